//! Stuck runs (docs/operations.md, "Stuck runs"): the scheduler looks for
//! what should have moved and did not, and opens a platform incident per
//! cause (admin only; one while it is open, later sightings count as
//! occurrences):
//!
//! - `wait_overdue`: a wait whose due time passed [`WAIT_OVERDUE`] ago and
//!   whose job nobody has taken;
//! - `lease_expired_repeatedly`: a job whose lease expired three times
//!   (each time a worker died or hung on it, and another took it over);
//! - `queue_stalled`: the oldest ready job older than [`QUEUE_STALLED`]
//!   while this node's workers have free slots;
//! - `run_timeout`: a run unfinished past its automation's
//!   `settings.runTimeout` (or, without one, the platform's
//!   `TOK_RUN_TIMEOUT`), which is then failed like a run the decider
//!   fails (the tenant's incident, `run.failed`, its parent told:
//!   [`crate::failure`]).
//!
//! A look also says `unknown` of the audit rows left `pending` past
//! [`tok_store::AUDIT_PENDING_GRACE_MS`]: the API wrote them before a
//! change, and their process stopped before it said how the change ended
//! (docs/security.md, "Audit").
//!
//! And at every wake, [`expire_unstarted`] ends `expired` the runs no
//! worker began within their automation's `flow.startTimeout`, and
//! [`release_singletons`] lets a queued singleton run go when the run
//! ahead of it has ended.

use std::time::Duration;

use serde_json::json;
use tok_core::ids::TenantId;
use tok_store::{NewPlatformIncident, Store};

use super::{Scheduler, WakeReport};
use crate::Result;

/// How long past its due time a wait may stay untaken.
pub const WAIT_OVERDUE: Duration = Duration::from_secs(60);

/// How old the oldest ready job may grow while workers are free.
pub const QUEUE_STALLED: Duration = Duration::from_secs(5 * 60);

/// Runs a look finds per tenant and kind at most; the rest are found at
/// the next look.
const PER_LOOK: u32 = 100;

/// Pending audit rows a look resolves at most.
const PENDING_AUDIT_PER_LOOK: u32 = 1000;

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

async fn open(store: &dyn Store, incident: NewPlatformIncident, now: i64) -> Result<()> {
    let (id, new) = store.open_platform_incident(incident.clone(), now).await?;
    if new {
        tracing::warn!(incident = %id, reason = incident.reason, source = %incident.source, "{}", incident.title);
    }
    Ok(())
}

/// One look over `tenants`.
pub(super) async fn look(
    scheduler: &Scheduler,
    tenants: &[TenantId],
    report: &mut WakeReport,
) -> Result<()> {
    let store = &*scheduler.store;
    let now = scheduler.clock.now_ms();
    let unknown = store
        .resolve_pending_audit(
            now - tok_store::AUDIT_PENDING_GRACE_MS,
            PENDING_AUDIT_PER_LOOK,
        )
        .await?;
    if unknown > 0 {
        tracing::warn!(
            rows = unknown,
            "audit rows of changes whose process stopped before it said how they ended are now `unknown`"
        );
    }
    for tenant in tenants {
        match look_at(scheduler, tenant, now, report).await {
            Err(e) if !super::skips(tenant, e.is_tenant_database_away()) => return Err(e),
            _ => {}
        }
    }
    if let Some(free) = &scheduler.free_slots
        && free() > 0
    {
        let stats = store.queue_stats(tenants).await?;
        if let Some(age) = stats.oldest_ready_ms.filter(|age| *age > ms(QUEUE_STALLED)) {
            report.stuck += 1;
            let incident = NewPlatformIncident {
                reason: "queue_stalled",
                source: "queue_stalled".into(),
                tenant_id: None,
                run_id: None,
                title: format!(
                    "The oldest ready job has waited {} s while workers have free slots",
                    age / 1000
                ),
                detail: json!({ "oldest_ready_ms": age, "ready": stats.ready, "node": scheduler.node }),
            };
            open(store, incident, now).await?;
        }
    }
    Ok(())
}

