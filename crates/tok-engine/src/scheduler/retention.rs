//! Retention (docs/operations.md, "Retention"): the scheduler's holder
//! expires each tenant's data past its retention
//! (`tenants.settings.retention`, [`tok_core::retention::Retention`]).
//!
//! One pass, in a task of its own so that it never delays a tick:
//!
//! 1. On PostgreSQL, the rows of months without a partition are moved out
//!    of the default partition into partitions of their own, a month per
//!    short transaction (`tok_store::partitions`), and then the monthly
//!    partitions of this month and the next two are created if missing. A
//!    month that cannot be moved (more rows than
//!    [`SchedulerConfig::partition_move_rows`](super::SchedulerConfig::partition_move_rows))
//!    or a partition that cannot be created is logged, raised as a
//!    `partition_not_created` platform incident and not tried again by
//!    this process; its rows stay in the default partition meanwhile and
//!    expire from there with the rest.
//! 2. For each expiring kind of row, whole monthly partitions every tenant
//!    is done with are dropped (PostgreSQL); a partition that still holds
//!    a tenant with a longer retention stays.
//! 3. What is left past each tenant's cutoff is deleted in batches of
//!    [`SchedulerConfig::expiry_batch`] rows, each its own short
//!    transaction, at most [`SchedulerConfig::expiry_batches`] per tenant
//!    and kind in a pass; a pass that stopped at that bound says so, and
//!    the next pass comes after a tick instead of an hour. On PostgreSQL a
//!    partitioned table expires by whole months: a tenant's cutoff there
//!    is the start of the month it falls in, so the batches only empty
//!    months a longer-retention tenant still keeps (and the default
//!    partition), never the current months a `DROP TABLE` will take.
//!    Idempotency keys past their window, the queue's samples older
//!    than a day ([`tok_store::QUEUE_SAMPLES_KEPT`]), the signals past
//!    both their lookback and the idempotency window and the platform's
//!    own audit rows past [`tok_store::PLATFORM_AUDIT_DAYS`] go the same
//!    way.
//! 4. On SQLite, freed pages are given back to the file system
//!    (`PRAGMA incremental_vacuum`), so the file shrinks.

use std::collections::BTreeMap;

use serde_json::json;
use tok_core::ids::TenantId;
use tok_core::retention::cutoff;
use tok_store::{Backend, Expiring, MovedRows, NewPlatformIncident, PartitionProblem};

use super::Scheduler;
use crate::Result;

/// Monthly partitions made ahead of the current month.
const MONTHS_AHEAD: u32 = 2;

/// Free pages SQLite gives back per pass: 64 MiB of 4 KiB pages, so one
/// pass never holds the writer for long; a larger backlog goes over
/// several passes.
const RECLAIM_PAGES: u32 = 16_384;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExpiryReport {
    /// Rows deleted by batches, by table.
    pub deleted: BTreeMap<&'static str, u64>,
    /// Monthly partitions dropped (PostgreSQL).
    pub dropped: Vec<String>,
    /// Months moved out of the default partition into partitions of their
    /// own (PostgreSQL).
    pub moved: Vec<MovedRows>,
    /// Partitions that could not be created in this pass (PostgreSQL).
    pub problems: Vec<PartitionProblem>,
    /// The SQLite file's page count after the pass (`None` on PostgreSQL).
    pub pages: Option<i64>,
    /// A batch bound was reached: more is left for the next pass.
    pub more: bool,
}

impl ExpiryReport {
    pub fn deleted(&self, table: &str) -> u64 {
        self.deleted.get(table).copied().unwrap_or(0)
    }

    fn did_something(&self) -> bool {
        !self.deleted.values().all(|n| *n == 0)
            || !self.dropped.is_empty()
            || !self.moved.is_empty()
    }
}

/// The start of the UTC month `ms` falls in.
fn month_start(ms: i64) -> i64 {
    let Ok(at) = jiff::Timestamp::from_millisecond(ms) else {
        return ms;
    };
    at.to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .first_of_month()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_or(ms, |z| z.timestamp().as_millisecond())
}

