//! Parallel branches in the record transaction, on either database
//! (`tok_core::parallel` has the decisions).
//!
//! A run has one job while it runs one chain of steps, and one more per
//! branch while a `parallel` step's branches run: the job that reached the
//! `parallel` step parks at it (`Resume::Branches`, never due by itself)
//! and a job per branch starts at the branch's first step, in that
//! record. Nothing in the queue is unique per run: the claim serves each
//! job on its own, so branches calling services call them at the same time
//! (a run with a subject ticket keeps its `ticket:` queue key on every
//! job, and its branches take turns, as runs on one ticket always do).
//!
//! Every record of a run locks the run's row under its fence (PostgreSQL)
//! or is written by the one writer (SQLite), so the records of one run's
//! branches are written one after another. That is what makes the join
//! happen once: a branch's end adds the branch to the parked job's
//! `Resume::Branches` and makes the job due when the last one is in; a
//! failed branch makes it due at once and deletes the parallel step's
//! other branch jobs (a step of theirs in flight loses its lease). And it
//! is what lets branches share the run's context: a branch's record writes
//! its steps' outputs over the context as it is now, not the copy its
//! claim read, and adds its actions to the run's count.
//!
//! One race is left to PostgreSQL's deadlock detection: a failed branch's
//! record (holding the run's row) deletes a sibling's job while that
//! sibling's own record holds the job's row and waits for the run's. One of
//! the two transactions is aborted; its job comes back after its lease and
//! is recorded (or found gone) then.
//!
//! The statements that read the database clock are the record's, worded
//! for each database once ([`RecordSql`]). The record's queries, still
//! written once per backend with sqlx, reach these functions through
//! [`native`].

use std::collections::HashMap;

use serde_json::Value;
use tok_core::context::Context;

use super::RecordSql;
use super::contexts::{Stored, fold_changes};
use crate::rows::{Fenced, now_ms};
use crate::sql::{Conn, Driver, on};
use crate::{ClaimedJob, NextJob, Record, Result, Resume, StepStatus, StoreError};

/// A job of the run `$1` of tenant `$2` at `$3` due now, on the queue key
/// `$4`, made at `$5`, held (`$6`) while the run is paused.
pub(crate) fn start_branch_sql<D: Driver>() -> String {
    format!(
        "INSERT INTO jobs (run_id, tenant_id, path, run_after, attempts,
                    queue_key, priority, created_at, held)
                 SELECT $1, $2, $3, {}, 0, $4, priority, $5, $6 FROM runs WHERE tenant_id = $2 AND id = $1",
        D::DB_NOW
    )
}

/// The parked job `$2` of tenant `$1` counts a branch: its `resume` is
/// `$3`, and it is due now when `$4`.
pub(crate) fn join_branch_sql<D: Driver>() -> String {
    format!(
        "UPDATE jobs SET resume = $3,
                    run_after = CASE WHEN $4 THEN {} ELSE run_after END
                 WHERE tenant_id = $1 AND id = $2",
        D::DB_NOW
    )
}

