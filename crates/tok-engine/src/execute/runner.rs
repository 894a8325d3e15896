//! Carrying out one claim: load the run's state, ask the decider
//! ([`tok_core::advance`]) what happens, run the steps it hands out, and
//! write everything in one record transaction.
//!
//! A step that runs in the record transaction (the service-desk steps)
//! opens that transaction on first use, after the claim token is checked,
//! so its effect and the records commit together. An external step (a
//! registered handler) runs with no database connection held; the decider
//! never chains one after steps already done in the claim, so their record
//! is written first, and the external step continues under the same lease
//! (`NextJob::Continue`) without a claim in between. A record with nothing
//! else to write joins the store's group commit with other claims' records.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt as _;
use serde_json::{Map, Value};
use tok_core::advance::{
    CustomWait, Effect, Env, Execute, Input, RunState, StepClass, Then, advance,
};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::path::FlowPath;
use tok_store::{
    Cause, ClaimedJob, ContextChange, NextJob, Record, RecordTx, RunEnded, RunStatus, StepRecord,
    StoreError, now_ms,
};
use tracing::Instrument as _;

use super::effects;
use super::panics::{self, Running};
use crate::Inner;
use crate::authorize::{self, StepToAuthorize};
use crate::registry::{Resumed, StepCall, StepOutcome};
use crate::steps::{TxContext, TxError};

/// Runs one claimed job and records its outcome.
pub(crate) async fn execute(inner: &Inner, job: ClaimedJob) {
    let automation = match inner
        .defs
        .get(
            &*inner.store,
            &job.tenant_id,
            &job.automation_id,
            job.version,
        )
        .await
    {
        Ok(automation) => automation,
        Err(crate::EngineError::Store(e)) => {
            // The database is away: leave the job to be retried after its lease.
            tracing::error!(job = %job.id, error = %e, "could not load the definition");
            return;
        }
        Err(e) => {
            // The stored definition does not parse (or its version is
            // gone): the run fails at once, visibly, from outside the
            // decider (which cannot read the tree), with one incident per
            // broken version, `run.failed` and its waiting parent told.
            let error = format!("{DEFINITION_INVALID}: {e}");
            tracing::error!(job = %job.id, run = %job.run_id, %error, "the run's definition is not valid; the run fails");
            let name = match inner
                .store
                .automation(&job.tenant_id, &job.automation_id)
                .await
            {
                Ok(Some(row)) => row.name,
                _ => job.automation_id.to_string(),
            };
            let failed = crate::failure::fail_run(
                &*inner.store,
                &job.tenant_id,
                &job.run_id,
                &name,
                error,
                crate::failure::Why::DefinitionInvalid,
                now_ms(),
            )
            .await;
            if let Err(e) = failed {
                tracing::error!(job = %job.id, error = %e, "could not record a broken definition");
            }
            return;
        }
    };
    let mut job = job;
    // A run whose next step is due at once keeps its slot and lease for a
    // few steps, without a claim in between; then it queues again like
    // everyone else.
    let mut budget = inner.config.fairness.continue_limit;
    loop {
        // The job's context moves into the claim; the store needs the
        // rest of the job (its key and token) to fence the record.
        let context = std::mem::take(&mut job.context);
        let mut running = Running::of_job(&job, &automation);
        let driven = AssertUnwindSafe(drive(
            inner,
            &job,
            context,
            &automation,
            budget > 0,
            &mut running,
        ))
        .catch_unwind()
        .await;
        let driven = match driven {
            Ok(driven) => driven,
            Err(panic) => {
                let panic = crate::panic_message(&*panic);
                if let Err(e) = panics::fail(inner, &job, &automation, running, panic).await {
                    tracing::error!(job = %job.id, error = %e, "could not record a panicked claim; the job returns after its lease");
                }
                return;
            }
        };
        match driven {
            Ok(Driven::Continue(next)) => {
                job = *next;
                budget = budget.saturating_sub(1);
            }
            Ok(Driven::Recorded { advanced }) => {
                if advanced {
                    inner.work.notify_one();
                }
                return;
            }
            Err(StoreError::LeaseLost(id)) => {
                // A stale execution: its job was claimed again (by another
                // process, or after this one's heartbeats failed for a
                // lease) and only the current claim's record counts.
                metrics::counter!("tok_stale_completions_total").increment(1);
                tracing::warn!(job = %id, run = %job.run_id, "lease lost while the step ran; result discarded (stale completion rejected)");
                return;
            }
            Err(e) => {
                tracing::error!(job = %job.id, run = %job.run_id, error = %e, "record failed; the job returns after its lease");
                return;
            }
        }
    }
}

