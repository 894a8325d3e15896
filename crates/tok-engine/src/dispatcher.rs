//! The dispatcher turns inbox rows into runs.
//!
//! For each pending event the store hands it the tenant's automations whose
//! trigger matches; [`plan`] (pure) evaluates each trigger's filter over the
//! context the run would start with and decides the runs. The store writes
//! the runs, their first jobs and the event's `dispatched` mark in one
//! transaction, and a run is unique per (event, automation): a dispatch
//! repeated after a crash creates nothing twice.
//!
//! The pure steps a run begins with (a condition on the event, `set`, a
//! log line) are run here at once ([`run_pure_prefix`]): they depend on
//! the run's context alone, so the dispatch writes their results with the
//! run, and the run is spared a claim and a record before its first step
//! that needs a worker — a run of pure steps only is complete when its
//! event is dispatched.

use jiff::Timestamp;
use serde_json::{Map, Value, json};
use tok_core::builtin::{self, Outcome};
use tok_core::condition::Condition;
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::flow::{self, Next};
use tok_core::ids::RunId;
use tok_core::path::FlowPath;
use tok_store::{Candidate, NewRun, PendingEvent, Plan, PlanNote, StepRecord, StepStatus, now_ms};

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
        let mut run_context = Context::from_value(context.clone());
        let (steps, first_path) = match flow::first(&automation.steps) {
            Next::Step(path) => run_pure_prefix(&automation, path, &mut run_context),
            Next::Complete => (Vec::new(), None),
        };
        count_steps(event, &steps, first_path.is_none());
        plan.runs.push(NewRun {
            id: RunId::generate(),
            automation_id: candidate.automation_id.clone(),
            version: candidate.version,
            trigger_type: event.source_kind.clone(),
            context: run_context.into_value(),
            depth: event.depth,
            queue_key: event
                .subject_ticket_id
                .as_ref()
                .map(|t| format!("ticket:{t}")),
            priority: 0,
            first_path: first_path.map(|p| p.to_string()),
            idempotency_key: None,
            subject_ticket_id: event.subject_ticket_id.clone(),
            actions: steps.len() as i32,
            steps,
        });
    }
    plan
}

/// Most pure steps a dispatch runs for one new run; the rest are a
/// worker's, like any step. (They run while the dispatch holds SQLite's
/// one writer.)
pub const PURE_PREFIX_LIMIT: usize = 16;

/// Runs the pure steps a run begins with, from `first`, publishing their
/// outputs into `context`; returns their records and the step a worker
/// runs next (`None`: the run is complete). It stops before the first step
/// that is not pure (it needs the database or the outside world), a
/// `wait`, a step that fails (a worker runs it again and fails the run the
/// usual way, with its retries and incident), or after
/// [`PURE_PREFIX_LIMIT`] steps.
pub fn run_pure_prefix(
    automation: &Automation,
    first: FlowPath,
    context: &mut Context,
) -> (Vec<StepRecord>, Option<FlowPath>) {
    let mut steps = Vec::new();
    let mut path = first;
    while steps.len() < PURE_PREFIX_LIMIT {
        let Some(step) = flow::step_at(&automation.steps, &path) else {
            break;
        };
        if !builtin::is_internal(&step.kind) {
            break;
        }
        let started_at = now_ms();
        let view = flow::scope(&automation.steps, &path, context.as_value());
        let outcome = builtin::evaluate(step, &view, Timestamp::now())
            .and_then(|o| crate::worker::check_output_size(&step.id, o));
        let Ok(Outcome::Done { outputs, log }) = outcome else {
            break;
        };
        let mut after = context.clone();
        after.publish(&step.id, &outputs);
        let Ok(next) = flow::next(&automation.steps, &path, after.as_value()) else {
            break;
        };
        *context = after;
        steps.push(StepRecord {
            path: path.to_string(),
            step_id: step.id.clone(),
            kind: step.kind.clone(),
            attempt: 1,
            status: StepStatus::Completed,
            input: None,
            output: Some(Value::Object(outputs)),
            error: None,
            log,
            started_at,
            finished_at: now_ms(),
        });
        match next {
            Next::Complete => return (steps, None),
            Next::Step(next) => path = next,
        }
    }
    (steps, Some(path))
}

