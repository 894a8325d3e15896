//! PostgreSQL's monthly partitions of `run_steps` and `ticket_trace`
//! (DESIGN §10): created ahead, one month per partition named
//! `<table>_YYYY_MM` over `[first of the month, first of the next)` in UTC
//! Unix milliseconds, and dropped whole once every tenant whose rows one
//! holds is done with them.
//!
//! Each partition is created or dropped in a transaction of its own with a
//! short `lock_timeout`: a DDL statement waiting for a lock would make every
//! query on the table queue behind it, so one that cannot have its lock at
//! once gives up and is tried at the next pass instead.

use jiff::civil::Date;
use jiff::{Timestamp, ToSpan, tz::TimeZone};
use sqlx::PgPool;
use sqlx::Row as _;
use tok_core::ids::TenantId;

use crate::retention::{Expiring, PARTITIONED, PartitionProblem};

/// How long a partition's DDL waits for its lock before it gives up.
const DDL_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '2s'";

/// The first day of the month `now_ms` falls in (UTC).
fn month_of(ms: i64) -> Date {
    let date = Timestamp::from_millisecond(ms)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_zoned(TimeZone::UTC)
        .date();
    date.first_of_month()
}

fn start_ms(month: Date) -> i64 {
    month
        .to_zoned(TimeZone::UTC)
        .map(|z| z.timestamp().as_millisecond())
        .unwrap_or(0)
}

fn name(table: &str, month: Date) -> String {
    format!("{table}_{:04}_{:02}", month.year(), month.month())
}

/// The month a partition's name stands for (`run_steps_2026_11`).
fn month_named(table: &str, partition: &str) -> Option<Date> {
    let rest = partition.strip_prefix(table)?.strip_prefix('_')?;
    let (year, month) = rest.split_once('_')?;
    Date::new(year.parse().ok()?, month.parse().ok()?, 1).ok()
}

/// Creates the partitions of the month of `now_ms` and `ahead` after it.
/// `lock` is the advisory lock the migrations take: two processes creating
/// the same partition at once would otherwise clash in the catalog.
pub(crate) async fn create(
    pool: &PgPool,
    lock: i64,
    now_ms: i64,
    ahead: u32,
    skip: &[String],
) -> crate::Result<Vec<PartitionProblem>> {
    let mut problems = Vec::new();
    for table in PARTITIONED {
        for i in 0..=ahead {
            let month = month_of(now_ms)
                .checked_add((i as i32).months())
                .unwrap_or(month_of(now_ms));
            let next = month.checked_add(1.month()).unwrap_or(month);
            let partition = name(table, month);
            if skip.contains(&partition) {
                continue;
            }
            let mut tx = pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(lock)
                .execute(&mut *tx)
                .await?;
            sqlx::Executor::execute(&mut *tx, DDL_LOCK_TIMEOUT).await?;
            let exists = sqlx::query("SELECT 1 AS one FROM pg_class WHERE relname = $1")
                .bind(&partition)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
            if exists {
                continue;
            }
            let ddl = format!(
                "CREATE TABLE {partition} PARTITION OF {table} FOR VALUES FROM ({}) TO ({})",
                start_ms(month),
                start_ms(next)
            );
            match sqlx::Executor::execute(&mut *tx, ddl.as_str()).await {
                Ok(_) => tx.commit().await?,
                // Rows of that month in the default partition, or a lock
                // not had in time: the month's rows go to the default
                // partition meanwhile; nothing fails for it.
                Err(e) => problems.push(PartitionProblem {
                    partition,
                    error: e.to_string(),
                }),
            }
        }
    }
    Ok(problems)
}

/// Drops the expired partitions of `what` (see
/// [`RetentionStore::drop_expired_partitions`](crate::RetentionStore::drop_expired_partitions)).
pub(crate) async fn drop_expired(
    pool: &PgPool,
    what: Expiring,
    cutoffs: &[(TenantId, i64)],
) -> crate::Result<Vec<String>> {
    if !what.partitioned() {
        return Ok(Vec::new());
    }
    let Some(latest) = cutoffs.iter().map(|(_, c)| *c).max() else {
        return Ok(Vec::new());
    };
    let table = what.table();
    let rows = sqlx::query(
        "SELECT c.relname AS name FROM pg_inherits i
           JOIN pg_class c ON c.oid = i.inhrelid
           JOIN pg_class p ON p.oid = i.inhparent
          WHERE p.relname = $1
          ORDER BY c.relname",
    )
    .bind(table)
    .fetch_all(pool)
    .await?;
    let mut dropped = Vec::new();
    for row in rows {
        let partition: String = row.get("name");
        let Some(month) = month_named(table, &partition) else {
            continue; // the default partition
        };
        let end = start_ms(month.checked_add(1.month()).unwrap_or(month));
        if end > latest {
            continue; // not expired for any tenant yet
        }
        // Tenants that still keep some of this month's rows.
        let keeping: Vec<&str> = cutoffs
            .iter()
            .filter(|(_, cutoff)| *cutoff < end)
            .map(|(t, _)| t.as_str())
            .collect();
        let mut tx = pool.begin().await?;
        sqlx::Executor::execute(&mut *tx, DDL_LOCK_TIMEOUT).await?;
        let locked = sqlx::Executor::execute(
            &mut *tx,
            format!("LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE").as_str(),
        )
        .await;
        if let Err(e) = locked {
            tracing::info!(partition = %partition, error = %e, "partition busy; dropped at the next pass");
            continue;
        }
        if !keeping.is_empty() {
            let held = sqlx::query(&format!(
                "SELECT 1 AS one FROM {partition} WHERE tenant_id = ANY($1) LIMIT 1"
            ))
            .bind(&keeping)
            .fetch_optional(&mut *tx)
            .await?;
            if held.is_some() {
                continue; // a longer retention: batched deletes empty the rest
            }
        }
        sqlx::Executor::execute(&mut *tx, format!("DROP TABLE {partition}").as_str()).await?;
        tx.commit().await?;
        dropped.push(partition);
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_named_by_month_and_read_back() {
        // 2025-11-15T00:00:00Z
        let month = month_of(1_763_164_800_000);
        assert_eq!(name("run_steps", month), "run_steps_2025_11");
        assert_eq!(month_named("run_steps", "run_steps_2025_11"), Some(month));
        assert_eq!(month_named("run_steps", "run_steps_default"), None);
        assert_eq!(start_ms(month), 1_761_955_200_000);
    }
}
