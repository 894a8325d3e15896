//! What the store's queries share: the rows of batch statements, the
//! process clock, and the layout of the queries for both backends.
//!
//! The SQL of PostgreSQL and SQLite differs in a handful of fragments (the
//! database clock, how a list of ids is bound, row locking: `fragments.rs`
//! defines them per backend, named for what they mean) and in two whole
//! queries, the fair selections of jobs to claim and of events to
//! dispatch (a file per backend each, in `queries/`); everything else is
//! the same text. The parts of the store that have a folder of their own
//! are written once as generic Rust over the driver of `sql/` (see
//! `docs/architecture.md`, "The store's traits"); each part not moved yet
//! is one file with one macro (`inbox_sql.rs` has
//! `impl_inbox!`, `queue_sql.rs` `impl_queue!`, …) that expands that part's
//! trait implementation for one backend with its fragments spliced in at
//! compile time, so a query exists once and both backends run it.
//! `postgres.rs` and `sqlite.rs` each import their backend's fragments and
//! expand every macro once, in one module, so the helpers of one file
//! (`insert_steps`, `steps_of`, …) serve the others.
//!
//! The macros are what is left of the first layout, in which every
//! statement was one `&'static str` built at compile time with `concat!`;
//! the parts move out of them one by one, and `sql/mod.rs` says why the
//! shared code is generic over a driver of our own rather than over
//! `sqlx::Database`. Backend-specific code (connecting, partitions) stays in `postgres.rs`
//! and `sqlite.rs`.

/// Unix milliseconds of the process clock, for `created_at`-style columns.
/// Leases and due times use the database clock instead (`db_now!`,
/// `fragments.rs`), which on SQLite adds the same offset (table `clock_offset`).
///
/// The clock is the system's plus an offset that only [`advance_clock`]
/// moves: `tok test` moves it past a wait instead of waiting.
pub fn now_ms() -> i64 {
    let system = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    system + CLOCK_OFFSET_MS.load(std::sync::atomic::Ordering::Relaxed)
}

/// [`now_ms`] as a timestamp: what the engine hands its decider as "now".
pub fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_millisecond(now_ms()).unwrap_or_else(|_| jiff::Timestamp::now())
}

/// How far [`now_ms`] is ahead of the system clock. Zero but in `tok test`.
static CLOCK_OFFSET_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Moves the process clock (and SQLite's `db_now!`) forward by `by_ms`:
/// the virtual clock of `tok test`, which runs the engine on a SQLite
/// store of its own and moves time to the next due job when nothing else
/// is left to do. PostgreSQL's clock is the server's and never moves, so
/// nothing that serves PostgreSQL calls this.
pub fn advance_clock(by_ms: i64) {
    CLOCK_OFFSET_MS.fetch_add(by_ms.max(0), std::sync::atomic::Ordering::Relaxed);
}

/// Events older than this no longer deduplicate a repeated idempotency key.
pub(crate) const IDEMPOTENCY_WINDOW_MS: i64 = 24 * 60 * 60 * 1000;

/// [`IDEMPOTENCY_WINDOW_MS`] for callers outside the store (the expiry of
/// the keys).
pub const IDEMPOTENCY_WINDOW: std::time::Duration =
    std::time::Duration::from_millis(IDEMPOTENCY_WINDOW_MS as u64);

/// The rows of a batch statement, bound as one JSON array (`batch_rows!`).
/// They borrow what they write: a payload or a context is serialized once
/// into the statement's parameter, never copied first.
///
/// Each row is a JSON object of its struct's fields, serialized with their
/// names, and the statement reads them by name (`x.value ->> 'run_id'`;
/// SQLite reads the label as the path `'$.run_id'`), so the order of the
/// fields means nothing. SQLite finds an object's member by comparing keys,
/// and it renders a row of `json_each` again as text each time the
/// statement reads `x.value`: `batch_rows!` turns each row into SQLite's
/// binary JSON once, and a batch insert of step rows by name costs less
/// than it did by position (docs/performance.md, "Batched rows read by
/// name").
#[derive(serde::Serialize)]
pub(crate) struct EventRow<'a> {
    pub(crate) id: &'a str,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) source_id: Option<&'a tok_core::ids::SourceId>,
    pub(crate) source_kind: &'a str,
    pub(crate) idempotency_key: &'a str,
    pub(crate) payload: &'a serde_json::Value,
    pub(crate) params: &'a serde_json::Value,
    pub(crate) cause_run_id: Option<&'a tok_core::ids::RunId>,
    pub(crate) depth: i32,
    pub(crate) origin_automation_id: Option<&'a tok_core::ids::AutomationId>,
    pub(crate) target_automation_id: Option<&'a tok_core::ids::AutomationId>,
    pub(crate) event_type: Option<&'a str>,
    pub(crate) subject_ticket_id: Option<&'a str>,
    pub(crate) traceparent: Option<&'a str>,
}

