//! The queue's gauges for `/metrics` (DESIGN §10, "Metrics"), sampled by
//! every node that runs the engine — holder of the wake or not, API or
//! worker-only — so each node's `/metrics` answers "is it keeping up" and
//! "is it busy or stuck" without an API node in front of it. The counters
//! and summaries (steps, runs, step and connector latency, inbox lag) are
//! counted where the work happens: see `docs/operations.md` for each
//! metric and the question it answers.

use std::sync::Arc;

use tok_store::QueueStats;

use crate::Inner;

/// Sets the queue's gauges from one sample.
pub fn record_queue_gauges(stats: &QueueStats) {
    metrics::gauge!("tok_queue_ready_jobs").set(stats.ready as f64);
    metrics::gauge!("tok_queue_scheduled_jobs").set(stats.scheduled as f64);
    metrics::gauge!("tok_queue_running_jobs").set(stats.running as f64);
    metrics::gauge!("tok_inbox_pending_events").set(stats.pending_events as f64);
    let oldest = stats.oldest_ready_ms.unwrap_or(0) as f64 / 1000.0;
    metrics::gauge!("tok_queue_oldest_ready_seconds").set(oldest);
}

/// Samples the queue every [`SchedulerConfig::sample_every`](super::SchedulerConfig::sample_every)
/// until shutdown.
pub(crate) async fn sample_loop(
    inner: Arc<Inner>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let every = inner.config.scheduler.sample_every;
    loop {
        match inner.store.queue_stats(&inner.tenants()).await {
            Ok(stats) => record_queue_gauges(&stats),
            Err(e) => tracing::warn!(error = %e, "could not sample the queue for the metrics"),
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
