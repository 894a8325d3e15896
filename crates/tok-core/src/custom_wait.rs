//! Steps that run and then wait, as values: what a registered step type's
//! handler (or the built-in `approval`) asks to wait for ([`CustomWait`]),
//! and the run context's bookkeeping of the steps that wait. The decider
//! parks such a step and takes its signals; a cancel of the run calls the
//! `cancel` hook of the steps that wait now ([`live`], read by
//! [`crate::compensation::cancel_at`] too).
//!
//! The context keeps two reserved maps by step path: `_live` (the
//! handler steps waiting now, with what they wait for: a cancel of the run
//! calls their handlers' `cancel` hook, [`live`], and an escalation parks
//! them again on the same wait) and `_resumed` (what ended a wait, until
//! the step's resume succeeds: a retried resume is resumed again with the
//! same signal, never waits a second time).

use serde_json::{Map, Value, json};

use crate::context::Context;
use crate::run::SignalWait;
use crate::waits::WaitMode;

/// What a step that runs (a handler, or `approval` in the record
/// transaction) asks to wait for, as a `wait_for_event` step may: a
/// signal on any of `keys` (`mode` [`WaitMode::Any`]) or on each of them
/// ([`WaitMode::All`]), about the ticket `subject` (or about none), whose
/// payload satisfies `filter`, `timeout_ms` at most (`None`: for ever);
/// with `only_new`, a signal buffered before the wait began does not
/// count. `outputs` are published while it waits; `what` is how the run
/// page says what it waits for ("a decision"; by default its keys).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CustomWait {
    pub keys: Vec<String>,
    pub mode: WaitMode,
    pub subject: Option<String>,
    pub filter: Option<crate::definition::Filter>,
    pub timeout_ms: Option<i64>,
    pub only_new: bool,
    pub outputs: Map<String, Value>,
    pub what: Option<String>,
}

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
            .map(|(path, entry)| {
                // Entries written before waits were kept are the step id alone.
                let id = entry.as_str().or(entry["step"].as_str());
                (path.clone(), id.unwrap_or_default().to_owned())
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// What the handler step at `path` waits for, as it parked (the keys
/// all there, buffered signals counted from when it began): what it
/// parks on again after an escalation.
pub fn live_wait(context: &Context, path: &str) -> Option<SignalWait> {
    let entry = context.reserved(LIVE_KEY)?.get(path)?.get("wait")?;
    serde_json::from_value(entry.clone()).ok()
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

/// What a signal, the last signal of a wait for each of several keys,
/// or a timeout hands to the resume of a handler step: `{signalId, key,
/// payload, actor, subject, timedOut}`; for each of several keys,
/// `signals` (key → signal) and `keys` (in the order they came), and
/// `missing` on a timeout.
pub fn resumed_by(signal: Option<Arrived>, all: Option<&crate::waits::AllWait>) -> Value {
    let mut resumed = match signal {
        Some(s) => json!({
            "signalId": s.signal_id, "key": s.key, "payload": s.payload, "actor": s.actor,
            "subject": s.subject, "timedOut": false
        }),
        None => json!({ "timedOut": true }),
    };
    if let Some(all) = all {
        resumed["signals"] = Value::Object(all.arrived.clone());
        resumed["keys"] = json!(all.order);
        let missing = all.missing();
        if !missing.is_empty() {
            resumed["missing"] = json!(missing);
        }
    }
    resumed
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

/// The handler step at `path` (id `step_id`) waits for `wait`, which
/// began at `now`.
pub(crate) fn begin(context: &mut Context, path: &str, step_id: &str, wait: &SignalWait, now: i64) {
    let mut kept = wait.clone();
    // Parked again (after an escalation), it still takes the signals
    // buffered since it began.
    if !kept.lookback {
        kept.since = Some(now);
    }
    set_entry(
        context,
        LIVE_KEY,
        path,
        Some(json!({ "step": step_id, "wait": kept })),
    );
}
