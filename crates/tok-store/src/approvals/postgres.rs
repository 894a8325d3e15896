//! [`DecisionIn`] of the PostgreSQL store: the signals' and the desk's queries
//! (`signals_sql.rs`, `desk_sql.rs`) as expanded for it.

use std::future::Future;

use tok_core::ids::TenantId;

use super::sql::DecisionIn;
use crate::postgres::{self, PgStore};
use crate::sql::Tx;
use crate::{Cause, NewSignal, Result, SignalSent};

impl DecisionIn for PgStore {
    fn escalating_wait(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        signal: &NewSignal,
    ) -> impl Future<Output = Result<bool>> + Send {
        postgres::escalating_wait(tx, tenant, signal)
    }

    fn send_signal_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        signal: &NewSignal,
    ) -> impl Future<Output = Result<SignalSent>> + Send {
        postgres::send_signal_in(tx, tenant, signal)
    }

    fn trace_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        ticket_id: &str,
        kind: &str,
        message: &str,
        cause: &Cause,
    ) -> impl Future<Output = Result<()>> + Send {
        postgres::trace_in(tx, tenant, ticket_id, kind, message, cause)
    }
}
