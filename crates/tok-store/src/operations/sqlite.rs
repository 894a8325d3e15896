//! [`RunActions`] of the SQLite store: the retry and cancel of `runs_sql.rs`
//! as expanded for it.

use std::future::Future;

use tok_core::ids::{RunId, TenantId};
use tok_core::run::RunStatus;

use super::sql::RunActions;
use crate::Result;
use crate::sql::Tx;
use crate::sqlite::{self, SqliteStore};

impl RunActions for SqliteStore {
    fn retry_path_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<std::result::Result<String, String>>> + Send {
        sqlite::retry_path_in(tx, tenant, run)
    }

    fn retry_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
        path: &str,
        version: Option<i32>,
        bulk: bool,
    ) -> impl Future<Output = Result<()>> + Send {
        sqlite::retry_in(tx, tenant, run, path, version, bulk)
    }

    fn cancel_checked_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<std::result::Result<(), String>>> + Send {
        sqlite::cancel_checked_in(tx, tenant, run)
    }

    fn run_status(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<RunStatus>> + Send {
        sqlite::run_status(tx, tenant, run)
    }
}