/// The steps a dispatch ran count like a worker's.
fn count_steps(event: &PendingEvent, steps: &[StepRecord], completed: bool) {
    if steps.is_empty() {
        return;
    }
    metrics::counter!(
        "tok_steps_total",
        "tenant" => event.tenant_id.to_string(),
        "status" => "completed"
    )
    .increment(steps.len() as u64);
    if completed {
        metrics::counter!("tok_runs_finished_total", "status" => "completed").increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn automation(steps: Value) -> Automation {
        let json = json!({ "name": "a", "trigger": { "kind": "manual" }, "steps": steps });
        Automation::from_json(&json.to_string()).expect("a valid definition")
    }

    fn prefix(steps: Value) -> (Vec<StepRecord>, Option<FlowPath>, Value) {
        let automation = automation(steps);
        let mut context = Context::new(Map::new(), json!({ "n": 7 }), json!({}));
        let Next::Step(first) = flow::first(&automation.steps) else {
            panic!("a tree with steps");
        };
        let (steps, next) = run_pure_prefix(&automation, first, &mut context);
        (steps, next, context.into_value())
    }

    fn ids(steps: &[StepRecord]) -> Vec<&str> {
        steps.iter().map(|s| s.step_id.as_str()).collect()
    }

    #[test]
    fn a_run_of_pure_steps_only_is_complete_at_dispatch() {
        let (steps, next, context) = prefix(json!([
            { "id": "s1", "type": "set", "config": { "values": { "n": "{{_body.n}}" } } },
            { "id": "c", "type": "condition",
              "rules": [{ "field": "s1.n", "operator": "eq", "value": 7 }],
              "then": [{ "id": "yes", "type": "flow/log", "config": { "message": "seven" } }],
              "else": [{ "id": "no", "type": "flow/log", "config": { "message": "other" } }] }
        ]));
        assert_eq!(ids(&steps), ["s1", "c", "yes"]);
        assert_eq!(next, None, "complete");
        assert_eq!(context["s1"]["n"], json!(7));
        assert_eq!(steps[2].log, ["info: seven"]);
        assert!(
            steps
                .iter()
                .all(|s| s.status == StepStatus::Completed && s.attempt == 1)
        );
    }

    #[test]
    fn the_prefix_stops_before_the_first_step_a_worker_must_run() {
        let (steps, next, context) = prefix(json!([
            { "id": "s1", "type": "set", "config": { "values": { "a": 1 } } },
            { "id": "call", "type": "bench/anything", "config": {} },
            { "id": "s2", "type": "set", "config": { "values": { "b": 2 } } }
        ]));
        assert_eq!(ids(&steps), ["s1"]);
        assert_eq!(next.map(|p| p.to_string()).as_deref(), Some("1"));
        assert!(context.get("s2").is_none(), "nothing after it ran");
    }

    #[test]
    fn a_wait_or_a_failing_step_is_left_to_a_worker_unrecorded() {
        let (steps, next, _) = prefix(json!([
            { "id": "s1", "type": "set", "config": { "values": { "a": 1 } } },
            { "id": "w", "type": "wait", "config": { "duration": "1h" } }
        ]));
        assert_eq!(
            (ids(&steps), next.map(|p| p.to_string())),
            (vec!["s1"], Some("1".into()))
        );

        let (steps, next, context) = prefix(json!([
            { "id": "bad", "type": "set", "config": { "values": "not an object" } }
        ]));
        assert!(steps.is_empty());
        assert_eq!(next.map(|p| p.to_string()).as_deref(), Some("0"));
        assert!(context.get("bad").is_none());
    }

    #[test]
    fn a_long_chain_of_pure_steps_goes_on_in_a_worker_after_the_limit() {
        let chain: Vec<Value> = (0..PURE_PREFIX_LIMIT + 4)
            .map(|i| json!({ "id": format!("s{i}"), "type": "set", "config": { "values": { "i": i } } }))
            .collect();
        let (steps, next, _) = prefix(Value::Array(chain));
        assert_eq!(steps.len(), PURE_PREFIX_LIMIT);
        assert_eq!(
            next.map(|p| p.to_string()),
            Some(PURE_PREFIX_LIMIT.to_string())
        );
    }
}
