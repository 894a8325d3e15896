//! Steps that run and then wait (DESIGN §5, "More shapes"): a registered
//! step type's handler may answer "wait for a signal" instead of outputs,
//! for whatever a `wait_for_event` step may wait for: any or each of
//! several keys, about a ticket, whose payload satisfies rules, only
//! signals sent from now on, with a timeout and the step's escalations.
//! The built-in `approval` is one such step (it opens the approval in the
//! record transaction and waits for the decision's signal). The run parks
//! as at a `wait_for_event` and takes its signals, timeouts and
//! escalations the same way ([`super::signals`]); what ended the wait
//! then goes back to the step's handler's `resume` (for `approval`, the
//! decider reads the decision itself).
//!
//! The context keeps two reserved maps by step path: `_live` (the
//! handler steps waiting now, with what they wait for: a cancel of the run
//! calls their handlers' `cancel` hook, [`live`], and an escalation parks
//! them again on the same wait) and `_resumed` (what ended a wait, until
//! the step's resume succeeds: a retried resume is resumed again with the
//! same signal, never waits a second time).

use serde_json::{Map, Value, json};

use super::{Decider, Env, Transition};
use crate::context::Context;
use crate::definition::Step;
use crate::error::StepError;
use crate::limits::MAX_WAIT_KEYS;
use crate::run::SignalWait;
use crate::waits::MAX_SUBJECT_BYTES;

/// Longest description of what a step waits for (the run page's
/// "waiting for …"), in bytes.
pub const MAX_WHAT_BYTES: usize = 200;

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

/// Why the wait a handler asked for cannot be waited for; `None` when it
/// can: at least one key and at most [`MAX_WAIT_KEYS`], none empty,
/// repeated or reserved, a subject that names a ticket, and a short
/// description if any.
fn refused(step: &Step, wait: &super::CustomWait) -> Option<String> {
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
        // Only an approval waits on a decision's key, its own.
        if crate::approval::is_decision_key(key) && step.kind != crate::approval::APPROVAL {
            return Some(format!(
                "asked to wait for `{key}`, but keys beginning with `{}` are the decisions \
                 of approvals",
                crate::approval::DECISION_KEY_PREFIX
            ));
        }
        if wait.keys[..i].contains(key) {
            return Some(format!("asked to wait for `{key}` twice"));
        }
    }
    match wait.what.as_deref().map(str::trim) {
        Some("") => return Some("described what it waits for with an empty text".into()),
        Some(what) if what.len() > MAX_WHAT_BYTES => {
            return Some(format!(
                "described what it waits for in {} bytes; a description has at most \
                 {MAX_WHAT_BYTES}",
                what.len()
            ));
        }
        _ => {}
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
    /// The step at the state's path asked to wait (`wait`): it is
    /// recorded waiting with the outputs it gave, which are published at
    /// once, and the run parks as at a `wait_for_event`. A wait it cannot
    /// have fails it, saying why.
    pub(super) fn park_custom(
        self,
        step: &Step,
        wait: super::CustomWait,
        input: Option<Value>,
        started_at: i64,
        env: &mut Env<'_>,
    ) -> Transition {
        if let Some(why) = refused(step, &wait) {
            let error = StepError::terminal(format!("step `{}` {why}", step.id));
            return self.step_failed(step, input, started_at, error, env);
        }
        let mut record = self.record(step, input, started_at);
        record.output = Some(Value::Object(wait.outputs));
        let due_at = wait
            .timeout_ms
            .map(|ms| self.now_ms().saturating_add(ms.max(0)));
        // A wait for each of its keys keeps its signals by key, even of one.
        let several = wait.keys.len() > 1 || wait.mode == crate::waits::WaitMode::All;
        let mut keys = wait.keys.into_iter();
        let signals = SignalWait {
            key: keys.next().unwrap_or_default(),
            also: keys.collect(),
            subject: wait.subject.map(|s| s.trim().to_owned()),
            filter: wait.filter,
            lookback: !wait.only_new,
            due_at,
            ..SignalWait::default()
        };
        let what = wait.what.map(|w| w.trim().to_owned());
        self.park_on_signals(step, record, signals, wait.mode, several, what)
    }
}

/// The handler step at `path` (id `step_id`) waits for `wait`, which
/// began at `now`.
pub(super) fn begin(context: &mut Context, path: &str, step_id: &str, wait: &SignalWait, now: i64) {
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
