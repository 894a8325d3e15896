//! The worker pool: independent slots that each run one claimed job.
//!
//! Each round the pool claims as many jobs as it has free slots, in one
//! batch, and starts each without waiting for the others, so a slow step
//! never keeps a free slot idle. An eighth of the slots is kept for tenants
//! that hold none of the others, so one tenant's burst cannot hold every
//! slot while another tenant's job waits. The dispatcher may fill free
//! slots directly with the runs it creates ([`Offer`]).
//!
//! A job is one step — or a chain of built-in steps that only decide
//! (condition, set, loop, log, wait, end), which run back to back and are
//! written by the same record transaction. (Those a run begins with ran in
//! its dispatch already: `dispatcher::run_pure_prefix`.) An external step
//! (a registered handler) runs with no database connection held and is
//! recorded by a second, short transaction. A heartbeat extends the leases of the jobs in
//! flight; a worker whose lease was taken over has its record rejected by
//! the claim token.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value, json};
use tok_core::builtin::{self, INTERNAL_TYPES, Outcome};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::flow::{self, Next};
use tok_core::ids::{JobId, TenantId};
use tok_core::limits::{MAX_ACTIONS, MAX_OUTPUT_BYTES};
use tok_core::path::FlowPath;
use tok_core::retry::RetryPolicy;
use tok_core::retry::{Decision, decide};
use tok_core::template;
use tok_store::{
    Cause, ClaimedJob, NewIncident, NewInternalEvent, NextJob, Record, RecordTx, RunStatus,
    StepRecord, StepStatus, StoreError, now_ms,
};
use tokio::sync::watch;

use crate::Inner;
use crate::registry::StepCall;
use crate::steps::{self, TxContext, TxError};

/// How many built-in steps one record transaction may chain before it hands
/// the rest of the run to a new job (so a long loop of `set` steps cannot
/// hold the writer for long).
const CHAIN_LIMIT: usize = 64;

/// Slots kept for tenants holding no other slot: a tenant whose burst
/// holds every other slot cannot make another tenant's job wait for one of
/// its slots to free. An eighth of the slots (none below four).
fn reserved_slots(concurrency: usize) -> usize {
    if concurrency < 4 {
        0
    } else {
        (concurrency / 8).max(1)
    }
}

/// The pool's slots: the jobs in flight in this process, and the slots a
/// dispatch in progress was promised for the runs it starts itself.
#[derive(Default)]
pub(crate) struct Slots {
    /// Whether the pool runs (and a dispatch may hand it jobs).
    open: bool,
    /// By job: its tenant, and whether it holds a reserved slot.
    jobs: HashMap<JobId, (TenantId, bool)>,
    promised_general: usize,
    promised_reserved: usize,
}

impl Slots {
    /// Busy general and reserved slots, promised ones included.
    fn busy(&self) -> (usize, usize) {
        let reserved = self.jobs.values().filter(|(_, r)| *r).count();
        (
            self.jobs.len() - reserved + self.promised_general,
            reserved + self.promised_reserved,
        )
    }

    /// General slots running a job (not promised ones).
    fn running_general(&self) -> usize {
        self.jobs.values().filter(|(_, reserved)| !reserved).count()
    }

    /// Tenants holding a general slot: the reserved slots are for the others.
    fn holding_general(&self) -> HashSet<TenantId> {
        self.jobs
            .values()
            .filter(|(_, reserved)| !reserved)
            .map(|(t, _)| t.clone())
            .collect()
    }
}

fn slots(inner: &Inner) -> std::sync::MutexGuard<'_, Slots> {
    inner.slots.lock().unwrap_or_else(|e| e.into_inner())
}

/// The free slots a dispatch may fill with the runs it creates, so that a
/// run whose first step is due starts without waiting for a claim — above
/// all a tenant's first run while another tenant's backlog holds the
/// general slots. The slots stay promised until [`Offer::accept`].
pub(crate) struct Offer {
    general: usize,
    reserved: usize,
    general_left: usize,
    reserved_left: usize,
    /// Free slots of both kinds, promised or not ([`Offer::free`]).
    free: usize,
    holding_general: HashSet<TenantId>,
    /// Reserved slots taken, by tenant.
    took_reserved: HashMap<TenantId, usize>,
}

