//! Custom steps that wait (DESIGN §5, "More shapes"): a registered step
//! type's handler may answer "wait for this signal key" instead of
//! outputs. The run parks at the step as at a `wait_for_event`, and the
//! signal (or the timeout) that ends the wait hands the step back to its
//! handler's `resume` with what ended it.
//!
//! The context keeps two reserved maps by step path: `_live` (the custom
//! steps waiting now, by id: a cancel of the run calls their handlers'
//! `cancel` hook, [`live`]) and `_resumed` (what ended a wait, until the
//! step's resume succeeds: a retried resume is resumed again with the same
//! signal, never waits a second time).

use serde_json::{Map, Value, json};

use super::{Decider, Env, Then, Transition};
use crate::context::Context;
use crate::definition::Step;
use crate::error::StepError;
use crate::run::{NextJob, RunStatus, SignalWait, StepStatus};

/// The custom steps waiting now: path → step id.
pub const LIVE_KEY: &str = "_live";
/// What ended a custom step's wait, until its resume succeeds: path →
/// `{signalId, payload, actor, subject, timedOut}`.
pub const RESUMED_KEY: &str = "_resumed";

/// The custom steps of a run that wait now, as (path, step id).
pub fn live(context: &Context) -> Vec<(String, String)> {
    match context.reserved(LIVE_KEY) {
        Some(Value::Object(map)) => map
            .iter()
            .map(|(path, id)| (path.clone(), id.as_str().unwrap_or_default().to_owned()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether the custom step at `path` waits now.
pub fn is_live(context: &Context, path: &str) -> bool {
    context
        .reserved(LIVE_KEY)
        .is_some_and(|map| map.get(path).is_some())
}

/// What ended the wait of the custom step at `path`, when its resume is
/// still to succeed.
pub fn resumed(context: &Context, path: &str) -> Option<Value> {
    context.reserved(RESUMED_KEY)?.get(path).cloned()
}

/// The wait's end of the step at `path`: no longer live, resumed with
/// `resumed`.
pub fn resume(context: &mut Context, path: &str, resumed: Value) {
    set_entry(context, LIVE_KEY, path, None);
    set_entry(context, RESUMED_KEY, path, Some(resumed));
}

/// The step at `path` published: what resumed it is spent.
pub fn settled(context: &mut Context, path: &crate::path::FlowPath) {
    if context.reserved(RESUMED_KEY).is_none() {
        return;
    }
    let path = path.to_string();
    if resumed(context, &path).is_some() {
        set_entry(context, RESUMED_KEY, &path, None);
    }
}

/// A cancelled run's live steps are no longer live (their hooks ran).
pub fn cancelled(context: &mut Context) {
    if context.reserved(LIVE_KEY).is_some() {
        context.set_reserved(LIVE_KEY, None);
    }
}

/// What a signal or a timeout hands to the resume of a custom step.
pub fn resumed_by(signal: Option<(String, Value, Option<Value>, Option<String>)>) -> Value {
    match signal {
        Some((signal_id, payload, actor, subject)) => json!({
            "signalId": signal_id, "payload": payload, "actor": actor, "subject": subject,
            "timedOut": false
        }),
        None => json!({ "timedOut": true }),
    }
}

fn set_entry(context: &mut Context, key: &str, path: &str, value: Option<Value>) {
    let mut map = match context.reserved(key) {
        Some(Value::Object(map)) => map.clone(),
        _ => Map::new(),
    };
    match value {
        Some(value) => map.insert(path.to_owned(), value),
        None => map.remove(path),
    };
    context.set_reserved(key, (!map.is_empty()).then_some(Value::Object(map)));
}

impl Decider<'_> {
    /// The custom step at the state's path asked to wait for `key` (for
    /// `timeout_ms` at most): it is recorded waiting with the outputs it
    /// gave, which are published at once, and the run parks on the key.
    pub(super) fn park_custom(
        mut self,
        step: &Step,
        wait: super::CustomWait,
        input: Option<Value>,
        started_at: i64,
        env: &mut Env<'_>,
    ) -> Transition {
        if wait.key.trim().is_empty() {
            let error = StepError::terminal(format!(
                "step `{}` asked to wait for an empty signal key; a handler's wait needs a key",
                step.id
            ));
            return self.step_failed(step, input, started_at, error, env);
        }
        if crate::waits::is_reserved_key(&wait.key) {
            let error = StepError::terminal(format!(
                "step `{}` asked to wait for `{}`, but keys beginning with `{}` are reserved \
                 for tok",
                step.id,
                wait.key,
                crate::waits::RESERVED_KEY_PREFIX
            ));
            return self.step_failed(step, input, started_at, error, env);
        }
        let mut record = self.record(step, input, started_at);
        record.status = StepStatus::Waiting;
        self.state.context.publish(&step.id, &wait.outputs);
        record.output = Some(Value::Object(wait.outputs));
        let path = self.state.path.to_string();
        set_entry(
            &mut self.state.context,
            LIVE_KEY,
            &path,
            Some(json!(step.id)),
        );
        let due_at = wait
            .timeout_ms
            .map(|ms| self.now_ms().saturating_add(ms.max(0)));
        record.log.push(match due_at {
            Some(_) => format!(
                "waiting for signal `{}` for {} ms at most",
                wait.key,
                wait.timeout_ms.unwrap_or_default()
            ),
            None => format!("waiting for signal `{}`", wait.key),
        });
        let wait = SignalWait {
            key: wait.key,
            lookback: true,
            due_at,
            ..SignalWait::default()
        };
        self.push(record);
        self.finish(
            RunStatus::Waiting,
            None,
            Then::Record(NextJob::Wait { path, wait }),
        )
    }
}
