//! The shapes of answers that handlers build as JSON, for the document.
//! The API tests validate every answer against them, so a field that a
//! handler renames, drops or retypes fails there. Every time is an RFC 3339
//! string in UTC (`format: date-time`).

#![allow(dead_code)]

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// Where a run is in its life: `compensating` while a cancelled (or
/// failed, with `settings.compensateOnFailure`) run undoes its completed
/// steps; it ends `cancelled` or `failed`. `refused`: an event would have
/// started the run over its automation's `settings.limits.startsPerMinute`;
/// no step ran. `skipped`: its automation's `flow.singleton` (mode `skip`)
/// had a run of the same key unfinished; no step ran. `expired`: no worker
/// began it within its automation's `flow.startTimeout`; no step ran.
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
    Refused,
    Skipped,
    Expired,
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
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(required = true, format = DateTime)]
    started_at: Option<String>,
    #[schema(required = true, format = DateTime)]
    finished_at: Option<String>,
    #[schema(required = true)]
    error: Option<String>,
    /// Its automation's `flow.priority` when it started, -100..100 (0
    /// without one): a tenant's jobs are claimed highest first.
    priority: i32,
    /// What holds a run that is neither running nor finished (in a run's
    /// detail and the runs listing); null otherwise.
    #[schema(required = true)]
    blocked_by: Option<BlockedBy>,
    /// In the runs listing, a run's detail and a run control's answer.
    progress: Option<RunProgress>,
}

