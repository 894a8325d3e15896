//! The audit log (DESIGN §15 "Audit"): one row per change a key or the
//! platform made — who (`actor`), what (`action`, `automation.saved`), to
//! what (`target`) and a short `summary` — never a secret. The HTTP layer
//! writes a row for every change an API call makes; the platform writes its
//! own (a new `TOK_ADMIN_KEY` at start).
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

/// Who made a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ActorKind {
    /// One of a tenant's API keys.
    Key,
    /// The platform: its admin key, or tok itself at start.
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
    /// Writes one row, dated now; returns it as stored.
    async fn write_audit(&self, row: NewAudit) -> Result<AuditRow>;

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
