//! Compensation, as a user drives it: a run whose completed `http` steps
//! say how to undo them (`compensate`) is cancelled while it waits for a
//! signal; it is `compensating` (listed so, and a second cancel is
//! refused) while the undo calls reach the service, the last completed
//! step first; then it is `cancelled`, its wait gone, and its detail shows
//! the undo steps at `…compensate.0`. A run that fails with
//! `settings.compensateOnFailure` undoes its completed steps and ends
//! `failed` with the error it failed with; an undo that fails after its
//! retries raises an incident naming it and the run still ends. A cancel
//! still takes the children a run waits for along, and each undoes its own
//! completed steps.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::routing::any;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::helpers::{Tenant, TestApp, backend_tests, manual};

backend_tests!(crate::helpers::run_with_service;
    a_cancelled_waiting_run_undoes_its_three_completed_steps_last_first,
    a_failed_run_with_compensate_on_failure_undoes_its_steps_and_keeps_its_error,
    an_undo_that_fails_raises_an_incident_and_the_run_still_ends_cancelled,
    a_parent_cancelled_while_its_child_waits_undoes_both,
);

/// The service the steps call: the calls it received, in order. A call to
/// `held` waits until the test lets it through (`gate`); `/missing…` calls
/// answer 404.
struct Service {
    calls: Mutex<Vec<String>>,
    held: Option<&'static str>,
    gate: Semaphore,
}

async fn answer(State(service): State<Arc<Service>>, uri: Uri) -> (StatusCode, axum::Json<Value>) {
    let path = uri.path().to_owned();
    service.calls.lock().unwrap().push(path.clone());
    if service.held == Some(path.as_str()) {
        let _permit = service.gate.acquire().await.unwrap();
    }
    if path.starts_with("/missing") {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({ "error": "no such booking" })),
        );
    }
    (StatusCode::OK, axum::Json(json!({ "done": path })))
}

async fn serve(app: &TestApp, held: Option<&'static str>) -> (Arc<Service>, SocketAddr) {
    let service = Arc::new(Service {
        calls: Mutex::new(Vec::new()),
        held,
        gate: Semaphore::new(0),
    });
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/{*path}", any(answer))
        .with_state(service.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (service, addr)
}

fn call(id: &str, addr: SocketAddr, path: &str) -> Value {
    json!({ "id": id, "type": "http",
            "config": { "method": "POST", "url": format!("http://{addr}{path}"), "timeoutMs": 5000 } })
}

/// A step calling `/<id>`, undone by a call to `undo` (`/<id>/undo`
/// unless given).
fn undoable(id: &str, addr: SocketAddr, undo: Option<&str>) -> Value {
    let mut step = call(id, addr, &format!("/{id}"));
    let undo_path = undo.map_or_else(|| format!("/{id}/undo"), str::to_owned);
    step["compensate"] = json!([call(&format!("undo_{id}"), addr, &undo_path)]);
    step
}

fn calls(service: &Service) -> Vec<String> {
    service.calls.lock().unwrap().clone()
}

fn steps_at(run: &Value) -> Vec<(String, String, String)> {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
            (text("path"), text("step_id"), text("status"))
        })
        .collect()
}

async fn cancel(app: &TestApp, tenant: &Tenant, run: &str) -> Value {
    app.post(&tenant.key, &format!("/api/runs/{run}/cancel"), &json!({}))
        .await
        .expect(StatusCode::OK)
}