/// The error code a run fails with when its stored definition does not parse.
pub(crate) const DEFINITION_INVALID: &str = "definition_invalid";

/// How a claim's record ended.
enum Driven {
    /// Recorded; `advanced` when the run's next step is due now (for another claim).
    Recorded { advanced: bool },
    /// Recorded, and the job stays leased to this worker for its next step.
    Continue(Box<ClaimedJob>),
}

/// The run fails before any step of the claim ran: its context as claimed.
fn failed_without_step(job: &ClaimedJob, context: Value, error: String) -> Record {
    Record {
        steps: Vec::new(),
        context: context.into(),
        changed: ContextChange::Whole,
        actions: job.actions,
        status: RunStatus::Failed,
        error: Some(error),
        next: NextJob::Done,
        subject_ticket_id: job.subject_ticket_id.clone(),
    }
}

/// What one claim decided and did, ready to record.
struct Claim {
    records: Vec<StepRecord>,
    effects: Vec<Effect>,
    state: RunState,
    status: RunStatus,
    error: Option<String>,
    next: NextJob,
    subject: Option<String>,
    /// A change could not raise its event: the chain of automations is too deep.
    too_deep: bool,
    /// The record transaction, when a step ran in it.
    tx: Option<Box<dyn RecordTx>>,
    /// The handler step this claim ran, if any: its `cancel` hook runs
    /// when the record finds the run cancelled meanwhile.
    external: Option<FlowPath>,
}

/// Runs the claim's steps as the decider says, then records everything in
/// one transaction. When the run's next step is due now and
/// `may_continue`, the job stays leased for it.
async fn drive(
    inner: &Inner,
    job: &ClaimedJob,
    context: Value,
    automation: &Automation,
    may_continue: bool,
    running: &mut Running,
) -> Result<Driven, StoreError> {
    let path = match job.path.parse::<FlowPath>() {
        Ok(path) => path,
        Err(e) => {
            let error = format!("job path `{}` is not valid: {e}", job.path);
            let record = failed_without_step(job, context, error);
            inner.store.record(job, record).await?;
            return Ok(Driven::Recorded { advanced: false });
        }
    };
    let cause = Cause {
        run_id: Some(job.run_id.clone()),
        automation_id: Some(job.automation_id.clone()),
        depth: job.depth,
        actor: format!("automation \u{201c}{}\u{201d}", automation.name),
    };
    let state = RunState::at(
        path,
        job.attempt.max(1) as u32,
        Context::from_value(context),
        job.actions,
    )
    .chaining(inner.config.fairness.chain_limit);
    let claim = run_claim(inner, job, automation, state, &cause, running).await?;
    let external = claim.external.clone();
    let recorded = record_claim(inner, job, automation, claim, may_continue, &cause).await;
    if let (Err(StoreError::LeaseLost(_)), Some(path)) = (&recorded, external) {
        cancel_abandoned_step(inner, job, automation, &path).await;
    }
    recorded
}

