//! Fan-out over items found at run time, as a user drives it: a
//! `for_each` over twelve order lines at `concurrency: 3` never has more
//! than three calls in flight at the supplier (by the supplier's own
//! count) and gives twelve results in item order; `complete: "any"` goes
//! on with the first answer and cancels the items still running; more
//! items than `maxItems` fail the step with `too_many_items`.

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
    twelve_items_run_three_at_once_and_answer_in_item_order,
    the_first_answer_completes_any_and_cancels_the_rest,
    the_cancelled_items_reservations_are_released,
    more_items_than_max_items_fail_the_step,
);

/// What the supplier saw: calls in flight now, the most ever in flight at
/// once, and the calls it answered.
#[derive(Default)]
struct Supplier {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    answered: AtomicUsize,
    paths: std::sync::Mutex<Vec<String>>,
}

/// Answers `/fast/…` at once, `/medium/…` after 1 s, `/slow/…` after 3 s
/// and every other call after 200 ms.
async fn answer(State(supplier): State<Arc<Supplier>>, uri: Uri) -> axum::Json<Value> {
    let now = supplier.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    supplier.peak.fetch_max(now, Ordering::SeqCst);
    let pause = match uri.path() {
        p if p.starts_with("/fast/") => 0,
        p if p.starts_with("/medium/") => 1000,
        p if p.starts_with("/slow/") => 3000,
        _ => 200,
    };
    tokio::time::sleep(Duration::from_millis(pause)).await;
    supplier.in_flight.fetch_sub(1, Ordering::SeqCst);
    supplier.answered.fetch_add(1, Ordering::SeqCst);
    supplier.paths.lock().unwrap().push(uri.path().to_owned());
    axum::Json(json!({ "from": uri.path() }))
}

async fn serve(app: &TestApp, supplier: Arc<Supplier>) -> SocketAddr {
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/{*path}", any(answer))
        .with_state(supplier);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Sets the order's `lines`, then asks the supplier about each.
fn order(addr: SocketAddr, lines: Value, config: Value) -> Value {
    let mut config = config;
    config["items"] = json!("{{st_lines.lines}}");
    json!([
        { "id": "st_lines", "type": "set", "config": { "values": { "lines": lines } } },
        { "id": "st_each", "type": "for_each", "config": config, "do": [
            { "id": "st_ask", "type": "http",
              "config": { "method": "GET", "url": format!("http://{addr}/{{{{item}}}}"), "timeoutMs": 10000 } },
            log_step("st_note", "line {{index}}: {{st_ask.body.from}}")
        ] },
        log_step("st_after", "{{st_each.completed}} of {{st_each.count}} answered")
    ])
}

fn step<'a>(run: &'a Value, id: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .and_then(|steps| steps.iter().rev().find(|s| s["step_id"] == id))
        .unwrap_or_else(|| panic!("no step {id} in {run:#}"))
}

async fn twelve_items_run_three_at_once_and_answer_in_item_order(app: &TestApp) {
    let supplier = Arc::new(Supplier::default());
    let addr = serve(app, supplier.clone()).await;
    let tenant = app.create_tenant("Acme").await;
    let lines: Vec<String> = (0..12).map(|n| format!("line/{n}")).collect();
    let steps = order(addr, json!(lines), json!({ "concurrency": 3 }));
    // Every step's output is kept whole, to read the results from it.
    let mut automation = manual("Ask the supplier", &steps);
    automation["settings"] = json!({ "keepStepData": true });
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let peak = supplier.peak.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&peak),
        "the supplier had {peak} calls in flight at once; the items run 3 at once"
    );
    assert_eq!(supplier.answered.load(Ordering::SeqCst), 12);

    let each = step(&done, "st_each");
    assert_eq!(each["status"], "completed", "{done:#}");
    let from: Vec<&str> = each["output"]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("results in {each:#}"))
        .iter()
        .map(|r| r["st_ask"]["body"]["from"].as_str().unwrap_or("?"))
        .collect();
    let expected: Vec<String> = (0..12).map(|n| format!("/line/{n}")).collect();
    assert_eq!(from, expected, "the results are in item order");
    assert_eq!(each["output"]["completed"], 12);
    assert_eq!(
        each["log"],
        json!(["running 12 items, 3 at once", "12 of 12 items done"])
    );
    let notes: Vec<&str> = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == "st_note")
        .map(|s| s["log"][0].as_str().unwrap())
        .collect();
    assert_eq!(notes.len(), 12, "each item ran its steps: {done:#}");
    assert!(
        notes.contains(&"info: line 7: /line/7"),
        "an item's steps read its own item and its own outputs: {notes:?}"
    );
    assert_eq!(step(&done, "st_after")["log"][0], "info: 12 of 12 answered");
    assert_eq!(
        step(&done, "st_ask")["path"]
            .as_str()
            .map(|p| p.starts_with("1.items.")),
        Some(true)
    );
    assert!(
        done["context"]
            .as_object()
            .is_none_or(|c| !c.keys().any(|k| k.starts_with("_item:"))),
        "the items' entries leave the run's context: {:#}",
        done["context"]
    );
}

