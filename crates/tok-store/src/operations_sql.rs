//! Bulk operations ([`OperationStore`](crate::OperationStore)) for both
//! backends (see `rows.rs` for why a macro per file). [`apply`] acts on a
//! run with the retry and cancel of `runs_sql.rs`, in its transaction.

macro_rules! impl_operations {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        fn operation_from_row(row: &<$db as sqlx::Database>::Row) -> Operation {
            Operation {
                id: row.get("id"),
                tenant_id: TenantId::from(row.get::<String, _>("tenant_id")),
                action: row.get("action"),
                version: row.get("version"),
                filter: row.get::<Json<Value>, _>("filter").0,
                status: row.get("status"),
                total: row.get("total"),
                done: row.get("done"),
                failed: row.get("failed"),
                after: row.get("after"),
                actor: row.get::<Option<Json<Value>>, _>("actor").map(|a| a.0),
                created_at: row.get("created_at"),
                finished_at: row.get("finished_at"),
            }
        }

        #[async_trait::async_trait]
        impl OperationStore for $store {
            async fn create_operation(
                &self,
                tenant: &TenantId,
                new: NewOperation,
            ) -> Result<Operation> {
                let id = new_id("op");
                sqlx::query(
                    "INSERT INTO operations (id, tenant_id, action, version, filter, status,
                        total, actor, created_at)
                     VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8)",
                )
                .bind(&id)
                .bind(tenant.as_str())
                .bind(new.action.as_str())
                .bind(&new.version)
                .bind(Json(&new.filter))
                .bind(new.total)
                .bind(new.actor.as_ref().map(Json))
                .bind(now_ms())
                .execute(&*self.writer().await)
                .await?;
                self.operation(tenant, &id)
                    .await?
                    .ok_or(StoreError::NotFound("operation"))
            }

            async fn operation(&self, tenant: &TenantId, id: &str) -> Result<Option<Operation>> {
                let row = sqlx::query("SELECT * FROM operations WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.as_ref().map(operation_from_row))
            }

            async fn operations(
                &self,
                tenant: &TenantId,
                limit: u32,
                after: Option<&str>,
            ) -> Result<$crate::Page<Operation>> {
                let rows = sqlx::query(
                    "SELECT * FROM operations
                     WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR id < $2)
                     ORDER BY id DESC LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(self.reader())
                .await?;
                let items = rows.iter().map(operation_from_row).collect();
                Ok($crate::Page::of(items, limit, |o: &Operation| o.id.clone()))
            }

            async fn operation_failures(
                &self,
                tenant: &TenantId,
                id: &str,
                limit: u32,
            ) -> Result<Vec<(RunId, String)>> {
                let rows = sqlx::query(
                    "SELECT run_id, reason FROM operation_runs
                     WHERE tenant_id = $1 AND operation_id = $2 AND NOT ok
                     ORDER BY run_id LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| {
                        (
                            RunId::from(r.get::<String, _>("run_id")),
                            r.get::<Option<String>, _>("reason").unwrap_or_default(),
                        )
                    })
                    .collect())
            }

            async fn cancel_operation(
                &self,
                tenant: &TenantId,
                id: &str,
            ) -> Result<Option<Operation>> {
                let stopped = sqlx::query(
                    "UPDATE operations SET status = 'cancelled', finished_at = $3
                     WHERE tenant_id = $1 AND id = $2 AND status = 'running'",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(now_ms())
                .execute(&*self.writer().await)
                .await?;
                let operation = self.operation(tenant, id).await?;
                match operation {
                    Some(op) if stopped.rows_affected() == 0 => Err(StoreError::Conflict(format!(
                        "the operation is {}; only a running operation can be cancelled",
                        op.status
                    ))),
                    found => Ok(found),
                }
            }

            async fn running_operations(&self, tenants: &[TenantId]) -> Result<Vec<Operation>> {
                if tenants.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(concat!(
                    "SELECT * FROM operations o
                     WHERE o.tenant_id ",
                    any_of!(1),
                    " AND o.status = 'running'
                       AND NOT EXISTS (SELECT 1 FROM operations e
                           WHERE e.tenant_id = o.tenant_id AND e.status = 'running'
                             AND (e.created_at, e.id) < (o.created_at, o.id))
                     ORDER BY o.created_at, o.id"
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .fetch_all(self.reader())
                .await?;
                Ok(rows.iter().map(operation_from_row).collect())
            }

            async fn apply(
                &self,
                tenant: &TenantId,
                operation: &str,
                run: &RunId,
                action: RunAction,
            ) -> Result<Applied> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let status: Option<String> = sqlx::query_scalar(
                    "SELECT status FROM operations WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(operation)
                .fetch_optional(&mut *tx)
                .await?;
                if status.as_deref() != Some("running") {
                    tx.rollback().await?;
                    return Ok(Applied::Stopped);
                }
                let now = now_ms();
                let first = sqlx::query(
                    "INSERT INTO operation_runs (tenant_id, operation_id, run_id, ok, at)
                     VALUES ($1, $2, $3, TRUE, $4)
                     ON CONFLICT (operation_id, run_id) DO NOTHING",
                )
                .bind(tenant.as_str())
                .bind(operation)
                .bind(run.as_str())
                .bind(now)
                .execute(&mut *tx)
                .await?;
                if first.rows_affected() == 0 {
                    tx.rollback().await?;
                    return Ok(Applied::Already);
                }
                let outcome = match action {
                    RunAction::Refuse(why) => Err(why),
                    RunAction::Retry { version } => match retry_path_in(&mut tx, tenant, run).await
                    {
                        Ok(Ok(path)) => {
                            retry_in(&mut tx, tenant, run, &path, version, true).await?;
                            Ok(())
                        }
                        Ok(Err(why)) => Err(why),
                        Err(StoreError::NotFound(_)) => Err("the run is gone".to_owned()),
                        Err(e) => return Err(e),
                    },
                    RunAction::Cancel => match cancel_checked_in(&mut tx, tenant, run).await {
                        Ok(outcome) => outcome,
                        Err(StoreError::NotFound(_)) => Err("the run is gone".to_owned()),
                        Err(e) => return Err(e),
                    },
                };
                // `total` is at least the runs acted on: an operation whose
                // count stopped at its call's budget counted fewer.
                let counted = match &outcome {
                    Ok(()) => {
                        "UPDATE operations SET done = done + 1,
                            total = CASE WHEN done + failed + 1 > total THEN done + failed + 1 ELSE total END
                         WHERE tenant_id = $1 AND id = $2"
                    }
                    Err(_) => {
                        "UPDATE operations SET failed = failed + 1,
                            total = CASE WHEN done + failed + 1 > total THEN done + failed + 1 ELSE total END
                         WHERE tenant_id = $1 AND id = $2"
                    }
                };
                sqlx::query(counted)
                    .bind(tenant.as_str())
                    .bind(operation)
                    .execute(&mut *tx)
                    .await?;
                if let Err(why) = &outcome {
                    sqlx::query(
                        "UPDATE operation_runs SET ok = FALSE, reason = $3
                         WHERE operation_id = $1 AND run_id = $2",
                    )
                    .bind(operation)
                    .bind(run.as_str())
                    .bind(why)
                    .execute(&mut *tx)
                    .await?;
                }
                let applied = match outcome {
                    Ok(()) => Applied::Done(run_status(&mut tx, tenant, run).await?),
                    Err(why) => Applied::Failed(why),
                };
                tx.commit().await?;
                Ok(applied)
            }

            async fn advance_operation(
                &self,
                tenant: &TenantId,
                id: &str,
                after: Option<&str>,
                finished: bool,
            ) -> Result<()> {
                sqlx::query(
                    "UPDATE operations SET after = COALESCE($3, after),
                        status = CASE WHEN $4 THEN 'done' ELSE status END,
                        finished_at = CASE WHEN $4 THEN $5 ELSE finished_at END
                     WHERE tenant_id = $1 AND id = $2 AND status = 'running'",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(after)
                .bind(finished)
                .bind(now_ms())
                .execute(&*self.writer().await)
                .await?;
                Ok(())
            }
        }
    };
}

pub(crate) use impl_operations;
