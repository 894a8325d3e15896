//! The product's central promise, tested on a real process: a `tok serve`
//! killed with SIGKILL in the middle of a load of webhooks, then restarted,
//! ends with exactly one completed run for every event it answered 202.
//!
//! The sender behaves like a real one: each event carries an
//! `Idempotency-Key`, and a request that got no answer (the server was
//! dead) is sent again until it does. Events answered before the kill must
//! not be lost; events sent again must not run twice. Every run recorded
//! each of its steps once (one row per step and attempt, all seven steps).
//! That a commit answered is on disk (`synchronous=FULL`) is asserted by
//! the SQLite store's own test.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, backends};
use tokio::sync::Mutex;

use support::{ADMIN_KEY, Api, Server, free_port};

const EVENTS: usize = 400;
const SENDERS: usize = 16;

/// Every run of the tenant, all pages.
async fn all_runs(api: &Api, key: &str) -> Vec<Value> {
    api.all("/api/dashboard/runs", key, None).await
}

/// Sends the request `build` makes until the server answers 202 (a
/// sender retrying through the kill and the restart); returns the answer.
/// `what` names the request in a failure.
async fn post_until_accepted(build: impl Fn() -> reqwest::RequestBuilder, what: &str) -> Value {
    loop {
        let sent = build().timeout(Duration::from_secs(5)).send().await;
        if let Ok(response) = sent {
            if response.status() == reqwest::StatusCode::ACCEPTED {
                return response.json().await.unwrap();
            }
            assert!(
                response.status().is_server_error(),
                "{what}: unexpected answer {}",
                response.status()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends event `n` until the server answers 202; returns its event id.
async fn send_until_accepted(http: &reqwest::Client, url: &str, n: usize) -> String {
    let build = || {
        http.post(url)
            .header("Idempotency-Key", format!("order-{n}"))
            .json(&json!({ "kind": "order.created", "data": { "order": { "id": n.to_string() } } }))
    };
    let body = post_until_accepted(build, &format!("event {n}")).await;
    body["event_id"].as_str().unwrap().to_owned()
}

async fn crash_and_recover(backend: Backend) {
    let db = TestDb::create(backend).await;
    let port = free_port();
    let api = Api::new(port);
    let crash_env = [("TOK_NODE_ID", "crash-test-node"), ("TOK_CONCURRENCY", "8")];
    let mut server = Server::start(&db.url, port, &[], &crash_env);
    api.wait_ready().await;

    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Crash" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let source = api
        .post(
            "/api/sources",
            &key,
            json!({ "name": "eshop", "params": [
                { "name": "orderId", "path": "data.order.id", "type": "string", "required": true }
            ]}),
        )
        .await;
    let webhook = source["url"].as_str().unwrap().to_owned();
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": "New order",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "steps": [
                { "id": "st_mark", "type": "set", "config": { "values": { "order": "{{orderId}}" } } },
                { "id": "st_pause", "type": "flow/pause", "config": { "seconds": 0.02 } },
                { "id": "st_each", "type": "loop", "config": { "items": ["a", "b", "c"] },
                  "do": [{ "id": "st_line", "type": "flow/log", "config": { "message": "{{order}} {{item}}" } }] },
                { "id": "st_done", "type": "flow/log", "config": { "message": "order {{order}} done" } }
            ]
        }),
    )
    .await;

    let next = Arc::new(AtomicUsize::new(0));
    let accepted: Arc<Mutex<HashMap<usize, String>>> = Arc::default();
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let (next, accepted, url, http) = (
            next.clone(),
            accepted.clone(),
            webhook.clone(),
            api.http.clone(),
        );
        senders.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= EVENTS {
                    return;
                }
                let id = send_until_accepted(&http, &url, n).await;
                accepted.lock().await.insert(n, id);
            }
        }));
    }

    // Kill in the middle of the load: some events answered, most not yet.
    while accepted.lock().await.len() < EVENTS / 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill();
    let answered_before_kill: HashMap<usize, String> = accepted.lock().await.clone();
    assert!(
        answered_before_kill.len() < EVENTS,
        "the kill came after the load ended"
    );

    let mut server = Server::start(&db.url, port, &[], &crash_env);
    api.wait_ready().await;
    for sender in senders {
        sender.await.unwrap();
    }
    let accepted = accepted.lock().await.clone();
    assert_eq!(accepted.len(), EVENTS);
    for (n, id) in &answered_before_kill {
        assert_eq!(
            &accepted[n], id,
            "event {n} was answered 202 before the kill with another id"
        );
    }

    // Every accepted event ends as exactly one completed run.
    let mut runs = Vec::new();
    for _ in 0..1200 {
        runs = all_runs(&api, &key).await;
        let done = runs.iter().filter(|r| r["status"] == "completed").count();
        if runs.len() >= EVENTS && done == runs.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expected: HashSet<&str> = accepted.values().map(String::as_str).collect();
    assert_eq!(
        expected.len(),
        EVENTS,
        "{backend:?}: one event id per order"
    );
    let mut per_event: HashMap<&str, usize> = HashMap::new();
    for run in &runs {
        assert_eq!(run["status"], "completed", "{backend:?}: run {run}");
        *per_event
            .entry(run["event_id"].as_str().unwrap())
            .or_default() += 1;
    }
    let missing: Vec<&&str> = expected
        .iter()
        .filter(|e| !per_event.contains_key(**e))
        .collect();
    assert!(
        missing.is_empty(),
        "{backend:?}: accepted events without a run: {missing:?}"
    );
    let doubled: Vec<_> = per_event.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "{backend:?}: events with more than one run: {doubled:?}"
    );
    assert_eq!(runs.len(), EVENTS, "{backend:?}");

    // Every run recorded each of its steps once: 1 set + 1 pause + 1 loop +
    // 3 lines + 1 log, one completed row per (path, attempt), whatever
    // attempt the kill left it at.
    for run in &runs {
        let id = run["id"].as_str().unwrap();
        let detail = api.get(&format!("/api/runs/{id}"), &key).await;
        assert_eq!(detail["actions"], 7, "{backend:?}: {detail}");
        let steps = detail["steps"].as_array().expect("steps");
        let mut rows: HashMap<(String, i64), usize> = HashMap::new();
        for step in steps {
            assert_eq!(step["status"], "completed", "{backend:?}: run {id}: {step}");
            let key = (step["path"].to_string(), step["attempt"].as_i64().unwrap());
            *rows.entry(key).or_default() += 1;
        }
        assert_eq!(steps.len(), 7, "{backend:?}: run {id} recorded {steps:#?}");
        assert!(
            rows.values().all(|n| *n == 1),
            "{backend:?}: run {id} recorded a (path, attempt) twice: {rows:?}"
        );
    }

    server.kill();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_load_loses_no_accepted_event_and_runs_none_twice() {
    for backend in backends() {
        crash_and_recover(backend).await;
    }
}

