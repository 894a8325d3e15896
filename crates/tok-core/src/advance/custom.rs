//! Steps that run and then wait (docs/workflows.md, "Custom steps that
//! wait"): a registered step type's handler may answer "wait for a signal"
//! instead of outputs, for whatever a `wait_for_event` step may wait for:
//! any or each of several keys, about a ticket, whose payload satisfies
//! rules, only signals sent from now on, with a timeout and the step's
//! escalations. The built-in `approval` is one such step (it opens the
//! approval in the record transaction and waits for the decision's signal).
//! The run parks as at a `wait_for_event` and takes its signals, timeouts
//! and escalations the same way ([`super::signals`]); what ended the wait
//! then goes back to the step's handler's `resume` (for `approval`, the
//! decider reads the decision itself).
//!
//! What a step asks to wait for ([`CustomWait`](super::CustomWait)) and the
//! run context's bookkeeping of the steps that wait ([`live`], [`resume`],
//! …) are values below the decider, in [`crate::custom_wait`]; they are
//! re-exported here.

use serde_json::Value;

use super::{Decider, Env, Transition};
pub(super) use crate::custom_wait::begin;
pub use crate::custom_wait::{
    Arrived, LIVE_KEY, RESUMED_KEY, cancelled, is_live, live, live_wait, resume, resumed,
    resumed_by, settled,
};
use crate::definition::Step;
use crate::error::StepError;
use crate::limits::MAX_WAIT_KEYS;
use crate::run::SignalWait;
use crate::waits::MAX_SUBJECT_BYTES;

/// Longest description of what a step waits for (the run page's
/// "waiting for …"), in bytes.
pub const MAX_WHAT_BYTES: usize = 200;

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
