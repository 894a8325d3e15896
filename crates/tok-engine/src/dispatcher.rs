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
use tok_store::{Candidate, NewRun, PendingEvent, Plan};

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
            "type": event.source_kind,
            "source": event.source_id,
            "depth": event.depth,
            "causeRunId": event.cause_run_id,
        }),
    )
}

/// Which runs an event starts: one per candidate whose filter passes.
pub fn plan(event: &PendingEvent, candidates: &[Candidate], defs: &DefinitionCache) -> Plan {
    let context = initial_context(event).into_value();
    let mut plan = Plan::default();
    for candidate in candidates {
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
            queue_key: None,
            priority: 0,
            first_path,
            idempotency_key: None,
        });
    }
    plan
}