/// How far a run is: the steps it executed, and the steps it executes in
/// all where its tree fixes that (no conditions, loops, branches or `end`).
#[derive(Serialize, ToSchema)]
pub(crate) struct RunProgress {
    done: u32,
    total: Option<u32>,
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

/// What holds a run.
#[derive(Serialize, ToSchema)]
pub(crate) struct BlockedBy {
    /// `approval`, `signal`, `condition`, `runs` (a wait), `breaker`,
    /// `connection_concurrency`, `connection_rate` (a step its connection
    /// held back), `throttle`, `debounce`, `batch` (its automation's start
    /// control holds its first step; `until` it is due, which a joining
    /// event moves), `timer` (a `wait` step, a retry's backoff), `queue_key`
    /// (a ticket's queue another run holds), `tenant_concurrency` (the
    /// tenant's `settings.limits.concurrency` reached).
    kind: String,
    /// When it lets go, where that is known.
    #[schema(required = true, format = DateTime)]
    until: Option<String>,
    /// What the kind names: `{key, subject?}` of a signal, `{approvalId}`, `{runId}`
    /// holding a queue key, `{reason}` of a connection's limit, `{limit,
    /// running}` of the tenant's cap, `{path}` of a timer.
    detail: Value,
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
    #[schema(format = DateTime)]
    started_at: String,
    #[schema(format = DateTime)]
    finished_at: String,
}

/// A parked wait: `kind` `event` (the signal `key`) or `runs` (`run:<id>`).
#[derive(Serialize, ToSchema)]
pub(crate) struct WaitRow {
    path: String,
    kind: String,
    key: String,
    /// The ticket the awaited signal must be about; absent: about none.
    subject: Option<String>,
    /// When it times out; null: never.
    #[schema(required = true, format = DateTime)]
    due_at: Option<String>,
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
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
    /// When a poll or schedule trigger is due next; null for other triggers.
    #[schema(required = true, format = DateTime)]
    next_run_at: Option<String>,
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
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
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
    /// The ticket the signal is about; null: about none.
    #[schema(required = true)]
    subject: Option<String>,
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

/// The process's state: `ok` (`/healthz`); `ready`, `starting`, `stopping`
/// or `database unavailable` (`/readyz`).
#[derive(Serialize, ToSchema)]
pub(crate) struct Health {
    status: String,
}

/// A webhook source: its contract and the full URL to send to.
#[derive(Serialize, ToSchema)]
pub(crate) struct Source {
    id: String,
    name: String,
    token: String,
    /// The full URL (`TOK_PUBLIC_URL` and the token).
    url: String,
    /// `[{name, path, type, required}]`.
    params: Vec<Value>,
    critical: bool,
    /// Events a second; null: no limit.
    #[schema(required = true)]
    rate_limit: Option<i32>,
    /// The JSON Schema (draft 2020-12) every body must meet; null: none.
    #[schema(required = true)]
    schema: Option<Value>,
    /// Sends must carry the signature of the sender `verify` names.
    signed: bool,
    /// The sender whose signature is checked; null: none. Its secret is
    /// never shown.
    #[schema(required = true)]
    verify: Option<SourceVerify>,
    /// Until when the token before the last rotation still opens the
    /// source; null when none does.
    #[schema(required = true, format = DateTime)]
    previous_token_expires_at: Option<String>,
    /// Until when a webhook signed with the secret before the last
    /// rotation is still accepted; null when none is.
    #[schema(required = true, format = DateTime)]
    previous_secret_expires_at: Option<String>,
    #[schema(format = DateTime)]
    created_at: String,
}

/// The sender a source checks.
#[derive(Serialize, ToSchema)]
pub(crate) struct SourceVerify {
    /// `standard`, `stripe`, `github`, `shopify` or `slack`.
    preset: String,
}

/// A page of sources, oldest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct SourcePage {
    items: Vec<Source>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// How `GET /webhook/{token}` tells a sender what to send.
#[derive(Serialize, ToSchema)]
pub(crate) struct WebhookHelp {
    method: String,
    content_type: String,
    url: String,
    source: String,
    /// `[{name, path, type, required}]`.
    params: Vec<Value>,
    /// A body with every param at its path.
    example: Value,
    max_body_bytes: i64,
    idempotency: String,
    /// Present when sends must be signed: what the headers must be.
    signature: Option<String>,
    /// Present when the source checks a sender's signature: the sender and
    /// the headers it sends.
    verify: Option<WebhookSender>,
    /// The source's JSON Schema, when it has one.
    schema: Option<Value>,
    /// How to try a body without storing it.
    dry_run: String,
}

/// A sender and the headers it sends, for the webhook's help.
#[derive(Serialize, ToSchema)]
pub(crate) struct WebhookSender {
    preset: String,
    headers: Vec<crate::senders::SentHeader>,
}

/// A 200 of `POST /webhook/{token}`: the answer of a dry run, or the
/// challenge of Slack's `url_verification`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum WebhookAnswered {
    DryRun(WebhookDryRun),
    Challenge(SlackChallenge),
}

/// What Slack's `url_verification` is answered: its own challenge.
#[derive(Serialize, ToSchema)]
pub(crate) struct SlackChallenge {
    challenge: String,
}

/// What a webhook would do (`?dry_run=true`); nothing was stored.
#[derive(Serialize, ToSchema)]
pub(crate) struct WebhookDryRun {
    /// Always true.
    dry_run: bool,
    /// The source's name.
    source: String,
    signature: DryRunSignature,
    /// The key the event would be kept under (a repeat within 24 h is a
    /// duplicate); absent for Slack's `url_verification`.
    idempotency_key: Option<String>,
    /// What the runs' context would hold at the top: the contract's
    /// params, and `_sender` for a signed source.
    params: Value,
    /// Each automation the source triggers (archived ones left out).
    automations: Vec<DryRunAutomation>,
    /// How many of them would start a run.
    would_start: i64,
    /// What a real request would be answered instead of an event (Slack's
    /// `url_verification`: `{challenge}`).
    answer: Option<SlackChallenge>,
    note: Option<String>,
}

/// How a dry run took the sender's signature.
#[derive(Serialize, ToSchema)]
pub(crate) struct DryRunSignature {
    /// The sender checked; null for a source that checks none.
    #[schema(required = true)]
    preset: Option<String>,
    /// Whether the signature was checked (a dry run asked with the
    /// tenant's API key and none of the sender's headers is not).
    checked: bool,
    note: String,
}

/// One automation of the source in a dry run.
#[derive(Serialize, ToSchema)]
pub(crate) struct DryRunAutomation {
    id: String,
    name: String,
    /// `active` or `paused`.
    status: String,
    /// Whether this webhook would start a run of it (its start controls
    /// aside: see `flow`).
    would_start: bool,
    /// Its trigger filter over the run's context; null when it has none.
    #[schema(required = true)]
    filter: Option<DryRunFilter>,
    /// Why it would start or not.
    why: String,
    /// Present when a start control (`flow.debounce`, …) decides when the
    /// run starts.
    flow: Option<String>,
}

/// A trigger filter evaluated: the result and one line per rule.
#[derive(Serialize, ToSchema)]
pub(crate) struct DryRunFilter {
    /// `all` or `any`.
    #[serde(rename = "match")]
    match_: String,
    holds: bool,
    /// What each rule compared, as the dispatcher logs it.
    lines: Vec<String>,
}

/// A ticket type: its statuses, in order, and its custom fields.
#[derive(Serialize, ToSchema)]
pub(crate) struct TicketType {
    id: String,
    name: String,
    statuses: Vec<String>,
    /// `[{name, type?, …}]`.
    fields: Vec<Value>,
    #[schema(format = DateTime)]
    created_at: String,
}

/// A page of ticket types, by name.
#[derive(Serialize, ToSchema)]
pub(crate) struct TicketTypePage {
    items: Vec<TicketType>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// A member of a group: how many open tickets suit them.
#[derive(Serialize, ToSchema)]
pub(crate) struct Member {
    id: String,
    name: String,
    capacity: i32,
}

/// An API key of the tenant's, as listed: never its secret.
#[derive(Serialize, ToSchema)]
pub(crate) struct ApiKey {
    id: String,
    name: String,
    /// Of `read`, `write` (which grants `read` and `signal`), `signal`, `admin` (which grants every scope).
    scopes: Vec<String>,
    created_at: String,
    #[schema(required = true)]
    expires_at: Option<String>,
    expired: bool,
    /// When a request last used it (noted at most once a minute per process).
    #[schema(required = true)]
    last_used_at: Option<String>,
}

/// A key just made: an [`ApiKey`] and its secret, shown this once.
#[derive(Serialize, ToSchema)]
pub(crate) struct NewApiKey {
    #[serde(flatten)]
    listed: ApiKey,
    /// The secret: send it as `Authorization: Bearer <key>`. Only its hash is kept.
    key: String,
}

/// A page of the tenant's keys, oldest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct ApiKeyPage {
    items: Vec<ApiKey>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// A group of people tickets are assigned to.
#[derive(Serialize, ToSchema)]
pub(crate) struct Group {
    id: String,
    name: String,
    members: Vec<Member>,
}

/// A page of groups, by name.
#[derive(Serialize, ToSchema)]
pub(crate) struct GroupPage {
    items: Vec<Group>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// A connection's circuit breaker.
#[derive(Serialize, ToSchema)]
pub(crate) struct Breaker {
    threshold: i32,
    cooldown_ms: i64,
    /// closed, open or half_open.
    state: String,
    failures: i32,
}

/// A connection to an outside service; its credentials are never shown.
#[derive(Serialize, ToSchema)]
pub(crate) struct Connection {
    id: String,
    name: String,
    /// http or mcp.
    service: String,
    #[schema(required = true)]
    base_url: Option<String>,
    has_credentials: bool,
    /// Calls a second; null: no rate limit.
    #[schema(required = true)]
    rate: Option<f64>,
    burst: i32,
    #[schema(required = true)]
    max_concurrency: Option<i32>,
    breaker: Breaker,
    #[schema(format = DateTime)]
    created_at: String,
}

/// A page of connections, by name.
#[derive(Serialize, ToSchema)]
pub(crate) struct ConnectionPage {
    items: Vec<Connection>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// An incident of a tenant. `detail`, `source` and `run_id` are shown to
/// the platform admin only.
#[derive(Serialize, ToSchema)]
pub(crate) struct Incident {
    id: String,
    title: String,
    impact: String,
    /// open or resolved.
    status: String,
    occurrences: i32,
    #[schema(required = true)]
    ticket_id: Option<String>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
    #[schema(required = true, format = DateTime)]
    resolved_at: Option<String>,
    /// Admin only: automation, run, failed step, message, steps, input.
    detail: Option<Value>,
    /// Admin only: the cause an open incident is deduplicated on.
    source: Option<String>,
    /// Admin only.
    run_id: Option<String>,
}

/// A page of incidents, newest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct IncidentPage {
    items: Vec<Incident>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// An incident of the platform (a stuck run, a failing scheduler), for the
/// platform admin.
#[derive(Serialize, ToSchema)]
pub(crate) struct PlatformIncident {
    id: String,
    reason: String,
    source: String,
    #[schema(required = true)]
    tenant_id: Option<String>,
    #[schema(required = true)]
    run_id: Option<String>,
    title: String,
    detail: Value,
    /// open or resolved.
    status: String,
    occurrences: i32,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
    #[schema(required = true, format = DateTime)]
    resolved_at: Option<String>,
}

/// A page of platform incidents, newest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct PlatformIncidentPage {
    items: Vec<PlatformIncident>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// A resolved platform incident.
#[derive(Serialize, ToSchema)]
pub(crate) struct PlatformIncidentResolved {
    id: String,
    status: String,
}

/// A tenant as the platform admin sees it.
#[derive(Serialize, ToSchema)]
pub(crate) struct Tenant {
    id: String,
    name: String,
    suspended: bool,
    /// `active`, or `deleting` from its `DELETE` until its rows are all
    /// erased (then it is gone: 404).
    status: String,
    #[schema(format = DateTime)]
    created_at: String,
}

/// One tenant; while it is being deleted, with what is left of it.
#[derive(Serialize, ToSchema)]
pub(crate) struct TenantShown {
    #[serde(flatten)]
    tenant: Tenant,
    /// Only while `status` is `deleting`.
    deletion: Option<TenantDeletion>,
}

/// What is left of a tenant being deleted.
#[derive(Serialize, ToSchema)]
pub(crate) struct TenantDeletion {
    /// When its deletion was asked.
    #[schema(format = DateTime)]
    requested_at: String,
    /// Rows of the tenant each table still holds (tables with none left
    /// out), each counted up to `counted_up_to`: that many means at
    /// least as many. Empty: the deletion is about to end.
    remaining: std::collections::BTreeMap<String, u64>,
    counted_up_to: u64,
}

/// A page of tenants, oldest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct TenantPage {
    items: Vec<Tenant>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// A new tenant and its first API key (shown once).
#[derive(Serialize, ToSchema)]
pub(crate) struct TenantCreated {
    id: String,
    name: String,
    api_key: String,
}

/// A tenant after a change, with its settings.
#[derive(Serialize, ToSchema)]
pub(crate) struct TenantChanged {
    #[serde(flatten)]
    tenant: Tenant,
    /// `{retention: {stepDataDays, runsDays, traceDays, inboxDays, auditDays}, limits:
    /// {signalsPerSecond: {rate, burst}, streams, startsPerMinute, concurrency},
    /// webhooks: {requireSignature, inForce}}`: the limits in force, defaults
    /// filled in (`requireSignature`: the tenant's own choice, null when it
    /// has none; `inForce`: with the platform's default).
    settings: Value,
}

/// Someone who may decide an approval.
#[derive(Serialize, ToSchema)]
pub(crate) struct Approver {
    id: String,
    name: String,
}

/// An approval a run waits for (docs/workflows.md, "`approval`").
#[derive(Serialize, ToSchema)]
pub(crate) struct Approval {
    id: String,
    run_id: String,
    automation_id: String,
    step_id: String,
    path: String,
    prompt: String,
    approvers: Vec<Approver>,
    /// pending, approved, rejected, timed_out or closed.
    status: String,
    #[schema(required = true)]
    decided_by: Option<Approver>,
    #[schema(required = true)]
    comment: Option<String>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(required = true, format = DateTime)]
    decided_at: Option<String>,
}

/// A page of approvals, newest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct ApprovalPage {
    items: Vec<Approval>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// The tenant a dashboard session acts for.
#[derive(Serialize, ToSchema)]
pub(crate) struct SessionTenant {
    id: String,
    #[schema(required = true)]
    name: Option<String>,
}

/// Who signed in to the dashboard: `admin` (the platform key) or `tenant`.
#[derive(Serialize, ToSchema)]
pub(crate) struct Session {
    kind: String,
    #[schema(required = true)]
    tenant: Option<SessionTenant>,
    /// The key's name.
    name: String,
    /// What the key may do (the platform admin key: `admin`).
    scopes: Vec<String>,
}

/// The tenant's queue now.
#[derive(Serialize, ToSchema)]
pub(crate) struct QueueHealth {
    ready: i64,
    scheduled: i64,
    running: i64,
    /// Events received and not yet dispatched.
    pending_events: i64,
    /// How long the oldest ready job has waited; null: none waits.
    #[schema(required = true)]
    oldest_ready_s: Option<f64>,
    #[schema(format = DateTime)]
    sampled_at: String,
}

/// The tenant's queue over the last minutes (`GET /api/dashboard/queue/history`).
#[derive(Serialize, ToSchema)]
pub(crate) struct QueueHistory {
    tenant_id: String,
    minutes: u32,
    #[schema(format = DateTime)]
    from: String,
    #[schema(format = DateTime)]
    to: String,
    /// How often the node running the scheduler keeps a sample
    /// (`TOK_QUEUE_SAMPLE_EVERY`).
    sample_every_s: f64,
    /// Oldest first.
    samples: Vec<QueueSampleView>,
}

/// One sample of the tenant's queue, and the step attempts recorded in the
/// `window_s` seconds before it (since the sample before).
#[derive(Serialize, ToSchema)]
pub(crate) struct QueueSampleView {
    #[schema(format = DateTime)]
    at: String,
    ready: i64,
    scheduled: i64,
    running: i64,
    pending_events: i64,
    /// How long the oldest ready job had waited; null: none waited.
    #[schema(required = true)]
    oldest_ready_s: Option<f64>,
    steps_completed: i64,
    /// Failed attempts, retried or not.
    steps_failed: i64,
    window_s: f64,
    /// Step attempts (completed and failed) per second over the window.
    steps_per_s: f64,
}

/// An OpenAPI 3.1 document (`GET /api/openapi.json`).
#[derive(Serialize, ToSchema)]
pub(crate) struct OpenApiDocument {
    openapi: String,
    info: Value,
    paths: Value,
}

/// Who made a change: one of the tenant's keys (`key`), the platform
/// (`platform`: its admin key, or tok itself at start), or a caller
/// without a key (`anonymous`). The key's id and name, never its secret.
#[derive(Serialize, ToSchema)]
pub(crate) struct AuditActor {
    /// key, platform or anonymous.
    kind: String,
    #[schema(required = true)]
    id: Option<String>,
    #[schema(required = true)]
    name: Option<String>,
}

/// What a change was made to: the kind of resource and its id.
#[derive(Serialize, ToSchema)]
pub(crate) struct AuditTarget {
    /// automation, source, key, run, approval, tenant, …
    kind: String,
    #[schema(required = true)]
    id: Option<String>,
}

/// One change a key or the platform made (docs/security.md, "Audit"):
/// never a secret.
#[derive(Serialize, ToSchema)]
pub(crate) struct AuditEntry {
    id: String,
    #[schema(format = DateTime)]
    at: String,
    /// The tenant changed; null for the platform's own rows (seen by the
    /// platform admin only).
    #[schema(required = true)]
    tenant_id: Option<String>,
    actor: AuditActor,
    /// `resource.verb`: `automation.created`, `automation.saved`,
    /// `source.rotated`, `key.revoked`, `run.retried`, `approval.decided`, …
    action: String,
    target: AuditTarget,
    /// A few words for people (a name, a version, the fields changed).
    #[schema(required = true)]
    summary: Option<String>,
    /// `done`: the change was made. `pending`: the row was written before
    /// the change, which is under way. `unknown`: the change answered an
    /// error that may have come after it was made, or its process stopped
    /// before it said (set by the scheduler once the row was pending ten
    /// minutes).
    outcome: String,
}

/// A page of the audit log, newest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct AuditPage {
    items: Vec<AuditEntry>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// An accepted event as the inbox keeps it.
#[derive(Serialize, ToSchema)]
pub(crate) struct Event {
    id: String,
    /// The source it came from; null for internal events and manual starts.
    #[schema(required = true)]
    source_id: Option<String>,
    /// webhook, poll, event, manual, …
    source_kind: String,
    /// An internal event's type (`ticket.created`, …).
    #[schema(required = true)]
    event_type: Option<String>,
    /// `pending` until the dispatcher takes it, then `dispatched`; `failed`
    /// when the dispatcher set it aside (its runs could not be planned or
    /// written, for a reason of its own): `error` says why, and a replay
    /// dispatches it again.
    status: String,
    /// The event this one replays (always the first, never a replay).
    #[schema(required = true)]
    replay_of: Option<String>,
    #[schema(format = DateTime)]
    received_at: String,
    /// Why the dispatcher set the event aside (`dispatch_failed: …`); null
    /// unless `status` is `failed`.
    #[schema(required = true)]
    error: Option<String>,
}

/// An event and the runs it started.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventDetail {
    #[serde(flatten)]
    event: Event,
    /// The runs this event started (not those of its replays: each replay
    /// is an event of its own), newest first.
    runs: Vec<RunSummary>,
}

/// What a replay of one event did.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventReplayed {
    /// Whether a replay was written.
    replayed: bool,
    /// Why not (`if_no_runs`): `has_runs` (the event or a replay of it
    /// started runs) or `pending` (a replay waits for the dispatcher).
    reason: Option<String>,
    /// The replay written, or the one still pending.
    event_id: Option<String>,
    /// The event replayed.
    replay_of: Option<String>,
    /// The replay's status: `pending` while the dispatcher has not taken it
    /// (the answer is then 202).
    status: Option<String>,
    /// The ids of the runs the replay started, or with `has_runs` of those
    /// the event already has.
    runs: Vec<String>,
}

/// One event a filtered replay wrote a replay for.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventReplay {
    event_id: String,
    replay_id: String,
}