impl Offer {
    /// The slots free now (at most `limit` general ones, and reserved ones
    /// up to `limit` or half of them unless `all_reserved`), or `None` when
    /// there are none or no pool runs here.
    pub(crate) fn new(inner: &Inner, limit: usize, all_reserved: bool) -> Option<Self> {
        let mut slots = slots(inner);
        if !slots.open {
            return None;
        }
        let concurrency = inner.config.concurrency.max(1);
        let reserved_total = reserved_slots(concurrency);
        let (general_busy, reserved_busy) = slots.busy();
        let general = (concurrency - reserved_total)
            .saturating_sub(general_busy)
            .min(limit);
        let share = match all_reserved {
            true => reserved_total,
            false => reserved_total / 2,
        };
        let reserved_free = reserved_total.saturating_sub(reserved_busy).min(limit);
        let reserved = reserved_free.min(share);
        if general == 0 && reserved == 0 {
            return None;
        }
        slots.promised_general += general;
        slots.promised_reserved += reserved;
        Some(Self {
            general,
            reserved,
            free: general + reserved_free,
            general_left: general,
            reserved_left: reserved,
            holding_general: slots.holding_general(),
            took_reserved: HashMap::new(),
        })
    }

    /// How many slots were free when it was made, those kept back from
    /// it among them: a dispatch takes as many events, so a burst of
    /// webhooks is dispatched in one transaction whoever runs its runs.
    pub(crate) fn free(&self) -> usize {
        self.free
    }

    /// Whether a new run of `tenant` takes a slot: a general one while any
    /// is free, else a reserved one if the tenant holds no general slot.
    pub(crate) fn take(&mut self, tenant: &TenantId) -> bool {
        if self.general_left > 0 {
            self.general_left -= 1;
            self.holding_general.insert(tenant.clone());
            true
        } else if self.reserved_left > 0 && !self.holding_general.contains(tenant) {
            self.reserved_left -= 1;
            *self.took_reserved.entry(tenant.clone()).or_default() += 1;
            true
        } else {
            false
        }
    }

    /// Starts the jobs the dispatch wrote claimed, and frees what it
    /// promised (jobs it did not write, or the dispatch failed).
    pub(crate) fn accept(mut self, inner: &Arc<Inner>, jobs: Vec<ClaimedJob>) {
        {
            let mut slots = slots(inner);
            slots.promised_general -= self.general;
            slots.promised_reserved -= self.reserved;
        }
        for job in jobs {
            let reserved = match self.took_reserved.get_mut(&job.tenant_id) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            };
            start(inner, job, reserved);
        }
        inner.work.notify_one();
    }
}

