//! [`QueueSampleStore`] on every store, on the tenant's database, and
//! [`QueueSampling`] on a store of one database: the same SQL on both
//! databases, but for the database clock and the bound list of tenants.

use async_trait::async_trait;
use tok_core::ids::TenantId;

use super::{QueueSample, QueueSampleStore, QueueSampling};
use crate::Result;
use crate::sql::{Driver, DriverOf, Route, Row, SqlStore, on};

fn sample<D: Driver>(row: &Row<D>) -> Result<QueueSample> {
    Ok(QueueSample {
        at: row.int("at")?,
        ready: row.int("ready")?,
        scheduled: row.int("scheduled")?,
        running: row.int("running")?,
        pending_events: row.int("pending_events")?,
        oldest_ready_ms: row.opt_int("oldest_ready_ms")?,
        steps_completed: row.int("steps_completed")?,
        steps_failed: row.int("steps_failed")?,
        window_ms: row.int("window_ms")?,
    })
}

/// One statement for every tenant (bound at `$1`): each tenant's window
/// starts at its sample before; the jobs, the pending events and the steps
/// of the window are each read once, grouped by tenant (the steps through
/// their (tenant, created_at) index). `WHERE 1 = 1` lets SQLite read
/// `ON CONFLICT` as the insert's.
fn sample_queue_sql<D: Driver>() -> String {
    let any_of_1 = D::any_of(1);
    let now = D::DB_NOW;
    format!(
        "WITH served AS (
                        SELECT t.id AS tenant_id,
                            COALESCE((SELECT MAX(q.at) FROM queue_samples q
                                      WHERE q.tenant_id = t.id AND q.at < $2 AND q.at >= $2 - $3),
                                     $2 - $3) AS since
                        FROM tenants t WHERE t.id {any_of_1}
                     ),
                     queue AS (
                        SELECT tenant_id,
                            SUM(CASE WHEN run_after <= n AND (locked_until IS NULL OR locked_until < n) THEN 1 ELSE 0 END) AS ready,
                            SUM(CASE WHEN run_after > n AND (locked_until IS NULL OR locked_until < n) THEN 1 ELSE 0 END) AS scheduled,
                            SUM(CASE WHEN locked_until >= n THEN 1 ELSE 0 END) AS running,
                            MIN(CASE WHEN run_after <= n AND (locked_until IS NULL OR locked_until < n) THEN n - run_after END) AS oldest
                        FROM jobs, (SELECT {now} AS n) clock
                        WHERE tenant_id {any_of_1}
                        GROUP BY tenant_id
                     ),
                     pending AS (
                        SELECT tenant_id, COUNT(*) AS events FROM event_inbox
                        WHERE status = 'pending' AND tenant_id {any_of_1}
                        GROUP BY tenant_id
                     ),
                     steps AS (
                        SELECT s.tenant_id,
                            SUM(CASE WHEN s.status = 'completed' THEN 1 ELSE 0 END) AS completed,
                            SUM(CASE WHEN s.status IN ('failed', 'retrying') THEN 1 ELSE 0 END) AS failed
                        FROM run_steps s JOIN served w ON w.tenant_id = s.tenant_id
                        WHERE s.created_at > w.since AND s.created_at <= $2
                        GROUP BY s.tenant_id
                     )
                     INSERT INTO queue_samples (tenant_id, at, ready, scheduled, running,
                        pending_events, oldest_ready_ms, steps_completed, steps_failed, window_ms)
                     SELECT w.tenant_id, $2, COALESCE(q.ready, 0), COALESCE(q.scheduled, 0),
                        COALESCE(q.running, 0), COALESCE(e.events, 0), q.oldest,
                        COALESCE(s.completed, 0), COALESCE(s.failed, 0), $2 - w.since
                     FROM served w
                     LEFT JOIN queue q ON q.tenant_id = w.tenant_id
                     LEFT JOIN pending e ON e.tenant_id = w.tenant_id
                     LEFT JOIN steps s ON s.tenant_id = w.tenant_id
                     WHERE 1 = 1
                     ON CONFLICT (tenant_id, at) DO NOTHING"
    )
}

/// On a store of one database, every tenant's queue is in it: one
/// statement for all the tenants asked.
#[async_trait]
impl<S: SqlStore> QueueSampling for S {
    async fn sample_queue(&self, tenants: &[TenantId], at: i64, window_ms: i64) -> Result<u64> {
        if tenants.is_empty() {
            return Ok(0);
        }
        let sql = sample_queue_sql::<S::Driver>();
        // The bulk lane, as every write but a quiet tenant's commit.
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on("queue_samples", &sql)
            .texts(tenants.iter().map(|t| t.as_str()))
            .int(at)
            .int(window_ms)
            .execute::<S::Driver>(&mut conn)
            .await
    }
}

#[async_trait]
impl<R: Route> QueueSampleStore for R {
    async fn queue_samples(
        &self,
        tenant: &TenantId,
        since: i64,
        limit: u32,
    ) -> Result<Vec<QueueSample>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let rows = on(
                "queue_samples",
                "SELECT at, ready, scheduled, running, pending_events, oldest_ready_ms,
                    steps_completed, steps_failed, window_ms
                 FROM queue_samples
                 WHERE tenant_id = $1 AND at >= $2
                 ORDER BY at DESC
                 LIMIT $3",
            )
            .text(tenant.as_str())
            .int(since)
            .int(i64::from(limit))
            .fetch_all::<DriverOf<R>>(&mut conn)
            .await?;
            let mut samples = rows.iter().map(sample).collect::<Result<Vec<_>>>()?;
            samples.reverse();
            Ok(samples)
        })
        .await
    }

    async fn expire_queue_samples(
        &self,
        tenant: &TenantId,
        before: i64,
        limit: u32,
    ) -> Result<u64> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            on(
                "queue_samples",
                "DELETE FROM queue_samples WHERE tenant_id = $1
                   AND at IN (SELECT at FROM queue_samples
                              WHERE tenant_id = $1 AND at < $2 ORDER BY at LIMIT $3)",
            )
            .text(tenant.as_str())
            .int(before)
            .int(i64::from(limit))
            .execute::<DriverOf<R>>(&mut conn)
            .await
        })
        .await
    }
}
