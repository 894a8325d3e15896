//! What six concurrent 50 MB answers cost a real `tok serve` (SQLite, one
//! process): each `http` step reads its answer against the byte budget and
//! fails with its error, so the process's peak resident memory stays near
//! what it was idle. A measurement, not a timed assertion: it prints the
//! figure and asserts only what a user sees (six failed runs, each with
//! the budget's error). Ignored in the normal suite (it moves 300 MB over
//! loopback); run it with
//!
//! ```sh
//! cargo test -p tok --test outbound_memory -- --ignored --nocapture
//! ```

mod support;

use serde_json::json;
use tok_store::Backend;
use tok_store::testing::{TestDb, backends};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::{ADMIN_KEY, Api, Server, free_port};

/// Steps answered at once.
const CALLS: usize = 6;

/// Bytes of each answer.
const ANSWER_BYTES: usize = 50 * 1024 * 1024;

/// A service that answers every request with [`ANSWER_BYTES`] of JSON-ish
/// text, written 64 KiB at a time as it is read, with no length announced
/// (so only the reader's budget stops it). Raw HTTP/1.1 over TCP: the
/// answer is the test's, not a framework's.
async fn huge_service() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = [0u8; 8192];
                let _ = socket.read(&mut request).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 64 * 1024];
                for _ in 0..ANSWER_BYTES / chunk.len() {
                    // tok hangs up once past its budget: that ends the answer.
                    if socket.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    base
}

/// Peak resident memory of a process so far (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: moves 300 MB over loopback; run with --ignored --nocapture"]
async fn six_concurrent_50_mb_answers_leave_the_peak_rss_near_idle() {
    if !backends().contains(&Backend::Sqlite) {
        return;
    }
    let db = TestDb::create(Backend::Sqlite).await;
    let port = free_port();
    let api = Api::new(port);
    let base = huge_service().await;
    let server = Server::start(
        &db.url,
        port,
        &[],
        &[
            ("TOK_OUTBOUND_ALLOW", &support::allow(&base)),
            ("TOK_CONCURRENCY", "8"),
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
        json!({ "name": "huge", "service": "http", "base_url": base, "rate": 1000, "burst": 100 }),
    )
    .await;
    let automation = api
        .post(
            "/api/automations",
            &key,
            json!({
                "name": "Huge answer",
                "trigger": { "kind": "manual" },
                "steps": [{ "id": "st_get", "type": "http",
                            "config": { "connection": "huge", "method": "GET", "url": "/export" } }]
            }),
        )
        .await;
    let id = automation["id"].as_str().unwrap().to_owned();

    // Idle, after one small run of the same kind warmed every path.
    let warm = api
        .post(
            "/api/automations",
            &key,
            json!({ "name": "Warm", "trigger": { "kind": "manual" },
                    "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "warm" } }] }),
        )
        .await;
    let warm = api
        .post(
            &format!("/api/automations/{}/runs", warm["id"].as_str().unwrap()),
            &key,
            json!({}),
        )
        .await;
    api.final_run(&key, warm["run_id"].as_str().unwrap()).await;
    let idle = peak_rss_kib(server.pid());

    let mut runs = Vec::new();
    for _ in 0..CALLS {
        let started = api
            .post(&format!("/api/automations/{id}/runs"), &key, json!({}))
            .await;
        runs.push(started["run_id"].as_str().unwrap().to_owned());
    }
    for run in &runs {
        let detail = api.final_run(&key, run).await;
        assert_eq!(detail["status"], "failed", "{detail:#}");
        let error = detail["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("output_too_large") && error.contains("byte budget"),
            "the step fails with the byte budget's error: {detail:#}"
        );
    }
    let after = peak_rss_kib(server.pid());
    println!(
        "outbound_memory: {CALLS} concurrent answers of {} MB: peak RSS idle {} MiB, after {} MiB, \
         +{} KiB",
        ANSWER_BYTES / (1024 * 1024),
        idle / 1024,
        after / 1024,
        after.saturating_sub(idle)
    );
}
