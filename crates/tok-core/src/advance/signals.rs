//! How the decider ends, or keeps, the waits of `wait_for_event` (one
//! key, or several in `any` or `all` mode: [`crate::waits`]) and of
//! `wait_for_condition` ([`crate::condition_wait`]) when what they wait
//! for comes or their due time passes.
//!
//! A wait for every one of several keys takes its signals one claim at a
//! time: each adds itself to the wait's entry in the context and the run
//! parks again on the keys still missing, until the original timeout,
//! without a record of its own (the step's record says it waits since it
//! began). The last one completes the step with all of them.

use serde_json::{Map, Value, json};

use super::{Decider, Env, Then, Transition, check_output_size, sender};
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

impl Decider<'_> {
    /// A signal resumed the `wait_for_event` at the state's path: the
    /// step completes with it, or, waiting for every one of several keys
    /// with some still missing, keeps it and parks again.
    pub(super) fn signal_arrived(
        mut self,
        step: &Step,
        signal: Arrived,
        env: &mut Env<'_>,
    ) -> Transition {
        if has_keys(step) && wait_mode(step) == WaitMode::All {
            return self.one_of_all(step, signal, env);
        }
        let path = self.state.path.clone();
        escalation::end(&path, &mut self.state.context);
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
        let record = self.record(step, None, self.now_ms());
        let log = vec![format!("resumed by signal {signal_id}{on}{about}{from}")];
        self.completed(step, record, outputs, log, env)
    }

    /// A signal came for a wait for every one of several keys.
    fn one_of_all(mut self, step: &Step, signal: Arrived, env: &mut Env<'_>) -> Transition {
        let path = self.state.path.to_string();
        let mut all = match waiting::<AllWait>(&self.state.context, &path) {
            Some(all) => all,
            None => match self.all_wait_again(step) {
                Ok(all) => all,
                Err(message) => return self.fail(message),
            },
        };
        // A resume that did not keep its key was for the first key missing.
        let key = signal
            .key
            .clone()
            .or_else(|| all.missing().into_iter().next())
            .unwrap_or_default();
        let arrival = waits::arrival(
            &signal.signal_id,
            signal.payload,
            signal.actor,
            signal.subject,
        );
        // A signal on a key that came already, or on none of the wait's,
        // changes nothing: the wait goes on.
        all.arrive(&key, arrival);
        let Some(mut wait) = all.remaining() else {
            escalation::end(&self.state.path, &mut self.state.context);
            end_waiting(&mut self.state.context, &path);
            let came: Vec<String> = all
                .order
                .iter()
                .map(|k| {
                    let id = all.arrived[k]["signalId"].as_str().unwrap_or_default();
                    format!("`{k}` ({id})")
                })
                .collect();
            let outputs = Map::from_iter([
                ("timedOut".to_owned(), Value::Bool(false)),
                ("signals".to_owned(), Value::Object(all.arrived)),
                ("keys".to_owned(), json!(all.order)),
            ]);
            let now = self.now_ms();
            // Each signal's payload fits a step's output; all of them may not.
            if let Err(error) = check_output_size(&step.id, &outputs) {
                return self.step_failed(step, None, now, error, env);
            }
            let record = self.record(step, None, now);
            let log = vec![format!("resumed: every signal came, {}", came.join(", "))];
            return self.completed(step, record, outputs, log, env);
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

    /// The `wait_for_event` at the state's path timed out (its
    /// escalations are over): `{timedOut: true}`, and for every one of
    /// several keys the signals that came and the keys still missing.
    pub(super) fn signals_timed_out(mut self, step: &Step, env: &mut Env<'_>) -> Transition {
        let path = self.state.path.to_string();
        let mut outputs = Map::from_iter([("timedOut".to_owned(), Value::Bool(true))]);
        let mut log = "timed out: no matching signal came".to_owned();
        if let Some(all) = waiting::<AllWait>(&self.state.context, &path) {
            end_waiting(&mut self.state.context, &path);
            let missing = all.missing();
            log = format!(
                "timed out: no signal came on {}",
                missing
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            outputs.insert("signals".into(), Value::Object(all.arrived));
            outputs.insert("keys".into(), json!(all.order));
            outputs.insert("missing".into(), json!(missing));
        }
        let now = self.now_ms();
        if let Err(error) = check_output_size(&step.id, &outputs) {
            return self.step_failed(step, None, now, error, env);
        }
        let record = self.record(step, None, now);
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
