//! Writing a claim's outcome for both backends: the records' group commit,
//! the fence of a claim, and the statements that move jobs on and write
//! step rows and runs' new states (see `rows.rs` for why a macro per file).

/// The `SET` list every update of a record's run begins with (the run's
/// row of a batch as `x`, the record's time at `$3`; see [`RunUpdate`]
/// for the row and `record/contexts.rs` for the context's columns): the
/// context written whole (the row's `whole`, tested on its own: reading
/// the context element as text would render it whole), where its changes
/// now begin (after the run's last step row) and its size; or the size of
/// the change its last step
/// row keeps, counted toward the run's changes since the context was
/// written whole; then where the job that goes on under its lease is, the
/// actions and the error.
///
/// [`RunUpdate`]: crate::rows::RunUpdate
macro_rules! run_record_set {
    () => {
        "context = CASE WHEN CAST(x.value ->> 12 AS INTEGER) = 1 THEN x.value -> 2
            ELSE runs.context END,
        context_bytes = CASE WHEN CAST(x.value ->> 12 AS INTEGER) = 1
            THEN CAST(x.value ->> 8 AS BIGINT) ELSE runs.context_bytes END,
        context_upto = CASE WHEN CAST(x.value ->> 12 AS INTEGER) = 1
            THEN COALESCE((SELECT MAX(s.id) FROM run_steps s
                           WHERE s.tenant_id = runs.tenant_id AND s.run_id = runs.id), 0)
            ELSE runs.context_upto END,
        tail_since = CASE WHEN CAST(x.value ->> 12 AS INTEGER) = 1 THEN NULL
            WHEN CAST(x.value ->> 8 AS BIGINT) > 0 THEN COALESCE(runs.tail_since, $3)
            ELSE runs.tail_since END,
        tail_bytes = CASE WHEN CAST(x.value ->> 12 AS INTEGER) = 1 THEN 0
            ELSE runs.tail_bytes + CAST(x.value ->> 8 AS BIGINT) END,
        cursor_job = CAST(x.value ->> 9 AS BIGINT),
        cursor_path = x.value ->> 10,
        cursor_base = CAST(x.value ->> 11 AS INTEGER),
        actions = CAST(x.value ->> 3 AS INTEGER),
        error = x.value ->> 5"
    };
}

