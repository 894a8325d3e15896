//! The audit log (docs/security.md, "Audit"): one row per change a key or
//! the platform made — who (`actor`), what (`action`, `automation.saved`),
//! to what (`target`) and a short `summary` — never a secret. The HTTP
//! layer writes a row for every change an API call makes; the platform
//! writes its own (a new `TOK_ADMIN_KEY` at start, `tok secrets rotate`,
//! `tok tenant move` and `forget`, a tenant's deletion).
//!
//! A row is written ahead of its change where the change is made elsewhere
//! (the API's handlers): [`AuditStore::begin_audit`] writes it `pending`
//! before the change is made, [`AuditStore::end_audit`] says `done` (or
//! `unknown`, when the change answered an error that may have come after
//! its commit) and [`AuditStore::drop_audit`] removes it when the change
//! was refused. A process that stops between the two leaves the row
//! `pending`, and the scheduler marks it `unknown` once it is older than
//! [`AUDIT_PENDING_GRACE_MS`] ([`AuditStore::resolve_pending_audit`]): a
//! change that was made always has its row. Where the platform changes
//! rows itself, the row commits in the same transaction, `done`.
//!
//! Rows live in the shared database (on a [`RoutedStore`](crate::RoutedStore)
//! too), beside the API keys they name: the log of who did what with which
//! key stays whole when a tenant's work moves to a database of its own, and
//! the platform admin lists every tenant's rows with one query. A row of a
//! tenant names it; a row of the platform itself (no tenant) has none and
//! is seen by the platform admin only.
//!
//! On PostgreSQL the table is kept in monthly partitions like the other
//! append-only tables; rows expire by the tenant's
//! `settings.retention.auditDays` (see [`crate::retention`]), the
//! platform's own rows by the default ([`PLATFORM_AUDIT_DAYS`]).

use async_trait::async_trait;
use serde::Serialize;
use tok_core::ids::TenantId;

use crate::{Page, Result};

/// How long the platform's own rows (no tenant) are kept, in days: the
/// default of a tenant's `auditDays`.
pub const PLATFORM_AUDIT_DAYS: u32 = 365;

/// How long a row may stay `pending` before the scheduler says its
/// change's outcome is `unknown`: ten minutes, far longer than any API
/// change takes (a row resolved while its request was still under way
/// is ended all the same when the request answers).
pub const AUDIT_PENDING_GRACE_MS: i64 = 10 * 60 * 1000;

/// Whether the change a row records was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditOutcome {
    /// Written ahead of the change, which is under way.
    Pending,
    /// The change was made.
    Done,
    /// The change may or may not have been made: it answered an error
    /// that can come after its commit (5xx), or its process stopped
    /// before it said.
    Unknown,
}

impl AuditOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Done => "done",
            Self::Unknown => "unknown",
        }
    }

    /// The stored form back; what this build does not know reads as
    /// `unknown`.
    pub fn parse(text: &str) -> Self {
        match text {
            "pending" => Self::Pending,
            "done" => Self::Done,
            _ => Self::Unknown,
        }
    }
}

/// Who made a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ActorKind {
    /// One of a tenant's API keys.
    Key,
    /// The platform: its admin key, tok itself (at start, its scheduler),
    /// or an operator's `tok` command (`tok secrets rotate`, `tok tenant`).
    Platform,
    /// A caller without a key (a route that checks a secret of its own).
    Anonymous,
}

impl ActorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::Platform => "platform",
            Self::Anonymous => "anonymous",
        }
    }

    /// The stored form back; what this build does not know reads as
    /// `anonymous`.
    pub fn parse(text: &str) -> Self {
        match text {
            "key" => Self::Key,
            "platform" => Self::Platform,
            _ => Self::Anonymous,
        }
    }
}

/// Who made a change: the key's id and name (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Actor {
    pub kind: ActorKind,
    pub id: Option<String>,
    pub name: Option<String>,
}

/// What a change was made to: a kind of resource (`automation`) and its id
/// (none when the change named none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    pub kind: String,
    pub id: Option<String>,
}

