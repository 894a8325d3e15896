//! Moving a tenant between databases: [`copy_tenant`] copies its rows while
//! its processes are stopped, [`forget_tenant`] deletes what the move left
//! behind (`docs/operations.md` has the procedure). Each may write the
//! platform's audit row of what it did in its own transaction.

use std::collections::HashSet;

use serde_json::Value;
use sqlx::Row as _;
use sqlx::postgres::PgPool;
use sqlx::types::Json;
use tok_core::ids::TenantId;

use crate::audit::{AuditOutcome, NewAudit};
use crate::{Result, StoreError};

/// What [`copy_tenant`] copied: rows per table.
pub type Copied = Vec<(String, u64)>;

/// Tables of tenant data not copied: the registry, the keys and the audit
/// log stay in the shared database, the platform's incidents are the platform's, and
/// `connection_slots` are the slots of calls in flight (none when the
/// tenant's processes are stopped; a slot left by a crash frees itself).
const NOT_COPIED: &[&str] = &[
    "tenants",
    "api_keys",
    "audit",
    "platform_incidents",
    "connection_slots",
];

/// Copies every row of `tenant` from the database `from` to the database
/// `to` (both migrated), in one transaction on `to`, and returns how many
/// rows of each table. Refuses, copying nothing, when a job of the tenant
/// is leased (a step in flight: stop its processes first) or when `to`
/// already holds rows of the tenant. The rows stay in `from` until
/// [`forget_tenant`] deletes them, after the switch. Identity columns
/// (`jobs.id`, `run_steps.id`, `ticket_trace.id`) are numbered anew by `to`,
/// in the old order. `audit`, if any, is written `done` in the same
/// transaction, its summary followed by the number of rows copied.
pub async fn copy_tenant(
    from: &PgPool,
    to: &PgPool,
    tenant: &TenantId,
    audit: Option<NewAudit>,
) -> Result<Copied> {
    let exists = sqlx::query("SELECT 1 FROM tenants WHERE id = $1")
        .bind(tenant.as_str())
        .fetch_optional(from)
        .await?;
    if exists.is_none() {
        return Err(StoreError::NotFound("tenant in the database to copy from"));
    }
    let leased: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM jobs WHERE tenant_id = $1
         AND locked_until >= (extract(epoch from clock_timestamp()) * 1000)::bigint",
    )
    .bind(tenant.as_str())
    .fetch_one(from)
    .await?;
    if leased > 0 {
        return Err(StoreError::InvalidState(format!(
            "{leased} job(s) of tenant {tenant} are leased (steps in flight); stop the tenant's \
             processes and wait for their leases to end before copying"
        )));
    }
    let tables = tenant_tables(from).await?;
    let mut source = from.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *source)
        .await?;
    let mut target = to.begin().await?;
    for table in &tables {
        let sql = format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE tenant_id = $1)");
        let held: bool = sqlx::query_scalar(&sql)
            .bind(tenant.as_str())
            .fetch_one(&mut *target)
            .await?;
        if held {
            return Err(StoreError::InvalidState(format!(
                "the target database already holds rows of tenant {tenant} in {table}; \
                 nothing was copied"
            )));
        }
    }
    let row = sqlx::query("SELECT id, name, settings, created_at FROM tenants WHERE id = $1")
        .bind(tenant.as_str())
        .fetch_one(&mut *source)
        .await?;
    sqlx::query(
        "INSERT INTO tenants (id, name, settings, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, settings = EXCLUDED.settings",
    )
    .bind(row.get::<String, _>("id"))
    .bind(row.get::<String, _>("name"))
    .bind(row.get::<Json<Value>, _>("settings"))
    .bind(row.get::<i64, _>("created_at"))
    .execute(&mut *target)
    .await?;
    let mut copied = Vec::new();
    for table in &tables {
        let columns: Vec<(String, bool)> = sqlx::query_as(
            "SELECT column_name::text, is_identity = 'YES' FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
        )
        .bind(table)
        .fetch_all(&mut *target)
        .await?;
        let identity = columns.iter().find(|(_, id)| *id).map(|(c, _)| c.clone());
        let kept: Vec<&str> = columns
            .iter()
            .filter(|(_, id)| !id)
            .map(|(c, _)| c.as_str())
            .collect();
        let list = kept
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let order = identity.map_or("tableoid, ctid".to_owned(), |c| format!("\"{c}\""));
        let mut total = 0u64;
        let mut offset = 0i64;
        loop {
            let read = format!(
                "SELECT COALESCE(jsonb_agg(to_jsonb(t)), '[]'::jsonb) FROM
                 (SELECT * FROM {table} WHERE tenant_id = $1 ORDER BY {order} LIMIT $2 OFFSET $3) t"
            );
            let Json(batch): Json<Value> = sqlx::query_scalar(&read)
                .bind(tenant.as_str())
                .bind(COPY_BATCH)
                .bind(offset)
                .fetch_one(&mut *source)
                .await?;
            let n = batch.as_array().map_or(0, Vec::len) as i64;
            if n == 0 {
                break;
            }
            let write = format!(
                "INSERT INTO {table} ({list})
                 SELECT {list} FROM jsonb_array_elements($1) WITH ORDINALITY e(v, n),
                      jsonb_populate_record(NULL::{table}, e.v)
                 ORDER BY e.n"
            );
            total += sqlx::query(&write)
                .bind(Json(batch))
                .execute(&mut *target)
                .await?
                .rows_affected();
            offset += n;
            if n < COPY_BATCH {
                break;
            }
        }
        copied.push((table.clone(), total));
    }
    if let Some(row) = audit {
        insert_audit(&mut target, row, &copied).await?;
    }
    target.commit().await?;
    source.rollback().await?;
    Ok(copied)
}

