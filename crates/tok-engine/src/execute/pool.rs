//! The worker pool: independent slots that each run one claimed job.
//!
//! Each round the pool claims as many jobs as it has free slots, in one
//! batch, and starts each in a task of its own without waiting for the
//! others, so a slow step never keeps a free slot idle. The reserved slots
//! ([`crate::fairness`]) are claimed for tenants holding no general slot
//! once the general ones run jobs. A dispatch may fill free slots directly
//! with the runs it creates ([`Offer`]). A heartbeat extends the leases of
//! the jobs in flight.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tok_core::ids::{JobId, TenantId};
use tok_store::ClaimedJob;
use tokio::sync::watch;
use tracing::Instrument as _;

use crate::Inner;
use crate::fairness::{Offer, Slots, reserved_slots};
use crate::registry::Lease;

pub(crate) fn slots(inner: &Inner) -> std::sync::MutexGuard<'_, Slots> {
    inner.slots.lock().unwrap_or_else(|e| e.into_inner())
}

/// The slots free now for a dispatch to fill (see [`Offer::new`]).
pub(crate) fn offer(inner: &Inner, limit: usize, all_reserved: bool) -> Option<Offer> {
    Offer::new(
        &mut slots(inner),
        inner.config.concurrency,
        limit,
        all_reserved,
    )
}

/// Starts the jobs a dispatch wrote claimed under `offer`, and frees what
/// it promised (jobs it did not write, or the dispatch failed).
pub(crate) fn accept(inner: &Arc<Inner>, offer: Offer, jobs: Vec<ClaimedJob>) {
    let reserved = offer.settle(&mut slots(inner), jobs.iter().map(|job| &job.tenant_id));
    for (job, reserved) in jobs.into_iter().zip(reserved) {
        start(inner, job, reserved);
    }
    inner.work.notify_one();
}

