//! Rendering budgets as a tenant sees them, with the sizes that took a node
//! down: a `flow/log` that repeats a 100 KB field a thousand times fails
//! its step with `render_budget_exceeded`, naming `config.message`, while
//! another tenant's webhook accepted in the same moment becomes a run and
//! completes; the run's detail stays small; a condition of a hundred rules
//! over the same field stores a short line per rule.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use tok_core::limits::{MAX_LOG_LINE_BYTES, MAX_STEP_LOG_BYTES};

use crate::helpers::{
    Tenant, TestApp, backend_tests, json_request, log_step, on_webhook, plain_source,
};

backend_tests!(
    crate::helpers::run;
    a_log_that_repeats_a_big_field_fails_its_step_and_holds_back_no_one,
    a_condition_of_a_hundred_rules_over_a_big_field_keeps_a_short_log,
);

/// A source of `tenant` with an automation of `steps`; the webhook token.
async fn hooked(app: &TestApp, tenant: &Tenant, steps: &Value) -> String {
    let source = app.create_source(tenant, &plain_source("shop")).await;
    let id = source["id"].as_str().unwrap();
    app.create_automation(tenant, &on_webhook("Shop", id, steps))
        .await;
    source["token"].as_str().unwrap().to_owned()
}

/// The run an event started, once the dispatcher took it and it finished.
async fn run_of(app: &TestApp, tenant: &Tenant, event: &str) -> Value {
    let uri = format!("/api/events/{event}");
    let run_id = app
        .poll(&format!("a run of event {event}"), async || {
            let event = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
            let runs = event["runs"].as_array().cloned().unwrap_or_default();
            match runs.first() {
                Some(run) => Ok(run["id"].as_str().unwrap().to_owned()),
                None => Err(()),
            }
        })
        .await;
    app.wait_for_final(tenant, &run_id).await
}

/// A body with a 100,000-byte field `b`.
fn big_body() -> Value {
    json!({ "b": "A".repeat(100_000), "id": 1 })
}

async fn a_log_that_repeats_a_big_field_fails_its_step_and_holds_back_no_one(app: &TestApp) {
    let hostile = app.create_tenant("Hostile").await;
    let message = "{{_body.b}}".repeat(1000);
    let steps = json!([{ "id": "st_log", "type": "flow/log", "config": { "message": message } }]);
    let hostile_token = hooked(app, &hostile, &steps).await;
    let other = app.create_tenant("Other").await;
    let other_steps = json!([
        { "id": "st_set", "type": "set", "config": { "values": { "order": "{{_body.order}}" } } },
        log_step("st_done", "order {{st_set.order}} received"),
    ]);
    let other_token = hooked(app, &other, &other_steps).await;

    // Both webhooks in the same moment.
    let send = |token: &str, body: &Value| {
        json_request(Method::POST, &format!("/webhook/{token}"), &[], body)
    };
    let replies = app
        .send_together(vec![
            send(&hostile_token, &big_body()),
            send(&other_token, &json!({ "order": "A-1" })),
        ])
        .await;
    let events: Vec<String> = replies
        .into_iter()
        .map(|reply| {
            let accepted = reply.expect(StatusCode::ACCEPTED);
            accepted["event_id"].as_str().unwrap().to_owned()
        })
        .collect();

    let run = run_of(app, &hostile, &events[0]).await;
    assert_eq!(run["status"], "failed", "{:.2000}", run.to_string());
    let steps = run["steps"].as_array().unwrap();
    let failed = steps.iter().find(|s| s["step_id"] == "st_log").unwrap();
    assert_eq!(failed["status"], "failed");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "step `st_log` config.message: render_budget_exceeded: the rendering passed \
             {MAX_LOG_LINE_BYTES} bytes, the budget of a log line, at 100000 bytes"
        )),
        "{error}"
    );
    assert!(
        run["error"].as_str().unwrap().contains("config.message"),
        "{}",
        run["error"]
    );
    // Small: what the run's page shows of its steps is a few KB, not the
    // 100 MB the template would have rendered.
    for step in steps {
        let served = step.to_string().len();
        assert!(served < 4 * 1024, "a step of {served} bytes: {step:.500}");
    }
    let served = app
        .get(
            &hostile.key,
            &format!("/api/runs/{}", run["id"].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK)
        .to_string()
        .len();
    // The run's context holds the body twice (its fields at the top, the
    // whole under `_body`): 200 KB, and a few KB more.
    assert!(
        served < 2 * 100_000 + 16 * 1024,
        "the run's detail is its context and a few KB: {served} bytes"
    );

    let run = run_of(app, &other, &events[1]).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    let done = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step_id"] == "st_done");
    assert_eq!(done.unwrap()["log"], json!(["info: order A-1 received"]));
}

async fn a_condition_of_a_hundred_rules_over_a_big_field_keeps_a_short_log(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let rules: Vec<Value> = (0..100)
        .map(|i| json!({ "field": "_body.b", "operator": "neq", "value": format!("{{{{_body.b}}}}{i}") }))
        .collect();
    let steps = json!([{ "id": "st_check", "type": "condition", "rules": rules,
        "then": [log_step("st_yes", "every rule holds")],
        "else": [log_step("st_no", "a rule does not hold")] }]);
    let token = hooked(app, &tenant, &steps).await;
    let accepted = app
        .webhook(&token, &big_body())
        .await
        .expect(StatusCode::ACCEPTED);
    let run = run_of(app, &tenant, accepted["event_id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "completed", "{:.2000}", run.to_string());
    let steps = run["steps"].as_array().unwrap();
    let check = steps.iter().find(|s| s["step_id"] == "st_check").unwrap();
    let log: Vec<&str> = check["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(log.len(), 101, "a line per rule and the result");
    let total: usize = log.iter().map(|l| l.len()).sum();
    assert!(total <= MAX_STEP_LOG_BYTES, "{total} bytes of log");
    for line in &log[..100] {
        assert!(line.len() < 1024, "{line:.200}");
        assert!(line.contains("[cut: 100000 bytes in all]"), "{line:.200}");
    }
    assert_eq!(log[100], "Condition: true → then");
    assert!(steps.iter().any(|s| s["step_id"] == "st_yes"));
}