/// Writes what the claim decided and did, in one transaction (or in the
/// store's group commit when nothing else is to be written with it).
async fn record_claim(
    inner: &Inner,
    job: &ClaimedJob,
    automation: &Automation,
    claim: Claim,
    may_continue: bool,
    cause: &Cause,
) -> Result<Driven, StoreError> {
    count(job, &claim);
    let ended = claim.status.is_final();
    // A wait may take a buffered signal (or find its runs ended) as it is
    // recorded: its job is then ready at once, like a next step due now;
    // so is the first job of a child run started in this record, a branch
    // forked in it, or a parallel step whose branches it joined.
    let advanced = matches!(
        claim.next,
        NextJob::Step { delay_ms: 0, .. }
            | NextJob::Wait { .. }
            | NextJob::WaitForRuns { .. }
            | NextJob::Fork { .. }
            | NextJob::BranchDone { .. }
    );
    let needs_tx = claim.tx.is_some() || claim.too_deep || !claim.effects.is_empty();
    let changed = ContextChange::Keys(claim.state.context.changed());
    let record = Record {
        steps: stored(inner, automation, claim.records),
        changed,
        context: claim.state.context.into_shared(),
        actions: claim.state.actions,
        status: claim.status,
        error: claim.error,
        next: claim.next,
        subject_ticket_id: claim.subject,
    };
    let mut published = crate::stream::Recorded::of(job, &record);
    if !needs_tx {
        // Nothing else to write with it: the record joins the store's group
        // commit with other claims' records.
        if let (true, NextJob::Step { path, delay_ms: 0 }) = (may_continue, &record.next) {
            // The job goes on under its claim: same token, its lease kept
            // by the pool's heartbeats. The context is shared with the
            // record until it is written, and is the job's alone after.
            let context = std::sync::Arc::clone(&record.context);
            let next = ClaimedJob {
                path: path.clone(),
                attempt: 1,
                context: Value::Null,
                actions: record.actions,
                subject_ticket_id: record.subject_ticket_id.clone(),
                resume: None,
                ..job.clone()
            };
            let mut record = record;
            record.next = NextJob::Continue {
                path: next.path.clone(),
                lease_ms: inner.lease_ms(),
            };
            let asked_at = now_ms();
            let continues = inner.store.record_and_continue(job, record).await?;
            if continues {
                // The record moved the lease on from when it was asked.
                let until = crate::registry::Lease::known_until(asked_at, inner.lease_ms());
                super::pool::lease_of(inner, job).extend_to(until);
            }
            published.publish(&inner.stream);
            return Ok(match continues {
                true => Driven::Continue(Box::new(ClaimedJob {
                    context: std::sync::Arc::unwrap_or_clone(context),
                    ..next
                })),
                false => Driven::Recorded { advanced: false },
            });
        }
        inner.store.record(job, record).await?;
        published.publish(&inner.stream);
        if ended {
            crate::traces::run_ended(
                inner.store.clone(),
                job.tenant_id.clone(),
                job.run_id.clone(),
            );
        }
        return Ok(Driven::Recorded { advanced });
    }
    let mut tx = match claim.tx {
        Some(tx) => tx,
        None => inner.store.begin_record(job).await?,
    };
    let subject = record.subject_ticket_id.as_deref();
    // The incidents this record opens (or counts again), for the stream.
    let mut incidents = Vec::new();
    if claim.too_deep {
        incidents.push(effects::chain_too_deep(&mut *tx, job, automation, subject).await?);
    }
    for effect in &claim.effects {
        match effect {
            Effect::RunFailed(failure) => {
                let context = &record.context;
                incidents.push(
                    effects::run_failed(
                        &mut *tx, job, automation, subject, context, failure, cause,
                    )
                    .await?,
                );
            }
            Effect::CompensationFailed(failure) => {
                incidents.push(
                    effects::compensation_failed(
                        &mut *tx, job, automation, subject, failure, cause,
                    )
                    .await?,
                );
            }
            Effect::NotifyParent(notice) => {
                let ended = RunEnded {
                    run_id: job.run_id.to_string(),
                    status: notice.status,
                    output: notice.output.clone(),
                    error: notice.error.clone(),
                };
                tx.run_ended(ended).await?;
            }
        }
    }
    tx.commit(record).await?;
    for (id, created) in &incidents {
        published.incident(&job.run_id, id, *created);
    }
    published.publish(&inner.stream);
    if ended {
        crate::traces::run_ended(
            inner.store.clone(),
            job.tenant_id.clone(),
            job.run_id.clone(),
        );
    }
    Ok(Driven::Recorded { advanced })
}

