//! How the decider ends, or keeps, the waits of the steps that wait for
//! signals — `wait_for_event` (one key, or several in `any` or `all`
//! mode: [`crate::waits`]), `approval` (its decision) and the handler
//! steps that asked to wait ([`super::custom`]) — and of
//! `wait_for_condition` ([`crate::condition_wait`]), when what they wait
//! for comes or their due time passes.
//!
//! The steps that wait for signals share one way: a wait for each of
//! several keys takes its signals one claim at a time: each adds itself
//! to the wait's entry in the context and the run parks again on the keys
//! still missing, until the original timeout, without a record of its
//! own (the step's record says it waits since it began); a due time
//! fires the next escalation level or times the wait out. Only the end
//! differs by step: a `wait_for_event` or an `approval` completes here
//! with its outputs, a handler step goes back to its handler's `resume`.

use serde_json::{Map, Value, json};

use super::{
    Branch, Decider, Env, Then, Transition, WAIT_FOR_EVENT, check_output_size, custom, sender,
};
use crate::approval::{self, APPROVAL};
use crate::condition_wait::{self, ConditionWait};
use crate::definition::Step;
use crate::escalation;
use crate::flow;
use crate::run::{NextJob, RunStatus, StepStatus};
use crate::waits::{
    self, AllWait, WaitMode, end_waiting, has_keys, set_waiting, signal_wait, wait_mode, waiting,
};

/// A signal that resumed a wait, as its resume carried it.
pub(super) struct Arrived {
    pub(super) signal_id: String,
    pub(super) payload: Value,
    pub(super) actor: Option<Value>,
    pub(super) subject: Option<String>,
    pub(super) key: Option<String>,
}

/// How a wait for signals ended.
enum Ended {
    /// A signal came (on one key, or on any of several).
    Signal(Arrived),
    /// The last missing signal of a wait for each of several keys came.
    All(AllWait, Arrived),
    /// Its timeout passed (its escalations are over); a wait for each of
    /// several keys has the signals that came.
    TimedOut(Option<AllWait>),
}

