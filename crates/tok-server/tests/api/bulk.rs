//! Bulk operations as an operator drives them after a fix: 20 runs failed
//! at their second step; once the automation is fixed, a bulk retry on the
//! current version counts 20 in its dry run, reports 20 of 20, and every
//! run completes without calling its first step again; a second bulk retry
//! finds nothing to do. An operation made while the engine is down is done
//! when it comes back (its state is in rows). A retry on the current
//! version that cannot move a run says which and why; a bulk cancel takes
//! only the runs its `where` matches over their context.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::routing::any;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual};

backend_tests!(
    crate::helpers::run_with_service;
    a_bulk_retry_after_a_fix_completes_every_failed_run_once,
    a_retry_on_the_current_version_says_which_runs_it_could_not_move,
    a_bulk_cancel_takes_the_runs_its_where_matches,
);

/// How many calls each path of the local service received. `/broken…`
/// answers 404 (a failure a step does not retry), the rest 200.
#[derive(Default)]
struct Service {
    calls: Mutex<HashMap<String, usize>>,
}

async fn answer(State(service): State<Arc<Service>>, uri: Uri) -> (StatusCode, axum::Json<Value>) {
    let path = uri.path().to_owned();
    *service
        .calls
        .lock()
        .unwrap()
        .entry(path.clone())
        .or_default() += 1;
    if path.starts_with("/broken") {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({ "error": "no such order" })),
        );
    }
    (StatusCode::OK, axum::Json(json!({ "done": path })))
}

async fn serve(app: &TestApp) -> (Arc<Service>, SocketAddr) {
    let service = Arc::new(Service::default());
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let router = Router::new()
        .route("/{*path}", any(answer))
        .with_state(service.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (service, addr)
}

fn calls(service: &Service, path: &str) -> usize {
    service
        .calls
        .lock()
        .unwrap()
        .get(path)
        .copied()
        .unwrap_or(0)
}

fn call(id: &str, addr: SocketAddr, path: &str) -> Value {
    json!({ "id": id, "type": "http",
            "config": { "method": "POST", "url": format!("http://{addr}{path}"), "timeoutMs": 5000 } })
}

/// Ship an order: reserve it (`/reserve`), then invoice it at `invoice`.
fn shipping(addr: SocketAddr, invoice: &str) -> Value {
    manual(
        "Ship",
        &json!([
            call("st_reserve", addr, "/reserve"),
            call("st_invoice", addr, invoice)
        ]),
    )
}

/// Starts `n` runs and waits until each has failed.
async fn failed_runs(app: &TestApp, tenant: &Tenant, automation: &str, n: usize) -> Vec<String> {
    let mut runs = Vec::new();
    for i in 0..n {
        runs.push(
            app.start_run(tenant, automation, &json!({ "input": { "order": i } }))
                .await,
        );
    }
    for run in &runs {
        let done = app.wait_for_final(tenant, run).await;
        assert_eq!(done["status"], "failed", "{done:#}");
    }
    runs
}

async fn bulk(app: &TestApp, tenant: &Tenant, body: Value) -> Value {
    let status = match body["dry_run"] == json!(true) {
        true => StatusCode::OK,
        false => StatusCode::ACCEPTED,
    };
    app.post(&tenant.key, "/api/runs/bulk", &body)
        .await
        .expect(status)
}

/// Polls the operation until it is no longer running.
async fn finished(app: &TestApp, tenant: &Tenant, operation: &str) -> Value {
    let uri = format!("/api/operations/{operation}");
    app.poll(&format!("operation {operation} finished"), async || {
        let op = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
        (op["status"] != "running").then_some(op).ok_or(())
    })
    .await
}

async fn a_bulk_retry_after_a_fix_completes_every_failed_run_once(app: &TestApp) {
    let (service, addr) = serve(app).await;
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(&tenant, &shipping(addr, "/broken/invoice"))
        .await;
    let runs = failed_runs(app, &tenant, &automation, 20).await;
    assert_eq!(calls(&service, "/reserve"), 20);

    // The fix: the invoice goes to the right place in version 2.
    app.put(
        &tenant.key,
        &format!("/api/automations/{automation}"),
        &shipping(addr, "/invoice"),
    )
    .await
    .expect(StatusCode::OK);
    let filter = json!({ "status": "failed", "automation": automation });
    let dry = bulk(
        app,
        &tenant,
        json!({ "filter": filter, "action": "retry", "version": "current", "dry_run": true }),
    )
    .await;
    assert_eq!(dry["count"], json!(20), "{dry:#}");
    assert_eq!(dry["runs"].as_array().map(Vec::len), Some(20));
    assert_eq!(calls(&service, "/invoice"), 0, "a dry run retries nothing");

    // Made while the engine is down: nothing moves until it is back, and
    // then the operation is done from its rows.
    app.stop_engine().await;
    let made = bulk(
        app,
        &tenant,
        json!({ "filter": filter, "action": "retry", "version": "current" }),
    )
    .await;
    assert_eq!(made["total"], json!(20), "{made:#}");
    let operation = made["operation_id"].as_str().unwrap().to_owned();
    let waiting = app
        .get(&tenant.key, &format!("/api/operations/{operation}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        (&waiting["status"], &waiting["done"]),
        (&json!("running"), &json!(0)),
        "{waiting:#}"
    );
    app.start_engine().await;
    let op = finished(app, &tenant, &operation).await;
    assert_eq!(
        (&op["status"], &op["total"], &op["done"], &op["failed"]),
        (&json!("done"), &json!(20), &json!(20), &json!(0)),
        "{op:#}"
    );
    assert_eq!(op["failures"], json!([]));
    for run in &runs {
        let done = app.wait_for_final(&tenant, run).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        assert_eq!(done["version"], json!(2), "moved to the fixed version");
    }
    assert_eq!(
        calls(&service, "/reserve"),
        20,
        "the first step is not called again"
    );
    assert_eq!(calls(&service, "/invoice"), 20);

    // The same bulk retry again finds no failed run: each was retried once.
    let again = bulk(app, &tenant, json!({ "filter": filter, "action": "retry" })).await;
    assert_eq!(again["total"], json!(0), "{again:#}");
    let again = finished(app, &tenant, again["operation_id"].as_str().unwrap()).await;
    assert_eq!(again["done"], json!(0), "{again:#}");
    assert_eq!(
        calls(&service, "/reserve") + calls(&service, "/invoice"),
        40
    );

    let listed = app
        .get(&tenant.key, "/api/operations")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(2),
        "{listed:#}"
    );
    let audit = app
        .get(&tenant.key, "/api/audit?action=operation.created")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        audit["items"].as_array().map(Vec::len),
        Some(3),
        "{audit:#}"
    );
}

