//! Run control as a client sees it: a waiting run is paused, resumed and
//! cancelled (a paused run does not go on until resumed, a cancelled one
//! never does); a failed run is retried from the step that failed, with its
//! context, without running the steps before it again; a control the run's
//! state does not allow is a 409 saying why; another tenant's run is a 404.

use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Reply, Tenant, TestApp, backend_tests, log_step, manual};

backend_tests!(
    crate::helpers::run;
    a_waiting_run_is_paused_resumed_and_cancelled,
    a_paused_run_waits_for_resume_and_a_cancelled_run_never_goes_on,
    a_failed_run_is_retried_from_the_failed_step,
    run_control_of_another_tenants_run_is_404,
    a_wait_that_is_the_last_step_holds_the_run_until_it_ends,
);

/// A manual automation: log, wait `duration`, log.
async fn waiting_automation(app: &TestApp, tenant: &Tenant, duration: &str) -> String {
    app.create_automation(
        tenant,
        &manual(
            &format!("Wait {duration}"),
            &json!([
                log_step("st_before", "before"),
                { "id": "st_wait", "type": "wait", "config": { "duration": duration } },
                log_step("st_after", "after")
            ]),
        ),
    )
    .await
}

/// Starts a run and waits until it sits in its `wait` step.
async fn waiting_run(app: &TestApp, tenant: &Tenant, automation: &str) -> String {
    let run = app
        .start_run(tenant, automation, &json!({ "input": {} }))
        .await;
    app.wait_for_run(tenant, &run, |r| r["status"] == "waiting")
        .await;
    run
}

async fn control(app: &TestApp, tenant: &Tenant, run: &str, action: &str) -> Reply {
    app.post(
        &tenant.key,
        &format!("/api/runs/{run}/{action}"),
        &json!({}),
    )
    .await
}

async fn show(app: &TestApp, tenant: &Tenant, run: &str) -> Value {
    app.get(&tenant.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK)
}

/// How many times each step ran (records per step id).
fn step_counts(run: &Value) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for step in run["steps"].as_array().unwrap() {
        *counts
            .entry(step["step_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    counts
}

#[track_caller]
fn assert_refused(reply: Reply, says: &str) {
    let error = reply.expect_error(StatusCode::CONFLICT, "conflict");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(says),
        "the 409 should say {says:?}: {error:#}"
    );
}

async fn a_waiting_run_is_paused_resumed_and_cancelled(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = waiting_automation(app, &tenant, "30s").await;
    let run = waiting_run(app, &tenant, &automation).await;

    let paused = control(app, &tenant, &run, "pause")
        .await
        .expect(StatusCode::OK);
    assert_eq!(paused["id"], run);
    assert_eq!(paused["status"], "paused", "{paused:#}");
    assert_eq!(show(app, &tenant, &run).await["status"], "paused");
    assert_refused(control(app, &tenant, &run, "pause").await, "paused");
    assert_refused(
        control(app, &tenant, &run, "retry").await,
        "only a failed run",
    );

    let resumed = control(app, &tenant, &run, "resume")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        resumed["status"], "waiting",
        "still in its wait: {resumed:#}"
    );
    assert_refused(
        control(app, &tenant, &run, "resume").await,
        "only a paused run",
    );

    let cancelled = control(app, &tenant, &run, "cancel")
        .await
        .expect(StatusCode::OK);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}");
    assert!(
        crate::helpers::ms(&cancelled["finished_at"]).is_some(),
        "{cancelled:#}"
    );
    for action in ["cancel", "pause", "resume", "retry"] {
        control(app, &tenant, &run, action)
            .await
            .expect_error(StatusCode::CONFLICT, "conflict");
    }
    let shown = show(app, &tenant, &run).await;
    assert_eq!(shown["status"], "cancelled", "{shown:#}");
    let counts = step_counts(&shown);
    assert_eq!(counts.get("st_before"), Some(&1), "{shown:#}");
    assert_eq!(counts.get("st_wait"), Some(&1), "{shown:#}");
    assert_eq!(counts.get("st_after"), None, "{shown:#}");
}

async fn a_paused_run_waits_for_resume_and_a_cancelled_run_never_goes_on(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = waiting_automation(app, &tenant, "1s").await;
    let paused = waiting_run(app, &tenant, &automation).await;
    let cancelled = waiting_run(app, &tenant, &automation).await;
    control(app, &tenant, &paused, "pause")
        .await
        .expect(StatusCode::OK);
    control(app, &tenant, &cancelled, "cancel")
        .await
        .expect(StatusCode::OK);

    // A run started now with the same wait is due after both held runs'
    // waits ran out: once it has completed, they would have gone on too.
    let sentinel = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &sentinel).await;
    assert_eq!(done["status"], "completed", "{done:#}");

    for (run, status) in [(&paused, "paused"), (&cancelled, "cancelled")] {
        let shown = show(app, &tenant, run).await;
        assert_eq!(shown["status"], status, "{shown:#}");
        assert_eq!(
            step_counts(&shown).get("st_after"),
            None,
            "a {status} run does not go on: {shown:#}"
        );
    }

    control(app, &tenant, &paused, "resume")
        .await
        .expect(StatusCode::OK);
    let finished = app.wait_for_final(&tenant, &paused).await;
    assert_eq!(finished["status"], "completed", "{finished:#}");
    let counts = step_counts(&finished);
    for step in ["st_before", "st_wait", "st_after"] {
        assert_eq!(counts.get(step), Some(&1), "{step}: {finished:#}");
    }
    assert_eq!(show(app, &tenant, &cancelled).await["status"], "cancelled");
}