/// For each record of a job inside a branch: the run's context with the
/// record's publications written over it, and the run's actions with the
/// record's added. `None` for every other record. Records of one run in
/// one batch are merged in order, and each gets the result of all of them.
pub(crate) async fn merged_contexts<D: RecordSql>(
    conn: &mut Conn<D>,
    items: &[(ClaimedJob, Record, Fenced)],
) -> Result<Vec<Option<(Value, i32)>>> {
    let mut runs: HashMap<String, (Context, i32)> = HashMap::new();
    let mut of_run = Vec::with_capacity(items.len());
    for (job, record, _) in items {
        if !tok_core::parallel::in_branch(&job.path) {
            of_run.push(None);
            continue;
        }
        let key = job.run_id.to_string();
        if !runs.contains_key(&key) {
            let row = on(
                "runs",
                "SELECT context, actions, context_upto, tail_since FROM runs
                 WHERE tenant_id = $1 AND id = $2",
            )
            .text(job.tenant_id.as_str())
            .text(job.run_id.as_str())
            .fetch_optional::<D>(conn)
            .await?
            .ok_or(StoreError::Database(sqlx::Error::RowNotFound))?;
            let mut context = row.json::<Value>("context")?;
            let stored = Stored::of(&row)?;
            fold_changes::<D>(
                conn,
                &job.tenant_id,
                &mut [(key.as_str(), &mut context, stored)],
            )
            .await?;
            let actions = row.int32("actions")?;
            runs.insert(key.clone(), (Context::from_value(context), actions));
        }
        if let Some((context, actions)) = runs.get_mut(&key) {
            for step in &record.steps {
                if let (StepStatus::Completed, Some(Value::Object(outputs))) =
                    (step.status, &step.output)
                {
                    // A `for_each` item's steps publish into its entry.
                    tok_core::for_each::publish(context, &step.path, &step.step_id, outputs);
                }
            }
            // The steps it completed that have compensations, too.
            tok_core::compensation::merge(context, &record.context);
            *actions += record.actions - job.actions;
        }
        of_run.push(Some(key));
    }
    Ok(of_run
        .into_iter()
        .map(|key| {
            let (context, actions) = runs.get(&key?)?;
            Some((context.to_value(), *actions))
        })
        .collect())
}

/// The branch jobs of records that fork, and the joins of records that end
/// a branch (after the batch's jobs moved on).
pub(crate) async fn fork_and_join<D: RecordSql>(
    conn: &mut Conn<D>,
    items: &[(ClaimedJob, Record, Fenced)],
) -> Result<()> {
    let now = now_ms();
    let mut woke = false;
    for (job, record, current) in items {
        let queue_key = record
            .subject_ticket_id
            .as_ref()
            .map(|t| format!("ticket:{t}"));
        let held = current.status == "paused";
        let start = BranchStart {
            queue_key: queue_key.as_deref(),
            held,
            now,
        };
        match &record.next {
            NextJob::Fork { branches, .. } => {
                for (_, path) in branches {
                    start_branch::<D>(conn, job, path, &start).await?;
                }
                woke = true;
            }
            NextJob::BranchDone {
                parallel,
                branch,
                failed,
            } => {
                woke |= join_branch::<D>(conn, job, parallel, *branch, failed.as_deref(), &start)
                    .await?;
            }
            _ => {}
        }
        // A run that ended by a parallel step's failure (or inside a
        // branch) keeps no job of a branch a failure raced with.
        let parallel = tok_core::parallel::in_branch(&job.path)
            || record.steps.iter().any(|s| {
                s.kind == tok_core::parallel::PARALLEL || s.kind == tok_core::for_each::FOR_EACH
            });
        if record.status.is_final() && parallel {
            for sql in [
                "DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2",
                "DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2",
            ] {
                on("jobs", sql)
                    .text(job.tenant_id.as_str())
                    .text(job.run_id.as_str())
                    .execute::<D>(conn)
                    .await?;
            }
        }
    }
    if woke && !D::NOTIFY_WORK.is_empty() {
        on("jobs", D::NOTIFY_WORK).execute::<D>(conn).await?;
    }
    Ok(())
}

/// How a record starts a branch's job: the run's queue key, held while the
/// run is paused.
struct BranchStart<'a> {
    queue_key: Option<&'a str>,
    held: bool,
    now: i64,
}

/// A job of the run of `job` at `path`, the first step of a branch (or of
/// a `for_each` item), due now.
async fn start_branch<D: RecordSql>(
    conn: &mut Conn<D>,
    job: &ClaimedJob,
    path: &str,
    start: &BranchStart<'_>,
) -> Result<()> {
    on("jobs", &D::statements().start_branch)
        .text(job.run_id.as_str())
        .text(job.tenant_id.as_str())
        .text(path)
        .opt_text(start.queue_key)
        .int(start.now)
        .bool(start.held)
        .execute::<D>(conn)
        .await?;
    Ok(())
}

