//! A run's context as it is now, for both backends (see `rows.rs` for why a
//! macro per file).
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
//! delete (`retention_sql.rs`).
//!
//! Every reader of a run's context reads it through [`fold_changes`]: the
//! claim, the run's detail, search, a cancel's compensation, a branch's
//! merge. A run that ends outside a record (a cancel, a timeout) has its
//! context written whole there too.

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

macro_rules! impl_contexts {
    (
        db = $db:ty,
    ) => {
        /// [`Stored`](crate::contexts_sql::Stored) of a row that has the
        /// run's `context_upto` and `tail_since`.
        fn stored_of(row: &<$db as sqlx::Database>::Row) -> $crate::contexts_sql::Stored {
            $crate::contexts_sql::Stored {
                upto: row.get("context_upto"),
                since: row.get("tail_since"),
            }
        }

        /// Folds over each run's stored context the changes its step rows
        /// recorded since, in the order they were written: each context as
        /// it is now. `runs` are (run id, its stored context, where it
        /// stands); one statement reads the changes of them all, none is
        /// read when no run has changes.
        async fn fold_changes<'c, E>(
            ex: E,
            tenant: &TenantId,
            runs: &mut [(&str, &mut Value, $crate::contexts_sql::Stored)],
        ) -> Result<()>
        where
            E: sqlx::Executor<'c, Database = $db>,
        {
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
            let rows = sqlx::query(concat!(
                "SELECT run_id, id, context_delta FROM run_steps
                 WHERE tenant_id = $1 AND run_id ", any_of!(2), " AND id > $3
                   AND created_at >= $4 AND context_delta IS NOT NULL
                 ORDER BY run_id, id"
            ))
            .bind(tenant.as_str())
            .bind(list(changed.iter().copied()))
            .bind(upto)
            .bind(since.saturating_sub($crate::contexts_sql::CLOCK_SKEW_MS))
            .fetch_all(ex)
            .await?;
            for row in &rows {
                let run: &str = row.get("run_id");
                let id: i64 = row.get("id");
                let Some((_, context, stored)) = runs.iter_mut().find(|(r, _, _)| *r == run) else {
                    continue;
                };
                if id <= stored.upto {
                    continue;
                }
                match row.try_get::<Json<tok_core::context::ContextDelta>, _>("context_delta") {
                    Ok(Json(delta)) => delta.apply(context),
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

        /// The context of one run as it is now, in the caller's
        /// transaction; `None` when the run is not there.
        async fn context_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            run: &RunId,
        ) -> Result<Option<Value>> {
            let row = sqlx::query(
                "SELECT context, context_upto, tail_since FROM runs WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.as_str())
            .bind(run.as_str())
            .fetch_optional(&mut **tx)
            .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let mut context = row.get::<Json<Value>, _>("context").0;
            let stored = stored_of(&row);
            fold_changes(&mut **tx, tenant, &mut [(run.as_str(), &mut context, stored)]).await?;
            Ok(Some(context))
        }

        /// Writes the run's context whole, as it is now, when steps changed
        /// it since it last was (retention before it deletes their rows; a
        /// run that ends outside a record). Returns whether it wrote.
        async fn write_whole_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            run: &RunId,
        ) -> Result<bool> {
            let row = sqlx::query(
                "SELECT context, context_upto, tail_since FROM runs WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.as_str())
            .bind(run.as_str())
            .fetch_optional(&mut **tx)
            .await?;
            let Some(row) = row else {
                return Ok(false);
            };
            let stored = stored_of(&row);
            if stored.since.is_none() {
                return Ok(false);
            }
            let mut context = row.get::<Json<Value>, _>("context").0;
            fold_changes(&mut **tx, tenant, &mut [(run.as_str(), &mut context, stored)]).await?;
            let whole = $crate::rows::raw_json(&context)?;
            sqlx::query(
                "UPDATE runs SET context = $3, context_bytes = $4,
                    context_upto = COALESCE((SELECT MAX(s.id) FROM run_steps s
                        WHERE s.tenant_id = runs.tenant_id AND s.run_id = runs.id), 0),
                    tail_since = NULL, tail_bytes = 0
                 WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.as_str())
            .bind(run.as_str())
            .bind(Json(&*whole))
            .bind(whole.get().len() as i64)
            .execute(&mut **tx)
            .await?;
            Ok(true)
        }

        /// The run's jobs were deleted outside a record (a cancel, a
        /// timeout): no job goes on where its row said (a job made after
        /// may even take the same id, on SQLite), and a run that ended so
        /// has its context written whole, as a record that ends a run does.
        async fn jobs_gone_outside_a_record(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            run: &RunId,
            ended: bool,
        ) -> Result<()> {
            sqlx::query(
                "UPDATE runs SET cursor_job = NULL, cursor_path = NULL, cursor_base = NULL
                 WHERE tenant_id = $1 AND id = $2 AND cursor_job IS NOT NULL",
            )
            .bind(tenant.as_str())
            .bind(run.as_str())
            .execute(&mut **tx)
            .await?;
            if ended {
                write_whole_in(tx, tenant, run).await?;
            }
            Ok(())
        }
    };
}

pub(crate) use impl_contexts;