async fn a_failed_run_is_retried_from_the_failed_step(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    // `st_type` fails for good while the type `order` does not exist; the
    // steps before it created a ticket and put a note into the context.
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Pack orders",
                &json!([
                    { "id": "st_ticket", "type": "ticket/upsert", "config": { "externalId": "{{orderId}}" } },
                    { "id": "st_note", "type": "set", "config": { "values": { "note": "packed {{orderId}}" } } },
                    { "id": "st_type", "type": "ticket/set-type", "config": { "type": "order" } },
                    { "id": "st_tag", "type": "ticket/add-tags", "config": { "tags": ["{{note}}"] } }
                ]),
            ),
        )
        .await;
    let run = app
        .start_run(
            &tenant,
            &automation,
            &json!({ "input": { "orderId": "5001" } }),
        )
        .await;
    let failed = app.wait_for_final(&tenant, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    assert!(
        failed["error"]
            .as_str()
            .unwrap_or_default()
            .contains("order"),
        "{failed:#}"
    );
    let counts = step_counts(&failed);
    assert_eq!(counts.get("st_tag"), None, "{failed:#}");

    app.create_ticket_type(&tenant, "order", &["new", "shipped"])
        .await;
    let retried = control(app, &tenant, &run, "retry")
        .await
        .expect(StatusCode::OK);
    assert_eq!(retried["id"], run);
    assert!(
        matches!(retried["status"].as_str(), Some("queued" | "running")),
        "{retried:#}"
    );
    assert!(retried["error"].is_null(), "{retried:#}");

    let finished = app.wait_for_final(&tenant, &run).await;
    assert_eq!(finished["status"], "completed", "{finished:#}");
    let counts = step_counts(&finished);
    assert_eq!(
        counts.get("st_ticket"),
        Some(&1),
        "not run again: {finished:#}"
    );
    assert_eq!(
        counts.get("st_note"),
        Some(&1),
        "not run again: {finished:#}"
    );
    assert_eq!(
        counts.get("st_type"),
        Some(&2),
        "failed, then ran: {finished:#}"
    );
    assert_eq!(counts.get("st_tag"), Some(&1), "{finished:#}");
    let statuses: Vec<&str> = finished["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == "st_type")
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["failed", "completed"], "{finished:#}");

    let tickets = app
        .get(&tenant.key, "/api/tickets?external_id=5001")
        .await
        .expect(StatusCode::OK);
    let items = tickets["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{tickets:#}");
    assert_eq!(items[0]["type"], "order");
    assert_eq!(items[0]["status"], "new");
    assert_eq!(
        items[0]["tags"],
        json!(["packed 5001"]),
        "the context of the first attempt is intact"
    );
    let ticket = app.ticket(&tenant, items[0]["id"].as_str().unwrap()).await;
    let created = ticket["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == "created" || l["kind"] == "attached")
        .count();
    assert_eq!(created, 1, "the ticket step ran once: {ticket:#}");

    assert_refused(
        control(app, &tenant, &run, "retry").await,
        "only a failed run",
    );
    control(app, &tenant, "run_nope", "retry")
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}

async fn run_control_of_another_tenants_run_is_404(app: &TestApp) {
    let a = app.create_tenant("Acme").await;
    let b = app.create_tenant("Beta").await;
    let automation = waiting_automation(app, &a, "30s").await;
    let run = waiting_run(app, &a, &automation).await;
    for action in ["pause", "resume", "cancel", "retry"] {
        let error = control(app, &b, &run, action)
            .await
            .expect_error(StatusCode::NOT_FOUND, "not_found");
        assert!(
            error["message"].as_str().unwrap().contains("run"),
            "{action}: {error:#}"
        );
        control(app, &a, "run_nope", action)
            .await
            .expect_error(StatusCode::NOT_FOUND, "not_found");
    }
    assert_eq!(show(app, &a, &run).await["status"], "waiting");
    app.get(&b.key, &format!("/api/runs/{run}"))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}

/// A run whose last step is a `wait` is not complete while it waits: it
/// says `waiting` (also after a pause and a resume, which claim it early),
/// and completes once the wait's `until` has passed, not before.
async fn a_wait_that_is_the_last_step_holds_the_run_until_it_ends(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = |duration: &str| {
        manual(
            &format!("Log, then wait {duration}"),
            &json!([
                log_step("st_before", "before"),
                { "id": "st_wait", "type": "wait", "config": { "duration": duration } }
            ]),
        )
    };
    let long = app.create_automation(&tenant, &automation("1h")).await;
    let run = waiting_run(app, &tenant, &long).await;
    control(app, &tenant, &run, "pause")
        .await
        .expect(StatusCode::OK);
    control(app, &tenant, &run, "resume")
        .await
        .expect(StatusCode::OK);
    let held = show(app, &tenant, &run).await;
    assert_eq!(held["status"], "waiting", "an hour to go: {held:#}");
    assert!(held["finished_at"].is_null(), "{held:#}");

    let short = app.create_automation(&tenant, &automation("2s")).await;
    let run = app
        .start_run(&tenant, &short, &json!({ "input": {} }))
        .await;
    let ended = app.wait_for_final(&tenant, &run).await;
    assert_eq!(ended["status"], "completed", "{ended:#}");
    let until = ended["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|s| s["output"]["until"].as_str())
        .unwrap_or_else(|| panic!("the wait's output says until when: {ended:#}"));
    let until = until.parse::<jiff::Timestamp>().unwrap().as_millisecond();
    let finished = crate::helpers::ms(&ended["finished_at"]).unwrap();
    assert!(
        finished >= until,
        "the run ended at {finished}, before its last step's wait ended at {until}: {ended:#}"
    );
}
