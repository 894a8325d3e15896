//! Logs of a real process: plain text without colour codes when stdout is
//! not a terminal, one JSON object per line with `TOK_LOG_FORMAT=json`,
//! and each step's lines inside the spans of its run and its step.

mod support;

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
