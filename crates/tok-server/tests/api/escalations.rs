//! Escalations, as a user sees them: an approval nobody decides escalates
//! to an incident after its level's `after`, while the run keeps waiting
//! for the decision (the wait is not resumed); a level fires once; the
//! decision that comes later resumes the run and leaves the later levels
//! unfired. A decision made while a level's steps run (even its first,
//! on the wait's own job) waits for the step to wait again, which takes
//! it. Short durations drive the time: no sleeps.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::any;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};

use crate::helpers::{TestApp, backend_tests, log_step, manual};

backend_tests!(crate::helpers::run;
    an_approval_nobody_decides_escalates_to_an_incident_and_keeps_waiting,
    a_wait_for_a_slow_child_escalates_and_still_resumes_when_the_child_ends,
    an_approval_stays_decidable_and_a_signal_kept_while_an_escalation_runs,
    an_escalation_that_fails_its_run_closes_the_approval,
);

backend_tests!(crate::helpers::run_with_service;
    a_decision_made_while_the_escalations_first_step_runs_is_kept,
);

async fn an_approval_nobody_decides_escalates_to_an_incident_and_keeps_waiting(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let group = app.create_group(&tenant, "Finance", &["Alice"]).await;
    let alice = group["members"][0]["id"].as_str().unwrap().to_owned();
    let automation = manual(
        "Refund",
        &json!([
            { "id": "st_ok", "type": "approval",
              "config": { "approvers": { "group": "Finance" }, "prompt": "Refund?", "timeout": "1h" },
              "escalations": [
                { "after": "200ms", "steps": [
                    { "id": "st_late", "type": "incident/create",
                      "config": { "title": "Refund waits for approval", "impact": "a customer waits" } } ] },
                { "after": "50m", "steps": [ log_step("st_later", "still nobody") ] }
              ] },
            log_step("st_after", "{{st_ok.decision}}")
        ]),
    );
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;

    // The first level fires, and the run waits again for the decision.
    let escalated = app
        .wait_for_run(&tenant, &run, |r| {
            r["status"] == "waiting"
                && r["waits"].as_array().is_some_and(|w| w.len() == 1)
                && r["steps"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s["step_id"] == "st_late"))
        })
        .await;
    let late = escalated["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step_id"] == "st_late")
        .unwrap();
    assert_eq!(late["path"], "0.escalations.0.0", "{escalated:#}");
    assert_eq!(late["status"], "completed");
    let waiting: Vec<&Value> = escalated["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == "st_ok")
        .collect();
    assert_eq!(waiting.len(), 1, "the wait was not resumed: {escalated:#}");
    assert_eq!(waiting[0]["status"], "waiting");
    let incidents = app
        .get(&tenant.key, "/api/incidents")
        .await
        .expect(StatusCode::OK);
    let items = incidents["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{incidents:#}");
    assert_eq!(items[0]["title"], "Refund waits for approval");

    // The decision still resumes it; the later level never fires.
    let pending = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    let id = pending["items"][0]["id"].as_str().expect("still pending");
    app.post(
        &tenant.key,
        &format!("/api/approvals/{id}"),
        &json!({ "decision": "approve", "member": alice }),
    )
    .await
    .expect(StatusCode::OK);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let ids: Vec<&str> = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["st_ok", "st_late", "st_after"],
        "the approval's row reads as what it became, its escalation after it: {done:#}"
    );
    assert!(
        done["context"].get("_escalations").is_none(),
        "the wait's escalations are over: {done:#}"
    );
}

/// An escalation whose steps take a while: its first step is recorded at
/// once, its second holds a worker for `pause` seconds.
fn slow_escalation(pause: f64) -> Value {
    json!([{ "after": "100ms", "steps": [
        { "id": "st_late", "type": "incident/create",
          "config": { "title": "Still waiting", "impact": "a customer waits" } },
        { "id": "st_slow", "type": "flow/pause", "config": { "seconds": pause } } ] }])
}

