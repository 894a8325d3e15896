//! Signals and the waits they resume (`docs/workflows.md`).
//!
//! A `wait_for_event` step parks its run's one job at the step, with a
//! `waits` row holding the key, the ticket it is about (its subject, if
//! any) and the `where` the signal's payload must satisfy; the job is due
//! at the wait's timeout. A signal sent to a key resumes, in its one
//! transaction, every parked wait of the tenant on that key about the same
//! ticket (or, for a signal about none, about none) whose `where` holds:
//! their jobs become ready now and carry the signal
//! ([`Resume::Signal`](crate::Resume)) to the worker that claims them. A
//! signal that resumed nothing is buffered for the lookback window, and a
//! wait that starts on its key within it takes the oldest matching one
//! (same subject, `where` holding) at once, as its record is written,
//! instead of parking.
//!
//! Signal and wait on one key never miss each other: both take the key's
//! lock (an advisory lock on PostgreSQL; SQLite's one writer serializes
//! every write anyway) before they look for the other. A job claimed for
//! its timeout is not resumed by a signal: the timeout won, and the signal
//! is buffered like any other that resumed nothing.
//!
//! A signal's row is kept past its lookback for as long as its idempotency
//! key deduplicates (24 h, [`crate::IDEMPOTENCY_WINDOW`]), and then deleted
//! by retention ([`crate::RetentionStore::expire_signals`]). A starting
//! wait reads the buffer in pages of [`BUFFER_PAGE`].

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::{RunId, TenantId};

use crate::Result;

/// A signal to send to a tenant's waits.
#[derive(Debug, Clone)]
pub struct NewSignal {
    pub key: String,
    /// The ticket the signal is about (a ticket id of the tenant, checked
    /// by the sender): it resumes only waits about that ticket, and a
    /// signal about none only waits about none.
    pub subject: Option<String>,
    pub payload: Value,
    /// A repeat of the key answers the first send's answer and changes
    /// nothing. Unique per tenant for as long as the signal is kept.
    pub idempotency_key: Option<String>,
    /// How long the signal stays buffered if it resumes no wait (ms).
    pub lookback_ms: i64,
    /// Who sent it (`{"kind": "key", "id"}`, `{"kind": "run", "runId"}`),
    /// given to the wait it resumes, now or from the buffer.
    pub actor: Option<Value>,
}

/// What a send did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalSent {
    pub signal_id: String,
    /// The key it was sent on (the first send's, for a repeat).
    pub key: String,
    /// The ticket the signal is about (the first send's, for a repeat).
    pub subject: Option<String>,
    /// The runs whose waits it resumed, oldest wait first.
    pub resumed: Vec<RunId>,
    /// It resumed nothing and waits in the buffer for a wait to start.
    pub buffered: bool,
    /// The idempotency key was used before: this is that send's answer.
    pub duplicate: bool,
}

/// Sending signals outside a run (the API). An `emit` step sends through
/// its record transaction instead ([`crate::RecordTx::send_signal`]).
#[async_trait]
pub trait SignalStore: Send + Sync {
    /// Resumes the tenant's matching waits on the signal's key, or buffers
    /// the signal, in one transaction.
    async fn send_signal(&self, tenant: &TenantId, signal: NewSignal) -> Result<SignalSent>;
}

/// Buffered signals a starting wait reads at a time, oldest first, until
/// one satisfies its `where` or none is left.
pub(crate) const BUFFER_PAGE: i64 = 100;

/// The `run_after` of a job parked with no timeout: later than any due
/// time, so the claim never takes it (9999-12-31T23:59:59.999Z).
pub(crate) const NEVER_DUE_MS: i64 = 253_402_300_799_999;
