//! [`AuditStore`] on either database: the same SQL on both; and
//! [`insert_audit_in`], which the platform's own changes write their rows
//! with in their transactions.

use async_trait::async_trait;
use tok_core::ids::{TenantId, new_id};

use super::{
    Actor, ActorKind, AuditEnd, AuditFilter, AuditOutcome, AuditRow, AuditStore, NewAudit, Target,
};
use crate::rows::now_ms;
use crate::sql::{Conn, Driver, Row, SqlStore, on};
use crate::{Page, Result};

/// The columns a row is written with (`seq` is the database's).
const AUDIT_COLUMNS: &str = "id, tenant_id, at, actor_kind, actor_id, actor_name, action,
            target_kind, target_id, summary, outcome";

/// Writes `row`, dated now, with `outcome`, in `conn` (a transaction): the
/// API's rows alone, or a platform change's in the change's own
/// transaction.
pub(crate) async fn insert_audit_in<D: Driver>(
    conn: &mut Conn<D>,
    row: NewAudit,
    outcome: AuditOutcome,
) -> Result<AuditRow> {
    let mut stored = AuditRow {
        id: new_id("aud"),
        seq: 0,
        tenant_id: row.tenant_id,
        at: now_ms(),
        actor: row.actor,
        action: row.action,
        target: row.target,
        summary: row.summary,
        outcome,
    };
    let sql = format!(
        "INSERT INTO audit ({AUDIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 RETURNING seq"
    );
    let inserted = on("audit", &sql)
        .text(&stored.id)
        .opt_text(stored.tenant_id.as_ref().map(|t| t.as_str()))
        .int(stored.at)
        .text(stored.actor.kind.as_str())
        .opt_text(stored.actor.id.as_deref())
        .opt_text(stored.actor.name.as_deref())
        .text(&stored.action)
        .text(&stored.target.kind)
        .opt_text(stored.target.id.as_deref())
        .opt_text(stored.summary.as_deref())
        .text(stored.outcome.as_str())
        .fetch_one::<D>(conn)
        .await?;
    stored.seq = inserted.int("seq")?;
    Ok(stored)
}

fn audit_row<D: Driver>(row: &Row<D>) -> Result<AuditRow> {
    Ok(AuditRow {
        id: row.text("id")?,
        seq: row.int("seq")?,
        tenant_id: row.opt_text("tenant_id")?.map(TenantId::from),
        at: row.int("at")?,
        actor: Actor {
            kind: ActorKind::parse(&row.text("actor_kind")?),
            id: row.opt_text("actor_id")?,
            name: row.opt_text("actor_name")?,
        },
        action: row.text("action")?,
        target: Target {
            kind: row.text("target_kind")?,
            id: row.opt_text("target_id")?,
        },
        summary: row.opt_text("summary")?,
        outcome: AuditOutcome::parse(&row.text("outcome")?),
    })
}

/// A page of audit rows, newest first; `tenant` `None` reads every
/// tenant's and the platform's.
async fn audit_page<D: Driver>(
    conn: &mut Conn<D>,
    tenant: Option<&TenantId>,
    filter: &AuditFilter,
    limit: u32,
    after: Option<i64>,
) -> Result<Page<AuditRow>> {
    // The tenant's listing seeks its own rows (`audit_tenant`); the
    // platform admin's reads the table newest first.
    let whose = match tenant {
        Some(_) => "tenant_id = $1",
        None => "CAST($1 AS TEXT) IS NULL",
    };
    let sql = format!(
        "SELECT seq, {AUDIT_COLUMNS} FROM audit
                 WHERE {whose}
                   AND (CAST($2 AS TEXT) IS NULL OR actor_id = $2)
                   AND (CAST($3 AS TEXT) IS NULL OR action = $3)
                   AND (CAST($4 AS TEXT) IS NULL OR target_id = $4)
                   AND (CAST($5 AS BIGINT) IS NULL OR at >= $5)
                   AND (CAST($6 AS BIGINT) IS NULL OR seq < $6)
                 ORDER BY seq DESC LIMIT $7"
    );
    let rows = on("audit", &sql)
        .opt_text(tenant.map(|t| t.as_str()))
        .opt_text(filter.actor.as_deref())
        .opt_text(filter.action.as_deref())
        .opt_text(filter.target.as_deref())
        .opt_int(filter.since)
        .opt_int(after)
        .int(i64::from(limit) + 1)
        .fetch_all::<D>(conn)
        .await?;
    let items = rows.iter().map(audit_row).collect::<Result<_>>()?;
    Ok(Page::of(items, limit, |r: &AuditRow| r.seq.to_string()))
}

