//! The queue samples' queries ([`QueueSampleStore`](crate::QueueSampleStore))
//! for both backends (see `rows.rs` for why a macro per file).

macro_rules! impl_queue_samples {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        #[async_trait::async_trait]
        impl $crate::queue_samples::QueueSampleStore for $store {
            async fn sample_queue(
                &self,
                tenants: &[TenantId],
                at: i64,
                window_ms: i64,
            ) -> Result<u64> {
                if tenants.is_empty() {
                    return Ok(0);
                }
                // One statement for every tenant: each tenant's window
                // starts at its sample before; the jobs, the pending events
                // and the steps of the window are each read once, grouped
                // by tenant (the steps through their (tenant, created_at)
                // index). `WHERE 1 = 1` lets SQLite read `ON CONFLICT` as
                // the insert's.
                let done = sqlx::query(concat!(
                    "WITH served AS (
                        SELECT t.id AS tenant_id,
                            COALESCE((SELECT MAX(q.at) FROM queue_samples q
                                      WHERE q.tenant_id = t.id AND q.at < $2 AND q.at >= $2 - $3),
                                     $2 - $3) AS since
                        FROM tenants t WHERE t.id ", any_of!(1), "
                     ),
                     queue AS (
                        SELECT tenant_id,
                            SUM(CASE WHEN run_after <= n AND (locked_until IS NULL OR locked_until < n) THEN 1 ELSE 0 END) AS ready,
                            SUM(CASE WHEN run_after > n AND (locked_until IS NULL OR locked_until < n) THEN 1 ELSE 0 END) AS scheduled,
                            SUM(CASE WHEN locked_until >= n THEN 1 ELSE 0 END) AS running,
                            MIN(CASE WHEN run_after <= n AND (locked_until IS NULL OR locked_until < n) THEN n - run_after END) AS oldest
                        FROM jobs, (SELECT ", db_now!(), " AS n) clock
                        WHERE tenant_id ", any_of!(1), "
                        GROUP BY tenant_id
                     ),
                     pending AS (
                        SELECT tenant_id, COUNT(*) AS events FROM event_inbox
                        WHERE status = 'pending' AND tenant_id ", any_of!(1), "
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
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .bind(at)
                .bind(window_ms)
                .execute(&*self.writer_in(crate::Lane::Bulk).await)
                .await?;
                Ok(done.rows_affected())
            }

            async fn queue_samples(
                &self,
                tenant: &TenantId,
                since: i64,
                limit: u32,
            ) -> Result<Vec<$crate::queue_samples::QueueSample>> {
                let rows = sqlx::query(
                    "SELECT at, ready, scheduled, running, pending_events, oldest_ready_ms,
                        steps_completed, steps_failed, window_ms
                     FROM queue_samples
                     WHERE tenant_id = $1 AND at >= $2
                     ORDER BY at DESC
                     LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(since)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                let mut samples: Vec<_> = rows
                    .iter()
                    .map(|r| $crate::queue_samples::QueueSample {
                        at: r.get("at"),
                        ready: r.get("ready"),
                        scheduled: r.get("scheduled"),
                        running: r.get("running"),
                        pending_events: r.get("pending_events"),
                        oldest_ready_ms: r.get("oldest_ready_ms"),
                        steps_completed: r.get("steps_completed"),
                        steps_failed: r.get("steps_failed"),
                        window_ms: r.get("window_ms"),
                    })
                    .collect();
                samples.reverse();
                Ok(samples)
            }

            async fn expire_queue_samples(
                &self,
                tenant: &TenantId,
                before: i64,
                limit: u32,
            ) -> Result<u64> {
                let done = sqlx::query(
                    "DELETE FROM queue_samples WHERE tenant_id = $1
                       AND at IN (SELECT at FROM queue_samples
                                  WHERE tenant_id = $1 AND at < $2 ORDER BY at LIMIT $3)",
                )
                .bind(tenant.as_str())
                .bind(before)
                .bind(i64::from(limit))
                .execute(&*self.writer_in(crate::Lane::Bulk).await)
                .await?;
                Ok(done.rows_affected())
            }
        }
    };
}

pub(crate) use impl_queue_samples;
