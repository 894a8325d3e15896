//! [`OperationStore`] on every store, on the tenant's database, and
//! [`OperationLoop`] on a store of one database: the same SQL on both
//! databases, but for how a list of tenants is bound.
//! [`OperationStore::apply`] acts on a run with the retry and cancel of
//! `runs_sql.rs`, in its transaction, through [`RunActions`].

use std::future::Future;

use async_trait::async_trait;
use tok_core::ids::{RunId, TenantId, new_id};
use tok_core::run::RunStatus;

use super::{Applied, NewOperation, Operation, OperationLoop, OperationStore, RunAction};
use crate::rows::now_ms;
use crate::sql::{Driver, DriverOf, Route, Row, SqlStore, Tx, on};
use crate::{Page, Result, StoreError};

/// What [`OperationStore::apply`] needs of the runs' queries, which are
/// still written once per backend (`runs_sql.rs`): each store forwards to
/// its own (`postgres.rs` and `sqlite.rs` of this folder).
pub(crate) trait RunActions: SqlStore {
    /// The path a failed run is retried at, or why it cannot be.
    fn retry_path_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<std::result::Result<String, String>>> + Send;

    /// Queues the failed run again at `path`, on `version` when given.
    fn retry_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
        path: &str,
        version: Option<i32>,
        bulk: bool,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Cancels the run unless its state does not allow it (then why).
    fn cancel_checked_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<std::result::Result<(), String>>> + Send;

    /// The run's status, its row locked.
    fn run_status(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        run: &RunId,
    ) -> impl Future<Output = Result<RunStatus>> + Send;
}

fn operation<D: Driver>(row: &Row<D>) -> Result<Operation> {
    Ok(Operation {
        id: row.text("id")?,
        tenant_id: TenantId::from(row.text("tenant_id")?),
        action: row.text("action")?,
        version: row.text("version")?,
        filter: row.json("filter")?,
        status: row.text("status")?,
        total: row.int("total")?,
        done: row.int("done")?,
        failed: row.int("failed")?,
        after: row.opt_text("after")?,
        actor: row.opt_json("actor")?,
        created_at: row.int("created_at")?,
        finished_at: row.opt_int("finished_at")?,
    })
}

/// The tenant's operation `id`, read on `store` (its database).
async fn operation_on<S: SqlStore>(
    store: &S,
    tenant: &TenantId,
    id: &str,
) -> Result<Option<Operation>> {
    let mut conn = store.reader().acquire().await?;
    let row = on(
        "operations",
        "SELECT * FROM operations WHERE tenant_id = $1 AND id = $2",
    )
    .text(tenant.as_str())
    .text(id)
    .fetch_optional::<S::Driver>(&mut conn)
    .await?;
    row.as_ref().map(operation).transpose()
}

