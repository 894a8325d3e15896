//! [`RetentionStore`] on either database: the tenant's setting and the
//! batched deletes are the same SQL on both. What only one backend has
//! (PostgreSQL's partitions, SQLite's `incremental_vacuum`) and how each
//! sets one key of a tenant's settings are [`RetentionBackend`], in
//! `postgres.rs` and `sqlite.rs` of this folder.
//!
//! The routed store has its own (`routed/mod.rs`): its tenants' settings
//! and audit log are on the shared database, and each database has its
//! own partitions.

use std::future::Future;

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::{RunId, TenantId};
use tok_core::retention::Retention;

use super::{Expiring, MovedRows, PartitionProblem, RetentionStore};
use crate::record::RecordSql;
use crate::record::contexts::{CLOCK_SKEW_MS, write_whole_in};
use crate::rows::IDEMPOTENCY_WINDOW_MS;
use crate::sql::{Driver, SqlStore, on};
use crate::{Result, StoreError};

/// What one backend's retention does that the other's does not; each
/// [`RetentionStore`] method of the same name forwards here. Where a
/// backend has nothing of it, it does nothing.
pub(crate) trait RetentionBackend: SqlStore {
    /// Sets the `retention` key of the settings of tenant `$1` to the JSON
    /// document `$2`, keeping its other settings.
    const SET_RETENTION: &'static str;

    /// [`RetentionStore::drop_expired_partitions`].
    fn drop_expired_partitions(
        &self,
        what: Expiring,
        cutoffs: &[(TenantId, i64)],
    ) -> impl Future<Output = Result<Vec<String>>> + Send {
        let _ = (what, cutoffs);
        async { Ok(Vec::new()) }
    }

    /// [`RetentionStore::create_partitions`].
    fn create_partitions(
        &self,
        now_ms: i64,
        ahead: u32,
        skip: &[String],
    ) -> impl Future<Output = Result<Vec<PartitionProblem>>> + Send {
        let _ = (now_ms, ahead, skip);
        async { Ok(Vec::new()) }
    }

    /// [`RetentionStore::move_default_rows`].
    fn move_default_rows(
        &self,
        max_rows: u64,
        skip: &[String],
    ) -> impl Future<Output = Result<(Vec<MovedRows>, Vec<PartitionProblem>)>> + Send {
        let _ = (max_rows, skip);
        async { Ok((Vec::new(), Vec::new())) }
    }

    /// [`RetentionStore::reclaim_space`].
    fn reclaim_space(&self, pages: u32) -> impl Future<Output = Result<Option<i64>>> + Send {
        let _ = pages;
        async { Ok(None) }
    }
}

/// One batch of expired rows: the rows are picked by the same condition as
/// they are deleted by, so that PostgreSQL prunes the partitions the outer
/// delete looks in.
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

#[async_trait]
impl<S> RetentionStore for S
where
    S: RetentionBackend,
    S::Driver: RecordSql,
{
    async fn retention(&self, tenant: &TenantId) -> Result<Option<Retention>> {
        let mut conn = self.reader().acquire().await?;
        let row = on("tenants", "SELECT settings FROM tenants WHERE id = $1")
            .text(tenant.as_str())
            .fetch_optional::<S::Driver>(&mut conn)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let settings = row.json::<Value>("settings")?;
        // A setting that no longer reads (written by hand) falls back to
        // the defaults rather than stopping expiry.
        let retention = settings
            .get("retention")
            .and_then(|r| serde_json::from_value(r.clone()).ok())
            .unwrap_or_default();
        Ok(Some(retention))
    }

    async fn set_retention(&self, tenant: &TenantId, retention: &Retention) -> Result<bool> {
        let value = serde_json::to_value(retention).map_err(|e| {
            StoreError::Refused(format!("the retention setting does not serialize: {e}"))
        })?;
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        let done = on("tenants", S::SET_RETENTION)
            .text(tenant.as_str())
            .json(&value)
            .execute::<S::Driver>(&mut conn)
            .await?;
        Ok(done > 0)
    }

    async fn expire(
        &self,
        tenant: &TenantId,
        what: Expiring,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64> {
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on(what.table(), expire_sql(what))
            .text(tenant.as_str())
            .int(before_ms)
            .int(i64::from(limit))
            .execute::<S::Driver>(&mut conn)
            .await
    }

    async fn keep_contexts_whole(
        &self,
        tenant: &TenantId,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        // Only a run that has not ended has changes outside its context (a
        // run's last record writes it whole).
        let sql = format!(
            "SELECT id FROM runs
             WHERE tenant_id = $1
               AND status IN ('queued', 'running', 'waiting', 'paused', 'compensating')
               AND tail_since < $2
             ORDER BY id LIMIT $3 {}",
            S::Driver::LOCK_ROWS_SKIP_LOCKED
        );
        let rows = on("runs", &sql)
            .text(tenant.as_str())
            .int(before_ms.saturating_add(CLOCK_SKEW_MS))
            .int(i64::from(limit))
            .fetch_all::<S::Driver>(&mut tx)
            .await?;
        for row in &rows {
            let run = RunId::from(row.text("id")?);
            write_whole_in::<S::Driver>(&mut tx, tenant, &run).await?;
        }
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    async fn expire_keys(&self, tenant: &TenantId, before_ms: i64, limit: u32) -> Result<u64> {
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on(
            "event_keys",
            "DELETE FROM event_keys WHERE tenant_id = $1
               AND (source_kind, source_id, idempotency_key) IN (
                 SELECT source_kind, source_id, idempotency_key FROM event_keys
                  WHERE tenant_id = $1 AND received_at < $2 LIMIT $3)",
        )
        .text(tenant.as_str())
        .int(before_ms)
        .int(i64::from(limit))
        .execute::<S::Driver>(&mut conn)
        .await
    }

    async fn expire_signals(&self, tenant: &TenantId, now_ms: i64, limit: u32) -> Result<u64> {
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        // By `received_at` first (the index `signals_age`): with a lookback
        // shorter than the window, every row it finds goes.
        on(
            "signals",
            "DELETE FROM signals WHERE tenant_id = $1 AND id IN (
                 SELECT id FROM signals
                  WHERE tenant_id = $1 AND received_at < $2 AND expires_at < $3 LIMIT $4)",
        )
        .text(tenant.as_str())
        .int(now_ms.saturating_sub(IDEMPOTENCY_WINDOW_MS))
        .int(now_ms)
        .int(i64::from(limit))
        .execute::<S::Driver>(&mut conn)
        .await
    }

    async fn drop_expired_partitions(
        &self,
        what: Expiring,
        cutoffs: &[(TenantId, i64)],
    ) -> Result<Vec<String>> {
        RetentionBackend::drop_expired_partitions(self, what, cutoffs).await
    }

    async fn create_partitions(
        &self,
        now_ms: i64,
        ahead: u32,
        skip: &[String],
    ) -> Result<Vec<PartitionProblem>> {
        RetentionBackend::create_partitions(self, now_ms, ahead, skip).await
    }

    async fn move_default_rows(
        &self,
        max_rows: u64,
        skip: &[String],
    ) -> Result<(Vec<MovedRows>, Vec<PartitionProblem>)> {
        RetentionBackend::move_default_rows(self, max_rows, skip).await
    }

    async fn reclaim_space(&self, pages: u32) -> Result<Option<i64>> {
        RetentionBackend::reclaim_space(self, pages).await
    }
}