/// The decider's loop for one claim: advance, run the step it hands out,
/// advance with its outcome, until the claim is over.
async fn run_claim(
    inner: &Inner,
    job: &ClaimedJob,
    automation: &Automation,
    mut state: RunState,
    cause: &Cause,
    running: &mut Running,
) -> Result<Claim, StoreError> {
    let kinds = |kind: &str| inner.registry.class(kind);
    let retries = |kind: &str| inner.registry.retry_policy(kind);
    let mut input = Input::from(job.resume.clone());
    if matches!(input, Input::Cancel { .. }) {
        cancel_live_steps(inner, job, automation, &state).await;
    } else if let Err(why) = authorize::check_tenant(&*inner.authorizer, &job.tenant_id).await {
        // The tenant's runs may not go on (suspended): nothing of the run
        // is decided or run, control steps included; it fails at the step
        // it is at, for good, as a step with side effects denied does.
        let (step_id, kind) = tok_core::flow::step_at(&automation.steps, &state.path)
            .map_or((job.path.as_str(), "unknown"), |s| {
                (s.id.as_str(), s.kind.as_str())
            });
        tracing::info!(run = %job.run_id, tenant = %job.tenant_id, %why, "the tenant's run may not go on");
        input = Input::StepFailed {
            error: authorize::denied(step_id, kind, &why),
            input: None,
            started_at: now_ms(),
        };
    }
    let mut records = Vec::new();
    let mut effects = Vec::new();
    let mut subject = job.subject_ticket_id.clone();
    let mut tx: Option<Box<dyn RecordTx>> = None;
    let mut too_deep = false;
    let mut external = None;
    loop {
        // A step in the record transaction may have given the run its
        // subject ticket: a wait about `"ticket"` waits about that one.
        state.subject.clone_from(&subject);
        let transition = {
            let mut rng = rand::rng();
            let mut env = Env {
                now: tok_store::now(),
                kinds: &kinds,
                rng: &mut rng,
                retries: &retries,
            };
            advance(automation, state, input, &mut env)
        };
        records.extend(transition.records);
        effects.extend(transition.effects);
        state = transition.state;
        let mut step = match transition.then {
            Then::Execute(step) => step,
            Then::Record(next) => {
                return Ok(Claim {
                    records,
                    effects,
                    state,
                    status: transition.status,
                    error: transition.error,
                    next,
                    subject,
                    too_deep,
                    tx,
                    external,
                });
            }
        };
        let started_at = now_ms();
        *running = Running {
            path: step.path.to_string(),
            step_id: step.step_id.clone(),
            kind: step.kind.clone(),
            attempt: step.attempt,
            started_at,
        };
        let span = tracing::info_span!(
            "step",
            step = %step.step_id,
            path = %step.path,
            kind = %step.kind,
            attempt = step.attempt,
            "otel.name" = "execute",
        );
        let trace = crate::traces::RunTrace::of(job.run_id.as_str(), state.context.as_value());
        let step_path = step.path.to_string();
        if crate::traces::enabled() {
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            let _ = span.set_parent(trace.step_context(
                job.run_id.as_str(),
                &step_path,
                step.attempt as i32,
            ));
        }
        let authorized = {
            let asked = StepToAuthorize {
                tenant_id: &job.tenant_id,
                run_id: &job.run_id,
                automation_id: &job.automation_id,
                step_id: &step.step_id,
                kind: &step.kind,
                path: &step.path.to_string(),
                attempt: step.attempt,
                actor: &state.context.as_value()["_event"]["actor"],
            };
            authorize::check(&*inner.authorizer, &asked).await
        };
        let outcome = match step.class {
            _ if authorized.is_err() => authorized.map(|()| StepOutcome::Done(Map::new())),
            StepClass::InTransaction => {
                if tx.is_none() {
                    tx = Some(inner.store.begin_record(job).await?);
                }
                let Some(tx) = tx.as_mut() else {
                    return Err(StoreError::NotFound("record transaction"));
                };
                let path = step.path.to_string();
                let mut cx = TxContext {
                    tx: &mut **tx,
                    subject: &mut subject,
                    cause,
                    step_id: &step.step_id,
                    path: &path,
                    attempt: step.attempt,
                    run_input: state.context.as_value().get("_body"),
                    too_deep: false,
                    signal_lookback: inner.config.signal_lookback,
                    traceparent: trace.for_child(
                        job.run_id.as_str(),
                        &step_path,
                        step.attempt as i32,
                    ),
                };
                let result = match inner.registry.in_transaction(&step.kind) {
                    Some(run) => {
                        run.run(&mut cx, &step.config)
                            .instrument(span.clone())
                            .await
                    }
                    None => Err(TxError::Step(StepError::terminal(format!(
                        "`{}` is not a step type that runs in the record transaction",
                        step.kind
                    )))),
                };
                too_deep |= cx.too_deep;
                match result {
                    Ok(outcome) => Ok(outcome),
                    Err(TxError::Step(e)) => Err(e),
                    Err(TxError::Store(e)) => return Err(e),
                }
            }
            StepClass::External | StepClass::Control => {
                external = Some(step.path.clone());
                let scope = std::mem::take(&mut step.scope);
                call_handler(inner, job, &step, scope, trace)
                    .instrument(span.clone())
                    .await
            }
        };
        span.in_scope(|| match &outcome {
            Ok(_) => tracing::debug!(ms = now_ms() - started_at, "step done"),
            Err(error) => tracing::info!(ms = now_ms() - started_at, %error, "step failed"),
        });
        let config = Some(step.config);
        input = match outcome {
            Ok(StepOutcome::Done(outputs)) => Input::StepDone {
                outputs,
                log: Vec::new(),
                input: config,
                started_at,
            },
            Ok(StepOutcome::Wait(wait)) => Input::StepWaits {
                wait: CustomWait {
                    keys: wait.keys,
                    mode: wait.mode,
                    subject: wait.subject,
                    filter: wait.filter,
                    timeout_ms: wait
                        .timeout
                        .map(|t| t.as_millis().min(i64::MAX as u128) as i64),
                    only_new: wait.only_new,
                    outputs: wait.outputs,
                    what: wait.what,
                },
                input: config,
                started_at,
            },
            Err(error) => Input::StepFailed {
                error,
                input: config,
                started_at,
            },
        };
    }
}

