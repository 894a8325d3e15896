//! How the decider parks a run at a waiting step (signals, a decision,
//! a handler step's wait, other runs, a timer with escalations) and
//! parks it again after an escalation level's steps.

use jiff::Timestamp;
use serde_json::{Map, Value};

use super::{Decider, Then, Transition, custom};
use crate::advance::WAIT_FOR_EVENT;
use crate::approval::{self, APPROVAL};
use crate::builtin::WAIT;
use crate::children::{self, WAIT_FOR_RUNS};
use crate::definition::Step;
use crate::escalation;
use crate::flow;
use crate::path::FlowPath;
use crate::run::{NextJob, RunStatus, RunsWait, SignalWait, StepRecord, StepStatus};
use crate::waits::{self, AllWait, WaitMode, set_waiting, signal_wait};

impl Decider<'_> {
    /// The run parks at a step that waits for signals: a
    /// `wait_for_event`, an `approval` (on its decision) or a step that
    /// asked to wait ([`custom`]); `record` is the step's record, marked
    /// waiting here, and its outputs are published at once. A wait for
    /// each of `several` keys is written down ([`AllWait`]) to keep its
    /// signals; `what` says what it waits for (by default its keys).
    pub(super) fn park_on_signals(
        mut self,
        step: &Step,
        mut record: StepRecord,
        mut wait: SignalWait,
        mode: WaitMode,
        several: bool,
        what: Option<String>,
    ) -> Transition {
        record.status = StepStatus::Waiting;
        if let Some(Value::Object(outputs)) = &record.output {
            self.state.context.publish(&record.step_id, outputs);
        }
        let about = match &wait.subject {
            Some(ticket) => format!(" about ticket {ticket}"),
            None => String::new(),
        };
        let what = what.unwrap_or_else(|| {
            let keys: Vec<String> = wait.keys().map(|k| format!("`{k}`")).collect();
            match (several, mode) {
                (false, _) => format!("signal {}", keys.join(", ")),
                (true, WaitMode::Any) => format!("a signal on any of {}", keys.join(", ")),
                (true, WaitMode::All) => format!("a signal on each of {}", keys.join(", ")),
            }
        });
        record.log.push(
            match wait
                .due_at
                .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            {
                Some(due) => format!("waiting for {what}{about} until {due}"),
                None => format!("waiting for {what}{about}"),
            },
        );
        let path = self.state.path.to_string();
        let now = self.now_ms();
        if several && mode == WaitMode::All {
            set_waiting(
                &mut self.state.context,
                &path,
                Some(&AllWait::begin(&wait, now)),
            );
        }
        if step.kind != WAIT_FOR_EVENT && step.kind != APPROVAL {
            custom::begin(&mut self.state.context, &path, &step.id, &wait, now);
        }
        wait.due_at = self.escalated_due(step, wait.due_at);
        self.push(record);
        self.finish(
            RunStatus::Waiting,
            None,
            Then::Record(NextJob::Wait { path, wait }),
        )
    }

    /// What the waiting step at the state's path published when it parked
    /// (an approval's id); empty when it published nothing.
    pub(super) fn waiting_output(&self, step: &Step) -> Map<String, Value> {
        match self.state.context.as_value().get(&step.id) {
            Some(Value::Object(map)) => map.clone(),
            _ => Map::new(),
        }
    }

    /// When the wait of `step` at the state's path is due, with its
    /// escalations ([`escalation::due`]); `timeout_at` without any.
    pub(super) fn escalated_due(&mut self, step: &Step, timeout_at: Option<i64>) -> Option<i64> {
        let now = self.now_ms();
        let path = self.state.path.clone();
        escalation::due(step, &path, &mut self.state.context, now, timeout_at)
    }

    /// An escalation level of the waiting step at `waiting` ran its
    /// steps: the step waits again, for what it waited for, until the same
    /// timeout (or its next level), without a record of its own.
    pub(super) fn wait_again(mut self, waiting: FlowPath) -> Transition {
        let automation = self.automation;
        let Some(step) = flow::step_at(&automation.steps, &waiting) else {
            return self.fail(format!("the run's version has no step at `{waiting}`"));
        };
        self.state.path = waiting.clone();
        self.state.attempt = 1;
        let path = waiting.to_string();
        match step.kind.as_str() {
            WAIT_FOR_RUNS => {
                let scope = flow::scope(&automation.steps, &waiting, self.state.context.as_value());
                let wait = children::runs_wait(step, &scope, self.now);
                drop(scope);
                let mut wait = match wait {
                    Ok((wait, _)) => wait,
                    Err(error) => {
                        let message =
                            format!("step `{}` cannot wait again: {}", step.id, error.message());
                        return self.fail(message);
                    }
                };
                wait.due_at = self.escalated_due(step, None);
                let next = NextJob::WaitForRuns { path, wait };
                return self.finish(RunStatus::Waiting, None, Then::Record(next));
            }
            WAIT => {
                let now = self.now_ms();
                let due = self.escalated_due(step, None).unwrap_or(now);
                let delay_ms = (due - now).max(0);
                let next = NextJob::Step { path, delay_ms };
                return self.finish(RunStatus::Waiting, None, Then::Record(next));
            }
            _ => {}
        }
        let wait = match step.kind.as_str() {
            APPROVAL => {
                let waiting_output = self.waiting_output(step);
                let id = waiting_output
                    .get("approvalId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                Ok(SignalWait {
                    key: approval::decision_key(id),
                    lookback: false,
                    ..SignalWait::default()
                })
            }
            _ => match waits::waiting::<AllWait>(&self.state.context, &path) {
                // Every one of several keys: the keys still missing.
                Some(all) => all
                    .remaining()
                    .ok_or_else(|| crate::error::StepError::terminal("every signal came already")),
                None if custom::is_live(&self.state.context, &path) => {
                    custom::live_wait(&self.state.context, &path).ok_or_else(|| {
                        crate::error::StepError::terminal("what it waits for was not kept")
                    })
                }
                None => {
                    let scope =
                        flow::scope(&automation.steps, &waiting, self.state.context.as_value());
                    let subject = self.state.subject.as_deref();
                    signal_wait(step, &scope, subject, self.now).map(|(wait, _)| wait)
                }
            },
        };
        let mut wait = match wait {
            Ok(wait) => wait,
            Err(error) => {
                let message = format!("step `{}` cannot wait again: {}", step.id, error.message());
                return self.fail(message);
            }
        };
        // The timeout is the one the wait began with, kept with its
        // escalations; this only finds the next one due.
        wait.due_at = self.escalated_due(step, None);
        self.finish(
            RunStatus::Waiting,
            None,
            Then::Record(NextJob::Wait { path, wait }),
        )
    }

    /// The run parks at a `wait` step with escalations until `until`: at
    /// the step itself (a plain `wait` parks at the next step), due at its
    /// first level, so that the levels fire while it waits.
    pub(super) fn park_on_timer(
        mut self,
        step: &Step,
        until: Timestamp,
        log: Vec<String>,
    ) -> Transition {
        let now = self.now_ms();
        let mut record = self.record(step, None, now);
        record.status = StepStatus::Waiting;
        record.log = log;
        let due = self.escalated_due(step, Some(until.as_millisecond()));
        let path = self.state.path.to_string();
        self.push(record);
        let delay_ms = (due.unwrap_or(now) - now).max(0);
        self.finish(
            RunStatus::Waiting,
            None,
            Then::Record(NextJob::Step { path, delay_ms }),
        )
    }

    /// The run parks at a step that waits on runs (`record` is that step's
    /// record, marked waiting here).
    pub(super) fn park_on_runs(
        mut self,
        step: &Step,
        mut record: StepRecord,
        mut wait: RunsWait,
    ) -> Transition {
        record.status = StepStatus::Waiting;
        record.log.push(children::waiting_line(&wait));
        wait.due_at = self.escalated_due(step, wait.due_at);
        let path = self.state.path.to_string();
        self.push(record);
        self.finish(
            RunStatus::Waiting,
            None,
            Then::Record(NextJob::WaitForRuns { path, wait }),
        )
    }
}
