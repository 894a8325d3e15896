//! Poll and schedule triggers: keeping each automation's schedule row in
//! step with its saved trigger, and starting the runs of the due ones.
//!
//! A row is written when the automation is saved (the API calls
//! [`sync_automation`]) and again by the wake for any automation whose row
//! is missing or older than its current version, so an automation saved
//! by any path is picked up within a tick. An edit that leaves the trigger
//! as it was keeps the row's due time; a new trigger starts over from now.
//!
//! Firing a due row starts one run whose idempotency key is the row's due
//! time, then moves the due time on from that value only: two schedulers
//! firing the same tick start one run between them, and a scheduler that
//! crashed between the two writes finds its run again on the next tick.

use serde_json::{Map, Value, json};
use tok_core::condition::Condition;
use tok_core::context::Context;
use tok_core::definition::Trigger;
use tok_core::flow;
use tok_core::ids::{RunId, TenantId};
use tok_core::schedule::{Timing, instant};
use tok_store::{
    AutomationRow, AutomationStatus, DueTrigger, NewEvent, NewRun, StaleSchedule, Store,
};

use super::{Scheduler, WakeReport};
use crate::Result;
use crate::dispatch::{plan, start};

/// Due rows one tick fires, earliest first whatever their tenant; the rest
/// wait for the next tick.
const DUE_PER_TICK: u32 = 500;

/// The timing of a saved trigger (JSON text); `None` for other kinds or a
/// trigger that no longer reads (validation keeps those out).
fn timing(spec: &str) -> Option<Timing> {
    let trigger: Trigger = serde_json::from_str(spec).ok()?;
    Timing::of(&trigger)?.ok()
}

/// Writes the schedule row of a just-saved automation, if it has a poll or
/// schedule trigger; removes a row its new trigger no longer needs.
pub async fn sync_automation(store: &dyn Store, row: &AutomationRow, now: i64) -> Result<()> {
    let spec = row
        .definition
        .get("trigger")
        .map(Value::to_string)
        .unwrap_or_default();
    match timing(&spec) {
        Some(timing) => {
            let kept = store
                .stale_schedules(std::slice::from_ref(&row.tenant_id))
                .await?
                .0
                .into_iter()
                .find(|s| s.automation_id == row.id)
                .and_then(|s| s.spec);
            let keep_due = kept.as_deref() == Some(spec.as_str());
            store
                .set_schedule(
                    &row.tenant_id,
                    &row.id,
                    row.version,
                    &spec,
                    timing.first_due(now),
                    keep_due,
                )
                .await?;
        }
        None => store.remove_schedule(&row.tenant_id, &row.id).await?,
    }
    Ok(())
}