async fn an_approval_stays_decidable_and_a_signal_kept_while_an_escalation_runs(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let group = app.create_group(&tenant, "Finance", &["Alice"]).await;
    let alice = group["members"][0]["id"].as_str().unwrap().to_owned();
    let approval = manual(
        "Refund",
        &json!([
            { "id": "st_ok", "type": "approval",
              "config": { "approvers": { "group": "Finance" }, "prompt": "Refund?", "timeout": "1h" },
              "escalations": slow_escalation(3.0) },
            log_step("st_after", "{{st_ok.decision}}")
        ]),
    );
    let signal = manual(
        "Paid",
        &json!([
            { "id": "st_paid", "type": "wait_for_event",
              "config": { "key": "pay-1", "timeout": "1h", "lookback": false },
              "escalations": slow_escalation(3.0) },
            log_step("st_after", "{{st_paid.payload.amount}}")
        ]),
    );
    let approval = app.create_automation(&tenant, &approval).await;
    let signal = app.create_automation(&tenant, &signal).await;
    let refund = app
        .start_run(&tenant, &approval, &json!({ "input": {} }))
        .await;
    let paid = app
        .start_run(&tenant, &signal, &json!({ "input": {} }))
        .await;
    let escalating = |r: &Value| {
        r["steps"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["step_id"] == "st_late"))
    };
    app.wait_for_run(&tenant, &refund, escalating).await;
    // The escalation's pause runs: the approval is still there to decide.
    let pending = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    assert_eq!(pending["items"][0]["status"], "pending", "{pending:#}");
    let id = pending["items"][0]["id"].as_str().unwrap();
    app.post(
        &tenant.key,
        &format!("/api/approvals/{id}"),
        &json!({ "decision": "approve", "member": alice }),
    )
    .await
    .expect(StatusCode::OK);
    app.wait_for_run(&tenant, &paid, escalating).await;
    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": "pay-1", "payload": { "amount": 42 } }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    // Each goes on with what came while its escalation ran.
    for (run, said) in [(&refund, "approve"), (&paid, "42")] {
        let done = app.wait_for_final(&tenant, run).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        let after = done["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["step_id"] == "st_after")
            .unwrap_or_else(|| panic!("no st_after: {done:#}"));
        assert_eq!(after["log"], json!([format!("info: {said}")]), "{done:#}");
    }
}

