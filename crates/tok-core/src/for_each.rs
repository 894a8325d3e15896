//! Fan-out over items found at run time (docs/workflows.md, "`for_each`"): a
//! `for_each` step runs its `do` list once per item of `config.items`, each
//! item as a branch job of its own (like a branch of a `parallel` step),
//! at most `config.concurrency` at once, and goes on when its completion
//! rule is met: every item done (`"all"`, the default), the first
//! (`"any"`), or `{"atLeast": n}`.
//!
//! How the decider drives it: reaching the step, it renders the items,
//! publishes them (`<id>.items`, `<id>.count`: an item's steps read their
//! item as `item` and `index`, as in a loop) and forks
//! ([`crate::run::NextJob::Fork`] with [`ItemsJoin`]): the step's job parks
//! and a job starts each of the first `concurrency` items at
//! `<path>.items.<n>.0`. The store counts the items done on the parked job
//! ([`crate::run::Resume::Branches`]) in the items' record transactions,
//! which a run's lock serializes: each item that ends starts the next one
//! not started, so no more than `concurrency` run at once; once the rule
//! is met, the items still running are cancelled (their jobs and waits
//! deleted; a step of theirs in flight loses its lease) and the parked job
//! is due. A failed item fails the step (`item_failed`), as a failed
//! branch fails a `parallel` step.
//!
//! Items run the same steps, so an item's steps do not publish under their
//! ids at the top of the run's context, where items running at the same
//! time would overwrite each other: each item keeps its steps' outputs in
//! a reserved entry of its own ([`item_key`]), which its steps see at the
//! top of their scope ([`crate::flow::scope`]). When the step joins, those
//! entries become its `results`, in item order (`null` for an item that
//! did not finish), and leave the context.
//!
//! The cancelled items' completed steps that have `compensate` steps are
//! undone when the step joins, the most recent first, before the step
//! completes ([`begin_undo`]): a fan-out that asks three suppliers to
//! reserve stock and goes on with the first releases the other two. They
//! are taken off the run's own list of steps to compensate; a cancel of
//! the run meanwhile puts back what is left ([`abandon_undo`]). That
//! bookkeeping is the run's compensation's ([`crate::compensation`]), and
//! the join the parked job keeps ([`ItemsJoin`]) a run's value
//! ([`crate::run`]); both are re-exported here.

use serde_json::{Map, Value, json};

pub use crate::compensation::{
    UNDOING_KEY, abandon_undo, begin_undo, end_undo, next_undo, undo_left, undoing,
};
use crate::context::Context;
use crate::definition::Step;
use crate::error::StepError;
use crate::limits::{MAX_FOR_EACH_CONCURRENCY, MAX_LOOP_ITEMS};
use crate::path::{Branch, FlowPath};
pub use crate::run::ItemsJoin;
use crate::template;

/// The step type that runs its `do` list for each item, several at once.
pub const FOR_EACH: &str = "for_each";

/// Items that run at once when `config.concurrency` is not given.
pub const DEFAULT_CONCURRENCY: usize = 10;

/// When a `for_each` step is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Complete {
    /// Every item is done.
    All,
    /// One item is done: the others are cancelled.
    Any,
    /// This many items are done: the others are cancelled.
    AtLeast(usize),
}

/// What a `for_each` step runs, from its config rendered against the scope.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub items: Vec<Value>,
    pub concurrency: usize,
    pub complete: Complete,
}

impl Spec {
    /// The items done that complete the step.
    pub fn need(&self) -> usize {
        match self.complete {
            Complete::All => self.items.len(),
            Complete::Any => 1,
            Complete::AtLeast(n) => n,
        }
    }
}

