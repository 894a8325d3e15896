use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::definition::{Automation, Match, Operator};
use crate::retry::RetryPolicy;

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

/// A step with every plain field set and, while `depth` lasts, two lists of
/// every [`ChildKind`], each holding a step built the same way.
fn filled(id: &str, depth: usize) -> Step {
    let mut step = Step::new(id, "flow/log", json!({"message": "m"}));
    step.match_ = Some(Match::Any);
    step.rules = Some(vec![Rule {
        field: "f".into(),
        operator: Operator::Eq,
        value: json!(1),
    }]);
    step.field_id = Some("f".into());
    step.operator = Some(Operator::Eq);
    step.value = Some(json!(1));
    step.retry = Some(RetryPolicy {
        max_attempts: 2,
        backoff: vec![Duration::from_secs(1)],
    });
    if depth > 0 {
        for round in 0..2 {
            for kind in ChildKind::ALL {
                let child = filled(&format!("{id}_{}{round}", kind.key()), depth - 1);
                kind.add(&mut step, vec![child]);
            }
        }
    }
    step
}

/// The paths of every object in `value` that is a step (has `id` and
/// `type`), wherever it sits: found from the JSON, not from the types.
fn steps_in_json(value: &Value, at: &str, found: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            if map.contains_key("id") && map.contains_key("type") {
                found.insert(at.to_owned());
            }
            for (key, inner) in map {
                steps_in_json(inner, &format!("{at}.{key}"), found);
            }
        }
        Value::Array(items) => {
            for (i, inner) in items.iter().enumerate() {
                steps_in_json(inner, &format!("{at}.{i}"), found);
            }
        }
        _ => {}
    }
}

/// The field names serde knows for `Step`, read from its own refusal of
/// an unknown field ("expected one of `id`, `type`, …"), so a field added
/// to the type is on this list without anyone adding it here.
fn step_fields() -> Vec<String> {
    let err = serde_json::from_value::<Step>(json!({"id": "a", "type": "b", "?": 0}))
        .unwrap_err()
        .to_string();
    let (_, list) = err
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("serde lists the fields: {err}"));
    list.split(", ")
        .map(|f| f.trim_matches('`').to_owned())
        .collect()
}

#[test]
fn the_test_step_fills_every_field_of_a_step() {
    let json = serde_json::to_value(filled("s", 1)).unwrap();
    let fields = step_fields();
    assert!(fields.len() >= 15, "{fields:?}");
    for field in fields {
        assert!(
            json.get(&field).is_some(),
            "`{field}` is empty in the test step: a plain field is set in `filled`, a child \
             list is one of `ChildKind::ALL` (and a case of `walk::children`)"
        );
    }
}

#[test]
fn every_step_anywhere_in_the_json_is_visited_at_its_path() {
    let tree = vec![filled("s", 2)];
    let mut in_json = BTreeSet::new();
    steps_in_json(&serde_json::to_value(&tree).unwrap(), "steps", &mut in_json);
    // Two of each of the six kinds under the root, six under each of them.
    assert_eq!(in_json.len(), 1 + 12 + 12 * 12, "{in_json:#?}");

    let mut visited = Vec::new();
    each_step(&tree, "steps", &mut |path, _| visited.push(path.to_owned()));
    let visited_set: BTreeSet<String> = visited.iter().cloned().collect();
    assert_eq!(
        visited.len(),
        visited_set.len(),
        "each step once: {visited:#?}"
    );
    let skipped: Vec<_> = in_json.difference(&visited_set).collect();
    let invented: Vec<_> = visited_set.difference(&in_json).collect();
    assert!(
        skipped.is_empty() && invented.is_empty(),
        "the walker skipped {skipped:#?} and visited paths that hold no step: {invented:#?}"
    );
}

#[test]
fn children_come_in_the_order_of_all_kinds() {
    let step = filled("s", 1);
    let kinds: Vec<ChildKind> = children(&step).iter().map(|c| c.kind).collect();
    let mut expected = Vec::new();
    for kind in ChildKind::ALL {
        let n = if matches!(kind, ChildKind::Branch | ChildKind::Escalation) {
            2
        } else {
            1
        };
        expected.extend(std::iter::repeat_n(kind, n));
    }
    assert_eq!(kinds, expected);
}

#[test]
fn count_steps_counts_every_branch() {
    let mut cond = Step::new("c", "condition", Value::Null);
    cond.then = vec![Step::new("a", "set", Value::Null)];
    let mut lp = Step::new("l", "loop", Value::Null);
    lp.do_ = vec![
        Step::new("b", "set", Value::Null),
        Step::new("d", "end", Value::Null),
    ];
    cond.else_ = vec![lp];
    assert_eq!(count_steps(&[cond, Step::new("e", "end", Value::Null)]), 6);
}
