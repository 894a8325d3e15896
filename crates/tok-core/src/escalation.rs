//! Escalations of a waiting step (docs/workflows.md, "Escalations"):
//! `escalations: [{after, steps}]` on a `wait`, `wait_for_event`,
//! `wait_for_runs` or `approval` step. A `wait` with escalations parks at
//! its own path (a plain one parks at the next step, or at its own when
//! nothing follows it: [`hold`]) until its end. While the step still waits
//! `after` its wait began, the level's steps run — on the waiting step's
//! own job, as a side chain at paths `<step>.escalations.<level>.<i>` — and
//! then the step waits again, for the same signal and until the same
//! timeout: the wait is not resumed. Levels fire in order, each at most
//! once; the wait's end (its signal, its timeout, a cancel of the run)
//! leaves the levels not yet fired pending for ever.
//!
//! How far a wait's escalations went is kept in the run's context under
//! [`ESCALATIONS_KEY`], by the waiting step's path: when the wait began,
//! its own timeout, and how many levels fired. The parked job is due at
//! the earlier of the next level and the timeout; when it is claimed for
//! that time, [`fires`] tells which it was.

use std::time::Duration;

use serde_json::{Value, json};

use crate::context::Context;
use crate::definition::Step;
use crate::duration::parse_duration;
use crate::path::FlowPath;

/// Why `step` cannot have `escalations`: its type never waits (a control
/// type, refused by validation, or one of the engine's own).
pub fn never_waits(step: &Step) -> String {
    format!(
        "only a step that waits (wait, wait_for_event, wait_for_runs, approval, or a custom \
         step that waits) can have `escalations`; `{}` is a `{}` step, which never waits",
        step.id, step.kind
    )
}

/// Where the context keeps the escalations of the run's waits.
pub const ESCALATIONS_KEY: &str = "_escalations";

/// The `after` of each level, in order (unparseable ones, refused at save,
/// never fire).
fn afters(step: &Step) -> Vec<Option<Duration>> {
    step.escalations
        .iter()
        .map(|e| parse_duration(&e.after).ok())
        .collect()
}

fn entry(context: &Context, path: &FlowPath) -> Option<(i64, Option<i64>, usize)> {
    let entry = context.reserved(ESCALATIONS_KEY)?.get(path.to_string())?;
    Some((
        entry["since"].as_i64()?,
        entry["timeoutAt"].as_i64(),
        entry["fired"].as_u64()? as usize,
    ))
}

fn set_entry(context: &mut Context, path: &FlowPath, entry: Option<(i64, Option<i64>, usize)>) {
    let mut all = match context.reserved(ESCALATIONS_KEY) {
        Some(Value::Object(map)) => map.clone(),
        _ => serde_json::Map::new(),
    };
    match entry {
        Some((since, timeout_at, fired)) => {
            all.insert(
                path.to_string(),
                json!({ "since": since, "timeoutAt": timeout_at, "fired": fired }),
            );
        }
        None => {
            all.remove(&path.to_string());
        }
    }
    context.set_reserved(
        ESCALATIONS_KEY,
        (!all.is_empty()).then_some(Value::Object(all)),
    );
}

/// When the next level not fired yet is due, if it comes before the
/// timeout (a level due after the timeout never fires).
fn next_level(step: &Step, since: i64, timeout_at: Option<i64>, fired: usize) -> Option<i64> {
    let after = (*afters(step).get(fired)?)?;
    let at = since.saturating_add(after.as_millis() as i64);
    match timeout_at {
        Some(timeout) if at >= timeout => None,
        _ => Some(at),
    }
}

/// The due time of the wait of `step` at `path`, with its escalations:
/// the earlier of its next level and its `timeout_at`. A wait that begins
/// (`now`) is written down first; one that waits again after a level
/// keeps when it began and its timeout.
pub fn due(
    step: &Step,
    path: &FlowPath,
    context: &mut Context,
    now: i64,
    timeout_at: Option<i64>,
) -> Option<i64> {
    if step.escalations.is_empty() {
        // A wait held at its own path ([`hold`]) keeps its end.
        return entry(context, path)
            .and_then(|(_, held_until, _)| held_until)
            .or(timeout_at);
    }
    let (since, timeout_at, fired) = match entry(context, path) {
        Some(entry) => entry,
        None => {
            set_entry(context, path, Some((now, timeout_at, 0)));
            (now, timeout_at, 0)
        }
    };
    next_level(step, since, timeout_at, fired).or(timeout_at)
}

/// Whether the wait at `path`, claimed for its due time, is due for an
/// escalation level rather than its timeout: `Some(level)`, marked fired.
pub fn fires(step: &Step, path: &FlowPath, context: &mut Context) -> Option<usize> {
    let (since, timeout_at, fired) = entry(context, path)?;
    next_level(step, since, timeout_at, fired)?;
    set_entry(context, path, Some((since, timeout_at, fired + 1)));
    Some(fired)
}

/// [`fires`] for a timer (`wait`) claimed at `now`, which may be before
/// its next level (a paused run resumed early): a level fires only once
/// it is due.
pub fn fires_by(step: &Step, path: &FlowPath, context: &mut Context, now: i64) -> Option<usize> {
    let (since, timeout_at, fired) = entry(context, path)?;
    if next_level(step, since, timeout_at, fired)? > now {
        return None;
    }
    set_entry(context, path, Some((since, timeout_at, fired + 1)));
    Some(fired)
}

/// When the wait at `path` began to wait and when it times out, if it
/// has escalations and began.
pub fn began(path: &FlowPath, context: &Context) -> Option<(i64, Option<i64>)> {
    entry(context, path).map(|(since, timeout_at, _)| (since, timeout_at))
}

/// A `wait` without escalations that has nothing after it in its list
/// (the run's, a branch's, an iteration's) holds it at its own path until
/// `until`, written down as a wait with escalations is: a claim of the
/// step before then waits again for the same end, one at it ends the
/// wait, and the run (branch, iteration) ends when its last step does.
pub fn hold(path: &FlowPath, context: &mut Context, now: i64, until: i64) {
    set_entry(context, path, Some((now, Some(until), 0)));
}

/// The wait at `path` is over: its levels not fired yet never will.
pub fn end(path: &FlowPath, context: &mut Context) {
    if entry(context, path).is_some() {
        set_entry(context, path, None);
    }
}
