use serde_json::json;

use super::*;
use crate::definition::Step;
use crate::walk::ChildKind;

fn known(kind: &str) -> bool {
    matches!(kind, "http" | "flow/pause" | "ticket/upsert")
}

fn errors(def: Value) -> Vec<ValidationError> {
    let def: Automation = serde_json::from_value(def).unwrap();
    match validate(&def, 100, &known) {
        Ok(()) => Vec::new(),
        Err(errors) => errors,
    }
}

fn with_steps(steps: &Value) -> Value {
    json!({"name": "n", "trigger": {"kind": "manual"}, "steps": steps})
}

fn paths(errors: &[ValidationError]) -> Vec<&str> {
    errors.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn a_good_definition_passes() {
    let def = json!({
        "name": "New order",
        "trigger": {"kind": "webhook", "source": "src_eshop",
                    "filter": {"match": "all", "rules": [{"field": "kind", "operator": "eq", "value": "order.created"}]}},
        "steps": [
            {"id": "st_ticket", "type": "ticket/upsert", "config": {"externalId": "{{orderId}}"}},
            {"id": "st_check", "type": "condition",
             "rules": [{"field": "st_ticket.created", "operator": "eq", "value": true}],
             "then": [{"id": "st_log", "type": "flow/log", "config": {"message": "new {{orderId}}", "level": "info"}}]},
            {"id": "st_legacy", "type": "condition", "fieldId": "kind", "operator": "isNotEmpty"},
            {"id": "st_each", "type": "loop", "config": {"items": "{{lines}}", "maxItems": 10},
             "do": [{"id": "st_set", "type": "set", "config": {"values": {"sku": "{{item.sku}}"}}}]},
            {"id": "st_wait", "type": "wait", "config": {"duration": "10m"}},
            {"id": "st_pause", "type": "flow/pause", "config": {"seconds": 1.5}},
            {"id": "st_end", "type": "end"}
        ],
        "settings": {"retry": {"max_attempts": 3, "backoff": ["1s"]}}
    });
    assert_eq!(errors(def), Vec::new());
}

#[test]
fn collects_every_error_with_its_path() {
    let errs = errors(json!({
        "name": " ",
        "trigger": {"kind": "poll", "intervalSec": 5},
        "steps": [
            {"id": "a", "type": "htp"},
            {"id": "a", "type": "http", "config": {"url": "https://x/{{id"}},
            {"id": "_b", "type": "set", "config": {"values": {}}},
            {"id": "c d", "type": "set", "config": {"values": {}}}
        ]
    }));
    assert_eq!(
        paths(&errs),
        [
            "name",
            "trigger.intervalSec",
            "steps.0.type",
            "steps.1.id",
            "steps.1.config.url",
            "steps.2.id",
            "steps.3.id"
        ]
    );
    assert_eq!(errs[2].message, "unknown step type `htp`");
    assert_eq!(errs[3].message, "step id `a` is already used at steps.0");
    assert_eq!(
        errs[1].to_string(),
        "trigger.intervalSec: the poll interval is 5 s; the minimum is 10 s"
    );
}

#[test]
fn parallel_branches_are_checked_and_counted() {
    let branch = |n: usize, tag: &str| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"id": format!("{tag}{i}"), "type": "flow/log", "config": {"message": "x"}}))
            .collect()
    };
    let errs = errors(with_steps(&json!([
        {"id": "p", "type": "parallel", "branches": [branch(30, "a"), branch(30, "b")]}
    ])));
    assert_eq!(paths(&errs), ["steps"], "{errs:?}");
    assert_eq!(
        errs[0].message,
        "the tree has 61 steps; at most 50 are allowed"
    );

    let errs = errors(with_steps(&json!([
        {"id": "p", "type": "parallel"},
        {"id": "q", "type": "parallel", "branches": [[
            {"id": "stop", "type": "end"},
            {"id": "w", "type": "wait_for_runs", "config": {"runs": [], "mode": "some"}}
        ]]},
        {"id": "s", "type": "set", "config": {"values": {}}, "branches": [[]]}
    ])));
    assert_eq!(
        paths(&errs),
        [
            "steps.0.branches",
            "steps.1.branches.0.0.type",
            "steps.1.branches.0.1.config.runs",
            "steps.1.branches.0.1.config.mode",
            "steps.2.branches"
        ],
        "{errs:?}"
    );
}

