//! Parallel branches, as a user drives them: a `parallel` step's branches
//! run at the same time (two `http` branches against a service answering
//! after 300 ms are both in flight at once, by the service's own count),
//! their outputs meet in the run's context after the join, and a branch
//! that fails cancels the others and fails the step with `branch_failed`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::routing::any;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, log_step, manual};

backend_tests!(crate::helpers::run_with_service;
    two_http_branches_call_the_service_at_the_same_time,
    a_failed_branch_cancels_the_others_and_fails_the_step,
);

/// What the service saw: calls in flight now, the most ever in flight at
/// once, and the calls it answered.
#[derive(Default)]
struct Service {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    answered: std::sync::Mutex<Vec<String>>,
}

/// Answers every call after 300 ms (`/missing` at once, with 404).
async fn answer(State(service): State<Arc<Service>>, uri: Uri) -> (StatusCode, axum::Json<Value>) {
    if uri.path() == "/missing" {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({ "error": "no such order" })),
        );
    }
    let now = service.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    service.peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    service.in_flight.fetch_sub(1, Ordering::SeqCst);
    service.answered.lock().unwrap().push(uri.path().to_owned());
    (StatusCode::OK, axum::Json(json!({ "from": uri.path() })))
}

async fn serve(app: &TestApp, service: Arc<Service>) -> SocketAddr {
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/{*path}", any(answer))
        .with_state(service);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn call(id: &str, addr: SocketAddr, path: &str) -> Value {
    json!({ "id": id, "type": "http",
            "config": { "method": "GET", "url": format!("http://{addr}{path}"), "timeoutMs": 5000 } })
}

fn step<'a>(run: &'a Value, id: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .and_then(|steps| steps.iter().rev().find(|s| s["step_id"] == id))
        .unwrap_or_else(|| panic!("no step {id} in {run:#}"))
}

async fn two_http_branches_call_the_service_at_the_same_time(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = app.create_tenant("Acme").await;
    let automation = manual(
        "Stock and price",
        &json!([
            { "id": "st_both", "type": "parallel", "branches": [
                [ call("st_stock", addr, "/stock") ],
                [ call("st_price", addr, "/price") ]
            ] },
            log_step("st_log", "{{st_stock.body.from}} {{st_price.body.from}}")
        ]),
    );
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(
        service.peak.load(Ordering::SeqCst),
        2,
        "the service had both calls in flight at once"
    );
    let mut answered = service.answered.lock().unwrap().clone();
    answered.sort();
    assert_eq!(answered, ["/price", "/stock"]);

    assert_eq!(step(&done, "st_stock")["path"], "0.branches.0.0");
    assert_eq!(step(&done, "st_price")["path"], "0.branches.1.0");
    let parallel = step(&done, "st_both");
    assert_eq!(parallel["status"], "completed", "{done:#}");
    assert_eq!(parallel["output"], json!({ "branches": 2 }));
    assert_eq!(
        step(&done, "st_log")["log"][0],
        "info: /stock /price",
        "both branches' outputs are in the context after the join"
    );
    let rows = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == "st_both")
        .count();
    assert_eq!(
        rows, 1,
        "the parallel step's wait reads as what it became: {done:#}"
    );
    assert_eq!(
        parallel["log"],
        json!(["running 2 branches at once", "2 branches done"]),
        "the parallel step waits while its branches run, once: {done:#}"
    );
}

async fn a_failed_branch_cancels_the_others_and_fails_the_step(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = app.create_tenant("Acme").await;
    let automation = manual(
        "Order",
        &json!([
            { "id": "st_both", "type": "parallel", "branches": [
                [ { "id": "st_wait", "type": "wait_for_event", "config": { "key": "never" } },
                  log_step("st_never", "never runs") ],
                [ call("st_order", addr, "/missing") ]
            ] },
            log_step("st_after", "never runs either")
        ]),
    );
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let failed = app.wait_for_final(&tenant, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("branch_failed") && error.contains("st_order") && error.contains("404"),
        "{error}"
    );
    assert_eq!(step(&failed, "st_order")["status"], "failed");
    assert_eq!(step(&failed, "st_both")["status"], "failed");
    let ran: Vec<&str> = failed["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step_id"].as_str().unwrap())
        .collect();
    assert!(
        !ran.contains(&"st_never") && !ran.contains(&"st_after"),
        "{ran:?}"
    );
    assert_eq!(
        failed["waits"],
        json!([]),
        "the other branch's wait is cancelled"
    );
    let sent = app
        .post(
            &tenant.key,
            "/api/signals",
            &json!({ "key": "never", "payload": {} }),
        )
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(sent["resumed"], json!([]));
}