async fn a_cancelled_waiting_run_undoes_its_three_completed_steps_last_first(app: &TestApp) {
    let (service, addr) = serve(app, Some("/car/undo")).await;
    let tenant = app.create_tenant("Acme").await;
    let automation = manual(
        "Trip",
        &json!([
            undoable("flight", addr, None),
            undoable("hotel", addr, None),
            undoable("car", addr, None),
            { "id": "confirm", "type": "wait_for_event", "config": { "key": "trip-{{tripId}}" } }
        ]),
    );
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(
            &tenant,
            &automation,
            &json!({ "input": { "tripId": "T1" } }),
        )
        .await;
    app.wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    assert_eq!(calls(&service), ["/flight", "/hotel", "/car"]);

    let cancelled = cancel(app, &tenant, &run).await;
    assert_eq!(cancelled["status"], "compensating", "{cancelled:#}");

    // The first undo is held at the service: the run is compensating.
    app.poll("the first undo call", async || {
        (calls(&service).len() == 4).then_some(()).ok_or(())
    })
    .await;
    let listed = app
        .get(&tenant.key, "/api/runs?status=compensating")
        .await
        .expect(StatusCode::OK);
    let listed: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [run.as_str()], "listed as compensating");
    let again = app
        .post(&tenant.key, &format!("/api/runs/{run}/cancel"), &json!({}))
        .await
        .expect(StatusCode::CONFLICT);
    assert!(
        again.to_string().contains("compensating"),
        "a second cancel does not interrupt the compensation: {again:#}"
    );
    service.gate.add_permits(1);

    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "cancelled", "{done:#}");
    assert_eq!(
        calls(&service),
        [
            "/flight",
            "/hotel",
            "/car",
            "/car/undo",
            "/hotel/undo",
            "/flight/undo"
        ],
        "the undo calls came last completed first"
    );
    assert_eq!(done["waits"], json!([]), "the wait is gone: {done:#}");
    let undone: Vec<_> = steps_at(&done)
        .into_iter()
        .filter(|(path, _, _)| path.contains(".compensate."))
        .collect();
    let row = |path: &str, id: &str| (path.to_owned(), id.to_owned(), "completed".to_owned());
    assert_eq!(
        undone,
        [
            row("2.compensate.0", "undo_car"),
            row("1.compensate.0", "undo_hotel"),
            row("0.compensate.0", "undo_flight"),
        ],
        "the detail shows the undo steps at their paths: {done:#}"
    );
    assert!(
        done["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["step_id"] == "confirm" && s["status"] == "waiting"),
        "the wait's step was never completed: {done:#}"
    );
}

async fn a_failed_run_with_compensate_on_failure_undoes_its_steps_and_keeps_its_error(
    app: &TestApp,
) {
    let (service, addr) = serve(app, None).await;
    let tenant = app.create_tenant("Acme").await;
    let mut automation = manual(
        "Order",
        &json!([
            undoable("reserve", addr, None),
            call("plain", addr, "/plain"),
            undoable("charge", addr, None),
            call("ship", addr, "/missing-carrier")
        ]),
    );
    automation["settings"] = json!({ "compensateOnFailure": true });
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    let error = done["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("step `ship` failed") && error.contains("404"),
        "the run keeps the error it failed with: {done:#}"
    );
    assert_eq!(
        calls(&service),
        [
            "/reserve",
            "/plain",
            "/charge",
            "/missing-carrier",
            "/charge/undo",
            "/reserve/undo"
        ]
    );
    let undone: Vec<_> = steps_at(&done)
        .into_iter()
        .filter(|(path, _, _)| path.contains(".compensate."))
        .map(|(path, _, status)| format!("{path} {status}"))
        .collect();
    assert_eq!(
        undone,
        ["2.compensate.0 completed", "0.compensate.0 completed"]
    );

    // Without the setting a failed run undoes nothing (the same service,
    // its calls forgotten: the app may call one local service only).
    service.calls.lock().unwrap().clear();
    let plain = manual(
        "Order as before",
        &json!([
            undoable("reserve", addr, None),
            call("ship", addr, "/missing")
        ]),
    );
    let plain = app.create_automation(&tenant, &plain).await;
    let run = app
        .start_run(&tenant, &plain, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    assert_eq!(calls(&service), ["/reserve", "/missing"]);
}

async fn an_undo_that_fails_raises_an_incident_and_the_run_still_ends_cancelled(app: &TestApp) {
    let (service, addr) = serve(app, None).await;
    let tenant = app.create_tenant("Acme").await;
    let automation = manual(
        "Trip",
        &json!([
            undoable("flight", addr, None),
            undoable("hotel", addr, Some("/missing-hotel")),
            { "id": "confirm", "type": "wait_for_event", "config": { "key": "trip" } }
        ]),
    );
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    app.wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    cancel(app, &tenant, &run).await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "cancelled", "{done:#}");
    assert_eq!(
        calls(&service),
        ["/flight", "/hotel", "/missing-hotel", "/flight/undo"],
        "the flight is still undone after the hotel's undo failed"
    );
    let error = done["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("compensation `undo_hotel` of step `hotel` failed"),
        "the run says what was not undone: {done:#}"
    );
    let incidents = app
        .get(&tenant.key, "/api/incidents")
        .await
        .expect(StatusCode::OK);
    let items = incidents["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{incidents:#}");
    assert_eq!(
        items[0]["title"], "The automation \u{201c}Trip\u{201d} could not undo all it did",
        "{incidents:#}"
    );
    let impact = items[0]["impact"].as_str().unwrap_or_default();
    assert!(
        impact.contains("one undo did not succeed") && !impact.contains("hotel"),
        "the tenant reads what happened, and no step names: {incidents:#}"
    );
    assert!(
        items[0].get("detail").is_none(),
        "the detail that names the steps is the admin's: {incidents:#}"
    );
}

