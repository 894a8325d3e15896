//! Failing a run from outside the decider: the scheduler's `run_timeout`
//! (docs/operations.md, "Stuck runs") and a claimed run whose definition no
//! longer reads. Such a run ends the way a run the decider fails does — an
//! incident for the tenant, a `run.failed` event, and the run waiting on it
//! (its parent) told that it failed, so that a parent never waits for ever
//! — in one transaction of the store ([`tok_store::WatchStore::fail_run`]).
//! The words are `tok-core`'s ([`tok_core::incident`]); the step it failed
//! at is the last one it recorded.

use serde_json::{Value, json};
use tok_core::advance::Failure;
use tok_core::ids::{AutomationId, RunId, TenantId};
use tok_core::incident;
use tok_store::{Cause, NewIncident, NewInternalEvent, RunFailure, Store, StoreError, Ticket};

/// Why a run is failed from outside the decider: it decides the incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// The scheduler's `run_timeout`: an incident like any failed run's,
    /// at the step it had reached.
    TimedOut,
    /// The stored definition does not parse: one incident per broken
    /// automation version, however many of its runs fail (`code`
    /// `definition_invalid` in its detail).
    DefinitionInvalid,
}

/// Fails the tenant's run `run` of the automation named `automation_name`
/// with `error`. False when the run had ended (or was paused) meanwhile.
pub(crate) async fn fail_run(
    store: &dyn Store,
    tenant: &TenantId,
    run: &RunId,
    automation_name: &str,
    error: String,
    why: Why,
    now: i64,
) -> Result<bool, StoreError> {
    let Some(detail) = store.run(tenant, run).await? else {
        return Ok(false);
    };
    let automation_id: &AutomationId = &detail.run.automation_id;
    let last = detail.steps.last();
    let failure = Failure {
        step_id: last.map_or_else(String::new, |s| s.step_id.clone()),
        path: last.map_or_else(String::new, |s| s.path.clone()),
        kind: last.map_or_else(String::new, |s| s.kind.clone()),
        attempt: last.map_or(1, |s| s.attempt.max(1) as u32),
        message: error.clone(),
    };
    let ticket = match &detail.run.subject_ticket_id {
        Some(id) => store.ticket(tenant, id).await?,
        None => None,
    };
    let text = match why {
        Why::TimedOut => incident::run_failed(
            automation_id,
            automation_name,
            ticket.as_ref().map(|t| t.external_id.as_str()),
            &failure,
        ),
        Why::DefinitionInvalid => incident::definition_invalid(automation_id, detail.run.version),
    };
    let incident = NewIncident {
        source: text.source,
        title: text.title,
        impact: text.impact,
        detail: {
            let mut detail = failed_run_detail(
                run,
                automation_id,
                automation_name,
                detail.run.version,
                &failure,
                &detail.steps,
                &detail.context,
            );
            detail["code"] = json!(match why {
                Why::TimedOut => "run_timeout",
                Why::DefinitionInvalid => "definition_invalid",
            });
            detail
        },
        run_id: Some(run.clone()),
        ticket_id: ticket.as_ref().map(|t| t.id.clone()),
    };
    let event = run_failed_event(
        run,
        automation_id,
        automation_name,
        &failure,
        ticket.as_ref(),
    );
    let cause = Cause {
        run_id: Some(run.clone()),
        automation_id: Some(automation_id.clone()),
        depth: detail.run.depth,
        actor: format!("automation \u{201c}{automation_name}\u{201d}"),
    };
    let mut ended = crate::traces::enabled().then(|| detail.clone());
    if let Some(ended) = &mut ended {
        ended.run.status = "failed".into();
        ended.run.error = Some(error.clone());
        ended.run.finished_at = Some(now);
    }
    let failure = RunFailure {
        error,
        incident: Some(incident),
        event: Some(event),
        cause,
    };
    let failed = store.fail_run(tenant, run, failure, now).await?;
    if let (true, Some(ended)) = (failed, ended) {
        crate::traces::export(tenant, &ended);
    }
    Ok(failed)
}

/// The incident detail of a failed run, for the platform admin: the
/// automation, the run, the step it failed at with its attempts and error,
/// the steps before it, and what the run started from.
pub(crate) fn failed_run_detail(
    run: &RunId,
    automation_id: &AutomationId,
    automation_name: &str,
    version: i32,
    failure: &Failure,
    steps_before: &impl serde::Serialize,
    context: &Value,
) -> Value {
    json!({
        "automation": { "id": automation_id, "name": automation_name, "version": version },
        "run_id": run,
        "failed_step": { "id": failure.step_id, "path": failure.path, "type": failure.kind },
        "attempts": failure.attempt,
        "message": failure.message,
        "steps_before": steps_before,
        "input": context.get("_body"),
        "event": context.get("_event"),
    })
}

/// The `run.failed` event of a failed run, for automations that react to
/// failures (the depth limit and the own-change rule keep a failing
/// reaction from looping).
pub(crate) fn run_failed_event(
    run: &RunId,
    automation_id: &AutomationId,
    automation_name: &str,
    failure: &Failure,
    ticket: Option<&Ticket>,
) -> NewInternalEvent {
    NewInternalEvent {
        event_type: "run.failed".into(),
        payload: json!({
            "run": {
                "id": run,
                "automationId": automation_id,
                "automationName": automation_name,
                "failedStep": failure.step_id,
                "error": failure.message,
            },
            "ticket": ticket.map(|t| t.event_view()),
        }),
        subject_ticket_id: ticket.map(|t| t.id.clone()),
    }
}
