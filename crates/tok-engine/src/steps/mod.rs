//! Built-in step types beyond the pure control steps of `tok-core`.
//!
//! `flow/pause` is an ordinary [`StepHandler`](crate::StepHandler). The
//! service-desk steps (`ticket/*`, `incident/create`, `emit`) touch only our
//! own database, so they run inside the record transaction
//! ([`RecordTx`]): their effect and their step record commit together, and a
//! crash between them is impossible. So does `run_workflow`, whose effect is
//! a new run of tok's own. Each lives in a file of its own.

pub(crate) mod approval;
pub(crate) mod emit;
pub(crate) mod http;
pub(crate) mod incident_create;
pub(crate) mod mcp;
pub(crate) mod pause;
pub(crate) mod run_workflow;
pub(crate) mod script;
pub(crate) mod ticket_add_tags;
pub(crate) mod ticket_assign;
pub(crate) mod ticket_close;
pub(crate) mod ticket_set_status;
pub(crate) mod ticket_set_type;
pub(crate) mod ticket_upsert;

use serde_json::{Map, Value};
use tok_core::error::StepError;

/// Describes the connector metrics the `http` and `mcp` steps record: the
/// `# HELP` of each in `/metrics`.
pub(crate) fn describe() {
    metrics::describe_counter!(
        "tok_connector_calls_total",
        "Outbound calls of the http and mcp steps, by connector and outcome"
    );
    metrics::describe_counter!(
        "tok_connector_deferred_total",
        "Outbound calls put off by a connection's rate limit, concurrency or breaker, by connector"
    );
    metrics::describe_histogram!(
        "tok_connector_call_seconds",
        metrics::Unit::Seconds,
        "How long an outbound call took, by connector, tenant and connection (its name; empty for none)"
    );
}
use tok_store::{Cause, RecordTx, StoreError, Ticket, TicketWrite};

/// A step type that runs inside the record transaction: its effect and
/// the step's record commit together. Each lives in a file of its own with
/// a `run`, a `validate` and its config's `KEYS`, and is registered in [`crate::Registry`] with
/// [`in_transaction!`].
#[async_trait::async_trait]
pub(crate) trait TxStep: Send + Sync + 'static {
    /// Its outputs, or a wait ([`crate::StepOutcome::Wait`]: `approval`
    /// waits for its decision) that the decider ends.
    async fn run(
        &self,
        cx: &mut TxContext<'_>,
        config: &Value,
    ) -> Result<crate::StepOutcome, TxError>;

    /// Checks the step's `config` at save; the message says what is expected.
    fn validate(&self, config: &Value) -> Result<(), String>;

    /// The keys the step's `config` may have (its module's `KEYS`).
    fn config_keys(&self) -> &'static [&'static str];
}

/// The [`TxStep`] of a module of this folder: its `run`, `validate` and `KEYS`.
macro_rules! in_transaction {
    ($module:ident) => {{
        struct Step;
        #[async_trait::async_trait]
        impl $crate::steps::TxStep for Step {
            async fn run(
                &self,
                cx: &mut $crate::steps::TxContext<'_>,
                config: &serde_json::Value,
            ) -> Result<$crate::StepOutcome, $crate::steps::TxError> {
                $crate::steps::$module::run(cx, config)
                    .await
                    .map(Into::into)
            }

            fn validate(&self, config: &serde_json::Value) -> Result<(), String> {
                $crate::steps::$module::validate(config)
            }

            fn config_keys(&self) -> &'static [&'static str] {
                $crate::steps::$module::KEYS
            }
        }
        std::sync::Arc::new(Step)
    }};
}
pub(crate) use in_transaction;

/// What a step inside the record transaction works with.
pub(crate) struct TxContext<'a> {
    pub(crate) tx: &'a mut dyn RecordTx,
    /// The run's subject ticket: the event's ticket, or the one the last
    /// `ticket/upsert` returned. Steps that create a ticket set it.
    pub(crate) subject: &'a mut Option<String>,
    pub(crate) cause: &'a Cause,
    pub(crate) step_id: &'a str,
    /// The step's path in its tree (`2.then.0`).
    pub(crate) path: &'a str,
    /// The attempt of the step (1 on the first).
    pub(crate) attempt: u32,
    /// The run's input (its `_body`), for an incident's detail.
    pub(crate) run_input: Option<&'a Value>,
    /// Set when a write could not raise its event because the chain of
    /// automations is too deep; the worker raises an alert for it.
    pub(crate) too_deep: bool,
    /// How long a signal the step sends stays buffered when it resumes no
    /// wait (the engine's `signal_lookback`).
    pub(crate) signal_lookback: std::time::Duration,
    /// The trace context a child run started here continues: this step's
    /// span in the run's trace.
    pub(crate) traceparent: String,
}