/// A row to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAudit {
    /// The tenant the change was made to; `None` for the platform's own.
    pub tenant_id: Option<TenantId>,
    pub actor: Actor,
    /// `resource.verb`: `automation.saved`, `key.revoked`, `run.retried`.
    pub action: String,
    pub target: Target,
    /// A few words for people; never a secret.
    pub summary: Option<String>,
}

/// A row as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRow {
    pub id: String,
    /// The order rows were written in, given by the database (ids made in
    /// one millisecond do not sort by time): a listing's pages are keyed
    /// by it.
    pub seq: i64,
    pub tenant_id: Option<TenantId>,
    /// Unix milliseconds.
    pub at: i64,
    pub actor: Actor,
    pub action: String,
    pub target: Target,
    pub summary: Option<String>,
    pub outcome: AuditOutcome,
}

/// How a row written ahead ([`AuditStore::begin_audit`]) ends, with what
/// the change made known: the tenant it made (a new tenant), the target's
/// id (a created resource's), its summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEnd {
    /// [`AuditOutcome::Done`] or [`AuditOutcome::Unknown`].
    pub outcome: AuditOutcome,
    pub tenant_id: Option<TenantId>,
    pub target_id: Option<String>,
    pub summary: Option<String>,
}

/// What a listing keeps: each filter given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// The actor's id (a key's id).
    pub actor: Option<String>,
    pub action: Option<String>,
    /// The target's id.
    pub target: Option<String>,
    /// Rows at or after this instant (unix ms).
    pub since: Option<i64>,
}

/// The audit log.
#[async_trait]
pub trait AuditStore: Send + Sync {
    /// Writes one row of a change already made (`done`), dated now;
    /// returns it as stored.
    async fn write_audit(&self, row: NewAudit) -> Result<AuditRow>;

    /// Writes the row of a change about to be made, `pending`, dated now;
    /// returns it as stored, for [`AuditStore::end_audit`] or
    /// [`AuditStore::drop_audit`]. A change whose row could not be written
    /// must not be made.
    async fn begin_audit(&self, row: NewAudit) -> Result<AuditRow>;

    /// Ends a row [`AuditStore::begin_audit`] wrote (whatever it says
    /// now: a row the scheduler said `unknown` meanwhile takes the
    /// outcome the change really had). A row that is gone (its tenant
    /// deleted meanwhile) is left gone.
    async fn end_audit(&self, row: &AuditRow, end: AuditEnd) -> Result<()>;

    /// Removes a row [`AuditStore::begin_audit`] wrote, whose change was
    /// refused before anything was made.
    async fn drop_audit(&self, row: &AuditRow) -> Result<()>;

    /// Says `unknown` of at most `limit` rows still `pending` that were
    /// written before `before_ms`: their process stopped (or could not
    /// write their end) before it said how their change ended. Returns how
    /// many.
    async fn resolve_pending_audit(&self, before_ms: i64, limit: u32) -> Result<u64>;

    /// A page of the tenant's rows that `filter` keeps, newest first,
    /// after the row whose `seq` is `after`; the page's cursor is the last
    /// row's `seq`.
    async fn audit(
        &self,
        tenant: &TenantId,
        filter: &AuditFilter,
        limit: u32,
        after: Option<i64>,
    ) -> Result<Page<AuditRow>>;

    /// The platform admin's listing: [`AuditStore::audit`] over every
    /// tenant's rows and the platform's own.
    async fn audit_everywhere(
        &self,
        filter: &AuditFilter,
        limit: u32,
        after: Option<i64>,
    ) -> Result<Page<AuditRow>>;

    /// Deletes at most `limit` of the platform's own rows (no tenant) from
    /// before `before_ms`, in one short transaction; returns how many. A
    /// tenant's rows expire by [`RetentionStore::expire`](crate::RetentionStore::expire)
    /// (`Expiring::Audit`).
    async fn expire_platform_audit(&self, before_ms: i64, limit: u32) -> Result<u64>;
}

mod sql;

pub(crate) use sql::insert_audit_in;