impl<'a> EventRow<'a> {
    pub(crate) fn new(
        id: &'a str,
        tenant_id: &'a tok_core::ids::TenantId,
        event: &'a crate::NewEvent,
    ) -> Self {
        EventRow {
            id,
            tenant_id,
            source_id: event.source_id.as_ref(),
            source_kind: &event.source_kind,
            idempotency_key: &event.idempotency_key,
            payload: &event.payload,
            params: &event.params,
            cause_run_id: event.cause_run_id.as_ref(),
            depth: event.depth,
            origin_automation_id: event.origin_automation_id.as_ref(),
            target_automation_id: event.target_automation_id.as_ref(),
            event_type: event.event_type.as_deref(),
            subject_ticket_id: event.subject_ticket_id.as_deref(),
            traceparent: event.traceparent.as_deref(),
        }
    }
}

/// A new run's row.
#[derive(serde::Serialize)]
pub(crate) struct RunRow<'a> {
    pub(crate) id: &'a tok_core::ids::RunId,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) automation_id: &'a tok_core::ids::AutomationId,
    pub(crate) version: i32,
    pub(crate) event_id: &'a tok_core::ids::EventId,
    pub(crate) trigger_type: &'a str,
    pub(crate) status: &'static str,
    pub(crate) depth: i32,
    pub(crate) queue_key: Option<&'a str>,
    pub(crate) context: &'a serde_json::Value,
    pub(crate) actions: i32,
    pub(crate) started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) idempotency_key: Option<&'a str>,
    pub(crate) subject_ticket_id: Option<&'a str>,
    /// Why a refused or skipped run did not start.
    pub(crate) error: Option<&'a str>,
    pub(crate) priority: i32,
    pub(crate) start_by: Option<i64>,
}

/// How a new run is written: its status, why it did not start (a refused
/// or skipped run) and when it started and finished.
pub(crate) struct RunStart<'a> {
    pub(crate) status: &'static str,
    pub(crate) error: Option<&'a str>,
    pub(crate) started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
}

impl<'a> RunRow<'a> {
    pub(crate) fn new(
        tenant_id: &'a tok_core::ids::TenantId,
        event_id: &'a tok_core::ids::EventId,
        run: &'a crate::NewRun,
        start: RunStart<'a>,
    ) -> Self {
        RunRow {
            id: &run.id,
            tenant_id,
            automation_id: &run.automation_id,
            version: run.version,
            event_id,
            trigger_type: &run.trigger_type,
            status: start.status,
            depth: run.depth,
            queue_key: run.queue_key.as_deref(),
            context: &run.context,
            actions: run.actions,
            started_at: start.started_at,
            finished_at: start.finished_at,
            idempotency_key: run.idempotency_key.as_deref(),
            subject_ticket_id: run.subject_ticket_id.as_deref(),
            error: start.error,
            priority: run.priority,
            start_by: run.start_by,
        }
    }
}

