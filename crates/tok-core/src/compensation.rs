//! Compensation (docs/workflows.md, "Compensation"): `compensate: [steps…]`
//! on any step says what undoes it. When a run is cancelled — and when it
//! fails, if `settings.compensateOnFailure` is true — the `compensate`
//! steps of its completed steps run, most recently completed first, as
//! ordinary steps of the run (jobs, retries, records, log) at paths
//! `<step>.compensate.<i>`; the run is `compensating` meanwhile and then
//! ends `cancelled` or `failed` (a failed run keeps the error it failed
//! with).
//!
//! What counts as a completed step is each step *instance* whose record
//! completed, in the order they completed: a step in a loop or a `repeat`
//! once per iteration that ran it (its path names the iteration, and its
//! compensation sees that iteration's `item`), a step in a `parallel`
//! branch in the order the branches' records reached the run, a `parallel`
//! or `repeat` step itself when it completed (after its inner steps). A
//! step that had not completed when the run stopped (one waiting, one in
//! flight, the one that failed) is not compensated.
//!
//! The decider keeps two entries in the run's context, so that a
//! compensation interrupted by a restart goes on where it was:
//! [`COMPENSABLE_KEY`], the paths of the completed steps that have
//! `compensate` steps, in completion order (the last is undone first), and,
//! while compensating, [`COMPENSATING_KEY`]: how the run ends and with what
//! error, and the compensations that failed. A compensation step that
//! fails after its retries does not stop the others: it raises an incident
//! naming it, the rest of that step's compensation is skipped, and the next
//! completed step is compensated. A cancel while compensating is refused:
//! compensation is not interrupted (as in Temporal's sagas).
//!
//! A `for_each` step undoes the completed steps of the items it cancelled
//! before it completes, off this same list ([`UNDOING_KEY`], [`begin_undo`];
//! [`crate::for_each`] re-exports them): a cancel starts where that undoing
//! stopped too ([`cancel_at`]).

use serde_json::{Value, json};

use crate::context::Context;
use crate::definition::Step;
use crate::path::FlowPath;
use crate::run::RunStatus;

/// Where the context keeps the completed steps that have compensations.
pub const COMPENSABLE_KEY: &str = "_compensable";

/// Where the context keeps how a compensating run ends.
pub const COMPENSATING_KEY: &str = "_compensating";

fn stack(context: &Context) -> Vec<Value> {
    match context.reserved(COMPENSABLE_KEY) {
        Some(Value::Array(paths)) => paths.clone(),
        _ => Vec::new(),
    }
}

fn set_stack(context: &mut Context, paths: Vec<Value>) {
    context.set_reserved(
        COMPENSABLE_KEY,
        (!paths.is_empty()).then_some(Value::Array(paths)),
    );
}

/// The step at `path` completed: if it has `compensate` steps (and is not
/// itself part of a compensation), it is undone first of those so far.
pub fn completed(step: &Step, path: &FlowPath, context: &mut Context) {
    if step.compensate.is_empty() || path.compensated().is_some() {
        return;
    }
    let mut paths = stack(context);
    paths.push(Value::String(path.to_string()));
    set_stack(context, paths);
}

/// The completed steps to compensate, the most recent first.
pub fn pending(context: &Context) -> Vec<String> {
    stack(context)
        .iter()
        .rev()
        .filter_map(|p| p.as_str().map(str::to_owned))
        .collect()
}

/// Where a cancel of a run with this context starts: the step undone
/// first, or `None` when nothing is to be undone (the run is cancelled at
/// once) or the run compensates already.
pub fn cancel_at(context: &Context) -> Option<String> {
    if is_compensating(context) {
        return None;
    }
    // A `for_each` step undoing its cancelled items hands what is left
    // of that to the run's compensation; a custom step waiting now has
    // its `cancel` hook called by the claim that takes the cancel, even
    // with nothing to undo.
    pending(context)
        .into_iter()
        .next()
        .or_else(|| undo_left(context).into_iter().next())
        .or_else(|| {
            crate::custom_wait::live(context)
                .into_iter()
                .next()
                .map(|(path, _)| path)
        })
}

/// Takes `paths` off the completed steps to compensate (a `for_each`
/// step undoes its cancelled items' steps itself, [`crate::for_each`]).
pub fn forget(context: &mut Context, paths: &[String]) {
    let mut stack = stack(context);
    stack.retain(|p| !p.as_str().is_some_and(|p| paths.iter().any(|q| q == p)));
    set_stack(context, stack);
}

/// Puts `paths` (most recent first) back on the completed steps to
/// compensate, to be undone first.
pub fn restore(context: &mut Context, paths: &[String]) {
    let mut stack = stack(context);
    stack.extend(paths.iter().rev().map(|p| Value::String(p.clone())));
    set_stack(context, stack);
}

