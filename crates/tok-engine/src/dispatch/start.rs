//! Starts that are not a source's events — a manual start, a schedule's
//! or a poll's tick — of an automation with a start control
//! (`flow.debounce`, `throttle`, `batch`, `singleton`). The start is
//! written as an event of its automation and dispatched at once, in the
//! same transaction, through the dispatch a webhook's event goes through
//! ([`super::batch`], [`super::gate`]): every control decides on every
//! start the same way, and the start answers what it decided — its own
//! run (held, queued or `skipped`), or the open run it joined. Nothing of
//! it is written when the transaction fails: the caller is told, and no
//! other dispatch ever sees the event. (docs/workflows.md, "Flow control".)

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;
use tok_core::definition::Automation;
use tok_core::ids::{RunId, TenantId};
use tok_core::run::FlowStart;
use tok_core::start::Control;
use tok_store::{InboxStore, Lane, NewEvent, NewRun, Plan, Result, StoreError};

use super::batch::{self, Deciders, Failure, Select};
use crate::fairness::Crowding;

/// What a start through its automation's start control became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gated {
    /// A run of its own: started, held until its control lets it go,
    /// queued behind its key's run, or written `skipped`.
    Run(RunId),
    /// It joined the key's open run (a debounce's or a batch's).
    Joined(RunId),
    /// Its automation was no longer active when it was dispatched.
    NotStarted,
}

impl Gated {
    /// The run the start answers with: its own, or the one it joined.
    pub fn run(&self) -> Option<&RunId> {
        match self {
            Gated::Run(run) | Gated::Joined(run) => Some(run),
            Gated::NotStarted => None,
        }
    }
}

/// Starts `run` of `automation` (which has a start control), for `event`,
/// through the control: see the module doc. A repeated idempotency key
/// answers the run its first start wrote. `planned` is told the run as it
/// is written (its status: queued, held, skipped), for the live stream.
pub(crate) async fn through_controls(
    store: &dyn InboxStore,
    tenant: &TenantId,
    event: NewEvent,
    mut run: NewRun,
    automation: &Automation,
    planned: Option<&crate::stream::Planned>,
) -> Result<Gated> {
    let Some(control) = automation.flow.control() else {
        return Err(StoreError::Invariant(
            "a start through its automation's start control needs one (flow)".into(),
        ));
    };
    if let Some(key) = &run.idempotency_key
        && let Some(existing) = store
            .run_by_idempotency_key(tenant, &run.automation_id, key)
            .await?
    {
        return Ok(Gated::Run(existing));
    }
    let (key, why) = control.key(&run.context);
    if let Some(why) = why {
        tracing::warn!(automation = %run.automation_id, "{why}");
    }
    if let Control::Batch(_) = control {
        // A batch's run has its events' bodies, this start's input first.
        run.context["_events"] = json!([event.payload]);
    }
    let start = FlowStart {
        run_id: run.id.clone(),
        flow: automation.flow.clone(),
        key,
    };
    let own = run.id.clone();
    let own = &own;
    let idempotency_key = run.idempotency_key.clone();
    let automation_id = run.automation_id.clone();
    let planner = move |_: &tok_store::PendingEvent, candidates: &[tok_store::Candidate], _| {
        // No candidate: the automation was paused or deleted meanwhile.
        if candidates.is_empty() {
            return Plan::default();
        }
        Plan {
            runs: vec![run.clone()],
            notes: Vec::new(),
            flow: vec![start.clone()],
        }
    };
    // The planner begins nothing at dispatch (its run's first step is left
    // to a claim), so whether the tenant's runs may begin is not asked.
    let may_begin =
        |_| -> futures_util::future::BoxFuture<'static, bool> { Box::pin(async { false }) };
    let written = AtomicBool::new(false);
    let noted = |runs: &[(TenantId, tok_core::ids::EventId, NewRun)]| {
        if runs.iter().any(|(_, _, run)| &run.id == own) {
            written.store(true, Ordering::Relaxed);
        }
        if let Some(planned) = planned {
            planned.note(runs);
        }
    };
    let crowding = Mutex::new(Crowding::default());
    let deciders = Deciders {
        planner: &planner,
        may_begin: &may_begin,
        noted: &noted,
        crowding: &crowding,
    };
    let tenants = [tenant.clone()];
    let mut tx = store.begin_dispatch(&tenants, Lane::Urgent).await?;
    let event = tx.accept(tenant, &event).await?;
    match batch::dispatch(tx, Select::One(tenant, &event), false, &deciders, None).await {
        Ok(dispatched) => {
            if let Some((_, open)) = dispatched.joined.into_iter().next() {
                return Ok(Gated::Joined(open));
            }
            Ok(match written.load(Ordering::Relaxed) {
                true => Gated::Run(own.clone()),
                false => Gated::NotStarted,
            })
        }
        Err(failed) => {
            let error = match failed.failure {
                Failure::Store(e) => e,
                Failure::Planning { message, .. } => StoreError::InvalidState(message),
            };
            // Two starts with one idempotency key at once: the second's
            // run collides with the first's, which it answers.
            if let Some(key) = &idempotency_key
                && let Some(existing) = store
                    .run_by_idempotency_key(tenant, &automation_id, key)
                    .await?
            {
                return Ok(Gated::Run(existing));
            }
            Err(error)
        }
    }
}
