//! The `http` step against real local HTTP servers (axum on port 0) that
//! count requests: retries keep their idempotency key, terminal answers are
//! not retried, `Retry-After` is honoured, a connection's rate limit,
//! concurrency cap and circuit breaker hold, and steps hold no database
//! connection while they wait on a slow service. Both backends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::any;
use serde_json::{Value, json};
use tok_core::ids::{AutomationId, RunId, TenantId};
use tok_engine::definitions::prepare;
use tok_engine::{Engine, EngineConfig, Registry};
use tok_store::testing::{TestDb, backends};
use tok_store::{Backend, NewConnection, RunDetail, Store};

/// One request the stub saw: when, its idempotency key, its authorization.
type Request = (Instant, Option<String>, Option<String>);

/// What the stub server saw.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<Request>>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// Answers to give, in order; the last one repeats.
    script: Mutex<Vec<(u16, Option<&'static str>)>>,
    healthy: AtomicBool,
    delay_ms: AtomicU32,
}

impl Seen {
    fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    fn keys(&self) -> Vec<Option<String>> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.1.clone())
            .collect()
    }

    fn times(&self) -> Vec<Instant> {
        self.requests.lock().unwrap().iter().map(|r| r.0).collect()
    }
}

async fn stub(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> impl IntoResponse {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    seen.requests
        .lock()
        .unwrap()
        .push((Instant::now(), key, auth));
    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.peak.fetch_max(now, Ordering::SeqCst);
    let delay = seen.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(u64::from(delay))).await;
    }
    seen.in_flight.fetch_sub(1, Ordering::SeqCst);
    let (status, retry_after) = {
        let mut script = seen.script.lock().unwrap();
        if seen.healthy.load(Ordering::SeqCst) || script.is_empty() {
            (200, None)
        } else if script.len() > 1 {
            script.remove(0)
        } else {
            script[0]
        }
    };
    let mut out = HeaderMap::new();
    if let Some(after) = retry_after {
        out.insert("retry-after", after.parse().unwrap());
    }
    let body = axum::Json(json!({ "ok": status == 200, "invoice": "INV-1" }));
    (StatusCode::from_u16(status).unwrap(), out, body)
}

async fn serve(seen: Arc<Seen>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/{*path}", any(stub)).with_state(seen);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct Setup {
    db: TestDb,
    store: Arc<dyn Store>,
    tenant: TenantId,
    registry: Registry,
}

impl Setup {
    async fn new(backend: Backend, max_connections: u32) -> Self {
        let db = TestDb::create(backend).await;
        let store = tok_store::connect(&db.url, max_connections, &db.keys)
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let tenant = store.create_tenant("Acme", "key-hash").await.unwrap().id;
        // The stub services listen on loopback ports chosen at random; the
        // outbound guard refuses loopback unless it is opened.
        let allow = tok_engine::OutboundAllow::parse("127.0.0.1/32").unwrap();
        let registry = Registry::with_connectors(store.clone(), &allow);
        Self {
            db,
            store,
            tenant,
            registry,
        }
    }

    async fn connection(&self, name: &str, base: SocketAddr, limits: Value) -> String {
        let get_i = |k: &str| limits.get(k).and_then(Value::as_i64);
        self.store
            .create_connection(
                &self.tenant,
                NewConnection {
                    name: name.into(),
                    service: "http".into(),
                    base_url: Some(format!("http://{base}")),
                    credentials: json!({ "bearer": "secret-token" }),
                    rate: limits.get("rate").and_then(Value::as_f64),
                    burst: get_i("burst").unwrap_or(1) as i32,
                    max_concurrency: get_i("max_concurrency").map(|n| n as i32),
                    breaker_threshold: get_i("breaker_threshold").unwrap_or(5) as i32,
                    breaker_cooldown_ms: get_i("breaker_cooldown_ms").unwrap_or(30_000),
                },
            )
            .await
            .unwrap()
            .id
    }

    async fn automation(&self, steps: Value, retry: Value) -> AutomationId {
        let definition = json!({
            "name": "call", "trigger": { "kind": "manual" }, "steps": steps,
            "settings": { "retry": retry }
        });
        let raw = serde_json::to_vec(&definition).unwrap();
        let (_, version) = prepare(&raw, &self.registry).unwrap_or_else(|e| panic!("{e:?}"));
        self.store
            .create_automation(&self.tenant, version)
            .await
            .unwrap()
            .id
    }

    fn engine(&self, concurrency: usize) -> Engine {
        Engine::new(
            self.store.clone(),
            self.registry.clone(),
            EngineConfig {
                concurrency,
                poll_interval: Duration::from_millis(20),
                ..EngineConfig::default()
            },
        )
    }

