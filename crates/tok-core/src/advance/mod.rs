//! The one decider of a run: [`advance`] takes the run's state and what just
//! happened to it, and returns what happens next as data.
//!
//! Everything that moves a run forward is an [`Input`]: the start of a claim,
//! a step that an executor ran (in the record transaction or outside it), a
//! signal or a timeout that resumed a wait, the end of runs it waited for
//! ([`crate::children`]), a cancel (which undoes the run's completed steps,
//! [`crate::compensation`]). The decider publishes outputs,
//! chains the control steps it can decide by itself (conditions, loops,
//! `set`, log lines, waits, `end`), and stops at the first step it cannot:
//! one that an executor must run ([`Then::Execute`]), or the end of the claim
//! ([`Then::Record`], with the job's next move). The worker and the
//! dispatcher only load the state, call `advance`, carry out what it says and
//! write the transition in one record transaction; nothing else decides.
//!
//! The decider never reads a clock or draws a random number of its own:
//! [`Env`] brings the time, the step classes of the engine's registry and the
//! retry jitter, so a test states a state and an input and compares the
//! transition.

pub mod custom;
mod items;
mod signals;
mod waiting;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::approval::APPROVAL;
use crate::builtin::{self, Outcome, WAIT};
use crate::children::{self, RUN_WORKFLOW, WAIT_FOR_RUNS};
use crate::compensation;
use crate::condition_wait::WAIT_FOR_CONDITION;
use crate::context::Context;
use crate::definition::{Automation, Step};
use crate::error::StepError;
use crate::escalation;
use crate::flow::{self, Next};
use crate::for_each::{self, FOR_EACH};
use crate::ids::RunId;
use crate::limits::{MAX_ACTIONS, MAX_NESTING_DEPTH, MAX_OUTPUT_BYTES};
use crate::parallel::{self, PARALLEL};
use crate::path::Branch;
use crate::path::FlowPath;
use crate::repeat::{self, Again, REPEAT};
use crate::retry::{Decision, RetryPolicy, decide};
use crate::run::{NextJob, Resume, RunEnded, RunStatus, StepRecord, StepStatus};
use crate::template;
use crate::waits::signal_wait;

// Values of the decision that the step modules below use too: they are
// defined there and re-exported here, so that `advance::X` still names them.
pub use crate::control::is_control;
pub use crate::custom_wait::CustomWait;
pub use crate::duration::humanize;
pub use crate::incident::Failure;
pub use crate::waits::WAIT_FOR_EVENT;

/// Whether the step at `path` waits for signals now: a `wait_for_event`,
/// an `approval` (its decision is a signal), or a step that asked to wait
/// ([`custom`]). They all park, take their signals, time out and
/// escalate the one way ([`signals`]); only their ends differ.
fn waits_for_signals(step: &Step, context: &Context, path: &FlowPath) -> bool {
    step.kind == WAIT_FOR_EVENT
        || step.kind == APPROVAL
        || custom::is_live(context, &path.to_string())
}

/// Who runs a step type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepClass {
    /// Decided here, from the scope and the time alone.
    Control,
    /// Run inside the record transaction: it touches only tok's own
    /// database, so its effect and its record commit together.
    InTransaction,
    /// Run with no database connection held (a service call, a script).
    External,
}

/// What the decider is given besides the state and the input.
pub struct Env<'a> {
    pub now: Timestamp,
    /// The class of a step type that is not a control step (the engine's
    /// registry answers; an unknown type is `External`, whose missing handler
    /// then fails the step).
    pub kinds: &'a dyn Fn(&str) -> StepClass,
    /// Draws the retry jitter; a seeded one makes a decision repeatable.
    pub rng: &'a mut dyn rand::RngCore,
    /// The retry policy a step type's handler gives its steps, used when a
    /// step sets none of its own (before the automation's).
    pub retries: &'a dyn Fn(&str) -> Option<RetryPolicy>,
}

/// Where a run stands, as far as its decisions go.
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    /// The step the run is at.
    pub path: FlowPath,
    /// The attempt of the step at `path` (1 on the first).
    pub attempt: u32,
    pub context: Context,
    /// Steps executed so far, toward [`MAX_ACTIONS`].
    pub actions: i32,
    /// Steps recorded by this claim so far.
    pub recorded: usize,
    /// Most steps one claim may record before its job queues again.
    pub chain_limit: usize,
    /// The serialized size of the context as far as this claim counted it
    /// (`None` until a step's outputs are first measured against the
    /// state's limit).
    pub state_bytes: Option<usize>,
    /// The run's subject ticket: its event's ticket, or the one the last
    /// `ticket/upsert` gave. A wait for signals about `"ticket"` waits
    /// for signals about this one.
    pub subject: Option<String>,
}

impl RunState {
    /// A claim's state at `path`, before it ran anything.
    pub fn at(path: FlowPath, attempt: u32, context: Context, actions: i32) -> Self {
        Self {
            path,
            attempt: attempt.max(1),
            context,
            actions,
            recorded: 0,
            chain_limit: usize::MAX,
            state_bytes: None,
            subject: None,
        }
    }

    /// The same state for a run whose subject ticket is `subject`.
    pub fn about(mut self, subject: Option<String>) -> Self {
        self.subject = subject;
        self
    }

