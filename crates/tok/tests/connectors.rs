//! The connector steps inside a real `tok serve`, on both backends: a
//! `script` step computes a total in the sandbox, an `http` step sends it
//! through a connection (its credentials and a stable idempotency key on
//! the request) to a local service, and the answer lands in the run's
//! context; a runaway script fails its run terminally while the server
//! goes on serving.

mod support;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, backends};

use support::{ADMIN_KEY, Api, Server, free_port};

type Seen = Arc<Mutex<Vec<(HeaderMap, Value)>>>;

async fn invoices(
    State(seen): State<Seen>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> axum::Json<Value> {
    seen.lock().unwrap().push((headers, body.0));
    axum::Json(json!({ "invoice": "INV-7" }))
}

async fn invoicing_service() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/invoices", post(invoices))
        .with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

async fn connectors(backend: Backend) {
    let db = TestDb::create(backend).await;
    let port = free_port();
    let api = Api::new(port);
    let (base, seen) = invoicing_service().await;
    // The connection's credentials are sealed under a key of the test's.
    let (_, secret_key) = tok_store::Keyring::generate();
    let _server = Server::start(
        &db.url,
        port,
        &[],
        &[
            ("TOK_OUTBOUND_ALLOW", &support::allow(&base)),
            ("TOK_SECRET_KEY", &secret_key),
        ],
    );
    api.wait_ready().await;

    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    api.post(
        "/api/connections",
        &key,
        json!({ "name": "invoicing", "service": "http", "base_url": base,
                "credentials": { "bearer": "sk_test_123" }, "rate": 50, "burst": 10 }),
    )
    .await;
    let automation = api
        .post(
            "/api/automations",
            &key,
            json!({
                "name": "Invoice order",
                "trigger": { "kind": "manual" },
                "steps": [
                    { "id": "st_total", "type": "script",
                      "config": { "source": "function main(input) { return { total: input.lines.reduce((s, l) => s + l.price * l.qty, 0) }; }",
                                  "input": { "lines": "{{lines}}" } } },
                    { "id": "st_invoice", "type": "http",
                      "config": { "connection": "invoicing", "method": "POST", "url": "/invoices",
                                  "body": { "order": "{{orderId}}", "total": "{{st_total.total}}" } } },
                    { "id": "st_done", "type": "set", "config": { "values": { "invoice": "{{st_invoice.body.invoice}}" } } }
                ]
            }),
        )
        .await;
    let id = automation["id"].as_str().unwrap();
    let started = api
        .post(
            &format!("/api/automations/{id}/runs"),
            &key,
            json!({ "input": { "orderId": "5001", "lines": [{ "price": 2, "qty": 2 }, { "price": 1, "qty": 2 }] } }),
        )
        .await;
    let run = started["run_id"].as_str().unwrap().to_owned();
    let detail = api.final_run(&key, &run).await;
    assert_eq!(detail["status"], "completed", "{backend:?}: {detail}");
    assert_eq!(
        detail["context"]["st_done"]["invoice"], "INV-7",
        "{backend:?}"
    );

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{backend:?}");
    let (headers, body) = &seen[0];
    assert_eq!(body, &json!({ "order": "5001", "total": 6 }), "{backend:?}");
    assert_eq!(
        headers["authorization"], "Bearer sk_test_123",
        "{backend:?}"
    );
    assert_eq!(
        headers["idempotency-key"],
        format!("{run}:1").as_str(),
        "{backend:?}"
    );

    // A runaway script ends its own run; the server keeps serving.
    let runaway = api
        .post(
            "/api/automations",
            &key,
            json!({ "name": "Runaway", "trigger": { "kind": "manual" },
                    "steps": [{ "id": "st_spin", "type": "script",
                                "config": { "source": "function main(input) { while (true) {} }" } }] }),
        )
        .await;
    let id = runaway["id"].as_str().unwrap();
    let started = api
        .post(
            &format!("/api/automations/{id}/runs"),
            &key,
            json!({ "input": {} }),
        )
        .await;
    let detail = api
        .final_run(&key, started["run_id"].as_str().unwrap())
        .await;
    assert_eq!(detail["status"], "failed", "{backend:?}");
    let error = detail["error"].as_str().unwrap();
    assert!(
        error.contains("st_spin") && error.contains("100 ms"),
        "{backend:?}: {error}"
    );
    assert_eq!(
        detail["steps"].as_array().unwrap().len(),
        1,
        "{backend:?}: a script failure is not retried"
    );

    // The counters a platform team watches are on /metrics.
    let metrics = api
        .http
        .get(format!("{}/metrics", api.base))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "tok_steps_total",
        "tok_runs_finished_total",
        "tok_connector_calls_total",
        "tok_queue_ready_jobs",
        "tok_runs_held{kind=\"timer\"}",
    ] {
        assert!(
            metrics.contains(name),
            "{backend:?}: /metrics lacks {name}:\n{metrics}"
        );
    }

    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_and_http_steps_run_inside_a_real_server() {
    for backend in backends() {
        connectors(backend).await;
    }
}