/// Rows read at once by [`copy_tenant`].
const COPY_BATCH: i64 = 2_000;

/// Deletes every row of `tenant` from `db` but its `tenants` row, its
/// API keys and its audit log (the shared database keeps those): what a move leaves behind
/// in the database it left, after the switch. One transaction, with
/// `audit`, if any, written `done` in it, its summary followed by the
/// number of rows deleted.
pub async fn forget_tenant(
    db: &PgPool,
    tenant: &TenantId,
    audit: Option<NewAudit>,
) -> Result<Copied> {
    let mut tables = tenant_tables(db).await?;
    tables.reverse();
    let mut tx = db.begin().await?;
    let mut deleted = Vec::new();
    for table in tables
        .iter()
        .map(String::as_str)
        .chain(["connection_slots"])
    {
        let sql = format!("DELETE FROM {table} WHERE tenant_id = $1");
        let n = sqlx::query(&sql)
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        deleted.push((table.to_owned(), n));
    }
    if let Some(row) = audit {
        insert_audit(&mut tx, row, &deleted).await?;
    }
    tx.commit().await?;
    Ok(deleted)
}

/// Writes `row` in `tx`, `done`, its summary followed by the rows counted.
async fn insert_audit(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    mut row: NewAudit,
    counted: &Copied,
) -> Result<()> {
    let rows: u64 = counted.iter().map(|(_, n)| n).sum();
    row.summary = Some(match row.summary.take() {
        Some(summary) => format!("{summary} ({rows} rows)"),
        None => format!("{rows} rows"),
    });
    crate::audit::insert_audit_in::<crate::sql::postgres::Postgres>(tx, row, AuditOutcome::Done)
        .await?;
    Ok(())
}

/// The tables with a `tenant_id` column but those of [`NOT_COPIED`],
/// partitions left out (their parent stands for them), each after the
/// tables it references.
async fn tenant_tables(db: &PgPool) -> Result<Vec<String>> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
         ORDER BY c.relname",
    )
    .fetch_all(db)
    .await?;
    let tables: Vec<String> = tables
        .into_iter()
        .filter(|t| !NOT_COPIED.contains(&t.as_str()))
        .collect();
    let edges: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.conrelid::regclass::text, c.confrelid::regclass::text FROM pg_constraint c
         WHERE c.contype = 'f' AND c.connamespace = current_schema()::regnamespace",
    )
    .fetch_all(db)
    .await?;
    let mut ordered: Vec<String> = Vec::new();
    let mut left: HashSet<String> = tables.iter().cloned().collect();
    while !left.is_empty() {
        let ready: Vec<String> = tables
            .iter()
            .filter(|t| left.contains(*t))
            .filter(|t| {
                !edges
                    .iter()
                    .any(|(from, to)| from == *t && to != *t && left.contains(to))
            })
            .cloned()
            .collect();
        if ready.is_empty() {
            return Err(StoreError::Invariant(
                "the tenant tables reference each other in a cycle".into(),
            ));
        }
        for t in ready {
            left.remove(&t);
            ordered.push(t);
        }
    }
    Ok(ordered)
}
