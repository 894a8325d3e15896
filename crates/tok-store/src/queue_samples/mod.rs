//! The queue's health over time, per tenant: what the dashboard charts
//! over the last hour ("Queue health" in `docs/dashboard.md`). The node
//! holding the scheduler's wake writes one sample per tenant every
//! `TOK_QUEUE_SAMPLE_EVERY`, all tenants in one statement
//! ([`QueueSampling::sample_queue`]); the expiry deletes samples older
//! than [`QUEUE_SAMPLES_KEPT`].
//!
//! Two traits: [`QueueSampleStore`], whose every call is about one tenant
//! and runs on its database (written once for every store over
//! `crate::sql::Route`: the routed store needs no code for it), and
//! [`QueueSampling`], the writing of many tenants' samples at once, which
//! spans the databases of the routed store (each samples its own tenants,
//! in `routed/wake.rs`).
//!
//! Times are Unix milliseconds of the caller's clock (see `schedule.rs`),
//! except the jobs' states and ages, which are the database clock's, as in
//! [`QueueStore::queue_stats`](crate::QueueStore::queue_stats).

use std::time::Duration;

use async_trait::async_trait;
use tok_core::ids::TenantId;

use crate::Result;

/// How long samples are kept: a day, the longest the dashboard charts.
pub const QUEUE_SAMPLES_KEPT: Duration = Duration::from_secs(24 * 3600);

/// One tenant's queue at one moment, and the steps recorded since the
/// sample before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSample {
    /// When it was taken.
    pub at: i64,
    /// Jobs due and not leased.
    pub ready: i64,
    /// Jobs due later (retries, timers, waits) and not leased.
    pub scheduled: i64,
    /// Jobs a worker holds.
    pub running: i64,
    /// Events received and not yet dispatched.
    pub pending_events: i64,
    /// How long the oldest ready job has been due; `None`: none is ready.
    pub oldest_ready_ms: Option<i64>,
    /// Step attempts recorded completed in the window before `at`.
    pub steps_completed: i64,
    /// Step attempts recorded failed (for good or to be retried) in it.
    pub steps_failed: i64,
    /// The window's length: since the tenant's sample before, or the
    /// window the caller gave when there is none.
    pub window_ms: i64,
}

/// The writing of the queue's samples, by the node holding the scheduler's
/// wake, for all the tenants it serves at once.
#[async_trait]
pub trait QueueSampling: Send + Sync {
    /// Writes one sample at `at` for each of `tenants`, in one statement
    /// whatever their number (one per database): the queue now, and the
    /// step attempts recorded since the tenant's sample before (at most
    /// `window_ms` back; `window_ms` back when there is none). Returns how
    /// many rows it wrote (a tenant that has a sample at `at` already
    /// keeps it).
    async fn sample_queue(&self, tenants: &[TenantId], at: i64, window_ms: i64) -> Result<u64>;
}

/// A tenant's queue samples, on its database.
#[async_trait]
pub trait QueueSampleStore: Send + Sync {
    /// The tenant's samples taken at or after `since`, oldest first; the
    /// newest `limit` of them when there are more.
    async fn queue_samples(
        &self,
        tenant: &TenantId,
        since: i64,
        limit: u32,
    ) -> Result<Vec<QueueSample>>;

    /// Deletes at most `limit` of the tenant's samples taken before
    /// `before`; returns how many. The caller repeats while a batch comes
    /// back full.
    async fn expire_queue_samples(&self, tenant: &TenantId, before: i64, limit: u32)
    -> Result<u64>;
}

mod sql;