/// A step inside the transaction fails as a step (its error decides about
/// retries) or because the database failed (the whole record is abandoned
/// and the job comes back after its lease).
#[derive(Debug)]
pub(crate) enum TxError {
    Step(StepError),
    Store(StoreError),
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        match e {
            // What a step asked of the store clashes with what is stored, or
            // breaks a rule of the store: trying it again fails the same way.
            StoreError::Taken(message)
            | StoreError::Changed(message)
            | StoreError::InvalidState(message)
            | StoreError::Invariant(message) => TxError::Step(StepError::terminal(message)),
            other => TxError::Store(other),
        }
    }
}

impl From<StepError> for TxError {
    fn from(e: StepError) -> Self {
        TxError::Step(e)
    }
}

pub(crate) type TxResult = Result<Map<String, Value>, TxError>;

fn terminal(message: impl Into<String>) -> TxError {
    TxError::Step(StepError::terminal(message))
}

/// `Ok` when `config.<key>` is a non-empty string (or, where `what`
/// speaks of a list, a non-empty array); else the error a person reads:
/// which step type needs which key, and what it is.
pub(crate) fn need(config: &Value, kind: &str, key: &str, what: &str) -> Result<(), String> {
    match config.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(()),
        Some(Value::Array(a)) if what.contains("list") && !a.is_empty() => Ok(()),
        _ => Err(format!("{kind} needs `{key}`: {what}")),
    }
}

fn string(config: &Value, key: &str) -> Option<String> {
    match config.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// The ticket a step acts on: `ticketId` from the config, else the run's
/// subject ticket.
async fn subject_ticket(cx: &mut TxContext<'_>, config: &Value) -> Result<Ticket, TxError> {
    let id = string(config, "ticketId")
        .or_else(|| cx.subject.clone())
        .ok_or_else(|| {
            terminal(format!(
                "step `{}` has no ticket to act on: the run has no subject ticket yet \
             (run ticket/upsert first, or set `ticketId`)",
                cx.step_id
            ))
        })?;
    cx.tx.ticket(&id).await?.ok_or_else(|| {
        terminal(format!(
            "step `{}`: ticket `{id}` does not exist",
            cx.step_id
        ))
    })
}

/// Writes a changed ticket (its trace and event come with it).
async fn save(cx: &mut TxContext<'_>, write: TicketWrite) -> Result<(), TxError> {
    let written = cx.tx.write_ticket(write, cx.cause).await?;
    cx.too_deep |= written.too_deep;
    Ok(())
}

/// The `updated_at` of a ticket changed now: later than its last one even
/// within the same millisecond, so a person's "change only if unchanged since
/// I read it" never misses a step's write.
fn stamp(previous: i64) -> i64 {
    tok_store::now_ms().max(previous + 1)
}

/// A step's `timeoutMs`: `default` when absent, else a whole number of
/// milliseconds from 1 to `max`. `step` names the step type in the error.
pub(crate) fn timeout_ms(
    config: &Value,
    step: &str,
    default: u64,
    max: u64,
) -> Result<std::time::Duration, String> {
    let ms = match config.get("timeoutMs") {
        None | Some(Value::Null) => default,
        Some(v) => match v.as_u64() {
            Some(ms) if (1..=max).contains(&ms) => ms,
            _ => return Err(format!("{step} `timeoutMs` must be between 1 and {max}")),
        },
    };
    Ok(std::time::Duration::from_millis(ms))
}

/// A connector's failure to read its connection: a credential that cannot
/// be opened (its key is not in `TOK_SECRET_KEY`) stays so however often
/// the step is tried, so it is terminal; a database that did not answer is
/// retried.
pub(crate) fn connection_unreadable(e: StoreError) -> StepError {
    match e {
        StoreError::Secret(secret) => StepError::terminal(secret.to_string()),
        other => StepError::retryable(format!("connection storage unavailable: {other}")),
    }
}
