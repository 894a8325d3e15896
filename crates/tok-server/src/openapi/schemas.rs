//! The shapes of answers that handlers build as JSON, for the document.
//! The API tests validate every answer against them, so a field that a
//! handler renames, drops or retypes fails there. Times are what handlers
//! answer today: epoch milliseconds (`i64`) or RFC 3339 strings.

#![allow(dead_code)]

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// Where a run is in its life: `compensating` while a cancelled (or
/// failed, with `settings.compensateOnFailure`) run undoes its completed
/// steps; it ends `cancelled` or `failed`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RunStatusName {
    Queued,
    Running,
    Waiting,
    Paused,
    Compensating,
    Completed,
    Failed,
    Cancelled,
}

/// One run as listings show it.
#[derive(Serialize, ToSchema)]
pub(crate) struct RunSummary {
    id: String,
    automation_id: String,
    version: i32,
    event_id: String,
    status: RunStatusName,
    /// webhook, event, poll, schedule, manual or parent.
    trigger_type: String,
    depth: i32,
    actions: i32,
    #[schema(required = true)]
    subject_ticket_id: Option<String>,
    /// The run that started this one (trigger type `parent`).
    #[schema(required = true)]
    parent_run_id: Option<String>,
    created_at: i64,
    #[schema(required = true)]
    started_at: Option<i64>,
    #[schema(required = true)]
    finished_at: Option<i64>,
    #[schema(required = true)]
    error: Option<String>,
}

/// A page of runs; `next_cursor` is null on the last page.
#[derive(Serialize, ToSchema)]
pub(crate) struct RunPage {
    items: Vec<RunSummary>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// One run with its context, output, steps and waits.
#[derive(Serialize, ToSchema)]
pub(crate) struct RunDetail {
    #[serde(flatten)]
    run: RunSummary,
    context: Value,
    /// The `output` of the run's `end` step; null until then, or without one.
    output: Value,
    steps: Vec<StepRow>,
    /// What a waiting run waits for; empty for every other run.
    waits: Vec<WaitRow>,
}

/// One attempt of one step.
#[derive(Serialize, ToSchema)]
pub(crate) struct StepRow {
    path: String,
    step_id: String,
    #[serde(rename = "type")]
    kind: String,
    attempt: i32,
    status: String,
    input: Option<Value>,
    output: Option<Value>,
    #[schema(required = true)]
    error: Option<String>,
    /// The step's log lines.
    log: Value,
    started_at: i64,
    finished_at: i64,
}

/// A parked wait: `kind` `event` (the signal `key`) or `runs` (`run:<id>`).
#[derive(Serialize, ToSchema)]
pub(crate) struct WaitRow {
    path: String,
    kind: String,
    key: String,
    /// When it times out; null: never.
    #[schema(required = true)]
    due_at: Option<i64>,
}

/// An automation and its current version.
#[derive(Serialize, ToSchema)]
pub(crate) struct Automation {
    id: String,
    name: String,
    /// active or paused.
    status: String,
    version: i32,
    hash: String,
    definition: Value,
    created_at: i64,
    updated_at: i64,
}

/// An automation, and when a poll or schedule trigger is due next.
#[derive(Serialize, ToSchema)]
pub(crate) struct AutomationDetail {
    #[serde(flatten)]
    automation: Automation,
    /// Epoch milliseconds; null for other triggers.
    #[schema(required = true)]
    next_run_at: Option<i64>,
}

/// A page of automations.
#[derive(Serialize, ToSchema)]
pub(crate) struct AutomationPage {
    items: Vec<Automation>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// The automation a create or update saved, and its version.
#[derive(Serialize, ToSchema)]
pub(crate) struct AutomationSaved {
    id: String,
    version: i32,
}

/// One saved version's definition.
#[derive(Serialize, ToSchema)]
pub(crate) struct AutomationVersion {
    id: String,
    version: i32,
    definition: Value,
}

/// An automation's status after pause or resume.
#[derive(Serialize, ToSchema)]
pub(crate) struct AutomationStatus {
    id: String,
    status: String,
}

/// The run a manual start created.
#[derive(Serialize, ToSchema)]
pub(crate) struct RunStarted {
    run_id: String,
}

/// A ticket.
#[derive(Serialize, ToSchema)]
pub(crate) struct Ticket {
    id: String,
    external_id: String,
    #[serde(rename = "type")]
    #[schema(required = true)]
    type_name: Option<String>,
    #[schema(required = true)]
    status: Option<String>,
    closed: bool,
    tags: Vec<String>,
    fields: serde_json::Map<String, Value>,
    #[schema(required = true)]
    title: Option<String>,
    #[schema(required = true)]
    assignee: Option<Assignee>,
    created_at: i64,
    updated_at: i64,
}

/// A ticket's assignee.
#[derive(Serialize, ToSchema)]
pub(crate) struct Assignee {
    id: String,
    #[schema(required = true)]
    name: Option<String>,
}

/// A ticket with its trace: what happened to it, oldest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct TicketDetail {
    #[serde(flatten)]
    ticket: Ticket,
    trace: Vec<Value>,
}

/// A page of tickets.
#[derive(Serialize, ToSchema)]
pub(crate) struct TicketPage {
    items: Vec<Ticket>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// What sending a signal did.
#[derive(Serialize, ToSchema)]
pub(crate) struct SignalSent {
    signal_id: String,
    /// The runs whose waits it resumed, oldest wait first.
    resumed: Vec<String>,
    /// It resumed nothing and waits in the buffer for a wait to start.
    buffered: bool,
    /// The idempotency key was used before: this is that send's answer.
    duplicate: bool,
}

/// A dashboard widget: a request whose answer tok caches for `ttl_sec`.
#[derive(Serialize, ToSchema)]
pub(crate) struct Widget {
    id: String,
    name: String,
    #[schema(required = true)]
    connection: Option<String>,
    request: Value,
    ttl_sec: i64,
    /// RFC 3339; null until the first fetch.
    #[schema(required = true)]
    fetched_at: Option<String>,
    /// RFC 3339.
    created_at: String,
}

/// A page of widgets.
#[derive(Serialize, ToSchema)]
pub(crate) struct WidgetPage {
    items: Vec<Widget>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// A widget's data, fresh or from the cache.
#[derive(Serialize, ToSchema)]
pub(crate) struct WidgetData {
    /// The answer's body (JSON when the service answered JSON, else text).
    data: Value,
    /// RFC 3339.
    fetched_at: String,
    age_s: i64,
    /// Served from the cache: no call left tok for this answer.
    cached: bool,
    /// Why a refresh failed, when the cached answer is served in its place.
    error: Option<String>,
}
