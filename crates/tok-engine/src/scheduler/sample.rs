//! The queue's gauges for `/metrics` (docs/operations.md, "Metrics"),
//! sampled by every node that runs the engine — holder of the wake or not,
//! API or worker-only — so each node's `/metrics` answers "is it keeping
//! up" and "is it busy or stuck" without an API node in front of it. The
//! counters and summaries (steps, runs, step and connector latency, inbox
//! lag) are counted where the work happens: see `docs/operations.md` for
//! each metric and the question it answers.
//!
//! The queue's history per tenant (the dashboard's Queue health,
//! docs/dashboard.md, "Pages") is the holder's alone: every
//! [`SchedulerConfig::queue_sample_every`] the node holding the wake writes
//! one sample row per tenant, all tenants in one statement
//! (`tok_store::QueueSampling`), for the dashboard's charts of the last
//! hour; the expiry deletes them after a day.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tok_core::ids::TenantId;
use tok_store::{QueueStats, Store};

use super::SchedulerConfig;
use crate::{Inner, Result};

/// Describes the gauges of this module to the recorder: the `# HELP` of
/// each in `/metrics`.
pub(crate) fn describe() {
    metrics::describe_gauge!(
        "tok_queue_ready_jobs",
        "Jobs ready to run now, at the last sample of the queue"
    );
    metrics::describe_gauge!(
        "tok_queue_scheduled_jobs",
        "Jobs due later (waits, retries' back-off), at the last sample of the queue"
    );
    metrics::describe_gauge!(
        "tok_queue_running_jobs",
        "Jobs claimed by a worker, at the last sample of the queue"
    );
    metrics::describe_gauge!(
        "tok_inbox_pending_events",
        "Events accepted and not yet dispatched, at the last sample of the queue"
    );
    metrics::describe_gauge!(
        "tok_queue_oldest_ready_seconds",
        metrics::Unit::Seconds,
        "Age of the oldest job ready to run: small under load is work, growing is a stall"
    );
    metrics::describe_gauge!(
        "tok_runs_held",
        "Runs held now, by what holds them (kind): a decision, a signal, child runs, a start control, a connection or a timer"
    );
}

/// Sets the queue's gauges from one sample.
pub fn record_queue_gauges(stats: &QueueStats) {
    metrics::gauge!("tok_queue_ready_jobs").set(stats.ready as f64);
    metrics::gauge!("tok_queue_scheduled_jobs").set(stats.scheduled as f64);
    metrics::gauge!("tok_queue_running_jobs").set(stats.running as f64);
    metrics::gauge!("tok_inbox_pending_events").set(stats.pending_events as f64);
    let oldest = stats.oldest_ready_ms.unwrap_or(0) as f64 / 1000.0;
    metrics::gauge!("tok_queue_oldest_ready_seconds").set(oldest);
}

/// Sets `tok_runs_held{kind}` from one count: every kind a row says alone,
/// 0 where none is held (so a kind that emptied reads 0, not its last).
pub fn record_held_gauges(held: &[(String, i64)]) {
    for kind in tok_core::blocked::KINDS {
        if matches!(*kind, "queue_key" | "tenant_concurrency") {
            continue;
        }
        let n = held.iter().find(|(k, _)| k == kind).map_or(0, |(_, n)| *n);
        metrics::gauge!("tok_runs_held", "kind" => *kind).set(n as f64);
    }
}

/// Samples the queue every [`SchedulerConfig::sample_every`](super::SchedulerConfig::sample_every)
/// until shutdown.
pub(crate) async fn sample_loop(
    inner: Arc<Inner>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let every = inner.config.scheduler.sample_every;
    loop {
        let tenants = inner.tenants();
        match inner.store.queue_stats(&tenants).await {
            Ok(stats) => record_queue_gauges(&stats),
            Err(e) => tracing::warn!(error = %e, "could not sample the queue for the metrics"),
        }
        match inner.store.held_counts(&tenants).await {
            Ok(held) => record_held_gauges(&held),
            Err(e) => tracing::warn!(error = %e, "could not count the held runs for the metrics"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => {}
        }
        if crate::stopping(&shutdown) {
            return;
        }
    }
}

/// Writes one sample of each of `tenants`' queue at `now`. Its step counts
/// go back to the tenant's sample before, or one interval when that is
/// more than two intervals old (the holder changed, or was down).
pub(super) async fn keep(
    store: &dyn Store,
    tenants: &[TenantId],
    now: i64,
    config: &SchedulerConfig,
) -> Result<u64> {
    let every = config.queue_sample_every.as_millis() as i64;
    Ok(store.sample_queue(tenants, now, 2 * every.max(1)).await?)
}

/// The holder's samples: every [`SchedulerConfig::queue_sample_every`]
/// while this node holds the wake, until shutdown.
pub(crate) async fn history_loop(
    inner: Arc<Inner>,
    holds: Arc<AtomicBool>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let config = inner.config.scheduler.clone();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(config.queue_sample_every) => {}
            _ = shutdown.changed() => {}
        }
        if crate::stopping(&shutdown) {
            return;
        }
        if !holds.load(Ordering::SeqCst) {
            continue;
        }
        let now = tok_store::now_ms();
        if let Err(e) = keep(&*inner.store, &inner.tenants(), now, &config).await {
            tracing::warn!(error = %e, "could not keep a sample of the queue; the charts miss a point");
        }
    }
}
