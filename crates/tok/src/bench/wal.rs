//! `wal` (SQLite only): how large the write-ahead log grows under sustained
//! ingest and steps, how large it is once the node is idle, and what a
//! clean shutdown leaves of it.
//!
//! Webhooks are sent as fast as `--senders` allow, each starting a run of
//! `set`, `bench/noop` and `set` (an ingest, a claim and records), until
//! every run has completed, while the `-wal` file's size is read every
//! 20 ms. Then the node idles for three seconds, and is stopped with
//! SIGTERM as a process manager stops it. The limit the log is held to is
//! `TOK_SQLITE_WAL_LIMIT` (64 MiB unless the bench's environment sets it).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;

use super::api;
use super::report::{Figure, Target};
use super::{BackendKind, Bench, NOOP_STEP, Server};

const NAME: &str = "wal";

/// Longest wait for the runs of the load.
const TIME_LIMIT: Duration = Duration::from_secs(900);

/// How long the node idles before the idle size is read: a few of the
/// background checkpoint's ticks.
const IDLE: Duration = Duration::from_secs(3);

const MB: f64 = 1024.0 * 1024.0;

pub(crate) async fn run(bench: &Bench) -> anyhow::Result<Vec<Figure>> {
    if bench.backend() != BackendKind::Sqlite || bench.own_backend().is_none() {
        return Ok(vec![Figure::missing(
            NAME,
            "MB",
            "not measured: SQLite only, on the bench's own server (not --url, not --database-url)",
        )]);
    }
    let mut server = bench.server(NAME, None).await?;
    let measured = measure(bench, &mut server).await;
    bench.release(NAME, server).await;
    measured
}

/// The `-wal` file beside a `sqlite://` database.
fn wal_of(database_url: &str) -> PathBuf {
    let mut wal = database_url.trim_start_matches("sqlite://").to_owned();
    wal.push_str("-wal");
    PathBuf::from(wal)
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Reads a file's size every 20 ms until stopped; keeps the largest.
struct Sampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(path: PathBuf) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (peak, stop) = (peak.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(size(&path), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        Self { peak, stop, task }
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.peak.load(Ordering::Relaxed)
    }
}

async fn measure(bench: &Bench, server: &mut Server) -> anyhow::Result<Vec<Figure>> {
    let api = &server.api.clone();
    let database = server
        .database
        .as_ref()
        .context("the bench's own server has a database")?;
    let wal = wal_of(&database.url);
    let db_file = PathBuf::from(database.url.trim_start_matches("sqlite://"));
    let tenant = api.tenant(&format!("bench wal {}", bench.nonce)).await?;
    let source = api.source(&tenant, NAME).await?;
    let steps = vec![
        json!({ "id": "s1", "type": "set", "config": { "values": { "seen": "{{n}}" } } }),
        json!({ "id": "s2", "type": NOOP_STEP, "config": {} }),
        json!({ "id": "s3", "type": "set", "config": { "values": { "done": true } } }),
    ];
    let automation = api
        .automation(&tenant, NAME, &source, steps)
        .await
        .with_context(super::noop::not_registered)?;
    let events = bench.scaled(20_000, 500);
    bench.progress.line(
        NAME,
        &format!("{events} webhooks, each a run of set, bench/noop and set"),
    );
    let sampler = Sampler::start(wal.clone());
    let started = std::time::Instant::now();
    let sent = api::send_closed_loop(
        &bench.http,
        &source.url,
        &format!("{}-wal", bench.nonce),
        events,
        bench.options().senders,
        false,
        (&bench.progress, NAME),
    )
    .await;
    let finished = api
        .wait_runs(
            &tenant,
            Some(&automation),
            sent.accepted,
            TIME_LIMIT,
            (&bench.progress, NAME),
        )
        .await?;
    let loaded = started.elapsed().as_secs_f64();
    server.check_alive()?;
    let peak = sampler.finish().await;
    tokio::time::sleep(IDLE).await;
    let idle = size(&wal);
    let database_mb = size(&db_file) as f64 / MB;
    let child = server.child.take().context("the bench's own server")?;
    let (exit, report) = child.terminate(Duration::from_secs(60));
    bench.keep_report(NAME, report);
    let after = size(&wal);
    let exists = wal.exists();
    let load = format!(
        "{} events ({}) and {} runs of 3 steps in {loaded:.1} s; database {database_mb:.1} MB",
        sent.accepted,
        sent.error_text(),
        finished.completed().count(),
    );
    let details = json!({
        "events": sent.accepted,
        "completed_runs": finished.completed().count(),
        "seconds": loaded,
        "wal_peak_bytes": peak,
        "wal_idle_bytes": idle,
        "wal_after_shutdown_bytes": exists.then_some(after),
        "database_bytes": size(&db_file),
        "exit": exit.map(|s| s.to_string()),
        "TOK_SQLITE_WAL_LIMIT": std::env::var("TOK_SQLITE_WAL_LIMIT").unwrap_or_else(|_| "64MiB (default)".into()),
    });
    let round = |bytes: u64| (bytes as f64 / MB * 10.0).round() / 10.0;
    Ok(vec![
        Figure::new("wal-peak", round(peak), "MB")
            .target(Target::AtMost(128.0))
            .notes(format!("the -wal file's largest size under load: {load}"))
            .details(details),
        Figure::new("wal-idle", round(idle), "MB")
            .target(Target::AtMost(64.0))
            .notes(format!(
                "the -wal file {} s after the last run ended",
                IDLE.as_secs()
            )),
        Figure::new("wal-after-shutdown", round(after), "MB")
            .target(Target::AtMost(0.0))
            .notes(format!(
                "the -wal file after SIGTERM ({}; {})",
                if exists { "present" } else { "gone" },
                exit.map_or_else(|| "no exit within 60 s: killed".into(), |s| s.to_string())
            )),
    ])
}
