//! A fleet on PostgreSQL (docs/operations.md, "Probes and roles"): one API
//! process and two worker processes. Each worker serves `/healthz`,
//! `/readyz` and `/metrics` on its own `TOK_LISTEN` (and nothing of the
//! API), is ready once it claims work, and counts on its own `/metrics` the
//! steps and the connector calls it made: over both workers the counts add
//! up to what the runs did, each worker did some of it, and the API
//! process, which runs no step, counts none.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db, skip_postgres};

use support::{ADMIN_KEY, Api, Server, free_port};

const RUNS: usize = 12;
/// Steps per run: a `set`, the `http` call, a `set`.
const STEPS: usize = 3;

async fn slow(State(calls): State<Arc<AtomicUsize>>) -> axum::Json<Value> {
    calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    axum::Json(json!({ "ok": true }))
}

async fn slow_service() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let base = support::serve(
        Router::new()
            .route("/slow", post(slow))
            .with_state(calls.clone()),
    )
    .await;
    (base, calls)
}

/// The value of the Prometheus sample `name` whose labels include every
/// pair of `labels` (summed, if several series match), 0 if none does.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let found: BTreeMap<&str, &str> = rest
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            labels
                .iter()
                .all(|(k, v)| found.get(k) == Some(v))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

async fn scrape(api: &Api) -> String {
    let response = api
        .http
        .get(format!("{}/metrics", api.base))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{}/metrics", api.base);
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_is_ready_and_counts_the_steps_it_ran_on_its_own_metrics() {
    if skip_postgres() {
        eprintln!("TOK_TEST_SKIP_POSTGRES=1: the fleet test (one api, two workers) is NOT run");
        return;
    }
    run_on_fresh_db(Backend::Postgres, async |db: &TestDb| {
        let (base, calls) = slow_service().await;
        let allow = support::allow(&base);
        let port = free_port();
        let api = Api::new(port);
        let _api = Server::start(
            &db.url,
            port,
            &[],
            &[("TOK_ROLE", "api"), ("TOK_NODE_ID", "fleet-api")],
        );
        api.wait_ready().await;
        let workers: Vec<(Server, Api)> = ["fleet-worker-a", "fleet-worker-b"]
            .into_iter()
            .map(|node| {
                let port = free_port();
                let server = Server::start(
                    &db.url,
                    port,
                    &[],
                    &[
                        ("TOK_ROLE", "worker"),
                        ("TOK_NODE_ID", node),
                        ("TOK_CONCURRENCY", "2"),
                        ("TOK_OUTBOUND_ALLOW", &allow),
                    ],
                );
                (server, Api::new(port))
            })
            .collect();
        for (_, worker) in &workers {
            // Ready means its worker pool claims: it polls until it does.
            worker.wait_ready().await;
            let (status, body) = worker
                .call(reqwest::Method::GET, "/readyz", "", None, None)
                .await;
            assert_eq!(status, StatusCode::OK, "{}: {body}", worker.base);
            assert_eq!(body, json!({ "status": "ready" }));
            let (status, body) = worker
                .call(reqwest::Method::GET, "/api/automations", ADMIN_KEY, None, None)
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "a worker serves no API: {body}");
            assert_eq!(body["error"]["code"], "not_found", "{body}");
        }

        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Fleet" }))
            .await;
        let key = tenant["api_key"].as_str().unwrap().to_owned();
        let tenant_id = tenant["id"].as_str().unwrap().to_owned();
        api.post(
            "/api/connections",
            &key,
            json!({ "name": "supplier", "service": "http", "base_url": base, "rate": 1000, "burst": 100 }),
        )
        .await;
        let automation = api
            .post(
                "/api/automations",
                &key,
                json!({
                    "name": "Ask the supplier",
                    "trigger": { "kind": "manual" },
                    "steps": [
                        { "id": "st_before", "type": "set", "config": { "values": { "asked": true } } },
                        { "id": "st_call", "type": "http",
                          "config": { "connection": "supplier", "method": "POST", "url": "/slow", "body": {} } },
                        { "id": "st_after", "type": "set", "config": { "values": { "answered": true } } }
                    ]
                }),
            )
            .await;
        let id = automation["id"].as_str().unwrap().to_owned();
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            let started = api
                .post(&format!("/api/automations/{id}/runs"), &key, json!({}))
                .await;
            runs.push(started["run_id"].as_str().unwrap().to_owned());
        }
        for run in &runs {
            let detail = api.final_run(&key, run).await;
            assert_eq!(detail["status"], "completed", "{detail:#}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), RUNS, "each run called once");

        let tenant_steps = [("tenant", tenant_id.as_str()), ("status", "completed")];
        let supplier_calls = [
            ("connector", "http"),
            ("tenant", tenant_id.as_str()),
            ("connection", "supplier"),
        ];
        let mut steps = Vec::new();
        let mut connector_calls = Vec::new();
        for (_, worker) in &workers {
            let text = scrape(worker).await;
            steps.push(sample(&text, "tok_steps_total", &tenant_steps));
            connector_calls.push(sample(
                &text,
                "tok_connector_call_seconds_count",
                &supplier_calls,
            ));
            let p95 = [supplier_calls.as_slice(), &[("quantile", "0.95")]].concat();
            if connector_calls.last() > Some(&0.0) {
                assert!(
                    sample(&text, "tok_connector_call_seconds", &p95) >= 0.2,
                    "the supplier's p95 on {} is at least its 200 ms:\n{text}",
                    worker.base
                );
            }
        }
        println!("fleet: steps per worker {steps:?}, supplier calls per worker {connector_calls:?}");
        assert_eq!(
            steps.iter().sum::<f64>(),
            (RUNS * STEPS) as f64,
            "the workers' /metrics count every step of the tenant's runs once"
        );
        assert_eq!(
            connector_calls.iter().sum::<f64>(),
            RUNS as f64,
            "the workers' /metrics count every call to the connection `supplier` once"
        );
        assert!(
            connector_calls.iter().all(|n| *n > 0.0),
            "two slots each, {RUNS} calls of 200 ms: both workers made some, and each \
             counts its own ({connector_calls:?})"
        );
        let api_text = scrape(&api).await;
        assert_eq!(
            sample(&api_text, "tok_steps_total", &tenant_steps),
            0.0,
            "the API process ran no step, so it counts none"
        );
        drop(workers);
    })
    .await;
}