/// Branch `branch` of the parallel step at `parallel` is over: the step's
/// parked job counts it, and is due when every branch is done or this one
/// failed (the others' jobs and waits then go). For a `for_each` step
/// (`branch` is an item), the next item not started starts in its place,
/// and the step is due once its completion rule is met, its items still
/// running cancelled. Returns whether a job became due.
async fn join_branch<D: RecordSql>(
    conn: &mut Conn<D>,
    job: &ClaimedJob,
    parallel: &str,
    branch: usize,
    failed: Option<&str>,
    start: &BranchStart<'_>,
) -> Result<bool> {
    let parked = on(
        "jobs",
        "SELECT id, resume FROM jobs WHERE tenant_id = $1 AND run_id = $2 AND path = $3",
    )
    .text(job.tenant_id.as_str())
    .text(job.run_id.as_str())
    .text(parallel)
    .fetch_optional::<D>(conn)
    .await?;
    // The parallel step's job is gone: its run was cancelled, or another
    // branch failed first. Nothing is left to join.
    let Some(parked) = parked else {
        return Ok(false);
    };
    let Some(Resume::Branches {
        total,
        mut done,
        failed: before,
        mut items,
    }) = parked.opt_json::<Resume>("resume")?
    else {
        return Ok(false);
    };
    if before.is_some() {
        return Ok(false);
    }
    if !done.contains(&branch) {
        done.push(branch);
    }
    let failed = failed.map(|e| match items {
        Some(_) => format!("item {branch} failed: {e}"),
        None => format!("branch {branch} failed: {e}"),
    });
    let mut next_item = None;
    let over = match &mut items {
        _ if failed.is_some() => true,
        None => done.len() >= total,
        Some(items) if done.len() >= items.need => {
            items.cancelled = (0..items.started).filter(|n| !done.contains(n)).collect();
            true
        }
        Some(items) => {
            if items.started < total {
                next_item = Some(items.started);
                items.started += 1;
            }
            false
        }
    };
    let id = parked.int("id")?;
    let cancels = failed.is_some() || (over && items.is_some());
    let inside = match items {
        Some(_) => format!("{parallel}.items.%"),
        None => format!("{parallel}.branches.%"),
    };
    let resume = Resume::Branches {
        total,
        done,
        failed: failed.clone(),
        items,
    };
    let resume = serde_json::to_value(&resume)
        .map_err(|e| StoreError::Database(sqlx::Error::Encode(e.into())))?;
    on("jobs", &D::statements().join_branch)
        .text(job.tenant_id.as_str())
        .int(id)
        .json(&resume)
        .bool(over)
        .execute::<D>(conn)
        .await?;
    if cancels {
        for sql in [
            "DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2 AND path LIKE $3",
            "DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2 AND path LIKE $3",
        ] {
            on("jobs", sql)
                .text(job.tenant_id.as_str())
                .text(job.run_id.as_str())
                .text(&inside)
                .execute::<D>(conn)
                .await?;
        }
    }
    if let Some(n) = next_item {
        let path = tok_core::for_each::item_start(parallel, n);
        start_branch::<D>(conn, job, &path, start).await?;
    }
    Ok(over || next_item.is_some())
}

/// The functions above for the record's queries, still written once per
/// backend with sqlx (`record_sql.rs`), by the names those call: each
/// finds its database from the sqlx transaction it is given. They go once
/// the record transaction has moved.
pub(crate) mod native {
    use serde_json::Value;

    use crate::record::RecordSql;
    use crate::rows::Fenced;
    use crate::sql::Native;
    use crate::{ClaimedJob, Record, Result};

    pub(crate) async fn merged_contexts<DB>(
        tx: &mut sqlx::Transaction<'_, DB>,
        items: &[(ClaimedJob, Record, Fenced)],
    ) -> Result<Vec<Option<(Value, i32)>>>
    where
        DB: Native,
        DB::Driver: RecordSql,
    {
        super::merged_contexts::<DB::Driver>(&mut **tx, items).await
    }

    pub(crate) async fn fork_and_join<DB>(
        tx: &mut sqlx::Transaction<'_, DB>,
        items: &[(ClaimedJob, Record, Fenced)],
    ) -> Result<()>
    where
        DB: Native,
        DB::Driver: RecordSql,
    {
        super::fork_and_join::<DB::Driver>(&mut **tx, items).await
    }
}
