//! Offboarding: a tenant deleted with every row it has, on a database of
//! its own too (docs/operations.md, "Offboarding a tenant").
//!
//! A deletion is asked once ([`OffboardingStore::begin_tenant_deletion`]):
//! in one transaction the tenant's row is marked `deleting_since` and its
//! API keys are revoked, so its keys fail at once on every process (keys
//! are looked up on every request) and the engine's tenant list
//! ([`AdminStore::tenant_ids`](crate::AdminStore::tenant_ids)) leaves it
//! out: nothing of it is dispatched, claimed or scheduled any more.
//!
//! Its rows then go in short batches: [`OffboardingStore::erase_tenant_rows`]
//! deletes at most `limit` rows of one table in one statement, table by
//! table in the order of [`ERASED`] — first what makes work happen (jobs,
//! events, waits), last what the platform keeps of the tenant (its keys,
//! its audit rows) — called by the scheduler until none is left; so a
//! deletion never locks a large table for long nor holds SQLite's one
//! writer for more than a batch. Then
//! [`OffboardingStore::finish_tenant_deletion`] checks, in one transaction,
//! that no table holds a row of the tenant, deletes its row and writes the
//! platform's audit row of the deletion (no tenant: it outlives the
//! tenant's own rows, and names the tenant by its id alone).
//!
//! Progress is the rows themselves: a process that stops half-way leaves
//! the mark and the rows not yet erased, and whoever runs the scheduler
//! next goes on from there. Rows written meanwhile by a step that was
//! already under way (its record is refused once its job is erased) are
//! found by the next pass: the finish refuses while any is left.
//!
//! On a [`RoutedStore`](crate::RoutedStore) each table is erased in every
//! database (the tenant's own first, then the others, where a move may
//! have left rows), and the tenant's row in the shared database goes last.

mod postgres;
mod sqlite;

use async_trait::async_trait;
use tok_core::ids::TenantId;

use crate::{NewAudit, Result, Tenant};

/// A table holding rows of tenants, as the erasure deletes them.
#[derive(Debug)]
pub struct ErasedTable {
    pub name: &'static str,
    /// Conditions that part the tenant's rows (besides `tenant_id = $1`),
    /// each served by an index of the table: the erasure deletes and
    /// counts by each in turn. They do not overlap and together take every
    /// row. Most tables need `TRUE` alone: an index starts with
    /// `tenant_id`; the inbox has a partial index for each status.
    pub parts: &'static [&'static str],
}

const ALL: &[&str] = &["TRUE"];

/// Every table with a `tenant_id` column, in the order a tenant's rows are
/// erased: a table before those it references. A table added with a
/// `tenant_id` column must be added here (the conformance test
/// `offboarding::every_table_with_a_tenant_is_erased` compares this list
/// with the database's own).
pub const ERASED: &[ErasedTable] = &[
    // What makes work happen first: no job is claimed, no event
    // dispatched, no wait resumed once these are gone.
    ErasedTable {
        name: "jobs",
        parts: ALL,
    },
    ErasedTable {
        name: "event_inbox",
        // Two partial indexes, one for each (`status` is never null).
        parts: &["status = 'pending'", "status <> 'pending'"],
    },
    ErasedTable {
        name: "waits",
        parts: ALL,
    },
    ErasedTable {
        name: "trigger_schedules",
        parts: ALL,
    },
    // The slots of calls in flight: a few rows, read whole.
    ErasedTable {
        name: "connection_slots",
        parts: ALL,
    },
    ErasedTable {
        name: "signals",
        parts: ALL,
    },
    ErasedTable {
        name: "approvals",
        parts: ALL,
    },
    ErasedTable {
        name: "flow_keys",
        parts: ALL,
    },
    ErasedTable {
        name: "run_cancels",
        parts: ALL,
    },
    ErasedTable {
        name: "operation_runs",
        parts: ALL,
    },
    ErasedTable {
        name: "operations",
        parts: ALL,
    },
    ErasedTable {
        name: "event_keys",
        parts: ALL,
    },
    // The record of its work.
    ErasedTable {
        name: "step_effects",
        parts: ALL,
    },
    ErasedTable {
        name: "run_steps",
        parts: ALL,
    },
    ErasedTable {
        name: "runs",
        parts: ALL,
    },
    ErasedTable {
        name: "ticket_trace",
        parts: ALL,
    },
    ErasedTable {
        name: "tickets",
        parts: ALL,
    },
    ErasedTable {
        name: "incidents",
        parts: ALL,
    },
    ErasedTable {
        name: "queue_samples",
        parts: ALL,
    },
    // Its definitions.
    ErasedTable {
        name: "members",
        parts: ALL,
    },
    ErasedTable {
        name: "groups",
        parts: ALL,
    },
    ErasedTable {
        name: "ticket_types",
        parts: ALL,
    },
    ErasedTable {
        name: "widgets",
        parts: ALL,
    },
    ErasedTable {
        name: "automation_versions",
        parts: ALL,
    },
    ErasedTable {
        name: "automations",
        parts: ALL,
    },
    ErasedTable {
        name: "sources",
        parts: ALL,
    },
    ErasedTable {
        name: "connections",
        parts: ALL,
    },
    // What the platform keeps of it, last.
    ErasedTable {
        name: "platform_incidents",
        parts: ALL,
    },
    ErasedTable {
        name: "api_keys",
        parts: ALL,
    },
    ErasedTable {
        name: "audit",
        parts: ALL,
    },
];

