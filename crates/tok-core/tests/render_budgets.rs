//! Rendering against its byte budgets, as tables: a template (or a step's
//! config) and a scope, and what comes of it — the rendered size, or the
//! error naming the budget and the path in the config — then the same
//! through the decider: the step a user sees failed, and logs that stay
//! small whatever the scope holds.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tok_core::advance::{Env, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::limits::{
    MAX_LOG_LINE_BYTES, MAX_RENDERED_CONFIG_BYTES, MAX_RENDERED_VALUE_BYTES, MAX_STEP_LOG_BYTES,
};
use tok_core::path::FlowPath;
use tok_core::run::{RunStatus, StepStatus};
use tok_core::template::{
    Budget, Meter, RenderError, TemplateError, render, render_config, render_cut, render_value_in,
};

const KB: usize = 1024;

/// A scope with a 100 KB string, a 300 KB one, and an object whose JSON is
/// about 300 KB.
fn scope() -> Value {
    let rows: Vec<Value> = (0..3000)
        .map(|i| json!({ "n": i, "pad": "p".repeat(80) }))
        .collect();
    json!({
        "_body": { "b": "A".repeat(100 * KB), "big": "B".repeat(300 * KB), "rows": rows, "id": 7 },
        "small": "x",
    })
}

/// What a rendering came to: its size, or the budget it passed and where.
#[derive(Debug, PartialEq)]
enum Came {
    Fits,
    Over(Budget, &'static str),
}

fn came(rendered: Result<Value, RenderError>) -> (Came, usize) {
    match rendered {
        Ok(v) => (Came::Fits, v.to_string().len()),
        Err(RenderError {
            at,
            error: TemplateError::TooLarge { budget, reached },
        }) => (Came::Over(budget, Box::leak(at.into_boxed_str())), reached),
        Err(other) => panic!("not a budget error: {other}"),
    }
}

#[test]
fn configs_render_within_their_budgets_or_fail_naming_the_budget_and_the_path() {
    let repeated = |n: usize, t: &str| t.repeat(n);
    let many_bodies: serde_json::Map<String, Value> = (0..10)
        .map(|i| (format!("k{i}"), json!("{{_body.b}}")))
        .collect();
    // (config, what it comes to)
    let table: Vec<(Value, Came)> = vec![
        (json!({ "message": "order {{_body.id}}" }), Came::Fits),
        (json!({ "body": "{{_body.b}}" }), Came::Fits),
        (
            json!({ "body": "{{_body}}" }),
            Came::Over(Budget::Value, "config.body"),
        ),
        (
            json!({ "rows": "{{_body.rows}}" }),
            Came::Over(Budget::Value, "config.rows"),
        ),
        (
            json!({ "big": "{{_body.big}}" }),
            Came::Over(Budget::Value, "config.big"),
        ),
        (
            json!({ "message": repeated(1000, "{{_body.b}}") }),
            Came::Over(Budget::Value, "config.message"),
        ),
        (
            json!({ "message": repeated(3, "{{_body.b}}") }),
            Came::Over(Budget::Value, "config.message"),
        ),
        (json!({ "message": repeated(2, "{{_body.b}}") }), Came::Fits),
        // Lone placeholders in a big structure: each fits, all do not.
        (
            Value::Object(many_bodies),
            Came::Over(Budget::Config, "config.k5"),
        ),
        (
            json!({ "list": ["{{_body.b}}", "{{_body.b}}", "{{_body.b}}", "{{_body.b}}", ["{{_body.b}}", "{{_body.b}}"]] }),
            Came::Over(Budget::Config, "config.list.4.1"),
        ),
        // Nesting: a value deep in the config counts toward the same total.
        (
            json!({ "a": { "b": { "c": { "d": ["{{_body.b}}", { "e": "x {{_body.b}} {{_body.b}}" }] } } }, "f": "{{_body.b}}{{_body.b}}{{_body.b}}" }),
            Came::Over(Budget::Config, "config.f"),
        ),
    ];
    let scope = scope();
    for (i, (config, want)) in table.into_iter().enumerate() {
        let (got, size) = came(render_config(&config, &scope));
        assert_eq!(got, want, "row {i}");
        match got {
            Came::Fits => assert!(
                size <= MAX_RENDERED_CONFIG_BYTES + 4 * KB,
                "row {i}: {size}"
            ),
            Came::Over(budget, _) => {
                // Rendering stopped right after the budget, not at the end:
                // never more than one piece (here 300 KB at most) past it.
                assert!(size > budget.bytes(), "row {i}: {size}");
                assert!(size <= budget.bytes() + 300 * KB + 16, "row {i}: {size}");
            }
        }
    }
}

#[test]
fn the_error_says_the_budget_its_size_and_where_it_was_passed() {
    let config = json!({ "message": "{{_body.b}}".repeat(1000) });
    let error = render_config(&config, &scope()).unwrap_err();
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "config.message: render_budget_exceeded: the rendering passed {MAX_RENDERED_VALUE_BYTES} bytes, the budget of one rendered value, at "
        )),
        "{text}"
    );
    // The third repetition passed it: 300 KB reached, not 100 MB.
    assert!(
        text.contains(&format!("at {} bytes", 3 * 100 * KB)),
        "{text}"
    );
}

