//! Reading and steering runs ([`RunStore`](crate::RunStore)) for both
//! backends (see `rows.rs` for why a macro per file).

macro_rules! impl_runs {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        fn run_from_row(row: &<$db as sqlx::Database>::Row) -> RunSummary {
            RunSummary {
                id: RunId::from(row.get::<String, _>("id")),
                automation_id: AutomationId::from(row.get::<String, _>("automation_id")),
                version: row.get("version"),
                event_id: EventId::from(row.get::<String, _>("event_id")),
                status: row.get("status"),
                trigger_type: row.get("trigger_type"),
                depth: row.get("depth"),
                actions: row.get("actions"),
                subject_ticket_id: row.get("subject_ticket_id"),
                parent_run_id: row.get::<Option<String>, _>("parent_run_id").map(RunId::from),
                created_at: row.get("created_at"),
                started_at: row.get("started_at"),
                finished_at: row.get("finished_at"),
                error: row.get("error"),
                priority: row.get("priority"),
                blocked_by: None,
            }
        }

        const RUN_COLUMNS: &str =
            "id, automation_id, version, event_id, status, trigger_type, depth,
            actions, subject_ticket_id, parent_run_id, created_at, started_at, finished_at, error,
            priority";

        fn step_from_row(r: &<$db as sqlx::Database>::Row) -> StepRow {
            StepRow {
                path: r.get("path"),
                step_id: r.get("step_id"),
                kind: r.get("type"),
                attempt: r.get("attempt"),
                status: r.get("status"),
                input: r.get::<Option<Json<Value>>, _>("input").map(|j| j.0),
                output: r.get::<Option<Json<Value>>, _>("output").map(|j| j.0),
                error: r.get("error"),
                log: r.get::<Json<Value>, _>("log").0,
                started_at: r.get("started_at"),
                finished_at: r.get("finished_at"),
            }
        }

        async fn steps_of<'c, E>(ex: E, tenant: &TenantId, run: &RunId) -> Result<Vec<StepRow>>
        where
            E: sqlx::Executor<'c, Database = $db>,
        {
            let rows = sqlx::query(
                "SELECT path, step_id, type, attempt, status, input, output, error, log,
                    started_at, finished_at
                 FROM run_steps WHERE tenant_id = $1 AND run_id = $2 ORDER BY id",
            )
            .bind(tenant.as_str())
            .bind(run.as_str())
            .fetch_all(ex)
            .await?;
            Ok(StepRow::as_they_became(rows.iter().map(step_from_row).collect()))
        }

        /// Cancels the unfinished run `id` in `tx` (its status checked by
        /// the caller), with `reason` as its error when given: the runs it
        /// waits for go with it, and a run with completed steps to undo goes
        /// on compensating.
        async fn cancel_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
            reason: Option<String>,
        ) -> Result<()> {
            // The runs this one waits for are cancelled with it, the
            // deepest first (see `children_sql.rs` for the lock order);
            // each cancelled run's end reaches the waits on it.
            let tree = cancel_tree(tx, tenant, id).await?;
            for run in tree.iter().rev() {
                let error = match run == id {
                    true => reason.clone(),
                    false => match run_status(tx, tenant, run).await? {
                        RunStatus::Compensating => continue,
                        status if status.is_final() => continue,
                        _ => Some(format!("cancelled with the run {id} that waited for it")),
                    },
                };
                for sql in [
                    "DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2",
                    "DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2",
                ] {
                    for_run(tx, sql, tenant, run).await?;
                }
                let undoes = compensation_start(tx, tenant, run).await?;
                jobs_gone_outside_a_record(tx, tenant, run, undoes.is_none()).await?;
                // A run with completed steps to undo goes on compensating:
                // one job hands the cancel to the decider, which runs
                // the compensations and ends the run (and tells its
                // parent) when they are done.
                if let Some(path) = undoes {
                    sqlx::query(concat!(
                        "INSERT INTO jobs (run_id, tenant_id, path, run_after, attempts, queue_key,
                            priority, created_at, resume)
                         SELECT id, tenant_id, $3, ",
                        db_now!(),
                        ", 0, CASE WHEN subject_ticket_id IS NULL THEN NULL
                            ELSE 'ticket:' || subject_ticket_id END, priority, $4, $5
                         FROM runs WHERE tenant_id = $1 AND id = $2"
                    ))
                    .bind(tenant.as_str())
                    .bind(run.as_str())
                    .bind(&path)
                    .bind(now_ms())
                    .bind(Json(&Resume::Cancel { error: error.clone() }))
                    .execute(&mut **tx)
                    .await?;
                    sqlx::query(
                        "UPDATE runs SET status = 'compensating', error = COALESCE($3, error)
                         WHERE tenant_id = $1 AND id = $2",
                    )
                    .bind(tenant.as_str())
                    .bind(run.as_str())
                    .bind(error.as_deref())
                    .execute(&mut **tx)
                    .await?;
                    continue;
                }
                sqlx::query(
                    "UPDATE runs SET status = 'cancelled', finished_at = $3,
                        error = COALESCE($4, error)
                     WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(run.as_str())
                .bind(now_ms())
                .bind(error.as_deref())
                .execute(&mut **tx)
                .await?;
                trace_run_ends(tx, &[(tenant, run, RunStatus::Cancelled, None)]).await?;
                let ended = RunEnded {
                    run_id: run.to_string(),
                    status: RunStatus::Cancelled,
                    output: Value::Null,
                    error: Some(error.unwrap_or_else(|| "the run was cancelled".into())),
                };
                run_ended_in(tx, tenant, &ended).await?;
            }
            Ok(())
        }

        /// Cancels the run unless its state does not allow it (then the
        /// reason, and nothing changed).
        pub(crate) async fn cancel_checked_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<std::result::Result<(), String>> {
            let status = run_status(tx, tenant, id).await?;
            if status == RunStatus::Compensating {
                return Ok(Err(
                    "the run is compensating: it is undoing its completed steps after a \
                     cancel or a failure, which a cancel does not interrupt; it ends \
                     cancelled or failed when they are undone"
                        .into(),
                ));
            }
            if status.is_final() {
                return Ok(Err(format!(
                    "the run is already {}; only an unfinished run can be cancelled",
                    status.as_str()
                )));
            }
            cancel_in(tx, tenant, id, None).await?;
            Ok(Ok(()))
        }

        /// The path of the step a retry of the run starts again at (its
        /// last failed step), or why the run cannot be retried.
        pub(crate) async fn retry_path_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<std::result::Result<String, String>> {
            let status = run_status(tx, tenant, id).await?;
            if status != RunStatus::Failed {
                return Ok(Err(format!(
                    "the run is {}; only a failed run can be retried",
                    status.as_str()
                )));
            }
            let failed = sqlx::query(
                "SELECT path FROM run_steps
                 WHERE tenant_id = $1 AND run_id = $2 AND status = 'failed'
                 ORDER BY id DESC LIMIT 1",
            )
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&mut **tx)
            .await?;
            let Some(failed) = failed else {
                return Ok(Err(
                    "the run failed before any step ran; start a new run instead".into(),
                ));
            };
            let compensated = sqlx::query(
                "SELECT 1 FROM run_steps
                 WHERE tenant_id = $1 AND run_id = $2 AND path LIKE '%.compensate.%'
                 LIMIT 1",
            )
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&mut **tx)
            .await?;
            if compensated.is_some() {
                return Ok(Err(
                    "the run undid its completed steps when it failed \
                     (settings.compensateOnFailure); start a new run instead"
                        .into(),
                ));
            }
            Ok(Ok(failed.get("path")))
        }

        /// Queues the failed run again at `path` (from [`retry_path_in`]),
        /// on its automation's `version` when given (else its own). A bulk
        /// retry's job ranks below its tenant's live jobs
        /// ([`tok_core::fairness::BULK_BELOW`]).
        pub(crate) async fn retry_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
            path: &str,
            version: Option<i32>,
            bulk: bool,
        ) -> Result<()> {
            // The run's ticket is its queue key, as the compensation job's
            // of `cancel_in`.
            sqlx::query(concat!(
                "INSERT INTO jobs (run_id, tenant_id, path, run_after, attempts, queue_key,
                    priority, created_at)
                 SELECT $1, $2, $3, ",
                db_now!(),
                ", 0, CASE WHEN subject_ticket_id IS NULL THEN NULL
                    ELSE 'ticket:' || subject_ticket_id END, priority - $5, $4
                 FROM runs WHERE tenant_id = $2 AND id = $1"
            ))
            .bind(id.as_str())
            .bind(tenant.as_str())
            .bind(path)
            .bind(now_ms())
            .bind(if bulk { tok_core::fairness::BULK_BELOW } else { 0 })
            .execute(&mut **tx)
            .await?;
            sqlx::query(
                "UPDATE runs SET status = 'queued', error = NULL, finished_at = NULL,
                    version = COALESCE($3, version)
                 WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.as_str())
            .bind(id.as_str())
            .bind(version)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        #[async_trait::async_trait]
        impl RunStore for $store {
            async fn cancel_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                if let Err(why) = cancel_checked_in(&mut tx, tenant, id).await? {
                    return refused(tx, StoreError::InvalidState(why)).await;
                }
                let run = summary_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn pause_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let status = run_status(&mut tx, tenant, id).await?;
                if !matches!(
                    status,
                    RunStatus::Queued | RunStatus::Running | RunStatus::Waiting
                ) {
                    return refused(tx, StoreError::InvalidState(format!(
                        "the run is {}; only a queued, running or waiting run can be paused",
                        status.as_str()
                    ))).await;
                }
                for_run(
                    &mut tx,
                    "UPDATE jobs SET held = TRUE WHERE tenant_id = $1 AND run_id = $2",
                    tenant,
                    id,
                )
                .await?;
                for_run(
                    &mut tx,
                    "UPDATE runs SET status = 'paused' WHERE tenant_id = $1 AND id = $2",
                    tenant,
                    id,
                )
                .await?;
                let run = summary_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn resume_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let status = run_status(&mut tx, tenant, id).await?;
                if status != RunStatus::Paused {
                    return refused(tx, StoreError::InvalidState(format!(
                        "the run is {}; only a paused run can be resumed",
                        status.as_str()
                    ))).await;
                }
                for_run(
                    &mut tx,
                    "UPDATE jobs SET held = FALSE WHERE tenant_id = $1 AND run_id = $2",
                    tenant,
                    id,
                )
                .await?;
                for_run(
                    &mut tx,
                    concat!(
                        "UPDATE runs SET status = CASE WHEN EXISTS (
                            SELECT 1 FROM jobs WHERE tenant_id = $1 AND run_id = $2
                              AND run_after > ",
                        db_now!(),
                        ") THEN 'waiting' ELSE 'queued' END
                     WHERE tenant_id = $1 AND id = $2"
                    ),
                    tenant,
                    id,
                )
                .await?;
                let run = summary_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn retry_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let path = match retry_path_in(&mut tx, tenant, id).await? {
                    Ok(path) => path,
                    Err(why) => return refused(tx, StoreError::InvalidState(why)).await,
                };
                retry_in(&mut tx, tenant, id, &path, None, false).await?;
                let run = summary_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn run_contexts(
                &self,
                tenant: &TenantId,
                ids: &[RunId],
            ) -> Result<Vec<(RunId, Value)>> {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(concat!(
                    "SELECT id, context, context_upto, tail_since FROM runs WHERE tenant_id = $1 AND id ",
                    any_of!(2)
                ))
                .bind(tenant.as_str())
                .bind(list(ids.iter().map(|id| id.as_str())))
                .fetch_all(self.reader())
                .await?;
                let mut contexts: Vec<(String, Value, $crate::record::contexts::Stored)> = rows
                    .iter()
                    .map(|r| Ok((r.get::<String, _>("id"), r.get::<Json<Value>, _>("context").0, stored_of(r)?)))
                    .collect::<Result<_>>()?;
                let mut folding: Vec<(&str, &mut Value, $crate::record::contexts::Stored)> = contexts
                    .iter_mut()
                    .map(|(id, context, stored)| (id.as_str(), context, *stored))
                    .collect();
                fold_changes(&mut *self.reader().acquire().await?, tenant, &mut folding).await?;
                Ok(contexts
                    .into_iter()
                    .map(|(id, context, _)| (RunId::from(id), context))
                    .collect())
            }

            async fn run_context_sizes(
                &self,
                tenant: &TenantId,
                ids: &[RunId],
            ) -> Result<Vec<(RunId, i64)>> {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                // `context_bytes` is the size a record wrote the context
                // whole at; a context never written whole by a record (a
                // run's first, as the dispatch wrote it) is measured.
                let rows = sqlx::query(concat!(
                    "SELECT id, CASE WHEN context_bytes > 0 THEN context_bytes ELSE ",
                    text_bytes!("context"),
                    " END + tail_bytes AS size FROM runs WHERE tenant_id = $1 AND id ",
                    any_of!(2)
                ))
                .bind(tenant.as_str())
                .bind(list(ids.iter().map(|id| id.as_str())))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| (RunId::from(r.get::<String, _>("id")), r.get::<i64, _>("size")))
                    .collect())
            }

            async fn runs(
                &self,
                tenant: &TenantId,
                filter: &RunFilter,
                limit: u32,
                cursor: Option<&str>,
            ) -> Result<Page<RunSummary>> {
                // Only in the text when asked: a generic plan of `$12 IS
                // NULL OR body @> $12` could not use the index.
                let (contains, contains_binds) = match &filter.body_contains {
                    Some(doc) => body_contains(doc, 12),
                    None => (String::new(), Vec::new()),
                };
                let sql = format!(
                    "SELECT {RUN_COLUMNS} FROM runs
                     WHERE tenant_id = $1
                       AND (CAST($2 AS TEXT) IS NULL OR status = $2)
                       AND (CAST($3 AS TEXT) IS NULL OR automation_id = $3)
                       AND (CAST($4 AS TEXT) IS NULL OR trigger_type = $4)
                       AND (CAST($5 AS TEXT) IS NULL OR id < $5)
                       AND (CAST($7 AS TEXT) IS NULL OR parent_run_id = $7)
                       AND ($8 = 0 OR status IN ('queued', 'running', 'waiting'))
                       AND (CAST($9 AS TEXT) IS NULL OR event_id = $9)
                       AND (CAST($10 AS BIGINT) IS NULL OR created_at >= $10)
                       AND (CAST($11 AS BIGINT) IS NULL OR created_at < $11)
                       {contains}
                     ORDER BY id DESC
                     LIMIT $6"
                );
                let mut query = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(filter.status.as_deref())
                    .bind(filter.automation_id.as_deref())
                    .bind(filter.trigger_type.as_deref())
                    .bind(cursor)
                    .bind(i64::from(limit) + 1)
                    .bind(filter.parent_run_id.as_deref())
                    .bind(i64::from(filter.unfinished))
                    .bind(filter.event_id.as_deref())
                    .bind(filter.since)
                    .bind(filter.until);
                for bind in contains_binds {
                    query = query.bind(bind);
                }
                let rows = query.fetch_all(self.reader()).await?;
                let mut items: Vec<RunSummary> = rows.iter().map(run_from_row).collect();
                let next_cursor = if items.len() > limit as usize {
                    items.truncate(limit as usize);
                    items.last().map(|r| r.id.to_string())
                } else {
                    None
                };
                fill_blocked_by(self.reader(), tenant, &mut items, None).await?;
                Ok(Page { items, next_cursor })
            }

            async fn run(&self, tenant: &TenantId, id: &RunId) -> Result<Option<RunDetail>> {
                let sql = format!(
                    "SELECT {RUN_COLUMNS}, context, context_upto, tail_since FROM runs
                     WHERE tenant_id = $1 AND id = $2"
                );
                let Some(row) = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(id.as_str())
                    .fetch_optional(self.reader())
                    .await?
                else {
                    return Ok(None);
                };
                let steps = steps_of(self.reader(), tenant, id).await?;
                let waits = waits_of(self.reader(), tenant, id).await?;
                let mut context = row.get::<Json<Value>, _>("context").0;
                fold_changes(&mut *self.reader().acquire().await?, tenant, &mut [(id.as_str(), &mut context, stored_of(&row)?)])
                    .await?;
                let mut run = [run_from_row(&row)];
                // Its waits are read above: not again.
                let known = std::collections::HashMap::from([(
                    id.to_string(),
                    waits.iter().map(tok_core::blocked::Wait::from).collect(),
                )]);
                fill_blocked_by(self.reader(), tenant, &mut run, Some(known)).await?;
                let [run] = run;
                Ok(Some(RunDetail {
                    run,
                    output: context
                        .get(tok_core::context::OUTPUT_KEY)
                        .cloned()
                        .unwrap_or(Value::Null),
                    actor: context["_event"]["actor"].clone(),
                    context,
                    steps,
                    waits,
                }))
            }
        }

        /// What holds each of `runs` that neither runs nor has ended, read
        /// from their jobs, their waits and their tenant's leases
        /// ([`tok_core::blocked::why`]), in three statements for the lot
        /// (two when the caller read their waits: `known`, by run id).
        async fn fill_blocked_by(
            db: &sqlx::Pool<$db>,
            tenant: &TenantId,
            runs: &mut [RunSummary],
            known: Option<std::collections::HashMap<String, Vec<tok_core::blocked::Wait>>>,
        ) -> Result<()> {
            use tok_core::blocked::{Job, TenantLoad, Wait};
            let live: Vec<String> = runs
                .iter()
                .filter(|r| matches!(r.status.as_str(), "queued" | "running" | "waiting"))
                .map(|r| r.id.to_string())
                .collect();
            if live.is_empty() {
                return Ok(());
            }
            let now = now_ms();
            let rows = sqlx::query(concat!(
                "SELECT j.run_id,
                    CASE WHEN r.cursor_job = j.id THEN r.cursor_path ELSE j.path END AS path,
                    j.run_after, j.held, j.resume, j.queue_key,
                    (j.locked_by IS NOT NULL AND j.locked_until >= $3) AS leased,
                    (SELECT q.run_id FROM jobs q
                     WHERE q.tenant_id = j.tenant_id AND q.queue_key = j.queue_key
                       AND q.run_id <> j.run_id
                       AND (q.locked_until >= $3
                            OR (q.id < j.id AND NOT q.held AND q.run_after <= $3))
                     ORDER BY q.id LIMIT 1) AS key_holder
                 FROM jobs j JOIN runs r ON r.tenant_id = j.tenant_id AND r.id = j.run_id
                 WHERE j.tenant_id = $1 AND j.run_id ", any_of!(2), "
                 ORDER BY path"
            ))
            .bind(tenant.as_str())
            .bind(list(live.iter().cloned()))
            .bind(now)
            .fetch_all(db)
            .await?;
            let mut jobs: std::collections::HashMap<String, Vec<Job>> = Default::default();
            for r in &rows {
                jobs.entry(r.get("run_id")).or_default().push(Job {
                    path: r.get("path"),
                    run_after: r.get("run_after"),
                    leased: r.get("leased"),
                    held: r.get("held"),
                    resume: r
                        .try_get::<Option<Json<tok_core::run::Resume>>, _>("resume")
                        .ok()
                        .flatten()
                        .map(|j| j.0),
                    queue_key: r.get("queue_key"),
                    key_holder: r.get("key_holder"),
                });
            }
            let waits = match known {
                Some(waits) => waits,
                None => {
                    let rows = sqlx::query(concat!(
                        "SELECT run_id, kind, key, subject, due_at FROM waits
                         WHERE tenant_id = $1 AND run_id ", any_of!(2), " ORDER BY id"
                    ))
                    .bind(tenant.as_str())
                    .bind(list(live.iter().cloned()))
                    .fetch_all(db)
                    .await?;
                    let mut waits: std::collections::HashMap<String, Vec<Wait>> =
                        Default::default();
                    for r in &rows {
                        waits.entry(r.get("run_id")).or_default().push(Wait {
                            kind: r.get("kind"),
                            key: r.get::<Option<String>, _>("key").unwrap_or_default(),
                            subject: r.get("subject"),
                            due_at: r.get("due_at"),
                        });
                    }
                    waits
                }
            };
            let load = sqlx::query(concat!(
                "SELECT ",
                tenant_cap!(),
                " AS cap, (SELECT COUNT(*) FROM jobs
                    WHERE tenant_id = $1 AND locked_by IS NOT NULL AND locked_until >= $2) AS running
                 FROM tenants tn WHERE tn.id = $1"
            ))
            .bind(tenant.as_str())
            .bind(now)
            .fetch_optional(db)
            .await?;
            let load = load.map_or(TenantLoad::default(), |r| TenantLoad {
                cap: r.get("cap"),
                running: r.get("running"),
            });
            for run in runs.iter_mut() {
                let id = run.id.as_str();
                run.blocked_by = tok_core::blocked::why(
                    &run.status,
                    jobs.get(id).map_or(&[][..], Vec::as_slice),
                    waits.get(id).map_or(&[][..], Vec::as_slice),
                    load,
                    now,
                );
            }
            Ok(())
        }

        /// Where a cancelled run's compensation starts (the step it undoes
        /// first, as `tok_core::compensation` reads the run's context), or
        /// `None` when it has nothing to undo.
        async fn compensation_start(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<Option<String>> {
            let context = context_in(tx, tenant, id).await?.ok_or(StoreError::NotFound("run"))?;
            Ok(tok_core::compensation::cancel_at(
                &tok_core::context::Context::from_value(context),
            ))
        }

        pub(crate) async fn run_status(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<RunStatus> {
            let row = sqlx::query(concat!(
                "SELECT status FROM runs WHERE tenant_id = $1 AND id = $2 ",
                lock_rows!()
            ))
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&mut **tx)
            .await?
            .ok_or(StoreError::NotFound("run"))?;
            let status = crate::sql::Row::<<$db as crate::sql::Native>::Driver>::new(row, "runs")
                .text("status")?;
            RunStatus::parse(&status).ok_or_else(|| StoreError::Decode {
                table: "runs",
                column: "status",
                cause: format!("`{status}` is not a run status"),
            })
        }

        /// Ends a transaction that refuses what was asked: rolled back at
        /// once, so the run's row it locked is free before the caller
        /// hears the refusal. (A dropped transaction is rolled back only
        /// when its connection is next used; until then a claim passes
        /// over the run's jobs.)
        async fn refused<T>(tx: sqlx::Transaction<'_, $db>, error: StoreError) -> Result<T> {
            tx.rollback().await?;
            Err(error)
        }

        /// Runs a statement whose `$1` is the tenant and `$2` the run.
        async fn for_run(
            tx: &mut sqlx::Transaction<'_, $db>,
            sql: &str,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<()> {
            sqlx::query(sql)
                .bind(tenant.as_str())
                .bind(id.as_str())
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        async fn summary_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<RunSummary> {
            let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE tenant_id = $1 AND id = $2");
            let row = sqlx::query(&sql)
                .bind(tenant.as_str())
                .bind(id.as_str())
                .fetch_one(&mut **tx)
                .await?;
            Ok(run_from_row(&row))
        }
    };
}

pub(crate) use impl_runs;
