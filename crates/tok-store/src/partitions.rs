//! PostgreSQL's monthly partitions of `run_steps`, `ticket_trace`,
//! `event_inbox` and `audit` (DESIGN §10): created ahead, one month per partition named
//! `<table>_YYYY_MM` over `[first of the month, first of the next)` in UTC
//! Unix milliseconds, and dropped whole once every tenant whose rows one
//! holds is done with them.
//!
//! Each partition is created or dropped in a transaction of its own with a
//! short `lock_timeout`: a DDL statement waiting for a lock would make every
//! query on the table queue behind it, so one that cannot have its lock at
//! once gives up and is tried at the next pass instead.
//!
//! Rows of a month that has no partition land in the table's default
//! partition (a clock that ran past the partitions made ahead, rows
//! restored from elsewhere), and that month's partition can then no longer
//! be created: PostgreSQL refuses a partition whose range the default
//! already holds rows of. [`move_default_rows`] makes room: for one month
//! at a time, in one transaction, it creates the month's table on its own,
//! moves the month's rows from the default partition into it and attaches
//! it. One transaction, because rows moved by a transaction of their own
//! would be out of every query's sight until the attach; the month's
//! rows are at most `max_rows`, so the transaction stays short. It locks
//! only the default partition (`ATTACH PARTITION` takes a weaker lock on
//! the table, which inserts and reads pass), so the engine's writes to the
//! months that have partitions go on meanwhile. A month with more rows
//! than that is left where it is and reported: its move is the manual
//! step in `docs/operations.md`.

use jiff::civil::Date;
use jiff::{Timestamp, ToSpan, tz::TimeZone};
use sqlx::PgPool;
use sqlx::Row as _;
use tok_core::ids::TenantId;

use crate::retention::{Expiring, MovedRows, PARTITIONED, PartitionProblem, partition_key};

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

/// How many months one pass moves out of a table's default partition at
/// most; more wait for the next pass.
const MONTHS_MOVED_PER_PASS: usize = 12;

/// Moves the rows of months without a partition out of each partitioned
/// table's default partition into a partition of their own (see the
/// module's comment); `skip` names partitions not to try again. Returns the
/// partitions made so, and those whose month could not be moved.
pub(crate) async fn move_default_rows(
    pool: &PgPool,
    lock: i64,
    max_rows: u64,
    skip: &[String],
) -> crate::Result<(Vec<MovedRows>, Vec<PartitionProblem>)> {
    let mut moved = Vec::new();
    let mut problems = Vec::new();
    for table in PARTITIONED {
        let key = partition_key(table);
        let default = format!("{table}_default");
        let mut from = i64::MIN;
        for _ in 0..MONTHS_MOVED_PER_PASS {
            let first: Option<i64> = sqlx::query_scalar(&format!(
                "SELECT MIN({key}) FROM {default} WHERE {key} >= $1"
            ))
            .bind(from)
            .fetch_one(pool)
            .await?;
            let Some(first) = first else {
                break;
            };
            let month = month_of(first);
            let (start, end) = (
                start_ms(month),
                start_ms(month.checked_add(1.month()).unwrap_or(month)),
            );
            from = end;
            let partition = name(table, month);
            if skip.contains(&partition) {
                continue;
            }
            match move_month(pool, lock, table, &partition, start, end, max_rows).await {
                Ok(0) => {}
                Ok(rows) => {
                    tracing::info!(
                        partition = %partition,
                        rows,
                        "rows of a month without a partition moved out of the default partition"
                    );
                    moved.push(MovedRows { partition, rows });
                }
                Err(error) => problems.push(PartitionProblem { partition, error }),
            }
        }
    }
    Ok((moved, problems))
}

/// One month's move (see [`move_default_rows`]); the rows moved, or why
/// nothing was.
async fn move_month(
    pool: &PgPool,
    lock: i64,
    table: &str,
    partition: &str,
    start: i64,
    end: i64,
    max_rows: u64,
) -> Result<u64, String> {
    let key = partition_key(table);
    let default = format!("{table}_default");
    let step = async {
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(lock)
            .execute(&mut *tx)
            .await?;
        sqlx::Executor::execute(&mut *tx, DDL_LOCK_TIMEOUT).await?;
        let rows: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {default} WHERE {key} >= $1 AND {key} < $2"
        ))
        .bind(start)
        .bind(end)
        .fetch_one(&mut *tx)
        .await?;
        if rows == 0 {
            return Ok(Ok(0)); // another process moved them meanwhile
        }
        if rows as u64 > max_rows {
            return Ok(Err(format!(
                "the default partition holds {rows} rows of this month, more than the \
                 {max_rows} moved in one transaction; move them by hand (docs/operations.md)"
            )));
        }
        for ddl in [
            format!(
                "CREATE TABLE {partition} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS \
                 INCLUDING STORAGE)"
            ),
            format!(
                "WITH moved AS (DELETE FROM {default} WHERE {key} >= {start} AND {key} < {end} \
                 RETURNING *) INSERT INTO {partition} SELECT * FROM moved"
            ),
            format!(
                "ALTER TABLE {table} ATTACH PARTITION {partition} FOR VALUES FROM ({start}) TO ({end})"
            ),
        ] {
            sqlx::Executor::execute(&mut *tx, ddl.as_str()).await?;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(Ok(rows as u64))
    };
    match step.await {
        Ok(outcome) => outcome,
        // A lock not had within the timeout: busy now, tried at the next
        // pass (not a problem to raise).
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
            tracing::info!(partition = %partition, error = %e, "default partition busy; its rows move at the next pass");
            Ok(0)
        }
        Err(e) => Err(e.to_string()),
    }
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
        if what == Expiring::Inbox {
            let pending = sqlx::query(&format!(
                "SELECT 1 AS one FROM {partition} WHERE status = 'pending' LIMIT 1"
            ))
            .fetch_optional(&mut *tx)
            .await?;
            if pending.is_some() {
                continue; // events not dispatched yet stay
            }
        }
        // The platform's own audit rows (no tenant) are kept by a
        // retention of their own: a month holding one stays until batched
        // deletes took them (`AuditStore::expire_platform_audit`).
        let platform_rows = what == Expiring::Audit;
        if !keeping.is_empty() || platform_rows {
            let held = sqlx::query(&format!(
                "SELECT 1 AS one FROM {partition} WHERE tenant_id = ANY($1){} LIMIT 1",
                if platform_rows {
                    " OR tenant_id IS NULL"
                } else {
                    ""
                }
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