#[async_trait]
impl<R: Route> OperationStore for R
where
    R::Store: RunActions,
{
    async fn create_operation(&self, tenant: &TenantId, new: NewOperation) -> Result<Operation> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let id = new_id("op");
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            on(
                "operations",
                "INSERT INTO operations (id, tenant_id, action, version, filter, status,
                    total, actor, created_at)
                 VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8)",
            )
            .text(&id)
            .text(tenant.as_str())
            .text(new.action.as_str())
            .text(&new.version)
            .json(&new.filter)
            .int(new.total)
            .opt_json(new.actor.as_ref())
            .int(now_ms())
            .execute::<DriverOf<R>>(&mut conn)
            .await?;
            drop(conn);
            drop(writer);
            operation_on(&*db, tenant, &id)
                .await?
                .ok_or(StoreError::NotFound("operation"))
        })
        .await
    }

    async fn operation(&self, tenant: &TenantId, id: &str) -> Result<Option<Operation>> {
        let db = self.db_for(tenant).await?;
        db.call(operation_on(&*db, tenant, id)).await
    }

    async fn operations(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<Operation>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let rows = on(
                "operations",
                "SELECT * FROM operations
                 WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR id < $2)
                 ORDER BY id DESC LIMIT $3",
            )
            .text(tenant.as_str())
            .opt_text(after)
            .int(i64::from(limit) + 1)
            .fetch_all::<DriverOf<R>>(&mut conn)
            .await?;
            let items = rows.iter().map(operation).collect::<Result<_>>()?;
            Ok(Page::of(items, limit, |o: &Operation| o.id.clone()))
        })
        .await
    }

    async fn operation_failures(
        &self,
        tenant: &TenantId,
        id: &str,
        limit: u32,
    ) -> Result<Vec<(RunId, String)>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let rows = on(
                "operation_runs",
                "SELECT run_id, reason FROM operation_runs
                 WHERE tenant_id = $1 AND operation_id = $2 AND NOT ok
                 ORDER BY run_id LIMIT $3",
            )
            .text(tenant.as_str())
            .text(id)
            .int(i64::from(limit))
            .fetch_all::<DriverOf<R>>(&mut conn)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok((
                        RunId::from(r.text("run_id")?),
                        r.opt_text("reason")?.unwrap_or_default(),
                    ))
                })
                .collect()
        })
        .await
    }

    async fn cancel_operation(&self, tenant: &TenantId, id: &str) -> Result<Option<Operation>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            let stopped = on(
                "operations",
                "UPDATE operations SET status = 'cancelled', finished_at = $3
                 WHERE tenant_id = $1 AND id = $2 AND status = 'running'",
            )
            .text(tenant.as_str())
            .text(id)
            .int(now_ms())
            .execute::<DriverOf<R>>(&mut conn)
            .await?;
            drop(conn);
            drop(writer);
            let operation = operation_on(&*db, tenant, id).await?;
            match operation {
                Some(op) if stopped == 0 => Err(StoreError::InvalidState(format!(
                    "the operation is {}; only a running operation can be cancelled",
                    op.status
                ))),
                found => Ok(found),
            }
        })
        .await
    }

    async fn apply(
        &self,
        tenant: &TenantId,
        operation: &str,
        run: &RunId,
        action: RunAction,
    ) -> Result<Applied> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            let status = on(
                "operations",
                "SELECT status FROM operations WHERE tenant_id = $1 AND id = $2",
            )
            .text(tenant.as_str())
            .text(operation)
            .fetch_optional::<DriverOf<R>>(&mut tx)
            .await?
            .map(|r| r.text("status"))
            .transpose()?;
            if status.as_deref() != Some("running") {
                tx.rollback().await?;
                return Ok(Applied::Stopped);
            }
            let now = now_ms();
            let first = on(
                "operation_runs",
                "INSERT INTO operation_runs (tenant_id, operation_id, run_id, ok, at)
                 VALUES ($1, $2, $3, TRUE, $4)
                 ON CONFLICT (operation_id, run_id) DO NOTHING",
            )
            .text(tenant.as_str())
            .text(operation)
            .text(run.as_str())
            .int(now)
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            if first == 0 {
                tx.rollback().await?;
                return Ok(Applied::Already);
            }
            let outcome = match action {
                RunAction::Refuse(why) => Err(why),
                RunAction::Retry { version } => {
                    match R::Store::retry_path_in(&mut tx, tenant, run).await {
                        Ok(Ok(path)) => {
                            R::Store::retry_in(&mut tx, tenant, run, &path, version, true).await?;
                            Ok(())
                        }
                        Ok(Err(why)) => Err(why),
                        Err(StoreError::NotFound(_)) => Err("the run is gone".to_owned()),
                        Err(e) => return Err(e),
                    }
                }
                RunAction::Cancel => match R::Store::cancel_checked_in(&mut tx, tenant, run).await
                {
                    Ok(outcome) => outcome,
                    Err(StoreError::NotFound(_)) => Err("the run is gone".to_owned()),
                    Err(e) => return Err(e),
                },
            };
            // `total` is at least the runs acted on: an operation whose count
            // stopped at its call's budget counted fewer.
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
            on("operations", counted)
                .text(tenant.as_str())
                .text(operation)
                .execute::<DriverOf<R>>(&mut tx)
                .await?;
            if let Err(why) = &outcome {
                on(
                    "operation_runs",
                    "UPDATE operation_runs SET ok = FALSE, reason = $3
                     WHERE operation_id = $1 AND run_id = $2",
                )
                .text(operation)
                .text(run.as_str())
                .text(why)
                .execute::<DriverOf<R>>(&mut tx)
                .await?;
            }
            let applied = match outcome {
                Ok(()) => Applied::Done(R::Store::run_status(&mut tx, tenant, run).await?),
                Err(why) => Applied::Failed(why),
            };
            tx.commit().await?;
            Ok(applied)
        })
        .await
    }

    async fn advance_operation(
        &self,
        tenant: &TenantId,
        id: &str,
        after: Option<&str>,
        finished: bool,
    ) -> Result<()> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            on(
                "operations",
                "UPDATE operations SET after = COALESCE($3, after),
                    status = CASE WHEN $4 THEN 'done' ELSE status END,
                    finished_at = CASE WHEN $4 THEN $5 ELSE finished_at END
                 WHERE tenant_id = $1 AND id = $2 AND status = 'running'",
            )
            .text(tenant.as_str())
            .text(id)
            .opt_text(after)
            .bool(finished)
            .int(now_ms())
            .execute::<DriverOf<R>>(&mut conn)
            .await?;
            Ok(())
        })
        .await
    }
}

/// On a store of one database, every tenant's operations are in it: one
/// statement for all the tenants asked.
#[async_trait]
impl<S: SqlStore> OperationLoop for S {
    async fn running_operations(&self, tenants: &[TenantId]) -> Result<Vec<Operation>> {
        if tenants.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT * FROM operations o
             WHERE o.tenant_id {} AND o.status = 'running'
               AND NOT EXISTS (SELECT 1 FROM operations e
                   WHERE e.tenant_id = o.tenant_id AND e.status = 'running'
                     AND (e.created_at, e.id) < (o.created_at, o.id))
             ORDER BY o.created_at, o.id",
            S::Driver::any_of(1)
        );
        let mut conn = self.reader().acquire().await?;
        let rows = on("operations", &sql)
            .texts(tenants.iter().map(|t| t.as_str()))
            .fetch_all::<S::Driver>(&mut conn)
            .await?;
        rows.iter().map(operation).collect()
    }
}
