//! What the scheduler keeps (`docs/operations.md`, "The scheduler"): the
//! wake's lease and when each poll or schedule automation is due next.
//!
//! The wake runs on one node at a time: the node that holds the one row of
//! `scheduler_lease` and renews it each tick. A node that finds the row
//! expired takes it over, so a dead holder's successor starts within one
//! lease. The row's `incarnation` is the holder's process start: a node
//! restarted under the same id takes its own old row over at once.
//!
//! A tick's run is started once however many schedulers race for it: the
//! run's idempotency key is the automation's due time
//! ([`SchedulerWake::due`] hands it out), unique per automation in `runs`,
//! and [`ScheduleStore::advance`] moves the due time on only from the
//! value it was read at. Every time here is Unix milliseconds of the
//! caller's clock, so tests drive the scheduler without sleeping.
//!
//! Two traits: [`ScheduleStore`], whose every call is about one tenant's
//! schedule row and runs on its database (written once for every store
//! over `crate::sql::Route`: the routed store needs no code for it), and
//! [`SchedulerWake`], what the wake does over all tenants at once — its
//! lease, on the shared database, and the schedules it reads, which span
//! the databases of the routed store (each asked for its own tenants, in
//! `routed/wake.rs`).

use async_trait::async_trait;
use tok_core::ids::{AutomationId, RunId, TenantId};

use crate::{AutomationStatus, Result, RunStatus};

/// A poll or schedule automation whose schedule row is missing or was read
/// from an older version.
#[derive(Debug, Clone, PartialEq)]
pub struct StaleSchedule {
    pub tenant_id: TenantId,
    pub automation_id: AutomationId,
    /// The automation's current version.
    pub version: i32,
    /// The trigger the row was made from, if there is a row.
    pub spec: Option<String>,
}

/// A schedule row due at the time asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct DueTrigger {
    pub tenant_id: TenantId,
    pub automation_id: AutomationId,
    /// The version the row was read from (the run starts on the current one).
    pub version: i32,
    /// The trigger as saved (JSON text).
    pub spec: String,
    /// The due time: the tick this firing stands for.
    pub due_at: i64,
    pub status: AutomationStatus,
    /// The status of the last run fired, if that run still exists.
    pub last_run_status: Option<RunStatus>,
}

/// What the scheduler's wake does over all the tenants it serves: holds
/// its lease (one per cluster: on the shared database), and reads the
/// schedule rows to make and the rows due, however many tenants and
/// databases they are on.
#[async_trait]
pub trait SchedulerWake: Send + Sync {
    /// Takes or renews the wake's lease for `holder` (this process:
    /// `incarnation`) until `now + lease_ms`. True when the caller holds
    /// it now: it held it, the row was free or expired, or `holder`'s
    /// earlier incarnation held it.
    async fn hold_wake(
        &self,
        holder: &str,
        incarnation: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<bool>;

    /// Gives the lease up (a clean shutdown), if this incarnation holds it.
    async fn release_wake(&self, incarnation: &str) -> Result<()>;

    /// The poll and schedule automations of `tenants` whose schedule row
    /// is missing or older than their current version, and the automations
    /// whose rows no longer have such a trigger (to be removed), each with
    /// its tenant: two statements however many tenants are asked for (on
    /// each database).
    async fn stale_schedules(
        &self,
        tenants: &[TenantId],
    ) -> Result<(Vec<StaleSchedule>, Vec<(TenantId, AutomationId)>)>;

    /// Up to `limit` rows of `tenants` due at `now`, earliest first whoever
    /// their tenant: one statement however many tenants are asked for (on
    /// each database).
    async fn due(&self, tenants: &[TenantId], now: i64, limit: u32) -> Result<Vec<DueTrigger>>;
}

/// A tenant's schedule rows, on its database.
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Writes an automation's schedule row: `spec` and `version` as read,
    /// and `next_run_at`, or keeps the row's due time when `keep_due` (an
    /// edit that left the trigger as it was).
    async fn set_schedule(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
        version: i32,
        spec: &str,
        next_run_at: Option<i64>,
        keep_due: bool,
    ) -> Result<()>;

    async fn remove_schedule(&self, tenant: &TenantId, automation: &AutomationId) -> Result<()>;

    /// Moves a row's due time from `from` to `next`, recording `run` (when
    /// one was started) as its last; false when the row was not at `from`
    /// any more (another scheduler fired that tick first).
    async fn advance(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
        from: i64,
        next: Option<i64>,
        run: Option<&RunId>,
        now: i64,
    ) -> Result<bool>;

    /// When the automation is due next, if it is a poll or schedule
    /// automation the scheduler has seen.
    async fn next_run_at(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
    ) -> Result<Option<i64>>;
}

mod sql;
