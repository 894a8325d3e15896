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
/// Each row is a JSON array of its fields in the order [`array_row!`]
/// lists them, and the statement reads them by position (`x.value ->> 0`):
/// SQLite finds an array element by its index but an object's member by
/// comparing keys, and with objects a batch insert of step rows took twice
/// as long on the one writer.
pub(crate) struct EventRow<'a> {
    pub(crate) id: &'a str,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) event: &'a crate::NewEvent,
}

pub(crate) struct RunRow<'a> {
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) event_id: &'a tok_core::ids::EventId,
    pub(crate) status: &'static str,
    /// Why a refused or skipped run did not start.
    pub(crate) error: Option<&'a str>,
    pub(crate) started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) run: &'a crate::NewRun,
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
pub(crate) struct CancelRow<'a> {
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) run_id: &'a tok_core::ids::RunId,
    pub(crate) key: &'a tok_core::run::CancelKey,
}

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
pub(crate) struct FenceRow<'a> {
    pub(crate) id: i64,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) token: &'a str,
}

/// A lease to extend: the job and the token it was claimed under.
pub(crate) struct LeaseRow<'a> {
    pub(crate) id: i64,
    pub(crate) token: &'a str,
}

/// A recorded job that stays: where it goes next, and whether it keeps its
/// lease (`token`) or is released.
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

#[derive(Clone, Copy)]
pub(crate) struct StepRow<'a> {
    pub(crate) run_id: &'a tok_core::ids::RunId,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) step: &'a crate::StepRecord,
    /// What the record changed of the run's context, on its last step row
    /// (`record/contexts.rs`).
    pub(crate) change: Option<&'a serde_json::value::RawValue>,
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

/// Serializes a batch row as a JSON array: `row` names the row inside the
/// brackets, whose expressions are its elements, position 0 first.
macro_rules! array_row {
    ($ty:ident, |$row:ident| [$($field:expr),+ $(,)?]) => {
        impl serde::Serialize for $ty<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeTuple;
                let $row = self;
                let len = [$(stringify!($field)),+].len();
                let mut tuple = serializer.serialize_tuple(len)?;
                $(tuple.serialize_element(&$field)?;)+
                tuple.end()
            }
        }
    };
}

array_row!(EventRow, |r| [
    r.id,                         // 0
    r.tenant_id,                  // 1
    r.event.source_id,            // 2
    r.event.source_kind,          // 3
    r.event.idempotency_key,      // 4
    r.event.payload,              // 5
    r.event.params,               // 6
    r.event.cause_run_id,         // 7
    r.event.depth,                // 8
    r.event.origin_automation_id, // 9
    r.event.target_automation_id, // 10
    r.event.event_type,           // 11
    r.event.subject_ticket_id,    // 12
    r.event.traceparent,          // 13
]);

array_row!(RunRow, |r| [
    r.run.id,                // 0
    r.tenant_id,             // 1
    r.run.automation_id,     // 2
    r.run.version,           // 3
    r.event_id,              // 4
    r.run.trigger_type,      // 5
    r.status,                // 6
    r.run.depth,             // 7
    r.run.queue_key,         // 8
    r.run.context,           // 9
    r.started_at,            // 10
    r.finished_at,           // 11
    r.run.idempotency_key,   // 12
    r.run.subject_ticket_id, // 13
    r.run.actions,           // 14
    r.error,                 // 15
    r.run.priority,          // 16
    r.run.start_by,          // 17
]);

array_row!(JobRow, |r| [
    r.run_id,      // 0
    r.tenant_id,   // 1
    r.path,        // 2
    r.attempts,    // 3
    r.queue_key,   // 4
    r.priority,    // 5
    r.locked_by,   // 6
    r.claim_token, // 7
    r.delay_ms,    // 8
    r.resume,      // 9
]);

array_row!(CancelRow, |r| [
    r.tenant_id,  // 0
    r.key.source, // 1
    r.key.path,   // 2
    r.key.value,  // 3
    r.run_id,     // 4
    r.key.filter, // 5
]);

array_row!(FenceRow, |r| [r.id, r.tenant_id, r.token]);
array_row!(LeaseRow, |r| [r.id, r.token]);

array_row!(JobMove, |r| [
    r.id,        // 0
    r.tenant_id, // 1
    r.path,      // 2
    r.delay_ms,  // 3
    r.attempts,  // 4
    r.token,     // 5
    r.lease_ms,  // 6
    r.held,      // 7
    r.queue_key, // 8
    r.run_at,    // 9
    r.resume,    // 10
]);

array_row!(StepRow, |r| [
    r.run_id,           // 0
    r.tenant_id,        // 1
    r.step.path,        // 2
    r.step.step_id,     // 3
    r.step.kind,        // 4
    r.step.attempt,     // 5
    r.step.status,      // 6
    r.step.input,       // 7
    r.step.output,      // 8
    r.step.error,       // 9
    r.step.log,         // 10
    r.step.started_at,  // 11
    r.step.finished_at, // 12
    r.change,           // 13
]);

array_row!(RunUpdate, |r| [
    r.id,                // 0
    r.tenant_id,         // 1
    r.context,           // 2
    r.actions,           // 3
    r.status,            // 4
    r.error,             // 5
    r.finished_at,       // 6
    r.subject_ticket_id, // 7
    r.bytes,             // 8
    r.cursor_job,        // 9
    r.cursor_path,       // 10
    r.cursor_base,       // 11
    r.whole,             // 12
]);
