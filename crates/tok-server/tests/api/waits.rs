//! Runs that wait for signals, end to end: a `wait_for_event` step parks its
//! run (`waiting`, with what it waits for in the run's detail), and
//! `POST /api/signals` resumes it with the signal's payload when the key
//! and `where` match; a signal sent before the wait is taken from the
//! lookback buffer; a timeout resumes it with `timedOut`; a repeated
//! `Idempotency-Key` resumes nothing more; another tenant's signal resumes
//! nothing; an `emit` with a key signals; a cancelled wait is gone; a retry
//! after a resume does not wait again.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual};

backend_tests!(crate::helpers::run;
    a_signal_resumes_a_waiting_run_with_its_payload_when_where_holds,
    a_signal_sent_before_the_wait_is_taken_from_the_buffer,
    a_wait_times_out_and_a_late_signal_resumes_nothing,
    a_repeated_idempotency_key_resumes_nothing_more,
    another_tenants_signal_on_the_same_key_resumes_nothing,
    an_emit_with_a_key_resumes_a_waiting_run,
    a_cancelled_waiting_run_is_not_resumed,
    a_retry_after_a_resume_does_not_wait_again,
);

/// A manual automation: wait for `order-{{orderId}}` (an amount of at
/// least 100, within `timeout` if given), then log what came, then `tail`.
async fn waiting_automation(
    app: &TestApp,
    tenant: &Tenant,
    timeout: Option<&str>,
    tail: Value,
) -> String {
    let mut config = json!({
        "key": "order-{{orderId}}",
        "where": { "rules": [{ "field": "amount", "operator": "gte", "value": 100 }] }
    });
    if let Some(timeout) = timeout {
        config["timeout"] = json!(timeout);
    }
    let mut steps = vec![
        json!({ "id": "st_paid", "type": "wait_for_event", "config": config }),
        log_step("st_log", "timed out: {{st_paid.timedOut}}"),
    ];
    if !tail.is_null() {
        steps.push(tail);
    }
    app.create_automation(tenant, &manual("Payment", &Value::Array(steps)))
        .await
}

async fn start(app: &TestApp, tenant: &Tenant, automation: &str, order: &str) -> String {
    app.start_run(
        tenant,
        automation,
        &json!({ "input": { "orderId": order } }),
    )
    .await
}

async fn waiting(app: &TestApp, tenant: &Tenant, run: &str) -> Value {
    app.wait_for_run(tenant, run, |r| r["status"] == "waiting")
        .await
}

async fn signal(app: &TestApp, tenant: &Tenant, key: &str, payload: Value) -> Value {
    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": key, "payload": payload }),
    )
    .await
    .expect(StatusCode::ACCEPTED)
}

fn step<'a>(run: &'a Value, id: &str, status: &str) -> Option<&'a Value> {
    run["steps"]
        .as_array()?
        .iter()
        .find(|s| s["step_id"] == id && s["status"] == status)
}

/// The amount of the signal that resumed the wait, as the run published it.
fn paid(run: &Value) -> Value {
    run["context"]["st_paid"]["payload"]["amount"].clone()
}

fn log_line(run: &Value) -> String {
    let line = step(run, "st_log", "completed").map(|s| s["log"][0].clone());
    line.and_then(|l| l.as_str().map(str::to_owned))
        .unwrap_or_default()
}

