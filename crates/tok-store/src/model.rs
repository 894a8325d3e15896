//! Rows the store reads and the inputs it writes, shared by both backends.
//!
//! Times are unix milliseconds (`i64`) on both backends; rows a client sees
//! serialize them as RFC 3339 (`crate::rfc3339`). JSON columns travel as
//! `serde_json::Value`; the engine parses them into `tok-core` types where it
//! needs to.

use serde::Serialize;
use serde_json::Value;
use tok_core::ids::{AutomationId, EventId, JobId, RunId, SourceId, TenantId};
pub use tok_core::quotas::TenantLimits;
pub use tok_core::run::{
    NewRun, NextJob, Plan, PlanNote, Resume, RunEnded, RunStatus, RunsMode, RunsWait, SignalWait,
    StepRecord, StepStatus,
};

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A tenant's row and the admin's change of it, defined beside
/// [`AdminStore`](crate::AdminStore).
pub use crate::admin::{Tenant, TenantPatch, WebhookSettings};

/// Who an API key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOwner {
    Platform,
    Tenant(TenantId),
}

/// Sources and automations, defined beside
/// [`DefinitionStore`](crate::DefinitionStore).
pub use crate::definitions::{
    AutomationRow, AutomationStatus, NewSource, NewVersion, SavedVersion, Source, SourcePatch,
    SourceRotation,
};

/// An event to put in the inbox.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewEvent {
    pub source_id: Option<SourceId>,
    /// `webhook`, `manual`, `event`, …
    pub source_kind: String,
    pub idempotency_key: String,
    pub payload: Value,
    /// Parameters extracted by the source's contract.
    pub params: Value,
    pub depth: i32,
    pub cause_run_id: Option<RunId>,
    pub origin_automation_id: Option<AutomationId>,
    /// Set for a manual start: the one automation the event is for.
    pub target_automation_id: Option<AutomationId>,
    /// The type of an internal event (`ticket.updated`, an `emit`ted name).
    pub event_type: Option<String>,
    /// The ticket an internal ticket event is about.
    pub subject_ticket_id: Option<String>,
    /// The W3C trace context the event was sent with, checked at intake:
    /// its runs continue that trace.
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    pub duplicate: bool,
}

/// An event as the inbox keeps it, for reading and replaying.
#[derive(Debug, Clone, Serialize)]
pub struct StoredEvent {
    pub id: EventId,
    pub source_id: Option<SourceId>,
    /// `webhook`, `manual`, `event`, …
    pub source_kind: String,
    pub event_type: Option<String>,
    /// `pending` until the dispatcher took it, then `dispatched`; `failed`
    /// when the dispatcher set it aside ([`crate::InboxStore::set_aside`]).
    pub status: String,
    /// The event this one replays (the first one, never a replay).
    pub replay_of: Option<EventId>,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub received_at: i64,
    /// Why the dispatcher set it aside (`failed`); `None` otherwise.
    pub error: Option<String>,
}

/// Which events a filtered replay takes: the tenant's events from a
/// source (webhooks and polls; not replays, internal events or manual
/// starts), received in `[since, until)`.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub source_id: Option<SourceId>,
    pub since: Option<i64>,
    pub until: Option<i64>,
}

/// When a replay writes a new event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Always: the event goes through the dispatch once more.
    Always,
    /// Only when neither the event nor any replay of it started a run,
    /// and no replay of it waits for the dispatcher.
    IfNoRuns,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// A new event, pending for the dispatcher.
    Accepted(EventId),
    /// `if_no_runs`, and the event or a replay of it started these runs.
    HasRuns(Vec<RunId>),
    /// `if_no_runs`, and this replay of it is still pending.
    Pending(EventId),
}