    /// The same state with at most `limit` steps recorded per claim.
    pub fn chaining(mut self, limit: usize) -> Self {
        self.chain_limit = limit;
        self
    }
}

/// What just happened to the run.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A claim begins at the state's path (a first attempt or a retry).
    Start,
    /// The step at the state's path, which the decider asked an executor
    /// to run, finished.
    StepDone {
        outputs: Map<String, Value>,
        log: Vec<String>,
        /// The rendered config the step ran with.
        input: Option<Value>,
        started_at: i64,
    },
    /// That step (a custom one) asked to wait for a signal
    /// ([`custom`]): the run parks until it comes or the wait times out,
    /// then the step is handed back to its handler's `resume`.
    StepWaits {
        wait: CustomWait,
        input: Option<Value>,
        started_at: i64,
    },
    /// That step failed; its error says whether it may be retried.
    StepFailed {
        error: StepError,
        input: Option<Value>,
        started_at: i64,
    },
    /// A signal matched the wait at the state's path, sent by `actor`,
    /// about the ticket `subject` when it named one, on `key` (one of the
    /// wait's keys; `None` from a resume that did not keep it).
    Signal {
        signal_id: String,
        payload: Value,
        actor: Option<Value>,
        subject: Option<String>,
        key: Option<String>,
    },
    /// The ticket of the `wait_for_condition` at the state's path holds
    /// its rules: `ticket` is the ticket as it was then.
    Condition { ticket: Value },
    /// The wait at the state's path timed out.
    TimedOut,
    /// Runs the step at the state's path waited on ended (all of them, one
    /// in `any` mode, or one that failed), or its timeout came first.
    RunsEnded {
        ended: Vec<RunEnded>,
        timed_out: bool,
    },
    /// The branches of the `parallel` step at the state's path joined:
    /// all `total` are done, or one `failed` (with its error). For a
    /// `for_each` step: its items `done` (in the order they were done) met
    /// its completion rule, and the ones `cancelled` then.
    BranchesJoined {
        total: usize,
        failed: Option<String>,
        done: Vec<usize>,
        cancelled: Vec<usize>,
    },
    /// The run was cancelled: its jobs and waits are gone, and this claim
    /// undoes its completed steps ([`crate::compensation`]) or ends it.
    /// `error` says why when another run's cancel took it along.
    Cancel { error: Option<String> },
}

impl From<Option<Resume>> for Input {
    /// How a claimed job begins: a parked job carries why it was resumed.
    fn from(resume: Option<Resume>) -> Self {
        match resume {
            None => Input::Start,
            Some(Resume::Signal {
                signal_id,
                payload,
                actor,
                subject,
                key,
            }) => Input::Signal {
                signal_id,
                payload,
                actor,
                subject,
                key,
            },
            Some(Resume::Condition { ticket }) => Input::Condition { ticket },
            Some(Resume::TimedOut) => Input::TimedOut,
            // A step held back by a limit is begun again like any step.
            Some(Resume::Deferred { .. }) => Input::Start,
            Some(Resume::Runs { ended, timed_out }) => Input::RunsEnded { ended, timed_out },
            Some(Resume::Branches {
                total,
                failed,
                done,
                items,
            }) => Input::BranchesJoined {
                total,
                failed,
                done,
                cancelled: items.map(|i| i.cancelled).unwrap_or_default(),
            },
            Some(Resume::Cancel { error }) => Input::Cancel { error },
        }
    }
}

/// A step for an executor to run, with everything it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Execute {
    pub path: FlowPath,
    pub step_id: String,
    pub kind: String,
    pub class: StepClass,
    pub attempt: u32,
    /// The step's config with every template rendered.
    pub config: Value,
    /// The context as the step sees it (loop variables included).
    pub scope: std::sync::Arc<Value>,
    /// What ended the custom step's wait (`{signalId, payload, actor,
    /// timedOut}`): the executor resumes the step with it rather than
    /// beginning it ([`custom`]).
    pub resumed: Option<Value>,
}

/// What the claim does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Then {
    /// Run this step, then advance with its outcome.
    Execute(Execute),
    /// The claim is over: write the records, the run's status and the job's
    /// next move.
    Record(NextJob),
}

/// What the record transaction must do besides writing the records.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// An incident for the tenant, a line in the ticket's trace and a
    /// `run.failed` event ([`crate::incident::run_failed`] has the words).
    RunFailed(Failure),
    /// The run ended and a run started it: the parent's wait on it, if the
    /// parent waits, learns how it ended, in this run's record transaction.
    NotifyParent(ParentNotice),
    /// A compensation step failed for good (`message` names the step it
    /// was undoing): an incident for the tenant; the run goes on with the
    /// next compensation.
    CompensationFailed(Failure),
}

/// How a child run ended, for its parent.
#[derive(Debug, Clone, PartialEq)]
pub struct ParentNotice {
    pub parent_run_id: RunId,
    pub status: RunStatus,
    /// The `output` of the child's `end` step (`null` without one).
    pub output: Value,
    pub error: Option<String>,
}

/// The decider's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The state after it: the next call's state.
    pub state: RunState,
    /// Step attempts to record, in order.
    pub records: Vec<StepRecord>,
    pub status: RunStatus,
    /// Why the run failed, when it did.
    pub error: Option<String>,
    pub then: Then,
    pub effects: Vec<Effect>,
}

