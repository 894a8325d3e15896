//! A run's context as it is now, on either database.
//!
//! A record does not write its run's context whole again: it stores what it
//! changed (`tok_core::context::Changes`: the top-level entries it set and
//! removed) in its last step row, `run_steps.context_delta`, a row it writes
//! anyway. `runs.context` holds the context up to the step row
//! `runs.context_upto`; the changes of the run's step rows after it, folded
//! in order over it ([`fold_changes`]), give the context now. So a step of a
//! run with a large context writes its own change, not the context, and its
//! cost does not grow with the run (`docs/performance.md`).
//!
//! The context is written whole (`record_sql.rs` decides) when the run
//! ends, when a branch's record merges it, when a record says nothing of
//! what it changed, and when the changes since the last whole write outgrow
//! [`MAX_CHANGES`]: what a reader folds stays within a few times the
//! context itself. Retention writes whole the context
//! of a run whose changes are older than the step rows it is about to
//! delete (`retention/sql.rs`).
//!
//! Every reader of a run's context reads it through [`fold_changes`]: the
//! claim, the run's detail, search, a cancel's compensation, a branch's
//! merge. A run that ends outside a record (a cancel, a timeout) has its
//! context written whole there too.
//!
//! The fold's statement is the claim's: its text for each database is
//! built once ([`RecordSql`]). The queries still written once per backend
//! with sqlx reach these functions through [`native`].

use serde_json::Value;
use tok_core::ids::{RunId, TenantId};

use super::RecordSql;
use crate::Result;
use crate::sql::{Conn, Driver, Row, on};

/// A run's changes since its context was last written whole are at most
/// this many bytes, or this many times that context's size if more: past
/// it, the record writes the context whole. A larger bound writes less and
/// has a claim read more: with 4, a claim reads at most five times the
/// context, and the whole writes of a run whose context grows add up to
/// about a third of what its changes wrote.
pub(crate) const MAX_CHANGES: i64 = 64 * 1024;
pub(crate) const MAX_CHANGES_FACTOR: i64 = 4;

/// Whether a record whose change is `change` bytes writes its run's context
/// whole, given the run's changes since (`tail_bytes`) and the size of the
/// context written then (`context_bytes`).
pub(crate) fn outgrown(tail_bytes: i64, context_bytes: i64, change: i64) -> bool {
    tail_bytes + change > MAX_CHANGES.max(MAX_CHANGES_FACTOR * context_bytes)
}

/// How far a step row's `created_at` (its process's clock) may be behind
/// the `tail_since` of its run (another process's clock, after a lost
/// lease) and still be read: the bound only lets PostgreSQL skip old
/// monthly partitions.
pub(crate) const CLOCK_SKEW_MS: i64 = 60 * 60 * 1000;

/// Where a run's stored context stands: the step row up to which
/// `runs.context` holds the run's changes, and when the first change after
/// it was written (`None`: there is none).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stored {
    pub(crate) upto: i64,
    pub(crate) since: Option<i64>,
}

impl Stored {
    /// Where the run of a row that has its `context_upto` and `tail_since`
    /// stands.
    pub(crate) fn of<D: Driver>(row: &Row<D>) -> Result<Self> {
        Ok(Self {
            upto: row.int("context_upto")?,
            since: row.opt_int("tail_since")?,
        })
    }
}

/// The changes of the step rows of the runs bound at `$2` after the step
/// row `$3`, written from `$4` on, in the order they were written.
pub(crate) fn fold_changes_sql<D: Driver>() -> String {
    format!(
        "SELECT run_id, id, context_delta FROM run_steps
                 WHERE tenant_id = $1 AND run_id {} AND id > $3
                   AND created_at >= $4 AND context_delta IS NOT NULL
                 ORDER BY run_id, id",
        D::any_of(2)
    )
}

/// Folds over each run's stored context the changes its step rows
/// recorded since, in the order they were written: each context as it is
/// now. `runs` are (run id, its stored context, where it stands); one
/// statement reads the changes of them all, none is read when no run has
/// changes.
pub(crate) async fn fold_changes<D: RecordSql>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    runs: &mut [(&str, &mut Value, Stored)],
) -> Result<()> {
    let changed: Vec<&str> = runs
        .iter()
        .filter(|(_, _, stored)| stored.since.is_some())
        .map(|(run, _, _)| *run)
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let upto = runs
        .iter()
        .filter(|(_, _, stored)| stored.since.is_some())
        .map(|(_, _, stored)| stored.upto)
        .min()
        .unwrap_or(0);
    let since = runs
        .iter()
        .filter_map(|(_, _, stored)| stored.since)
        .min()
        .unwrap_or(0);
    let rows = on("run_steps", &D::statements().fold_changes)
        .text(tenant.as_str())
        .texts(changed.iter().copied())
        .int(upto)
        .int(since.saturating_sub(CLOCK_SKEW_MS))
        .fetch_all::<D>(conn)
        .await?;
    for row in &rows {
        let run = row.text("run_id")?;
        let id = row.int("id")?;
        let Some((_, context, stored)) = runs.iter_mut().find(|(r, _, _)| *r == run) else {
            continue;
        };
        if id <= stored.upto {
            continue;
        }
        match row.json::<tok_core::context::ContextDelta>("context_delta") {
            Ok(delta) => delta.apply(context),
            // Written by this store, so never: but a context
            // missing one change beats a queue that stops.
            Err(e) => {
                tracing::error!(run, step_row = id, error = %e,
                    "a step row's change of its run's context does not read; left out")
            }
        }
    }
    Ok(())
}

