//! Deleting a ticket ([`DeskStore::delete_ticket`](crate::DeskStore::delete_ticket)),
//! the same SQL on both databases but for the row lock: one transaction
//! that refuses while runs in flight or events not yet dispatched are about
//! the ticket, and otherwise deletes the ticket, its trace and the signals
//! still buffered about it.

use tok_core::ids::{RunId, TenantId};

use super::TicketDeletion;
use crate::Result;
use crate::sql::{Driver, Native, on};

/// Runs in flight a refusal names at most.
const TICKET_USERS_NAMED: i64 = 20;

/// [`DeskStore::delete_ticket`](crate::DeskStore::delete_ticket) in `tx`
/// (its database type picks the driver).
pub(crate) async fn delete_ticket_in<DB: Native>(
    tx: &mut sqlx::Transaction<'_, DB>,
    tenant: &TenantId,
    id: &str,
) -> Result<TicketDeletion> {
    let lock = format!(
        "SELECT id FROM tickets WHERE tenant_id = $1 AND id = $2 {}",
        <DB::Driver as Driver>::LOCK_ROWS
    );
    let found = on("tickets", &lock)
        .text(tenant.as_str())
        .text(id)
        .fetch_optional::<DB::Driver>(&mut **tx)
        .await?;
    if found.is_none() {
        return Ok(TicketDeletion::NotFound);
    }
    // Runs about it, or waiting for a signal about it, that have not
    // ended: their steps would find it gone.
    let runs = on(
        "runs",
        "SELECT id FROM (
             SELECT id FROM runs
              WHERE tenant_id = $1 AND subject_ticket_id = $2
                AND status IN ('queued', 'running', 'waiting', 'paused', 'compensating')
             UNION
             SELECT w.run_id AS id FROM waits w
               JOIN runs r ON r.id = w.run_id AND r.tenant_id = w.tenant_id
              WHERE w.tenant_id = $1 AND w.subject = $2
                AND r.status IN ('queued', 'running', 'waiting', 'paused', 'compensating')
         ) u ORDER BY id LIMIT $3",
    )
    .text(tenant.as_str())
    .text(id)
    .int(TICKET_USERS_NAMED)
    .fetch_all::<DB::Driver>(&mut **tx)
    .await?
    .iter()
    .map(|row| Ok(RunId::from(row.text("id")?)))
    .collect::<Result<Vec<_>>>()?;
    let events = on(
        "event_inbox",
        "SELECT COUNT(*) AS events FROM event_inbox
          WHERE tenant_id = $1 AND status = 'pending' AND subject_ticket_id = $2",
    )
    .text(tenant.as_str())
    .text(id)
    .fetch_one::<DB::Driver>(&mut **tx)
    .await?
    .int("events")?;
    if !runs.is_empty() || events > 0 {
        return Ok(TicketDeletion::InUse { runs, events });
    }
    on(
        "ticket_trace",
        "DELETE FROM ticket_trace WHERE tenant_id = $1 AND ticket_id = $2",
    )
    .text(tenant.as_str())
    .text(id)
    .execute::<DB::Driver>(&mut **tx)
    .await?;
    on(
        "signals",
        "DELETE FROM signals WHERE tenant_id = $1 AND subject = $2",
    )
    .text(tenant.as_str())
    .text(id)
    .execute::<DB::Driver>(&mut **tx)
    .await?;
    on(
        "tickets",
        "DELETE FROM tickets WHERE tenant_id = $1 AND id = $2",
    )
    .text(tenant.as_str())
    .text(id)
    .execute::<DB::Driver>(&mut **tx)
    .await?;
    Ok(TicketDeletion::Deleted)
}