/// Decides what happens to a run in `state` after `input`.
pub fn advance(
    automation: &Automation,
    state: RunState,
    input: Input,
    env: &mut Env<'_>,
) -> Transition {
    let decider = Decider {
        automation,
        state,
        records: Vec::new(),
        effects: Vec::new(),
        now: env.now,
    };
    if let Input::Cancel { error } = input {
        return decider.cancel(error);
    }
    let Some(step) = flow::step_at(&automation.steps, &decider.state.path) else {
        let error = format!("the run's version has no step at `{}`", decider.state.path);
        return decider.fail(error);
    };
    let step_path = decider.state.path.clone();
    match input {
        Input::Start => decider.chain(env),
        Input::StepDone {
            outputs,
            log,
            input,
            started_at,
        } => match check_output_size(&step.id, &outputs) {
            Ok(()) => decider.step_done(step, input, outputs, log, started_at, env),
            Err(error) => decider.step_failed(step, input, started_at, error, env),
        },
        Input::StepFailed {
            error,
            input,
            started_at,
        } => decider.step_failed(step, input, started_at, error, env),
        Input::StepWaits {
            wait,
            input,
            started_at,
        } => decider.park_custom(step, wait, input, started_at, env),
        Input::Signal {
            signal_id,
            payload,
            actor,
            subject,
            key,
        } if waits_for_signals(step, &decider.state.context, &step_path) => {
            let signal = signals::Arrived {
                signal_id,
                payload,
                actor,
                subject,
                key,
            };
            decider.signal_arrived(step, signal, env)
        }
        Input::Condition { ticket } if step.kind == WAIT_FOR_CONDITION => {
            decider.condition_holds(step, ticket, env)
        }
        Input::TimedOut if step.kind == WAIT_FOR_CONDITION => decider.condition_due(step, env),
        Input::TimedOut if waits_for_signals(step, &decider.state.context, &step_path) => {
            decider.signals_due(step, env)
        }
        Input::RunsEnded { ended, timed_out }
            if step.kind == RUN_WORKFLOW || step.kind == WAIT_FOR_RUNS =>
        {
            let mut decider = decider;
            let path = decider.state.path.clone();
            if timed_out
                && let Some(level) = escalation::fires(step, &path, &mut decider.state.context)
            {
                // A side chain: the step keeps waiting, the level's steps run.
                decider.state.path = path.child(Branch::Escalation(level), 0);
                decider.state.attempt = 1;
                return decider.chain(env);
            }
            escalation::end(&path, &mut decider.state.context);
            let now = decider.now_ms();
            match children::outcome(step, &ended, timed_out) {
                Ok((outputs, log)) => {
                    let record = decider.record(step, None, now);
                    decider.completed(step, record, outputs, log, env)
                }
                Err(error) => decider.step_failed(step, None, now, error, env),
            }
        }
        Input::BranchesJoined {
            total,
            failed,
            done,
            cancelled,
        } if step.kind == FOR_EACH => {
            let now = decider.now_ms();
            match failed {
                None => decider.items_joined(step, total, &done, &cancelled, env),
                Some(error) => {
                    let error = StepError::terminal(format!("item_failed: {error}"));
                    decider.step_failed(step, None, now, error, env)
                }
            }
        }
        Input::BranchesJoined { total, failed, .. } if step.kind == PARALLEL => {
            let now = decider.now_ms();
            match failed {
                None => {
                    let record = decider.record(step, None, now);
                    let log = vec![format!("{total} branches done")];
                    decider.completed(step, record, parallel::joined(total), log, env)
                }
                Some(error) => {
                    let error = StepError::terminal(format!("branch_failed: {error}"));
                    decider.step_failed(step, None, now, error, env)
                }
            }
        }
        // A resume for a step that is no longer waiting (the run moved on
        // by another way): nothing to take from it; the claim goes on.
        Input::Signal { .. }
        | Input::Condition { .. }
        | Input::TimedOut
        | Input::RunsEnded { .. }
        | Input::BranchesJoined { .. } => decider.chain(env),
        Input::Cancel { .. } => unreachable!("a cancel is decided before the step is looked up"),
    }
}

/// One call's work in progress.
struct Decider<'a> {
    automation: &'a Automation,
    state: RunState,
    records: Vec<StepRecord>,
    effects: Vec<Effect>,
    now: Timestamp,
}