/// The claim's step records as they are stored: a successful step's long
/// input and output truncated unless the automation keeps step data or
/// the step is in the sample (`EngineConfig::step_sample`); see
/// [`tok_core::retention`]. The run's context is recorded apart, whole.
fn stored(inner: &Inner, automation: &Automation, records: Vec<StepRecord>) -> Vec<StepRecord> {
    let keep_all = automation.settings.keeps_step_data();
    let sample = inner.config.step_sample;
    records
        .into_iter()
        .map(|record| {
            let keep = keep_all || (sample > 0.0 && rand::random::<f64>() < sample);
            tok_core::retention::for_storage(record, keep)
        })
        .collect()
}

/// The steps and the run's end count in the metrics.
/// Describes the counters and summaries of steps and runs to the recorder
/// (also counted by the dispatch and the watch): the `# HELP` of each in
/// `/metrics`.
pub(crate) fn describe() {
    metrics::describe_counter!(
        "tok_steps_total",
        "Steps recorded, by tenant and by status (completed, failed, retrying, waiting, …)"
    );
    metrics::describe_histogram!(
        "tok_step_duration_seconds",
        metrics::Unit::Seconds,
        "How long a step took from its start to its record, by step type"
    );
    metrics::describe_counter!(
        "tok_runs_finished_total",
        "Runs that ended, by final status (completed, failed, cancelled, expired, …)"
    );
    metrics::describe_counter!(
        "tok_stale_completions_total",
        "Results of steps whose lease was lost while they ran, discarded (another claim's record counts)"
    );
}

fn count(job: &ClaimedJob, claim: &Claim) {
    for step in &claim.records {
        metrics::counter!(
            "tok_steps_total",
            "tenant" => job.tenant_id.to_string(),
            "status" => step.status.as_str()
        )
        .increment(1);
        // Per step type ("connector"): its count is the steps per second,
        // its quantiles the p95 (a parked wait has no duration).
        if step.status != tok_core::run::StepStatus::Waiting {
            let seconds = (step.finished_at - step.started_at).max(0) as f64 / 1000.0;
            metrics::histogram!("tok_step_duration_seconds", "type" => step.kind.clone())
                .record(seconds);
        }
    }
    if claim.status.is_final() {
        metrics::counter!("tok_runs_finished_total", "status" => claim.status.as_str())
            .increment(1);
    }
}

/// Runs a registered handler with no database connection held. A panic in
/// the handler is a terminal error, not a crash of the worker.
async fn call_handler(
    inner: &Inner,
    job: &ClaimedJob,
    step: &Execute,
    scope: std::sync::Arc<Value>,
    trace: crate::traces::RunTrace,
) -> Result<StepOutcome, StepError> {
    let Some(handler) = inner.registry.handler(&step.kind) else {
        return Err(StepError::terminal(format!(
            "no handler is registered for step type `{}`",
            step.kind
        )));
    };
    let path = step.path.to_string();
    let traceparent = trace.outbound(job.run_id.as_str(), &path, step.attempt as i32);
    let mut call = step_call(inner, job, path, &step.step_id, step.config.clone(), scope);
    call.attempt = step.attempt;
    call.traceparent = Some(traceparent);
    let resumed = match &step.resumed {
        Some(value) => Some(
            serde_json::from_value::<Resumed>(value.clone()).map_err(|e| {
                StepError::terminal(format!(
                    "what ended step `{}`'s wait does not read back: {e}",
                    step.step_id
                ))
            })?,
        ),
        None => None,
    };
    let handled = async move {
        match resumed {
            Some(resumed) => handler.resume(call, resumed).await.map(StepOutcome::Done),
            None => handler.handle(call).await,
        }
    }
    .instrument(tracing::Span::current());
    match tokio::spawn(handled).await {
        Ok(result) => result,
        Err(join) => Err(StepError::terminal(format!(
            "step `{}` panicked: {join}",
            step.step_id
        ))),
    }
}