/// The spec of the `for_each` `step`: its items (an array, or a template
/// that renders to one), at most `maxItems` (default and ceiling
/// [`MAX_LOOP_ITEMS`]), `concurrency` (1 to [`MAX_FOR_EACH_CONCURRENCY`],
/// default [`DEFAULT_CONCURRENCY`]) and `complete`. Every problem is a
/// terminal error naming the step and what was expected.
pub fn spec(step: &Step, scope: &Value) -> Result<Spec, StepError> {
    let config = template::render_config(&step.config, scope)
        .map_err(|e| StepError::terminal(format!("step `{}` {e}", step.id)))?;
    let items = match config.get("items") {
        Some(Value::Array(items)) => items.clone(),
        None | Some(Value::Null) => {
            return Err(StepError::terminal(format!(
                "for_each `{}` has no config.items; give an array or a template like \
                 `{{{{order.lines}}}}`",
                step.id
            )));
        }
        Some(other) => {
            return Err(StepError::terminal(format!(
                "for_each `{}` needs config.items to be an array, but got {other}",
                step.id
            )));
        }
    };
    let max_items = match config.get("maxItems") {
        None | Some(Value::Null) => MAX_LOOP_ITEMS,
        Some(v) => whole(v)
            .filter(|n| *n >= 1)
            .map(|n| n.min(MAX_LOOP_ITEMS))
            .ok_or_else(|| {
                StepError::terminal(format!(
                    "for_each `{}` needs config.maxItems to be a whole number from 1 to \
                     {MAX_LOOP_ITEMS}, but got {v}",
                    step.id
                ))
            })?,
    };
    if items.len() > max_items {
        return Err(StepError::terminal(format!(
            "too_many_items: for_each `{}` got {} items, more than its limit of {max_items} \
             (`config.maxItems`)",
            step.id,
            items.len()
        )));
    }
    let concurrency = match config.get("concurrency") {
        None | Some(Value::Null) => DEFAULT_CONCURRENCY,
        Some(v) => whole(v)
            .filter(|n| (1..=MAX_FOR_EACH_CONCURRENCY).contains(n))
            .ok_or_else(|| {
                StepError::terminal(format!(
                    "for_each `{}` needs config.concurrency to be a whole number from 1 to \
                     {MAX_FOR_EACH_CONCURRENCY}, but got {v}",
                    step.id
                ))
            })?,
    };
    let complete = complete_of(config.get("complete")).map_err(|found| {
        StepError::terminal(format!(
            "for_each `{}` config.complete must be \"all\", \"any\" or {{\"atLeast\": n}} with \
             n ≥ 1, not {found}",
            step.id
        ))
    })?;
    if let Complete::AtLeast(n) = complete
        && n > items.len()
        && !items.is_empty()
    {
        return Err(StepError::terminal(format!(
            "for_each `{}` completes when {n} items are done (`complete.atLeast`), but it got \
             only {} items",
            step.id,
            items.len()
        )));
    }
    Ok(Spec {
        items,
        concurrency,
        complete,
    })
}

/// A `complete` value: absent is `all`; `Err` with what was found.
pub fn complete_of(value: Option<&Value>) -> Result<Complete, String> {
    match value {
        None | Some(Value::Null) => Ok(Complete::All),
        Some(Value::String(s)) if s == "all" => Ok(Complete::All),
        Some(Value::String(s)) if s == "any" => Ok(Complete::Any),
        Some(Value::Object(map)) if map.len() == 1 => match map.get("atLeast").and_then(whole) {
            Some(n) if n >= 1 => Ok(Complete::AtLeast(n)),
            _ => Err(Value::Object(map.clone()).to_string()),
        },
        Some(other) => Err(other.to_string()),
    }
}

/// A whole number, or a string of one (a rendered template).
fn whole(v: &Value) -> Option<usize> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        .and_then(|n| usize::try_from(n).ok())
}

/// The jobs a `for_each` step at `path` starts first: its first
/// `concurrency` items, each with the path of its first step.
pub fn forks(spec: &Spec, path: &FlowPath) -> Vec<(usize, String)> {
    (0..spec.items.len().min(spec.concurrency))
        .map(|n| (n, path.child(Branch::Item(n), 0).to_string()))
        .collect()
}

/// The path of item `n`'s first step of the `for_each` step at `path`.
pub fn item_start(path: &str, n: usize) -> String {
    format!("{path}.items.{n}.0")
}