/// One event a filtered replay left (`if_no_runs`).
#[derive(Serialize, ToSchema)]
pub(crate) struct EventNotReplayed {
    event_id: String,
    /// `has_runs`, `pending` or `gone` (expired meanwhile).
    reason: String,
    /// With `has_runs`: the runs it has.
    runs: Option<Vec<String>>,
    /// With `pending`: the replay still waiting for the dispatcher.
    pending: Option<String>,
}

/// What a filtered replay did, or with `dry_run` would do.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventsReplayed {
    /// A dry run: nothing was written.
    dry_run: Option<bool>,
    /// Dry run: every event the filter takes.
    count: Option<i64>,
    /// Dry run: the first page of them, oldest first.
    events: Option<Vec<Event>>,
    /// The events of this page replayed, oldest first.
    replayed: Option<Vec<EventReplay>>,
    /// The events of this page `if_no_runs` left.
    skipped: Option<Vec<EventNotReplayed>>,
    /// The next page of the filter (send it as `cursor`).
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// What a bulk operation's dry run would touch.
#[derive(Serialize, ToSchema)]
pub(crate) struct BulkDryRun {
    dry_run: bool,
    /// The runs the filter takes, counted so far (with the counts of the
    /// calls before, when `cursor` was sent).
    count: i64,
    /// Whether every run was counted: `false` when the call read as many
    /// runs' contexts as one call reads (for `where`).
    complete: bool,
    /// Send it back as `cursor` (with the same filter) to go on counting;
    /// `null` once `complete`.
    next_cursor: Option<String>,
    /// The first of them this call counted, newest first (at most 50).
    runs: Vec<RunSummary>,
}

