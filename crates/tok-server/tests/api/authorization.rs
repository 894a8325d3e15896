//! Authorization, as the platform admin and a tenant see it: a suspended
//! tenant's runs run no step at all — a worker fails a run at its first
//! step, a control step or one with side effects (an `http` step never
//! reaches its service), and the dispatcher begins none of a webhook's run
//! — the denial is terminal and raises an incident; resuming the tenant
//! lets its next runs go on; a run records who started it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::any;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, log_step, manual};

backend_tests!(crate::helpers::run_with_service;
    a_suspended_tenants_http_step_is_denied_without_a_call,
    a_suspended_tenants_run_runs_no_control_step_at_dispatch_or_in_a_worker,
    only_the_admin_suspends_a_tenant_and_unknown_settings_are_refused,
    a_run_records_who_started_it,
);

/// Counts the calls that reached it.
async fn serve(app: &TestApp, calls: Arc<AtomicUsize>) -> SocketAddr {
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route(
            "/{*path}",
            any(async |State(calls): State<Arc<AtomicUsize>>| {
                calls.fetch_add(1, Ordering::SeqCst);
                axum::Json(json!({ "ok": true }))
            }),
        )
        .with_state(calls);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn call(addr: SocketAddr) -> Value {
    json!({ "id": "st_call", "type": "http",
            "config": { "method": "POST", "url": format!("http://{addr}/orders"), "timeoutMs": 5000 } })
}

async fn a_suspended_tenants_http_step_is_denied_without_a_call(app: &TestApp) {
    let calls = Arc::new(AtomicUsize::new(0));
    let addr = serve(app, calls.clone()).await;
    let tenant = app.create_tenant("Acme").await;
    let automation = manual(
        "Order",
        &json!([log_step("st_before", "starting"), call(addr)]),
    );
    let automation = app.create_automation(&tenant, &automation).await;

    let suspended = app
        .patch(
            &app.admin_key,
            &format!("/api/tenants/{}", tenant.id),
            &json!({ "suspended": true }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(suspended["suspended"], true, "{suspended:#}");

    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "no call reached the service"
    );
    let steps = done["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "denied at its first step, once: {done:#}");
    assert_eq!(
        steps[0]["step_id"], "st_before",
        "a control step is denied too"
    );
    assert_eq!(steps[0]["status"], "failed");
    let error = steps[0]["error"].as_str().unwrap();
    assert!(
        error.starts_with("authorization_denied: step `st_before` (flow/log) may not run: tenant")
            && error.contains("suspended"),
        "{error}"
    );
    assert_eq!(
        steps[0]["log"],
        json!(["failed (not retryable): ".to_owned() + error])
    );
    let incidents = app
        .get(&tenant.key, "/api/incidents")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        incidents["items"].as_array().unwrap().len(),
        1,
        "{incidents:#}"
    );

    app.patch(
        &app.admin_key,
        &format!("/api/tenants/{}", tenant.id),
        &json!({ "suspended": false }),
    )
    .await
    .expect(StatusCode::OK);
    let again = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &again).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

async fn suspend(app: &TestApp, tenant: &crate::helpers::Tenant, suspended: bool) {
    app.patch(
        &app.admin_key,
        &format!("/api/tenants/{}", tenant.id),
        &json!({ "suspended": suspended }),
    )
    .await
    .expect(StatusCode::OK);
}

/// The run failed at `step`, denied for good, and no step of it completed.
fn denied_at(run: &Value, step: &str) {
    assert_eq!(run["status"], "failed", "{run:#}");
    let steps = run["steps"].as_array().unwrap();
    assert!(
        steps.iter().all(|s| s["status"] != "completed"),
        "no step ran: {run:#}"
    );
    let recorded: Vec<&Value> = steps.iter().filter(|s| s["status"] == "failed").collect();
    assert_eq!(recorded.len(), 1, "{run:#}");
    assert_eq!(recorded[0]["step_id"], step, "{run:#}");
    assert_eq!(recorded[0]["status"], "failed", "{run:#}");
    assert_eq!(recorded[0]["attempt"], 1, "never retried: {run:#}");
    let error = recorded[0]["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!("authorization_denied: step `{step}`"))
            && error.contains("is suspended"),
        "{error}"
    );
}

async fn a_suspended_tenants_run_runs_no_control_step_at_dispatch_or_in_a_worker(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(&tenant, &crate::helpers::plain_source("shop"))
        .await;
    let controls = json!([
        { "id": "st_set", "type": "set", "config": { "values": { "n": "{{_body.n}}" } } },
        { "id": "st_check", "type": "condition",
          "rules": [{ "field": "st_set.n", "operator": "gt", "value": 0 }],
          "then": [log_step("st_yes", "positive")], "else": [log_step("st_no", "not positive")] }
    ]);
    let on_webhook =
        crate::helpers::on_webhook("Controls", source["id"].as_str().unwrap(), &controls);
    app.create_automation(&tenant, &on_webhook).await;
    let waiter = app
        .create_automation(
            &tenant,
            &manual(
                "Waits",
                &json!([{ "id": "st_wait", "type": "wait_for_event", "config": { "key": "paid", "timeout": "1h" } },
                        log_step("st_after", "paid")]),
            ),
        )
        .await;
    let waiting = app
        .start_run(&tenant, &waiter, &json!({ "input": {} }))
        .await;
    app.wait_for_run(&tenant, &waiting, |r| r["status"] == "waiting")
        .await;

    suspend(app, &tenant, true).await;
    let token = source["token"].as_str().unwrap();
    // The dispatcher begins none of its control steps: the run is not
    // complete at dispatch, and a worker fails it at its first step.
    let accepted = app
        .webhook(token, &json!({ "n": 5 }))
        .await
        .expect(StatusCode::ACCEPTED);
    let event = accepted["event_id"].as_str().unwrap();
    let uri = format!("/api/events/{event}");
    let run = app
        .poll("the webhook's run", async || {
            let event = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
            match event["runs"].as_array().and_then(|r| r.first()) {
                Some(run) => Ok(run["id"].as_str().unwrap().to_owned()),
                None => Err(()),
            }
        })
        .await;
    let run = app.wait_for_final(&tenant, &run).await;
    denied_at(&run, "st_set");
    // A waiting run's wait, resumed by its signal, fails in turn.
    app.post(&tenant.key, "/api/signals", &json!({ "key": "paid" }))
        .await
        .expect(StatusCode::ACCEPTED);
    let run = app.wait_for_final(&tenant, &waiting).await;
    assert!(
        run["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["step_id"] != "st_after"),
        "{run:#}"
    );
    denied_at(&run, "st_wait");

    suspend(app, &tenant, false).await;
    let accepted = app
        .webhook(token, &json!({ "n": 6 }))
        .await
        .expect(StatusCode::ACCEPTED);
    let event = accepted["event_id"].as_str().unwrap();
    let uri = format!("/api/events/{event}");
    let run = app
        .poll("the webhook's run", async || {
            let event = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
            match event["runs"].as_array().and_then(|r| r.first()) {
                Some(run) => Ok(run["id"].as_str().unwrap().to_owned()),
                None => Err(()),
            }
        })
        .await;
    let run = app.wait_for_final(&tenant, &run).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    let ran: Vec<&str> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step_id"].as_str().unwrap())
        .collect();
    assert_eq!(ran, ["st_set", "st_check", "st_yes"]);
}

async fn only_the_admin_suspends_a_tenant_and_unknown_settings_are_refused(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let uri = format!("/api/tenants/{}", tenant.id);
    app.patch(&tenant.key, &uri, &json!({ "suspended": true }))
        .await
        .expect_error(StatusCode::FORBIDDEN, "admin_only");
    let error = app
        .patch(&app.admin_key, &uri, &json!({ "suspend": true }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert!(
        error["message"].as_str().unwrap().contains("suspend"),
        "{error:#}"
    );
    app.patch(
        &app.admin_key,
        "/api/tenants/ten_missing",
        &json!({ "suspended": true }),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "not_found");
    let listed = app
        .get(&app.admin_key, "/api/tenants")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"][0]["suspended"], false, "{listed:#}");
}

async fn a_run_records_who_started_it(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = manual("Hello", &json!([log_step("st_hi", "hi")]));
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["actor"]["kind"], "key", "{done:#}");
    assert!(
        done["actor"]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("key_")),
        "the key's id, never the key: {done:#}"
    );
    assert!(!done.to_string().contains(&tenant.key));
}
