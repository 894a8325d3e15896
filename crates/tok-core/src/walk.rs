//! The one walk over a step tree: every check of a definition (templates,
//! handler configs, the script guard, step counts, connection origins)
//! visits the steps through [`each_step`], so a child list can never be
//! skipped by one check and seen by another (DESIGN §15, "One walker").
//!
//! [`children`] is the only place that names a step's child lists. It
//! destructures [`Step`] without `..`, so a field added to the type does not
//! compile until it is listed here, as a child list or as a plain field.

use crate::definition::Step;

/// One of a step's child lists, with the path segment that leads to it
/// (`then`, `branches.1`, `escalations.0.steps`).
pub struct Children<'a> {
    pub label: String,
    pub steps: &'a [Step],
}

/// Every child list of `step`, in the order a reader of the JSON meets them.
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
    let mut lists = vec![
        Children {
            label: "then".into(),
            steps: then,
        },
        Children {
            label: "else".into(),
            steps: else_,
        },
        Children {
            label: "do".into(),
            steps: do_,
        },
    ];
    lists.extend(branches.iter().enumerate().map(|(i, b)| Children {
        label: format!("branches.{i}"),
        steps: b.as_slice(),
    }));
    lists.extend(escalations.iter().enumerate().map(|(i, e)| Children {
        label: format!("escalations.{i}.steps"),
        steps: e.steps.as_slice(),
    }));
    lists.push(Children {
        label: "compensate".into(),
        steps: compensate,
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::Automation;

    #[test]
    fn every_child_list_is_visited_with_its_path() {
        let a = Automation::from_json(
            r#"{"name": "w", "trigger": {"kind": "manual"}, "steps": [
                {"id": "c", "type": "condition", "rules": [],
                 "then": [{"id": "t", "type": "flow/log"}],
                 "else": [{"id": "e", "type": "flow/log"}]},
                {"id": "l", "type": "loop", "do": [{"id": "d", "type": "flow/log"}]},
                {"id": "p", "type": "parallel", "branches": [[{"id": "b0", "type": "flow/log"}],
                                                             [{"id": "b1", "type": "flow/log"}]]},
                {"id": "w", "type": "wait_for_event",
                 "escalations": [{"after": "1h", "steps": [{"id": "x", "type": "flow/log"}]}],
                 "compensate": [{"id": "u", "type": "flow/log"}]}
            ]}"#,
        )
        .unwrap();
        let mut seen = Vec::new();
        each_step(&a.steps, "steps", &mut |path, step| {
            seen.push(format!("{path}={}", step.id))
        });
        assert_eq!(
            seen,
            [
                "steps.0=c",
                "steps.0.then.0=t",
                "steps.0.else.0=e",
                "steps.1=l",
                "steps.1.do.0=d",
                "steps.2=p",
                "steps.2.branches.0.0=b0",
                "steps.2.branches.1.0=b1",
                "steps.3=w",
                "steps.3.escalations.0.steps.0=x",
                "steps.3.compensate.0=u",
            ]
        );
    }
}