/// The reserved context entry where item `n` of the `for_each` step at
/// `path` keeps its steps' outputs, by step id.
pub fn item_key(path: &FlowPath, n: usize) -> String {
    format!("_item:{path}:{n}")
}

/// Takes out of the context what items of the `for_each` step at `path`
/// kept from an earlier attempt (a failed run retried at the step), so
/// that its results are only this attempt's.
pub fn clear_items(context: &mut Context, path: &FlowPath) {
    let prefix = format!("_item:{path}:");
    let stale: Vec<String> = match context.as_value() {
        Value::Object(map) => map
            .keys()
            .filter(|k| k.starts_with(prefix.as_str()))
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    for key in stale {
        context.set_reserved(&key, None);
    }
}

/// The innermost item a step at `path` runs in: the `for_each` step's
/// path and the item.
fn innermost_item(path: &FlowPath) -> Option<(FlowPath, usize)> {
    path.enclosing()
        .into_iter()
        .rev()
        .find_map(|(ancestor, branch)| match branch {
            Branch::Item(n) => Some((ancestor, n)),
            _ => None,
        })
}

/// Publishes the outputs of the step `step_id` at `path`: into its item's
/// entry inside an item of a `for_each` step (`true`), else nothing is done
/// here (`false`: the caller publishes under the step's id).
pub fn publish_in_item(
    context: &mut Context,
    path: &FlowPath,
    step_id: &str,
    outputs: &Map<String, Value>,
) -> bool {
    if path.compensated().is_some() {
        return false;
    }
    let Some((for_each, n)) = innermost_item(path) else {
        return false;
    };
    let key = item_key(&for_each, n);
    let mut entry = match context.reserved(&key) {
        Some(Value::Object(map)) => map.clone(),
        _ => Map::new(),
    };
    entry.insert(step_id.to_owned(), Value::Object(outputs.clone()));
    context.set_reserved(&key, Some(Value::Object(entry)));
    true
}

/// Publishes a step's outputs where its path says: its item's entry, or
/// under its id ([`Context::publish`]). For a store merging a branch's
/// records, whose paths are text.
pub fn publish(context: &mut Context, path: &str, step_id: &str, outputs: &Map<String, Value>) {
    let in_item = path
        .parse::<FlowPath>()
        .is_ok_and(|at| publish_in_item(context, &at, step_id, outputs));
    if !in_item {
        context.publish(step_id, outputs);
    }
}

/// Adds to `view` (a step's scope) what the items it runs in published,
/// outermost first, so that an item's steps read their own item's
/// outputs under their ids.
pub fn overlay(view: &mut Map<String, Value>, context: &Value, ancestor: &FlowPath, n: usize) {
    if let Some(Value::Object(entry)) = context.get(item_key(ancestor, n)) {
        for (id, outputs) in entry {
            view.insert(id.clone(), outputs.clone());
        }
    }
}

/// The outputs of a `for_each` step at `path` whose `total` items joined
/// (`done`: the items done, in the order they were done; `cancelled`: the
/// items stopped when it completed), with its items' entries taken out of
/// the context.
pub fn joined(
    context: &mut Context,
    path: &FlowPath,
    total: usize,
    done: &[usize],
    cancelled: &[usize],
) -> Map<String, Value> {
    let mut results = Vec::with_capacity(total);
    for n in 0..total {
        let key = item_key(path, n);
        let entry = context.reserved(&key).cloned();
        if entry.is_some() {
            context.set_reserved(&key, None);
        }
        let finished = done.contains(&n);
        results.push(match entry {
            Some(outputs) if finished => outputs,
            _ if finished => json!({}),
            _ => Value::Null,
        });
    }
    Map::from_iter([
        ("count".to_owned(), json!(total)),
        ("results".to_owned(), Value::Array(results)),
        ("completed".to_owned(), json!(done.len())),
        ("cancelled".to_owned(), json!(cancelled.len())),
        (
            "first".to_owned(),
            done.first().map_or(Value::Null, |n| json!(n)),
        ),
    ])
}

/// What a `for_each` step publishes while its items run: the items, for
/// their steps' `item`.
pub fn forked(spec: &Spec) -> Map<String, Value> {
    Map::from_iter([
        ("count".to_owned(), json!(spec.items.len())),
        ("items".to_owned(), Value::Array(spec.items.clone())),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(config: Value) -> Step {
        serde_json::from_value(json!({
            "id": "fe", "type": "for_each", "config": config,
            "do": [{"id": "call", "type": "http"}]
        }))
        .unwrap()
    }

    #[test]
    fn a_spec_reads_items_concurrency_and_the_completion_rule() {
        let scope = json!({"lines": [1, 2, 3, 4], "n": "2"});
        let spec = spec(
            &step(json!({"items": "{{lines}}", "concurrency": "{{n}}", "complete": "any"})),
            &scope,
        )
        .unwrap();
        assert_eq!(spec.items.len(), 4);
        assert_eq!(spec.concurrency, 2);
        assert_eq!(spec.need(), 1);
        let spec = super::spec(&step(json!({"items": [1, 2]})), &scope).unwrap();
        assert_eq!((spec.concurrency, spec.need()), (DEFAULT_CONCURRENCY, 2));
        let spec = super::spec(
            &step(json!({"items": [1, 2, 3], "complete": {"atLeast": 2}})),
            &scope,
        )
        .unwrap();
        assert_eq!(spec.need(), 2);
    }

    #[test]
    fn a_bad_spec_is_a_terminal_error_that_says_what_was_expected() {
        let scope = json!({"lines": [1, 2, 3], "name": "x"});
        let cases = [
            (json!({}), "has no config.items"),
            (
                json!({"items": "{{name}}"}),
                "needs config.items to be an array, but got \"x\"",
            ),
            (
                json!({"items": "{{lines}}", "maxItems": 2}),
                "too_many_items: for_each `fe` got 3 items, more than its limit of 2",
            ),
            (
                json!({"items": [1], "concurrency": 0}),
                "concurrency to be a whole number from 1 to",
            ),
            (
                json!({"items": [1], "concurrency": 1000}),
                "concurrency to be a whole number from 1 to",
            ),
            (
                json!({"items": [1], "complete": "some"}),
                "config.complete must be",
            ),
            (
                json!({"items": [1], "complete": {"atLeast": 0}}),
                "config.complete must be",
            ),
            (
                json!({"items": [1, 2], "complete": {"atLeast": 3}}),
                "completes when 3 items are done (`complete.atLeast`), but it got only 2 items",
            ),
        ];
        for (config, expected) in cases {
            let error = spec(&step(config.clone()), &scope).expect_err(&config.to_string());
            assert!(!error.is_retryable(), "{config}");
            assert!(
                error.message().contains(expected),
                "{config}: expected `{expected}` in {}",
                error.message()
            );
        }
    }

    #[test]
    fn items_publish_apart_and_join_as_results_in_item_order() {
        let at: FlowPath = "1".parse().unwrap();
        let mut context = Context::default();
        let outputs = |v: i64| Map::from_iter([("v".to_owned(), json!(v))]);
        for (n, v) in [(2, 20), (0, 0), (1, 10)] {
            let path = at.child(Branch::Item(n), 0);
            assert!(publish_in_item(&mut context, &path, "call", &outputs(v)));
        }
        assert!(
            context.as_value().get("call").is_none(),
            "no item publishes at the top"
        );
        let out = joined(&mut context, &at, 4, &[2, 0, 1], &[3]);
        assert_eq!(
            Value::Object(out),
            json!({
                "count": 4,
                "results": [{"call": {"v": 0}}, {"call": {"v": 10}}, {"call": {"v": 20}}, null],
                "completed": 3, "cancelled": 1, "first": 2
            })
        );
        assert_eq!(
            context.as_value(),
            &json!({}),
            "the items' entries leave the context"
        );
        let top: FlowPath = "0".parse().unwrap();
        assert!(!publish_in_item(&mut context, &top, "a", &outputs(1)));
    }
}