/// The table of [`ERASED`] named `name`.
pub fn erased_table(name: &str) -> Option<&'static ErasedTable> {
    ERASED.iter().find(|t| t.name == name)
}

/// Rows of a tenant a table still holds, counted up to a cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowsLeft {
    pub table: &'static str,
    pub rows: u64,
}

/// What [`OffboardingStore::finish_tenant_deletion`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// The tenant's row is gone, and the audit row written with it.
    Done,
    /// This table still holds rows of the tenant: nothing was done.
    RowsLeft(&'static str),
    /// The tenant is not being deleted (or is gone already): nothing was
    /// done.
    NotDeleting,
}

/// Deleting a tenant and every row of it (see the module's doc).
#[async_trait]
pub trait OffboardingStore: Send + Sync {
    /// Marks the tenant as being deleted (now) and revokes its API keys,
    /// in one transaction; returns it as it is now. A tenant already being
    /// deleted keeps the time it was first asked. `None`: no such tenant.
    async fn begin_tenant_deletion(&self, tenant: &TenantId) -> Result<Option<Tenant>>;

    /// The tenants being deleted, the longest asked first.
    async fn deleting_tenants(&self) -> Result<Vec<TenantId>>;

    /// Deletes at most `limit` rows of `tenant` from `table` (one of
    /// [`ERASED`]) in one short statement; returns how many (none: the
    /// table holds no more of them). Refused for a tenant that is not being
    /// deleted ([`StoreError::InvalidState`](crate::StoreError::InvalidState))
    /// and for a table not in [`ERASED`]
    /// ([`StoreError::Invariant`](crate::StoreError::Invariant)).
    async fn erase_tenant_rows(&self, tenant: &TenantId, table: &str, limit: u32) -> Result<u64>;

    /// The rows of `tenant` each table of [`ERASED`] still holds, each
    /// counted up to `cap` (a count of `cap` means at least as many);
    /// tables with none left out.
    async fn tenant_rows_left(&self, tenant: &TenantId, cap: u32) -> Result<Vec<RowsLeft>>;

    /// Ends a deletion once no table holds a row of the tenant: deletes
    /// its row and writes `audit` (the platform's row of it, `done`) in one
    /// transaction.
    async fn finish_tenant_deletion(&self, tenant: &TenantId, audit: NewAudit) -> Result<Finished>;
}

/// The refusal of [`OffboardingStore::erase_tenant_rows`] for a table not
/// in [`ERASED`].
pub(crate) fn not_erased(table: &str) -> crate::StoreError {
    crate::StoreError::Invariant(format!(
        "`{table}` is not a table a tenant's deletion erases"
    ))
}

/// The refusal of [`OffboardingStore::erase_tenant_rows`] for a tenant in
/// service (or none).
pub(crate) fn not_deleting(tenant: &TenantId) -> crate::StoreError {
    crate::StoreError::InvalidState(format!(
        "tenant {tenant} is not being deleted: its rows are not erased"
    ))
}