/// New runs whose first jobs are written claimed by a dispatching node.
pub(crate) struct HandedOff<'a> {
    pub(crate) node: &'a str,
    pub(crate) lease_ms: i64,
    pub(crate) token: &'a str,
    /// The runs, by id.
    pub(crate) runs: &'a std::collections::HashSet<tok_core::ids::RunId>,
}

/// A run's `flow.cancelOn` row.
#[derive(serde::Serialize)]
pub(crate) struct CancelRow<'a> {
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) run_id: &'a tok_core::ids::RunId,
    pub(crate) source: &'a str,
    pub(crate) path: &'a str,
    pub(crate) value: &'a str,
    pub(crate) filter: Option<&'a tok_core::definition::Filter>,
}

impl<'a> CancelRow<'a> {
    pub(crate) fn new(
        tenant_id: &'a tok_core::ids::TenantId,
        run_id: &'a tok_core::ids::RunId,
        key: &'a tok_core::run::CancelKey,
    ) -> Self {
        CancelRow {
            tenant_id,
            run_id,
            source: &key.source,
            path: &key.path,
            value: &key.value,
            filter: key.filter.as_ref(),
        }
    }
}

#[derive(serde::Serialize)]
pub(crate) struct JobRow<'a> {
    pub(crate) run_id: &'a tok_core::ids::RunId,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) path: &'a str,
    pub(crate) queue_key: Option<&'a str>,
    pub(crate) priority: i32,
    pub(crate) attempts: i32,
    pub(crate) locked_by: Option<&'a str>,
    pub(crate) claim_token: Option<&'a str>,
    /// Due this long after now (a start control's hold).
    pub(crate) delay_ms: i64,
    pub(crate) resume: Option<&'a tok_core::run::Resume>,
}

/// A claim to fence: the job, its tenant and the token it holds.
#[derive(serde::Serialize)]
pub(crate) struct FenceRow<'a> {
    pub(crate) id: i64,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) token: &'a str,
}

/// A lease to extend: the job and the token it was claimed under.
#[derive(serde::Serialize)]
pub(crate) struct LeaseRow<'a> {
    pub(crate) id: i64,
    pub(crate) token: &'a str,
}

/// A recorded job that stays: where it goes next, and whether it keeps its
/// lease (`token`) or is released.
#[derive(serde::Serialize)]
pub(crate) struct JobMove<'a> {
    pub(crate) id: i64,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) path: String,
    pub(crate) delay_ms: i64,
    pub(crate) attempts: i32,
    pub(crate) token: Option<String>,
    pub(crate) lease_ms: i64,
    pub(crate) held: bool,
    pub(crate) queue_key: Option<String>,
    /// When the job is due (Unix ms), overriding `delay_ms`: a parked wait's timeout.
    pub(crate) run_at: Option<i64>,
    /// Why the job will be handed out again; `None` for a job that is not parked.
    pub(crate) resume: Option<crate::Resume>,
}

/// What a job recorded at a wait becomes (see `signals_sql.rs`): ready now
/// with a buffered signal (`run_at` `None`), or parked until its timeout.
pub(crate) struct Parked {
    pub(crate) run_at: Option<i64>,
    pub(crate) resume: crate::Resume,
}

/// A step row: one executed step attempt of a run.
#[derive(Clone, Copy, serde::Serialize)]
pub(crate) struct StepRow<'a> {
    pub(crate) run_id: &'a tok_core::ids::RunId,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) path: &'a str,
    pub(crate) step_id: &'a str,
    /// The step's type.
    pub(crate) kind: &'a str,
    pub(crate) attempt: i32,
    pub(crate) status: tok_core::run::StepStatus,
    pub(crate) input: Option<&'a serde_json::Value>,
    pub(crate) output: Option<&'a serde_json::Value>,
    pub(crate) error: Option<&'a str>,
    pub(crate) log: &'a [String],
    pub(crate) started_at: i64,
    pub(crate) finished_at: i64,
    /// What the record changed of the run's context, on its last step row
    /// (`record/contexts.rs`).
    pub(crate) change: Option<&'a serde_json::value::RawValue>,
}