/// A bulk operation made.
#[derive(Serialize, ToSchema)]
pub(crate) struct BulkStarted {
    operation_id: String,
    /// The runs the filter took when it was made, as far as one call
    /// counted them (see `total_complete`).
    total: i64,
    /// Whether `total` counted every run; when not, it grows as the
    /// operation acts on more.
    total_complete: bool,
    status: String,
}

/// A bulk retry or cancel of the runs a filter takes.
#[derive(Serialize, ToSchema)]
pub(crate) struct Operation {
    id: String,
    /// `retry` or `cancel`.
    action: String,
    /// A retry's version: `original` or `current`.
    version: String,
    /// The filter as it was sent.
    filter: Value,
    /// `running`, `done` or `cancelled`.
    status: String,
    /// The runs the filter took when it was made.
    total: i64,
    /// Runs acted on.
    done: i64,
    /// Runs it could not act on (`failures` says why).
    failed: i64,
    /// The key that made it: `{"kind": "key", "id"}`.
    #[schema(required = true)]
    actor: Option<Value>,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(required = true, format = DateTime)]
    finished_at: Option<String>,
}

/// One run an operation could not act on.
#[derive(Serialize, ToSchema)]
pub(crate) struct OperationFailure {
    run_id: String,
    reason: String,
}

/// An operation with the runs it could not act on (the first 100).
#[derive(Serialize, ToSchema)]
pub(crate) struct OperationDetail {
    #[serde(flatten)]
    operation: Operation,
    failures: Vec<OperationFailure>,
}

/// A page of the tenant's operations, newest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct OperationPage {
    items: Vec<Operation>,
    #[schema(required = true)]
    next_cursor: Option<String>,
}
