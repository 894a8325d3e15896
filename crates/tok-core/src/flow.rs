//! The pure decision of what runs next in a step tree.
//!
//! The engine runs the step at a path, publishes its outputs into the context,
//! then asks [`next`] where to go: into a condition's branch, into a loop's
//! body for the next iteration, on to the following sibling, back up out of a
//! finished branch, or to completion. The answer depends only on the tree, the
//! path and the published outputs (`result` of conditions, `count` of loops),
//! so a run that waited a week resumes exactly where it was.

use std::borrow::Cow;

use serde_json::{Map, Value};
use thiserror::Error;

use crate::definition::Step;
use crate::path::{Branch, FlowPath};

/// Why the next step cannot be decided. Both mean the stored run does not fit
/// its tree or its context, so the run must fail rather than guess.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FlowError {
    #[error("there is no step at path `{path}` in this automation version")]
    NoSuchStep { path: String },
    #[error(
        "step `{step_id}` has no output `{key}` in the context, which is needed to decide what runs next"
    )]
    MissingOutput { step_id: String, key: String },
    #[error(
        "step `{step_id}` has output `{key}` = {found}, but {expected} is needed to decide what runs next"
    )]
    BadOutput {
        step_id: String,
        key: String,
        expected: &'static str,
        found: String,
    },
}

/// Where the run goes after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Run the step at this path.
    Step(FlowPath),
    /// Nothing is left: the run is complete.
    Complete,
    /// Branch `branch` of the `parallel` step at `parallel` has run its
    /// last step: the branch is done (the parallel step joins its branches).
    BranchDone { parallel: FlowPath, branch: usize },
    /// Iteration `iteration` of the `repeat` step at `repeat` has run its
    /// last step: the repeat decides whether another one follows
    /// ([`crate::repeat::after_iteration`]).
    IterationDone { repeat: FlowPath, iteration: usize },
    /// Escalation level `level` of the waiting step at `waiting` has run
    /// its last step: the step waits again ([`crate::escalation`]).
    EscalationDone { waiting: FlowPath, level: usize },
    /// The `compensate` steps of the step at `step` have run: the next
    /// completed step is compensated, or the run ends
    /// ([`crate::compensation`]).
    CompensationDone { step: FlowPath },
}

/// The step at `path`, following `then`/`else`/`do` lists as the path says
/// (a `do` hop's iteration does not matter here).
pub fn step_at<'a>(steps: &'a [Step], path: &FlowPath) -> Option<&'a Step> {
    let mut step = steps.get(path.first())?;
    for &(branch, i) in path.hops() {
        step = children(step, branch).get(i)?;
    }
    Some(step)
}

/// Whether a failed run can go on with `steps` (another version of its
/// automation) at the `path` of its failed step `step_id`: the path must
/// lead to a step of that id there, else a retry on that version would run
/// another step in its place. The reason says what is there instead.
pub fn resumes_at(steps: &[Step], path: &str, step_id: &str) -> Result<(), String> {
    let at: FlowPath = path.parse().map_err(|e| format!("{e}"))?;
    match step_at(steps, &at) {
        Some(step) if step.id == step_id => Ok(()),
        Some(step) => Err(format!(
            "the failed step `{step_id}` is not at {path} in that version (`{}` is)",
            step.id
        )),
        None => Err(format!(
            "the failed step `{step_id}` is not at {path} in that version (no step is)"
        )),
    }
}

fn children(step: &Step, branch: Branch) -> &[Step] {
    match branch {
        Branch::Then => &step.then,
        Branch::Else => &step.else_,
        Branch::Do(_) => &step.do_,
        Branch::Parallel(b) => step.branches.get(b).map_or(&[], Vec::as_slice),
        Branch::Item(_) => &step.do_,
        Branch::Escalation(l) => step.escalations.get(l).map_or(&[], |e| e.steps.as_slice()),
        Branch::Compensate => &step.compensate,
    }
}

/// The path of a run's first step, or `None` for an empty tree.
pub fn first_path(steps: &[Step]) -> Option<FlowPath> {
    (!steps.is_empty()).then(|| FlowPath::root(0))
}

/// Where a run starts: the first top-level step, or completion for an empty tree.
pub fn first(steps: &[Step]) -> Next {
    if steps.is_empty() {
        Next::Complete
    } else {
        Next::Step(FlowPath::root(0))
    }
}