#[test]
fn too_many_steps_and_too_many_bytes() {
    let steps: Vec<Value> = (0..61)
        .map(|i| json!({"id": format!("s{i}"), "type": "end"}))
        .collect();
    let def: Automation = serde_json::from_value(with_steps(&json!(steps))).unwrap();
    let errs = validate(&def, MAX_DEFINITION_BYTES + 1, &known).unwrap_err();
    assert_eq!(errs.len(), 2);
    assert_eq!(errs[0].path, "");
    assert!(
        errs[0]
            .message
            .starts_with("the definition is 262145 bytes")
    );
    assert_eq!(errs[0].to_string(), errs[0].message);
    assert_eq!(errs[1].path, "steps");
    assert_eq!(
        errs[1].message,
        "the tree has 61 steps; at most 50 are allowed"
    );
}

#[test]
fn nested_steps_are_counted_and_checked_with_nested_paths() {
    let errs = errors(with_steps(&json!([
        {"id": "c", "type": "condition", "rules": [{"field": "x", "operator": "eq", "value": 1}],
         "else": [{"id": "h", "type": "http", "config": {"headers": {"X": "{{ }}"}}}]},
        {"id": "l", "type": "loop", "config": {"items": [1]},
         "do": [{"id": "c", "type": "http"}]}
    ])));
    assert_eq!(
        paths(&errs),
        ["steps.0.else.0.config.headers.X", "steps.1.do.0.id"]
    );
}

#[test]
fn branches_only_where_they_belong() {
    let errs = errors(with_steps(&json!([
        {"id": "h", "type": "http", "then": [{"id": "x", "type": "end"}], "fieldId": "a"},
        {"id": "s", "type": "set", "config": {"values": {}}, "do": [{"id": "y", "type": "end"}]}
    ])));
    assert_eq!(
        paths(&errs),
        ["steps.0.fieldId", "steps.0.then", "steps.1.do"]
    );
    assert_eq!(
        errs[1].message,
        "only a condition step can have `then`; `h` is a `http` step"
    );
}

#[test]
fn escalations_only_on_waits_in_order_with_steps() {
    let log = json!({"id": "l", "type": "flow/log", "config": {"message": "late"}});
    let errs = errors(with_steps(&json!([
        {"id": "w", "type": "wait_for_event", "config": {"key": "k"}, "escalations": [
            {"after": "10m", "steps": [log]},
            {"after": "5m", "steps": [{"id": "e", "type": "end"}]},
            {"after": "soon", "steps": []}
        ]},
        {"id": "s", "type": "set", "config": {"values": {}},
         "escalations": [{"after": "1h", "steps": [{"id": "m", "type": "flow/log", "config": {"message": "x"}}]}]}
    ])));
    assert_eq!(
        paths(&errs),
        [
            "steps.0.escalations.1.after",
            "steps.0.escalations.1.steps",
            "steps.0.escalations.2.after",
            "steps.0.escalations.2.steps",
            "steps.1.escalations"
        ],
        "{errs:?}"
    );
}

