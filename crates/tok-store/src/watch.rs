//! What the scheduler watches for (DESIGN §10, stuck runs): waits whose
//! due time passed without their job being taken, jobs whose lease
//! expired again and again, runs past their
//! automation's `settings.runTimeout`, and the platform incidents it opens
//! for them, which only the platform admin reads.
//!
//! Times are Unix milliseconds of the caller's clock (see `schedule.rs`).

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tok_core::ids::{AutomationId, RunId, TenantId};

use crate::{Cause, NewIncident, NewInternalEvent, Result};

/// How often a job's lease may expire before the watch calls it stuck
/// (the partial index `jobs_lease_expired_repeatedly` holds the same 3).
pub const LEASE_EXPIRIES: i32 = 3;

/// A parked wait whose due time passed and whose job nobody holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverdueWait {
    pub run_id: RunId,
    pub path: String,
    pub due_at: i64,
}

/// A run whose job's lease expired again and again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiringJob {
    pub run_id: RunId,
    pub path: String,
    /// How often its lease expired before it was claimed again.
    pub lease_expiries: i32,
}

/// A queued, running or waiting run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnfinishedRun {
    pub id: RunId,
    pub created_at: i64,
}

/// A singleton key with runs queued on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingletonKey {
    pub tenant_id: TenantId,
    pub automation_id: AutomationId,
    pub key: String,
}

/// A queued run past its `start_by`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnstartedRun {
    pub tenant_id: TenantId,
    pub run_id: RunId,
    pub start_by: i64,
}

/// How [`WatchStore::fail_run`] fails a run: its error, and the tenant's
/// incident and the `run.failed` event a run failed by the decider gets.
#[derive(Debug, Clone)]
pub struct RunFailure {
    pub error: String,
    pub incident: Option<NewIncident>,
    pub event: Option<NewInternalEvent>,
    /// Who raises the event (the failed run).
    pub cause: Cause,
}

/// A platform incident to open: one per `source` while it is open.
#[derive(Debug, Clone)]
pub struct NewPlatformIncident {
    /// `run_timeout`, `wait_overdue`, `queue_stalled`.
    pub reason: &'static str,
    pub source: String,
    pub tenant_id: Option<TenantId>,
    pub run_id: Option<RunId>,
    pub title: String,
    pub detail: Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlatformIncident {
    pub id: String,
    pub reason: String,
    pub source: String,
    pub tenant_id: Option<String>,
    pub run_id: Option<String>,
    pub title: String,
    pub detail: Value,
    pub status: String,
    pub occurrences: i32,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub updated_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize_opt")]
    pub resolved_at: Option<i64>,
}

#[async_trait]
pub trait WatchStore: Send + Sync {
    /// Up to `limit` waits of the tenant due before `due_before` whose job
    /// no lease holds at `now`, earliest first.
    async fn overdue_waits(
        &self,
        tenant: &TenantId,
        due_before: i64,
        now: i64,
        limit: u32,
    ) -> Result<Vec<OverdueWait>>;

    /// Up to `limit` jobs of the tenant whose lease expired at least
    /// [`LEASE_EXPIRIES`] times (a worker died or hung on them each time).
    async fn leases_expired_repeatedly(
        &self,
        tenant: &TenantId,
        limit: u32,
    ) -> Result<Vec<ExpiringJob>>;

    /// Up to `limit` queued, running or waiting runs of the automation
    /// created before `created_before`, oldest first.
    async fn unfinished_runs(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
        created_before: i64,
        limit: u32,
    ) -> Result<Vec<UnfinishedRun>>;

    /// Up to `limit` runs of `tenants` still queued, never begun, past
    /// their `start_by` (`flow.startTimeout`) at `now`, earliest first.
    async fn unstarted_past(
        &self,
        tenants: &[TenantId],
        now: i64,
        limit: u32,
    ) -> Result<Vec<UnstartedRun>>;

    /// Ends a run no worker has begun `expired` with `error`, in one
    /// transaction: its jobs and waits go, the runs waiting on it learn it
    /// ended, its ticket's trace says so. False, and nothing written, when
    /// a worker claimed it first (it began) or it ended meanwhile.
    async fn expire_run(
        &self,
        tenant: &TenantId,
        run: &RunId,
        error: &str,
        now: i64,
    ) -> Result<bool>;

    /// Up to `limit` singleton keys (`flow.singleton` mode `queue`) of
    /// `tenants` whose run has ended while runs are queued on them.
    async fn singletons_to_release(
        &self,
        tenants: &[TenantId],
        limit: u32,
    ) -> Result<Vec<SingletonKey>>;

    /// Lets the oldest run queued on a singleton key go (its first job due
    /// now) and names it the key's run, under the key's lock as the
    /// dispatch takes it; none when the key's run is unfinished again or
    /// nothing is queued any more (then the key counts none). Returns the
    /// run let go.
    async fn release_singleton(&self, key: &SingletonKey) -> Result<Option<RunId>>;

    /// Fails a queued, running or waiting run from outside the decider
    /// (its `settings.runTimeout` passed, its definition no longer reads),
    /// all in one transaction: the run fails with `failure.error`, its job
    /// and waits go (a step in flight has its result discarded), the runs
    /// waiting on it learn it ended (as the decider's `NotifyParent` effect
    /// tells them), and `failure`'s incident and event are written. False,
    /// and nothing written, when the run had finished or was paused
    /// meanwhile.
    async fn fail_run(
        &self,
        tenant: &TenantId,
        run: &RunId,
        failure: RunFailure,
        now: i64,
    ) -> Result<bool>;

    /// Opens a platform incident, or counts one more occurrence of the open
    /// one of the same source; its id and whether it is new.
    async fn open_platform_incident(
        &self,
        incident: NewPlatformIncident,
        now: i64,
    ) -> Result<(String, bool)>;

    /// The newest platform incidents (`status`: `open`, `resolved`, or all).
    async fn platform_incidents(
        &self,
        status: Option<&str>,
        limit: u32,
        before: Option<&str>,
    ) -> Result<crate::Page<PlatformIncident>>;

    async fn resolve_platform_incident(&self, id: &str, now: i64) -> Result<bool>;
}
