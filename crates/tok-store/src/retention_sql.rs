//! Retention ([`RetentionStore`](crate::RetentionStore)) for both backends
//! (see `rows.rs` for why a macro per file): the tenant's setting and the
//! batched deletes are the same SQL; what only one backend has (partitions,
//! `incremental_vacuum`) comes in as `backend`.

macro_rules! impl_retention {
    (
        store = $store:ty,
        db = $db:ty,
        // Sets `settings.retention` to `$2` and keeps the other settings.
        set_retention = $set_retention:literal,
        backend = { $($backend:tt)* },
    ) => {
        /// One batch of expired rows: the rows are picked by the same
        /// condition as they are deleted by, so that PostgreSQL prunes the
        /// partitions the outer delete looks in.
        fn expire_sql(what: Expiring) -> &'static str {
            match what {
                Expiring::StepData => {
                    "DELETE FROM run_steps WHERE tenant_id = $1 AND created_at < $2 AND id IN (
                         SELECT id FROM run_steps WHERE tenant_id = $1 AND created_at < $2 LIMIT $3)"
                }
                Expiring::Runs => {
                    "DELETE FROM runs WHERE tenant_id = $1 AND id IN (
                         SELECT id FROM runs WHERE tenant_id = $1 AND finished_at < $2
                           AND status IN ('completed', 'failed', 'cancelled', 'refused', 'skipped', 'expired') LIMIT $3)"
                }
                Expiring::Trace => {
                    "DELETE FROM ticket_trace WHERE tenant_id = $1 AND at < $2 AND id IN (
                         SELECT id FROM ticket_trace WHERE tenant_id = $1 AND at < $2 LIMIT $3)"
                }
                Expiring::Effects => {
                    "DELETE FROM step_effects WHERE tenant_id = $1 AND created_at < $2
                       AND idempotency_key IN (
                         SELECT idempotency_key FROM step_effects
                         WHERE tenant_id = $1 AND created_at < $2 LIMIT $3)"
                }
                Expiring::FlowKeys => {
                    "DELETE FROM flow_keys WHERE tenant_id = $1 AND updated_at < $2 AND key IN (
                         SELECT key FROM flow_keys WHERE tenant_id = $1 AND updated_at < $2 LIMIT $3)"
                }
                Expiring::RunCancels => {
                    "DELETE FROM run_cancels WHERE tenant_id = $1 AND created_at < $2 AND run_id IN (
                         SELECT run_id FROM run_cancels WHERE tenant_id = $1 AND created_at < $2
                         LIMIT $3)"
                }
                Expiring::Audit => {
                    "DELETE FROM audit WHERE tenant_id = $1 AND at < $2 AND seq IN (
                         SELECT seq FROM audit WHERE tenant_id = $1 AND at < $2 LIMIT $3)"
                }
                Expiring::Inbox => {
                    "DELETE FROM event_inbox WHERE tenant_id = $1 AND received_at < $2 AND id IN (
                         SELECT id FROM event_inbox WHERE tenant_id = $1 AND received_at < $2
                           AND status <> 'pending' LIMIT $3)"
                }
            }
        }

        #[async_trait::async_trait]
        impl RetentionStore for $store {
            async fn retention(
                &self,
                tenant: &TenantId,
            ) -> Result<Option<tok_core::retention::Retention>> {
                let row = sqlx::query("SELECT settings FROM tenants WHERE id = $1")
                    .bind(tenant.as_str())
                    .fetch_optional(self.reader())
                    .await?;
                let Some(row) = row else {
                    return Ok(None);
                };
                let settings: Json<Value> = row.get("settings");
                // A setting that no longer reads (written by hand) falls
                // back to the defaults rather than stopping expiry.
                let retention = settings
                    .0
                    .get("retention")
                    .and_then(|r| serde_json::from_value(r.clone()).ok())
                    .unwrap_or_default();
                Ok(Some(retention))
            }

            async fn set_retention(
                &self,
                tenant: &TenantId,
                retention: &tok_core::retention::Retention,
            ) -> Result<bool> {
                let value = serde_json::to_value(retention)
                    .map_err(|e| StoreError::Refused(format!("the retention setting does not serialize: {e}")))?;
                let done = sqlx::query($set_retention)
                    .bind(tenant.as_str())
                    .bind(Json(value))
                    .execute(&*self.writer().await)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn expire(
                &self,
                tenant: &TenantId,
                what: Expiring,
                before_ms: i64,
                limit: u32,
            ) -> Result<u64> {
                let done = sqlx::query(expire_sql(what))
                    .bind(tenant.as_str())
                    .bind(before_ms)
                    .bind(i64::from(limit))
                    .execute(&*self.writer_in(crate::Lane::Bulk).await)
                    .await?;
                Ok(done.rows_affected())
            }

            async fn keep_contexts_whole(
                &self,
                tenant: &TenantId,
                before_ms: i64,
                limit: u32,
            ) -> Result<u64> {
                let writer = self.writer_in(crate::Lane::Bulk).await;
                let mut tx = writer.begin().await?;
                // Only a run that has not ended has changes outside its
                // context (a run's last record writes it whole).
                let runs: Vec<String> = sqlx::query_scalar(concat!(
                    "SELECT id FROM runs
                     WHERE tenant_id = $1
                       AND status IN ('queued', 'running', 'waiting', 'paused', 'compensating')
                       AND tail_since < $2
                     ORDER BY id LIMIT $3 ", lock_rows_skip_locked!()
                ))
                .bind(tenant.as_str())
                .bind(before_ms.saturating_add($crate::record::contexts::CLOCK_SKEW_MS))
                .bind(i64::from(limit))
                .fetch_all(&mut *tx)
                .await?;
                for run in &runs {
                    write_whole_in(&mut tx, tenant, &RunId::from(run.clone())).await?;
                }
                tx.commit().await?;
                Ok(runs.len() as u64)
            }

            async fn expire_keys(&self, tenant: &TenantId, before_ms: i64, limit: u32) -> Result<u64> {
                let done = sqlx::query(
                    "DELETE FROM event_keys WHERE tenant_id = $1
                       AND (source_kind, source_id, idempotency_key) IN (
                         SELECT source_kind, source_id, idempotency_key FROM event_keys
                          WHERE tenant_id = $1 AND received_at < $2 LIMIT $3)",
                )
                .bind(tenant.as_str())
                .bind(before_ms)
                .bind(i64::from(limit))
                .execute(&*self.writer_in(crate::Lane::Bulk).await)
                .await?;
                Ok(done.rows_affected())
            }

            async fn expire_signals(&self, tenant: &TenantId, now_ms: i64, limit: u32) -> Result<u64> {
                // By `received_at` first (the index `signals_age`): with a
                // lookback shorter than the window, every row it finds goes.
                let done = sqlx::query(
                    "DELETE FROM signals WHERE tenant_id = $1 AND id IN (
                         SELECT id FROM signals
                          WHERE tenant_id = $1 AND received_at < $2 AND expires_at < $3 LIMIT $4)",
                )
                .bind(tenant.as_str())
                .bind(now_ms.saturating_sub($crate::rows::IDEMPOTENCY_WINDOW_MS))
                .bind(now_ms)
                .bind(i64::from(limit))
                .execute(&*self.writer_in(crate::Lane::Bulk).await)
                .await?;
                Ok(done.rows_affected())
            }

            $($backend)*
        }
    };
}

pub(crate) use impl_retention;