#[test]
fn a_log_line_has_a_smaller_budget() {
    let table = [
        ("{{small}}", None),
        ("a line of {{_body.id}}", None),
        ("{{_body.b}}", Some(100 * KB)),
        (
            &*"x".repeat(MAX_LOG_LINE_BYTES + 1),
            Some(MAX_LOG_LINE_BYTES + 1),
        ),
    ];
    let scope = scope();
    for (template, over) in table {
        let rendered = render_value_in(
            &json!(template),
            &scope,
            "config.message",
            &mut Meter::log_line(),
        );
        match (rendered, over) {
            (Ok(_), None) => {}
            (Err(e), Some(reached)) => assert_eq!(
                e.error,
                TemplateError::TooLarge {
                    budget: Budget::LogLine,
                    reached
                },
                "{template:.20}"
            ),
            (other, _) => panic!("{template:.20}: {other:?}"),
        }
    }
}

#[test]
fn one_template_alone_renders_within_one_value_and_a_key_is_cut_not_failed() {
    assert_eq!(render("{{small}}{{small}}", &scope()).unwrap(), json!("xx"));
    assert!(matches!(
        render(&"{{_body.b}}".repeat(1000), &scope()),
        Err(TemplateError::TooLarge {
            budget: Budget::Value,
            ..
        })
    ));
    // A flow key keeps its first bytes, however big the rendering would be.
    let key = render_cut(&"{{_body.b}}".repeat(1000), &scope(), 200).unwrap();
    assert_eq!(key, json!("A".repeat(200)));
    let key = render_cut("{{_body.rows}}", &scope(), 20).unwrap();
    assert_eq!(key, json!("[{\"n\":0,\"pad\":\"ppppp"));
    assert_eq!(render_cut("{{_body.id}}", &scope(), 20).unwrap(), json!(7));
    assert!(matches!(
        render_cut("{{_body.b}}{{nowhere}}", &scope(), 20),
        Err(TemplateError::Missing { .. })
    ));
}

// The same through the decider: what a user of the run sees.

const NOW_MS: i64 = 1_780_000_000_000;

fn decide(steps: Value, body: Value) -> Transition {
    let automation = Automation::from_json(
        &json!({ "name": "Budgets", "trigger": { "kind": "manual" }, "steps": steps }).to_string(),
    )
    .expect("a valid definition");
    let kinds = |_: &str| StepClass::External;
    let retries = |_: &str| None;
    let mut rng = StdRng::seed_from_u64(7);
    let mut env = Env {
        now: Timestamp::from_millisecond(NOW_MS).unwrap(),
        kinds: &kinds,
        rng: &mut rng,
        retries: &retries,
    };
    let context = Context::new(serde_json::Map::new(), body, json!({}));
    let state = RunState::at(FlowPath::root(0), 1, context, 0);
    advance(&automation, state, Input::Start, &mut env)
}

