//! [`DecisionIn`] of the SQLite store: the signals' and the desk's queries
//! (`signals_sql.rs`, `desk_sql.rs`) as expanded for it.

use std::future::Future;

use tok_core::ids::TenantId;

use super::sql::DecisionIn;
use crate::sql::Tx;
use crate::sqlite::{self, SqliteStore};
use crate::{Cause, NewSignal, Result, SignalSent};

impl DecisionIn for SqliteStore {
    fn escalating_wait(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        signal: &NewSignal,
    ) -> impl Future<Output = Result<bool>> + Send {
        sqlite::escalating_wait(tx, tenant, signal)
    }

    fn send_signal_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        signal: &NewSignal,
    ) -> impl Future<Output = Result<SignalSent>> + Send {
        sqlite::send_signal_in(tx, tenant, signal)
    }

    fn trace_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        ticket_id: &str,
        kind: &str,
        message: &str,
        cause: &Cause,
    ) -> impl Future<Output = Result<()>> + Send {
        sqlite::trace_in(tx, tenant, ticket_id, kind, message, cause)
    }
}