pub(super) async fn pass(scheduler: &Scheduler, tenants: &[TenantId]) -> Result<ExpiryReport> {
    let store = &scheduler.store;
    let now = scheduler.clock.now_ms();
    let config = &scheduler.config;
    let mut report = ExpiryReport::default();

    let mut skip = scheduler.failed_partitions();
    let (moved, not_moved) = store
        .move_default_rows(config.partition_move_rows, &skip)
        .await?;
    report.moved = moved;
    // A month whose rows could not be moved cannot be created either.
    skip.extend(not_moved.iter().map(|p| p.partition.clone()));
    let created = store.create_partitions(now, MONTHS_AHEAD, &skip).await?;
    for problem in not_moved.into_iter().chain(created) {
        tracing::error!(
            partition = %problem.partition,
            error = %problem.error,
            "a monthly partition could not be created; its month's rows go to the default \
             partition and expire from there by batched deletes; not tried again until restart"
        );
        let incident = NewPlatformIncident {
            reason: "partition_not_created",
            source: format!("partition_not_created:{}", problem.partition),
            tenant_id: None,
            run_id: None,
            title: format!(
                "Monthly partition {} could not be created; its rows go to the default partition",
                problem.partition
            ),
            detail: json!({ "partition": problem.partition, "error": problem.error }),
        };
        store.open_platform_incident(incident, now).await?;
        scheduler.partition_failed(&problem.partition);
        report.problems.push(problem);
    }

    let mut retentions = Vec::with_capacity(tenants.len());
    for tenant in tenants {
        if let Some(retention) = store.retention(tenant).await? {
            retentions.push((tenant.clone(), retention));
        }
    }
    let by_month = store.backend() == Backend::Postgres;
    for what in Expiring::ALL {
        let cutoffs: Vec<(TenantId, i64)> = retentions
            .iter()
            .map(|(tenant, r)| (tenant.clone(), cutoff(now, what.days(r))))
            .collect();
        // What a waiting run's steps changed of its context is kept in
        // their rows until the context is written whole: first that, and
        // the step rows of a tenant with more of it to do stay this pass.
        let mut unfinished = Vec::new();
        if what == Expiring::StepData {
            for (tenant, before) in &cutoffs {
                let mut batches = 0;
                loop {
                    let kept = match store
                        .keep_contexts_whole(tenant, *before, config.expiry_batch)
                        .await
                    {
                        Err(e) if super::skips(tenant, e.is_tenant_database_away()) => {
                            unfinished.push(tenant.clone());
                            break;
                        }
                        kept => kept?,
                    };
                    if kept < u64::from(config.expiry_batch) {
                        break;
                    }
                    batches += 1;
                    if batches >= config.expiry_batches {
                        unfinished.push(tenant.clone());
                        report.more = true;
                        break;
                    }
                }
            }
        }
        if unfinished.is_empty() {
            report
                .dropped
                .extend(store.drop_expired_partitions(what, &cutoffs).await?);
        }
        for (tenant, before) in &cutoffs {
            if unfinished.contains(tenant) {
                continue;
            }
            let before = if by_month && what.partitioned() {
                &month_start(*before)
            } else {
                before
            };
            let mut batches = 0;
            loop {
                let deleted = match store
                    .expire(tenant, what, *before, config.expiry_batch)
                    .await
                {
                    Err(e) if super::skips(tenant, e.is_tenant_database_away()) => break,
                    deleted => deleted?,
                };
                *report.deleted.entry(what.table()).or_default() += deleted;
                batches += 1;
                if deleted < u64::from(config.expiry_batch) {
                    break;
                }
                if batches >= config.expiry_batches {
                    report.more = true;
                    break;
                }
            }
        }
    }
    // Idempotency keys past their window deduplicate nothing any more, the
    // queue's samples are charted over a day at most, and a signal past
    // both its lookback and the window resumes and deduplicates nothing.
    let keys_before = now - tok_store::IDEMPOTENCY_WINDOW.as_millis() as i64;
    let samples_before = now - tok_store::QUEUE_SAMPLES_KEPT.as_millis() as i64;
    for (tenant, _) in &retentions {
        for table in ["event_keys", "queue_samples", "signals"] {
            let mut batches = 0;
            loop {
                let deleted = match match table {
                    "event_keys" => {
                        store
                            .expire_keys(tenant, keys_before, config.expiry_batch)
                            .await
                    }
                    "queue_samples" => {
                        store
                            .expire_queue_samples(tenant, samples_before, config.expiry_batch)
                            .await
                    }
                    _ => store.expire_signals(tenant, now, config.expiry_batch).await,
                } {
                    Err(e) if super::skips(tenant, e.is_tenant_database_away()) => break,
                    deleted => deleted?,
                };
                *report.deleted.entry(table).or_default() += deleted;
                batches += 1;
                if deleted < u64::from(config.expiry_batch) {
                    break;
                }
                if batches >= config.expiry_batches {
                    report.more = true;
                    break;
                }
            }
        }
    }
    // The platform's own audit rows (no tenant) are kept the default
    // `auditDays`.
    let platform_before = cutoff(now, tok_store::PLATFORM_AUDIT_DAYS);
    let mut batches = 0;
    loop {
        let deleted = store
            .expire_platform_audit(platform_before, config.expiry_batch)
            .await?;
        *report.deleted.entry("audit").or_default() += deleted;
        batches += 1;
        if deleted < u64::from(config.expiry_batch) {
            break;
        }
        if batches >= config.expiry_batches {
            report.more = true;
            break;
        }
    }
    report.pages = store.reclaim_space(RECLAIM_PAGES).await?;
    if report.did_something() {
        tracing::info!(
            deleted = ?report.deleted,
            dropped = ?report.dropped,
            moved = ?report.moved,
            more = report.more,
            "expired data past its retention"
        );
    }
    Ok(report)
}
