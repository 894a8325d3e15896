//! Bulk operations on runs (`docs/operations.md`, "Retrying and cancelling
//! many runs"): a retry or a cancel of every run a filter takes, done by
//! the server in pages. The store keeps an operation's state in rows (its
//! progress and the last run of its pages done), and acts on each run in
//! one transaction with the row that says it did
//! ([`OperationStore::apply`]): an operation done again from a page it had
//! begun acts on each run once. Which runs a page takes, and whether a
//! retry can move a run to another version, are the engine's
//! (`tok_engine::operations`).
//!
//! Two traits: [`OperationStore`], whose every call is about one tenant and
//! runs on its database (written once for every store over
//! `crate::sql::Route`: the routed store needs no code for it), and
//! [`OperationLoop`], what the engine's loop of operations reads over many
//! tenants at once, which spans the databases of the routed store (each
//! asked for its own tenants, in `routed/wake.rs`).

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tok_core::ids::{RunId, TenantId};
use tok_core::run::RunStatus;

use crate::{Page, Result};

/// What an operation does to each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationAction {
    /// A failed run goes on from its failed step.
    Retry,
    /// An unfinished run is cancelled (with its compensation).
    Cancel,
}

impl OperationAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Cancel => "cancel",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "retry" => Some(Self::Retry),
            "cancel" => Some(Self::Cancel),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct NewOperation {
    pub action: OperationAction,
    /// `original` or `current`: the version a retried run goes on with.
    pub version: String,
    /// The filter as it was sent, for the engine's pages and for people.
    pub filter: Value,
    /// How many runs the filter took when the operation was made.
    pub total: i64,
    /// Who asked for it (the API key), as the audit log names it.
    pub actor: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Operation {
    pub id: String,
    #[serde(skip)]
    pub tenant_id: TenantId,
    pub action: String,
    pub version: String,
    pub filter: Value,
    /// `running`, `done` or `cancelled`.
    pub status: String,
    pub total: i64,
    /// Runs acted on.
    pub done: i64,
    /// Runs it could not act on (each in [`OperationStore::operation_failures`]).
    pub failed: i64,
    /// The last run of the pages done; the next page takes the runs after it.
    #[serde(skip)]
    pub after: Option<String>,
    pub actor: Option<Value>,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize_opt")]
    pub finished_at: Option<i64>,
}

/// What [`OperationStore::apply`] does to one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAction {
    /// Retry it from its failed step, on this version when given.
    Retry {
        version: Option<i32>,
    },
    Cancel,
    /// Act on nothing: count the run as failed, for this reason (a retry
    /// on the current version whose failed step is not there).
    Refuse(String),
}

/// What [`OperationStore::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The action was taken; the run's status after it (`queued`, or
    /// `cancelled` or `compensating`).
    Done(RunStatus),
    /// The run's state did not allow it (why), or it was refused.
    Failed(String),
    /// The operation had acted on the run already: nothing was done.
    Already,
    /// The operation is not running (cancelled): nothing was done.
    Stopped,
}

/// A tenant's bulk operations, on its database.
#[async_trait]
pub trait OperationStore: Send + Sync {
    async fn create_operation(&self, tenant: &TenantId, new: NewOperation) -> Result<Operation>;
    async fn operation(&self, tenant: &TenantId, id: &str) -> Result<Option<Operation>>;
    /// A page of the tenant's operations, newest first, before the id `after`.
    async fn operations(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<Operation>>;
    /// The runs the operation could not act on, with why, at most `limit`.
    async fn operation_failures(
        &self,
        tenant: &TenantId,
        id: &str,
        limit: u32,
    ) -> Result<Vec<(RunId, String)>>;
    /// Stops a running operation: the runs it acted on stay as they are.
    /// `None` when the tenant has no such operation; a
    /// [`crate::StoreError::InvalidState`] when it is not running.
    async fn cancel_operation(&self, tenant: &TenantId, id: &str) -> Result<Option<Operation>>;
    /// Acts on one run for the operation, in one transaction with the
    /// operation's row for the run and its counts; [`Applied::Already`] when
    /// that row exists. Nothing is done once the operation is not running.
    async fn apply(
        &self,
        tenant: &TenantId,
        operation: &str,
        run: &RunId,
        action: RunAction,
    ) -> Result<Applied>;
    /// Keeps `after` as the last run of the pages done, and with `finished`
    /// ends the operation `done` (unless it was cancelled meanwhile).
    async fn advance_operation(
        &self,
        tenant: &TenantId,
        id: &str,
        after: Option<&str>,
        finished: bool,
    ) -> Result<()>;
}

/// What the engine's loop of bulk operations reads over all the tenants it
/// serves at once: on the routed store, each database is asked for its own
/// tenants.
#[async_trait]
pub trait OperationLoop: Send + Sync {
    /// The oldest running operation of each of these tenants.
    async fn running_operations(&self, tenants: &[TenantId]) -> Result<Vec<Operation>>;
}

mod postgres;
mod sql;
mod sqlite;