macro_rules! impl_record {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// The records' group commit: each claim's record in one shared
        /// transaction. A record whose lease was lost writes nothing and is
        /// answered `LeaseLost`; the others go on. Text with U+0000 is made
        /// storable first (`storable.rs`); when the database still refuses
        /// the batch over one row's data, each record is written in a
        /// transaction of its own, and a record refused alone fails its run
        /// instead (`storable::refused_record`), so that its step does not
        /// run again and again while its batch-mates are written.
        pub(crate) async fn record_batch(
            pool: &sqlx::Pool<$db>,
            mut items: Vec<(ClaimedJob, Record)>,
        ) -> Result<Vec<Result<bool>>> {
            for (_, record) in &mut items {
                $crate::storable::mend_record(record);
            }
            let (refusal, items) = match record_together(pool, items).await? {
                Ok(answers) => return Ok(answers),
                Err(refused) => refused,
            };
            tracing::warn!(error = %refusal, records = items.len(),
                "the database refused a record batch; writing its records one by one");
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let answer = match record_together(pool, vec![item]).await? {
                    Ok(mut one) => one.pop().unwrap_or(Ok(false)),
                    Err((refusal, mut one)) => {
                        let (job, record) = one.pop().expect("the record refused");
                        tracing::error!(job = %job.id, run = %job.run_id, error = %refusal,
                            "the database refused a record; its run fails");
                        let failed = $crate::storable::refused_record(&job, &record, now_ms());
                        match record_together(pool, vec![(job, failed)]).await? {
                            // The job went: it does not stay leased.
                            Ok(mut one) => one.pop().unwrap_or(Ok(false)).map(|_| false),
                            Err((refusal, _)) => Err(refusal),
                        }
                    }
                };
                out.push(answer);
            }
            Ok(out)
        }

        /// [`record_batch`]'s records in one transaction: an answer per
        /// record, or, when the database refused a row's data, the refusal
        /// and the records (nothing of them written).
        async fn record_together(
            pool: &sqlx::Pool<$db>,
            items: Vec<(ClaimedJob, Record)>,
        ) -> Result<
            std::result::Result<Vec<Result<bool>>, (StoreError, Vec<(ClaimedJob, Record)>)>,
        > {
            let mut tx = pool.begin().await?;
            if !plan_prelude!().is_empty() {
                sqlx::Executor::execute(&mut *tx, plan_prelude!()).await?;
            }
            let held = fenced_statuses(&mut tx, items.iter().map(|(job, _)| job)).await?;
            // Fenced records with their run's status; the lost ones apart.
            let mut fenced = Vec::with_capacity(items.len());
            let mut lost = Vec::new();
            let mut kept = Vec::with_capacity(items.len());
            for (job, record) in items {
                // By claim, not by job: two executions of one job (the
                // first one's lease lost while it ran) may share a batch, and
                // only the one holding the current token is written.
                match held.get(&(job.id.0, job.claim_token.clone())) {
                    Some(held) => {
                        kept.push(true);
                        fenced.push((job, record, held.clone()));
                    }
                    None => {
                        kept.push(false);
                        lost.push((job, record));
                    }
                }
            }
            let written = async {
                let continued = write_records(&mut tx, &fenced).await?;
                ended_outside_the_decider(&mut tx, &fenced).await?;
                tx.commit().await?;
                Result::Ok(continued)
            }
            .await;
            let continued = match written {
                Ok(continued) => continued,
                Err(e) if $crate::storable::refused_row(&e) => {
                    let (mut fenced, mut lost) = (fenced.into_iter(), lost.into_iter());
                    let items = kept
                        .into_iter()
                        .filter_map(|kept| match kept {
                            true => fenced.next().map(|(job, record, _)| (job, record)),
                            false => lost.next(),
                        })
                        .collect();
                    return Ok(Err((e, items)));
                }
                Err(e) => return Err(e),
            };
            let (mut continued, mut lost) = (continued.into_iter(), lost.into_iter());
            Ok(Ok(kept
                .into_iter()
                .map(|kept| match kept {
                    true => Ok(continued.next().unwrap_or(false)),
                    false => Err(StoreError::LeaseLost(
                        lost.next().map(|(job, _)| job.id).unwrap_or(JobId(0)),
                    )),
                })
                .collect()))
        }

        /// A record of the group commit carries no effects, so a run it fails
        /// failed outside the decider (a job path that no longer reads, a
        /// record the database refused) and no `NotifyParent` effect told
        /// the run waiting on it: it learns it here, the same way.
        async fn ended_outside_the_decider(
            tx: &mut sqlx::Transaction<'_, $db>,
            items: &[(ClaimedJob, Record, $crate::rows::Fenced)],
        ) -> Result<()> {
            for (job, record, _) in items {
                if record.status != RunStatus::Failed
                    || tok_core::children::parent_of(&record.context).is_none()
                {
                    continue;
                }
                let ended = RunEnded {
                    run_id: job.run_id.to_string(),
                    status: record.status,
                    output: Value::Null,
                    error: record.error.clone(),
                };
                run_ended_in(tx, &job.tenant_id, &ended).await?;
            }
            Ok(())
        }

        /// Writes the line each run that ended writes in its ticket's trace
        /// (its subject ticket; a run without one writes none), naming its
        /// automation and how it ended (`tok_core::incident::run_ended_trace`),
        /// in the transaction that ends the run. `ends` are (tenant, run,
        /// final status, error).
        async fn trace_run_ends(
            tx: &mut sqlx::Transaction<'_, $db>,
            ends: &[(&TenantId, &RunId, RunStatus, Option<&str>)],
        ) -> Result<()> {
            for (tenant, run, status, error) in ends {
                let row = sqlx::query(
                    "SELECT r.subject_ticket_id, r.automation_id, a.name FROM runs r
                     JOIN automations a ON a.tenant_id = r.tenant_id AND a.id = r.automation_id
                     WHERE r.tenant_id = $1 AND r.id = $2",
                )
                .bind(tenant.as_str())
                .bind(run.as_str())
                .fetch_optional(&mut **tx)
                .await?;
                let Some(row) = row else {
                    continue;
                };
                let Some(ticket) = row.get::<Option<String>, _>("subject_ticket_id") else {
                    continue;
                };
                let name: String = row.get("name");
                let Some((kind, message)) =
                    tok_core::incident::run_ended_trace(&name, *status, *error)
                else {
                    continue;
                };
                let cause = Cause {
                    run_id: Some((*run).clone()),
                    automation_id: Some(AutomationId::from(row.get::<String, _>("automation_id"))),
                    depth: 0,
                    actor: String::new(),
                };
                trace_in(&mut **tx, tenant, &ticket, kind, &message, &cause).await?;
            }
            Ok(())
        }

        /// Writes step rows, one statement for all of them, each with its
        /// record's change of the context where it has one (in its row, or
        /// apart: `CHANGES_APART`).
        async fn insert_steps(
            tx: &mut sqlx::Transaction<'_, $db>,
            steps: &[$crate::rows::StepRow<'_>],
            now: i64,
        ) -> Result<()> {
            if steps.is_empty() {
                return Ok(());
            }
            let apart: Vec<$crate::rows::StepRow<'_>>;
            let (steps, changes) = match CHANGES_APART {
                true => {
                    let changes: Vec<Option<&str>> =
                        steps.iter().map(|s| s.change.map(|c| c.get())).collect();
                    apart = steps
                        .iter()
                        .map(|s| $crate::rows::StepRow { change: None, ..*s })
                        .collect();
                    (apart.as_slice(), changes)
                }
                false => (steps, Vec::new()),
            };
            let query = sqlx::query(concat!(
                "INSERT INTO run_steps (run_id, tenant_id, path, step_id, type, attempt,
                    status, input, output, error, log, started_at, finished_at, created_at,
                    context_delta)
                 SELECT x.value ->> 0, x.value ->> 1, x.value ->> 2,
                    x.value ->> 3, x.value ->> 4,
                    CAST(x.value ->> 5 AS INTEGER), x.value ->> 6,
                    NULLIF(x.value -> 7, 'null'), NULLIF(x.value -> 8, 'null'),
                    x.value ->> 9, x.value -> 10,
                    CAST(x.value ->> 11 AS BIGINT),
                    CAST(x.value ->> 12 AS BIGINT), $2, ", step_change!(), "
                 FROM ", batch_rows!(1), "
                 ORDER BY x.key"
            ))
            .bind(Json(steps))
            .bind(now);
            let query = match CHANGES_APART {
                true => query.bind(list(changes)),
                false => query,
            };
            query.execute(&mut **tx).await?;
            Ok(())
        }

        /// The fence of a batch of claims: the jobs whose claim token
        /// still holds, with what their records need of their runs
        /// ([`Fenced`](crate::rows::Fenced)), keyed by (job, claim token).
        /// A job missing from the answer has lost its lease.
        ///
        /// On PostgreSQL the runs' rows are locked, in one order, by a
        /// statement of their own, and the jobs are read after it: every
        /// change of a job's claim (a claim, a cancel, a branch's failure)
        /// locks its run's row first, so the second statement, whose
        /// snapshot begins after the lock was granted, sees the token that
        /// holds. The jobs' rows are not locked: a job that goes on under
        /// its lease is not written at all (its run's row says where it is),
        /// and the record that moves or deletes one locks it as it does.
        async fn fenced_statuses<'j>(
            tx: &mut sqlx::Transaction<'_, $db>,
            jobs: impl Iterator<Item = &'j ClaimedJob>,
        ) -> Result<std::collections::HashMap<(i64, String), $crate::rows::Fenced>> {
            let jobs: Vec<&ClaimedJob> = jobs.collect();
            if !lock_rows!().is_empty() {
                sqlx::query(concat!(
                    "SELECT id FROM runs WHERE tenant_id ", unindexed_any_of!(1),
                    " AND id ", any_of!(2), " ORDER BY id ", lock_rows!()
                ))
                .bind(list(jobs.iter().map(|job| job.tenant_id.as_str())))
                .bind(list(jobs.iter().map(|job| job.run_id.as_str())))
                .execute(&mut **tx)
                .await?;
            }
            let rows: Vec<$crate::rows::FenceRow> = jobs
                .iter()
                .map(|job| $crate::rows::FenceRow {
                    id: job.id.0,
                    tenant_id: &job.tenant_id,
                    token: &job.claim_token,
                })
                .collect();
            // `r.actions`, not in the index `runs_tenant_status`, keeps
            // SQLite's planner from reading the tenant's runs through that
            // covering index instead of seeking `(tenant_id, id)`; on
            // PostgreSQL the run is found by its key alone (a plan that
            // seeks by tenant reads all of the tenant's runs).
            Ok(sqlx::query(concat!(
                "SELECT j.id, j.claim_token, r.status, r.actions, r.tail_bytes, r.context_bytes
                 FROM ", batch_rows!(1), "
                 JOIN jobs j ON j.id = CAST(x.value ->> 0 AS BIGINT)
                    AND j.tenant_id = x.value ->> 1
                    AND j.claim_token = x.value ->> 2
                 JOIN runs r ON r.tenant_id ", unindexed!(), " = j.tenant_id AND r.id = j.run_id
                 WHERE j.id ", any_of!(2), "
                 ORDER BY j.id"
            ))
            .bind(Json(&rows))
            .bind(list(jobs.iter().map(|job| job.id.0)))
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|r| {
                let claim = (r.get::<i64, _>("id"), r.get::<String, _>("claim_token"));
                let fenced = $crate::rows::Fenced {
                    status: r.get::<String, _>("status"),
                    tail_bytes: r.get::<i64, _>("tail_bytes"),
                    context_bytes: r.get::<i64, _>("context_bytes"),
                };
                (claim, fenced)
            })
            .collect())
        }

        /// The end of record transactions: each job moves on (or goes), the
        /// step rows and the runs' new states are written, a statement each
        /// for the whole batch. The jobs were fenced by the caller, and
        /// `fenced` has each run's status read under that fence: a run
        /// paused meanwhile stays paused, its job held back.
        ///
        /// A record whose run goes on under the same lease (`Continue`,
        /// outside a parallel branch) leaves its job's row as it was
        /// claimed: the run's row carries where the job is now (`cursor_*`).
        /// And a record keeps what it changed of its run's context in its
        /// last step row rather than writing the context whole again
        /// (`record/contexts.rs` says when it is written whole). So a step that
        /// goes on writes two rows, its step row and its run's row, and
        /// neither grows with the run.
        ///
        /// Returns, per record, whether the job stays leased for a `Continue`.
        async fn write_records(
            tx: &mut sqlx::Transaction<'_, $db>,
            items: &[(ClaimedJob, Record, $crate::rows::Fenced)],
        ) -> Result<Vec<bool>> {
            use serde_json::value::RawValue;
            if items.is_empty() {
                return Ok(Vec::new());
            }
            let now = now_ms();
            let mut parked = settle_waits(tx, &items).await?;
            // A branch's job writes its publications over the run's
            // current context (`record/branches.rs`), not its own copy.
            let merged = merged_contexts(tx, items).await?;
            // What each record writes of its run's context: the context
            // whole, or its change in its last step row (serialized once,
            // here, so that its size is known), or nothing.
            enum Written {
                Whole(Box<RawValue>),
                Change(Box<RawValue>),
                Unchanged,
            }
            let mut written = Vec::with_capacity(items.len());
            for (i, (job, record, fenced)) in items.iter().enumerate() {
                let whole = |context: &Value| $crate::rows::raw_json(context).map(Written::Whole);
                written.push(match (&merged[i], &record.changed) {
                    (Some((context, _)), _) => whole(context)?,
                    (None, ContextChange::Whole) => whole(&record.context)?,
                    // A run that ends keeps its context whole, as it is.
                    (None, ContextChange::Kept) if record.status.is_final() => {
                        let context = context_in(tx, &job.tenant_id, &job.run_id).await?;
                        whole(&context.unwrap_or_default())?
                    }
                    (None, ContextChange::Kept) => Written::Unchanged,
                    (None, ContextChange::Keys(_))
                        if record.steps.is_empty() || record.status.is_final() =>
                    {
                        whole(&record.context)?
                    }
                    (None, ContextChange::Keys(keys)) if keys.is_empty() => Written::Unchanged,
                    (None, ContextChange::Keys(keys)) => {
                        let change = $crate::rows::raw_json(&tok_core::context::Changes::of(
                            &record.context,
                            keys,
                        ))?;
                        let size = change.get().len() as i64;
                        match $crate::record::contexts::outgrown(
                            fenced.tail_bytes,
                            fenced.context_bytes,
                            size,
                        ) {
                            true => whole(&record.context)?,
                            false => Written::Change(change),
                        }
                    }
                });
            }
            let mut continued = Vec::with_capacity(items.len());
            let mut moves = Vec::new();
            let mut moved_ids = Vec::new();
            let mut done = Vec::new();
            let mut steps = Vec::new();
            let mut runs = Vec::with_capacity(items.len());
            let mut staying = Vec::with_capacity(items.len());
            for (i, (job, record, fenced)) in items.iter().enumerate() {
                let current = fenced.status.as_str();
                let actions = match &merged[i] {
                    Some((_, actions)) => *actions,
                    None => record.actions,
                };
                let paused = current == "paused" && !record.status.is_final();
                let status = if paused { RunStatus::Paused } else { record.status };
                let queue_key = record.subject_ticket_id.as_ref().map(|t| format!("ticket:{t}"));
                // A paused run's job is released and held back, never kept.
                let next = match &record.next {
                    NextJob::Continue { path, .. } if paused => {
                        NextJob::Step { path: path.clone(), delay_ms: 0 }
                    }
                    next => next.clone(),
                };
                continued.push(matches!(next, NextJob::Continue { .. }));
                // A job that goes on under its lease stays as it was: the
                // run's row says where it is. A branch's job writes its own
                // row (a run's branches go on side by side, and its row has
                // room for one).
                let cursor = match &record.next {
                    NextJob::Continue { path, .. }
                        if !paused && !tok_core::parallel::in_branch(&job.path) =>
                    {
                        Some(path.as_str())
                    }
                    _ => None,
                };
                // Continue in a branch keeps the lease under its token (and
                // leaves `run_after`, an indexed column, alone, so PostgreSQL
                // can update the row in place); Step and Retry release it. A wait parks the job (released, due at its
                // timeout) or resumes it at once with a buffered signal:
                // `settle_waits` decided which.
                let parked = match next {
                    NextJob::Wait { .. } | NextJob::WaitForRuns { .. } | NextJob::Fork { .. } => {
                        parked.remove(&job.id.0)
                    }
                    _ => None,
                };
                let (run_at, resume) = match (parked, &next) {
                    (Some($crate::rows::Parked { run_at, resume }), _) => (run_at, Some(resume)),
                    // A step a limit held back says so until its next claim.
                    (None, NextJob::Retry { held, .. }) => (None, held.clone()),
                    (None, _) => (None, None),
                };
                let (path, delay_ms, attempts, token, lease_ms) = match next {
                    NextJob::Continue { path, lease_ms, .. } => {
                        (path, 0, 1, Some(job.claim_token.clone()), lease_ms)
                    }
                    NextJob::Step { path, delay_ms } => (path, delay_ms, 0, None, 0),
                    NextJob::Retry { path, attempts, delay_ms, .. } => (path, delay_ms, attempts, None, 0),
                    NextJob::Wait { path, .. }
                    | NextJob::WaitForRuns { path, .. }
                    | NextJob::Fork { path, .. } => (path, 0, 0, None, 0),
                    NextJob::Done | NextJob::BranchDone { .. } => {
                        done.push(job.id.0);
                        (String::new(), 0, 0, None, 0)
                    }
                };
                if cursor.is_none() && !matches!(record.next, NextJob::Done | NextJob::BranchDone { .. }) {
                    moved_ids.push(job.id.0);
                    moves.push($crate::rows::JobMove {
                        id: job.id.0,
                        tenant_id: &job.tenant_id,
                        path,
                        delay_ms,
                        attempts,
                        token,
                        lease_ms,
                        held: paused,
                        queue_key,
                        run_at,
                        resume,
                    });
                }
                let change = match &written[i] {
                    Written::Change(change) => Some(&**change),
                    _ => None,
                };
                let last = record.steps.len().saturating_sub(1);
                for (n, step) in record.steps.iter().enumerate() {
                    steps.push($crate::rows::StepRow {
                        run_id: &job.run_id,
                        tenant_id: &job.tenant_id,
                        step,
                        change: change.filter(|_| n == last),
                    });
                }
                // A run whose status and ticket stay is updated without
                // naming them where the backend asks for it: SQLite rewrites
                // the entries of every index on a column the `SET` list
                // names, changed or not. (PostgreSQL compares the values, and
                // one statement is one round trip less.)
                let stays = UPDATE_STAYING_RUNS_APART
                    && status.as_str() == current
                    && (record.subject_ticket_id.is_none()
                        || record.subject_ticket_id == job.subject_ticket_id);
                let runs = if stays { &mut staying } else { &mut runs };
                let (context, bytes) = match &written[i] {
                    Written::Whole(context) => (Some(&**context), context.get().len() as i64),
                    Written::Change(change) => (None, change.get().len() as i64),
                    Written::Unchanged => (None, 0),
                };
                runs.push($crate::rows::RunUpdate {
                    id: &job.run_id,
                    tenant_id: &job.tenant_id,
                    context,
                    actions,
                    status: status.as_str(),
                    error: record.error.as_deref(),
                    finished_at: status.is_final().then_some(now),
                    subject_ticket_id: record.subject_ticket_id.as_deref(),
                    bytes,
                    cursor_job: cursor.map(|_| job.id.0),
                    cursor_path: cursor,
                    cursor_base: cursor.map(|_| job.row_attempts - 1),
                    whole: i32::from(context.is_some()),
                });
            }
            // Rows are matched one by one on (id, tenant) from the batch's own
            // rows. On PostgreSQL the updates also name their rows' keys (the
            // `seek_keys!` fragment), so it seeks them by primary key whatever
            // its statistics say: a table that grew fast still looks small to
            // it, and a hash join would read all of it. SQLite plans these
            // joins from the batch's rows by itself; a key list would turn
            // its plan around (the batch scanned once per row).
            let mut moved = 0;
            if !moves.is_empty() {
                moved += sqlx::query(concat!(
                    "UPDATE jobs SET path = x.value ->> 2,
                        run_after = CASE WHEN x.value ->> 9 IS NOT NULL THEN CAST(x.value ->> 9 AS BIGINT)
                            WHEN x.value ->> 5 IS NULL
                            THEN ", db_now!(), " + CAST(x.value ->> 3 AS BIGINT)
                            ELSE jobs.run_after END,
                        resume = NULLIF(x.value -> 10, 'null'),
                        attempts = CAST(x.value ->> 4 AS INTEGER),
                        claim_token = x.value ->> 5,
                        locked_by = CASE WHEN x.value ->> 5 IS NULL THEN NULL ELSE jobs.locked_by END,
                        locked_until = CASE WHEN x.value ->> 5 IS NULL THEN NULL
                            ELSE ", db_now!(), " + CAST(x.value ->> 6 AS BIGINT) END,
                        held = CAST(x.value ->> 7 AS BOOLEAN),
                        queue_key = COALESCE(x.value ->> 8, jobs.queue_key)
                     FROM ", batch_rows!(1), "
                     WHERE jobs.id = CAST(x.value ->> 0 AS BIGINT)
                       AND jobs.tenant_id = x.value ->> 1 ", seek_keys!(jobs, 2)
                ))
                .bind(Json(&moves))
                .bind(list(moved_ids.iter().copied()))
                .execute(&mut **tx)
                .await?
                .rows_affected();
            }
            if !done.is_empty() {
                moved += sqlx::query(concat!(
                    "DELETE FROM jobs WHERE tenant_id ", unindexed_any_of!(1), " AND id ", any_of!(2)
                ))
                .bind(list(items.iter().map(|(job, _, _)| job.tenant_id.as_str())))
                .bind(list(done.iter().copied()))
                .execute(&mut **tx)
                .await?
                .rows_affected();
            }
            let expected = (moves.len() + done.len()) as u64;
            if moved != expected {
                // The caller's fence said every job was held: a job that
                // changed under it is a broken invariant, and nothing is kept.
                return Err(StoreError::Conflict(format!(
                    "{moved} of {expected} fenced jobs could be moved on"
                )));
            }
            fork_and_join(tx, items).await?;
            insert_steps(tx, &steps, now).await?;
            // What every update of a record's run sets: the context whole
            // (with where its changes now begin) or the size of the change
            // its step row keeps, where the job that goes on is, the
            // actions and the error.
            if !staying.is_empty() {
                sqlx::query(concat!(
                    "UPDATE runs SET ", $crate::record_sql::run_record_set!(), "
                     FROM ", batch_rows!(1), "
                     WHERE runs.id = x.value ->> 0 AND runs.tenant_id = x.value ->> 1 ",
                       seek_keys!(runs, 2)
                ))
                .bind(Json(&staying))
                .bind(list(staying.iter().map(|run| run.id.as_str())))
                .bind(now)
                .execute(&mut **tx)
                .await?;
            }
            if !runs.is_empty() {
                sqlx::query(concat!(
                    "UPDATE runs SET ", $crate::record_sql::run_record_set!(), ",
                        status = x.value ->> 4,
                        finished_at = COALESCE(CAST(x.value ->> 6 AS BIGINT), runs.finished_at),
                        subject_ticket_id = COALESCE(x.value ->> 7, runs.subject_ticket_id)
                     FROM ", batch_rows!(1), "
                     WHERE runs.id = x.value ->> 0 AND runs.tenant_id = x.value ->> 1 ",
                       seek_keys!(runs, 2)
                ))
                .bind(Json(&runs))
                .bind(list(runs.iter().map(|run| run.id.as_str())))
                .bind(now)
                .execute(&mut **tx)
                .await?;
            }
            // The runs these records end tell their tickets how they ended.
            let mut ends = Vec::new();
            for (job, record, fenced) in items {
                let ended_now = record.status.is_final()
                    && record.status != RunStatus::Refused
                    && !RunStatus::parse(&fenced.status).is_some_and(RunStatus::is_final);
                let ticket = record.subject_ticket_id.is_some() || job.subject_ticket_id.is_some();
                if ended_now && ticket && !ends.iter().any(|(_, run, _, _)| *run == &job.run_id) {
                    ends.push((&job.tenant_id, &job.run_id, record.status, record.error.as_deref()));
                }
            }
            trace_run_ends(tx, &ends).await?;
            Ok(continued)
        }
    };
}

pub(crate) use impl_record;
pub(crate) use run_record_set;