async fn a_retry_on_the_current_version_says_which_runs_it_could_not_move(app: &TestApp) {
    let (service, addr) = serve(app).await;
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(&tenant, &shipping(addr, "/broken/invoice"))
        .await;
    let mut runs = failed_runs(app, &tenant, &automation, 2).await;
    // Version 2 has no invoice step where the runs failed.
    app.put(
        &tenant.key,
        &format!("/api/automations/{automation}"),
        &manual(
            "Ship",
            &json!([
                call("st_reserve", addr, "/reserve"),
                log_step("st_log", "done")
            ]),
        ),
    )
    .await
    .expect(StatusCode::OK);
    let made = bulk(
        app,
        &tenant,
        json!({ "filter": { "status": "failed" }, "action": "retry", "version": "current" }),
    )
    .await;
    let op = finished(app, &tenant, made["operation_id"].as_str().unwrap()).await;
    assert_eq!(
        (&op["done"], &op["failed"]),
        (&json!(0), &json!(2)),
        "{op:#}"
    );
    let mut failed: Vec<String> = op["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let reason = f["reason"].as_str().unwrap();
            assert!(
                reason.contains("not moved to version 2") && reason.contains("st_invoice"),
                "{reason}"
            );
            f["run_id"].as_str().unwrap().to_owned()
        })
        .collect();
    failed.sort();
    runs.sort();
    assert_eq!(failed, runs);
    for run in &runs {
        let run = app
            .get(&tenant.key, &format!("/api/runs/{run}"))
            .await
            .expect(StatusCode::OK);
        assert_eq!(
            (&run["status"], &run["version"]),
            (&json!("failed"), &json!(1))
        );
    }
    assert_eq!(calls(&service, "/broken/invoice"), 2, "nothing ran again");

    // What the body gets wrong is named.
    let many: Vec<Value> = (0..21)
        .map(|i| json!({ "field": format!("_body.f{i}"), "operator": "isEmpty" }))
        .collect();
    for (body, field) in [
        (
            json!({ "action": "retry", "filter": { "where": { "rules": many } } }),
            "filter",
        ),
        (json!({ "action": "restart" }), "action"),
        (json!({ "filter": {} }), "action"),
        (
            json!({ "action": "cancel", "version": "current" }),
            "version",
        ),
        (
            json!({ "action": "retry", "filter": { "status": "broken" } }),
            "filter",
        ),
        (
            json!({ "action": "retry", "filter": { "since": "last week" } }),
            "filter",
        ),
        (
            json!({ "action": "retry", "filter": { "order": 1 } }),
            "filter",
        ),
    ] {
        let error = app
            .post(&tenant.key, "/api/runs/bulk", &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(error["field"], json!(field), "{body}: {error:#}");
    }
}

async fn a_bulk_cancel_takes_the_runs_its_where_matches(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Hold",
                &json!([{ "id": "st_wait", "type": "wait", "config": { "duration": "1h" } }]),
            ),
        )
        .await;
    let mut runs = HashMap::new();
    for order in ["A-1", "B-2", "C-3"] {
        let run = app
            .start_run(
                &tenant,
                &automation,
                &json!({ "input": { "order": order } }),
            )
            .await;
        app.wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
            .await;
        runs.insert(order, run);
    }
    let filter = json!({ "where": { "rules": [
        { "field": "_body.order", "operator": "eq", "value": "B-2" }
    ] } });
    let dry = bulk(
        app,
        &tenant,
        json!({ "filter": filter, "action": "cancel", "dry_run": true }),
    )
    .await;
    assert_eq!(dry["count"], json!(1), "{dry:#}");
    assert_eq!(dry["runs"][0]["id"], json!(runs["B-2"]));
    let made = bulk(
        app,
        &tenant,
        json!({ "filter": filter, "action": "cancel" }),
    )
    .await;
    let op = finished(app, &tenant, made["operation_id"].as_str().unwrap()).await;
    assert_eq!(
        (&op["done"], &op["failed"]),
        (&json!(1), &json!(0)),
        "{op:#}"
    );
    for (order, run) in &runs {
        let run = app
            .get(&tenant.key, &format!("/api/runs/{run}"))
            .await
            .expect(StatusCode::OK);
        let expected = if *order == "B-2" {
            "cancelled"
        } else {
            "waiting"
        };
        assert_eq!(run["status"], expected, "{order}: {run:#}");
    }
    // A finished operation is not cancelled again.
    app.post(
        &tenant.key,
        &format!("/api/operations/{}/cancel", op["id"].as_str().unwrap()),
        &json!({}),
    )
    .await
    .expect_error(StatusCode::CONFLICT, "conflict");
}
