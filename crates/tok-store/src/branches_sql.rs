//! Parallel branches in the record transaction, for both backends (see
//! `rows.rs` for why a macro; `tok_core::parallel` has the decisions).
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

macro_rules! impl_branches {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// For each record of a job inside a branch: the run's context
        /// with the record's publications written over it, and the run's
        /// actions with the record's added. `None` for every other record.
        /// Records of one run in one batch are merged in order, and each
        /// gets the result of all of them.
        async fn merged_contexts(
            tx: &mut sqlx::Transaction<'_, $db>,
            items: &[(ClaimedJob, Record, $crate::rows::Fenced)],
        ) -> Result<Vec<Option<(Value, i32)>>> {
            let mut runs: std::collections::HashMap<String, (tok_core::context::Context, i32)> =
                std::collections::HashMap::new();
            let mut of_run = Vec::with_capacity(items.len());
            for (job, record, _) in items {
                if !tok_core::parallel::in_branch(&job.path) {
                    of_run.push(None);
                    continue;
                }
                let key = job.run_id.to_string();
                if !runs.contains_key(&key) {
                    let row = sqlx::query(
                        "SELECT context, actions, context_upto, tail_since FROM runs
                         WHERE tenant_id = $1 AND id = $2",
                    )
                    .bind(job.tenant_id.as_str())
                    .bind(job.run_id.as_str())
                    .fetch_one(&mut **tx)
                    .await?;
                    let mut context = row.get::<Json<Value>, _>("context").0;
                    let stored = stored_of(&row)?;
                    fold_changes(
                        &mut **tx,
                        &job.tenant_id,
                        &mut [(key.as_str(), &mut context, stored)],
                    )
                    .await?;
                    let actions: i32 = row.get("actions");
                    runs.insert(
                        key.clone(),
                        (tok_core::context::Context::from_value(context), actions),
                    );
                }
                if let Some((context, actions)) = runs.get_mut(&key) {
                    for step in &record.steps {
                        if let (StepStatus::Completed, Some(Value::Object(outputs))) =
                            (step.status, &step.output)
                        {
                            // A `for_each` item's steps publish into its entry.
                            tok_core::for_each::publish(
                                context,
                                &step.path,
                                &step.step_id,
                                outputs,
                            );
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

        /// The branch jobs of records that fork, and the joins of records
        /// that end a branch (after the batch's jobs moved on).
        async fn fork_and_join(
            tx: &mut sqlx::Transaction<'_, $db>,
            items: &[(ClaimedJob, Record, $crate::rows::Fenced)],
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
                            start_branch(tx, job, path, &start).await?;
                        }
                        woke = true;
                    }
                    NextJob::BranchDone {
                        parallel,
                        branch,
                        failed,
                    } => {
                        woke |= join_branch(tx, job, parallel, *branch, failed.as_deref(), &start)
                            .await?;
                    }
                    _ => {}
                }
                // A run that ended by a parallel step's failure (or inside
                // a branch) keeps no job of a branch a failure raced with.
                let parallel = tok_core::parallel::in_branch(&job.path)
                    || record.steps.iter().any(|s| {
                        s.kind == tok_core::parallel::PARALLEL
                            || s.kind == tok_core::for_each::FOR_EACH
                    });
                if record.status.is_final() && parallel {
                    for sql in [
                        "DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2",
                        "DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2",
                    ] {
                        sqlx::query(sql)
                            .bind(job.tenant_id.as_str())
                            .bind(job.run_id.as_str())
                            .execute(&mut **tx)
                            .await?;
                    }
                }
            }
            if woke && !notify_work!().is_empty() {
                sqlx::query(notify_work!()).execute(&mut **tx).await?;
            }
            Ok(())
        }

        /// How a record starts a branch's job: the run's queue key, held
        /// while the run is paused.
        struct BranchStart<'a> {
            queue_key: Option<&'a str>,
            held: bool,
            now: i64,
        }

        /// A job of the run of `job` at `path`, the first step of a branch
        /// (or of a `for_each` item), due now.
        async fn start_branch(
            tx: &mut sqlx::Transaction<'_, $db>,
            job: &ClaimedJob,
            path: &str,
            start: &BranchStart<'_>,
        ) -> Result<()> {
            sqlx::query(concat!(
                "INSERT INTO jobs (run_id, tenant_id, path, run_after, attempts,
                    queue_key, priority, created_at, held)
                 SELECT $1, $2, $3, ",
                db_now!(),
                ", 0, $4, priority, $5, $6 FROM runs WHERE tenant_id = $2 AND id = $1"
            ))
            .bind(job.run_id.as_str())
            .bind(job.tenant_id.as_str())
            .bind(path)
            .bind(start.queue_key)
            .bind(start.now)
            .bind(start.held)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        /// Branch `branch` of the parallel step at `parallel` is over:
        /// the step's parked job counts it, and is due when every branch is
        /// done or this one failed (the others' jobs and waits then go).
        /// For a `for_each` step (`branch` is an item), the next item not
        /// started starts in its place, and the step is due once its
        /// completion rule is met, its items still running cancelled.
        /// Returns whether a job became due.
        async fn join_branch(
            tx: &mut sqlx::Transaction<'_, $db>,
            job: &ClaimedJob,
            parallel: &str,
            branch: usize,
            failed: Option<&str>,
            start: &BranchStart<'_>,
        ) -> Result<bool> {
            let parked = sqlx::query(
                "SELECT id, resume FROM jobs WHERE tenant_id = $1 AND run_id = $2 AND path = $3",
            )
            .bind(job.tenant_id.as_str())
            .bind(job.run_id.as_str())
            .bind(parallel)
            .fetch_optional(&mut **tx)
            .await?;
            // The parallel step's job is gone: its run was cancelled, or
            // another branch failed first. Nothing is left to join.
            let Some(parked) = parked else {
                return Ok(false);
            };
            let Some(Json(Resume::Branches {
                total,
                mut done,
                failed: before,
                mut items,
            })) = parked.try_get::<Option<Json<Resume>>, _>("resume")?
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
            let id: i64 = parked.get("id");
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
            sqlx::query(concat!(
                "UPDATE jobs SET resume = $3,
                    run_after = CASE WHEN $4 THEN ",
                db_now!(),
                " ELSE run_after END
                 WHERE tenant_id = $1 AND id = $2"
            ))
            .bind(job.tenant_id.as_str())
            .bind(id)
            .bind(Json(&resume))
            .bind(over)
            .execute(&mut **tx)
            .await?;
            if cancels {
                for sql in [
                    "DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2 AND path LIKE $3",
                    "DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2 AND path LIKE $3",
                ] {
                    sqlx::query(sql)
                        .bind(job.tenant_id.as_str())
                        .bind(job.run_id.as_str())
                        .bind(&inside)
                        .execute(&mut **tx)
                        .await?;
                }
            }
            if let Some(n) = next_item {
                let path = tok_core::for_each::item_start(parallel, n);
                start_branch(tx, job, &path, start).await?;
            }
            Ok(over || next_item.is_some())
        }
    };
}

pub(crate) use impl_branches;
