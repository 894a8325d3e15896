//! A panic in a claim outside a handler (the decider, a template, a step
//! that runs in the record transaction, a row decode) is a bug, not a
//! crash: the claim's record transaction rolls back, and the run fails at
//! the step that was running, in a transaction of its own, with the
//! incident, trace line and `run.failed` event of any other failure. The
//! slot is freed by the pool whatever happens ([`super::pool`]).

use serde_json::Value;
use tok_core::advance::Failure;
use tok_core::definition::Automation;
use tok_core::flow::step_at;
use tok_core::path::FlowPath;
use tok_store::{
    Cause, ClaimedJob, NextJob, Record, RunEnded, RunStatus, StepRecord, StepStatus, StoreError,
    now_ms,
};

use super::effects;
use crate::Inner;

/// The step a claim was carrying out, for the failure of a panic.
#[derive(Debug, Clone)]
pub(super) struct Running {
    pub(super) path: String,
    pub(super) step_id: String,
    pub(super) kind: String,
    pub(super) attempt: u32,
    pub(super) started_at: i64,
}

impl Running {
    /// The job's own step: where a claim panics before it starts one.
    pub(super) fn of_job(job: &ClaimedJob, automation: &Automation) -> Self {
        let step = job
            .path
            .parse::<FlowPath>()
            .ok()
            .and_then(|path| step_at(&automation.steps, &path));
        Self {
            path: job.path.clone(),
            step_id: step.map_or_else(|| job.path.clone(), |s| s.id.clone()),
            kind: step.map_or_else(String::new, |s| s.kind.clone()),
            attempt: job.attempt.max(1) as u32,
            started_at: now_ms(),
        }
    }
}

/// Fails the run at the step that panicked: a failed step record, the
/// run's incident and, for a child run, its parent's notice.
pub(super) async fn fail(
    inner: &Inner,
    job: &ClaimedJob,
    automation: &Automation,
    running: Running,
    panic: String,
) -> Result<(), StoreError> {
    let error = format!(
        "step `{}` panicked: {panic} (a bug in tok or in the step type `{}`)",
        running.step_id, running.kind
    );
    tracing::error!(job = %job.id, run = %job.run_id, path = %running.path, %error, "a claim panicked; its run fails");
    let failure = Failure {
        step_id: running.step_id.clone(),
        path: running.path.clone(),
        kind: running.kind.clone(),
        attempt: running.attempt,
        message: error.clone(),
    };
    let cause = Cause {
        run_id: Some(job.run_id.clone()),
        automation_id: Some(job.automation_id.clone()),
        depth: job.depth,
        actor: format!("automation \u{201c}{}\u{201d}", automation.name),
    };
    let mut tx = inner.store.begin_record(job).await?;
    // What the claim did is lost with it: the context as it was stored.
    let context = tx.run_context().await?;
    let subject = job.subject_ticket_id.as_deref();
    effects::run_failed(
        &mut *tx, job, automation, subject, &context, &failure, &cause,
    )
    .await?;
    if tok_core::children::parent_of(&context).is_some() {
        tx.run_ended(RunEnded {
            run_id: job.run_id.to_string(),
            status: RunStatus::Failed,
            output: Value::Null,
            error: Some(error.clone()),
        })
        .await?;
    }
    let step = StepRecord {
        path: running.path,
        step_id: running.step_id,
        kind: running.kind,
        attempt: running.attempt as i32,
        status: StepStatus::Failed,
        input: None,
        output: None,
        error: Some(error.clone()),
        log: Vec::new(),
        started_at: running.started_at,
        finished_at: now_ms(),
    };
    tx.commit(Record {
        steps: vec![step],
        context: context.into(),
        changed: tok_store::ContextChange::Whole,
        actions: job.actions,
        status: RunStatus::Failed,
        error: Some(error),
        next: NextJob::Done,
        subject_ticket_id: job.subject_ticket_id.clone(),
    })
    .await
}

#[cfg(test)]
mod tests;