/// Whether the run is compensating.
pub fn is_compensating(context: &Context) -> bool {
    context.reserved(COMPENSATING_KEY).is_some()
}

/// The run begins to compensate; it will end `ends` with `error`.
pub fn begin(context: &mut Context, ends: RunStatus, error: Option<String>) {
    context.set_reserved(
        COMPENSATING_KEY,
        Some(json!({ "ends": ends.as_str(), "error": error, "failed": [] })),
    );
}

/// The next completed step to undo, taken off the list; `None` when all
/// are undone.
pub fn take_next(context: &mut Context) -> Option<FlowPath> {
    let mut paths = stack(context);
    loop {
        let last = paths.pop()?;
        if let Some(path) = last.as_str().and_then(|p| p.parse().ok()) {
            set_stack(context, paths);
            return Some(path);
        }
    }
}

/// The error a compensating run keeps meanwhile (a failed run's).
pub fn error(context: &Context) -> Option<String> {
    context
        .reserved(COMPENSATING_KEY)
        .and_then(|c| c.get("error"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// A compensation failed for good (`message` says which and why).
pub fn failed(context: &mut Context, message: &str) {
    let Some(Value::Object(mut entry)) = context.reserved(COMPENSATING_KEY).cloned() else {
        return;
    };
    let mut failures = match entry.remove("failed") {
        Some(Value::Array(failures)) => failures,
        _ => Vec::new(),
    };
    failures.push(Value::String(message.to_owned()));
    entry.insert("failed".into(), Value::Array(failures));
    context.set_reserved(COMPENSATING_KEY, Some(Value::Object(entry)));
}

/// The compensation is over: how the run ends and its error. A failed run
/// keeps the error it failed with; a cancelled run keeps why it was
/// cancelled, and says which of its compensations failed.
pub fn end(context: &mut Context) -> (RunStatus, Option<String>) {
    let entry = context.reserved(COMPENSATING_KEY).cloned();
    context.set_reserved(COMPENSATING_KEY, None);
    let ends = entry
        .as_ref()
        .and_then(|e| e.get("ends"))
        .and_then(Value::as_str)
        .and_then(RunStatus::parse)
        .unwrap_or(RunStatus::Cancelled);
    let error = entry
        .as_ref()
        .and_then(|e| e.get("error"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let failures: Vec<String> = entry
        .as_ref()
        .and_then(|e| e.get("failed"))
        .and_then(Value::as_array)
        .map(|f| {
            f.iter()
                .filter_map(|m| m.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let error = match (ends, error, failures.is_empty()) {
        (_, error, true) | (RunStatus::Failed, error, false) => error,
        (_, None, false) => Some(format!(
            "the run was cancelled, but not all of it was undone: {}",
            failures.join("; ")
        )),
        (_, Some(error), false) => Some(format!(
            "{error}; not all of it was undone: {}",
            failures.join("; ")
        )),
    };
    (ends, error)
}

/// A branch's record reaches the run's context (`branch` is the branch
/// job's copy of the context): the steps it completed join the run's list,
/// in order.
pub fn merge(run: &mut Context, branch: &Value) {
    let Some(Value::Array(completed)) = branch.get(COMPENSABLE_KEY) else {
        return;
    };
    let mut paths = stack(run);
    let before = paths.len();
    for path in completed.iter().cloned() {
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    if paths.len() != before {
        set_stack(run, paths);
    }
}

/// Where the context keeps a `for_each` step's undoing of its cancelled
/// items: the step, how its items joined, and the completed steps still
/// to undo.
pub const UNDOING_KEY: &str = "_undoingItems";

/// The `for_each` step at `path` joined with `cancelled` items: the
/// completed steps of theirs that have `compensate` steps are undone
/// before the step completes, the most recent first. Returns the first
/// to undo (the rest are kept in [`UNDOING_KEY`], off the run's own list
/// of steps to compensate), or `None` when there is nothing to undo.
pub fn begin_undo(
    context: &mut Context,
    path: &FlowPath,
    total: usize,
    done: &[usize],
    cancelled: &[usize],
) -> Option<FlowPath> {
    let inside: Vec<String> = cancelled
        .iter()
        .map(|n| format!("{path}.items.{n}."))
        .collect();
    let undo: Vec<String> = pending(context)
        .into_iter()
        .filter(|p| inside.iter().any(|i| p.starts_with(i.as_str())))
        .collect();
    let first = undo.first()?.parse().ok()?;
    forget(context, &undo);
    context.set_reserved(
        UNDOING_KEY,
        Some(json!({
            "at": path.to_string(), "total": total, "done": done, "cancelled": cancelled,
            "undo": undo[1..],
        })),
    );
    Some(first)
}

/// Whether a `for_each` step undoes its cancelled items' steps now.
pub fn undoing(context: &Context) -> bool {
    context.reserved(UNDOING_KEY).is_some()
}

/// The next completed step of a cancelled item to undo, taken off the
/// list; `None` when all are undone.
pub fn next_undo(context: &mut Context) -> Option<FlowPath> {
    let mut entry = context.reserved(UNDOING_KEY)?.clone();
    let undo = entry.get_mut("undo")?.as_array_mut()?;
    if undo.is_empty() {
        return None;
    }
    let next = undo.remove(0);
    context.set_reserved(UNDOING_KEY, Some(entry));
    next.as_str()?.parse().ok()
}

/// How a `for_each` step whose cancelled items are undone joined: its
/// path, its items, and the ones done and cancelled. The entry goes.
pub fn end_undo(context: &mut Context) -> Option<(FlowPath, usize, Vec<usize>, Vec<usize>)> {
    let entry = context.reserved(UNDOING_KEY)?.clone();
    context.set_reserved(UNDOING_KEY, None);
    let indices = |key: &str| -> Vec<usize> {
        entry[key]
            .as_array()
            .map(|a| a.iter().filter_map(whole).collect())
            .unwrap_or_default()
    };
    let at = entry["at"].as_str()?.parse().ok()?;
    let total = whole(&entry["total"])?;
    Some((at, total, indices("done"), indices("cancelled")))
}

/// What a `for_each` step undoing its cancelled items has left to undo,
/// the next first.
pub fn undo_left(context: &Context) -> Vec<String> {
    context
        .reserved(UNDOING_KEY)
        .and_then(|entry| entry["undo"].as_array())
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The run is cancelled while a `for_each` step undoes its cancelled
/// items: what is left to undo goes back on the run's list, undone first.
pub fn abandon_undo(context: &mut Context) {
    if context.reserved(UNDOING_KEY).is_none() {
        return;
    }
    let left = undo_left(context);
    context.set_reserved(UNDOING_KEY, None);
    restore(context, &left);
}

/// A whole number as the entry keeps it (or a string of one).
fn whole(v: &Value) -> Option<usize> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        .and_then(|n| usize::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn undoable(id: &str) -> Step {
        let mut step = Step::new(id, "http", Value::Null);
        step.compensate = vec![Step::new(format!("undo_{id}"), "http", Value::Null)];
        step
    }

    #[test]
    fn completed_steps_with_compensations_are_undone_last_first() {
        let mut context = Context::default();
        completed(&undoable("a"), &"0".parse().unwrap(), &mut context);
        completed(
            &Step::new("plain", "set", Value::Null),
            &"1".parse().unwrap(),
            &mut context,
        );
        completed(&undoable("b"), &"2.do.0.0".parse().unwrap(), &mut context);
        completed(
            &undoable("c"),
            &"0.compensate.0".parse().unwrap(),
            &mut context,
        );
        assert_eq!(pending(&context), ["2.do.0.0", "0"]);
        assert_eq!(cancel_at(&context).as_deref(), Some("2.do.0.0"));
        begin(&mut context, RunStatus::Cancelled, None);
        assert_eq!(cancel_at(&context), None, "a compensating run");
        assert_eq!(take_next(&mut context).unwrap().to_string(), "2.do.0.0");
        assert_eq!(take_next(&mut context).unwrap().to_string(), "0");
        assert_eq!(take_next(&mut context), None);
        assert_eq!(context.reserved(COMPENSABLE_KEY), None);
        failed(
            &mut context,
            "compensation `undo_a` of step `a` failed: 500",
        );
        assert_eq!(
            end(&mut context),
            (
                RunStatus::Cancelled,
                Some(
                    "the run was cancelled, but not all of it was undone: \
                     compensation `undo_a` of step `a` failed: 500"
                        .into()
                )
            )
        );
        assert!(!is_compensating(&context));
    }

    #[test]
    fn a_failed_run_keeps_its_error_and_branches_merge_in_order() {
        let mut context = Context::default();
        begin(
            &mut context,
            RunStatus::Failed,
            Some("step `x` failed".into()),
        );
        failed(&mut context, "compensation `u` of step `a` failed");
        assert_eq!(error(&context).as_deref(), Some("step `x` failed"));
        assert_eq!(
            end(&mut context),
            (RunStatus::Failed, Some("step `x` failed".into()))
        );

        let mut run = Context::default();
        completed(&undoable("a"), &"0".parse().unwrap(), &mut run);
        let mut branch = run.clone();
        completed(
            &undoable("b"),
            &"1.branches.0.0".parse().unwrap(),
            &mut branch,
        );
        completed(&undoable("c"), &"1.branches.1.0".parse().unwrap(), &mut run);
        merge(&mut run, branch.as_value());
        assert_eq!(pending(&run), ["1.branches.0.0", "1.branches.1.0", "0"]);
    }
}