/// An inbox row waiting for the dispatcher.
#[derive(Debug, Clone)]
pub struct PendingEvent {
    pub id: EventId,
    pub tenant_id: TenantId,
    pub source_id: Option<SourceId>,
    pub source_kind: String,
    pub payload: Value,
    pub params: Value,
    pub depth: i32,
    pub cause_run_id: Option<RunId>,
    pub origin_automation_id: Option<AutomationId>,
    pub target_automation_id: Option<AutomationId>,
    pub event_type: Option<String>,
    pub subject_ticket_id: Option<String>,
    pub received_at: i64,
    /// The trace context it was sent with ([`NewEvent::traceparent`]).
    pub traceparent: Option<String>,
}

impl PendingEvent {
    /// What the triggers of the automations it starts name besides its
    /// kind: an internal event's type, a webhook's source.
    pub fn trigger_key(&self) -> Option<&str> {
        self.event_type
            .as_deref()
            .or(self.source_id.as_ref().map(|s| s.as_str()))
    }
}

/// An active automation whose trigger matches an event, with the definition of
/// its current version.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub automation_id: AutomationId,
    pub name: String,
    pub version: i32,
    pub definition: Value,
    /// Runs of this automation on the event's ticket in the last minute
    /// (0 for an event without a ticket): the loop protection's count.
    pub recent_runs_on_ticket: i64,
}

/// A job the worker holds a lease on, with what it needs of its run.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub id: JobId,
    pub tenant_id: TenantId,
    pub run_id: RunId,
    pub path: String,
    /// Executions of this job's step so far, this one included (1 on the first).
    pub attempt: i32,
    /// The job row's `attempts` when it was claimed. A job that goes on to
    /// the next step under its lease keeps its row as it was (the run's
    /// row says where it is), and counts that step's attempts from here.
    pub row_attempts: i32,
    pub claim_token: String,
    pub automation_id: AutomationId,
    pub version: i32,
    pub context: Value,
    pub actions: i32,
    pub depth: i32,
    /// The run's subject ticket, if it has one yet.
    pub subject_ticket_id: Option<String>,
    /// Why a parked job (a `wait_for_event`) was handed out again: the
    /// signal that matched, or its timeout. `None` for every other job.
    pub resume: Option<Resume>,
}

/// The whole outcome of one claim, written in one transaction or not at all.
#[derive(Debug, Clone)]
pub struct Record {
    pub steps: Vec<StepRecord>,
    /// The run's context after the record, shared with the worker that
    /// goes on with it (see [`ContextChange`] for what it is to the store).
    pub context: std::sync::Arc<Value>,
    /// What `context` is to the run's stored context.
    pub changed: ContextChange,
    pub actions: i32,
    pub status: RunStatus,
    pub error: Option<String>,
    pub next: NextJob,
    /// The run's subject ticket after this record. Once set, the run's job
    /// carries the queue key `ticket:<id>`, so runs on one ticket never
    /// interleave.
    pub subject_ticket_id: Option<String>,
}

/// What a [`Record`]'s context is to its run's stored context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContextChange {
    /// The run's whole context, to be written whole.
    Whole,
    /// The run's whole context, of which the record changed these
    /// top-level entries ([`tok_core::context::Context::changed`]): the
    /// store may keep just those, with the record's last step row.
    Keys(Vec<String>),
    /// Not the run's context (a record made outside the decider, which
    /// knows only that the step failed): the stored context stays.
    Kept,
}

