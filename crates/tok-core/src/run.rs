//! The values a run's decisions are made of: its status, the records of its
//! steps, what happens to its job next, and the runs a dispatch plans.
//!
//! [`crate::advance`] produces them; the store writes them as they are. They
//! live here, not in the store, so that a decision is data a test can compare
//! without a database.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::definition::Filter;
use crate::ids::{AutomationId, RunId};

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Queued,
    Running,
    Waiting,
    Paused,
    /// Cancelled or failed, and undoing its completed steps
    /// ([`crate::compensation`]); then `cancelled` or `failed`.
    Compensating,
    Completed,
    Failed,
    Cancelled,
    /// Never started: an event would have started it over its automation's
    /// `settings.limits.startsPerMinute` (its error says
    /// `start_rate_exceeded`). No step runs; nothing moves it.
    Refused,
    /// Never started: its automation's `flow.singleton` (`skip`) had a run
    /// of its key unfinished (its error names it). No step runs.
    Skipped,
    /// Never started: its automation's `flow.startTimeout` passed while it
    /// was queued (held by a start control, a cap, a queue key). No step ran.
    Expired,
}

impl RunStatus {
    /// Every status, in the order of a run's life.
    pub const ALL: [RunStatus; 11] = [
        Self::Queued,
        Self::Running,
        Self::Waiting,
        Self::Paused,
        Self::Compensating,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
        Self::Refused,
        Self::Skipped,
        Self::Expired,
    ];

    /// The statuses' names, `queued, running, …`, for an error that lists them.
    pub fn names() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Paused => "paused",
            Self::Compensating => "compensating",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Refused => "refused",
            Self::Skipped => "skipped",
            Self::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "waiting" => Self::Waiting,
            "paused" => Self::Paused,
            "compensating" => Self::Compensating,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            "refused" => Self::Refused,
            "skipped" => Self::Skipped,
            "expired" => Self::Expired,
            _ => return None,
        })
    }

    /// Completed, failed, cancelled, refused, skipped or expired: nothing
    /// moves the run any more (but a retry of a failed one).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Completed
                | Self::Failed
                | Self::Cancelled
                | Self::Refused
                | Self::Skipped
                | Self::Expired
        )
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one attempt of a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    Completed,
    Failed,
    /// Failed, and another attempt is due.
    Retrying,
    /// Parked: the step waits for a signal or its timeout.
    Waiting,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Retrying => "retrying",
            Self::Waiting => "waiting",
        }
    }
}

impl std::fmt::Display for StepStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One executed step attempt, as the record transaction writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    pub path: String,
    pub step_id: String,
    pub kind: String,
    pub attempt: i32,
    pub status: StepStatus,
    pub input: Option<Value>,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub log: Vec<String>,
    pub started_at: i64,
    pub finished_at: i64,
}

/// The key a `wait_for_condition` parks on: its wait is resumed by a
/// change of its ticket that makes the rules hold, never by a signal.
pub const CONDITION_KEY: &str = "tok:condition";

/// What a `wait_for_event` step parks its run on: the signal key (or
/// keys), the `where` its payload must satisfy, and when the wait gives
/// up. A `wait_for_condition` parks on one too, on the reserved
/// [`CONDITION_KEY`]: its `subject` is the ticket and its
/// `filter` the rules the ticket must hold (the store checks them when
/// the ticket changes, not signals).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SignalWait {
    pub key: String,
    /// The wait's further keys (`config.keys` beyond the first): a signal
    /// on any of them resumes it. Waits stored before several keys have
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
    /// The ticket the signal must be about (its `subject`): only a signal
    /// with this subject resumes the wait, and a wait without one takes
    /// only signals without one. Waits stored before subjects have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Rules over the signal's payload; `None` takes any payload.
    pub filter: Option<Filter>,
    /// Whether a signal buffered before the wait began (within the
    /// lookback window) may resume it at once.
    pub lookback: bool,
    /// Unix ms when the wait times out; `None` waits for ever.
    pub due_at: Option<i64>,
    /// Without `lookback`: the signals buffered from this time on (Unix
    /// ms) may resume it at once. A wait for every one of several keys
    /// that parks again on the keys still missing sets it to when it
    /// began, so that a signal that came meanwhile is not lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
}

impl SignalWait {
    /// Every key of the wait, the first first.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.key.as_str()).chain(self.also.iter().map(String::as_str))
    }

    /// Whether this is a `wait_for_condition`'s wait on a ticket rather
    /// than a wait for signals.
    pub fn is_condition(&self) -> bool {
        self.key == CONDITION_KEY
    }
}

/// Whether a wait for runs ends when all of them have ended or when one has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunsMode {
    #[default]
    All,
    Any,
}