pub(crate) async fn run_pool(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    slots(&inner).open = true;
    let heartbeat = tokio::spawn(heartbeat(inner.clone()));
    let concurrency = inner.config.concurrency.max(1);
    let reserved = reserved_slots(concurrency);
    let general = concurrency - reserved;
    loop {
        if crate::stopping(&shutdown) {
            break;
        }
        let (general_busy, reserved_busy) = slots(&inner).busy();
        let free = general.saturating_sub(general_busy);
        let tenants = inner.tenants();
        let mut claimed = 0;
        if free > 0 {
            claimed = claim_and_start(&inner, &tenants, free, false).await;
        }
        // The general slots are full of running jobs and more may be
        // waiting: tenants holding none of them may take the reserved ones.
        // (Slots promised to a dispatch in progress are not full: that
        // dispatch starts its runs in them or frees them.)
        let reserve_free = reserved.saturating_sub(reserved_busy);
        if claimed == free && reserve_free > 0 && slots(&inner).running_general() >= general {
            let newcomers: Vec<TenantId> = {
                let holding = slots(&inner).holding_general();
                tenants
                    .iter()
                    .filter(|t| !holding.contains(t))
                    .cloned()
                    .collect()
            };
            claim_and_start(&inner, &newcomers, reserve_free, true).await;
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
    slots(&inner).open = false;
    let deadline = tokio::time::Instant::now() + inner.config.shutdown_grace;
    while {
        let slots = slots(&inner);
        !slots.jobs.is_empty() || slots.promised_general + slots.promised_reserved > 0
    } && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    heartbeat.abort();
}

/// Claims up to `limit` jobs of `tenants` and starts each in its own task;
/// returns how many it claimed.
async fn claim_and_start(
    inner: &Arc<Inner>,
    tenants: &[TenantId],
    limit: usize,
    reserved: bool,
) -> usize {
    let jobs = match inner
        .store
        .claim(
            tenants,
            &inner.config.node_id,
            limit as u32,
            inner.lease_ms(),
        )
        .await
    {
        Ok(jobs) => jobs,
        Err(e) => {
            tracing::error!(error = %e, "claim failed; retrying shortly");
            tokio::time::sleep(Duration::from_secs(1)).await;
            return 0;
        }
    };
    let claimed = jobs.len();
    for job in jobs {
        start(inner, job, reserved);
    }
    claimed
}

/// Runs a job claimed for this pool in its own task, in a general or a
/// reserved slot.
fn start(inner: &Arc<Inner>, job: ClaimedJob, reserved: bool) {
    slots(inner)
        .jobs
        .insert(job.id, (job.tenant_id.clone(), reserved));
    let inner = inner.clone();
    tokio::spawn(async move {
        let id = job.id;
        execute(&inner, job).await;
        slots(&inner).jobs.remove(&id);
        inner.work.notify_one();
    });
}

/// Extends the leases of the jobs in flight until the pool aborts it (after
/// the last step in flight has finished or the grace period ran out).
async fn heartbeat(inner: Arc<Inner>) {
    loop {
        tokio::time::sleep(inner.config.heartbeat).await;
        let ids: Vec<JobId> = slots(&inner).jobs.keys().copied().collect();
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
            let record = fail_without_step(&job, e.to_string());
            if let Err(e) = inner.store.record(&job, record).await {
                tracing::error!(job = %job.id, error = %e, "could not record a broken definition");
            }
            return;
        }
    };
    let mut job = job;
    // A run whose next step is due at once keeps its slot and lease for up
    // to this many steps, without a claim in between; then it queues again
    // like everyone else.
    let mut budget = CONTINUE_LIMIT;
    loop {
        // The job's context moves into the chain; the store needs the
        // rest of the job (its key and token) to fence the record.
        let context = std::mem::take(&mut job.context);
        match drive(inner, &job, context, &automation, budget > 0).await {
            Ok(Driven::Continue(next)) => {
                job = next;
                budget -= 1;
            }
            Ok(Driven::Recorded { advanced }) => {
                if advanced {
                    inner.work.notify_one();
                }
                return;
            }
            Err(StoreError::LeaseLost(id)) => {
                tracing::warn!(job = %id, run = %job.run_id, "lease lost while the step ran; result discarded");
                return;
            }
            Err(e) => {
                tracing::error!(job = %job.id, run = %job.run_id, error = %e, "record failed; the job returns after its lease");
                return;
            }
        }
    }
}

/// Steps one claim may run back to back before its job queues again.
const CONTINUE_LIMIT: u32 = 16;

/// How a claim's record ended.
enum Driven {
    /// Recorded; `advanced` when the run's next step is due now (for another claim).
    Recorded { advanced: bool },
    /// Recorded, and the job stays leased to this worker for its next step.
    Continue(ClaimedJob),
}

fn fail_without_step(job: &ClaimedJob, error: String) -> Record {
    Record {
        steps: Vec::new(),
        context: job.context.clone(),
        actions: job.actions,
        status: RunStatus::Failed,
        error: Some(error),
        next: NextJob::Done,
        subject_ticket_id: job.subject_ticket_id.clone(),
    }
}

/// How a step type runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Decided by `tok-core` from the context alone.
    Pure,
    /// Runs inside the record transaction (touches only our database).
    InTransaction,
    /// A handler, run with no database connection held.
    External,
}

fn kind_of(step: &tok_core::definition::Step) -> Kind {
    if INTERNAL_TYPES.contains(&step.kind.as_str()) {
        Kind::Pure
    } else if steps::TX_TYPES.contains(&step.kind.as_str()) {
        Kind::InTransaction
    } else {
        Kind::External
    }
}

