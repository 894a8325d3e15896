//! The dispatcher turns inbox rows into runs.
//!
//! For each pending event the store hands it the tenant's automations whose
//! trigger matches; [`plan`] (pure) evaluates each trigger's filter over the
//! context the run would start with and decides the runs. The store writes
//! the runs, their first jobs and the event's `dispatched` mark in one
//! transaction, and a run is unique per (event, automation): a dispatch
//! repeated after a crash creates nothing twice.

use serde_json::{Map, Value, json};
use tok_core::condition::Condition;
use tok_core::context::Context;
use tok_core::flow::{self, Next};
use tok_core::ids::RunId;
use tok_store::{Candidate, NewRun, PendingEvent, Plan, PlanNote};

use crate::definitions::DefinitionCache;

/// The context a run of this event starts with: the contract's params at the
/// top, then the body's own top-level fields where no param took the name
/// (so a filter on `kind` works without declaring it), the whole body under
/// `_body`, the event under `_event`.
pub fn initial_context(event: &PendingEvent) -> Context {
    let mut params = match &event.params {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    if let Value::Object(body) = &event.payload {
        for (key, value) in body {
            if !key.starts_with('_') && !params.contains_key(key) {
                params.insert(key.clone(), value.clone());
            }
        }
    }
    Context::new(
        params,
        event.payload.clone(),
        json!({
            "id": event.id,
            "type": event.event_type.as_deref().unwrap_or(&event.source_kind),
            "source": event.source_id,
            "depth": event.depth,
            "causeRunId": event.cause_run_id,
        }),
    )
}

/// Most runs of one automation on one ticket per minute: past it, the
/// dispatcher skips the automation and says so in the ticket's trace.
pub const MAX_RUNS_PER_TICKET_PER_MINUTE: i64 = 5;

/// Which runs an event starts: one per candidate whose filter passes, less
/// what loop protection forbids — a change made by an automation does not
/// start that automation again, and one automation runs at most
/// [`MAX_RUNS_PER_TICKET_PER_MINUTE`] times per ticket per minute.
pub fn plan(event: &PendingEvent, candidates: &[Candidate], defs: &DefinitionCache) -> Plan {
    let context = initial_context(event).into_value();
    let mut plan = Plan::default();
    for candidate in candidates {
        if event.origin_automation_id.as_ref() == Some(&candidate.automation_id) {
            tracing::debug!(event = %event.id, automation = %candidate.automation_id, "own change; not triggered");
            continue;
        }
        let automation = match defs.parse(
            &candidate.automation_id,
            candidate.version,
            &candidate.definition,
        ) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(event = %event.id, error = %e, "skipping an automation that does not parse");
                continue;
            }
        };
        if event.target_automation_id.is_none()
            && let Some(filter) = automation.trigger.filter()
        {
            let evaluation = Condition::from_filter(filter).evaluate(&context);
            if !evaluation.result {
                tracing::debug!(
                    event = %event.id,
                    automation = %candidate.automation_id,
                    why = ?evaluation.lines,
                    "trigger filter did not match"
                );
                continue;
            }
        }
        if let Some(ticket) = &event.subject_ticket_id
            && candidate.recent_runs_on_ticket >= MAX_RUNS_PER_TICKET_PER_MINUTE
        {
            tracing::warn!(
                event = %event.id,
                automation = %candidate.automation_id,
                ticket = %ticket,
                "run skipped: per-ticket limit reached"
            );
            plan.notes.push(PlanNote {
                ticket_id: ticket.clone(),
                automation_id: candidate.automation_id.clone(),
                kind: "loop_protection".into(),
                message: format!(
                    "Automation \u{201c}{}\u{201d} was not started for {}: it already ran \
                     {MAX_RUNS_PER_TICKET_PER_MINUTE} times on this ticket in the last minute \
                     (loop protection)",
                    candidate.name,
                    event.event_type.as_deref().unwrap_or("this event")
                ),
            });
            continue;
        }
        let first_path = match flow::first(&automation.steps) {
            Next::Step(path) => Some(path.to_string()),
            Next::Complete => None,
        };
        plan.runs.push(NewRun {
            id: RunId::generate(),
            automation_id: candidate.automation_id.clone(),
            version: candidate.version,
            trigger_type: event.source_kind.clone(),
            context: context.clone(),
            depth: event.depth,
            queue_key: event
                .subject_ticket_id
                .as_ref()
                .map(|t| format!("ticket:{t}")),
            priority: 0,
            first_path,
            idempotency_key: None,
            subject_ticket_id: event.subject_ticket_id.clone(),
        });
    }
    plan
}
