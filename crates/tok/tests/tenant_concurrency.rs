//! A tenant's concurrency cap across processes (docs/security.md, "Tenant
//! quotas"): on PostgreSQL, one API process and two worker processes of
//! eight slots each; the tenant's `settings.limits.concurrency` is 2 and it
//! starts 10 runs of one `http` step that takes 300 ms. The service the
//! step calls counts the calls in flight: it never sees more than 2 at
//! once, and every run completes, each call made once. The cap is the
//! leases in the jobs' rows, so no process needs to know the others.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db, skip_postgres};

use support::{ADMIN_KEY, Api, Server, free_port};

const RUNS: usize = 10;
const CAP: usize = 2;

#[derive(Default)]
struct Service {
    now: AtomicUsize,
    most: AtomicUsize,
    /// The idempotency key of every call, in arrival order.
    keys: Mutex<Vec<String>>,
}

async fn slow(State(service): State<Arc<Service>>, headers: HeaderMap) -> axum::Json<Value> {
    let now = service.now.fetch_add(1, Ordering::SeqCst) + 1;
    service.most.fetch_max(now, Ordering::SeqCst);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    service.keys.lock().unwrap().push(key);
    tokio::time::sleep(Duration::from_millis(300)).await;
    service.now.fetch_sub(1, Ordering::SeqCst);
    axum::Json(json!({ "ok": true }))
}

async fn slow_service() -> (String, Arc<Service>) {
    let service = Arc::new(Service::default());
    let base = support::serve(
        Router::new()
            .route("/slow", post(slow))
            .with_state(service.clone()),
    )
    .await;
    (base, service)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_capped_at_2_has_at_most_2_calls_in_flight_across_two_workers() {
    if skip_postgres() {
        eprintln!("TOK_TEST_SKIP_POSTGRES=1: the two-worker concurrency cap test is NOT run");
        return;
    }
    run_on_fresh_db(Backend::Postgres, async |db: &TestDb| {
        let (base, service) = slow_service().await;
        let allow = support::allow(&base);
        let port = free_port();
        let api = Api::new(port);
        let _api = Server::start(
            &db.url,
            port,
            &[],
            &[
                ("TOK_ROLE", "api"),
                ("TOK_NODE_ID", "cap-api"),
                ("TOK_OUTBOUND_ALLOW", &allow),
            ],
        );
        api.wait_ready().await;
        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Capped" }))
            .await;
        let key = tenant["api_key"].as_str().unwrap().to_owned();
        let tenant_id = tenant["id"].as_str().unwrap().to_owned();
        let (status, changed) = api
            .call(
                reqwest::Method::PATCH,
                &format!("/api/tenants/{tenant_id}"),
                ADMIN_KEY,
                None,
                Some(json!({ "settings": { "limits": { "concurrency": CAP } } })),
            )
            .await;
        assert_eq!(status, 200, "{changed:#}");
        assert_eq!(changed["settings"]["limits"]["concurrency"], CAP);
        api.post(
            "/api/connections",
            &key,
            json!({ "name": "slow", "service": "http", "base_url": base, "rate": 1000, "burst": 100 }),
        )
        .await;
        let automation = api
            .post(
                "/api/automations",
                &key,
                json!({
                    "name": "Slow call",
                    "trigger": { "kind": "manual" },
                    "steps": [{ "id": "st_call", "type": "http",
                                "config": { "connection": "slow", "method": "POST", "url": "/slow", "body": {} } }]
                }),
            )
            .await;
        let id = automation["id"].as_str().unwrap().to_owned();
        let workers: Vec<Server> = ["cap-worker-a", "cap-worker-b"]
            .into_iter()
            .map(|node| {
                Server::start(
                    &db.url,
                    free_port(),
                    &[],
                    &[
                        ("TOK_ROLE", "worker"),
                        ("TOK_NODE_ID", node),
                        ("TOK_CONCURRENCY", "8"),
                        ("TOK_OUTBOUND_ALLOW", &allow),
                    ],
                )
            })
            .collect();

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
        let most = service.most.load(Ordering::SeqCst);
        println!("tenant_concurrency: at most {most} of {RUNS} calls in flight (cap {CAP})");
        assert!(
            most <= CAP,
            "the service saw {most} calls in flight at once; the tenant's cap is {CAP}"
        );
        let mut keys = service.keys.lock().unwrap().clone();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), RUNS, "each run's call was made once");
        drop(workers);
    })
    .await;
}
