//! Planning the runs of an event.
//!
//! For each pending event the store hands the dispatcher the tenant's
//! automations whose trigger matches; [`plan`] (pure) evaluates each
//! trigger's filter over the context the run would start with and decides
//! the runs. The store writes the runs, their first jobs and the event's
//! `dispatched` mark in one transaction, and a run is unique per (event,
//! automation): a dispatch repeated after a crash creates nothing twice.
//!
//! A run begins here ([`begin`]), through the same decider a worker uses:
//! the control steps it starts with (a condition on the event, `set`, a log
//! line) depend on the run's context alone, so the dispatch writes their
//! results with the run, and the run is spared a claim and a record before
//! its first step that needs a worker — a run of control steps only is
//! complete when its event is dispatched.

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use tok_core::advance::{Env, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::condition::Condition;
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::flow::{self, Next};
use tok_core::ids::{AutomationId, RunId, TenantId};
use tok_core::path::FlowPath;
use tok_core::run::{FlowStart, ticket_queue_key};
use tok_core::start::Control;
use tok_store::{Candidate, NewRun, NextJob, PendingEvent, Plan, PlanNote, RunStatus, StepRecord};

use crate::definitions::DefinitionCache;
use crate::fairness::Fairness;
use crate::registry::Registry;

/// The context a run of this event starts with: the contract's params at the
/// top, then the body's own top-level fields where no param took the name
/// (so a filter on `kind` works without declaring it), the whole body under
/// `_body`, the event under `_event` (with the trace context it was sent
/// with, `_event.traceparent`, which the run's spans continue).
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
    let mut meta = json!({
        "id": event.id,
        "type": event.event_type.as_deref().unwrap_or(&event.source_kind),
        "source": event.source_id,
        "depth": event.depth,
        "causeRunId": event.cause_run_id,
        "actor": actor(event),
    });
    if let Some(traceparent) = &event.traceparent {
        meta["traceparent"] = json!(traceparent);
    }
    Context::new(params, event.payload.clone(), meta)
}

/// Who starts a run of an event: the run whose change raised it, or the
/// system (a webhook, a poll, a schedule, a person's change to a ticket).
fn actor(event: &PendingEvent) -> Value {
    match &event.cause_run_id {
        Some(run) => json!({ "kind": "automation", "runId": run }),
        None => json!({ "kind": "system", "source": event.source_kind }),
    }
}

/// Most runs of one automation on one ticket per minute: past it, the
/// dispatcher skips the automation and says so in the ticket's trace.
pub const MAX_RUNS_PER_TICKET_PER_MINUTE: i64 = 5;

/// The minute of [`MAX_RUNS_PER_TICKET_PER_MINUTE`], in milliseconds.
pub const TICKET_WINDOW_MS: i64 = 60_000;

/// The runs one dispatch planned on tickets, by tenant, automation and
/// ticket: they count for the loop protection like runs already written
/// (a batch with six events of one ticket starts five runs, not six).
#[derive(Debug, Default)]
pub(crate) struct PlannedOnTickets(HashMap<(TenantId, AutomationId, String), i64>);

impl PlannedOnTickets {
    /// Runs of `automation` this dispatch planned on `ticket` so far.
    pub(crate) fn planned(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
        ticket: &str,
    ) -> i64 {
        let key = (tenant.clone(), automation.clone(), ticket.to_owned());
        self.0.get(&key).copied().unwrap_or(0)
    }

    /// Notes the runs `plan` starts on `ticket`.
    pub(crate) fn add(&mut self, event: &PendingEvent, ticket: &str, plan: &Plan) {
        for run in &plan.runs {
            let key = (
                event.tenant_id.clone(),
                run.automation_id.clone(),
                ticket.to_owned(),
            );
            *self.0.entry(key).or_default() += 1;
        }
    }
}