/// A handler's call for the step at `path` of the claimed job's run.
fn step_call(
    inner: &Inner,
    job: &ClaimedJob,
    path: String,
    step_id: &str,
    config: Value,
    scope: std::sync::Arc<Value>,
) -> StepCall {
    StepCall {
        tenant_id: job.tenant_id.clone(),
        run_id: job.run_id.clone(),
        idempotency_key: format!("{}:{}", job.run_id, path),
        path,
        step_id: step_id.to_owned(),
        attempt: 1,
        job_id: job.id,
        lease_ms: inner.lease_ms(),
        config,
        context: scope,
        effects: crate::registry::Effects::in_store(inner.store.clone()),
        traceparent: None,
        lease: super::pool::lease_of(inner, job),
    }
}

/// A handler step whose record found its job gone: when its run was
/// cancelled (or is being undone) while the step ran, the step's
/// handler's `cancel` hook is called, once, by this worker, the only one
/// that ran it (a lease lost to another worker's claim calls nothing).
/// The run's context is read again for the config's templates.
async fn cancel_abandoned_step(
    inner: &Inner,
    job: &ClaimedJob,
    automation: &Automation,
    path: &FlowPath,
) {
    let detail = match inner.store.run(&job.tenant_id, &job.run_id).await {
        Ok(Some(detail)) => detail,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(run = %job.run_id, path = %path, error = %e, "could not read a run whose step lost its job; its cancel hook is not called");
            return;
        }
    };
    let status = detail.run.status.as_str();
    if status == RunStatus::Cancelled.as_str() || status == RunStatus::Compensating.as_str() {
        call_cancel_hook(inner, job, automation, path, &detail.context).await;
    }
}

/// Calls the `cancel` hook of the handler step at `path` (with its config
/// rendered against `context` as it would run); a step that is no
/// handler's calls nothing. A hook that fails is logged.
async fn call_cancel_hook(
    inner: &Inner,
    job: &ClaimedJob,
    automation: &Automation,
    path: &FlowPath,
    context: &Value,
) {
    let Some(step) = tok_core::flow::step_at(&automation.steps, path) else {
        return;
    };
    let Some(handler) = inner.registry.handler(&step.kind) else {
        return;
    };
    let scope = tok_core::flow::scope(&automation.steps, path, context);
    let config = tok_core::template::render_config(&step.config, &scope)
        .unwrap_or_else(|_| step.config.clone());
    let call = step_call(
        inner,
        job,
        path.to_string(),
        &step.id,
        config,
        std::sync::Arc::new(scope.into_owned()),
    );
    let step_id = step.id.clone();
    let hook = async move { handler.cancel(call).await };
    match tokio::spawn(hook).await {
        Ok(Ok(())) => tracing::info!(run = %job.run_id, step = %step_id, "cancel hook ran"),
        Ok(Err(error)) => {
            tracing::warn!(run = %job.run_id, step = %step_id, %error, "cancel hook failed")
        }
        Err(join) => {
            tracing::warn!(run = %job.run_id, step = %step_id, %join, "cancel hook panicked")
        }
    }
}

/// A cancelled run's custom steps that wait now: each handler's `cancel`
/// hook is called (with the step's config rendered as it would run)
/// before the decider takes the cancel, which makes them no longer live.
/// A hook that fails is logged; the cancel goes on.
async fn cancel_live_steps(
    inner: &Inner,
    job: &ClaimedJob,
    automation: &Automation,
    state: &RunState,
) {
    for (path, _) in tok_core::advance::custom::live(&state.context) {
        if let Ok(at) = path.parse::<FlowPath>() {
            call_cancel_hook(inner, job, automation, &at, state.context.as_value()).await;
        }
    }
}