async fn a_signal_resumes_a_waiting_run_with_its_payload_when_where_holds(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = waiting_automation(app, &tenant, Some("1h"), Value::Null).await;
    let run = start(app, &tenant, &automation, "5001").await;
    let parked = waiting(app, &tenant, &run).await;
    let waits = parked["waits"].as_array().cloned().unwrap_or_default();
    assert_eq!(waits.len(), 1, "what the run waits for: {parked:#}");
    assert_eq!(waits[0]["key"], "order-5001");
    assert!(
        crate::helpers::ms(&waits[0]["due_at"]).is_some(),
        "due as RFC 3339 like the route's other times: {parked:#}"
    );
    assert!(step(&parked, "st_paid", "waiting").is_some(), "{parked:#}");

    // Too small an amount: the `where` does not hold, nothing resumes.
    let small = signal(app, &tenant, "order-5001", json!({ "amount": 50 })).await;
    assert_eq!(small["resumed"], json!([]), "{small:#}");
    assert_eq!(small["buffered"], true);
    let still = app
        .get(&tenant.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(still["status"], "waiting");

    let payment = signal(app, &tenant, "order-5001", json!({ "amount": 150 })).await;
    assert_eq!(payment["resumed"], json!([run]), "{payment:#}");
    assert_eq!(payment["buffered"], false);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(log_line(&done), "info: timed out: false");
    assert_eq!(paid(&done), json!(150), "{done:#}");
    let resumed = step(&done, "st_paid", "completed").expect("the wait's record");
    assert_eq!(resumed["output"]["signalId"], payment["signal_id"]);
    assert_eq!(done["waits"], json!([]), "{done:#}");
}

async fn a_signal_sent_before_the_wait_is_taken_from_the_buffer(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = waiting_automation(app, &tenant, None, Value::Null).await;
    let early = signal(app, &tenant, "order-7", json!({ "amount": 300 })).await;
    assert_eq!(early["buffered"], true, "nothing waits yet: {early:#}");
    let run = start(app, &tenant, &automation, "7").await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(log_line(&done), "info: timed out: false");
    assert_eq!(paid(&done), json!(300), "{done:#}");

    // The buffered signal was consumed: a second wait on the key stays.
    let second = start(app, &tenant, &automation, "7").await;
    waiting(app, &tenant, &second).await;
}

async fn a_wait_times_out_and_a_late_signal_resumes_nothing(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = waiting_automation(app, &tenant, Some("1s"), Value::Null).await;
    let run = start(app, &tenant, &automation, "9").await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(log_line(&done), "info: timed out: true");
    let late = signal(app, &tenant, "order-9", json!({ "amount": 500 })).await;
    assert_eq!(late["resumed"], json!([]), "{late:#}");
    assert_eq!(late["buffered"], true);
}

async fn a_repeated_idempotency_key_resumes_nothing_more(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = waiting_automation(app, &tenant, None, Value::Null).await;
    let first = start(app, &tenant, &automation, "11").await;
    waiting(app, &tenant, &first).await;
    let body = json!({ "key": "order-11", "payload": { "amount": 120 } });
    let headers = [("idempotency-key", "pay-11")];
    let sent = app
        .post_with(&tenant.key, "/api/signals", &headers, &body)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(sent["resumed"], json!([first]));
    app.wait_for_final(&tenant, &first).await;

    let second = start(app, &tenant, &automation, "11").await;
    waiting(app, &tenant, &second).await;
    let again = app
        .post_with(&tenant.key, "/api/signals", &headers, &body)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(again["signal_id"], sent["signal_id"], "{again:#}");
    assert_eq!(
        again["resumed"],
        json!([first]),
        "the first answer: {again:#}"
    );
    let still = app
        .get(&tenant.key, &format!("/api/runs/{second}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(still["status"], "waiting", "the repeat resumed nothing");
}

async fn another_tenants_signal_on_the_same_key_resumes_nothing(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    let automation = waiting_automation(app, &acme, None, Value::Null).await;
    let run = start(app, &acme, &automation, "13").await;
    waiting(app, &acme, &run).await;
    let theirs = signal(app, &other, "order-13", json!({ "amount": 900 })).await;
    assert_eq!(theirs["resumed"], json!([]), "{theirs:#}");
    let still = app
        .get(&acme.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(still["status"], "waiting");
    // Nor does the other tenant's buffered signal reach a later wait.
    let later = start(app, &acme, &automation, "13").await;
    waiting(app, &acme, &later).await;
}

async fn an_emit_with_a_key_resumes_a_waiting_run(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = waiting_automation(app, &tenant, None, Value::Null).await;
    let run = start(app, &tenant, &automation, "15").await;
    waiting(app, &tenant, &run).await;
    let payer = app
        .create_automation(
            &tenant,
            &manual(
                "Payer",
                &json!([{ "id": "st_emit", "type": "emit",
                          "config": { "event": "payment.received", "key": "order-15",
                                      "payload": { "amount": 250 } } }]),
            ),
        )
        .await;
    let paying = app
        .start_run(&tenant, &payer, &json!({ "input": {} }))
        .await;
    let payer_run = app.wait_for_final(&tenant, &paying).await;
    assert_eq!(payer_run["status"], "completed", "{payer_run:#}");
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(log_line(&done), "info: timed out: false");
    assert_eq!(paid(&done), json!(250), "{done:#}");
}

async fn a_cancelled_waiting_run_is_not_resumed(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = waiting_automation(app, &tenant, None, Value::Null).await;
    let run = start(app, &tenant, &automation, "17").await;
    waiting(app, &tenant, &run).await;
    app.post(&tenant.key, &format!("/api/runs/{run}/cancel"), &json!({}))
        .await
        .expect(StatusCode::OK);
    let cancelled = app
        .get(&tenant.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["waits"], json!([]), "{cancelled:#}");
    let sent = signal(app, &tenant, "order-17", json!({ "amount": 100 })).await;
    assert_eq!(sent["resumed"], json!([]), "{sent:#}");
}

async fn a_retry_after_a_resume_does_not_wait_again(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    // After the wait, a step that fails for good: the run has no ticket.
    let fails = json!({ "id": "st_close", "type": "ticket/close", "config": {} });
    let automation = waiting_automation(app, &tenant, None, fails).await;
    let run = start(app, &tenant, &automation, "19").await;
    waiting(app, &tenant, &run).await;
    signal(app, &tenant, "order-19", json!({ "amount": 100 })).await;
    let failed = app.wait_for_final(&tenant, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    app.post(&tenant.key, &format!("/api/runs/{run}/retry"), &json!({}))
        .await
        .expect(StatusCode::OK);
    let again = app
        .wait_for_run(&tenant, &run, |r| {
            r["status"] == "failed"
                && r["steps"]
                    .as_array()
                    .is_some_and(|s| s.iter().filter(|s| s["step_id"] == "st_close").count() == 2)
        })
        .await;
    let waits = again["steps"]
        .as_array()
        .map(|s| s.iter().filter(|s| s["step_id"] == "st_paid").count());
    assert_eq!(
        waits,
        Some(1),
        "one wait, read as what it became, and no second wait: {again:#}"
    );
    assert_eq!(paid(&again), json!(100), "{again:#}");
}
