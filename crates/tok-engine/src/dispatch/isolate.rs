//! After a dispatch failed: finding the event at fault and setting it
//! aside, so that the events dispatched with it — of its tenant and of
//! others — go on (docs/reliability.md, "Events set aside").
//!
//! A dispatch is one transaction for a batch of events: one event whose
//! runs the database refuses, or whose planning fails, would fail the whole
//! batch, and the next batch (which takes the oldest events first) again,
//! for ever. So:
//!
//! - An event whose planning panicked is at fault: it is set aside at
//!   once, and the others stay pending for the next dispatch.
//! - A store error that is an outage ([`tok_store::StoreError::is_outage`]:
//!   the database away, busy, shutting down) is nobody's fault: the events
//!   stay pending, as they are, and the dispatcher tries again shortly.
//! - Any other store error: the batch's events are dispatched again one at
//!   a time, each in a transaction of its own. An event that fails alone
//!   with its data refused ([`tok_store::StoreError::is_refused_data`]) is
//!   set aside; so is one that fails alone with another error while other
//!   events of the batch went through alone (the failure is its own). When
//!   every event fails alone and none is refused data, the fault is not
//!   theirs: they stay pending.
//!
//! An event set aside is `failed` in the inbox, with its error (the events
//! API shows both); a replay dispatches it again.

use std::sync::Arc;

use tok_core::ids::{EventId, TenantId};
use tok_store::{InboxStore, Lane, StoreError};

use super::batch::{self, Dispatched, Failed, Failure, Select};
use crate::Inner;

/// Deals with a failed dispatch (see the module's doc); returns what the
/// dispatches of single events did, or the error that leaves its events
/// pending.
pub(super) async fn after_failure(
    inner: &Arc<Inner>,
    failed: Failed,
    lane: Lane,
) -> tok_store::Result<Dispatched> {
    let Failed { failure, events } = failed;
    match failure {
        Failure::Planning {
            tenant,
            event,
            message,
        } => {
            set_aside(inner, &tenant, &event, &planning_failed(&message)).await?;
            // The others are pending: the next dispatch goes at once.
            Ok(Dispatched {
                left: events.len().saturating_sub(1),
                ..Dispatched::default()
            })
        }
        Failure::Store(e) if e.is_outage() || events.is_empty() => Err(e),
        Failure::Store(e) => {
            tracing::warn!(error = %e, events = events.len(),
                "a dispatch failed; its events are dispatched again one by one");
            one_by_one(inner, events, lane, e).await
        }
    }
}

/// Dispatches each of `events` alone, then sets aside those at fault.
async fn one_by_one(
    inner: &Arc<Inner>,
    events: Vec<(TenantId, EventId)>,
    lane: Lane,
    batch_error: StoreError,
) -> tok_store::Result<Dispatched> {
    let store: &dyn InboxStore = &*inner.store;
    let planner = super::planner(inner);
    let may_begin = super::may_begin(inner);
    let mut total = Dispatched::default();
    let mut went = 0;
    let mut failures: Vec<(TenantId, EventId, StoreError)> = Vec::new();
    for (tenant, event) in &events {
        let tx = match store
            .begin_dispatch(std::slice::from_ref(tenant), lane)
            .await
        {
            Ok(tx) => tx,
            Err(e) => {
                tracing::warn!(error = %e, "the database went away while a failed dispatch was taken apart; its events stay pending");
                return Ok(total);
            }
        };
        let planned = crate::stream::Planned::default();
        let noted = |runs: &[_]| planned.note(runs);
        let deciders = batch::Deciders {
            planner: &planner,
            may_begin: &may_begin,
            noted: &noted,
            crowding: &inner.crowding,
        };
        let alone = batch::dispatch(tx, Select::One(tenant, event), false, &deciders, None).await;
        match alone {
            Ok(mut d) => {
                planned.publish(&inner.stream);
                went += d.events();
                total.received_at.append(&mut d.received_at);
                for (tenant, run) in std::mem::take(&mut d.ended) {
                    crate::traces::run_ended(inner.store.clone(), tenant, run);
                }
            }
            Err(Failed {
                failure:
                    Failure::Planning {
                        tenant,
                        event,
                        message,
                    },
                ..
            }) => {
                set_aside(inner, &tenant, &event, &planning_failed(&message)).await?;
            }
            Err(Failed {
                failure: Failure::Store(e),
                ..
            }) if e.is_outage() => {
                tracing::warn!(error = %e, "the database went away while a failed dispatch was taken apart; its events stay pending");
                return Ok(total);
            }
            Err(Failed {
                failure: Failure::Store(e),
                ..
            }) => failures.push((tenant.clone(), event.clone(), e)),
        }
    }
    let mut kept = None;
    for (tenant, event, e) in failures {
        if e.is_refused_data() || went > 0 {
            tracing::error!(tenant = %tenant, event = %event, error = %e,
                "an event's runs cannot be written; the event is set aside");
            set_aside(inner, &tenant, &event, &write_failed(&e)).await?;
        } else {
            kept.get_or_insert(e);
        }
    }
    match kept {
        // Every event failed alone, none for its data: not theirs.
        Some(e) if went == 0 => {
            tracing::error!(error = %batch_error, "a dispatch failed, and each of its events alone; they stay pending");
            Err(e)
        }
        _ => Ok(total),
    }
}

/// Marks the event failed with `error` (cut to a bounded length).
async fn set_aside(
    inner: &Inner,
    tenant: &TenantId,
    event: &EventId,
    error: &str,
) -> tok_store::Result<()> {
    let mut error = error.to_owned();
    tok_core::budget::bound_error(&mut error);
    if inner.store.set_aside(tenant, event, &error).await? {
        tracing::error!(tenant = %tenant, event = %event, %error, "event set aside");
    }
    Ok(())
}

/// What follows the reason in an event's error: what was done and what to do.
const SET_ASIDE: &str = "The event was set aside: no run was started for it, and the other events \
     went on. Replay it (POST /api/events/{id}/replay) once the cause is gone.";

/// The error of an event whose planning panicked.
fn planning_failed(message: &str) -> String {
    format!(
        "dispatch_failed: planning this event's runs failed (a fault in tok: {message}). {SET_ASIDE}"
    )
}

/// The error of an event whose runs could not be written (the database's
/// own words stay in the log, not in what the tenant reads).
fn write_failed(e: &StoreError) -> String {
    let why = match e {
        StoreError::Refused(message) => message.clone(),
        e if e.is_refused_data() => {
            "the database refused the runs this event starts as invalid data (a value too big \
             for its index, say)"
                .to_owned()
        }
        _ => "writing the runs this event starts failed, again when it was dispatched alone, \
              while the events dispatched with it went on"
            .to_owned(),
    };
    format!("dispatch_failed: {why}. {SET_ASIDE}")
}