/// The run's stored context and where it stands; `None` when the run is
/// not there.
async fn stored_context<D: Driver>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    run: &RunId,
) -> Result<Option<Row<D>>> {
    on(
        "runs",
        "SELECT context, context_upto, tail_since FROM runs WHERE tenant_id = $1 AND id = $2",
    )
    .text(tenant.as_str())
    .text(run.as_str())
    .fetch_optional::<D>(conn)
    .await
}

/// The context of one run as it is now, in the caller's transaction;
/// `None` when the run is not there.
pub(crate) async fn context_in<D: RecordSql>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    run: &RunId,
) -> Result<Option<Value>> {
    let Some(row) = stored_context::<D>(conn, tenant, run).await? else {
        return Ok(None);
    };
    let mut context = row.json::<Value>("context")?;
    let stored = Stored::of(&row)?;
    fold_changes::<D>(conn, tenant, &mut [(run.as_str(), &mut context, stored)]).await?;
    Ok(Some(context))
}

/// Writes the run's context whole, as it is now, when steps changed it
/// since it last was (retention before it deletes their rows; a run that
/// ends outside a record). Returns whether it wrote.
pub(crate) async fn write_whole_in<D: RecordSql>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    run: &RunId,
) -> Result<bool> {
    let Some(row) = stored_context::<D>(conn, tenant, run).await? else {
        return Ok(false);
    };
    let stored = Stored::of(&row)?;
    if stored.since.is_none() {
        return Ok(false);
    }
    let mut context = row.json::<Value>("context")?;
    fold_changes::<D>(conn, tenant, &mut [(run.as_str(), &mut context, stored)]).await?;
    // Stored as `raw_json` makes it storable (U+0000 mended), and sized so.
    crate::storable::mend_value(&mut context);
    let size = crate::rows::raw_json(&context)?.get().len() as i64;
    on(
        "runs",
        "UPDATE runs SET context = $3, context_bytes = $4,
            context_upto = COALESCE((SELECT MAX(s.id) FROM run_steps s
                WHERE s.tenant_id = runs.tenant_id AND s.run_id = runs.id), 0),
            tail_since = NULL, tail_bytes = 0
         WHERE tenant_id = $1 AND id = $2",
    )
    .text(tenant.as_str())
    .text(run.as_str())
    .json(&context)
    .int(size)
    .execute::<D>(conn)
    .await?;
    Ok(true)
}

/// The run's jobs were deleted outside a record (a cancel, a timeout): no
/// job goes on where its row said (a job made after may even take the same
/// id, on SQLite), and a run that ended so has its context written whole,
/// as a record that ends a run does.
pub(crate) async fn jobs_gone_outside_a_record<D: RecordSql>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    run: &RunId,
    ended: bool,
) -> Result<()> {
    on(
        "runs",
        "UPDATE runs SET cursor_job = NULL, cursor_path = NULL, cursor_base = NULL
         WHERE tenant_id = $1 AND id = $2 AND cursor_job IS NOT NULL",
    )
    .text(tenant.as_str())
    .text(run.as_str())
    .execute::<D>(conn)
    .await?;
    if ended {
        write_whole_in::<D>(conn, tenant, run).await?;
    }
    Ok(())
}

/// The functions above for the queries still written once per backend
/// with sqlx (`*_sql.rs`), by the names those call: each finds its
/// database from the sqlx transaction, connection or row it is given.
/// They go once their callers have moved.
pub(crate) mod native {
    use serde_json::Value;
    use tok_core::ids::{RunId, TenantId};

    use super::Stored;
    use crate::record::RecordSql;
    use crate::sql::{Cell, Driver, Kind, Native};
    use crate::{Result, StoreError};

    /// [`Stored`] of a row sqlx returned that has the run's `context_upto`
    /// and `tail_since`.
    pub(crate) fn stored_of<R>(row: &R) -> Result<Stored>
    where
        R: sqlx::Row,
        R::Database: Native + sqlx::Database<Row = R>,
    {
        let int = |column: &'static str| match <<R::Database as Native>::Driver as Driver>::read(
            row,
            column,
            Kind::Int,
        ) {
            Ok(Cell::Int(value)) => Ok(Some(value)),
            Ok(_) => Ok(None),
            Err(e) => Err(StoreError::Decode {
                table: "runs",
                column,
                cause: e.to_string(),
            }),
        };
        Ok(Stored {
            upto: int("context_upto")?.ok_or_else(|| StoreError::Decode {
                table: "runs",
                column: "context_upto",
                cause: "it is NULL".into(),
            })?,
            since: int("tail_since")?,
        })
    }

    pub(crate) async fn fold_changes<C>(
        conn: &mut C,
        tenant: &TenantId,
        runs: &mut [(&str, &mut Value, Stored)],
    ) -> Result<()>
    where
        C: sqlx::Connection,
        C::Database: Native,
        <C::Database as Native>::Driver: RecordSql,
    {
        super::fold_changes::<<C::Database as Native>::Driver>(conn, tenant, runs).await
    }

    pub(crate) async fn context_in<DB>(
        tx: &mut sqlx::Transaction<'_, DB>,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<Option<Value>>
    where
        DB: Native,
        DB::Driver: RecordSql,
    {
        super::context_in::<DB::Driver>(&mut **tx, tenant, run).await
    }

    pub(crate) async fn jobs_gone_outside_a_record<DB>(
        tx: &mut sqlx::Transaction<'_, DB>,
        tenant: &TenantId,
        run: &RunId,
        ended: bool,
    ) -> Result<()>
    where
        DB: Native,
        DB::Driver: RecordSql,
    {
        super::jobs_gone_outside_a_record::<DB::Driver>(&mut **tx, tenant, run, ended).await
    }
}
