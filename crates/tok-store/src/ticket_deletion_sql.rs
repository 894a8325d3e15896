//! Deleting a ticket ([`DeskStore::delete_ticket`](crate::DeskStore::delete_ticket))
//! for both backends (see `rows.rs` for why a macro per file): one
//! transaction that refuses while runs in flight or events not yet
//! dispatched are about the ticket, and otherwise deletes the ticket, its
//! trace and the signals still buffered about it.

macro_rules! impl_ticket_deletion {
    (
        db = $db:ty,
    ) => {
        /// Runs in flight a refusal names at most.
        const TICKET_USERS_NAMED: i64 = 20;

        /// [`DeskStore::delete_ticket`] in `tx`.
        pub(crate) async fn delete_ticket_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &str,
        ) -> Result<$crate::desk::TicketDeletion> {
            let found = sqlx::query(concat!(
                "SELECT id FROM tickets WHERE tenant_id = $1 AND id = $2 ",
                lock_rows!()
            ))
            .bind(tenant.as_str())
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
            if found.is_none() {
                return Ok($crate::desk::TicketDeletion::NotFound);
            }
            // Runs about it, or waiting for a signal about it, that have
            // not ended: their steps would find it gone.
            let runs: Vec<String> = sqlx::query_scalar(
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
            .bind(tenant.as_str())
            .bind(id)
            .bind(TICKET_USERS_NAMED)
            .fetch_all(&mut **tx)
            .await?;
            let events: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM event_inbox
                  WHERE tenant_id = $1 AND status = 'pending' AND subject_ticket_id = $2",
            )
            .bind(tenant.as_str())
            .bind(id)
            .fetch_one(&mut **tx)
            .await?;
            if !runs.is_empty() || events > 0 {
                return Ok($crate::desk::TicketDeletion::InUse {
                    runs: runs.into_iter().map(RunId::from).collect(),
                    events,
                });
            }
            sqlx::query("DELETE FROM ticket_trace WHERE tenant_id = $1 AND ticket_id = $2")
                .bind(tenant.as_str())
                .bind(id)
                .execute(&mut **tx)
                .await?;
            sqlx::query("DELETE FROM signals WHERE tenant_id = $1 AND subject = $2")
                .bind(tenant.as_str())
                .bind(id)
                .execute(&mut **tx)
                .await?;
            sqlx::query("DELETE FROM tickets WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.as_str())
                .bind(id)
                .execute(&mut **tx)
                .await?;
            Ok($crate::desk::TicketDeletion::Deleted)
        }
    };
}

pub(crate) use impl_ticket_deletion;
