//! The one walk over a step tree: every check of a definition (templates,
//! handler configs, the script guard, step counts, connection origins)
//! visits the steps through [`each_step`], so a child list can never be
//! skipped by one check and seen by another (docs/architecture.md, "The
//! tenant boundary").
//!
//! [`children`] is the only place that names a step's child lists. It
//! destructures [`Step`] without `..`, so a field added to the type does not
//! compile until it is listed here, as a child list or as a plain field.
//! [`ChildKind::ALL`] lists the kinds of child list; a test builds a step
//! with every one of them and every plain field filled, serializes it, and
//! requires every step found anywhere in that JSON to be visited at its
//! path, so a child list the walker skips fails the tests even if it
//! compiles.

use serde_json::{Value, json};

use crate::definition::{Automation, Escalation, Rule, Step};

/// A kind of child list, as a step's JSON names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChildKind {
    /// A condition's steps when it holds.
    Then,
    /// A condition's steps when it does not.
    Else,
    /// A loop's (or repeat's) body.
    Do,
    /// One branch of a `parallel` step (`branches.<b>`).
    Branch,
    /// The steps of one escalation level (`escalations.<l>.steps`).
    Escalation,
    /// What undoes a step.
    Compensate,
}

impl ChildKind {
    /// Every kind of child list, in the order [`children`] yields them.
    pub const ALL: [ChildKind; 6] = [
        ChildKind::Then,
        ChildKind::Else,
        ChildKind::Do,
        ChildKind::Branch,
        ChildKind::Escalation,
        ChildKind::Compensate,
    ];

    /// The step's JSON key that holds lists of this kind.
    pub fn key(self) -> &'static str {
        match self {
            ChildKind::Then => "then",
            ChildKind::Else => "else",
            ChildKind::Do => "do",
            ChildKind::Branch => "branches",
            ChildKind::Escalation => "escalations",
            ChildKind::Compensate => "compensate",
        }
    }

    /// A step that may hold lists of this kind and is valid once it holds
    /// one (a condition with a rule, a loop over `[1]`, a parallel step, a
    /// `wait_for_event` on a key, a log line that can be undone): for
    /// building trees in code and tests, such as the fuzz suite's hostile
    /// steps placed in every kind of list.
    pub fn holder(self, id: &str) -> Step {
        let (kind, config) = match self {
            ChildKind::Then | ChildKind::Else => ("condition", Value::Null),
            ChildKind::Do => ("loop", json!({"items": [1]})),
            ChildKind::Branch => (crate::parallel::PARALLEL, Value::Null),
            ChildKind::Escalation => (crate::waits::WAIT_FOR_EVENT, json!({"key": "k"})),
            ChildKind::Compensate => ("flow/log", json!({"message": "done"})),
        };
        let mut step = Step::new(id, kind, config);
        if kind == "condition" {
            step.rules = Some(vec![Rule {
                field: "x".into(),
                operator: crate::definition::Operator::IsEmpty,
                value: Value::Null,
            }]);
        }
        step
    }

    /// Adds `steps` to `parent` as one more list of this kind: appended to
    /// `then`, `else`, `do` or `compensate`, or as a new branch, or as a new
    /// escalation level an hour after the last one.
    pub fn add(self, parent: &mut Step, steps: Vec<Step>) {
        match self {
            ChildKind::Then => parent.then.extend(steps),
            ChildKind::Else => parent.else_.extend(steps),
            ChildKind::Do => parent.do_.extend(steps),
            ChildKind::Branch => parent.branches.push(steps),
            ChildKind::Escalation => {
                let after = format!("{}h", parent.escalations.len() + 1);
                parent.escalations.push(Escalation { after, steps });
            }
            ChildKind::Compensate => parent.compensate.extend(steps),
        }
    }
}

/// One of a step's child lists, with the path segment that leads to it
/// (`then`, `branches.1`, `escalations.0.steps`).
pub struct Children<'a> {
    pub kind: ChildKind,
    pub label: String,
    pub steps: &'a [Step],
}

/// Every child list of `step`, in the order of [`ChildKind::ALL`] (every
/// branch, every escalation level, empty lists included).
pub fn children(step: &Step) -> Vec<Children<'_>> {
    let Step {
        id: _,
        kind: _,
        config: _,
        match_: _,
        rules: _,
        field_id: _,
        operator: _,
        value: _,
        retry: _,
        then,
        else_,
        do_,
        branches,
        escalations,
        compensate,
    } = step;
    fn list(kind: ChildKind, steps: &[Step]) -> Children<'_> {
        Children {
            kind,
            label: kind.key().to_owned(),
            steps,
        }
    }
    let mut lists = vec![
        list(ChildKind::Then, then),
        list(ChildKind::Else, else_),
        list(ChildKind::Do, do_),
    ];
    lists.extend(branches.iter().enumerate().map(|(i, b)| Children {
        kind: ChildKind::Branch,
        label: format!("branches.{i}"),
        steps: b.as_slice(),
    }));
    lists.extend(escalations.iter().enumerate().map(|(i, e)| Children {
        kind: ChildKind::Escalation,
        label: format!("escalations.{i}.steps"),
        steps: e.steps.as_slice(),
    }));
    lists.push(list(ChildKind::Compensate, compensate));
    lists
}

/// Calls `visit(path, step)` for every step of `steps` and of every child
/// list below them, depth first, parents before their children. `at` is the
/// path of the list itself (`"steps"` for a definition's top level), and
/// each step's path is `at.index` (`steps.2.then.0`).
pub fn each_step<'a>(steps: &'a [Step], at: &str, visit: &mut impl FnMut(&str, &'a Step)) {
    for (i, step) in steps.iter().enumerate() {
        let here = format!("{at}.{i}");
        visit(&here, step);
        for list in children(step) {
            each_step(list.steps, &format!("{here}.{}", list.label), visit);
        }
    }
}

/// Number of steps in `steps` and everything nested under them.
pub fn count_steps(steps: &[Step]) -> usize {
    let mut count = 0;
    each_step(steps, "", &mut |_, _| count += 1);
    count
}

impl Automation {
    /// Number of steps in the whole tree, nested steps included.
    pub fn step_count(&self) -> usize {
        count_steps(&self.steps)
    }
}

#[cfg(test)]
mod tests;