/// The step to run after the one at `path` finished and its outputs were
/// published into `ctx` under its id.
///
/// - `condition`: its `result` picks `then` or `else`; an empty branch goes on
///   after the condition.
/// - `loop`: its `count` > 0 enters iteration 0 of `do`; otherwise after the loop.
/// - `end`: completion.
/// - anything else: the next sibling; at the end of a list, back up: after the
///   condition for a branch, the next iteration (while below the loop's
///   `count`) or after the loop for a loop body, the branch done for a
///   `parallel` step's branch, completion for the top list. (A `parallel`
///   step itself goes on after itself once its branches joined.)
pub fn next(steps: &[Step], path: &FlowPath, ctx: &Value) -> Result<Next, FlowError> {
    let step = step_at(steps, path).ok_or_else(|| FlowError::NoSuchStep {
        path: path.to_string(),
    })?;
    match step.kind.as_str() {
        "condition" => {
            let result = output_bool(ctx, &step.id, "result")?;
            let (branch, list) = if result {
                (Branch::Then, &step.then)
            } else {
                (Branch::Else, &step.else_)
            };
            if list.is_empty() {
                after(steps, path, ctx)
            } else {
                Ok(Next::Step(path.child(branch, 0)))
            }
        }
        "loop" => {
            let count = output_count(ctx, &step.id)?;
            if count > 0 && !step.do_.is_empty() {
                Ok(Next::Step(path.child(Branch::Do(0), 0)))
            } else {
                after(steps, path, ctx)
            }
        }
        "end" => Ok(Next::Complete),
        // A repeat is entered by the decider, and goes on after itself
        // once its iterations are over.
        _ => after(steps, path, ctx),
    }
}

/// The step after the one at `path` when its own children are done or absent.
fn after(steps: &[Step], path: &FlowPath, ctx: &Value) -> Result<Next, FlowError> {
    let mut current = path.clone();
    loop {
        let sibling = current.sibling(current.index() + 1);
        let list_len = match current.parent() {
            None => steps.len(),
            Some(parent) => {
                let branch = current.branch().expect("a path with a parent has a branch");
                let parent_step = step_at(steps, &parent).ok_or_else(|| FlowError::NoSuchStep {
                    path: parent.to_string(),
                })?;
                children(parent_step, branch).len()
            }
        };
        if sibling.index() < list_len {
            return Ok(Next::Step(sibling));
        }
        let Some(parent) = current.parent() else {
            return Ok(Next::Complete);
        };
        if let Some(Branch::Parallel(branch) | Branch::Item(branch)) = current.branch() {
            return Ok(Next::BranchDone {
                parallel: parent,
                branch,
            });
        }
        if let Some(Branch::Compensate) = current.branch() {
            return Ok(Next::CompensationDone { step: parent });
        }
        if let Some(Branch::Escalation(level)) = current.branch() {
            return Ok(Next::EscalationDone {
                waiting: parent,
                level,
            });
        }
        if let Some(Branch::Do(iteration)) = current.branch() {
            let loop_step = step_at(steps, &parent).ok_or_else(|| FlowError::NoSuchStep {
                path: parent.to_string(),
            })?;
            if loop_step.kind == crate::repeat::REPEAT {
                return Ok(Next::IterationDone {
                    repeat: parent,
                    iteration,
                });
            }
            let count = output_count(ctx, &loop_step.id)?;
            if iteration + 1 < count {
                return Ok(Next::Step(parent.child(Branch::Do(iteration + 1), 0)));
            }
        }
        current = parent;
    }
}

fn output<'a>(ctx: &'a Value, step_id: &str, key: &str) -> Result<&'a Value, FlowError> {
    ctx.get(step_id)
        .and_then(|outputs| outputs.get(key))
        .ok_or_else(|| FlowError::MissingOutput {
            step_id: step_id.to_owned(),
            key: key.to_owned(),
        })
}

fn output_bool(ctx: &Value, step_id: &str, key: &str) -> Result<bool, FlowError> {
    let v = output(ctx, step_id, key)?;
    v.as_bool().ok_or_else(|| FlowError::BadOutput {
        step_id: step_id.to_owned(),
        key: key.to_owned(),
        expected: "true or false",
        found: v.to_string(),
    })
}

fn output_count(ctx: &Value, step_id: &str) -> Result<usize, FlowError> {
    let v = output(ctx, step_id, "count")?;
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| FlowError::BadOutput {
            step_id: step_id.to_owned(),
            key: "count".to_owned(),
            expected: "a non-negative integer",
            found: v.to_string(),
        })
}