#[test]
fn compensations_are_checked_counted_and_kept_to_one_chain() {
    let undo = json!({"id": "u", "type": "flow/log", "config": {"message": "undo"}});
    let errs = errors(with_steps(&json!([
        {"id": "a", "type": "flow/log", "config": {"message": "x"}, "compensate": [
            undo,
            {"id": "u2", "type": "nope"},
            {"id": "u3", "type": "flow/log", "config": {"message": "y"},
             "compensate": [{"id": "u4", "type": "flow/log", "config": {"message": "z"}}]},
            {"id": "u5", "type": "wait_for_event", "config": {"key": "k"}},
            {"id": "u6", "type": "parallel", "branches": [[]]},
            {"id": "u7", "type": "end"}
        ]},
        {"id": "l", "type": "loop", "config": {"items": "{{list}}"}, "do": [
            {"id": "b", "type": "flow/log", "config": {"message": "x"},
             "compensate": [{"id": "a", "type": "flow/log", "config": {"message": "again"}}]}
        ]}
    ])));
    assert_eq!(
        paths(&errs),
        [
            "steps.0.compensate.1.type",
            "steps.0.compensate.2.compensate",
            "steps.0.compensate.3.type",
            "steps.0.compensate.4.type",
            "steps.0.compensate.5.type",
            "steps.1.do.0.compensate.0.id"
        ],
        "{errs:#?}"
    );
    let nested = &errs[1].message;
    assert!(nested.contains("`u3`") && nested.contains("cannot have `compensate`"));
    assert!(errs[2].message.contains("cannot be cancelled"), "{errs:#?}");
    assert!(
        errs[5].message.contains("already used at steps.0"),
        "{errs:#?}"
    );

    // Compensation steps count toward MAX_STEPS.
    let many: Vec<Value> = (0..MAX_STEPS)
        .map(|i| json!({"id": format!("u{i}"), "type": "flow/log", "config": {"message": "x"}}))
        .collect();
    let errs = errors(with_steps(&json!([
        {"id": "a", "type": "flow/log", "config": {"message": "x"}, "compensate": many}
    ])));
    assert_eq!(paths(&errs), ["steps"], "{errs:#?}");
    assert!(
        errs[0]
            .message
            .contains(&format!("{} steps", MAX_STEPS + 1))
    );
}

#[test]
fn condition_and_loop_requirements() {
    let errs = errors(with_steps(&json!([
        {"id": "c1", "type": "condition"},
        {"id": "c2", "type": "condition", "rules": [{"field": "", "operator": "in", "value": 3}]},
        {"id": "l1", "type": "loop"},
        {"id": "l2", "type": "loop", "config": {"items": "plain", "maxItems": 5000}, "do": [{"id": "e", "type": "end"}]}
    ])));
    assert_eq!(
        paths(&errs),
        [
            "steps.0",
            "steps.1.rules.0.field",
            "steps.1.rules.0.value",
            "steps.2.config.items",
            "steps.2.do",
            "steps.3.config.items",
            "steps.3.config.maxItems"
        ]
    );
    assert!(
        errs[0].message.contains("has no rules"),
        "{}",
        errs[0].message
    );
}

#[test]
fn wait_pause_log_and_set_configs() {
    let errs = errors(with_steps(&json!([
        {"id": "w1", "type": "wait", "config": {"duration": "ten minutes"}},
        {"id": "w2", "type": "wait"},
        {"id": "w3", "type": "wait", "config": {"until": "{{due}}"}},
        {"id": "w4", "type": "wait", "config": {"until": "next week"}},
        {"id": "p1", "type": "flow/pause", "config": {"seconds": 61}},
        {"id": "p2", "type": "flow/pause", "config": {"seconds": 0}},
        {"id": "g", "type": "flow/log", "config": {"message": "m", "level": "debug"}},
        {"id": "s", "type": "set", "config": {"values": [1]}}
    ])));
    assert_eq!(
        paths(&errs),
        [
            "steps.0.config.duration",
            "steps.1.config",
            "steps.3.config.until",
            "steps.4.config.seconds",
            "steps.5.config.seconds",
            "steps.6.config.level",
            "steps.7.config.values"
        ]
    );
    assert!(errs[0].message.contains("`ten minutes`"));
}