/// What a `run_workflow` (with `wait`) or `wait_for_runs` step parks its
/// run on: other runs of the tenant, ending. A run that fails or is
/// cancelled ends the wait at once, whatever the mode: the step fails.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunsWait {
    pub runs: Vec<String>,
    #[serde(default)]
    pub mode: RunsMode,
    /// Unix ms when the wait times out; `None` waits for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<i64>,
}

impl RunsWait {
    /// Whether the runs that `ended` end the wait: one failed or was
    /// cancelled, one ended in `any` mode, or every run did in `all` mode.
    pub fn is_over(&self, ended: &[RunEnded]) -> bool {
        ended.iter().any(|run| run.status != RunStatus::Completed)
            || match self.mode {
                RunsMode::Any => !ended.is_empty(),
                RunsMode::All => self
                    .runs
                    .iter()
                    .all(|id| ended.iter().any(|run| &run.run_id == id)),
            }
    }
}

/// How an awaited run ended: its status, the `output` of its `end` step,
/// its error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEnded {
    pub run_id: String,
    pub status: RunStatus,
    #[serde(default)]
    pub output: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a parked job was handed to a worker again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Resume {
    /// A signal matched the wait; `actor` is who sent it (`{"kind":
    /// "key", "id"}`, `{"kind": "run", "runId"}`), when known.
    #[serde(rename_all = "camelCase")]
    Signal {
        signal_id: String,
        payload: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        actor: Option<Value>,
        /// The ticket the signal was about, when it named one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
        /// The key the signal came on (a wait may have several); resumes
        /// written before keys were kept have none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// A `wait_for_condition`'s ticket holds its rules: `ticket` is the
    /// ticket as it was then (its event view).
    Condition { ticket: Value },
    /// The wait's due time passed first.
    TimedOut,
    /// Not a resume: a step a limit held back (`limit`, one of
    /// [`crate::blocked`]'s, and why) waits for its next claim, which
    /// begins it as a start. Kept so a reader can say what holds the run.
    Deferred { limit: String, reason: String },
    /// A wait for runs: the awaited runs that have ended so far. A job
    /// parked on runs carries this from the start with `timed_out` true
    /// (what its due time brings); each run that ends adds itself, and the
    /// one that ends the wait sets `timed_out` false and makes the job due.
    #[serde(rename_all = "camelCase")]
    Runs {
        ended: Vec<RunEnded>,
        timed_out: bool,
    },
    /// A `parallel` step's join: the branches (by index) that are done of
    /// the `total` it forked, or the first branch's failure. The job is due
    /// when every branch is done or one failed. A `for_each` step's join
    /// counts its items (`done` in the order they were done) and says how
    /// the rest start and when it is complete (`items`).
    #[serde(rename_all = "camelCase")]
    Branches {
        total: usize,
        done: Vec<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failed: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        items: Option<ItemsJoin>,
    },
    /// The run was cancelled: the job undoes its completed steps
    /// ([`crate::compensation`]). `error` says why when another run's
    /// cancel took it along.
    #[serde(rename_all = "camelCase")]
    Cancel {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// How a forked `for_each` step joins its items: kept on its parked job
/// with the items done so far ([`crate::run::Resume::Branches`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemsJoin {
    /// How many items there are.
    pub total: usize,
    /// How many items have had a job, in item order: the next item to
    /// start is this one.
    pub started: usize,
    /// At most this many items run at once.
    pub concurrency: usize,
    /// The items done that complete the step.
    pub need: usize,
    /// The items whose jobs were cancelled when the step completed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cancelled: Vec<usize>,
}

/// What happens to the claimed job when its result is recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum NextJob {
    /// The run goes on at `path`, due `delay_ms` after now (database clock).
    Step { path: String, delay_ms: i64 },
    /// A failed step again after `delay_ms`: `path` is the step that failed
    /// (a chain of built-in steps may have moved past the claimed one) and
    /// `attempts` how many attempts it has had, so the next claim is the
    /// next attempt.
    Retry {
        path: String,
        attempts: i32,
        delay_ms: i64,
        /// What the job carries meanwhile: [`Resume::Deferred`] when a
        /// limit held the step back, `None` after a failed attempt.
        held: Option<Resume>,
    },
    /// The run goes on at `path` now, and the worker that recorded keeps
    /// the job under its claim (its lease going on with its heartbeats;
    /// `lease_ms` is the lease a branch's job is given again with its row)
    /// to run that step at once, without a claim in between. A run paused
    /// meanwhile is released instead.
    Continue { path: String, lease_ms: i64 },
    /// The job parks at `path` (a `wait_for_event` step) until a signal
    /// matches `wait` or its due time passes; then it is claimed again with
    /// a [`Resume`]. A signal buffered within the lookback window may
    /// resume it in the same transaction.
    Wait { path: String, wait: SignalWait },
    /// The job parks at `path` (a `run_workflow` or `wait_for_runs` step)
    /// until the awaited runs end (see [`RunsWait::is_over`]) or its due
    /// time passes; then it is claimed again with [`Resume::Runs`]. Runs
    /// that have ended already count as the job parks: it may be due at once.
    WaitForRuns { path: String, wait: RunsWait },
    /// The job parks at `path` (a `parallel` step) and one new job starts
    /// each branch at its first step (`branches`: the branch's index and
    /// that step's path), all in this record. The parked job is due again
    /// when every branch is done ([`Resume::Branches`]). A `for_each` step
    /// forks its first items, and says how the rest start and join
    /// (`items`).
    Fork {
        path: String,
        branches: Vec<(usize, String)>,
        items: Option<ItemsJoin>,
    },
    /// This job's branch `branch` of the `parallel` step at `parallel` is
    /// over: the job is deleted and the parallel step's parked job learns
    /// it. A branch that `failed` (with this message) ends the join at once
    /// and the parallel step's other branches are cancelled.
    BranchDone {
        parallel: String,
        branch: usize,
        failed: Option<String>,
    },
    /// The run is over (completed or failed): the job is deleted.
    Done,
}

/// A run the dispatcher (or a manual start) decided to create.
#[derive(Debug, Clone, Serialize)]
pub struct NewRun {
    pub id: RunId,
    pub automation_id: AutomationId,
    pub version: i32,
    pub trigger_type: String,
    pub context: Value,
    pub depth: i32,
    pub queue_key: Option<String>,
    pub priority: i32,
    /// Path of the step a worker runs first; `None` completes the run at
    /// once (an empty tree, or `steps` ran all of it).
    pub first_path: Option<String>,
    pub idempotency_key: Option<String>,
    /// The ticket the run acts on from its start (a ticket event's ticket).
    pub subject_ticket_id: Option<String>,
    /// Steps already run, written with the run: the pure steps a run
    /// begins with, which the dispatcher runs at once. `context` is the
    /// context after them.
    pub steps: Vec<StepRecord>,
    /// Steps executed so far (`steps` among them), toward `MAX_ACTIONS`.
    pub actions: i32,
    /// Why the run was refused rather than started (`start_rate_exceeded:
    /// …`): it is written `refused` with this error, no steps and no job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Why the run is written `skipped` rather than started (a singleton
    /// key's run is unfinished): no steps and no job, like a refused run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The first job is due `delay_ms` after now, held by the automation's
    /// start control meanwhile (`resume` says which, for `blocked_by`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// When the run expires if no worker has begun it by then (Unix ms;
    /// `flow.startTimeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_by: Option<i64>,
    /// What cancels the run (`flow.cancelOn`), written with it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cancels: Vec<CancelKey>,
    /// The run never starts: an event of its automation's `flow.cancelOn`
    /// came in the same dispatch after its own (this says which). It is
    /// written `cancelled`, with no steps and no job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<String>,
}

/// A run's row of one `flow.cancelOn` entry: an event of `source` whose
/// value at `path` is `value`, and whose context `filter` holds for,
/// cancels it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CancelKey {
    pub source: String,
    pub path: String,
    pub value: String,
    pub filter: Option<crate::definition::Filter>,
}