#[test]
fn a_step_past_a_budget_fails_for_good_naming_its_path() {
    let big = json!({ "b": "A".repeat(100 * KB) });
    // (step, the path its error names, the budget)
    let table = [
        (
            json!({ "id": "log", "type": "flow/log", "config": { "message": "{{_body.b}}".repeat(1000) } }),
            "config.message",
            Budget::LogLine,
        ),
        (
            json!({ "id": "set", "type": "set", "config": { "values": { "a": "{{_body.b}}".repeat(3) } } }),
            "config.values.a",
            Budget::Value,
        ),
        (
            json!({ "id": "call", "type": "http", "config": { "url": "https://example.com", "headers": {
                "a": "{{_body.b}}", "b": "{{_body.b}}", "c": "{{_body.b}}", "d": "{{_body.b}}", "e": "{{_body.b}}", "f": "{{_body.b}}" } } }),
            "config.headers.f",
            Budget::Config,
        ),
        (
            json!({ "id": "loop", "type": "loop", "config": { "items": ["{{_body.b}}{{_body.b}}{{_body.b}}"] } }),
            "config.items.0",
            Budget::Value,
        ),
    ];
    for (step, at, budget) in table {
        let t = decide(json!([step]), big.clone());
        assert_eq!(t.status, RunStatus::Failed, "{step}");
        assert!(matches!(t.then, Then::Record(_)), "{step}");
        let record = t.records.last().expect("the failed step's record");
        assert_eq!(record.status, StepStatus::Failed);
        let error = record.error.as_deref().unwrap();
        let id = step["id"].as_str().unwrap();
        let want = format!(
            "step `{id}` {at}: render_budget_exceeded: the rendering passed {} bytes",
            budget.bytes()
        );
        assert!(error.starts_with(&want), "{error}");
        let run_error = t.error.as_deref().unwrap();
        assert!(run_error.contains(at), "{run_error}");
        // Nothing of the body is kept with the failure.
        let stored = serde_json::to_string(record).unwrap().len();
        assert!(stored < 4 * KB, "{stored}");
    }
}

#[test]
fn a_condition_over_a_big_field_keeps_a_short_line_per_rule() {
    let rules: Vec<Value> = (0..100)
        .map(|i| json!({ "field": "_body.b", "operator": "eq", "value": format!("{{{{_body.b}}}} {i}") }))
        .collect();
    let steps = json!([{ "id": "c", "type": "condition", "rules": rules,
        "then": [{ "id": "yes", "type": "flow/log", "config": { "message": "yes" } }],
        "else": [{ "id": "no", "type": "flow/log", "config": { "message": "no" } }] }]);
    let t = decide(steps, json!({ "b": "A".repeat(100 * KB) }));
    assert_eq!(t.status, RunStatus::Completed);
    let condition = &t.records[0];
    assert_eq!(condition.status, StepStatus::Completed);
    let total: usize = condition.log.iter().map(String::len).sum();
    assert!(total <= MAX_STEP_LOG_BYTES, "{total}");
    assert!(
        condition.log[0].starts_with("Condition: _body.b eq {{_body.b}} 0 | _body.b = \"AAAA"),
        "{}",
        &condition.log[0][..100]
    );
    assert!(
        condition.log[0].contains("[cut: 102400 bytes in all]"),
        "{}",
        condition.log[0]
    );
    assert!(condition.log[0].len() < 1024, "{}", condition.log[0].len());
    assert_eq!(condition.log.last().unwrap(), "Condition: false → else");
    assert_eq!(t.records[1].step_id, "no");
}

#[test]
fn a_log_line_just_under_its_budget_is_kept_whole() {
    let message = "y".repeat(MAX_LOG_LINE_BYTES - 10);
    let t = decide(
        json!([{ "id": "log", "type": "flow/log", "config": { "message": "{{_body.m}}" } }]),
        json!({ "m": message }),
    );
    assert_eq!(t.status, RunStatus::Completed);
    assert_eq!(t.records[0].log, [format!("info: {message}")]);
}
