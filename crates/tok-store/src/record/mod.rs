//! The record transaction's parts that the other parts of the store share:
//! a run's context as it is now (`contexts.rs`), which the claim, a run's
//! detail, a cancel and retention read or write as the record does, and
//! parallel branches (`branches.rs`), which the record forks and joins.
//! The record transaction itself is still written once per backend
//! (`record_sql.rs`).
//!
//! The statements of these parts whose SQL differs per database are
//! [`Statements`], each written once (beside the code that runs it) and
//! worded for a driver from its fragments ([`Driver`]) once, at its first
//! use: a claim and a record run them thousands of times a second, so none
//! is formatted per call ([`RecordSql`], implemented in `postgres.rs` and
//! `sqlite.rs`).

pub(crate) mod branches;
pub(crate) mod contexts;
mod postgres;
mod sqlite;

use crate::sql::Driver;

/// A driver's wording of the record's statements.
pub(crate) trait RecordSql: Driver {
    /// Tells the other processes that jobs are ready (empty: nobody to
    /// tell).
    const NOTIFY_WORK: &'static str;

    /// The statements, built at the first call.
    fn statements() -> &'static Statements;
}

/// The record's statements whose SQL differs per database, as one driver
/// words them.
pub(crate) struct Statements {
    /// [`contexts::fold_changes`].
    pub(crate) fold_changes: String,
    /// [`branches`]: a branch's job, due now.
    pub(crate) start_branch: String,
    /// [`branches`]: a parallel step's parked job counts a branch.
    pub(crate) join_branch: String,
}

impl Statements {
    /// The statements as `D` words them.
    pub(crate) fn of<D: Driver>() -> Self {
        Self {
            fold_changes: contexts::fold_changes_sql::<D>(),
            start_branch: branches::start_branch_sql::<D>(),
            join_branch: branches::join_branch_sql::<D>(),
        }
    }
}