/// Filters of the runs listing; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub status: Option<String>,
    pub automation_id: Option<String>,
    pub trigger_type: Option<String>,
    /// The run that started them (`run_workflow`).
    pub parent_run_id: Option<String>,
    /// Only runs that have not ended and are not paused (`queued`,
    /// `running`, `waiting`): those that something may hold.
    pub unfinished: bool,
    /// The runs this event started.
    pub event_id: Option<String>,
    /// Runs created at or after this time (ms since the epoch).
    pub since: Option<i64>,
    /// Runs created before this time (ms since the epoch).
    pub until: Option<i64>,
    /// Runs whose `_body` (what started them) contains this JSON document
    /// (PostgreSQL's `@>`; objects down to strings and booleans, as
    /// `Condition::containment` makes them); on PostgreSQL an index finds
    /// them.
    pub body_contains: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub id: RunId,
    pub automation_id: AutomationId,
    pub version: i32,
    pub event_id: EventId,
    pub status: String,
    pub trigger_type: String,
    pub depth: i32,
    pub actions: i32,
    pub subject_ticket_id: Option<String>,
    /// The run that started this one (trigger type `parent`).
    pub parent_run_id: Option<RunId>,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize_opt")]
    pub started_at: Option<i64>,
    #[serde(serialize_with = "crate::rfc3339::serialize_opt")]
    pub finished_at: Option<i64>,
    pub error: Option<String>,
    /// Its automation's `flow.priority` as it started (0 without one).
    pub priority: i32,
    /// What holds a run that is neither running nor finished (a wait, a
    /// connection's limit, a timer, a ticket's queue, its tenant's cap);
    /// `null` otherwise, and in answers that are not a run's detail or a
    /// runs listing ([`tok_core::blocked`]).
    pub blocked_by: Option<tok_core::blocked::BlockedBy>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepRow {
    pub path: String,
    pub step_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub attempt: i32,
    pub status: String,
    pub input: Option<Value>,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub log: Value,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub started_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub finished_at: i64,
}

impl StepRow {
    /// A run's step rows as a reader should see them. A step that waits
    /// (`wait_for_event`, `approval`, `parallel`, `wait_for_runs`, a held
    /// `wait`) writes a `waiting` row when it parks and another when it
    /// resumes: the rows are append-only, one insert per record. Read, the
    /// waiting row becomes what it became — the later row's status, error
    /// and end, its output (the wait's when it has none, as a failed wait
    /// for runs names its child), both logs, the wait's start — and the
    /// later row is not shown again. A wait that has not resumed stays `waiting`.
    pub fn as_they_became(rows: Vec<StepRow>) -> Vec<StepRow> {
        let mut shown: Vec<StepRow> = Vec::with_capacity(rows.len());
        // The shown row of each step still waiting, by path.
        let mut waiting: std::collections::HashMap<String, usize> = Default::default();
        for row in rows {
            if let Some(&at) = waiting.get(&row.path)
                && shown[at].step_id == row.step_id
            {
                let parked = &mut shown[at];
                let mut log = match std::mem::take(&mut parked.log) {
                    Value::Array(lines) => lines,
                    other => vec![other],
                };
                match row.log {
                    Value::Array(lines) => log.extend(lines),
                    Value::Null => {}
                    other => log.push(other),
                }
                parked.log = Value::Array(log);
                parked.status = row.status;
                parked.attempt = row.attempt;
                if row.output.is_some() {
                    parked.output = row.output;
                }
                parked.error = row.error;
                parked.finished_at = row.finished_at;
                if row.input.is_some() {
                    parked.input = row.input;
                }
                if parked.status != "waiting" {
                    waiting.remove(&row.path);
                }
                continue;
            }
            if row.status == "waiting" {
                waiting.insert(row.path.clone(), shown.len());
            }
            shown.push(row);
        }
        shown
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunSummary,
    pub context: Value,
    /// The `output` of the run's `end` step; `null` until then, or without one.
    pub output: Value,
    /// Who started the run: `{"kind": "key", "id"}` (an API key, by hand),
    /// `{"kind": "system", "source"}` (a webhook, poll, schedule or ticket
    /// event), `{"kind": "automation", "runId"}` (an event a run raised),
    /// `{"kind": "parent", "runId"}` (a child run); `null` for older runs.
    pub actor: Value,
    pub steps: Vec<StepRow>,
    /// What a waiting run waits for; empty for every other run.
    pub waits: Vec<WaitRow>,
}

/// A parked wait: the step, what it waits for (`kind` `event`: the signal
/// `key`; `runs`: the run `run:<id>`), and when it times out (`None`: never).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaitRow {
    pub path: String,
    pub kind: String,
    pub key: String,
    /// The ticket the awaited signal must be about; `None`: about none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(serialize_with = "crate::rfc3339::serialize_opt")]
    pub due_at: Option<i64>,
}

