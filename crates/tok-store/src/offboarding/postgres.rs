//! [`OffboardingStore`] on PostgreSQL. A batch deletes rows by their
//! `ctid`, which an index scan of the tenant's rows found, partition by
//! partition (a `ctid` is its partition's own): each batch is a TID scan
//! of at most `limit` rows, however large the table.

use async_trait::async_trait;
use sqlx::Row as _;
use tok_core::ids::TenantId;

use super::{ERASED, ErasedTable, Finished, OffboardingStore, RowsLeft, erased_table};
use crate::admin::{TENANT_COLUMNS, tenant as tenant_row};
use crate::audit::{AuditOutcome, insert_audit_in};
use crate::sql::on;
use crate::sql::postgres::Postgres;
use crate::{NewAudit, PgStore, Result, Tenant};

impl PgStore {
    /// The tables that hold `table`'s rows: its leaf partitions, or itself.
    async fn leaves(&self, table: &str) -> Result<Vec<String>> {
        let leaves: Vec<String> = sqlx::query_scalar(
            "SELECT relid::regclass::text FROM pg_partition_tree($1::regclass) WHERE isleaf",
        )
        .bind(table)
        .fetch_all(self.pool())
        .await?;
        Ok(if leaves.is_empty() {
            vec![table.to_owned()]
        } else {
            leaves
        })
    }

    /// Deletes at most `limit` rows of `tenant` from `table`, whether or
    /// not it is being deleted (a [`RoutedStore`](crate::RoutedStore)
    /// asked the shared database first); none: none are left.
    pub(crate) async fn erase_rows(
        &self,
        tenant: &TenantId,
        table: &ErasedTable,
        limit: u32,
    ) -> Result<u64> {
        for leaf in self.leaves(table.name).await? {
            for part in table.parts {
                let sql = format!(
                    "DELETE FROM {leaf} WHERE ctid = ANY(ARRAY(
                         SELECT ctid FROM {leaf} WHERE tenant_id = $1 AND ({part}) LIMIT $2))"
                );
                let done = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(i64::from(limit))
                    .execute(self.pool())
                    .await?
                    .rows_affected();
                if done > 0 {
                    return Ok(done);
                }
            }
        }
        Ok(0)
    }

    /// [`OffboardingStore::tenant_rows_left`] on this database alone.
    pub(crate) async fn rows_left(&self, tenant: &TenantId, cap: u32) -> Result<Vec<RowsLeft>> {
        let mut left = Vec::new();
        for table in ERASED {
            let mut rows = 0u64;
            for part in table.parts {
                let sql = format!(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM {} WHERE tenant_id = $1 AND ({part})
                     LIMIT $2) t",
                    table.name
                );
                let n: i64 = sqlx::query_scalar(&sql)
                    .bind(tenant.as_str())
                    .bind(i64::from(cap))
                    .fetch_one(self.pool())
                    .await?;
                rows += n as u64;
            }
            if rows > 0 {
                left.push(RowsLeft {
                    table: table.name,
                    rows: rows.min(u64::from(cap)),
                });
            }
        }
        Ok(left)
    }

    /// Deletes this database's copy of the tenant's row (a tenant
    /// database of a [`RoutedStore`](crate::RoutedStore)) once none of
    /// its tables holds a row of the tenant.
    pub(crate) async fn forget_tenant_row(&self, tenant: &TenantId) -> Result<Finished> {
        let mut tx = self.pool().begin().await?;
        if let Some(table) = table_with_rows(&mut tx, tenant).await? {
            return Ok(Finished::RowsLeft(table));
        }
        sqlx::query("DELETE FROM tenants WHERE id = $1")
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Finished::Done)
    }
}

/// The first table of [`ERASED`] that holds a row of `tenant`, read in `tx`.
async fn table_with_rows(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant: &TenantId,
) -> Result<Option<&'static str>> {
    for table in ERASED {
        for part in table.parts {
            let sql = format!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE tenant_id = $1 AND ({part}))",
                table.name
            );
            let held: bool = sqlx::query_scalar(&sql)
                .bind(tenant.as_str())
                .fetch_one(&mut **tx)
                .await?;
            if held {
                return Ok(Some(table.name));
            }
        }
    }
    Ok(None)
}

/// Whether the tenant's row says it is being deleted (`None`: no row).
async fn deleting(pool: &sqlx::PgPool, tenant: &TenantId) -> Result<Option<bool>> {
    let row = sqlx::query("SELECT deleting_since FROM tenants WHERE id = $1")
        .bind(tenant.as_str())
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|r| r.get::<Option<i64>, _>("deleting_since").is_some()))
}

#[async_trait]
impl OffboardingStore for PgStore {
    async fn begin_tenant_deletion(&self, tenant: &TenantId) -> Result<Option<Tenant>> {
        let now = crate::now_ms();
        let mut tx = self.pool().begin().await?;
        let marked = sqlx::query(
            "UPDATE tenants SET deleting_since = COALESCE(deleting_since, $2) WHERE id = $1",
        )
        .bind(tenant.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if marked.rows_affected() == 0 {
            return Ok(None);
        }
        sqlx::query(
            "UPDATE api_keys SET revoked_at = $2 WHERE tenant_id = $1 AND revoked_at IS NULL",
        )
        .bind(tenant.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1");
        let row = on("tenants", &sql)
            .text(tenant.as_str())
            .fetch_one::<Postgres>(&mut tx)
            .await?;
        tx.commit().await?;
        tenant_row(&row).map(Some)
    }

    async fn deleting_tenants(&self) -> Result<Vec<TenantId>> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM tenants WHERE deleting_since IS NOT NULL ORDER BY deleting_since, id",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(ids.into_iter().map(TenantId::from).collect())
    }

    async fn erase_tenant_rows(&self, tenant: &TenantId, table: &str, limit: u32) -> Result<u64> {
        let table = erased_table(table).ok_or_else(|| super::not_erased(table))?;
        if deleting(self.pool(), tenant).await? != Some(true) {
            return Err(super::not_deleting(tenant));
        }
        self.erase_rows(tenant, table, limit).await
    }

    async fn tenant_rows_left(&self, tenant: &TenantId, cap: u32) -> Result<Vec<RowsLeft>> {
        self.rows_left(tenant, cap).await
    }

    async fn finish_tenant_deletion(&self, tenant: &TenantId, audit: NewAudit) -> Result<Finished> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query("SELECT deleting_since FROM tenants WHERE id = $1 FOR UPDATE")
            .bind(tenant.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        if row.is_none_or(|r| r.get::<Option<i64>, _>("deleting_since").is_none()) {
            return Ok(Finished::NotDeleting);
        }
        if let Some(table) = table_with_rows(&mut tx, tenant).await? {
            return Ok(Finished::RowsLeft(table));
        }
        sqlx::query("DELETE FROM tenants WHERE id = $1")
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?;
        insert_audit_in::<Postgres>(&mut tx, audit, AuditOutcome::Done).await?;
        tx.commit().await?;
        Ok(Finished::Done)
    }
}