/// What the chain of steps of one claim came to.
struct Ending {
    status: RunStatus,
    error: Option<String>,
    next: NextJob,
    /// The failed step, when the run failed at one.
    failed: Option<Failure>,
}

struct Failure {
    step_id: String,
    path: String,
    kind: String,
    attempt: u32,
    message: String,
}

impl Ending {
    fn new(status: RunStatus, error: Option<String>, next: NextJob) -> Self {
        Self {
            status,
            error,
            next,
            failed: None,
        }
    }
}

/// Executes the job's step (and the built-in steps chained after it),
/// then records everything in one transaction. When the run's next step
/// is due now and `may_continue`, the job stays leased for it.
async fn drive(
    inner: &Inner,
    job: &ClaimedJob,
    context: Value,
    automation: &Automation,
    may_continue: bool,
) -> Result<Driven, StoreError> {
    let mut context = Context::from_value(context);
    let mut subject = job.subject_ticket_id.clone();
    let mut actions = job.actions;
    let mut steps: Vec<StepRecord> = Vec::new();
    let mut tx: Option<Box<dyn RecordTx>> = None;
    let mut too_deep = false;
    let cause = Cause {
        run_id: Some(job.run_id.clone()),
        automation_id: Some(job.automation_id.clone()),
        depth: job.depth,
        actor: format!("automation \u{201c}{}\u{201d}", automation.name),
    };
    let ending = match job.path.parse::<FlowPath>() {
        Err(e) => Ending::new(
            RunStatus::Failed,
            Some(format!("job path `{}` is not valid: {e}", job.path)),
            NextJob::Done,
        ),
        Ok(path) => {
            let mut chain = Chain {
                inner,
                job,
                automation,
                context: &mut context,
                subject: &mut subject,
                actions: &mut actions,
                steps: &mut steps,
                tx: &mut tx,
                too_deep: &mut too_deep,
                cause: &cause,
            };
            chain.run(path).await?
        }
    };
    for step in &steps {
        metrics::counter!(
            "tok_steps_total",
            "tenant" => job.tenant_id.to_string(),
            "status" => step.status.as_str()
        )
        .increment(1);
    }
    if ending.status.is_final() {
        metrics::counter!("tok_runs_finished_total", "status" => ending.status.as_str())
            .increment(1);
    }
    let advanced = matches!(ending.next, NextJob::Step { delay_ms: 0, .. });
    let needs_tx = tx.is_some() || too_deep || ending.failed.is_some();
    let record = Record {
        steps,
        context: context.into_value(),
        actions,
        status: ending.status,
        error: ending.error,
        next: ending.next,
        subject_ticket_id: subject,
    };
    if !needs_tx {
        // Nothing else to write with it: the record joins the store's group
        // commit with other claims' records.
        if let (true, NextJob::Step { path, delay_ms: 0 }) = (may_continue, &record.next) {
            let next = ClaimedJob {
                path: path.clone(),
                attempt: 1,
                claim_token: tok_store::random_token(),
                context: record.context.clone(),
                actions: record.actions,
                subject_ticket_id: record.subject_ticket_id.clone(),
                ..job.clone()
            };
            let mut record = record;
            record.next = NextJob::Continue {
                path: next.path.clone(),
                token: next.claim_token.clone(),
                lease_ms: inner.lease_ms(),
            };
            return Ok(match inner.store.record_and_continue(job, record).await? {
                true => Driven::Continue(next),
                false => Driven::Recorded { advanced: false },
            });
        }
        inner.store.record(job, record).await?;
        return Ok(Driven::Recorded { advanced });
    }
    let mut tx = match tx {
        Some(tx) => tx,
        None => inner.store.begin_record(job).await?,
    };
    let subject = record.subject_ticket_id.clone();
    if too_deep {
        raise_too_deep(&mut *tx, job, automation, subject.as_deref()).await?;
    }
    if let Some(failure) = &ending.failed {
        raise_failure(
            &mut *tx,
            job,
            automation,
            subject.as_deref(),
            &record.context,
            failure,
            &cause,
        )
        .await?;
    }
    tx.commit(record).await?;
    Ok(Driven::Recorded { advanced })
}