async fn an_escalation_that_fails_its_run_closes_the_approval(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_group(&tenant, "Finance", &["Alice"]).await;
    let automation = manual(
        "Refund",
        &json!([
            { "id": "st_ok", "type": "approval",
              "config": { "approvers": { "group": "Finance" }, "prompt": "Refund?", "timeout": "1h" },
              "escalations": [{ "after": "100ms", "steps": [
                  { "id": "st_bad", "type": "set", "config": { "values": { "x": "{{nothing.here}}" } } } ] }] },
            log_step("st_after", "{{st_ok.decision}}")
        ]),
    );
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    assert_eq!(done["waits"], json!([]), "it waits for nothing: {done:#}");
    let approvals = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    let shown: Vec<&Value> = approvals["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["status"] == "pending")
        .collect();
    assert!(
        shown.is_empty(),
        "a failed run's approval is no longer pending: {approvals:#}"
    );
}

async fn a_wait_for_a_slow_child_escalates_and_still_resumes_when_the_child_ends(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let child = manual(
        "Ship order",
        &json!([
            { "id": "st_shipped", "type": "wait_for_event", "config": { "key": "order:shipped" } },
            { "id": "st_end", "type": "end", "config": { "output": { "shipped": true } } }
        ]),
    );
    let child = app.create_automation(&tenant, &child).await;
    let parent = manual(
        "Order",
        &json!([
            { "id": "st_start", "type": "run_workflow",
              "config": { "automation": child, "input": {}, "wait": false } },
            { "id": "st_runs", "type": "wait_for_runs",
              "config": { "runs": ["{{st_start.runId}}"] },
              "escalations": [
                { "after": "200ms", "steps": [
                    { "id": "st_late", "type": "incident/create",
                      "config": { "title": "Shipping is late", "impact": "a customer waits" } } ] },
                { "after": "50m", "steps": [ log_step("st_later", "still not shipped") ] }
              ] },
            log_step("st_after", "shipped")
        ]),
    );
    let parent = app.create_automation(&tenant, &parent).await;
    let run = app
        .start_run(&tenant, &parent, &json!({ "input": {} }))
        .await;

    // The first level fires while the child still waits; the parent waits on.
    let escalated = app
        .wait_for_run(&tenant, &run, |r| {
            r["status"] == "waiting"
                && r["waits"].as_array().is_some_and(|w| w.len() == 1)
                && r["steps"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s["step_id"] == "st_late"))
        })
        .await;
    assert_eq!(escalated["waits"][0]["kind"], "runs", "{escalated:#}");
    let incidents = app
        .get(&tenant.key, "/api/incidents")
        .await
        .expect(StatusCode::OK);
    let items = incidents["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{incidents:#}");
    assert_eq!(items[0]["title"], "Shipping is late");

    // The child ends: the wait resumes with its output; the later level never fires.
    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": "order:shipped", "payload": {} }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let ids: Vec<&str> = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["st_start", "st_runs", "st_late", "st_after"],
        "{done:#}"
    );
    assert_eq!(
        done["context"]["st_runs"]["runs"][0]["output"],
        json!({ "shipped": true }),
        "{done:#}"
    );
    assert!(
        done["context"].get("_escalations").is_none(),
        "the wait's escalations are over: {done:#}"
    );
}

/// A service whose every call is held until the test lets it through;
/// `arrived` tells that a call came.
struct Held {
    arrived: Notify,
    gate: Semaphore,
}

async fn held(State(service): State<Arc<Held>>) -> axum::Json<Value> {
    service.arrived.notify_one();
    let _permit = service.gate.acquire().await.unwrap();
    axum::Json(json!({ "paged": true }))
}

async fn a_decision_made_while_the_escalations_first_step_runs_is_kept(app: &TestApp) {
    let service = Arc::new(Held {
        arrived: Notify::new(),
        gate: Semaphore::new(0),
    });
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let router = Router::new()
        .route("/{*path}", any(held))
        .with_state(service.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let tenant = app.create_tenant("Acme").await;
    let group = app.create_group(&tenant, "Finance", &["Alice"]).await;
    let alice = group["members"][0]["id"].as_str().unwrap().to_owned();
    // The escalation's only step pages someone: the call is held, so the
    // worker is inside the level's first step when the decision comes.
    let refund = manual(
        "Refund",
        &json!([
            { "id": "st_ok", "type": "approval",
              "config": { "approvers": { "group": "Finance" }, "prompt": "Refund?", "timeout": "1h" },
              "escalations": [{ "after": "100ms", "steps": [
                  { "id": "st_page", "type": "http",
                    "config": { "method": "POST", "url": format!("http://{addr}/page"),
                                "timeoutMs": 30000 } } ] }] },
            log_step("st_after", "{{st_ok.decision}}")
        ]),
    );
    let refund = app.create_automation(&tenant, &refund).await;
    let run = app
        .start_run(&tenant, &refund, &json!({ "input": {} }))
        .await;
    service.arrived.notified().await;
    let pending = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    assert_eq!(pending["items"][0]["status"], "pending", "{pending:#}");
    let id = pending["items"][0]["id"].as_str().unwrap();
    let decided = app
        .post(
            &tenant.key,
            &format!("/api/approvals/{id}"),
            &json!({ "decision": "approve", "member": alice }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(decided["status"], "approved", "{decided:#}");
    service.gate.add_permits(1);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let after = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step_id"] == "st_after")
        .unwrap_or_else(|| panic!("no st_after: {done:#}"));
    assert_eq!(after["log"], json!(["info: approve"]), "{done:#}");
}
