//! Tenants' concurrency caps (`settings.limits.concurrency`,
//! `docs/security.md`, "Tenant quotas"): how many more jobs a claim or a
//! dispatch may lease to a capped tenant. Both the queue's claim and the
//! dispatch ask it ([`room_under_caps`], after [`caps_of`] for the
//! dispatch, whose candidates do not carry their tenant's cap).
//!
//! A tenant's steps in flight are its jobs with a live lease, counted in
//! the jobs' rows (`jobs_leased_by_tenant`), not kept in a count of their
//! own: every end of a lease (a record, a release, a node's restart, an
//! expiry, a cancel deleting the job) gives its slot back by itself, and no
//! count can drift from the leases. A record that continues on its lease
//! keeps its one slot; a `parallel` step's branches are new jobs, leased by
//! claims like any other.
//!
//! Two transactions counting one tenant's leases at once would each see
//! room for the same slots: on PostgreSQL each first takes the tenant's
//! cap lock (`CLAIM_TENANTS` of `fragments.rs`, a try-lock held to the
//! commit) and counts in a statement after it; one that misses the lock
//! leases nothing of that tenant this time. No transaction waits for the
//! lock, so it adds no edge to the store's lock order (runs before jobs).
//! SQLite's one writer serializes them.
//!
//! The counting runs in every claim and every dispatch, so its statements
//! are not built per call: each driver has them as constants ([`CapsSql`],
//! in `postgres.rs` and `sqlite.rs` of this folder), put together at
//! compile time from the fragments the two databases write differently
//! (the database clock, a bound list, a tenant's cap read from its
//! settings). The functions that run them are written once (`sql.rs`).

mod postgres;
mod sql;
mod sqlite;

pub(crate) use sql::{caps_of, room_under_caps};

use crate::sql::Driver;

/// The statements of the caps, as each database writes them.
pub(crate) trait CapsSql: Driver {
    /// The tenants bound at `$1` that have a cap, with it: columns `id`
    /// and `cap` (`NULL`: no cap, or one that is no number).
    const CAPS_OF: &'static str;

    /// Of the tenants bound at `$1`, those whose cap lock this transaction
    /// got (column `t`); empty where no lock is needed (every tenant's
    /// count is then taken).
    const CAP_LOCKS: &'static str;

    /// For each tenant bound at `$1`, its jobs with a live lease or among
    /// the jobs bound at `$2`: columns `tenant_id` and `held`.
    const LEASES_HELD: &'static str;
}