/// The view the step at `path` sees: `ctx` plus, for each enclosing loop
/// or `for_each` item (outermost first), `<loop_id>.item` and
/// `<loop_id>.index` for the current iteration, and bare `item` / `index`
/// for the innermost one; inside a `for_each` item, also what the item's
/// steps published, under their ids ([`crate::for_each::overlay`]). An item
/// past the end of the loop's `items` is `null`. Outside loops that is
/// `ctx` itself (borrowed); inside one, a copy, and `ctx` is untouched.
pub fn scope<'c>(steps: &[Step], path: &FlowPath, ctx: &'c Value) -> Cow<'c, Value> {
    if !path
        .hops()
        .iter()
        .any(|(branch, _)| matches!(branch, Branch::Do(_) | Branch::Item(_)))
    {
        return Cow::Borrowed(ctx);
    }
    let mut view = ctx.clone();
    let Value::Object(map) = &mut view else {
        return Cow::Owned(view);
    };
    let mut innermost = None;
    for (ancestor, branch) in path.enclosing() {
        let iteration = match branch {
            Branch::Do(iteration) => iteration,
            Branch::Item(n) => {
                crate::for_each::overlay(map, ctx, &ancestor, n);
                n
            }
            _ => continue,
        };
        let Some(loop_step) = step_at(steps, &ancestor) else {
            continue;
        };
        let item = map
            .get(&loop_step.id)
            .and_then(|o| o.get("items"))
            .and_then(|items| items.get(iteration))
            .cloned()
            .unwrap_or(Value::Null);
        let entry = map
            .entry(loop_step.id.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        if let Value::Object(outputs) = entry {
            outputs.insert("item".to_owned(), item.clone());
            outputs.insert("index".to_owned(), Value::from(iteration));
        }
        innermost = Some((item, iteration));
    }
    if let Some((item, iteration)) = innermost {
        map.insert("item".to_owned(), item);
        map.insert("index".to_owned(), Value::from(iteration));
    }
    Cow::Owned(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(s: &str) -> FlowPath {
        s.parse().unwrap()
    }

    fn step(id: &str, kind: &str) -> Step {
        Step::new(id, kind, Value::Null)
    }

    /// 0 a; 1 cond (then: t0, t1; else: e0); 2 loop (do: d0, d1); 3 z
    fn tree() -> Vec<Step> {
        let mut cond = step("cond", "condition");
        cond.then = vec![step("t0", "set"), step("t1", "set")];
        cond.else_ = vec![step("e0", "set")];
        let mut lp = step("lp", "loop");
        lp.do_ = vec![step("d0", "set"), step("d1", "set")];
        vec![step("a", "set"), cond, lp, step("z", "set")]
    }

    fn go(steps: &[Step], from: &str, ctx: &Value) -> Next {
        next(steps, &p(from), ctx).unwrap()
    }

    #[test]
    fn step_at_follows_the_path() {
        let t = tree();
        assert_eq!(step_at(&t, &p("1.then.1")).unwrap().id, "t1");
        assert_eq!(step_at(&t, &p("1.else.0")).unwrap().id, "e0");
        assert_eq!(step_at(&t, &p("2.do.7.1")).unwrap().id, "d1");
        assert!(step_at(&t, &p("1.else.1")).is_none());
        assert!(step_at(&t, &p("4")).is_none());
        assert!(step_at(&t, &p("0.then.0")).is_none());
    }

    #[test]
    fn a_retry_resumes_only_where_the_failed_step_still_is() {
        let t = tree();
        assert_eq!(resumes_at(&t, "1.then.1", "t1"), Ok(()));
        assert_eq!(resumes_at(&t, "2.do.3.1", "d1"), Ok(()));
        let moved = resumes_at(&t, "1.then.1", "t0").unwrap_err();
        assert!(moved.contains("`t1` is"), "{moved}");
        let gone = resumes_at(&t, "7", "t1").unwrap_err();
        assert!(gone.contains("no step is"), "{gone}");
        assert!(resumes_at(&t, "x.y", "t1").is_err());
    }

    #[test]
    fn first_step_or_complete() {
        assert_eq!(first(&tree()), Next::Step(p("0")));
        assert_eq!(first(&[]), Next::Complete);
    }

    #[test]
    fn condition_picks_a_branch_and_climbs_out_of_it() {
        let t = tree();
        let yes = json!({"cond": {"result": true}});
        let no = json!({"cond": {"result": false}});
        assert_eq!(go(&t, "0", &yes), Next::Step(p("1")));
        assert_eq!(go(&t, "1", &yes), Next::Step(p("1.then.0")));
        assert_eq!(go(&t, "1.then.0", &yes), Next::Step(p("1.then.1")));
        assert_eq!(go(&t, "1.then.1", &yes), Next::Step(p("2")));
        assert_eq!(go(&t, "1", &no), Next::Step(p("1.else.0")));
        assert_eq!(go(&t, "1.else.0", &no), Next::Step(p("2")));
    }

    #[test]
    fn empty_branch_goes_on_after_the_condition() {
        let mut t = tree();
        t[1].else_.clear();
        assert_eq!(
            go(&t, "1", &json!({"cond": {"result": false}})),
            Next::Step(p("2"))
        );
    }

    #[test]
    fn loop_iterates_count_times_then_goes_on() {
        let t = tree();
        let ctx = json!({"lp": {"count": 2, "items": ["x", "y"]}});
        assert_eq!(go(&t, "2", &ctx), Next::Step(p("2.do.0.0")));
        assert_eq!(go(&t, "2.do.0.0", &ctx), Next::Step(p("2.do.0.1")));
        assert_eq!(go(&t, "2.do.0.1", &ctx), Next::Step(p("2.do.1.0")));
        assert_eq!(go(&t, "2.do.1.1", &ctx), Next::Step(p("3")));
        assert_eq!(go(&t, "3", &ctx), Next::Complete);
        let empty = json!({"lp": {"count": 0, "items": []}});
        assert_eq!(go(&t, "2", &empty), Next::Step(p("3")));
    }

    #[test]
    fn end_completes_even_when_nested() {
        let mut t = tree();
        t[1].then[0] = step("stop", "end");
        assert_eq!(
            go(&t, "1.then.0", &json!({"cond": {"result": true}})),
            Next::Complete
        );
    }

    #[test]
    fn nested_loop_end_climbs_through_both_levels() {
        let mut inner = step("inner", "loop");
        inner.do_ = vec![step("x", "set")];
        let mut outer = step("outer", "loop");
        outer.do_ = vec![inner];
        let t = vec![outer];
        let ctx = json!({"outer": {"count": 2}, "inner": {"count": 1}});
        assert_eq!(go(&t, "0.do.0.0.do.0.0", &ctx), Next::Step(p("0.do.1.0")));
        assert_eq!(go(&t, "0.do.1.0.do.0.0", &ctx), Next::Complete);
    }

    #[test]
    fn a_compensation_list_ends_in_its_own_step_not_after_it() {
        let mut t = tree();
        t[2].do_[1].compensate = vec![step("u0", "set"), step("u1", "set")];
        let ctx = json!({"lp": {"count": 2}});
        assert_eq!(step_at(&t, &p("2.do.1.1.compensate.1")).unwrap().id, "u1");
        assert_eq!(
            go(&t, "2.do.1.1.compensate.0", &ctx),
            Next::Step(p("2.do.1.1.compensate.1"))
        );
        assert_eq!(
            go(&t, "2.do.1.1.compensate.1", &ctx),
            Next::CompensationDone {
                step: p("2.do.1.1")
            }
        );
    }

    #[test]
    fn errors_name_the_path_or_the_step_and_key() {
        let t = tree();
        let err = next(&t, &p("9"), &json!({})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "there is no step at path `9` in this automation version"
        );
        let err = next(&t, &p("1"), &json!({})).unwrap_err();
        assert_eq!(
            err,
            FlowError::MissingOutput {
                step_id: "cond".into(),
                key: "result".into()
            }
        );
        assert!(err.to_string().contains("`cond`") && err.to_string().contains("`result`"));
        let err = next(&t, &p("2.do.0.1"), &json!({})).unwrap_err();
        assert!(matches!(err, FlowError::MissingOutput { ref step_id, .. } if step_id == "lp"));
        let err = next(&t, &p("2"), &json!({"lp": {"count": "2"}})).unwrap_err();
        assert!(matches!(err, FlowError::BadOutput { .. }), "{err}");
    }

    #[test]
    fn scope_exposes_loop_items_innermost_bare() {
        let mut inner = step("inner", "loop");
        inner.do_ = vec![step("x", "set")];
        let mut outer = step("outer", "loop");
        outer.do_ = vec![inner];
        let t = vec![outer];
        let ctx = json!({
            "outer": {"count": 2, "items": ["o0", "o1"]},
            "inner": {"count": 3, "items": [10, 11, 12]},
            "keep": true
        });
        let view = scope(&t, &p("0.do.1.0.do.2.0"), &ctx);
        assert_eq!(view["outer"]["item"], json!("o1"));
        assert_eq!(view["outer"]["index"], json!(1));
        assert_eq!(view["inner"]["item"], json!(12));
        assert_eq!(view["inner"]["index"], json!(2));
        assert_eq!(view["item"], json!(12));
        assert_eq!(view["index"], json!(2));
        assert_eq!(view["keep"], json!(true));
        assert!(ctx.get("item").is_none(), "ctx must not change");

        let outside = scope(&t, &p("0"), &ctx);
        assert!(
            matches!(outside, Cow::Borrowed(_)),
            "outside a loop the view is ctx itself"
        );
        assert_eq!(*outside, ctx);
    }
}
