//! Expiry of old data ([`RetentionStore`], `docs/operations.md`,
//! "Retention"): each tenant's retention setting, the batched deletes that
//! expire a tenant's rows, and what only one backend has — PostgreSQL's
//! monthly partitions (created ahead, dropped whole once expired) and
//! SQLite's `incremental_vacuum` that gives freed pages back.
//!
//! The scheduler's holder drives it (`tok_engine::scheduler::retention`):
//! partitions first, so a month every tenant is done with goes as one
//! `DROP TABLE`, then bounded batches of deletes for what is left — the
//! rows of tenants with a shorter retention in a partition that still
//! holds a tenant with a longer one, and every expired row on SQLite.
//!
//! The trait is implemented once for both databases' stores (`sql.rs`);
//! what only one of them does is in `postgres.rs` and `sqlite.rs`. The
//! routed store implements it itself (`routed/mod.rs`): its tenants'
//! settings and audit log are on the shared database, and every database
//! has its own partitions.

mod postgres;
pub(crate) mod sql;
mod sqlite;

use async_trait::async_trait;
use tok_core::ids::TenantId;
use tok_core::retention::Retention;

use crate::Result;

/// What expires, each by its own time column and retention setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Expiring {
    /// `run_steps` by `created_at` (`stepDataDays`); partitioned on PostgreSQL.
    StepData,
    /// Finished `runs` by `finished_at` (`runsDays`); unfinished runs stay.
    Runs,
    /// `ticket_trace` by `at` (`traceDays`); partitioned on PostgreSQL.
    Trace,
    /// Dispatched `event_inbox` rows by `received_at` (`inboxDays`);
    /// pending events stay. Partitioned on PostgreSQL.
    Inbox,
    /// Effects once's stored results (`step_effects`) by `created_at`,
    /// with the step data (`stepDataDays`).
    Effects,
    /// A tenant's `audit` rows by `at` (`auditDays`); partitioned on
    /// PostgreSQL. The platform's own rows (no tenant) expire by
    /// [`AuditStore::expire_platform_audit`](crate::AuditStore::expire_platform_audit).
    Audit,
    /// Start controls' key rows (`flow_keys`) no event touched for as long
    /// as finished runs are kept (`runsDays`).
    FlowKeys,
    /// `flow.cancelOn`'s rows of runs (`run_cancels`) by `created_at`, as
    /// long as finished runs are kept (`runsDays`).
    RunCancels,
}

impl Expiring {
    pub const ALL: [Expiring; 8] = [
        Self::StepData,
        Self::Runs,
        Self::Trace,
        Self::Inbox,
        Self::Effects,
        Self::Audit,
        Self::FlowKeys,
        Self::RunCancels,
    ];

    /// The table its rows are in.
    pub fn table(self) -> &'static str {
        match self {
            Self::StepData => "run_steps",
            Self::Runs => "runs",
            Self::Trace => "ticket_trace",
            Self::Inbox => "event_inbox",
            Self::Effects => "step_effects",
            Self::Audit => "audit",
            Self::FlowKeys => "flow_keys",
            Self::RunCancels => "run_cancels",
        }
    }

    /// How many days a tenant keeps these rows.
    pub fn days(self, retention: &Retention) -> u32 {
        match self {
            Self::StepData | Self::Effects => retention.step_data_days,
            Self::Runs | Self::FlowKeys | Self::RunCancels => retention.runs_days,
            Self::Trace => retention.trace_days,
            Self::Inbox => retention.inbox_days,
            Self::Audit => retention.audit_days,
        }
    }

    /// Whether PostgreSQL keeps the table in monthly partitions.
    pub fn partitioned(self) -> bool {
        matches!(
            self,
            Self::StepData | Self::Trace | Self::Inbox | Self::Audit
        )
    }
}

/// The tables PostgreSQL keeps in monthly partitions.
pub const PARTITIONED: [&str; 4] = ["run_steps", "ticket_trace", "event_inbox", "audit"];

/// The column a partitioned table is split by months of.
pub fn partition_key(table: &str) -> &'static str {
    match table {
        "run_steps" => "created_at",
        "ticket_trace" | "audit" => "at",
        _ => "received_at",
    }
}

/// A month's rows moved out of the default partition into a partition of
/// their own (PostgreSQL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedRows {
    pub partition: String,
    pub rows: u64,
}

/// A monthly partition that could not be created (PostgreSQL): its rows go
/// to the table's default partition meanwhile, and expire from there by
/// batched deletes. Typically the default partition already holds rows of
/// that month (a clock that ran past the partitions made ahead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionProblem {
    pub partition: String,
    pub error: String,
}