/// Which runs an event starts: one per candidate whose filter passes, less
/// what loop protection forbids — a change made by an automation does not
/// start that automation again, and one automation runs at most
/// [`MAX_RUNS_PER_TICKET_PER_MINUTE`] times per ticket per minute. Unless
/// `may_begin` (the authorizer lets the tenant's runs go on), a run begins
/// nothing here: its first step is left to a claim, which fails it.
pub fn plan(
    event: &PendingEvent,
    candidates: &[Candidate],
    defs: &DefinitionCache,
    registry: &Registry,
    fairness: &Fairness,
    may_begin: bool,
) -> Plan {
    let context = initial_context(event).into_value();
    let mut plan = Plan::default();
    for candidate in candidates {
        if event.origin_automation_id.as_ref() == Some(&candidate.automation_id) {
            tracing::debug!(event = %event.id, automation = %candidate.automation_id, "own change; not triggered");
            continue;
        }
        let automation = match defs.parse(
            &event.tenant_id,
            &candidate.automation_id,
            candidate.version,
            &candidate.definition,
        ) {
            Ok(a) => a,
            Err(e) => {
                // Not dropped without a trace: the run is written, and the
                // worker that claims it fails it with `definition_invalid`
                // and an incident (`execute::runner`).
                tracing::error!(event = %event.id, automation = %candidate.automation_id, error = %e,
                    "an automation's definition does not parse; its run fails");
                plan.runs.push(NewRun {
                    id: RunId::generate(),
                    automation_id: candidate.automation_id.clone(),
                    version: candidate.version,
                    trigger_type: event.source_kind.clone(),
                    context: context.clone(),
                    depth: event.depth,
                    queue_key: event.subject_ticket_id.as_deref().map(ticket_queue_key),
                    priority: 0,
                    first_path: Some(FlowPath::root(0).to_string()),
                    idempotency_key: None,
                    subject_ticket_id: event.subject_ticket_id.clone(),
                    actions: 0,
                    steps: Vec::new(),
                    refused: None,
                    skipped: None,
                    hold: None,
                    start_by: None,
                    cancels: Vec::new(),
                    cancelled: None,
                });
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
        let priority = run_priority(&automation, &context, &candidate.automation_id);
        let control = automation.flow.control();
        let mut run_context = Context::from_value(context.clone());
        if let Some(Control::Batch(_)) = control {
            // A batch's run has its events' bodies, the first one's now.
            let mut value = run_context.into_value();
            value["_events"] = json!([event.payload]);
            run_context = Context::from_value(value);
        }
        let limit = fairness.dispatch_chain_limit;
        let (steps, first_path, run_context) = match flow::first(&automation.steps) {
            // A run its start control holds begins when it is due: an
            // event joining it may change its context until then.
            Next::Step(path) if control.is_some_and(|c| c.holds()) || !may_begin => {
                (Vec::new(), Some(path), run_context)
            }
            Next::Step(path) => begin(&automation, path, run_context, registry, limit),
            Next::Complete
            | Next::BranchDone { .. }
            | Next::IterationDone { .. }
            | Next::EscalationDone { .. }
            | Next::CompensationDone { .. } => (Vec::new(), None, run_context),
        };
        let id = RunId::generate();
        if let Some(control) = control {
            let (key, why) = control.key(&context);
            if let Some(why) = why {
                tracing::warn!(automation = %candidate.automation_id, "{why}");
            }
            plan.flow.push(FlowStart {
                run_id: id.clone(),
                flow: automation.flow.clone(),
                key,
            });
        }
        count_steps(event, &steps, first_path.is_none());
        // Stored like a worker's records (see `tok_core::retention`).
        let keep = automation.settings.keeps_step_data();
        let steps: Vec<StepRecord> = steps
            .into_iter()
            .map(|step| tok_core::retention::for_storage(step, keep))
            .collect();
        plan.runs.push(NewRun {
            id,
            automation_id: candidate.automation_id.clone(),
            version: candidate.version,
            trigger_type: event.source_kind.clone(),
            context: run_context.into_value(),
            depth: event.depth,
            queue_key: event.subject_ticket_id.as_deref().map(ticket_queue_key),
            priority,
            first_path: first_path.map(|p| p.to_string()),
            idempotency_key: None,
            subject_ticket_id: event.subject_ticket_id.clone(),
            actions: steps.len() as i32,
            refused: None,
            skipped: None,
            hold: None,
            start_by: start_by(&automation),
            cancels: cancel_keys(&automation, &context),
            cancelled: None,
            steps,
        });
    }
    plan
}

/// When a run of `automation` written now expires unless it began
/// (`flow.startTimeout`).
pub(crate) fn start_by(automation: &Automation) -> Option<i64> {
    automation
        .flow
        .start_timeout
        .map(|d| tok_store::now_ms() + d.as_millis() as i64)
}

/// The rows of a run of `automation` starting with `context` that its
/// `flow.cancelOn` entries cancel it by: one per entry the context has a
/// value at the entry's `match` path for.
pub(crate) fn cancel_keys(
    automation: &Automation,
    context: &Value,
) -> Vec<tok_core::run::CancelKey> {
    automation
        .flow
        .cancel_on
        .iter()
        .filter_map(|entry| {
            Some(tok_core::run::CancelKey {
                source: entry.source.clone(),
                path: entry.match_.clone(),
                value: entry.value(context)?,
                filter: entry.where_.clone(),
            })
        })
        .collect()
}

/// The priority of a run of `automation` starting with `context`
/// (`flow.priority`); one its template could not give is 0, said in the log.
pub(crate) fn run_priority(automation: &Automation, context: &Value, id: &AutomationId) -> i32 {
    let (priority, why) = automation.flow.priority(context);
    if let Some(why) = why {
        tracing::warn!(automation = %id, "{why}");
    }
    priority
}

/// Begins a run at `first` through the decider, as a worker would, with
/// at most `limit` steps recorded; returns their records, the step a worker
/// runs next (`None`: the run is complete) and the context after them.
///
/// The dispatch keeps only what it can write with the run: control steps
/// that completed, up to a step an executor must run or the limit. When
/// the decider ends the claim otherwise — the run waits, or a step fails —
/// the run begins again with the steps before that one only, and a worker
/// decides that step from there the usual way (a failure with its retries
/// and incident).
pub fn begin(
    automation: &Automation,
    first: FlowPath,
    context: Context,
    registry: &Registry,
    limit: usize,
) -> (Vec<StepRecord>, Option<FlowPath>, Context) {
    // A run that begins with a step an executor runs has nothing to begin
    // here: no copy of its context, no rendering of a config to throw away.
    let begins_with_control = flow::step_at(&automation.steps, &first)
        .is_some_and(|step| registry.class(&step.kind) == StepClass::Control);
    if !begins_with_control {
        return (Vec::new(), Some(first), context);
    }
    let state = RunState::at(first, 1, context, 0).chaining(limit);
    let before = state.clone();
    match kept(decide(automation, state, registry)) {
        Ok(begun) => begun,
        Err(recorded) if recorded > 1 => {
            let shorter = before.clone().chaining(recorded - 1);
            kept(decide(automation, shorter, registry))
                .unwrap_or_else(|_| (Vec::new(), Some(before.path), before.context))
        }
        Err(_) => (Vec::new(), Some(before.path), before.context),
    }
}

fn decide(automation: &Automation, state: RunState, registry: &Registry) -> Transition {
    let kinds = |kind: &str| registry.class(kind);
    let retries = |kind: &str| registry.retry_policy(kind);
    let mut rng = rand::rng();
    let mut env = Env {
        now: tok_store::now(),
        kinds: &kinds,
        rng: &mut rng,
        retries: &retries,
    };
    advance(automation, state, Input::Start, &mut env)
}

/// What a dispatch writes of a transition, or how many steps the
/// transition recorded when it cannot write it.
fn kept(t: Transition) -> Result<(Vec<StepRecord>, Option<FlowPath>, Context), usize> {
    match &t.then {
        Then::Execute(step) => {
            let path = step.path.clone();
            Ok((t.records, Some(path), t.state.context))
        }
        Then::Record(NextJob::Done) if t.status == RunStatus::Completed => {
            Ok((t.records, None, t.state.context))
        }
        Then::Record(NextJob::Step { delay_ms: 0, .. }) if t.status == RunStatus::Running => {
            let path = t.state.path.clone();
            Ok((t.records, Some(path), t.state.context))
        }
        _ => Err(t.records.len()),
    }
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
        let context = Context::new(Map::new(), json!({ "n": 7 }), json!({}));
        let Next::Step(first) = flow::first(&automation.steps) else {
            panic!("a tree with steps");
        };
        let limit = Fairness::default().dispatch_chain_limit;
        let (steps, next, context) = begin(
            &automation,
            first,
            context,
            &Registry::with_builtins(),
            limit,
        );
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
                .all(|s| s.status == tok_store::StepStatus::Completed && s.attempt == 1)
        );
    }

    #[test]
    fn a_run_begins_up_to_a_step_in_the_record_transaction_or_a_wait_for_a_signal() {
        for second in [
            json!({ "id": "t", "type": "ticket/upsert", "config": { "externalId": "x" } }),
            json!({ "id": "w", "type": "wait_for_event", "config": { "key": "k" } }),
        ] {
            let first = json!({ "id": "s1", "type": "set", "config": { "values": { "a": 1 } } });
            let (steps, next, _) = prefix(json!([first, second]));
            assert_eq!(
                (ids(&steps), next.map(|p| p.to_string())),
                (vec!["s1"], Some("1".into())),
                "before {second}"
            );
        }
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
            { "id": "w", "type": "wait", "config": { "duration": "1h" } },
            { "id": "s2", "type": "set", "config": { "values": { "b": 2 } } }
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
        let limit = Fairness::default().dispatch_chain_limit;
        let chain: Vec<Value> = (0..limit + 4)
            .map(|i| json!({ "id": format!("s{i}"), "type": "set", "config": { "values": { "i": i } } }))
            .collect();
        let (steps, next, _) = prefix(Value::Array(chain));
        assert_eq!(steps.len(), limit);
        assert_eq!(next.map(|p| p.to_string()), Some(limit.to_string()));
    }
}
