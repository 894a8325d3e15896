//! Approvals (`docs/workflows.md`, "`approval`"): an `approval` step opens
//! one in its record transaction and parks its run on the decision's signal
//! key; a person decides it through the API, which — in one transaction —
//! records the decision and who made it, resumes the wait with it, and
//! writes a line in the trace of the run's ticket. An approval is pending
//! while its run waits for it: one whose wait timed out or was cancelled is
//! closed and takes no decision.

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tok_core::ids::{RunId, TenantId};

use crate::Result;

/// Someone who may decide: a member of the tenant's service desk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Approver {
    pub id: String,
    pub name: String,
}

/// What an `approval` step opens.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub step_id: String,
    pub path: String,
    pub prompt: String,
    pub approvers: Vec<Approver>,
}

/// An approval as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Approval {
    pub id: String,
    pub run_id: RunId,
    pub automation_id: String,
    pub step_id: String,
    pub path: String,
    pub prompt: String,
    pub approvers: Vec<Approver>,
    /// `pending`, `approved`, `rejected`, or `closed` (its run no longer
    /// waits for it: it timed out or was cancelled).
    pub status: String,
    pub decided_by: Option<Approver>,
    pub comment: Option<String>,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize_opt")]
    pub decided_at: Option<i64>,
}

/// A decision to record.
#[derive(Debug, Clone)]
pub struct Decision {
    /// `approve` or `reject`.
    pub decision: String,
    /// The member deciding (an id of one of the approvers).
    pub member: String,
    pub comment: Option<String>,
    /// Who sent it (the API key), for the record.
    pub actor: Value,
}

/// What became of a decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// Recorded; the run goes on with it.
    Done(Approval),
    /// No approval of the tenant has this id.
    NotFound,
    /// The member is not one of its approvers.
    NotAnApprover(Approval),
    /// It was decided before (or its run no longer waits for it).
    AlreadyDecided(Approval),
}

#[async_trait]
pub trait ApprovalStore: Send + Sync {
    /// The tenant's approvals, newest first: only the pending ones, or all.
    /// A page of approvals, newest first, before the approval id `before`.
    async fn approvals(
        &self,
        tenant: &TenantId,
        pending_only: bool,
        limit: u32,
        before: Option<&str>,
    ) -> Result<crate::Page<Approval>>;
    async fn approval(&self, tenant: &TenantId, id: &str) -> Result<Option<Approval>>;
    /// Decides a pending approval, in one transaction with the resume of
    /// its run and the line in its ticket's trace.
    async fn decide_approval(
        &self,
        tenant: &TenantId,
        id: &str,
        decision: Decision,
    ) -> Result<Decided>;
}

mod postgres;
pub(crate) mod sql;
mod sqlite;