    async fn finished(&self, run: &RunId) -> RunDetail {
        for _ in 0..3000 {
            let d = self.store.run(&self.tenant, run).await.unwrap().unwrap();
            if matches!(d.run.status.as_str(), "completed" | "failed") {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("run {run} did not finish within 60 s");
    }

    /// Starts one run on an engine with 4 slots and waits until it ends.
    async fn run_once(&self, automation: &AutomationId, input: Value) -> RunDetail {
        let engine = self.engine(4);
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&self.tenant, automation, input, None)
            .await
            .unwrap();
        let detail = self.finished(&run).await;
        running.shutdown().await;
        detail
    }

    async fn cleanup(self) {
        drop(self.registry);
        drop(self.store);
        self.db.cleanup().await;
    }
}

fn call(connection: &str, method: &str) -> Value {
    json!([{ "id": "st_call", "type": "http",
             "config": { "connection": connection, "method": method, "url": "/invoices",
                         "body": { "order": "{{orderId}}" } } }])
}

fn fast_retries(max: u32) -> Value {
    json!({ "max_attempts": max, "backoff": ["50ms"] })
}

#[tokio::test]
async fn a_503_is_retried_with_the_same_idempotency_key() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        *seen.script.lock().unwrap() = vec![(503, None), (503, None), (200, None)];
        let addr = serve(seen.clone()).await;
        let s = Setup::new(backend, 10).await;
        s.connection("invoicing", addr, json!({})).await;
        let automation = s
            .automation(call("invoicing", "POST"), fast_retries(5))
            .await;
        let detail = s.run_once(&automation, json!({ "orderId": "5001" })).await;

        assert_eq!(
            detail.run.status, "completed",
            "{backend:?}: {:?}",
            detail.run.error
        );
        let key = format!("{}:0", detail.run.id);
        assert_eq!(
            seen.keys(),
            vec![Some(key.clone()), Some(key.clone()), Some(key)],
            "{backend:?}"
        );
        let auth = seen.requests.lock().unwrap()[0].2.clone();
        assert_eq!(
            auth.as_deref(),
            Some("Bearer secret-token"),
            "{backend:?}: credentials applied"
        );
        assert_eq!(detail.context["st_call"]["status"], 200, "{backend:?}");
        assert_eq!(
            detail.context["st_call"]["body"]["invoice"], "INV-1",
            "{backend:?}"
        );
        s.cleanup().await;
    }
}

#[tokio::test]
async fn a_400_is_not_retried() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        *seen.script.lock().unwrap() = vec![(400, None)];
        let addr = serve(seen.clone()).await;
        let s = Setup::new(backend, 10).await;
        s.connection("invoicing", addr, json!({})).await;
        let automation = s
            .automation(call("invoicing", "POST"), fast_retries(5))
            .await;
        let detail = s.run_once(&automation, json!({ "orderId": "1" })).await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        assert_eq!(seen.count(), 1, "{backend:?}");
        assert!(detail.run.error.unwrap().contains("400"), "{backend:?}");
        s.cleanup().await;
    }
}

#[tokio::test]
async fn retry_after_is_honoured() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        *seen.script.lock().unwrap() = vec![(429, Some("1")), (200, None)];
        let addr = serve(seen.clone()).await;
        let s = Setup::new(backend, 10).await;
        s.connection("invoicing", addr, json!({})).await;
        let automation = s
            .automation(call("invoicing", "GET"), fast_retries(5))
            .await;
        let detail = s.run_once(&automation, json!({ "orderId": "1" })).await;

        assert_eq!(detail.run.status, "completed", "{backend:?}");
        let times = seen.times();
        assert_eq!(times.len(), 2, "{backend:?}");
        // The policy alone would have retried after 50 ms.
        assert!(
            times[1] - times[0] >= Duration::from_millis(1000),
            "{backend:?}: {:?}",
            times[1] - times[0]
        );
        s.cleanup().await;
    }
}

#[tokio::test]
async fn a_rate_limit_holds_a_burst_of_100_steps_to_its_rate() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        let addr = serve(seen.clone()).await;
        let s = Setup::new(backend, 10).await;
        s.connection("invoicing", addr, json!({ "rate": 50.0, "burst": 5 }))
            .await;
        let automation = s
            .automation(call("invoicing", "POST"), fast_retries(3))
            .await;
        let engine = s.engine(16);
        let running = engine.start(true).await.unwrap();
        let mut runs = Vec::new();
        for n in 0..100 {
            runs.push(
                engine
                    .start_run(
                        &s.tenant,
                        &automation,
                        json!({ "orderId": n.to_string() }),
                        None,
                    )
                    .await
                    .unwrap(),
            );
        }
        for run in &runs {
            assert_eq!(s.finished(run).await.run.status, "completed", "{backend:?}");
        }
        running.shutdown().await;

        let mut times = seen.times();
        assert_eq!(
            times.len(),
            100,
            "{backend:?}: no call was made twice or dropped"
        );
        times.sort();
        // In any window of one second at most rate + burst calls (+1 for the
        // window's edge).
        for (i, start) in times.iter().enumerate() {
            let within = times[i..]
                .iter()
                .take_while(|t| **t - *start < Duration::from_secs(1))
                .count();
            assert!(
                within <= 56,
                "{backend:?}: {within} calls within one second"
            );
        }
        // 100 calls at 50/s after a burst of 5 take at least 1.9 s.
        assert!(
            times[99] - times[0] >= Duration::from_millis(1800),
            "{backend:?}: {:?}",
            times[99] - times[0]
        );
        s.cleanup().await;
    }
}