#[test]
fn retry_trigger_and_filter_checks() {
    let errs = errors(json!({
        "name": "n",
        "trigger": {"kind": "schedule", "cron": "0 8 * *",
                    "filter": {"rules": [{"field": "a", "operator": "eq", "value": "{{b"}]}},
        "steps": [{"id": "h", "type": "http", "retry": {"max_attempts": 11}}],
        "settings": {"retry": {"max_attempts": 3, "backoff": []}}
    }));
    assert_eq!(
        paths(&errs),
        [
            "trigger.cron",
            "trigger.filter.rules.0.value",
            "settings.retry.backoff",
            "steps.0.retry.max_attempts"
        ]
    );
    assert!(errs[0].message.contains("has 4 fields"));
    assert!(errors(json!({"name": "n", "trigger": {"kind": "schedule", "cron": "0 0 8 * * 1-5"}, "steps": []})).is_empty());
    let errs = errors(json!({"name": "n", "trigger": {"kind": "schedule",
        "cron": "0 8 * * 1-5", "timezone": "Europe/Praha"}, "steps": []}));
    assert_eq!(paths(&errs), ["trigger.timezone"]);
    assert!(
        errs[0]
            .message
            .contains("`Europe/Praha` is not a known time zone")
    );
    let errs = errors(json!({"name": "n", "trigger": {"kind": "schedule",
        "cron": "61 8 * * *"}, "steps": []}));
    assert_eq!(paths(&errs), ["trigger.cron"]);
    assert!(
        errs[0]
            .message
            .starts_with("cron `61 8 * * *` is not valid"),
        "{}",
        errs[0].message
    );
    assert_eq!(
        paths(&errors(
            json!({"name": "n", "trigger": {"kind": "webhook", "source": ""}, "steps": []})
        )),
        ["trigger.source"]
    );
}

#[test]
fn a_start_limit_is_at_least_one_start_per_minute() {
    let limited = |n: u32| {
        errors(
            json!({"name": "n", "trigger": {"kind": "manual"}, "steps": [],
            "settings": {"limits": {"startsPerMinute": n}}}),
        )
    };
    let errs = limited(0);
    assert_eq!(paths(&errs), ["settings.limits.startsPerMinute"]);
    assert!(
        errs[0].message.contains("at least 1"),
        "{}",
        errs[0].message
    );
    assert!(limited(5).is_empty());
}

#[test]
fn a_step_is_checked_in_every_kind_of_child_list() {
    use crate::walk::ChildKind;
    for kind in ChildKind::ALL {
        let mut holder = kind.holder("h");
        let bad = Step::new("bad", "flow/log", json!({"message": "{{ _body.x"}));
        kind.add(&mut holder, vec![bad]);
        let def = Automation {
            name: "n".into(),
            trigger: Trigger::Manual { filter: None },
            flow: Default::default(),
            steps: vec![holder],
            settings: Default::default(),
        };
        let errs = validate(&def, 100, &known).unwrap_err();
        let list = match kind {
            ChildKind::Branch => "branches.0".to_owned(),
            ChildKind::Escalation => "escalations.0.steps".to_owned(),
            other => other.key().to_owned(),
        };
        assert_eq!(
            paths(&errs),
            [format!("steps.0.{list}.0.config.message")],
            "{kind:?}"
        );
    }
}

#[test]
fn a_waits_subject_is_a_ticket_id_or_ticket_at_save() {
    for subject in [
        json!("ticket"),
        json!("{{st_ticket.ticketId}}"),
        json!(null),
    ] {
        let steps = json!([{"id": "w", "type": "wait_for_event",
                            "config": {"key": "k", "subject": subject}}]);
        assert_eq!(errors(with_steps(&steps)), Vec::new(), "{subject}");
    }
    for subject in [json!(""), json!(7), json!({"id": "tk_1"})] {
        let steps = json!([{"id": "w", "type": "wait_for_event",
                            "config": {"key": "k", "subject": subject}}]);
        let errs = errors(with_steps(&steps));
        assert_eq!(paths(&errs), vec!["steps.0.config.subject"], "{subject}");
        assert!(
            errs[0]
                .message
                .contains("\"ticket\" for the run's subject ticket"),
            "{subject}: {errs:?}"
        );
    }
}

#[test]
fn every_holder_is_valid_once_it_holds_a_step() {
    for kind in ChildKind::ALL {
        let mut holder = kind.holder("h");
        kind.add(
            &mut holder,
            vec![Step::new("c", "flow/log", json!({"message": "x"}))],
        );
        let def = Automation {
            name: "n".into(),
            trigger: crate::definition::Trigger::Manual { filter: None },
            flow: Default::default(),
            steps: vec![holder],
            settings: Default::default(),
        };
        assert_eq!(
            crate::validate::validate(&def, 100, &|_| false),
            Ok(()),
            "{kind:?}"
        );
    }
}
