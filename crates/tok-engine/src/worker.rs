//! The worker pool: independent slots that each run one claimed job.
//!
//! Each round the pool claims as many jobs as it has free slots, in one
//! batch, and starts each without waiting for the others, so a slow step
//! never keeps a free slot idle. A job is one step — or a chain of built-in
//! steps that only decide (condition, set, loop, log, wait, end), which run
//! back to back and are written by the same record transaction. An external
//! step (a registered handler) runs with no database connection held and is
//! recorded by a second, short transaction. A heartbeat extends the leases
//! of the jobs in flight; a worker whose lease was taken over has its record
//! rejected by the claim token.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value, json};
use tok_core::builtin::{self, INTERNAL_TYPES, Outcome};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::flow::{self, Next};
use tok_core::ids::JobId;
use tok_core::limits::{MAX_ACTIONS, MAX_OUTPUT_BYTES};
use tok_core::path::FlowPath;
use tok_core::retry::RetryPolicy;
use tok_core::retry::{Decision, decide};
use tok_core::template;
use tok_store::{ClaimedJob, NextJob, Record, RunStatus, StepRecord, StoreError};
use tokio::sync::watch;

use crate::Inner;
use crate::registry::StepCall;

/// How many built-in steps one record transaction may chain before it hands
/// the rest of the run to a new job (so a long loop of `set` steps cannot
/// hold the writer for long).
const CHAIN_LIMIT: usize = 64;