/// The state of one claim's chain of steps.
struct Chain<'a> {
    inner: &'a Inner,
    job: &'a ClaimedJob,
    automation: &'a Automation,
    context: &'a mut Context,
    subject: &'a mut Option<String>,
    actions: &'a mut i32,
    steps: &'a mut Vec<StepRecord>,
    tx: &'a mut Option<Box<dyn RecordTx>>,
    too_deep: &'a mut bool,
    cause: &'a Cause,
}

impl Chain<'_> {
    async fn run(&mut self, mut path: FlowPath) -> Result<Ending, StoreError> {
        let automation = self.automation;
        let mut attempt = self.job.attempt.max(1) as u32;
        loop {
            let Some(step) = flow::step_at(&automation.steps, &path) else {
                let error = format!("the run's version has no step at `{path}`");
                return Ok(Ending::new(RunStatus::Failed, Some(error), NextJob::Done));
            };
            let kind = kind_of(step);
            if !self.steps.is_empty() && (kind == Kind::External || self.steps.len() >= CHAIN_LIMIT)
            {
                let next = NextJob::Step {
                    path: path.to_string(),
                    delay_ms: 0,
                };
                return Ok(Ending::new(RunStatus::Running, None, next));
            }
            if *self.actions >= MAX_ACTIONS as i32 {
                let error = format!(
                    "the run was stopped before step `{}`: it had executed {MAX_ACTIONS} steps, \
                     the most one run may execute (loop iterations count)",
                    step.id
                );
                return Ok(Ending::new(RunStatus::Failed, Some(error), NextJob::Done));
            }
            *self.actions += 1;
            let started_at = now_ms();
            let view = flow::scope(&automation.steps, &path, self.context.as_value());
            let (outcome, input) = match kind {
                Kind::Pure => (builtin::evaluate(step, &view, Timestamp::now()), None),
                Kind::InTransaction => {
                    let view = view.into_owned();
                    self.in_transaction(step, &view).await?
                }
                Kind::External => {
                    let view = view.into_owned();
                    call_handler(self.inner, self.job, &path, step, attempt, view).await
                }
            };
            let outcome = outcome.and_then(|o| check_output_size(&step.id, o));
            let mut record = StepRecord {
                path: path.to_string(),
                step_id: step.id.clone(),
                kind: step.kind.clone(),
                attempt: attempt as i32,
                status: StepStatus::Completed,
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
                Err(error) => return Ok(self.failed(step, &path, attempt, record, &error)),
            };
            self.context.publish(&step.id, &outputs);
            record.output = Some(Value::Object(outputs));
            record.log = log;
            self.steps.push(record);
            attempt = 1;
            let next = match flow::next(&automation.steps, &path, self.context.as_value()) {
                Ok(next) => next,
                Err(e) => {
                    let error = format!("could not decide the step after `{}`: {e}", step.id);
                    return Ok(Ending::new(RunStatus::Failed, Some(error), NextJob::Done));
                }
            };
            match (next, wait_until) {
                (Next::Complete, _) => {
                    return Ok(Ending::new(RunStatus::Completed, None, NextJob::Done));
                }
                (Next::Step(next), Some(until)) => {
                    let delay_ms = (until.as_millisecond() - now_ms()).max(0);
                    let next = NextJob::Step {
                        path: next.to_string(),
                        delay_ms,
                    };
                    return Ok(Ending::new(RunStatus::Waiting, None, next));
                }
                (Next::Step(next), None) => path = next,
            }
        }
    }

    /// Runs a service-desk step inside the record transaction (opened here
    /// on first use, after the claim token was checked).
    async fn in_transaction(
        &mut self,
        step: &tok_core::definition::Step,
        view: &Value,
    ) -> Result<(Result<Outcome, StepError>, Option<Value>), StoreError> {
        let config = match template::render_value(&step.config, view) {
            Ok(config) => config,
            Err(e) => {
                let error = StepError::terminal(format!("step `{}` config: {e}", step.id));
                return Ok((Err(error), None));
            }
        };
        if self.tx.is_none() {
            *self.tx = Some(self.inner.store.begin_record(self.job).await?);
        }
        let Some(tx) = self.tx.as_mut() else {
            return Err(StoreError::NotFound("record transaction"));
        };
        let mut cx = TxContext {
            tx: &mut **tx,
            subject: &mut *self.subject,
            cause: self.cause,
            step_id: &step.id,
            too_deep: false,
            signal_lookback: self.inner.config.signal_lookback,
        };
        let result = steps::run(&step.kind, &mut cx, &config).await;
        *self.too_deep |= cx.too_deep;
        match result {
            Ok(outputs) => Ok((
                Ok(Outcome::Done {
                    outputs,
                    log: Vec::new(),
                }),
                Some(config),
            )),
            Err(TxError::Step(e)) => Ok((Err(e), Some(config))),
            Err(TxError::Store(e)) => Err(e),
        }
    }

    /// A step failed: retry it later if its error and the policy allow,
    /// otherwise fail the run.
    fn failed(
        &mut self,
        step: &tok_core::definition::Step,
        path: &FlowPath,
        attempt: u32,
        mut record: StepRecord,
        error: &StepError,
    ) -> Ending {
        if let StepError::Deferred { message, after } = error {
            // Held back before it called anything: no attempt is spent and
            // there is nothing to record but the wait.
            tracing::debug!(step = %step.id, run = %self.job.run_id, %message, "step deferred");
            *self.actions -= 1;
            let next = NextJob::Retry {
                path: path.to_string(),
                attempts: attempt as i32 - 1,
                delay_ms: after.as_millis() as i64,
            };
            return Ending::new(RunStatus::Running, None, next);
        }
        let policy =
            RetryPolicy::resolve(step.retry.as_ref(), self.automation.settings.retry.as_ref());
        record.error = Some(error.message().to_owned());
        match decide(error, attempt, &policy, &mut rand::rng()) {
            Decision::RetryIn(delay) => {
                record.status = StepStatus::Retrying;
                record.log.push(format!(
                    "attempt {attempt} of {} failed: {}; next attempt in {}",
                    policy.max_attempts,
                    error.message(),
                    humanize(delay)
                ));
                self.steps.push(record);
                let next = NextJob::Retry {
                    path: path.to_string(),
                    attempts: attempt as i32,
                    delay_ms: delay.as_millis() as i64,
                };
                Ending::new(RunStatus::Running, None, next)
            }
            Decision::Fail => {
                record.status = StepStatus::Failed;
                let why = if error.is_retryable() {
                    format!("gave up after {attempt} attempts")
                } else {
                    "not retryable".to_owned()
                };
                record
                    .log
                    .push(format!("failed ({why}): {}", error.message()));
                self.steps.push(record);
                Ending {
                    status: RunStatus::Failed,
                    error: Some(format!("step `{}` failed: {}", step.id, error.message())),
                    next: NextJob::Done,
                    failed: Some(Failure {
                        step_id: step.id.clone(),
                        path: path.to_string(),
                        kind: step.kind.clone(),
                        attempt,
                        message: error.message().to_owned(),
                    }),
                }
            }
        }
    }
}