async fn the_first_answer_completes_any_and_cancels_the_rest(app: &TestApp) {
    let supplier = Arc::new(Supplier::default());
    let addr = serve(app, supplier.clone()).await;
    let tenant = app.create_tenant("Acme").await;
    let lines = json!(["slow/a", "fast/b", "slow/c", "slow/d"]);
    let steps = order(addr, lines, json!({ "concurrency": 3, "complete": "any" }));
    let automation = app
        .create_automation(&tenant, &manual("First supplier to answer", &steps))
        .await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let each = step(&done, "st_each");
    let output = &each["output"];
    assert_eq!(output["completed"], 1, "{output:#}");
    assert_eq!(
        output["cancelled"], 2,
        "the two slow items in flight: {output:#}"
    );
    assert_eq!(output["first"], 1);
    let results = output["results"].as_array().expect("results");
    assert_eq!(results[1]["st_ask"]["body"]["from"], "/fast/b");
    assert_eq!(
        [&results[0], &results[2], &results[3]],
        [&Value::Null, &Value::Null, &Value::Null],
        "the cancelled items and the one never started have no result"
    );
    assert_eq!(step(&done, "st_after")["log"][0], "info: 1 of 4 answered");
    assert_eq!(
        supplier.answered.load(Ordering::SeqCst),
        1,
        "the run went on before the slow calls answered"
    );
    let asked = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == "st_ask")
        .count();
    assert_eq!(asked, 1, "no cancelled item recorded its call: {done:#}");
    assert_eq!(done["waits"], json!([]));
}

async fn more_items_than_max_items_fail_the_step(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let steps = order(addr, json!(["a", "b", "c"]), json!({ "maxItems": 2 }));
    let automation = app
        .create_automation(&tenant, &manual("Too many lines", &steps))
        .await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let failed = app.wait_for_final(&tenant, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("too_many_items: for_each `st_each` got 3 items, more than its limit of 2"),
        "{error}"
    );
    let refused = app
        .post(
            &tenant.key,
            "/api/automations",
            &manual(
                "Bad fan-out",
                &json!([{ "id": "fe", "type": "for_each",
                          "config": { "items": [1], "concurrency": 0, "complete": "most" },
                          "do": [ { "id": "x", "type": "end" } ] }]),
            ),
        )
        .await
        .expect(StatusCode::BAD_REQUEST);
    let text = refused.to_string();
    for expected in [
        "steps.0.config.concurrency",
        "steps.0.config.complete",
        "steps.0.do.0.type",
    ] {
        assert!(text.contains(expected), "{expected} in {refused:#}");
    }
}

async fn the_cancelled_items_reservations_are_released(app: &TestApp) {
    let supplier = Arc::new(Supplier::default());
    let addr = serve(app, supplier.clone()).await;
    let tenant = app.create_tenant("Acme").await;
    let url = |path: &str| format!("http://{addr}{path}");
    let get = |id: &str, path: &str| {
        json!({ "id": id, "type": "http",
                "config": { "method": "GET", "url": url(path), "timeoutMs": 10000 } })
    };
    let mut reserve = get("st_reserve", "/fast/reserve-{{index}}");
    reserve["compensate"] = json!([get("st_release", "/fast/release-{{index}}")]);
    let steps = json!([
        { "id": "st_each", "type": "for_each",
          "config": { "items": ["slow", "medium", "slow"], "complete": "any" },
          "do": [ reserve, get("st_confirm", "/{{item}}/confirm-{{index}}") ] },
        log_step("st_after", "item {{st_each.first}} confirmed")
    ]);
    let automation = app
        .create_automation(&tenant, &manual("Reserve at the first supplier", &steps))
        .await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(step(&done, "st_after")["log"][0], "info: item 1 confirmed");
    // The cancelled items whose reservation was recorded before the
    // cancel: each is released once (item 1 answered a second after them).
    let rows = done["steps"].as_array().unwrap();
    let reserved: Vec<String> = [0, 2]
        .into_iter()
        .filter(|n| {
            rows.iter().any(|s| {
                s["step_id"] == "st_reserve"
                    && s["status"] == "completed"
                    && s["path"] == format!("0.items.{n}.0").as_str()
            })
        })
        .map(|n| format!("/fast/release-{n}"))
        .collect();
    assert!(
        !reserved.is_empty(),
        "no cancelled item had reserved: {done:#}"
    );
    let mut released: Vec<String> = supplier
        .paths
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.starts_with("/fast/release-"))
        .cloned()
        .collect();
    released.sort();
    assert_eq!(
        released, reserved,
        "each cancelled reservation is released once"
    );
    assert!(
        !released.contains(&"/fast/release-1".to_owned()),
        "the winner's reservation stays"
    );
    let each = step(&done, "st_each");
    assert_eq!(each["output"]["cancelled"], 2, "{each:#}");
    let release_rows = rows.iter().filter(|s| s["step_id"] == "st_release").count();
    assert_eq!(release_rows, released.len(), "{done:#}");
}
