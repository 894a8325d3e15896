//! Logs of a real process: plain text without colour codes when stdout is
//! not a terminal, one JSON object per line with `TOK_LOG_FORMAT=json`,
//! and each step's lines inside the spans of its run and its step. What a
//! webhook's body or a service's answer puts in a line cannot end it or
//! send the terminal an escape.

mod support;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::TestDb;

use support::{ADMIN_KEY, Api, Server, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_to_a_pipe_have_no_colour_codes() {
    let db = TestDb::create(Backend::Sqlite).await;
    let port = free_port();
    let server = Server::start(&db.url, port, &[], &[("RUST_LOG", "info")]);
    let (started, before) = server.line_where(|l| l.contains("tok started"));
    for line in before.iter().chain([&started]) {
        assert!(!line.contains('\u{1b}'), "a colour code in {line:?}");
    }
    assert!(started.contains("INFO"), "{started}");
    drop(server);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_run_and_step_spans() {
    let db = TestDb::create(Backend::Sqlite).await;
    let port = free_port();
    let api = Api::new(port);
    let server = Server::start(
        &db.url,
        port,
        &[],
        &[
            ("RUST_LOG", "info,tok_engine=debug"),
            ("TOK_LOG_FORMAT", "json"),
        ],
    );
    let (started, _) = server.line_where(|l| l.contains("tok started"));
    let started: Value = serde_json::from_str(&started).expect("a JSON line");
    assert_eq!(started["level"], "INFO", "{started}");
    assert_eq!(started["fields"]["message"], "tok started", "{started}");
    api.wait_ready().await;

    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let automation = api
        .post(
            "/api/automations",
            &key,
            json!({ "name": "Log", "trigger": { "kind": "manual" },
                    "steps": [{ "id": "st_pause", "type": "flow/pause", "config": { "seconds": 0.01 } }] }),
        )
        .await;
    let id = automation["id"].as_str().unwrap();
    let run = api
        .post(&format!("/api/automations/{id}/runs"), &key, json!({}))
        .await;
    let run_id = run["run_id"].as_str().unwrap();

    let (done, _) = server.line_where(|l| l.contains("step done"));
    let done: Value = serde_json::from_str(&done).expect("a JSON line");
    assert_eq!(done["span"]["name"], "step", "{done}");
    assert_eq!(done["span"]["step"], "st_pause", "{done}");
    assert_eq!(done["spans"][0]["name"], "run", "{done}");
    assert_eq!(done["spans"][0]["run"], run_id, "{done}");
    drop(server);
    db.cleanup().await;
}

/// What a hostile webhook sends: a line of its own, in the log's format,
/// and a terminal escape (red).
const FORGED: &str =
    "order 7\n2026-01-01T00:00:00.000000Z  INFO tok_engine: forged by a webhook\u{1b}[31m red";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_string_cannot_forge_a_text_log_line_or_send_an_escape() {
    let db = TestDb::create(Backend::Sqlite).await;
    // A service that refuses what it is sent and says what it was: its
    // error reaches the `step failed` line.
    let service = support::serve(Router::new().route(
        "/orders",
        post(|axum::Json(body): axum::Json<Value>| async move {
            let order = body["order"].as_str().unwrap_or_default().to_owned();
            (StatusCode::BAD_REQUEST, format!("no such order: {order}"))
        }),
    ))
    .await;
    let allow = support::allow(&service);
    let port = free_port();
    let api = Api::new(port);
    let server = Server::start(
        &db.url,
        port,
        &[],
        &[("RUST_LOG", "info"), ("TOK_OUTBOUND_ALLOW", allow.as_str())],
    );
    api.wait_ready().await;
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let source = api
        .post("/api/sources", &key, json!({ "name": "shop" }))
        .await;
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": "Forward",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "steps": [
                { "id": "st_log", "type": "flow/log", "config": { "message": "got {{_body.order}}" } },
                { "id": "st_call", "type": "http",
                  "config": { "method": "POST", "url": format!("{service}/orders"),
                              "body": { "order": "{{_body.order}}" } } }
            ]
        }),
    )
    .await;
    let sent = api
        .http
        .post(source["url"].as_str().unwrap())
        .json(&json!({ "order": FORGED }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status().as_u16(), 202);

    let (failed, before) = server.line_where(|l| l.contains("step failed"));
    let escaped =
        "order 7\\n2026-01-01T00:00:00.000000Z  INFO tok_engine: forged by a webhook\\x1b[31m red";
    assert!(
        failed.contains(escaped),
        "the service's answer is in the line, escaped: {failed}"
    );
    for line in before.iter().chain([&failed]) {
        assert!(
            !line.starts_with("2026-01-01T00:00:00.000000Z"),
            "a line forged by the webhook: {line:?}"
        );
        assert!(!line.contains('\u{1b}'), "an escape in {line:?}");
    }
    drop(server);
    db.cleanup().await;
}