pub(crate) async fn run_pool(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    slots(&inner).open = true;
    // Aborted however the pool ends (a panic included): a pool started
    // again has one heartbeat, not two.
    let heartbeat = AbortOnDrop(tokio::spawn(heartbeat(inner.clone())));
    let concurrency = inner.config.concurrency.max(1);
    let reserved = reserved_slots(concurrency);
    let general = concurrency - reserved;
    loop {
        if crate::stopping(&shutdown) {
            break;
        }
        let (general_busy, reserved_busy) = slots(&inner).busy();
        let free = general.saturating_sub(general_busy);
        let tenants = inner.tenants();
        let mut claimed = 0;
        if free > 0 {
            claimed = claim_and_start(&inner, &tenants, free, false).await;
        }
        // The general slots are full of running jobs and more may be
        // waiting: tenants holding none of them may take the reserved ones.
        // (Slots promised to a dispatch in progress are not full: that
        // dispatch starts its runs in them or frees them.)
        let reserve_free = reserved.saturating_sub(reserved_busy);
        if claimed == free && reserve_free > 0 && slots(&inner).running_general() >= general {
            let newcomers: Vec<TenantId> = {
                let holding = slots(&inner).holding_general();
                tenants
                    .iter()
                    .filter(|t| !holding.contains(t))
                    .cloned()
                    .collect()
            };
            claim_and_start(&inner, &newcomers, reserve_free, true).await;
        }
        // A full batch means more may be ready: claim again as soon as a slot frees.
        if claimed > 0 && claimed == free {
            tokio::select! {
                _ = inner.work.notified() => {}
                _ = shutdown.changed() => {}
            }
        } else {
            tokio::select! {
                _ = inner.work.notified() => {}
                _ = tokio::time::sleep(inner.config.poll_interval) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    // Let the steps in flight finish and record; a step that outlives the
    // grace period is taken over by another worker when its lease expires.
    slots(&inner).open = false;
    let deadline = tokio::time::Instant::now() + inner.config.shutdown_grace;
    while !slots(&inner).idle() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(heartbeat);
    let left = slots(&inner).jobs.len();
    if left > 0 {
        // Their results will be discarded (the claim token no longer
        // matches): another worker runs them again now, not after a lease.
        match inner.store.release_claims(&inner.holder).await {
            Ok(released) => tracing::warn!(
                steps = left,
                released,
                grace = ?inner.config.shutdown_grace,
                "steps still running after the shutdown grace; their leases were released"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not release the leases of the steps still running; they expire by themselves")
            }
        }
    }
}

/// Claims up to `limit` jobs of `tenants` and starts each in its own task;
/// returns how many it claimed.
async fn claim_and_start(
    inner: &Arc<Inner>,
    tenants: &[TenantId],
    limit: usize,
    reserved: bool,
) -> usize {
    // A job still running here is never claimed again here, even when its
    // lease expired while the heartbeats failed: its slot is taken, and a
    // second execution would race the first to record.
    let running = slots(inner).job_ids();
    let jobs = match inner
        .store
        .claim_except(
            tenants,
            &inner.holder,
            limit as u32,
            inner.lease_ms(),
            &running,
        )
        .await
    {
        Ok(jobs) => {
            slots(inner).claim_failing = None;
            jobs
        }
        Err(e) => {
            slots(inner).claim_failing = Some(e.to_string());
            tracing::error!(error = %e, "claim failed; retrying shortly");
            tokio::time::sleep(Duration::from_secs(1)).await;
            return 0;
        }
    };
    let claimed = jobs.len();
    for job in jobs {
        start(inner, job, reserved);
    }
    claimed
}

/// Runs a job claimed for this pool in its own task, in a general or a
/// reserved slot.
fn start(inner: &Arc<Inner>, job: ClaimedJob, reserved: bool) {
    let claim = (job.id, job.claim_token.clone());
    {
        let mut slots = slots(inner);
        slots
            .jobs
            .insert(claim.clone(), (job.tenant_id.clone(), reserved));
        // Claimed a moment ago: its lease lasts about `lease_ms` from now.
        let until = Lease::known_until(tok_store::now_ms(), inner.lease_ms());
        slots.leases.insert(claim.clone(), Lease::until(until));
    }
    let inner = inner.clone();
    // One span per run's claim: every line the run's steps log carries it.
    let span = tracing::info_span!(
        "run",
        run = %job.run_id,
        tenant = %job.tenant_id,
        automation = %job.automation_id,
        "otel.name" = "claim",
    );
    if crate::traces::enabled() {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let trace = crate::traces::RunTrace::of(job.run_id.as_str(), &job.context);
        let _ = span.set_parent(trace.run_context());
    }
    tokio::spawn(
        async move {
            // Freed however the claim ends, a panic included: no slot is
            // lost and no lease heartbeated for a job nobody runs.
            let _slot = Slot {
                inner: &inner,
                claim,
            };
            let job_id = job.id;
            let executed = AssertUnwindSafe(super::runner::execute(&inner, job))
                .catch_unwind()
                .await;
            if let Err(panic) = executed {
                let panic = crate::panic_message(&*panic);
                tracing::error!(job = %job_id, %panic, "a claim panicked before its step began; the job returns after its lease");
            }
        }
        .instrument(span),
    );
}

/// The lease of a claim running here (always held for a claim this pool
/// does not know: a job run outside it).
pub(crate) fn lease_of(inner: &Inner, job: &ClaimedJob) -> Lease {
    slots(inner)
        .leases
        .get(&(job.id, job.claim_token.clone()))
        .cloned()
        .unwrap_or_default()
}

/// A claim's place in the slot map, freed when dropped.
struct Slot<'a> {
    inner: &'a Arc<Inner>,
    claim: (JobId, String),
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut slots = slots(self.inner);
        slots.jobs.remove(&self.claim);
        slots.leases.remove(&self.claim);
        drop(slots);
        self.inner.work.notify_one();
    }
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Extends the leases of the jobs in flight until the pool aborts it (after
/// the last step in flight has finished or the grace period ran out).
async fn heartbeat(inner: Arc<Inner>) {
    loop {
        tokio::time::sleep(inner.config.heartbeat).await;
        let claims = slots(&inner).claims();
        let asked_at = tok_store::now_ms();
        match inner
            .store
            .heartbeat(&inner.holder, &claims, inner.lease_ms())
            .await
        {
            Ok(extended) => {
                let slots = slots(&inner);
                for claim in claims.iter().filter(|(id, _)| extended.contains(id)) {
                    if let Some(lease) = slots.leases.get(claim) {
                        lease.extend_to(Lease::known_until(asked_at, inner.lease_ms()));
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, jobs = claims.len(), "heartbeat failed"),
        }
    }
}
