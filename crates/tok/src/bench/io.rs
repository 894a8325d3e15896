//! `io`: runs whose steps are `http` calls to a local stub that answers
//! after 20 ms, with `TOK_CONCURRENCY=256` — enough runs that 200+ steps
//! wait on the stub at once. It shows that a step waiting on a service holds
//! a worker slot but no database connection: the figure is steps/s, the
//! stub's peak of concurrent requests, and the peak of connections the
//! server holds on PostgreSQL (polled from `pg_stat_activity` every 50 ms).
//! SQLite's connections are fixed by construction: one writer, four readers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde_json::json;

use super::report::{Figure, Target};
use super::server::ConnectionPoller;
use super::steps::{self, STEPS_PER_RUN};
use super::{Bench, Server};

const NAME: &str = "io";

/// Worker slots of the server for this figure.
pub(crate) const CONCURRENCY: usize = 256;

/// How long the stub takes to answer.
const STUB_DELAY: Duration = Duration::from_millis(20);

/// Requests in flight at the stub, and the most there were at once.
#[derive(Default)]
struct StubCounters {
    current: AtomicUsize,
    peak: AtomicUsize,
    served: AtomicUsize,
}

async fn answer(State(counters): State<Arc<StubCounters>>) -> axum::Json<serde_json::Value> {
    let now = counters.current.fetch_add(1, Ordering::SeqCst) + 1;
    counters.peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(STUB_DELAY).await;
    counters.current.fetch_sub(1, Ordering::SeqCst);
    counters.served.fetch_add(1, Ordering::SeqCst);
    axum::Json(json!({ "ok": true }))
}

/// The stub on 127.0.0.1 in this process; aborted when the figure ends.
pub(crate) struct Stub {
    port: u16,
    counters: Arc<StubCounters>,
    task: tokio::task::JoinHandle<()>,
}

impl Stub {
    pub(crate) async fn start() -> anyhow::Result<Stub> {
        let counters = Arc::new(StubCounters::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let app = Router::new()
            .route("/stub", get(answer))
            .with_state(counters.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Stub {
            port,
            counters,
            task,
        })
    }
}

impl Stub {
    /// Ten `http` steps, each a call to this stub.
    pub(crate) fn calls(&self) -> Vec<serde_json::Value> {
        (1..=STEPS_PER_RUN)
            .map(|i| {
                json!({
                    "id": format!("h{i}"), "type": "http",
                    "config": {
                        "method": "GET",
                        "url": format!("http://127.0.0.1:{}/stub?n={{{{n}}}}&step={i}", self.port),
                        "timeoutMs": 10_000,
                    }
                })
            })
            .collect()
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn run(bench: &Bench) -> anyhow::Result<Vec<Figure>> {
    let stub = Stub::start().await?;
    let mut server = bench.server(NAME, Some(CONCURRENCY)).await?;
    let measured = measure(bench, &mut server, &stub).await;
    bench.release(NAME, server).await;
    measured
}

async fn measure(bench: &Bench, server: &mut Server, stub: &Stub) -> anyhow::Result<Vec<Figure>> {
    let api = &server.api.clone();
    let tenant = api.tenant(&format!("bench io {}", bench.nonce)).await?;
    let source = api.source(&tenant, NAME).await?;
    let automation = api.automation(&tenant, NAME, &source, stub.calls()).await?;
    let events = bench.scaled(1_000, 400);
    bench.progress.line(
        NAME,
        &format!(
            "{events} webhooks, each a run of {STEPS_PER_RUN} http steps to a stub answering in {} ms",
            STUB_DELAY.as_millis()
        ),
    );
    let poller = match server.postgres_url() {
        Some(url) => Some(ConnectionPoller::start(url).await?),
        None => None,
    };
    stub.counters.peak.store(0, Ordering::SeqCst);
    let load = steps::load(
        bench,
        api,
        &tenant,
        &source,
        &automation,
        events,
        &server.pids(),
        (&bench.progress, NAME),
    )
    .await;
    let connections = match poller {
        Some(poller) => Some(poller.finish().await?),
        None => None,
    };
    let load = load?;
    server.check_alive()?;
    let peak = stub.counters.peak.load(Ordering::SeqCst);
    let served = stub.counters.served.load(Ordering::SeqCst);
    let ideal = CONCURRENCY as f64 / STUB_DELAY.as_secs_f64();
    let slots = if server.is_external() {
        "the server's own TOK_CONCURRENCY (start it with 256)".to_owned()
    } else {
        format!(
            "TOK_CONCURRENCY={CONCURRENCY} (at most {ideal:.0} steps/s if slots were the only bound)"
        )
    };
    let throughput = Figure::new(NAME, load.steps_per_sec().round(), "steps/s")
        .notes(format!(
            "{slots}; {}; the stub served {served} requests",
            load.describe("10 http steps")
        ))
        .details(json!({ "load": load.details(), "stub_served": served, "stub_peak": peak }));
    let concurrency = Figure::new("io-concurrency", peak as f64, "requests")
        .target(Target::AtLeast(200.0))
        .notes("the most stub requests in flight at once: steps waiting on IO together");
    let connections = match (connections, bench.backend(), server.is_external()) {
        (Some((open, busy)), _, _) => Figure::new("io-connections", open as f64, "connections")
            .target(Target::AtMost(10.0))
            .notes(format!(
                "peak connections the server held on its database (pg_stat_activity every 50 ms); \
                 peak not idle {busy}; while {peak} steps waited on the stub"
            ))
            .details(json!({ "open": open, "not_idle": busy })),
        (None, super::BackendKind::Sqlite, false) => Figure {
            shown: Some("1w+4r".into()),
            met: Some(true),
            ..Figure::new("io-connections", 5.0, "connections")
                .target(Target::AtMost(10.0))
                .notes("not measured: 1 writer + ≤4 readers by construction (tok-store's SQLite pools)")
        },
        (None, _, _) => Figure::missing(
            "io-connections",
            "connections",
            "not measured: pass the external server's PostgreSQL as --database-url",
        ),
    };
    Ok(vec![throughput, concurrency, connections])
}