/// A run's first job held back by its start control (`flow.debounce`,
/// `throttle`, `batch`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hold {
    pub delay_ms: i64,
    /// [`Resume::Deferred`] naming the control.
    pub resume: Resume,
}

/// A run the dispatch must pass through its automation's start control
/// before it is written: the control and the run's rendered key.
#[derive(Debug, Clone)]
pub struct FlowStart {
    pub run_id: RunId,
    pub flow: crate::definition::FlowControl,
    pub key: String,
}

/// What the dispatcher's planner decided for one event.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub runs: Vec<NewRun>,
    /// Lines for the event's ticket's trace (a run skipped by loop protection).
    pub notes: Vec<PlanNote>,
    /// The runs of `runs` a start control decides on (`flow`).
    pub flow: Vec<FlowStart>,
}

/// A line the dispatcher writes to a ticket's trace, for a person to see.
#[derive(Debug, Clone)]
pub struct PlanNote {
    pub ticket_id: String,
    pub automation_id: AutomationId,
    pub kind: String,
    pub message: String,
}

/// The queue key of a run acting on a ticket: runs on one ticket never
/// interleave.
pub fn ticket_queue_key(ticket_id: &str) -> String {
    format!("ticket:{ticket_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_listed_once_and_reads_back() {
        for status in RunStatus::ALL {
            assert_eq!(RunStatus::parse(status.as_str()), Some(status));
        }
        let names = RunStatus::names();
        assert!(names.starts_with("queued, running, waiting"), "{names}");
        let unique: std::collections::HashSet<_> = RunStatus::ALL.into_iter().collect();
        assert_eq!(unique.len(), RunStatus::ALL.len());
    }
}