async fn a_parent_cancelled_while_its_child_waits_undoes_both(app: &TestApp) {
    let (service, addr) = serve(app, None).await;
    let tenant = app.create_tenant("Acme").await;
    let child = manual(
        "Stock",
        &json!([
            undoable("reserve", addr, None),
            { "id": "picked", "type": "wait_for_event", "config": { "key": "picked" } }
        ]),
    );
    app.create_automation(&tenant, &child).await;
    let parent = manual(
        "Order",
        &json!([
            undoable("charge", addr, None),
            { "id": "stock", "type": "run_workflow",
              "config": { "automation": "Stock", "input": {}, "wait": true } }
        ]),
    );
    let parent = app.create_automation(&tenant, &parent).await;
    let run = app
        .start_run(&tenant, &parent, &json!({ "input": {} }))
        .await;
    let parked = app
        .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    let child = parked["waits"][0]["key"]
        .as_str()
        .and_then(|k| k.strip_prefix("run:"))
        .expect("the parent waits for its child")
        .to_owned();
    app.wait_for_run(&tenant, &child, |r| r["status"] == "waiting")
        .await;

    let cancelled = cancel(app, &tenant, &run).await;
    assert_eq!(cancelled["status"], "compensating", "{cancelled:#}");
    let parent_done = app.wait_for_final(&tenant, &run).await;
    let child_done = app.wait_for_final(&tenant, &child).await;
    assert_eq!(parent_done["status"], "cancelled", "{parent_done:#}");
    assert_eq!(child_done["status"], "cancelled", "{child_done:#}");
    assert!(
        child_done["error"]
            .as_str()
            .is_some_and(|e| e.contains(&run)),
        "the child says why it was cancelled: {child_done:#}"
    );
    let mut undone: Vec<String> = calls(&service)
        .into_iter()
        .filter(|c| c.ends_with("/undo"))
        .collect();
    undone.sort();
    assert_eq!(undone, ["/charge/undo", "/reserve/undo"]);
    let paths = |run: &Value| -> Vec<String> {
        steps_at(run)
            .into_iter()
            .filter(|(path, _, _)| path.contains(".compensate."))
            .map(|(path, _, _)| path)
            .collect()
    };
    assert_eq!(paths(&parent_done), ["0.compensate.0"]);
    assert_eq!(paths(&child_done), ["0.compensate.0"]);
}