/// Expiry of old data.
#[async_trait]
pub trait RetentionStore: Send + Sync {
    /// The tenant's retention (the defaults where the setting says
    /// nothing); `None` when there is no such tenant.
    async fn retention(&self, tenant: &TenantId) -> Result<Option<Retention>>;

    /// Replaces the tenant's retention setting (`settings.retention`),
    /// leaving its other settings as they are; false when there is no such
    /// tenant.
    async fn set_retention(&self, tenant: &TenantId, retention: &Retention) -> Result<bool>;

    /// Deletes at most `limit` of the tenant's rows of `what` from before
    /// `before_ms`, in one short transaction; returns how many. The caller
    /// repeats while a batch comes back full.
    async fn expire(
        &self,
        tenant: &TenantId,
        what: Expiring,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64>;

    /// Writes whole the context of at most `limit` of the tenant's runs
    /// whose changes in step rows began before `before_ms` (give or take
    /// the clocks' skew), in one short transaction; returns how many. The
    /// caller repeats while a batch comes back full, before it expires step
    /// rows from before `before_ms`: a run that waits longer than its
    /// tenant keeps step data must not lose what its steps changed of its
    /// context with them (`record/contexts.rs`). A run whose record is being
    /// written is left for the next pass.
    async fn keep_contexts_whole(
        &self,
        tenant: &TenantId,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64>;

    /// Deletes at most `limit` of the tenant's idempotency keys
    /// (`event_keys`) taken before `before_ms`, in one short transaction;
    /// returns how many. A key older than the idempotency window no longer
    /// deduplicates anything.
    async fn expire_keys(&self, tenant: &TenantId, before_ms: i64, limit: u32) -> Result<u64>;

    /// Deletes at most `limit` of the tenant's signals past both their
    /// lookback (`expires_at`) and the idempotency window
    /// ([`crate::IDEMPOTENCY_WINDOW`]) at `now_ms`, in one short
    /// transaction; returns how many. Such a signal resumes no wait and
    /// deduplicates no send any more.
    async fn expire_signals(&self, tenant: &TenantId, now_ms: i64, limit: u32) -> Result<u64>;

    /// PostgreSQL: drops each monthly partition of `what` that ends at or
    /// before the latest of `cutoffs` and holds no row of a tenant whose
    /// cutoff is after the partition's end (nor, of the inbox, a pending
    /// event; nor, of the audit log, a row of the platform's own) (a
    /// partition still holding a
    /// tenant with a longer retention stays, and its other rows go by
    /// [`expire`](Self::expire)). `cutoffs` has every tenant's. Returns the
    /// partitions dropped; a drop that would wait on a lock is given up
    /// and tried at the next pass. SQLite has no partitions: none.
    async fn drop_expired_partitions(
        &self,
        what: Expiring,
        cutoffs: &[(TenantId, i64)],
    ) -> Result<Vec<String>> {
        let _ = (what, cutoffs);
        Ok(Vec::new())
    }

    /// PostgreSQL: creates the monthly partitions of the month of `now_ms`
    /// and `ahead` months after it, each on its own, except those named in
    /// `skip` (ones that failed before: not tried again and again); returns
    /// those that could not be created (see [`PartitionProblem`]). SQLite:
    /// none.
    async fn create_partitions(
        &self,
        now_ms: i64,
        ahead: u32,
        skip: &[String],
    ) -> Result<Vec<PartitionProblem>> {
        let _ = (now_ms, ahead, skip);
        Ok(Vec::new())
    }

    /// PostgreSQL: moves the rows of each month that has no partition out
    /// of the default partition into a partition of that month, one month
    /// per transaction, a month of at most `max_rows` rows (one with more
    /// is reported, not moved), except the partitions named in `skip`.
    /// Returns the partitions made so and the months that could not be
    /// moved. SQLite: none.
    async fn move_default_rows(
        &self,
        max_rows: u64,
        skip: &[String],
    ) -> Result<(Vec<MovedRows>, Vec<PartitionProblem>)> {
        let _ = (max_rows, skip);
        Ok((Vec::new(), Vec::new()))
    }

    /// SQLite: gives up to `pages` free pages back to the file system
    /// (`PRAGMA incremental_vacuum`) and returns the file's page count
    /// after; `None` where there is nothing to give back this way
    /// (PostgreSQL; a SQLite file made without incremental auto-vacuum).
    async fn reclaim_space(&self, pages: u32) -> Result<Option<i64>> {
        let _ = pages;
        Ok(None)
    }
}
