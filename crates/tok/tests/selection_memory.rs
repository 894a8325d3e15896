//! What selecting runs by their contexts costs a real `tok serve`
//! (SQLite, one process): 200 runs of about 1 MB of context each, then
//! four bulk dry runs with a `where` at once, beside a search, while
//! `/healthz` is asked every 50 ms. The contexts are read a few megabytes
//! at a time and each call reads at most 64 MiB of them (its answer then
//! says how to go on), so the process's peak resident memory stays tens of
//! megabytes above idle and `/healthz` keeps answering; the release before
//! the bound took 2.37 GB and a 7.5 s `/healthz`. A measurement, not a timed
//! assertion: it prints the figures, and asserts only what a user sees
//! (the counts, across the calls' cursors, are right). Ignored in the
//! normal suite (it writes 200 MB); run it with
//!
//! ```sh
//! cargo test -p tok --test selection_memory -- --ignored --nocapture
//! ```

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, backends};

use support::{ADMIN_KEY, Api, Server, free_port};

/// Runs made, and the bytes of each one's input.
const RUNS: usize = 200;
const INPUT_BYTES: usize = 1_000_000;

/// Dry runs sent at once.
const DRY_RUNS: usize = 4;

/// Peak resident memory of a process so far (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A bulk dry run counted to its end, call after call: the count, and the
/// calls it took.
async fn count_all(api: &Api, key: &str, filter: &Value) -> (i64, usize) {
    let mut cursor = Value::Null;
    let mut calls = 0;
    loop {
        let mut body = json!({ "filter": filter, "action": "retry", "dry_run": true });
        if !cursor.is_null() {
            body["cursor"] = cursor.clone();
        }
        let answer = api.post("/api/runs/bulk", key, body).await;
        calls += 1;
        if answer["complete"] == true {
            return (answer["count"].as_i64().unwrap(), calls);
        }
        cursor = answer["next_cursor"].clone();
        assert!(cursor.is_string(), "{answer:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: writes 200 MB of contexts; run with --ignored --nocapture"]
async fn dry_runs_over_big_contexts_keep_memory_and_healthz_in_bounds() {
    if !backends().contains(&Backend::Sqlite) {
        return;
    }
    let db = TestDb::create(Backend::Sqlite).await;
    let port = free_port();
    let api = Arc::new(Api::new(port));
    let server = Server::start(&db.url, port, &[], &[("TOK_CONCURRENCY", "8")]);
    api.wait_ready().await;
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let automation = api
        .post(
            "/api/automations",
            &key,
            json!({ "name": "Big", "trigger": { "kind": "manual" },
                    "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "done" } }] }),
        )
        .await;
    let id = automation["id"].as_str().unwrap().to_owned();
    let blob = "x".repeat(INPUT_BYTES);
    let mut last = String::new();
    for i in 0..RUNS {
        let started = api
            .post(
                &format!("/api/automations/{id}/runs"),
                &key,
                json!({ "input": { "n": i, "even": i % 2 == 0, "blob": blob } }),
            )
            .await;
        last = started["run_id"].as_str().unwrap().to_owned();
    }
    api.final_run(&key, &last).await;
    let idle = peak_rss_kib(server.pid());

    // `/healthz` every 50 ms while the dry runs go.
    let stop = Arc::new(AtomicBool::new(false));
    let slowest = Arc::new(AtomicU64::new(0));
    let probe = {
        let (stop, slowest, api) = (stop.clone(), slowest.clone(), api.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let at = Instant::now();
                let answer = api.http.get(format!("{}/healthz", api.base)).send().await;
                assert!(answer.is_ok_and(|a| a.status().is_success()));
                slowest.fetch_max(at.elapsed().as_millis() as u64, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let filter = json!({ "status": "completed", "where": { "match": "all", "rules": [
        { "field": "_body.even", "operator": "eq", "value": true }
    ] } });
    let started = Instant::now();
    let mut calls = Vec::new();
    for _ in 0..DRY_RUNS {
        let (api, key, filter) = (api.clone(), key.clone(), filter.clone());
        calls.push(tokio::spawn(
            async move { count_all(&api, &key, &filter).await },
        ));
    }
    let search = api
        .post(
            "/api/runs/search",
            &key,
            json!({ "where": filter["where"], "limit": 100 }),
        )
        .await;
    let mut per_call = 0;
    for call in calls {
        let (count, n) = call.await.unwrap();
        assert_eq!(count, (RUNS / 2) as i64, "every even run, once");
        per_call = n;
    }
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    probe.await.unwrap();
    assert!(search["items"].as_array().is_some(), "{search:#}");
    let after = peak_rss_kib(server.pid());
    println!(
        "selection_memory: {RUNS} runs of {} kB, {DRY_RUNS} dry runs at once ({per_call} calls each) \
         and a search in {:.1} s: peak RSS idle {} MiB, after {} MiB (+{} MiB); slowest /healthz {} ms",
        INPUT_BYTES / 1000,
        took.as_secs_f64(),
        idle / 1024,
        after / 1024,
        after.saturating_sub(idle) / 1024,
        slowest.load(Ordering::SeqCst)
    );
}
