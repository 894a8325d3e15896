//! What the request that once took a node down costs a real `tok serve`
//! (SQLite, one process) now that rendering is bounded: automations that
//! render a 100 KB field a thousand times (`flow/log`), in a hundred
//! condition rules, and in a config of many lone placeholders, each sent
//! twenty such webhooks. Before the budgets, one such webhook raised the
//! process from 32 MB to 2.6 GB. A measurement, not a timed assertion: it
//! prints the process's peak resident memory idle and after, and asserts
//! only what a user sees (the runs failed with the budget's error, the
//! conditions completed, another tenant's run completed). Ignored in the
//! normal suite; run it against a release build with
//!
//! ```sh
//! cargo test --release -p tok --test render_memory -- --ignored --nocapture
//! ```

mod support;

use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, backends};

use support::{ADMIN_KEY, Api, Server, free_port};

/// Webhooks sent to each hostile automation.
const WEBHOOKS: usize = 20;

/// Peak resident memory of a process so far (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A tenant with a source and an automation of `steps` on it: its key and
/// the webhook token.
async fn hooked(api: &Api, name: &str, steps: Value) -> (String, String) {
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": name }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let source = api
        .post(
            "/api/sources",
            &key,
            json!({ "name": "shop", "params": [] }),
        )
        .await;
    let source_id = source["id"].as_str().unwrap();
    api.post(
        "/api/automations",
        &key,
        json!({ "name": name, "trigger": { "kind": "webhook", "source": source_id }, "steps": steps }),
    )
    .await;
    (key, source["token"].as_str().unwrap().to_owned())
}

/// Sends `body` to the webhook; the event's id.
async fn send(api: &Api, token: &str, body: &Value) -> String {
    let accepted = api
        .post(&format!("/webhook/{token}"), "", body.clone())
        .await;
    accepted["event_id"].as_str().unwrap().to_owned()
}

/// The event's run, finished.
async fn run_of(api: &Api, key: &str, event: &str) -> Value {
    for _ in 0..1200 {
        let detail = api.get(&format!("/api/events/{event}"), key).await;
        if let Some(run) = detail["runs"].as_array().and_then(|r| r.first()) {
            return api.final_run(key, run["id"].as_str().unwrap()).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("event {event} started no run within 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: renders against 100 KB bodies; run with --ignored --nocapture"]
async fn a_thousand_repetitions_of_a_big_field_leave_the_peak_rss_near_idle() {
    if !backends().contains(&Backend::Sqlite) {
        return;
    }
    let db = TestDb::create(Backend::Sqlite).await;
    let port = free_port();
    let api = Api::new(port);
    let server = Server::start(&db.url, port, &[], &[("TOK_CONCURRENCY", "8")]);
    api.wait_ready().await;

    let repeat = json!([{ "id": "st_log", "type": "flow/log",
                          "config": { "message": "{{_body.b}}".repeat(1000) } }]);
    let rules: Vec<Value> = (0..100)
        .map(|i| json!({ "field": "_body.b", "operator": "neq", "value": format!("{{{{_body.b}}}}{i}") }))
        .collect();
    let condition = json!([{ "id": "st_check", "type": "condition", "rules": rules,
                             "then": [{ "id": "st_yes", "type": "flow/log", "config": { "message": "yes" } }] }]);
    let lone: serde_json::Map<String, Value> = (0..100)
        .map(|i| (format!("v{i}"), json!("{{_body.b}}")))
        .collect();
    let many = json!([{ "id": "st_set", "type": "set", "config": { "values": lone } }]);
    let (repeat_key, repeat_token) = hooked(&api, "Repeat", repeat).await;
    let (condition_key, condition_token) = hooked(&api, "Condition", condition).await;
    let (many_key, many_token) = hooked(&api, "Many", many).await;
    let (other_key, other_token) = hooked(
        &api,
        "Other",
        json!([{ "id": "st_log", "type": "flow/log", "config": { "message": "order {{_body.n}}" } }]),
    )
    .await;

    // Idle, after one small run warmed every path.
    let warm = send(&api, &other_token, &json!({ "n": 0 })).await;
    run_of(&api, &other_key, &warm).await;
    let idle = peak_rss_kib(server.pid());

    let body = json!({ "b": "A".repeat(100_000) });
    let mut sent = Vec::new();
    for _ in 0..WEBHOOKS {
        sent.push(("repeat", send(&api, &repeat_token, &body).await));
        sent.push(("condition", send(&api, &condition_token, &body).await));
        sent.push(("many", send(&api, &many_token, &body).await));
    }
    let other = send(&api, &other_token, &json!({ "n": 1 })).await;
    for (kind, event) in &sent {
        let key = match *kind {
            "repeat" => &repeat_key,
            "condition" => &condition_key,
            _ => &many_key,
        };
        let run = run_of(&api, key, event).await;
        let error = run["error"].as_str().unwrap_or_default();
        match *kind {
            "condition" => assert_eq!(run["status"], "completed", "{:.1000}", run.to_string()),
            _ => assert!(
                run["status"] == "failed" && error.contains("render_budget_exceeded"),
                "{kind}: {:.1000}",
                run.to_string()
            ),
        }
    }
    let done = run_of(&api, &other_key, &other).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let after = peak_rss_kib(server.pid());
    println!(
        "render_memory: {} webhooks of 100 KB to a log of 1,000 repetitions, a condition of 100 \
         rules and a config of 100 lone placeholders: peak RSS idle {} MiB, after {} MiB, +{} MiB",
        3 * WEBHOOKS,
        idle / 1024,
        after / 1024,
        after.saturating_sub(idle) / 1024
    );
}
