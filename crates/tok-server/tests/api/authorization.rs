//! Authorization, as the platform admin and a tenant see it: a suspended
//! tenant's steps with side effects are denied before they run (an `http`
//! step never reaches its service), the denial is terminal and raises an
//! incident; resuming the tenant lets its next runs call again; a run
//! records who started it.

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
    let denied: Vec<&Value> = steps.iter().filter(|s| s["step_id"] == "st_call").collect();
    assert_eq!(denied.len(), 1, "denied once, never retried: {done:#}");
    assert_eq!(denied[0]["status"], "failed");
    let error = denied[0]["error"].as_str().unwrap();
    assert!(
        error.starts_with("authorization_denied:") && error.contains("suspended"),
        "{error}"
    );
    assert_eq!(
        steps.iter().find(|s| s["step_id"] == "st_before").unwrap()["status"],
        "completed",
        "steps without side effects still run"
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