/// Brings the schedule rows of `tenants` in step with their automations:
/// two reads for all of them; only a row to write costs more.
pub(super) async fn reconcile(scheduler: &Scheduler, tenants: &[TenantId]) -> Result<()> {
    let store = &*scheduler.store;
    let (stale, gone) = store.stale_schedules(tenants).await?;
    for (tenant, id) in gone {
        match store.remove_schedule(&tenant, &id).await {
            Err(e) if !super::skips(&tenant, e.is_tenant_database_away()) => return Err(e.into()),
            _ => {}
        }
    }
    let now = scheduler.clock.now_ms();
    for s in stale {
        match bring_up_to_date(store, &s, now).await {
            Err(e) if !super::skips(&s.tenant_id, e.is_tenant_database_away()) => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Writes the schedule row of one automation whose row is older than it.
async fn bring_up_to_date(store: &dyn Store, s: &StaleSchedule, now: i64) -> Result<()> {
    let tenant = &s.tenant_id;
    let Some(row) = store.automation(tenant, &s.automation_id).await? else {
        return Ok(());
    };
    let spec = row
        .definition
        .get("trigger")
        .map(Value::to_string)
        .unwrap_or_default();
    let next = timing(&spec).and_then(|t| t.first_due(now));
    let keep_due = s.spec.as_deref() == Some(spec.as_str());
    store
        .set_schedule(tenant, &row.id, row.version, &spec, next, keep_due)
        .await?;
    Ok(())
}

/// Fires the due rows of `tenants`: one read for all of them, then each
/// due row's own writes under its tenant.
pub(super) async fn fire(
    scheduler: &Scheduler,
    tenants: &[TenantId],
    report: &mut WakeReport,
) -> Result<()> {
    let store = &*scheduler.store;
    let now = scheduler.clock.now_ms();
    for due in store.due(tenants, now, DUE_PER_TICK).await? {
        match fire_one(scheduler, &due, now, report).await {
            Err(e) if !super::skips(&due.tenant_id, e.is_tenant_database_away()) => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Fires one due row: starts its run (unless its automation is not
/// active, or a poll's run is still going) and moves its due time on.
async fn fire_one(
    scheduler: &Scheduler,
    due: &DueTrigger,
    now: i64,
    report: &mut WakeReport,
) -> Result<()> {
    let store = &*scheduler.store;
    let tenant = &due.tenant_id;
    let Some(timing) = timing(&due.spec) else {
        // Not a poll or schedule any more: the next reconcile removes it.
        return Ok(());
    };
    let next = timing.next_due(due.due_at, now);
    if due.status != AutomationStatus::Active {
        store
            .advance(tenant, &due.automation_id, due.due_at, next, None, now)
            .await?;
        report.skipped += 1;
        return Ok(());
    }
    let pending = due.last_run_status.is_some_and(|s| !s.is_final());
    if matches!(timing, Timing::Poll { .. }) && pending {
        // At most one poll run per automation: due again once it ends.
        report.skipped += 1;
        return Ok(());
    }
    let run = start(scheduler, tenant, due, &timing, now).await?;
    store
        .advance(
            tenant,
            &due.automation_id,
            due.due_at,
            next,
            run.as_ref(),
            now,
        )
        .await?;
    match (run, timing) {
        (None, _) => report.skipped += 1,
        (Some(_), Timing::Poll { .. }) => report.polls += 1,
        (Some(_), Timing::Cron(_)) => report.schedules += 1,
    }
    Ok(())
}

/// Starts the run of one due row (or finds the one an earlier firing of
/// the same tick started); `None` when the trigger's filter does not hold
/// over the context the run would start with (its `_event`).
async fn start(
    scheduler: &Scheduler,
    tenant: &TenantId,
    due: &DueTrigger,
    timing: &Timing,
    now: i64,
) -> Result<Option<RunId>> {
    let store = &*scheduler.store;
    let automation = scheduler
        .defs
        .get(store, tenant, &due.automation_id, due.version)
        .await?;
    let kind = timing.kind();
    let run_id = RunId::generate();
    // `catchUp`: the server was down (or the wake late) over more than
    // this tick, and this one run stands for all of them.
    let event = json!({
        "type": kind,
        "depth": 0,
        "runId": run_id,
        "scheduledAt": instant(due.due_at),
        "catchUp": timing.is_catch_up(due.due_at, now),
        "actor": { "kind": "system", "source": kind },
    });
    let context = Context::new(Map::new(), json!({}), event);
    if let Some(filter) = automation.trigger.filter()
        && !Condition::from_filter(filter)
            .evaluate(context.as_value())
            .result
    {
        return Ok(None);
    }
    let key = format!("{kind}:{}", due.due_at);
    let new_event = NewEvent {
        source_id: None,
        source_kind: kind.into(),
        // The run's key deduplicates the tick; the event's only needs to
        // be unique, so a racing firing never conflicts on it.
        idempotency_key: tok_store::random_token(),
        payload: json!({}),
        params: json!({}),
        depth: 0,
        cause_run_id: None,
        origin_automation_id: None,
        target_automation_id: Some(due.automation_id.clone()),
        ..NewEvent::default()
    };
    let context = context.into_value();
    let run = NewRun {
        id: run_id,
        automation_id: due.automation_id.clone(),
        version: due.version,
        trigger_type: kind.into(),
        priority: plan::run_priority(&automation, &context, &due.automation_id),
        cancels: plan::cancel_keys(&automation, &context),
        start_by: plan::start_by(&automation),
        context,
        depth: 0,
        queue_key: None,
        first_path: flow::first_path(&automation.steps).map(|path| path.to_string()),
        idempotency_key: Some(key),
        subject_ticket_id: None,
        steps: Vec::new(),
        actions: 0,
        refused: None,
        skipped: None,
        hold: None,
        cancelled: None,
    };
    if automation.flow.control().is_some() {
        // Its start control decides, as for an event of a source: a tick
        // while a singleton's run is unfinished is skipped, queued or
        // replaces it; a debounced or batched one joins the open run.
        let gated =
            start::through_controls(store, tenant, new_event, run, &automation, None).await?;
        return Ok(gated.run().cloned());
    }
    Ok(Some(store.start_run(tenant, new_event, run).await?))
}