/// A run failed for good: an incident for the tenant (title and impact in
/// their words, the detail for the platform admin) and a line in its
/// ticket's trace, in the record transaction.
async fn raise_failure(
    tx: &mut dyn RecordTx,
    job: &ClaimedJob,
    automation: &Automation,
    subject: Option<&str>,
    context: &Value,
    failure: &Failure,
    cause: &Cause,
) -> Result<(), StoreError> {
    let ticket = match subject {
        Some(id) => tx.ticket(id).await?,
        None => None,
    };
    let (title, impact) = match &ticket {
        Some(t) => (
            format!(
                "The automation \u{201c}{}\u{201d} did not finish for ticket {}",
                automation.name, t.external_id
            ),
            format!(
                "The automation for ticket {} did not finish; no data was lost. \
                 It can be retried from where it stopped.",
                t.external_id
            ),
        ),
        None => (
            format!(
                "The automation \u{201c}{}\u{201d} did not finish",
                automation.name
            ),
            "An event was received but its automation did not finish; no data was lost. \
             It can be retried from where it stopped."
                .to_owned(),
        ),
    };
    let mut all_steps = tx.run_steps().await?;
    all_steps.retain(|s| s.path != failure.path || s.status != "failed");
    let detail = json!({
        "automation": { "id": job.automation_id, "name": automation.name, "version": job.version },
        "run_id": job.run_id,
        "failed_step": { "id": failure.step_id, "path": failure.path, "type": failure.kind },
        "attempts": failure.attempt,
        "message": failure.message,
        "steps_before": all_steps,
        "input": context.get("_body"),
        "event": context.get("_event"),
    });
    tx.open_incident(NewIncident {
        source: format!("run-failed:{}:{}", job.automation_id, failure.step_id),
        title,
        impact,
        detail,
        run_id: Some(job.run_id.clone()),
        ticket_id: ticket.as_ref().map(|t| t.id.clone()),
    })
    .await?;
    if let Some(t) = &ticket {
        let message = format!(
            "Automation \u{201c}{}\u{201d} failed at step {}: {}",
            automation.name, failure.step_id, failure.message
        );
        tx.trace(&t.id, "run_failed", &message, cause).await?;
    }
    // Automations may react to failures (`run.failed`); the depth limit and
    // the own-change rule keep a failing reaction from looping.
    let event = NewInternalEvent {
        event_type: "run.failed".into(),
        payload: json!({
            "run": {
                "id": job.run_id,
                "automationId": job.automation_id,
                "automationName": automation.name,
                "failedStep": failure.step_id,
                "error": failure.message,
            },
            "ticket": ticket.as_ref().map(|t| t.event_view()),
        }),
        subject_ticket_id: ticket.as_ref().map(|t| t.id.clone()),
    };
    tx.emit(event, cause).await?;
    Ok(())
}

