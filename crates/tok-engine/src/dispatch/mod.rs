//! The dispatch phase: inbox rows become runs and their first jobs.
//!
//! The bulk loop takes every tenant's pending events in turn. While one
//! tenant's backlog fills its dispatches ([`crate::fairness::Backlog`]), an
//! urgent loop takes the other tenants' new events apart, in the writer's
//! urgent lane. Each dispatch may start the runs it creates in this
//! process's free slots at once ([`crate::fairness::Offer`]). [`batch`]
//! makes one dispatch transaction of the store's mechanisms; [`plan`]
//! decides the runs, purely. A dispatch that fails for a reason of one of
//! its events does not fail again and again for all of them: [`isolate`]
//! takes its events one by one and sets the one at fault aside. A manual
//! or scheduled start of an automation with a start control is dispatched
//! by [`start`], through the same gate, at once.

mod batch;
mod gate;
mod isolate;
pub mod plan;
pub mod start;

use std::sync::Arc;
use std::time::Duration;

use tok_core::ids::TenantId;
use tok_store::{InboxStore, Lane};
use tokio::sync::watch;

pub use batch::Dispatched;

use crate::execute::pool;
use crate::{Inner, stopping};

/// Describes the dispatch's summary to the recorder: its `# HELP` in
/// `/metrics`.
pub(crate) fn describe() {
    metrics::describe_histogram!(
        "tok_inbox_lag_seconds",
        metrics::Unit::Seconds,
        "From an event's acceptance to its dispatch into runs, per event"
    );
}

/// One dispatch transaction of `tenants`' events in `lane`, the new runs'
/// jobs handed to this process's free slots: between `least` events and
/// four times as many while as many slots are free. Returns what it did
/// and the batch it asked for.
async fn dispatch_once(
    inner: &Arc<Inner>,
    tenants: &[TenantId],
    lane: Lane,
    least: u32,
    all_reserved: bool,
) -> tok_store::Result<(Dispatched, u32)> {
    if tenants.is_empty() {
        return Ok((Dispatched::default(), least));
    }
    let store: &dyn InboxStore = &*inner.store;
    let planned = crate::stream::Planned::default();
    let planner = planner(inner);
    let may_begin = may_begin(inner);
    let most = 4 * least;
    let mut offer = pool::offer(inner, most as usize, all_reserved);
    let size = offer
        .as_ref()
        .map_or(least, |o| (o.free() as u32).clamp(least, most));
    let mut take = |tenant: &TenantId| offer.as_mut().is_some_and(|o| o.take(tenant));
    let handoff = batch::Handoff {
        node: &inner.holder,
        lease_ms: inner.lease_ms(),
        take: &mut take,
    };
    let mut dispatched = match store.begin_dispatch(tenants, lane).await {
        Ok(tx) => {
            let bulk = lane == Lane::Bulk;
            let noted = |runs: &[_]| planned.note(runs);
            let deciders = batch::Deciders {
                planner: &planner,
                may_begin: &may_begin,
                noted: &noted,
                crowding: &inner.crowding,
            };
            let select = batch::Select::Batch(size);
            batch::dispatch(tx, select, bulk, &deciders, Some(handoff)).await
        }
        Err(e) => Err(batch::Failed {
            failure: batch::Failure::Store(e),
            events: Vec::new(),
        }),
    };
    let claimed = match &mut dispatched {
        Ok(d) => {
            // Before the handed-off jobs run: their steps come after.
            planned.publish(&inner.stream);
            record_lag(d);
            for (tenant, run) in std::mem::take(&mut d.ended) {
                crate::traces::run_ended(inner.store.clone(), tenant, run);
            }
            std::mem::take(&mut d.claimed)
        }
        Err(_) => Vec::new(),
    };
    if let Some(offer) = offer {
        pool::accept(inner, offer, claimed);
    }
    let dispatched = match dispatched {
        Ok(dispatched) => dispatched,
        Err(failed) => {
            let d = isolate::after_failure(inner, failed, lane).await?;
            record_lag(&d);
            d
        }
    };
    if dispatched.events() > 0 {
        inner.work.notify_one();
    }
    Ok((dispatched, size))
}

/// The dispatcher's planner: [`plan::plan`] with the engine's definitions,
/// registry and fairness.
fn planner(
    inner: &Inner,
) -> impl Fn(&tok_store::PendingEvent, &[tok_store::Candidate], bool) -> tok_store::Plan + Send + Sync + '_
{
    move |event, candidates, may_begin| {
        plan::plan(
            event,
            candidates,
            &inner.defs,
            &inner.registry,
            &inner.config.fairness,
            may_begin,
        )
    }
}

/// Whether a tenant's new runs may begin their leading control steps at
/// dispatch: only when the authorizer lets its runs go on
/// ([`crate::authorize::check_tenant`]); otherwise a claim fails them.
fn may_begin(
    inner: &Inner,
) -> impl Fn(TenantId) -> futures_util::future::BoxFuture<'static, bool> + Send + Sync + use<> {
    let authorizer = Arc::clone(&inner.authorizer);
    move |tenant| {
        let authorizer = Arc::clone(&authorizer);
        Box::pin(async move {
            crate::authorize::check_tenant(&*authorizer, &tenant)
                .await
                .is_ok()
        })
    }
}

/// The inbox lag of the events a dispatch took.
fn record_lag(d: &Dispatched) {
    let now = tok_store::now_ms();
    for received_at in &d.received_at {
        let lag = (now - received_at).max(0) as f64 / 1000.0;
        metrics::histogram!("tok_inbox_lag_seconds").record(lag);
    }
}

pub(crate) async fn dispatch_loop(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let least = inner.config.dispatch_batch.max(1);
    loop {
        if stopping(&shutdown) {
            return;
        }
        let tenants = inner.tenants();
        // While a backlog fills the dispatches, half the reserved slots
        // are kept for the urgent dispatcher's runs (the backlog's tenant
        // holds general slots and may not take them anyway).
        let reserved = !inner.backlog().active();
        match dispatch_once(&inner, &tenants, Lane::Bulk, least, reserved).await {
            Ok((d, batch)) => {
                let full = d.events() == batch as usize || d.left > 0;
                inner.backlog().bulk_found(d.backlog);
                if full {
                    continue;
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "dispatch failed; retrying shortly");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        tokio::select! {
            _ = inner.inbox.notified() => {}
            _ = tokio::time::sleep(inner.config.poll_interval) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Dispatches the new events of tenants other than the one whose backlog
/// fills the bulk dispatches, apart and in the urgent lane.
pub(crate) async fn urgent_dispatch_loop(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let least = inner.config.dispatch_batch.max(1);
    loop {
        tokio::select! {
            _ = inner.urgent.notified() => {}
            _ = shutdown.changed() => {}
        }
        loop {
            if stopping(&shutdown) {
                return;
            }
            let tenants: Vec<TenantId> = inner.backlog().waiting.drain().collect();
            if tenants.is_empty() {
                break;
            }
            match dispatch_once(&inner, &tenants, Lane::Urgent, least, true).await {
                Ok((d, batch)) if d.events() == batch as usize => {
                    inner.backlog().urgent_full(tenants, d.backlog);
                }
                Ok(_) => {}
                Err(e) => {
                    // The bulk dispatches take these events in turn.
                    tracing::warn!(error = %e, "urgent dispatch failed");
                }
            }
        }
    }
}
