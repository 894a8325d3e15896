//! Custom steps that wait (DESIGN §5, "More shapes"): a registered step
//! type's handler may answer "wait for a signal" instead of outputs, for
//! what a `wait_for_event` step may wait for: any of several keys, about a
//! ticket, whose payload satisfies rules, with a timeout. The run parks at the step as at a `wait_for_event`, and the
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
use crate::limits::MAX_WAIT_KEYS;
use crate::run::{NextJob, RunStatus, SignalWait, StepStatus};
use crate::waits::MAX_SUBJECT_BYTES;

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

/// A signal that ended a custom step's wait: its id, the key it came on,
/// what it said, who sent it and the ticket it was about.
pub struct Arrived {
    pub signal_id: String,
    pub key: Option<String>,
    pub payload: Value,
    pub actor: Option<Value>,
    pub subject: Option<String>,
}

/// What a signal or a timeout hands to the resume of a custom step.
pub fn resumed_by(signal: Option<Arrived>) -> Value {
    match signal {
        Some(s) => json!({
            "signalId": s.signal_id, "key": s.key, "payload": s.payload, "actor": s.actor,
            "subject": s.subject, "timedOut": false
        }),
        None => json!({ "timedOut": true }),
    }
}

/// Why the wait a handler asked for cannot be waited for; `None` when it
/// can: at least one key and at most [`MAX_WAIT_KEYS`], none empty,
/// repeated or reserved, and a subject that names a ticket.
fn refused(wait: &super::CustomWait) -> Option<String> {
    if wait.keys.is_empty() {
        return Some("asked to wait for no signal key; a handler's wait needs a key".into());
    }
    if wait.keys.len() > MAX_WAIT_KEYS {
        return Some(format!(
            "asked to wait for {} signal keys; a wait takes at most {MAX_WAIT_KEYS}",
            wait.keys.len()
        ));
    }
    for (i, key) in wait.keys.iter().enumerate() {
        if key.trim().is_empty() {
            return Some(
                "asked to wait for an empty signal key; a handler's wait needs a key".into(),
            );
        }
        if crate::waits::is_reserved_key(key) {
            return Some(format!(
                "asked to wait for `{key}`, but keys beginning with `{}` are reserved for tok",
                crate::waits::RESERVED_KEY_PREFIX
            ));
        }
        if wait.keys[..i].contains(key) {
            return Some(format!("asked to wait for `{key}` twice"));
        }
    }
    match wait.subject.as_deref().map(str::trim) {
        Some("") => Some("asked to wait for signals about an empty ticket id".into()),
        Some(ticket) if ticket.len() > MAX_SUBJECT_BYTES => Some(format!(
            "asked to wait for signals about a ticket id of {} bytes; a ticket id has at most \
             {MAX_SUBJECT_BYTES}",
            ticket.len()
        )),
        _ => None,
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
        if let Some(why) = refused(&wait) {
            let error = StepError::terminal(format!("step `{}` {why}", step.id));
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
        let keys = wait
            .keys
            .iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(" or ");
        let about = match &wait.subject {
            Some(ticket) => format!(" about ticket {}", ticket.trim()),
            None => String::new(),
        };
        record.log.push(match due_at {
            Some(_) => format!(
                "waiting for signal {keys}{about} for {} ms at most",
                wait.timeout_ms.unwrap_or_default()
            ),
            None => format!("waiting for signal {keys}{about}"),
        });
        let mut keys = wait.keys.into_iter();
        let wait = SignalWait {
            key: keys.next().unwrap_or_default(),
            also: keys.collect(),
            subject: wait.subject.map(|s| s.trim().to_owned()),
            filter: wait.filter,
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