impl<'a> StepRow<'a> {
    pub(crate) fn new(
        run_id: &'a tok_core::ids::RunId,
        tenant_id: &'a tok_core::ids::TenantId,
        step: &'a crate::StepRecord,
        change: Option<&'a serde_json::value::RawValue>,
    ) -> Self {
        StepRow {
            run_id,
            tenant_id,
            path: &step.path,
            step_id: &step.step_id,
            kind: &step.kind,
            attempt: step.attempt,
            status: step.status,
            input: step.input.as_ref(),
            output: step.output.as_ref(),
            error: step.error.as_deref(),
            log: &step.log,
            started_at: step.started_at,
            finished_at: step.finished_at,
            change,
        }
    }
}

/// A wait row to take: the waits of a run at one path.
#[derive(serde::Serialize)]
pub(crate) struct WaitAt<'a> {
    pub(crate) tenant_id: &'a str,
    pub(crate) run_id: &'a str,
    pub(crate) path: &'a str,
}

/// A run, by its tenant and id: all of its wait rows.
#[derive(serde::Serialize)]
pub(crate) struct RunKey<'a> {
    pub(crate) tenant_id: &'a str,
    pub(crate) run_id: &'a str,
}

/// A claim whose token still holds, with what its record needs of its run
/// read under the fence.
#[derive(Debug, Clone)]
pub(crate) struct Fenced {
    pub(crate) status: String,
    /// The size of the changes the run's step rows hold since its context
    /// was last written whole, and of that context (`record/contexts.rs`).
    pub(crate) tail_bytes: i64,
    pub(crate) context_bytes: i64,
}

#[derive(serde::Serialize)]
pub(crate) struct RunUpdate<'a> {
    pub(crate) id: &'a tok_core::ids::RunId,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    /// The context written whole; `None` when the record's change went to
    /// its last step row instead.
    pub(crate) context: Option<&'a serde_json::value::RawValue>,
    pub(crate) actions: i32,
    pub(crate) status: &'static str,
    pub(crate) error: Option<&'a str>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) subject_ticket_id: Option<&'a str>,
    /// The size of the context written whole, or of the change kept in
    /// the step row (0: nothing changed).
    pub(crate) bytes: i64,
    /// The job that continues under its lease, where it is, and its row's
    /// `attempts` before that step (`None`: no job continues outside its row).
    pub(crate) cursor_job: Option<i64>,
    pub(crate) cursor_path: Option<&'a str>,
    pub(crate) cursor_base: Option<i32>,
    /// 1 when `context` is written whole (a flag of its own, so that the
    /// statement need not render the context to test it).
    pub(crate) whole: i32,
}

/// `value` serialized once, to go into a batch row as it is (a run's
/// context, or a record's change of it, whose size the record keeps), and
/// storable on every backend: U+0000, which PostgreSQL cannot keep in
/// JSON, is serialized as `\u0000`, and only a value whose text has that
/// is mended, on a copy (`storable.rs`).
pub(crate) fn raw_json<T: serde::Serialize + ?Sized>(
    value: &T,
) -> crate::Result<Box<serde_json::value::RawValue>> {
    let unserializable = |e: serde_json::Error| {
        crate::StoreError::Refused(format!("a run's context does not serialize: {e}"))
    };
    let raw = serde_json::value::to_raw_value(value).map_err(unserializable)?;
    if !raw.get().contains("\\u0000") {
        return Ok(raw);
    }
    let mut mended: serde_json::Value = serde_json::from_str(raw.get()).map_err(unserializable)?;
    crate::storable::mend_value(&mut mended);
    serde_json::value::to_raw_value(&mended).map_err(unserializable)
}
