//! A graceful shutdown on a real process: SIGTERM while 20 external steps
//! (HTTP calls to a service that holds every answer until the test lets it
//! go, two seconds after the signal) are in flight. The node
//! stops claiming, `/readyz` answers 503, the 20 calls finish and each is
//! recorded once, and the process exits 0.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use tok_core::ids::TenantId;
use tok_store::testing::{TestDb, backends};
use tok_store::{Backend, RunFilter};

use support::{ADMIN_KEY, Api, Server, free_port};

const STEPS: usize = 20;

/// The calls a [`slow_service`] got and the answers it sent.
type Counts = Arc<(AtomicUsize, AtomicUsize)>;

/// A service that holds every call until `release` is sent true; counts
/// the calls it got and the answers it sent. Holding the answers (rather
/// than sleeping a fixed time) keeps all 20 in flight however slowly a busy
/// machine starts them.
async fn slow_service() -> (String, Counts, tokio::sync::watch::Sender<bool>) {
    let counts: Counts = Arc::default();
    let (release, released) = tokio::sync::watch::channel(false);
    async fn slow(
        State((counts, mut released)): State<(Counts, tokio::sync::watch::Receiver<bool>)>,
    ) -> axum::Json<Value> {
        counts.0.fetch_add(1, Ordering::SeqCst);
        let _ = released.wait_for(|go| *go).await;
        counts.1.fetch_add(1, Ordering::SeqCst);
        axum::Json(json!({ "ok": true }))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/slow", post(slow))
        .with_state((counts.clone(), released));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, counts, release)
}

async fn sigterm_lets_the_steps_in_flight_finish(backend: Backend) {
    let db = TestDb::create(backend).await;
    let port = free_port();
    let api = Api::new(port);
    let env = [
        ("TOK_CONCURRENCY", "32"),
        ("TOK_SHUTDOWN_GRACE", "20s"),
        ("TOK_NODE_ID", "shutdown-test-node"),
    ];
    let (base, counts, release) = slow_service().await;
    let allow = support::allow(&base);
    let env = [env.as_slice(), &[("TOK_OUTBOUND_ALLOW", allow.as_str())]].concat();
    let mut server = Server::start(&db.url, port, &[], &env);
    api.wait_ready().await;

    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let tenant_id = TenantId::from(tenant["id"].as_str().unwrap());
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
    let id = automation["id"].as_str().unwrap();
    for _ in 0..STEPS {
        api.post(&format!("/api/automations/{id}/runs"), &key, json!({}))
            .await;
    }
    // All 20 calls are in flight, none answered yet.
    for _ in 0..3000 {
        if counts.0.load(Ordering::SeqCst) == STEPS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(counts.0.load(Ordering::SeqCst), STEPS, "{backend:?}");
    assert_eq!(counts.1.load(Ordering::SeqCst), 0, "{backend:?}");

    server.terminate();
    // The load balancer is told at once, while the steps still run.
    let mut readyz = None;
    for _ in 0..100 {
        let answer = api
            .http
            .get(format!("{}/readyz", api.base))
            .send()
            .await
            .unwrap();
        if answer.status() != reqwest::StatusCode::OK {
            readyz = Some((answer.status(), answer.json::<Value>().await.unwrap()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        readyz,
        Some((
            reqwest::StatusCode::SERVICE_UNAVAILABLE,
            json!({ "status": "stopping" })
        )),
        "{backend:?}"
    );
    assert_eq!(
        counts.1.load(Ordering::SeqCst),
        0,
        "{backend:?}: the steps were still in flight"
    );
    // The service answers two seconds into the grace.
    tokio::time::sleep(Duration::from_secs(2)).await;
    release.send(true).unwrap();
    let status = server.wait_exit(Duration::from_secs(30));
    assert_eq!(
        status.map(|s| s.code()),
        Some(Some(0)),
        "{backend:?}: tok serve exits 0 after SIGTERM"
    );

    // Every call was answered, made once, and recorded once.
    assert_eq!(counts.0.load(Ordering::SeqCst), STEPS, "{backend:?}");
    assert_eq!(counts.1.load(Ordering::SeqCst), STEPS, "{backend:?}");
    let store = tok_store::connect(&db.url, 2, &db.keys).await.unwrap();
    let runs = store
        .runs(&tenant_id, &RunFilter::default(), 100, None)
        .await
        .unwrap()
        .items;
    assert_eq!(runs.len(), STEPS, "{backend:?}");
    for run in &runs {
        assert_eq!(run.status, "completed", "{backend:?}: {run:?}");
        let detail = store.run(&tenant_id, &run.id).await.unwrap().unwrap();
        assert_eq!(detail.steps.len(), 1, "{backend:?}: {:?}", detail.steps);
        assert_eq!(detail.steps[0].status, "completed", "{backend:?}");
    }
    drop(store);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_20_steps_are_in_flight_completes_them_and_exits_0() {
    for backend in backends() {
        sigterm_lets_the_steps_in_flight_finish(backend).await;
    }
}