/// A change could not raise its event because the chain of automations
/// that led to it is too deep: alert the tenant (the trace says it too).
async fn raise_too_deep(
    tx: &mut dyn RecordTx,
    job: &ClaimedJob,
    automation: &Automation,
    subject: Option<&str>,
) -> Result<(), StoreError> {
    tracing::warn!(run = %job.run_id, automation = %job.automation_id, depth = job.depth, "event chain too deep; event dropped");
    tx.open_incident(NewIncident {
        source: format!("loop:{}", job.automation_id),
        title: format!(
            "Automations keep triggering each other (last: \u{201c}{}\u{201d})",
            automation.name
        ),
        impact: "A chain of automations that trigger each other was stopped after 5 levels; \
                 the last change did not start further automations. Check the automations that \
                 react to each other's changes."
            .into(),
        detail: json!({
            "automation": { "id": job.automation_id, "name": automation.name },
            "run_id": job.run_id,
            "depth": job.depth,
        }),
        run_id: Some(job.run_id.clone()),
        ticket_id: subject.map(str::to_owned),
    })
    .await?;
    Ok(())
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
        job_id: job.id,
        lease_ms: inner.lease_ms(),
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

/// A step's outputs past [`MAX_OUTPUT_BYTES`] fail it: they are not kept.
pub(crate) fn check_output_size(step_id: &str, outcome: Outcome) -> Result<Outcome, StepError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(general: usize, reserved: usize, holding: &[&str]) -> Offer {
        Offer {
            general,
            reserved,
            general_left: general,
            reserved_left: reserved,
            free: general + reserved,
            holding_general: holding
                .iter()
                .map(|t| TenantId::from(t.to_string()))
                .collect(),
            took_reserved: HashMap::new(),
        }
    }

    fn tenant(name: &str) -> TenantId {
        TenantId::from(name.to_string())
    }

    #[test]
    fn an_offer_fills_general_slots_first_then_reserved_ones_for_other_tenants() {
        let mut offer = offer(1, 2, &["big"]);
        assert!(offer.take(&tenant("big")), "a free general slot");
        assert!(!offer.take(&tenant("big")), "big holds general slots");
        assert!(offer.take(&tenant("small")), "a reserved slot");
        assert!(offer.take(&tenant("small")), "the second reserved slot");
        assert!(!offer.take(&tenant("third")), "every slot taken");
        assert_eq!(offer.took_reserved.get(&tenant("small")), Some(&2));
    }

    #[test]
    fn a_tenant_given_a_general_slot_by_this_offer_does_not_take_a_reserved_one() {
        let mut offer = offer(1, 1, &[]);
        assert!(offer.take(&tenant("a")));
        assert!(!offer.take(&tenant("a")), "a now holds a general slot");
        assert!(offer.take(&tenant("b")));
    }
}
