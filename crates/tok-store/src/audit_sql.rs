//! The audit log's queries ([`AuditStore`](crate::AuditStore)) for both
//! backends (see `rows.rs` for why a macro per file).

macro_rules! impl_audit {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// The columns a row is written with (`seq` is the database's).
        const AUDIT_COLUMNS: &str = "id, tenant_id, at, actor_kind, actor_id, actor_name, action,
            target_kind, target_id, summary, outcome";

        /// Writes `row`, dated now, with `outcome`, in `tx`: the API's
        /// rows alone, or a platform change's in the change's own
        /// transaction.
        pub(crate) async fn insert_audit_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            row: $crate::audit::NewAudit,
            outcome: $crate::audit::AuditOutcome,
        ) -> Result<$crate::audit::AuditRow> {
            let mut stored = $crate::audit::AuditRow {
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
            stored.seq = sqlx::query_scalar(&format!(
                "INSERT INTO audit ({AUDIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 RETURNING seq"
            ))
            .bind(&stored.id)
            .bind(stored.tenant_id.as_ref().map(|t| t.as_str()))
            .bind(stored.at)
            .bind(stored.actor.kind.as_str())
            .bind(stored.actor.id.as_deref())
            .bind(stored.actor.name.as_deref())
            .bind(&stored.action)
            .bind(&stored.target.kind)
            .bind(stored.target.id.as_deref())
            .bind(stored.summary.as_deref())
            .bind(stored.outcome.as_str())
            .fetch_one(&mut **tx)
            .await?;
            Ok(stored)
        }

        fn audit_from_row(row: &<$db as sqlx::Database>::Row) -> $crate::audit::AuditRow {
            $crate::audit::AuditRow {
                id: row.get("id"),
                seq: row.get("seq"),
                tenant_id: row.get::<Option<String>, _>("tenant_id").map(TenantId::from),
                at: row.get("at"),
                actor: $crate::audit::Actor {
                    kind: $crate::audit::ActorKind::parse(&row.get::<String, _>("actor_kind")),
                    id: row.get("actor_id"),
                    name: row.get("actor_name"),
                },
                action: row.get("action"),
                target: $crate::audit::Target {
                    kind: row.get("target_kind"),
                    id: row.get("target_id"),
                },
                summary: row.get("summary"),
                outcome: $crate::audit::AuditOutcome::parse(&row.get::<String, _>("outcome")),
            }
        }

        /// A page of audit rows, newest first; `tenant` `None` reads every
        /// tenant's and the platform's.
        async fn audit_page(
            pool: &sqlx::Pool<$db>,
            tenant: Option<&TenantId>,
            filter: &$crate::audit::AuditFilter,
            limit: u32,
            after: Option<i64>,
        ) -> Result<Page<$crate::audit::AuditRow>> {
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
            let rows = sqlx::query(&sql)
                .bind(tenant.map(|t| t.as_str()))
                .bind(filter.actor.as_deref())
                .bind(filter.action.as_deref())
                .bind(filter.target.as_deref())
                .bind(filter.since)
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(pool)
                .await?;
            let items = rows.iter().map(audit_from_row).collect();
            Ok(Page::of(items, limit, |r: &$crate::audit::AuditRow| {
                r.seq.to_string()
            }))
        }

        #[async_trait::async_trait]
        impl $crate::audit::AuditStore for $store {
            async fn write_audit(
                &self,
                row: $crate::audit::NewAudit,
            ) -> Result<$crate::audit::AuditRow> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let stored = insert_audit_in(&mut tx, row, $crate::audit::AuditOutcome::Done).await?;
                tx.commit().await?;
                Ok(stored)
            }

            async fn begin_audit(
                &self,
                row: $crate::audit::NewAudit,
            ) -> Result<$crate::audit::AuditRow> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let stored =
                    insert_audit_in(&mut tx, row, $crate::audit::AuditOutcome::Pending).await?;
                tx.commit().await?;
                Ok(stored)
            }

            async fn end_audit(
                &self,
                row: &$crate::audit::AuditRow,
                end: $crate::audit::AuditEnd,
            ) -> Result<()> {
                sqlx::query(
                    "UPDATE audit SET outcome = $3, tenant_id = $4, target_id = $5, summary = $6
                     WHERE seq = $1 AND at = $2",
                )
                .bind(row.seq)
                .bind(row.at)
                .bind(end.outcome.as_str())
                .bind(end.tenant_id.as_ref().map(|t| t.as_str()))
                .bind(end.target_id.as_deref())
                .bind(end.summary.as_deref())
                .execute(&*self.writer().await)
                .await?;
                Ok(())
            }

            async fn drop_audit(&self, row: &$crate::audit::AuditRow) -> Result<()> {
                sqlx::query("DELETE FROM audit WHERE seq = $1 AND at = $2")
                    .bind(row.seq)
                    .bind(row.at)
                    .execute(&*self.writer().await)
                    .await?;
                Ok(())
            }

            async fn resolve_pending_audit(&self, before_ms: i64, limit: u32) -> Result<u64> {
                // By the partial index `audit_pending`: the pending rows
                // are the few of changes under way.
                let done = sqlx::query(
                    "UPDATE audit SET outcome = 'unknown'
                     WHERE outcome = 'pending' AND at < $1 AND seq IN (
                         SELECT seq FROM audit WHERE outcome = 'pending' AND at < $1 LIMIT $2)",
                )
                .bind(before_ms)
                .bind(i64::from(limit))
                .execute(&*self.writer_in($crate::Lane::Bulk).await)
                .await?;
                Ok(done.rows_affected())
            }

            async fn audit(
                &self,
                tenant: &TenantId,
                filter: &$crate::audit::AuditFilter,
                limit: u32,
                after: Option<i64>,
            ) -> Result<Page<$crate::audit::AuditRow>> {
                audit_page(self.reader(), Some(tenant), filter, limit, after).await
            }

            async fn audit_everywhere(
                &self,
                filter: &$crate::audit::AuditFilter,
                limit: u32,
                after: Option<i64>,
            ) -> Result<Page<$crate::audit::AuditRow>> {
                audit_page(self.reader(), None, filter, limit, after).await
            }

            async fn expire_platform_audit(&self, before_ms: i64, limit: u32) -> Result<u64> {
                let done = sqlx::query(
                    "DELETE FROM audit WHERE tenant_id IS NULL AND at < $1 AND seq IN (
                         SELECT seq FROM audit WHERE tenant_id IS NULL AND at < $1 LIMIT $2)",
                )
                .bind(before_ms)
                .bind(i64::from(limit))
                .execute(&*self.writer_in($crate::Lane::Bulk).await)
                .await?;
                Ok(done.rows_affected())
            }
        }
    };
}

pub(crate) use impl_audit;