#[async_trait]
impl<S: SqlStore> AuditStore for S {
    async fn write_audit(&self, row: NewAudit) -> Result<AuditRow> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        let stored = insert_audit_in::<S::Driver>(&mut tx, row, AuditOutcome::Done).await?;
        tx.commit().await?;
        Ok(stored)
    }

    async fn begin_audit(&self, row: NewAudit) -> Result<AuditRow> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        let stored = insert_audit_in::<S::Driver>(&mut tx, row, AuditOutcome::Pending).await?;
        tx.commit().await?;
        Ok(stored)
    }

    async fn end_audit(&self, row: &AuditRow, end: AuditEnd) -> Result<()> {
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on(
            "audit",
            "UPDATE audit SET outcome = $3, tenant_id = $4, target_id = $5, summary = $6
                     WHERE seq = $1 AND at = $2",
        )
        .int(row.seq)
        .int(row.at)
        .text(end.outcome.as_str())
        .opt_text(end.tenant_id.as_ref().map(|t| t.as_str()))
        .opt_text(end.target_id.as_deref())
        .opt_text(end.summary.as_deref())
        .execute::<S::Driver>(&mut conn)
        .await?;
        Ok(())
    }

    async fn drop_audit(&self, row: &AuditRow) -> Result<()> {
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on("audit", "DELETE FROM audit WHERE seq = $1 AND at = $2")
            .int(row.seq)
            .int(row.at)
            .execute::<S::Driver>(&mut conn)
            .await?;
        Ok(())
    }

    async fn resolve_pending_audit(&self, before_ms: i64, limit: u32) -> Result<u64> {
        // By the partial index `audit_pending`: the pending rows are the
        // few of changes under way. In the bulk lane, as every write but
        // a quiet tenant's commit.
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on(
            "audit",
            "UPDATE audit SET outcome = 'unknown'
                     WHERE outcome = 'pending' AND at < $1 AND seq IN (
                         SELECT seq FROM audit WHERE outcome = 'pending' AND at < $1 LIMIT $2)",
        )
        .int(before_ms)
        .int(i64::from(limit))
        .execute::<S::Driver>(&mut conn)
        .await
    }

    async fn audit(
        &self,
        tenant: &TenantId,
        filter: &AuditFilter,
        limit: u32,
        after: Option<i64>,
    ) -> Result<Page<AuditRow>> {
        let mut conn = self.reader().acquire().await?;
        audit_page::<S::Driver>(&mut conn, Some(tenant), filter, limit, after).await
    }

    async fn audit_everywhere(
        &self,
        filter: &AuditFilter,
        limit: u32,
        after: Option<i64>,
    ) -> Result<Page<AuditRow>> {
        let mut conn = self.reader().acquire().await?;
        audit_page::<S::Driver>(&mut conn, None, filter, limit, after).await
    }

    async fn expire_platform_audit(&self, before_ms: i64, limit: u32) -> Result<u64> {
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on(
            "audit",
            "DELETE FROM audit WHERE tenant_id IS NULL AND at < $1 AND seq IN (
                         SELECT seq FROM audit WHERE tenant_id IS NULL AND at < $1 LIMIT $2)",
        )
        .int(before_ms)
        .int(i64::from(limit))
        .execute::<S::Driver>(&mut conn)
        .await
    }
}