impl Decider<'_> {
    fn finish(mut self, status: RunStatus, error: Option<String>, then: Then) -> Transition {
        let (status, mut error) = match compensation::is_compensating(&self.state.context) {
            true if !status.is_final() => (
                RunStatus::Compensating,
                compensation::error(&self.state.context),
            ),
            _ => (status, error),
        };
        if let Some(error) = error.as_mut() {
            crate::budget::bound_error(error);
        }
        if status.is_final()
            && let Some(parent_run_id) = children::parent_of(self.state.context.as_value())
        {
            self.effects.push(Effect::NotifyParent(ParentNotice {
                parent_run_id,
                status,
                output: self.state.context.output(),
                error: error.clone().or_else(|| {
                    (status == RunStatus::Cancelled).then(|| "the run was cancelled".to_owned())
                }),
            }));
        }
        Transition {
            state: self.state,
            records: self.records,
            status,
            error,
            then,
            effects: self.effects,
        }
    }

    /// The run fails; inside a branch of a `parallel` step, the branch
    /// fails, and with it that step. With `settings.compensateOnFailure`,
    /// its completed steps are undone first; a compensation that cannot
    /// go on ends the run as it was to end.
    fn fail(mut self, error: String) -> Transition {
        if compensation::is_compensating(&self.state.context) {
            compensation::failed(&mut self.state.context, &error);
            return self.compensated();
        }
        if let Some((parallel, branch)) = self.state.path.innermost_branch() {
            let next = NextJob::BranchDone {
                parallel: parallel.to_string(),
                branch,
                failed: Some(error),
            };
            return self.finish(RunStatus::Running, None, Then::Record(next));
        }
        if self.automation.settings.compensate_on_failure
            && !compensation::pending(&self.state.context).is_empty()
        {
            compensation::begin(&mut self.state.context, RunStatus::Failed, Some(error));
            return self.compensate_next();
        }
        self.finish(RunStatus::Failed, Some(error), Then::Record(NextJob::Done))
    }

    /// The run was cancelled: what its waits kept in the context goes, and
    /// its completed steps are undone, the last first; with none, it ends.
    fn cancel(mut self, error: Option<String>) -> Transition {
        let context = &mut self.state.context;
        context.set_reserved(escalation::ESCALATIONS_KEY, None);
        context.set_reserved(crate::waits::WAITING_KEY, None);
        custom::cancelled(context);
        for_each::abandon_undo(context);
        compensation::begin(context, RunStatus::Cancelled, error);
        self.compensate_next()
    }

    /// The job goes on at the compensation of the next completed step, or
    /// the run ends.
    fn compensate_next(mut self) -> Transition {
        match self.next_compensation() {
            true => {
                let next = NextJob::Step {
                    path: self.state.path.to_string(),
                    delay_ms: 0,
                };
                self.finish(RunStatus::Compensating, None, Then::Record(next))
            }
            false => self.compensated(),
        }
    }

    /// Moves the state to the first compensation step of the next
    /// completed step; `false` when none is left.
    fn next_compensation(&mut self) -> bool {
        let automation = self.automation;
        while let Some(undone) = compensation::take_next(&mut self.state.context) {
            let has_steps = flow::step_at(&automation.steps, &undone)
                .is_some_and(|step| !step.compensate.is_empty());
            if has_steps {
                self.state.path = undone.child(Branch::Compensate, 0);
                self.state.attempt = 1;
                return true;
            }
        }
        false
    }

    /// Every compensation has run: the run ends cancelled or failed.
    fn compensated(mut self) -> Transition {
        let (status, error) = compensation::end(&mut self.state.context);
        self.finish(status, error, Then::Record(NextJob::Done))
    }

    /// The branch this claim ran in is done: its job ends, and the
    /// `parallel` step learns it.
    fn branch_done(self, parallel: FlowPath, branch: usize) -> Transition {
        let next = NextJob::BranchDone {
            parallel: parallel.to_string(),
            branch,
            failed: None,
        };
        self.finish(RunStatus::Running, None, Then::Record(next))
    }

    fn now_ms(&self) -> i64 {
        self.now.as_millisecond()
    }

    /// A completed record of the step at the state's path (the caller sets
    /// its outputs and log).
    fn record(&self, step: &Step, input: Option<Value>, started_at: i64) -> StepRecord {
        StepRecord {
            path: self.state.path.to_string(),
            step_id: step.id.clone(),
            kind: step.kind.clone(),
            attempt: self.state.attempt as i32,
            status: StepStatus::Completed,
            input,
            output: None,
            error: None,
            log: Vec::new(),
            started_at,
            finished_at: self.now_ms(),
        }
    }

    /// Adds a step record to the claim's, its log and error bounded
    /// ([`crate::budget`]): whatever a step logged or failed with, its
    /// record stays small.
    fn push(&mut self, mut record: StepRecord) {
        crate::budget::bound_log(&mut record.log);
        if let Some(error) = record.error.as_mut() {
            crate::budget::bound_error(error);
        }
        self.records.push(record);
        self.state.recorded += 1;
    }

    /// Runs from the state's path: control steps are decided here, one
    /// after another, until a step needs an executor, the run parks or
    /// ends, or the claim has recorded its share.
    fn chain(mut self, env: &mut Env<'_>) -> Transition {
        let automation = self.automation;
        loop {
            let path = self.state.path.clone();
            let Some(step) = flow::step_at(&automation.steps, &path) else {
                return self.fail(format!("the run's version has no step at `{path}`"));
            };
            let class = match is_control(&step.kind) {
                true => StepClass::Control,
                false => (env.kinds)(&step.kind),
            };
            let recorded = self.state.recorded;
            if recorded >= self.state.chain_limit || (recorded > 0 && class == StepClass::External)
            {
                // What this claim did is recorded before the step goes on,
                // in a job of its own.
                let next = NextJob::Step {
                    path: path.to_string(),
                    delay_ms: 0,
                };
                return self.finish(RunStatus::Running, None, Then::Record(next));
            }
            // A compensation runs whatever the run executed before it: a
            // cancelled run must be able to undo what it did.
            let limits = &automation.settings.limits;
            let most = limits.actions();
            if self.state.actions >= most as i32 && path.compensated().is_none() {
                let whose = match limits.max_actions {
                    Some(_) if most < MAX_ACTIONS => {
                        "its automation's `settings.limits.maxActions`"
                    }
                    _ => "the most one run may execute",
                };
                return self.fail(format!(
                    "action_limit_exceeded: the run was stopped before step `{}`: it had \
                     executed {most} steps, {whose} (loop iterations count)",
                    step.id
                ));
            }
            self.state.actions += 1;
            if step.kind == RUN_WORKFLOW {
                let depth = children::depth_of(self.state.context.as_value()) + 1;
                if depth > MAX_NESTING_DEPTH {
                    let error = StepError::terminal(format!(
                        "nesting_depth_exceeded: step `{}` would start a run at depth {depth}; \
                         runs nest at most {MAX_NESTING_DEPTH} deep",
                        step.id
                    ));
                    let now = self.now_ms();
                    return self.step_failed(step, None, now, error, env);
                }
            }
            if step.kind == WAIT
                && let Some((_, timeout_at)) = escalation::began(&path, &self.state.context)
            {
                // A `wait` with escalations, claimed again while it waits:
                // for a level, or at its end.
                let now = self.now_ms();
                if let Some(level) = escalation::fires_by(step, &path, &mut self.state.context, now)
                {
                    self.state.path = path.child(Branch::Escalation(level), 0);
                    self.state.attempt = 1;
                    continue;
                }
                let until = timeout_at.unwrap_or(now);
                if until > now {
                    return self.wait_again(path);
                }
                escalation::end(&path, &mut self.state.context);
                let until = Timestamp::from_millisecond(until).unwrap_or(self.now);
                let outputs = Map::from_iter([("until".to_owned(), json!(until.to_string()))]);
                let record = self.record(step, None, now);
                let log = vec![format!("waited until {until}")];
                let next = self.publish(step, record, outputs, log);
                self = match self.follow(next, env) {
                    Ok(decider) => decider,
                    Err(transition) => return *transition,
                };
                continue;
            }
            let scope = flow::scope(&automation.steps, &path, self.state.context.as_value());
            if class != StepClass::Control {
                let rendered = template::render_config(&step.config, &scope);
                // The handler reads the run's context as it is, shared,
                // or the view of an iteration (a copy).
                let scope = match scope {
                    std::borrow::Cow::Borrowed(_) => self.state.context.shared(),
                    std::borrow::Cow::Owned(view) => std::sync::Arc::new(view),
                };
                let config = match rendered {
                    Ok(config) => config,
                    Err(e) => {
                        let error = StepError::terminal(format!("step `{}` {e}", step.id));
                        let now = self.now_ms();
                        return self.step_failed(step, None, now, error, env);
                    }
                };
                let resumed = custom::resumed(&self.state.context, &path.to_string());
                if resumed.is_some() {
                    // The step began when it asked to wait: its resume is
                    // no second action.
                    self.state.actions -= 1;
                }
                let execute = Execute {
                    path,
                    step_id: step.id.clone(),
                    kind: step.kind.clone(),
                    class,
                    attempt: self.state.attempt,
                    config,
                    scope,
                    resumed,
                };
                return self.finish(RunStatus::Running, None, Then::Execute(execute));
            }
            if step.kind == WAIT_FOR_EVENT {
                let wait = signal_wait(step, &scope, self.state.subject.as_deref(), self.now);
                drop(scope);
                return match wait {
                    Ok((wait, config)) => {
                        let record = self.record(step, Some(config), self.now_ms());
                        let several = crate::waits::has_keys(step);
                        let mode = crate::waits::wait_mode(step);
                        self.park_on_signals(step, record, wait, mode, several, None)
                    }
                    Err(error) => {
                        let now = self.now_ms();
                        self.step_failed(step, None, now, error, env)
                    }
                };
            }
            if step.kind == FOR_EACH {
                let now = self.now_ms();
                let spec = for_each::spec(step, &scope);
                drop(scope);
                return match spec {
                    Ok(spec) => self.fork_items(step, spec, env),
                    Err(error) => self.step_failed(step, None, now, error, env),
                };
            }
            if step.kind == WAIT_FOR_CONDITION {
                let subject = self.state.subject.as_deref();
                let wait = crate::condition_wait::condition_wait(step, &scope, subject, self.now);
                drop(scope);
                return match wait {
                    Ok((wait, config)) => self.park_on_condition(step, wait, config),
                    Err(error) => {
                        let now = self.now_ms();
                        self.step_failed(step, None, now, error, env)
                    }
                };
            }
            if step.kind == PARALLEL {
                drop(scope);
                let forks = parallel::forks(step, &path);
                let mut record = self.record(step, None, self.now_ms());
                if forks.is_empty() {
                    let next = self.publish(step, record, parallel::joined(0), Vec::new());
                    self = match self.follow(next, env) {
                        Ok(decider) => decider,
                        Err(transition) => return *transition,
                    };
                    continue;
                }
                record.status = StepStatus::Waiting;
                record
                    .log
                    .push(format!("running {} branches at once", forks.len()));
                self.push(record);
                let next = NextJob::Fork {
                    path: path.to_string(),
                    branches: forks,
                    items: None,
                };
                return self.finish(RunStatus::Running, None, Then::Record(next));
            }
            if step.kind == REPEAT {
                let now = self.now_ms();
                let entered =
                    repeat::spec(step, &scope).map(|spec| repeat::enters(step, &spec, &scope));
                drop(scope);
                match entered {
                    Ok(true) => self.state.path = path.child(Branch::Do(0), 0),
                    Ok(false) => {
                        let record = self.record(step, None, now);
                        let outputs = Map::from_iter([("iterations".to_owned(), json!(0))]);
                        let log = vec!["skipped: `while` does not hold".to_owned()];
                        let next = self.publish(step, record, outputs, log);
                        self = match self.follow(next, env) {
                            Ok(decider) => decider,
                            Err(transition) => return *transition,
                        };
                    }
                    Err(error) => return self.step_failed(step, None, now, error, env),
                }
                continue;
            }
            if step.kind == WAIT_FOR_RUNS {
                let wait = children::runs_wait(step, &scope, self.now);
                drop(scope);
                let now = self.now_ms();
                return match wait {
                    Ok((wait, config)) => {
                        let record = self.record(step, Some(config), now);
                        self.park_on_runs(step, record, wait)
                    }
                    Err(error) => self.step_failed(step, None, now, error, env),
                };
            }
            let outcome = builtin::evaluate(step, &scope, self.now);
            drop(scope);
            let started_at = self.now_ms();
            if let Ok(Outcome::WaitUntil { until, log }) = &outcome
                && until.as_millisecond() > started_at
            {
                if !step.escalations.is_empty() {
                    return self.park_on_timer(step, *until, log.clone());
                }
                if !self.leads_to_a_step(step, *until) {
                    let end = until.as_millisecond();
                    escalation::hold(&path, &mut self.state.context, started_at, end);
                    return self.park_on_timer(step, *until, log.clone());
                }
            }
            match outcome {
                Ok(Outcome::Done { outputs, log }) => {
                    if let Err(error) = check_output_size(&step.id, &outputs)
                        .and_then(|()| self.state_fits(step, &outputs))
                    {
                        return self.step_failed(step, None, started_at, error, env);
                    }
                    let record = self.record(step, None, started_at);
                    let next = self.publish(step, record, outputs, log);
                    self = match self.follow(next, env) {
                        Ok(decider) => decider,
                        Err(transition) => return *transition,
                    };
                }
                Ok(Outcome::WaitUntil { until, log }) => {
                    let mut outputs = Map::new();
                    outputs.insert("until".into(), json!(until.to_string()));
                    let record = self.record(step, None, started_at);
                    match self.publish(step, record, outputs, log) {
                        Ok(Next::Step(next)) => {
                            let delay_ms = (until.as_millisecond() - self.now_ms()).max(0);
                            let next = NextJob::Step {
                                path: next.to_string(),
                                delay_ms,
                            };
                            return self.finish(RunStatus::Waiting, None, Then::Record(next));
                        }
                        other => {
                            self = match self.follow(other, env) {
                                Ok(decider) => decider,
                                Err(transition) => return *transition,
                            };
                        }
                    }
                }
                Err(error) => return self.step_failed(step, None, started_at, error, env),
            }
        }
    }

    /// Whether the `wait` at the state's path, done at `until`, leads to
    /// another step (where it parks its run) rather than to the end of its
    /// list (the run's, a branch's, an iteration's), which must wait for it.
    fn leads_to_a_step(&self, step: &Step, until: Timestamp) -> bool {
        let mut context = self.state.context.clone();
        let outputs = Map::from_iter([("until".to_owned(), json!(until.to_string()))]);
        context.publish(&step.id, &outputs);
        matches!(
            flow::next(&self.automation.steps, &self.state.path, context.as_value()),
            Ok(Next::Step(_))
        )
    }

    fn complete(self) -> Transition {
        self.finish(RunStatus::Completed, None, Then::Record(NextJob::Done))
    }

    /// Whether the run's context still fits its limit once `step`'s
    /// outputs are published (`settings.limits.maxStateBytes`, at most
    /// [`crate::limits::MAX_STATE_BYTES`]): a `state_too_large` failure of
    /// the step when not. The context is measured whole once a claim, then
    /// by what each step's outputs add and replace
    /// ([`Context::published_growth`]).
    fn state_fits(&mut self, step: &Step, outputs: &Map<String, Value>) -> Result<(), StepError> {
        let limit = self.automation.settings.limits.state_bytes();
        let before = match self.state.state_bytes {
            Some(bytes) => bytes,
            None => self.state.context.measure(),
        };
        let context = &self.state.context;
        let pruned = match self.automation.settings.prune_state_after {
            Some(keep) => context.prunable(&step.id, keep as usize),
            None => 0,
        };
        let after = before
            .saturating_add_signed(context.published_growth(&step.id, outputs))
            .saturating_sub(pruned);
        if after > limit {
            self.state.state_bytes = Some(before);
            let whose = match self.automation.settings.limits.max_state_bytes {
                Some(_) if limit < crate::limits::MAX_STATE_BYTES => {
                    "its automation's `settings.limits.maxStateBytes`"
                }
                _ => "the most a run may keep",
            };
            return Err(StepError::terminal(format!(
                "state_too_large: step `{}`'s outputs would make the run's context {after} bytes; \
                 {whose} is {limit} bytes (keep less in the context: a smaller output, or \
                 `settings.pruneStateAfter`)",
                step.id
            )));
        }
        self.state.state_bytes = Some(after);
        Ok(())
    }

    /// Publishes a finished step's outputs, records it and finds the step
    /// after it; `Err` says why the next step cannot be decided.
    fn publish(
        &mut self,
        step: &Step,
        mut record: StepRecord,
        outputs: Map<String, Value>,
        log: Vec<String>,
    ) -> Result<Next, String> {
        custom::settled(&mut self.state.context, &self.state.path);
        // A step of a `for_each` item publishes into its item's entry.
        let path = &self.state.path;
        let in_item = for_each::publish_in_item(&mut self.state.context, path, &step.id, &outputs);
        if !in_item {
            let bare = self.state.context.publish(&step.id, &outputs);
            if let Some(keep) = self.automation.settings.prune_state_after {
                let removed = self
                    .state
                    .context
                    .keep_latest(&step.id, bare, keep as usize);
                self.state.state_bytes = self.state.state_bytes.map(|b| b.saturating_sub(removed));
            }
        }
        if step.kind == "end"
            && let Some(output) = outputs.get("output")
        {
            self.state.context.set_output(output.clone());
        }
        record.output = Some(Value::Object(outputs));
        record.log = log;
        self.push(record);
        self.state.attempt = 1;
        compensation::completed(step, &self.state.path, &mut self.state.context);
        let steps = &self.automation.steps;
        let path = &self.state.path;
        let context = self.state.context.as_value();
        // Inside an item, its steps' outputs are read from its scope.
        let next = match in_item {
            true => flow::next(steps, path, &flow::scope(steps, path, context)),
            false => flow::next(steps, path, context),
        };
        next.map_err(|e| format!("could not decide the step after `{}`: {e}", step.id))
    }

    /// A step finished: publish it and chain on.
    fn completed(
        mut self,
        step: &Step,
        record: StepRecord,
        outputs: Map<String, Value>,
        log: Vec<String>,
        env: &mut Env<'_>,
    ) -> Transition {
        if let Err(error) = self.state_fits(step, &outputs) {
            return self.step_failed(step, record.input, record.started_at, error, env);
        }
        let next = self.publish(step, record, outputs, log);
        match self.follow(next, env) {
            Ok(decider) => decider.chain(env),
            Err(transition) => *transition,
        }
    }

    /// Where a published step leads: `Ok` with the state at the step to
    /// decide next within this claim, or the transition that ends it (the
    /// run completes, a branch is done, a repeat waits, a failure).
    fn follow(
        mut self,
        next: Result<Next, String>,
        env: &mut Env<'_>,
    ) -> Result<Self, Box<Transition>> {
        match next {
            Ok(Next::Step(next)) => {
                self.state.path = next;
                Ok(self)
            }
            Ok(Next::Complete) => Err(Box::new(self.complete())),
            Ok(Next::BranchDone { parallel, branch }) => {
                Err(Box::new(self.branch_done(parallel, branch)))
            }
            Ok(Next::IterationDone { repeat, iteration }) => {
                self.iteration_done(repeat, iteration, env)
            }
            Ok(Next::EscalationDone { waiting, .. }) => Err(Box::new(self.wait_again(waiting))),
            Ok(Next::CompensationDone { .. }) if for_each::undoing(&self.state.context) => {
                self.undo_next_item(env)
            }
            Ok(Next::CompensationDone { .. }) => match self.next_compensation() {
                true => Ok(self),
                false => Err(Box::new(self.compensated())),
            },
            Err(error) => Err(Box::new(self.fail(error))),
        }
    }

    /// An iteration of the repeat at `repeat` is done: the repeat is over
    /// (its record, `{iterations}`, and on after it), the next iteration
    /// starts (now, or after `every`), or the limit fails the step.
    fn iteration_done(
        mut self,
        repeat_at: FlowPath,
        iteration: usize,
        env: &mut Env<'_>,
    ) -> Result<Self, Box<Transition>> {
        let automation = self.automation;
        let Some(step) = flow::step_at(&automation.steps, &repeat_at) else {
            return Err(Box::new(
                self.fail(format!("the run's version has no step at `{repeat_at}`")),
            ));
        };
        self.state.path = repeat_at.clone();
        let now = self.now_ms();
        let scope = flow::scope(&automation.steps, &repeat_at, self.state.context.as_value());
        let again = repeat::spec(step, &scope)
            .and_then(|spec| repeat::after_iteration(step, &spec, &scope, iteration));
        drop(scope);
        match again {
            Ok(Again::Over(n)) => {
                let record = self.record(step, None, now);
                let outputs = Map::from_iter([("iterations".to_owned(), json!(n))]);
                let next = self.publish(step, record, outputs, vec![format!("repeated {n} times")]);
                self.follow(next, env)
            }
            Ok(Again::Next { iteration, delay }) => {
                let path = repeat_at.child(Branch::Do(iteration), 0);
                if delay.is_zero() {
                    self.state.path = path;
                    return Ok(self);
                }
                let next = NextJob::Step {
                    path: path.to_string(),
                    delay_ms: delay.as_millis() as i64,
                };
                Err(Box::new(self.finish(
                    RunStatus::Waiting,
                    None,
                    Then::Record(next),
                )))
            }
            Err(error) => Err(Box::new(self.step_failed(step, None, now, error, env))),
        }
    }

    /// An executed step finished: a `run_workflow` that waits parks on its
    /// child, any other step is published and the run chains on.
    fn step_done(
        self,
        step: &Step,
        input: Option<Value>,
        outputs: Map<String, Value>,
        log: Vec<String>,
        started_at: i64,
        env: &mut Env<'_>,
    ) -> Transition {
        match children::awaited_child(step, input.as_ref(), &outputs) {
            Some(wait) => {
                let mut record = self.record(step, input, started_at);
                record.output = Some(Value::Object(outputs));
                self.park_on_runs(step, record, wait)
            }
            None => {
                let record = self.record(step, input, started_at);
                self.completed(step, record, outputs, log, env)
            }
        }
    }

    /// A step failed: another attempt later if its error and the policy
    /// allow, otherwise the run fails (with an incident).
    fn step_failed(
        mut self,
        step: &Step,
        input: Option<Value>,
        started_at: i64,
        error: StepError,
        env: &mut Env<'_>,
    ) -> Transition {
        // Its message may quote what a tenant sent: it goes to the record,
        // the run's error and an incident, each bounded.
        let error = error.bounded();
        let path = self.state.path.to_string();
        let attempt = self.state.attempt;
        if let StepError::Deferred {
            after,
            kind,
            message,
        } = &error
        {
            // Held back before it called anything: no attempt is spent and
            // there is nothing to record but the wait.
            self.state.actions -= 1;
            let next = NextJob::Retry {
                path,
                attempts: attempt as i32 - 1,
                delay_ms: after.as_millis() as i64,
                held: Some(Resume::Deferred {
                    limit: (*kind).to_owned(),
                    reason: message.clone(),
                }),
            };
            return self.finish(RunStatus::Running, None, Then::Record(next));
        }
        // The step's own policy, else its type's, else its automation's.
        let typed = (env.retries)(&step.kind);
        let policy = RetryPolicy::resolve(
            step.retry.as_ref().or(typed.as_ref()),
            self.automation.settings.retry.as_ref(),
        );
        let mut record = self.record(step, input, started_at);
        record.error = Some(error.message().to_owned());
        let mut rng = &mut *env.rng;
        match decide(&error, attempt, &policy, &mut rng) {
            Decision::RetryIn(delay) => {
                record.status = StepStatus::Retrying;
                record.log.push(format!(
                    "attempt {attempt} of {} failed: {}; next attempt in {}",
                    policy.max_attempts,
                    error.message(),
                    humanize(delay)
                ));
                self.push(record);
                let next = NextJob::Retry {
                    path,
                    attempts: attempt as i32,
                    delay_ms: delay.as_millis() as i64,
                    held: None,
                };
                self.finish(RunStatus::Running, None, Then::Record(next))
            }
            Decision::Fail => {
                record.status = StepStatus::Failed;
                let why = match error.is_retryable() {
                    true => format!("gave up after {attempt} attempts"),
                    false => "not retryable".to_owned(),
                };
                record
                    .log
                    .push(format!("failed ({why}): {}", error.message()));
                self.push(record);
                if let Some(undone) = self.state.path.compensated() {
                    // The run goes on undoing; an incident says what was not.
                    let undone_id = flow::step_at(&self.automation.steps, &undone)
                        .map_or_else(|| undone.to_string(), |s| s.id.clone());
                    let message = format!(
                        "compensation `{}` of step `{undone_id}` failed: {}",
                        step.id,
                        error.message()
                    );
                    compensation::failed(&mut self.state.context, &message);
                    self.effects.push(Effect::CompensationFailed(Failure {
                        step_id: step.id.clone(),
                        path,
                        kind: step.kind.clone(),
                        attempt,
                        message,
                    }));
                    if for_each::undoing(&self.state.context) {
                        // A cancelled item's undo: the next one goes on.
                        return match self.undo_next_item(env) {
                            Ok(decider) => decider.chain(env),
                            Err(transition) => *transition,
                        };
                    }
                    return self.compensate_next();
                }
                if self.state.path.innermost_branch().is_some() {
                    // The parallel step fails for it, and raises the incident.
                    let message = format!("step `{}` failed: {}", step.id, error.message());
                    return self.fail(message);
                }
                self.effects.push(Effect::RunFailed(Failure {
                    step_id: step.id.clone(),
                    path,
                    kind: step.kind.clone(),
                    attempt,
                    message: error.message().to_owned(),
                }));
                let message = format!("step `{}` failed: {}", step.id, error.message());
                self.fail(message)
            }
        }
    }
}

/// A step's outputs past [`MAX_OUTPUT_BYTES`] fail it: they are not kept.
pub fn check_output_size(step_id: &str, outputs: &Map<String, Value>) -> Result<(), StepError> {
    let size = serde_json::to_vec(outputs).map(|v| v.len()).unwrap_or(0);
    if size > MAX_OUTPUT_BYTES {
        return Err(StepError::terminal(format!(
            "step `{step_id}` returned {size} bytes of output; at most {MAX_OUTPUT_BYTES} are kept"
        )));
    }
    Ok(())
}

/// Who sent a signal, for its wait's log line (` from key key_…`).
fn sender(actor: &Value) -> String {
    match (
        actor["kind"].as_str(),
        actor["id"].as_str(),
        actor["runId"].as_str(),
    ) {
        (Some("key"), Some(id), _) => format!(" from key {id}"),
        (Some("run"), _, Some(run)) => format!(" from run {run}"),
        _ => String::new(),
    }
}