const WAITING_RUNS: usize = 200;

/// Sends the signal that pays order `n` until the server answers 202.
async fn signal_until_accepted(http: &reqwest::Client, url: &str, key: &str, n: usize) {
    let build = || {
        http.post(url)
            .bearer_auth(key)
            .header("Idempotency-Key", format!("pay-{n}"))
            .json(&json!({ "key": format!("order-{n}"), "payload": { "amount": n } }))
    };
    post_until_accepted(build, &format!("signal {n}")).await;
}

async fn crash_while_signalling(backend: Backend) {
    let db = TestDb::create(backend).await;
    let port = free_port();
    let api = Api::new(port);
    let env = [
        ("TOK_NODE_ID", "signal-crash-node"),
        ("TOK_CONCURRENCY", "8"),
    ];
    let mut server = Server::start(&db.url, port, &[], &env);
    api.wait_ready().await;
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Signals" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let automation = api
        .post(
            "/api/automations",
            &key,
            json!({
                "name": "Payment",
                "trigger": { "kind": "manual" },
                "steps": [
                    { "id": "st_paid", "type": "wait_for_event", "config": { "key": "order-{{n}}" } },
                    { "id": "st_log", "type": "flow/log", "config": { "message": "paid {{st_paid.payload.amount}}" } }
                ]
            }),
        )
        .await;
    let automation = automation["id"].as_str().unwrap().to_owned();
    let mut runs = HashMap::new();
    for n in 0..WAITING_RUNS {
        let started = api
            .post(
                &format!("/api/automations/{automation}/runs"),
                &key,
                json!({ "input": { "n": n } }),
            )
            .await;
        runs.insert(started["run_id"].as_str().unwrap().to_owned(), n);
    }
    for _ in 0..600 {
        let listed = all_runs(&api, &key).await;
        if listed.iter().filter(|r| r["status"] == "waiting").count() == WAITING_RUNS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let url = format!("http://127.0.0.1:{port}/api/signals");
    let next = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let (next, answered, url, key, http) = (
            next.clone(),
            answered.clone(),
            url.clone(),
            key.clone(),
            api.http.clone(),
        );
        senders.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= WAITING_RUNS {
                    return;
                }
                signal_until_accepted(&http, &url, &key, n).await;
                answered.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    while answered.load(Ordering::SeqCst) < WAITING_RUNS / 4 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.kill();
    assert!(
        answered.load(Ordering::SeqCst) < WAITING_RUNS,
        "the kill came after the signals ended"
    );
    let mut server = Server::start(&db.url, port, &[], &env);
    api.wait_ready().await;
    for sender in senders {
        sender.await.unwrap();
    }

    let mut listed = Vec::new();
    for _ in 0..1200 {
        listed = all_runs(&api, &key).await;
        if listed.iter().all(|r| r["status"] == "completed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(listed.len(), WAITING_RUNS, "{backend:?}");
    for run in &listed {
        let id = run["id"].as_str().unwrap();
        assert_eq!(run["status"], "completed", "{backend:?}: run {run}");
        let detail = api.get(&format!("/api/runs/{id}"), &key).await;
        let steps = detail["steps"].as_array().unwrap();
        let count = |step: &str, status: &str| {
            steps
                .iter()
                .filter(|s| s["step_id"] == step && s["status"] == status)
                .count()
        };
        assert_eq!(
            (count("st_paid", "completed"), count("st_log", "completed")),
            (1, 1),
            "{backend:?}: run {id} resumed once and went on once: {detail}"
        );
        let log = steps
            .iter()
            .find(|s| s["step_id"] == "st_log")
            .map(|s| s["log"][0].clone());
        assert_eq!(
            log,
            Some(json!(format!("info: paid {}", runs[id]))),
            "{backend:?}: run {id} got its own signal"
        );
    }
    server.kill();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_signals_are_delivered_resumes_every_answered_wait_exactly_once() {
    for backend in backends() {
        crash_while_signalling(backend).await;
    }
}