/// One tenant's part of a look: its overdue waits, its leases that
/// expired again and again, its runs past their timeout.
async fn look_at(
    scheduler: &Scheduler,
    tenant: &TenantId,
    now: i64,
    report: &mut WakeReport,
) -> Result<()> {
    let store = &*scheduler.store;
    for wait in store
        .overdue_waits(tenant, now - ms(WAIT_OVERDUE), now, PER_LOOK)
        .await?
    {
        report.stuck += 1;
        let incident = NewPlatformIncident {
            reason: "wait_overdue",
            source: format!("wait_overdue:{}", wait.run_id),
            tenant_id: Some(tenant.clone()),
            run_id: Some(wait.run_id.clone()),
            title: format!(
                "A wait of run {} was due {} s ago and has not been resumed",
                wait.run_id,
                (now - wait.due_at) / 1000
            ),
            detail: json!({ "path": wait.path, "due_at": tok_store::rfc3339::format(wait.due_at) }),
        };
        open(store, incident, now).await?;
    }
    for job in store.leases_expired_repeatedly(tenant, PER_LOOK).await? {
        report.stuck += 1;
        let incident = NewPlatformIncident {
            reason: "lease_expired_repeatedly",
            source: format!("lease_expired_repeatedly:{}", job.run_id),
            tenant_id: Some(tenant.clone()),
            run_id: Some(job.run_id.clone()),
            title: format!(
                "The lease on run {} expired {} times: a worker died or hung on it each time",
                job.run_id, job.lease_expiries
            ),
            detail: json!({ "path": job.path, "lease_expiries": job.lease_expiries }),
        };
        open(store, incident, now).await?;
    }
    time_out_runs(scheduler, tenant, now, report).await?;
    Ok(())
}

/// Runs one wake expires at most; the rest at the next.
const EXPIRED_PER_WAKE: u32 = 500;

/// Ends `expired` the runs of `tenants` that no worker began by their
/// `flow.startTimeout` (every wake: one read of an index that holds only
/// queued runs with a deadline). Returns how many.
pub(super) async fn expire_unstarted(scheduler: &Scheduler, tenants: &[TenantId]) -> Result<usize> {
    let store = &*scheduler.store;
    let now = scheduler.clock.now_ms();
    let mut expired = 0;
    for run in store.unstarted_past(tenants, now, EXPIRED_PER_WAKE).await? {
        let error = format!(
            "expired: not started by {} (flow.startTimeout)",
            tok_store::rfc3339::format(run.start_by)
        );
        if store
            .expire_run(&run.tenant_id, &run.run_id, &error, now)
            .await?
        {
            tracing::info!(tenant = %run.tenant_id, run = %run.run_id, "run expired before it started");
            metrics::counter!("tok_runs_finished_total", "status" => "expired").increment(1);
            expired += 1;
        }
    }
    Ok(expired)
}

/// Lets the next queued run of every singleton key (`flow.singleton` mode
/// `queue`) whose run has ended go, at every wake (one read of an index of
/// the keys with runs queued). Returns how many went.
pub(super) async fn release_singletons(
    scheduler: &Scheduler,
    tenants: &[TenantId],
) -> Result<usize> {
    let store = &*scheduler.store;
    let mut released = 0;
    for key in store
        .singletons_to_release(tenants, EXPIRED_PER_WAKE)
        .await?
    {
        if let Some(run) = store.release_singleton(&key).await? {
            tracing::debug!(tenant = %key.tenant_id, run = %run, "queued singleton run released");
            released += 1;
        }
    }
    Ok(released)
}

/// Fails the tenant's runs past their automation's `settings.runTimeout`,
/// or the platform's for an automation without one.
async fn time_out_runs(
    scheduler: &Scheduler,
    tenant: &TenantId,
    now: i64,
    report: &mut WakeReport,
) -> Result<()> {
    let store = &*scheduler.store;
    for row in store.automations(tenant).await? {
        let automation = scheduler
            .defs
            .parse(tenant, &row.id, row.version, &row.definition)?;
        let (limit, whose) = match (
            automation.settings.run_timeout,
            scheduler.config.run_timeout,
        ) {
            (Some(own), _) => (own, "settings.runTimeout"),
            (None, Some(platform)) => (platform, "TOK_RUN_TIMEOUT"),
            (None, None) => continue,
        };
        for run in store
            .unfinished_runs(tenant, &row.id, now - ms(limit), PER_LOOK)
            .await?
        {
            let limit_text = tok_core::duration::format_duration(limit);
            let error =
                format!("run_timeout: the run did not finish within {limit_text} ({whose})");
            if !crate::failure::fail_run(
                store,
                tenant,
                &run.id,
                &row.name,
                error,
                crate::failure::Why::TimedOut,
                now,
            )
            .await?
            {
                continue;
            }
            report.stuck += 1;
            let incident = NewPlatformIncident {
                reason: "run_timeout",
                source: format!("run_timeout:{}", run.id),
                tenant_id: Some(tenant.clone()),
                run_id: Some(run.id.clone()),
                title: format!(
                    "Run {} of \u{201c}{}\u{201d} passed its timeout of {limit_text} and was failed",
                    run.id, row.name
                ),
                detail: json!({ "automation_id": row.id, "created_at": tok_store::rfc3339::format(run.created_at) }),
            };
            open(store, incident, now).await?;
        }
    }
    Ok(())
}
