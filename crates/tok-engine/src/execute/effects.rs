//! The effects a transition asks of the record transaction besides its
//! records: the incident and `run.failed` event of a run that failed (the
//! line in its ticket's trace is the store's, written by every run that
//! ends as it ends), and the alert of a chain of automations that went too deep. The
//! words are `tok-core`'s ([`tok_core::incident`]); here they meet the
//! rows they need (the subject ticket, the steps so far).

use serde_json::{Value, json};
use tok_core::advance::Failure;
use tok_core::definition::Automation;
use tok_core::incident;
use tok_store::{Cause, ClaimedJob, NewIncident, RecordTx, StepStatus, StoreError};

/// A run failed for good: an incident for the tenant (title and impact in
/// their words, the detail for the platform admin) and a `run.failed`
/// event. Returns the incident's id and whether
/// it is new (else one more occurrence of the open one).
pub(super) async fn run_failed(
    tx: &mut dyn RecordTx,
    job: &ClaimedJob,
    automation: &Automation,
    subject: Option<&str>,
    context: &Value,
    failure: &Failure,
    cause: &Cause,
) -> Result<(String, bool), StoreError> {
    let ticket = match subject {
        Some(id) => tx.ticket(id).await?,
        None => None,
    };
    let text = incident::run_failed(
        &job.automation_id,
        &automation.name,
        ticket.as_ref().map(|t| t.external_id.as_str()),
        failure,
    );
    let mut all_steps = tx.run_steps().await?;
    all_steps.retain(|s| s.path != failure.path || s.status != StepStatus::Failed.as_str());
    let detail = crate::failure::failed_run_detail(
        &job.run_id,
        &job.automation_id,
        &automation.name,
        job.version,
        failure,
        &all_steps,
        context,
    );
    let opened = tx
        .open_incident(NewIncident {
            source: text.source,
            title: text.title,
            impact: text.impact,
            detail,
            run_id: Some(job.run_id.clone()),
            ticket_id: ticket.as_ref().map(|t| t.id.clone()),
        })
        .await?;
    let event = crate::failure::run_failed_event(
        &job.run_id,
        &job.automation_id,
        &automation.name,
        failure,
        ticket.as_ref(),
    );
    tx.emit(event, cause).await?;
    Ok(opened)
}

/// A compensation step failed for good: an incident for the tenant that
/// says which undo failed (the run goes on with the next one), and a line
/// in its ticket's trace.
pub(super) async fn compensation_failed(
    tx: &mut dyn RecordTx,
    job: &ClaimedJob,
    automation: &Automation,
    subject: Option<&str>,
    failure: &Failure,
    cause: &Cause,
) -> Result<(String, bool), StoreError> {
    let ticket = match subject {
        Some(id) => tx.ticket(id).await?,
        None => None,
    };
    let text = incident::compensation_failed(
        &job.automation_id,
        &automation.name,
        ticket.as_ref().map(|t| t.external_id.as_str()),
        failure,
    );
    let detail = json!({
        "automation": { "id": job.automation_id, "name": automation.name, "version": job.version },
        "run_id": job.run_id,
        "failed_step": { "id": failure.step_id, "path": failure.path, "type": failure.kind },
        "attempts": failure.attempt,
        "message": failure.message,
    });
    let opened = tx
        .open_incident(NewIncident {
            source: text.source,
            title: text.title,
            impact: text.impact,
            detail,
            run_id: Some(job.run_id.clone()),
            ticket_id: ticket.as_ref().map(|t| t.id.clone()),
        })
        .await?;
    if let Some(t) = &ticket {
        tx.trace(&t.id, "compensation_failed", &failure.message, cause)
            .await?;
    }
    Ok(opened)
}

/// A change could not raise its event because the chain of automations
/// that led to it is too deep: alert the tenant (the trace says it too).
pub(super) async fn chain_too_deep(
    tx: &mut dyn RecordTx,
    job: &ClaimedJob,
    automation: &Automation,
    subject: Option<&str>,
) -> Result<(String, bool), StoreError> {
    tracing::warn!(run = %job.run_id, automation = %job.automation_id, depth = job.depth, "event chain too deep; event dropped");
    let text = incident::chain_too_deep(&job.automation_id, &automation.name);
    tx.open_incident(NewIncident {
        source: text.source,
        title: text.title,
        impact: text.impact,
        detail: json!({
            "automation": { "id": job.automation_id, "name": automation.name },
            "run_id": job.run_id,
            "depth": job.depth,
        }),
        run_id: Some(job.run_id.clone()),
        ticket_id: subject.map(str::to_owned),
    })
    .await
}