impl Decider<'_> {
    /// A signal resumed the step waiting at the state's path: the wait
    /// ends with it, or, waiting for each of several keys with some still
    /// missing, keeps it and parks again.
    pub(super) fn signal_arrived(
        mut self,
        step: &Step,
        signal: Arrived,
        env: &mut Env<'_>,
    ) -> Transition {
        let path = self.state.path.to_string();
        let all = match waiting::<AllWait>(&self.state.context, &path) {
            Some(all) => Some(all),
            // A context written before entries were kept: the wait
            // begins again, from its config, now.
            None if step.kind == WAIT_FOR_EVENT
                && has_keys(step)
                && wait_mode(step) == WaitMode::All =>
            {
                match self.all_wait_again(step) {
                    Ok(all) => Some(all),
                    Err(message) => return self.fail(message),
                }
            }
            None => None,
        };
        if let Some(all) = all {
            return self.one_of_all(step, all, signal, env);
        }
        escalation::end(&self.state.path, &mut self.state.context);
        self.wait_ended(step, Ended::Signal(signal), env)
    }

    /// A signal came for a wait for each of several keys.
    fn one_of_all(
        mut self,
        step: &Step,
        mut all: AllWait,
        signal: Arrived,
        env: &mut Env<'_>,
    ) -> Transition {
        let path = self.state.path.to_string();
        // A resume that did not keep its key was for the first key missing.
        let key = signal
            .key
            .clone()
            .or_else(|| all.missing().into_iter().next())
            .unwrap_or_default();
        let arrival = waits::arrival(
            &signal.signal_id,
            signal.payload.clone(),
            signal.actor.clone(),
            signal.subject.clone(),
        );
        // A signal on a key that came already, or on none of the wait's,
        // changes nothing: the wait goes on.
        all.arrive(&key, arrival);
        let Some(mut wait) = all.remaining() else {
            escalation::end(&self.state.path, &mut self.state.context);
            end_waiting(&mut self.state.context, &path);
            let signal = Arrived {
                key: Some(key),
                ..signal
            };
            return self.wait_ended(step, Ended::All(all, signal), env);
        };
        set_waiting(&mut self.state.context, &path, Some(&all));
        wait.due_at = self.escalated_due(step, all.due_at);
        self.finish(
            RunStatus::Waiting,
            None,
            Then::Record(NextJob::Wait { path, wait }),
        )
    }

    /// A wait for every one of several keys whose entry is gone (a
    /// context written before entries were kept): it begins again, from
    /// its config, now.
    fn all_wait_again(&self, step: &Step) -> Result<AllWait, String> {
        let automation = self.automation;
        let scope = flow::scope(
            &automation.steps,
            &self.state.path,
            self.state.context.as_value(),
        );
        let subject = self.state.subject.as_deref();
        signal_wait(step, &scope, subject, self.now)
            .map(|(wait, _)| AllWait::begin(&wait, self.now_ms()))
            .map_err(|e| format!("step `{}` cannot wait again: {}", step.id, e.message()))
    }

    /// The wait for signals at the state's path is due: its next
    /// escalation level runs as a side chain (the step keeps waiting), or
    /// it times out.
    pub(super) fn signals_due(mut self, step: &Step, env: &mut Env<'_>) -> Transition {
        let path = self.state.path.clone();
        if let Some(level) = escalation::fires(step, &path, &mut self.state.context) {
            self.state.path = path.child(Branch::Escalation(level), 0);
            self.state.attempt = 1;
            return self.chain(env);
        }
        escalation::end(&path, &mut self.state.context);
        let path = path.to_string();
        let all = waiting::<AllWait>(&self.state.context, &path);
        if all.is_some() {
            end_waiting(&mut self.state.context, &path);
        }
        self.wait_ended(step, Ended::TimedOut(all), env)
    }

    /// The wait of the step at the state's path ended: a `wait_for_event`
    /// or an `approval` completes with its outputs, a handler step is
    /// handed back to its handler with what ended it.
    fn wait_ended(mut self, step: &Step, ended: Ended, env: &mut Env<'_>) -> Transition {
        let now = self.now_ms();
        let (outputs, log, input) = match step.kind.as_str() {
            WAIT_FOR_EVENT => {
                let (outputs, log) = signal_outputs(step, ended);
                (outputs, log, None)
            }
            APPROVAL => {
                let approval_id = self.waiting_output(step).get("approvalId").cloned();
                match ended {
                    Ended::Signal(signal) | Ended::All(_, signal) => (
                        approval::decided(&signal.payload, approval_id.as_ref()),
                        approval::decided_line(&signal.payload),
                        Some(json!({ "signalId": signal.signal_id })),
                    ),
                    Ended::TimedOut(_) => {
                        let mut outputs = Map::new();
                        if let Some(id) = approval_id {
                            outputs.insert("approvalId".into(), id);
                        }
                        outputs.insert("timedOut".into(), Value::Bool(true));
                        (outputs, "timed out: nobody decided".to_owned(), None)
                    }
                }
            }
            _ => {
                let resumed = match ended {
                    Ended::Signal(signal) => custom::resumed_by(Some(custom_arrival(signal)), None),
                    Ended::All(all, signal) => {
                        custom::resumed_by(Some(custom_arrival(signal)), Some(&all))
                    }
                    Ended::TimedOut(all) => custom::resumed_by(None, all.as_ref()),
                };
                custom::resume(
                    &mut self.state.context,
                    &self.state.path.to_string(),
                    resumed,
                );
                return self.chain(env);
            }
        };
        // Each signal's payload fits a step's output; all of them may not.
        if let Err(error) = check_output_size(&step.id, &outputs) {
            return self.step_failed(step, None, now, error, env);
        }
        let mut record = self.record(step, None, now);
        record.input = input;
        self.completed(step, record, outputs, vec![log], env)
    }

    /// The run parks at a `wait_for_condition` step: its deadline and
    /// interval are kept while it waits, and the store checks the ticket
    /// as it parks.
    pub(super) fn park_on_condition(
        mut self,
        step: &Step,
        wait: ConditionWait,
        config: Value,
    ) -> Transition {
        let now = self.now_ms();
        let mut record = self.record(step, Some(config), now);
        record.status = StepStatus::Waiting;
        record.log.push(condition_wait::waiting_line(&wait));
        let path = self.state.path.to_string();
        set_waiting(&mut self.state.context, &path, Some(&wait));
        let parked = wait.parked(now);
        self.push(record);
        self.finish(
            RunStatus::Waiting,
            None,
            Then::Record(NextJob::Wait { path, wait: parked }),
        )
    }

    /// The ticket of the `wait_for_condition` at the state's path holds
    /// its rules: the step completes with the ticket.
    pub(super) fn condition_holds(
        mut self,
        step: &Step,
        ticket: Value,
        env: &mut Env<'_>,
    ) -> Transition {
        let path = self.state.path.to_string();
        end_waiting(&mut self.state.context, &path);
        let id = ticket["id"].as_str().unwrap_or_default().to_owned();
        let outputs = Map::from_iter([
            ("timedOut".to_owned(), Value::Bool(false)),
            ("ticket".to_owned(), ticket),
        ]);
        let record = self.record(step, None, self.now_ms());
        let log = vec![format!("the condition holds: ticket {id} holds the rules")];
        self.completed(step, record, outputs, log, env)
    }

    /// The `wait_for_condition` at the state's path is due: at its
    /// deadline it gives up, else it parks again until its next check
    /// (the store checks the ticket as it parks).
    pub(super) fn condition_due(mut self, step: &Step, env: &mut Env<'_>) -> Transition {
        let path = self.state.path.to_string();
        let now = self.now_ms();
        let wait = match waiting::<ConditionWait>(&self.state.context, &path) {
            Some(wait) => wait,
            None => {
                // A context written before entries were kept: the wait
                // begins again from its config.
                let automation = self.automation;
                let scope = flow::scope(
                    &automation.steps,
                    &self.state.path,
                    self.state.context.as_value(),
                );
                let subject = self.state.subject.as_deref();
                match condition_wait::condition_wait(step, &scope, subject, self.now) {
                    Ok((wait, _)) => wait,
                    Err(error) => {
                        drop(scope);
                        return self.step_failed(step, None, now, error, env);
                    }
                }
            }
        };
        if wait.is_over(now) {
            end_waiting(&mut self.state.context, &path);
            let outputs = Map::from_iter([("timedOut".to_owned(), Value::Bool(true))]);
            let record = self.record(step, None, now);
            let log = vec![format!(
                "timed out: ticket {} did not hold the rules",
                wait.ticket
            )];
            return self.completed(step, record, outputs, log, env);
        }
        set_waiting(&mut self.state.context, &path, Some(&wait));
        let parked = wait.parked(now);
        self.finish(
            RunStatus::Waiting,
            None,
            Then::Record(NextJob::Wait { path, wait: parked }),
        )
    }
}