pub(crate) async fn run_pool(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let in_flight: Arc<Mutex<HashSet<JobId>>> = Arc::default();
    let busy = Arc::new(AtomicUsize::new(0));
    let heartbeat = tokio::spawn(heartbeat(inner.clone(), in_flight.clone()));
    let concurrency = inner.config.concurrency.max(1);
    loop {
        if crate::stopping(&shutdown) {
            break;
        }
        let free = concurrency.saturating_sub(busy.load(Ordering::SeqCst));
        let mut claimed = 0;
        if free > 0 {
            let tenants = inner.tenants();
            match inner
                .store
                .claim(
                    &tenants,
                    &inner.config.node_id,
                    free as u32,
                    inner.lease_ms(),
                )
                .await
            {
                Ok(jobs) => {
                    claimed = jobs.len();
                    for job in jobs {
                        busy.fetch_add(1, Ordering::SeqCst);
                        in_flight
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(job.id);
                        let (inner, busy, in_flight) =
                            (inner.clone(), busy.clone(), in_flight.clone());
                        tokio::spawn(async move {
                            let id = job.id;
                            execute(&inner, job).await;
                            in_flight
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .remove(&id);
                            busy.fetch_sub(1, Ordering::SeqCst);
                            inner.work.notify_one();
                        });
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "claim failed; retrying shortly");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        // A full batch means more may be ready: claim again as soon as a slot frees.
        if claimed > 0 && claimed == free {
            tokio::select! {
                _ = inner.work.notified() => {}
                _ = shutdown.changed() => {}
            }
        } else {
            tokio::select! {
                _ = inner.work.notified() => {}
                _ = tokio::time::sleep(inner.config.poll_interval) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    // Let the steps in flight finish and record; a step that outlives the
    // grace period is taken over by another worker when its lease expires.
    let deadline = tokio::time::Instant::now() + inner.config.shutdown_grace;
    while busy.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    heartbeat.abort();
}

/// Extends the leases of the jobs in flight until the pool aborts it (after
/// the last step in flight has finished or the grace period ran out).
async fn heartbeat(inner: Arc<Inner>, in_flight: Arc<Mutex<HashSet<JobId>>>) {
    loop {
        tokio::time::sleep(inner.config.heartbeat).await;
        let ids: Vec<JobId> = in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        if let Err(e) = inner
            .store
            .heartbeat(&inner.config.node_id, &ids, inner.lease_ms())
            .await
        {
            tracing::warn!(error = %e, jobs = ids.len(), "heartbeat failed");
        }
    }
}

/// Runs one claimed job and records its outcome.
async fn execute(inner: &Inner, job: ClaimedJob) {
    let record = match inner
        .defs
        .get(
            &*inner.store,
            &job.tenant_id,
            &job.automation_id,
            job.version,
        )
        .await
    {
        Ok(automation) => run_job(inner, &job, &automation).await,
        Err(crate::EngineError::Store(e)) => {
            // The database is away: leave the job to be retried after its lease.
            tracing::error!(job = %job.id, error = %e, "could not load the definition");
            return;
        }
        Err(e) => fail_without_step(&job, e.to_string()),
    };
    let done = record.status.is_final();
    let advanced = matches!(record.next, NextJob::Step { delay_ms: 0, .. });
    match inner.store.record(&job, record).await {
        Ok(()) => {
            if advanced {
                inner.work.notify_one();
            }
            if done {
                tracing::debug!(run = %job.run_id, "run finished");
            }
        }
        Err(StoreError::LeaseLost(id)) => {
            tracing::warn!(job = %id, run = %job.run_id, "lease lost while the step ran; result discarded");
        }
        Err(e) => {
            tracing::error!(job = %job.id, run = %job.run_id, error = %e, "record failed; the job returns after its lease");
        }
    }
}

fn fail_without_step(job: &ClaimedJob, error: String) -> Record {
    Record {
        steps: Vec::new(),
        context: job.context.clone(),
        actions: job.actions,
        status: RunStatus::Failed,
        error: Some(error),
        next: NextJob::Done,
    }
}

fn now_ms() -> i64 {
    Timestamp::now().as_millisecond()
}

/// Executes the job's step (and the built-in steps chained after it) and
/// decides the record.
async fn run_job(inner: &Inner, job: &ClaimedJob, automation: &Automation) -> Record {
    let mut context = match &job.context {
        Value::Object(map) => Context(map.clone()),
        _ => Context(Map::new()),
    };
    let mut path: FlowPath = match job.path.parse() {
        Ok(p) => p,
        Err(e) => {
            return fail_without_step(job, format!("job path `{}` is not valid: {e}", job.path));
        }
    };
    let mut actions = job.actions;
    let mut attempt = job.attempt.max(1) as u32;
    let mut steps: Vec<StepRecord> = Vec::new();

    let finish = |context: Context, steps, actions, status, error, next| Record {
        steps,
        context: context.into_value(),
        actions,
        status,
        error,
        next,
    };

    loop {
        let Some(step) = flow::step_at(&automation.steps, &path) else {
            let error = format!("the run's version has no step at `{path}`");
            return finish(
                context,
                steps,
                actions,
                RunStatus::Failed,
                Some(error),
                NextJob::Done,
            );
        };
        let internal = INTERNAL_TYPES.contains(&step.kind.as_str());
        if !steps.is_empty() && (!internal || steps.len() >= CHAIN_LIMIT) {
            let next = NextJob::Step {
                path: path.to_string(),
                delay_ms: 0,
            };
            return finish(context, steps, actions, RunStatus::Running, None, next);
        }
        if actions >= MAX_ACTIONS as i32 {
            let error = format!(
                "the run was stopped before step `{}`: it had executed {MAX_ACTIONS} steps, \
                 the most one run may execute (loop iterations count)",
                step.id
            );
            return finish(
                context,
                steps,
                actions,
                RunStatus::Failed,
                Some(error),
                NextJob::Done,
            );
        }
        actions += 1;
        let started_at = now_ms();
        let view = flow::scope(&automation.steps, &path, &context.to_value());
        let (outcome, input) = if internal {
            (builtin::evaluate(step, &view, Timestamp::now()), None)
        } else {
            call_handler(inner, job, &path, step, attempt, view).await
        };
        let outcome = outcome.and_then(|o| check_output_size(&step.id, o));
        let mut record = StepRecord {
            path: path.to_string(),
            step_id: step.id.clone(),
            kind: step.kind.clone(),
            attempt: attempt as i32,
            status: "completed".into(),
            input,
            output: None,
            error: None,
            log: Vec::new(),
            started_at,
            finished_at: now_ms(),
        };
        let (outputs, log, wait_until) = match outcome {
            Ok(Outcome::Done { outputs, log }) => (outputs, log, None),
            Ok(Outcome::WaitUntil { until, log }) => {
                let mut outputs = Map::new();
                outputs.insert("until".into(), json!(until.to_string()));
                (outputs, log, Some(until))
            }
            Err(error) => {
                let policy =
                    RetryPolicy::resolve(step.retry.as_ref(), automation.settings.retry.as_ref());
                record.error = Some(error.message().to_owned());
                return match decide(&error, attempt, &policy, &mut rand::rng()) {
                    Decision::RetryIn(delay) => {
                        record.status = "retrying".into();
                        record.log.push(format!(
                            "attempt {attempt} of {} failed: {}; next attempt in {}",
                            policy.max_attempts,
                            error.message(),
                            humanize(delay)
                        ));
                        steps.push(record);
                        let next = NextJob::Retry {
                            delay_ms: delay.as_millis() as i64,
                        };
                        finish(context, steps, actions, RunStatus::Running, None, next)
                    }
                    Decision::Fail => {
                        record.status = "failed".into();
                        let why = if error.is_retryable() {
                            format!("gave up after {attempt} attempts")
                        } else {
                            "not retryable".to_owned()
                        };
                        record
                            .log
                            .push(format!("failed ({why}): {}", error.message()));
                        let run_error = format!("step `{}` failed: {}", step.id, error.message());
                        steps.push(record);
                        finish(
                            context,
                            steps,
                            actions,
                            RunStatus::Failed,
                            Some(run_error),
                            NextJob::Done,
                        )
                    }
                };
            }
        };
        context.publish(&step.id, &outputs);
        record.output = Some(Value::Object(outputs));
        record.log = log;
        steps.push(record);
        attempt = 1;
        let next = match flow::next(&automation.steps, &path, &context.to_value()) {
            Ok(next) => next,
            Err(e) => {
                let error = format!("could not decide the step after `{}`: {e}", step.id);
                return finish(
                    context,
                    steps,
                    actions,
                    RunStatus::Failed,
                    Some(error),
                    NextJob::Done,
                );
            }
        };
        match (next, wait_until) {
            (Next::Complete, _) => {
                return finish(
                    context,
                    steps,
                    actions,
                    RunStatus::Completed,
                    None,
                    NextJob::Done,
                );
            }
            (Next::Step(next), Some(until)) => {
                let delay_ms = (until.as_millisecond() - now_ms()).max(0);
                let next = NextJob::Step {
                    path: next.to_string(),
                    delay_ms,
                };
                return finish(context, steps, actions, RunStatus::Waiting, None, next);
            }
            (Next::Step(next), None) => path = next,
        }
    }
}

/// Runs a registered handler with no database connection held. A panic in
/// the handler is a terminal error, not a crash of the worker.
async fn call_handler(
    inner: &Inner,
    job: &ClaimedJob,
    path: &FlowPath,
    step: &tok_core::definition::Step,
    attempt: u32,
    view: Value,
) -> (Result<Outcome, StepError>, Option<Value>) {
    let Some(handler) = inner.registry.handler(&step.kind) else {
        let error = StepError::terminal(format!(
            "no handler is registered for step type `{}`",
            step.kind
        ));
        return (Err(error), None);
    };
    let config = match template::render_value(&step.config, &view) {
        Ok(config) => config,
        Err(e) => {
            return (
                Err(StepError::terminal(format!(
                    "step `{}` config: {e}",
                    step.id
                ))),
                None,
            );
        }
    };
    let call = StepCall {
        tenant_id: job.tenant_id.clone(),
        run_id: job.run_id.clone(),
        path: path.to_string(),
        step_id: step.id.clone(),
        idempotency_key: format!("{}:{}", job.run_id, path),
        attempt,
        config: config.clone(),
        context: view,
    };
    let outcome = match tokio::spawn(async move { handler.run(call).await }).await {
        Ok(Ok(outputs)) => Ok(Outcome::Done {
            outputs,
            log: Vec::new(),
        }),
        Ok(Err(e)) => Err(e),
        Err(join) => Err(StepError::terminal(format!(
            "step `{}` panicked: {join}",
            step.id
        ))),
    };
    (outcome, Some(config))
}

fn check_output_size(step_id: &str, outcome: Outcome) -> Result<Outcome, StepError> {
    if let Outcome::Done { outputs, .. } = &outcome {
        let size = serde_json::to_vec(outputs).map(|v| v.len()).unwrap_or(0);
        if size > MAX_OUTPUT_BYTES {
            return Err(StepError::terminal(format!(
                "step `{step_id}` returned {size} bytes of output; at most {MAX_OUTPUT_BYTES} are kept"
            )));
        }
    }
    Ok(outcome)
}

fn humanize(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 1.0 {
        format!("{} ms", d.as_millis())
    } else if secs < 120.0 {
        format!("{secs:.0} s")
    } else if secs < 7200.0 {
        format!("{:.0} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3600.0)
    }
}
