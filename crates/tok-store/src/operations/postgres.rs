//! [`RunActions`] of the PostgreSQL store: the retry and cancel of `runs_sql.rs`
//! as expanded for it.

use std::future::Future;

use tok_core::ids::{RunId, TenantId};
use tok_core::run::RunStatus;

use super::sql::RunActions;
use crate::Result;
use crate::postgres::{self, PgStore};
use crate::sql::Tx;

impl RunActions for PgStore {
    fn retry_path_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<std::result::Result<String, String>>> + Send {
        postgres::retry_path_in(tx, tenant, run)
    }

    fn retry_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
        path: &str,
        version: Option<i32>,
        bulk: bool,
    ) -> impl Future<Output = Result<()>> + Send {
        postgres::retry_in(tx, tenant, run, path, version, bulk)
    }

    fn cancel_checked_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<std::result::Result<(), String>>> + Send {
        postgres::cancel_checked_in(tx, tenant, run)
    }

    fn run_status(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<RunStatus>> + Send {
        postgres::run_status(tx, tenant, run)
    }
}