fn custom_arrival(signal: Arrived) -> custom::Arrived {
    custom::Arrived {
        signal_id: signal.signal_id,
        key: signal.key,
        payload: signal.payload,
        actor: signal.actor,
        subject: signal.subject,
    }
}

/// The outputs and the log line of a `wait_for_event` whose wait ended.
fn signal_outputs(step: &Step, ended: Ended) -> (Map<String, Value>, String) {
    match ended {
        Ended::Signal(signal) => {
            let Arrived {
                signal_id,
                payload,
                actor,
                subject,
                key,
            } = signal;
            let mut outputs = Map::new();
            outputs.insert("timedOut".into(), Value::Bool(false));
            outputs.insert("payload".into(), payload);
            outputs.insert("signalId".into(), Value::String(signal_id.clone()));
            let on = match key.filter(|_| has_keys(step)) {
                Some(key) => {
                    let line = format!(" on `{key}`");
                    outputs.insert("key".into(), Value::String(key));
                    line
                }
                None => String::new(),
            };
            let about = match subject {
                Some(ticket) => {
                    let line = format!(" about ticket {ticket}");
                    outputs.insert("subject".into(), Value::String(ticket));
                    line
                }
                None => String::new(),
            };
            let from = actor.as_ref().map(sender).unwrap_or_default();
            if let Some(actor) = actor {
                outputs.insert("actor".into(), actor);
            }
            let log = format!("resumed by signal {signal_id}{on}{about}{from}");
            (outputs, log)
        }
        Ended::All(all, _) => {
            let came: Vec<String> = all
                .order
                .iter()
                .map(|k| {
                    let id = all.arrived[k]["signalId"].as_str().unwrap_or_default();
                    format!("`{k}` ({id})")
                })
                .collect();
            let log = format!("resumed: every signal came, {}", came.join(", "));
            let outputs = Map::from_iter([
                ("timedOut".to_owned(), Value::Bool(false)),
                ("signals".to_owned(), Value::Object(all.arrived)),
                ("keys".to_owned(), json!(all.order)),
            ]);
            (outputs, log)
        }
        Ended::TimedOut(None) => (
            Map::from_iter([("timedOut".to_owned(), Value::Bool(true))]),
            "timed out: no matching signal came".to_owned(),
        ),
        Ended::TimedOut(Some(all)) => {
            let missing = all.missing();
            let log = format!(
                "timed out: no signal came on {}",
                missing
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let outputs = Map::from_iter([
                ("timedOut".to_owned(), Value::Bool(true)),
                ("signals".to_owned(), Value::Object(all.arrived)),
                ("keys".to_owned(), json!(all.order)),
                ("missing".to_owned(), json!(missing)),
            ]);
            (outputs, log)
        }
    }
}