#[tokio::test]
async fn a_concurrency_cap_holds() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        seen.delay_ms.store(100, Ordering::SeqCst);
        let addr = serve(seen.clone()).await;
        let s = Setup::new(backend, 10).await;
        s.connection("invoicing", addr, json!({ "max_concurrency": 3 }))
            .await;
        let automation = s
            .automation(call("invoicing", "GET"), fast_retries(3))
            .await;
        let engine = s.engine(16);
        let running = engine.start(true).await.unwrap();
        let mut runs = Vec::new();
        for n in 0..20 {
            runs.push(
                engine
                    .start_run(
                        &s.tenant,
                        &automation,
                        json!({ "orderId": n.to_string() }),
                        None,
                    )
                    .await
                    .unwrap(),
            );
        }
        for run in &runs {
            assert_eq!(s.finished(run).await.run.status, "completed", "{backend:?}");
        }
        running.shutdown().await;

        assert_eq!(seen.count(), 20, "{backend:?}");
        let peak = seen.peak.load(Ordering::SeqCst);
        assert!(
            (2..=3).contains(&peak),
            "{backend:?}: peak of {peak} calls in flight"
        );
        s.cleanup().await;
    }
}

#[tokio::test]
async fn a_circuit_breaker_opens_after_failures_and_recovers() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        *seen.script.lock().unwrap() = vec![(503, None)];
        let addr = serve(seen.clone()).await;
        let s = Setup::new(backend, 10).await;
        s.connection(
            "invoicing",
            addr,
            json!({ "breaker_threshold": 3, "breaker_cooldown_ms": 1500 }),
        )
        .await;
        let automation = s
            .automation(
                call("invoicing", "GET"),
                json!({ "max_attempts": 10, "backoff": ["50ms"] }),
            )
            .await;
        let engine = s.engine(4);
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&s.tenant, &automation, json!({ "orderId": "1" }), None)
            .await
            .unwrap();
        // Three failures open the breaker; then nothing reaches the service
        // during the cool-down, although the policy would retry every 50 ms.
        while seen.count() < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(
            seen.count(),
            3,
            "{backend:?}: calls went through an open breaker"
        );
        let connection = s
            .store
            .connection(&s.tenant, "invoicing")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(connection.breaker_state, "open", "{backend:?}");
        // The service recovers; after the cool-down one probe succeeds.
        seen.healthy.store(true, Ordering::SeqCst);
        let detail = s.finished(&run).await;
        running.shutdown().await;

        assert_eq!(detail.run.status, "completed", "{backend:?}");
        assert_eq!(seen.count(), 4, "{backend:?}");
        let connection = s
            .store
            .connection(&s.tenant, "invoicing")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (connection.breaker_state.as_str(), connection.failures),
            ("closed", 0),
            "{backend:?}"
        );
        // Deferred waits spent no attempts: 3 failures + 1 success.
        let attempts: Vec<i32> = detail.steps.iter().map(|st| st.attempt).collect();
        assert_eq!(attempts, vec![1, 2, 3, 4], "{backend:?}");
        s.cleanup().await;
    }
}

#[tokio::test]
async fn ninety_slow_calls_at_once_need_no_more_than_five_database_connections() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        // Each call lasts long enough that the 90 runs, started one after
        // another, overlap however slowly the machine starts them: the peak
        // then says how many calls the connections allowed, not how fast
        // the runs were started.
        seen.delay_ms.store(1_000, Ordering::SeqCst);
        let addr = serve(seen.clone()).await;
        // At most 5 connections in the store's pool (SQLite: one writer).
        let s = Setup::new(backend, 5).await;
        let automation = s
            .automation(
                json!([{ "id": "st_call", "type": "http",
                         "config": { "method": "GET", "url": format!("http://{addr}/slow") } }]),
                fast_retries(1),
            )
            .await;
        let engine = s.engine(90);
        let running = engine.start(true).await.unwrap();
        let mut runs = Vec::new();
        for n in 0..90 {
            runs.push(
                engine
                    .start_run(&s.tenant, &automation, json!({ "n": n }), None)
                    .await
                    .unwrap(),
            );
        }
        let mut statuses: HashMap<String, usize> = HashMap::new();
        for run in &runs {
            *statuses
                .entry(s.finished(run).await.run.status)
                .or_default() += 1;
        }
        running.shutdown().await;

        assert_eq!(
            statuses.get("completed"),
            Some(&90),
            "{backend:?}: {statuses:?}"
        );
        // Had a step held a connection while it waited, at most 5 calls
        // could have been in flight at once.
        let peak = seen.peak.load(Ordering::SeqCst);
        assert!(
            peak >= 30,
            "{backend:?}: only {peak} calls were in flight at once"
        );
        s.cleanup().await;
    }
}