impl From<&WaitRow> for tok_core::blocked::Wait {
    fn from(w: &WaitRow) -> Self {
        Self {
            kind: w.kind.clone(),
            key: w.key.clone(),
            subject: w.subject.clone(),
            due_at: w.due_at,
        }
    }
}

/// One page of a listing: `next_cursor` is `None` on the last page.
#[derive(Debug, Clone, Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// The page of rows read with `LIMIT limit + 1` in the listing's order:
    /// the row past `limit` only says that another page follows, and the
    /// cursor is the `key` of the last row kept (the listing's next query
    /// reads the rows after it: keyset pages, stable while rows are added).
    pub fn of(mut items: Vec<T>, limit: u32, key: impl Fn(&T) -> String) -> Self {
        let next_cursor = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(key)
        } else {
            None
        };
        Self { items, next_cursor }
    }
}

/// How many jobs wait and how old the oldest ready one is.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct QueueStats {
    pub ready: i64,
    pub scheduled: i64,
    pub running: i64,
    pub oldest_ready_ms: Option<i64>,
    pub pending_events: i64,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::StepRow;

    fn row(path: &str, id: &str, status: &str, log: &str, at: i64) -> StepRow {
        StepRow {
            path: path.into(),
            step_id: id.into(),
            kind: "wait_for_event".into(),
            attempt: 1,
            status: status.into(),
            input: None,
            output: (status != "waiting").then(|| json!({ "at": at })),
            error: None,
            log: json!([log]),
            started_at: at,
            finished_at: at,
        }
    }

    fn seen(rows: &[StepRow]) -> Vec<String> {
        rows.iter()
            .map(|r| {
                format!(
                    "{} {} {}-{} {}",
                    r.step_id, r.status, r.started_at, r.finished_at, r.log
                )
            })
            .collect()
    }

    #[test]
    fn a_resumed_wait_reads_as_what_it_became_and_an_open_one_still_waits() {
        let rows = vec![
            row("0", "st_first", "completed", "done", 1),
            row("1", "st_paid", "waiting", "waiting for payment", 2),
            row("1.escalations.0.0", "st_remind", "completed", "reminded", 3),
            row("1", "st_paid", "completed", "resumed by signal", 9),
            row("2", "st_shipped", "waiting", "waiting for shipping", 10),
        ];
        assert_eq!(
            seen(&StepRow::as_they_became(rows)),
            [
                r#"st_first completed 1-1 ["done"]"#,
                r#"st_paid completed 2-9 ["waiting for payment","resumed by signal"]"#,
                r#"st_remind completed 3-3 ["reminded"]"#,
                r#"st_shipped waiting 10-10 ["waiting for shipping"]"#,
            ]
        );
    }

    #[test]
    fn each_iteration_of_a_wait_at_one_path_merges_with_its_own_resume() {
        let rows = vec![
            row("0.do.0", "st_wait", "waiting", "a", 1),
            row("0.do.0", "st_wait", "completed", "b", 2),
            row("0.do.0", "st_wait", "waiting", "c", 3),
            row("0.do.0", "st_wait", "failed", "d", 4),
            row("0.do.0", "st_wait", "failed", "retried", 5),
        ];
        assert_eq!(
            seen(&StepRow::as_they_became(rows)),
            [
                r#"st_wait completed 1-2 ["a","b"]"#,
                r#"st_wait failed 3-4 ["c","d"]"#,
                r#"st_wait failed 5-5 ["retried"]"#,
            ]
        );
    }
}
