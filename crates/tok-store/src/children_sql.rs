//! Runs that start and wait for other runs (`docs/workflows.md`), for both backends
//! (see `rows.rs` for why a macro): a child run written in its parent's
//! record transaction, a job parked on runs, a run's end resuming the
//! waits on it, and the runs a cancel cascades to.
//!
//! A wait on runs is the signals' machinery with a key per awaited run:
//! the parked job (due at the wait's timeout, or never) and one `waits`
//! row of kind `runs` per awaited run that has not ended, keyed
//! `run:<id>`, whose `match` holds the whole [`RunsWait`]. The job's
//! `resume` holds the awaited runs that ended so far
//! ([`Resume::Runs`](crate::Resume)). A run that ends takes its key's lock
//! and, in its own record transaction, adds itself to each waiting job's
//! `resume`; the one that ends the wait makes the job due now. A job
//! parking on runs takes the same locks before it reads the runs'
//! statuses, so a run ending at that moment is either seen ended or finds
//! the wait: never neither.
//!
//! Lock order: a cancel locks the runs it cancels from the deepest child up
//! and only then deletes the parent's job; a child's record holds its own
//! rows and then the parent's job. Neither waits on the other's first lock.

/// The key a wait on run `id` is found by.
pub(crate) fn run_key(id: &str) -> String {
    format!("run:{id}")
}

macro_rules! impl_children {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        use $crate::children_sql::run_key;

        /// How the runs of `ids` that have ended ended, in the order of
        /// `ids`. A run that is not the tenant's counts as failed.
        async fn ended_runs(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            ids: &[String],
        ) -> Result<Vec<RunEnded>> {
            let rows = sqlx::query(concat!(
                "SELECT id, status, context -> '_output' AS output, error FROM runs
                 WHERE tenant_id = $1 AND id ",
                any_of!(2)
            ))
            .bind(tenant.as_str())
            .bind(list(ids.iter().map(String::as_str)))
            .fetch_all(&mut **tx)
            .await?;
            let mut found = std::collections::HashMap::new();
            for row in &rows {
                let id: String = row.get("id");
                let status = RunStatus::parse(row.get::<&str, _>("status"));
                let output = row
                    .try_get::<Option<Json<Value>>, _>("output")?
                    .map_or(Value::Null, |o| o.0);
                found.insert(id, (status, output, row.get::<Option<String>, _>("error")));
            }
            let mut ended = Vec::new();
            for id in ids {
                match found.remove(id) {
                    Some((Some(status), output, error)) if status.is_final() => {
                        ended.push(RunEnded {
                            run_id: id.clone(),
                            status,
                            output,
                            error,
                        });
                    }
                    Some(_) => {}
                    None if ended.iter().any(|r: &RunEnded| &r.run_id == id) => {}
                    None => ended.push(RunEnded {
                        run_id: id.clone(),
                        status: RunStatus::Failed,
                        output: Value::Null,
                        error: Some(format!("there is no run `{id}` in this tenant")),
                    }),
                }
            }
            Ok(ended)
        }

        /// Parks a recorded job on runs (part of `settle_waits`): due now
        /// when the runs that ended already end the wait, else parked with
        /// a wait row per awaited run still going.
        async fn park_on_runs(
            tx: &mut sqlx::Transaction<'_, $db>,
            job: &ClaimedJob,
            path: &str,
            wait: &RunsWait,
        ) -> Result<$crate::rows::Parked> {
            let tenant = &job.tenant_id;
            let keys = wait.runs.iter().map(|run| key_lock(tenant, &run_key(run)));
            lock_names(tx, keys.collect()).await?;
            let ended = ended_runs(tx, tenant, &wait.runs).await?;
            if wait.is_over(&ended) {
                let resume = Resume::Runs {
                    ended,
                    timed_out: false,
                };
                return Ok($crate::rows::Parked {
                    run_at: None,
                    resume,
                });
            }
            for run in &wait.runs {
                if ended.iter().any(|r| &r.run_id == run) {
                    continue;
                }
                sqlx::query(
                    "INSERT INTO waits (id, run_id, tenant_id, path, kind, key, match, due_at)
                     VALUES ($1, $2, $3, $4, 'runs', $5, $6, $7)",
                )
                .bind(new_id("wai"))
                .bind(job.run_id.as_str())
                .bind(tenant.as_str())
                .bind(path)
                .bind(run_key(run))
                .bind(Json(wait))
                .bind(wait.due_at)
                .execute(&mut **tx)
                .await?;
            }
            let run_at = Some(wait.due_at.unwrap_or(NEVER_DUE_MS));
            let resume = Resume::Runs {
                ended,
                timed_out: true,
            };
            Ok($crate::rows::Parked { run_at, resume })
        }

        /// A run ended: every job parked on it learns how, and a job whose
        /// wait that ends is due now. A job a worker holds (claimed for its
        /// timeout) is left alone: its timeout won.
        async fn run_ended_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            ended: &RunEnded,
        ) -> Result<()> {
            let key = run_key(&ended.run_id);
            lock_names(tx, vec![key_lock(tenant, &key)]).await?;
            let waits = sqlx::query(concat!(
                "SELECT w.id, w.run_id, w.path, w.match, j.id AS job_id, j.resume
                 FROM waits w
                 JOIN jobs j ON j.tenant_id = w.tenant_id AND j.run_id = w.run_id
                    AND j.path = w.path
                 WHERE w.tenant_id = $1 AND w.kind = 'runs' AND w.key = $2
                   AND j.claim_token IS NULL
                 ORDER BY j.id ",
                lock_rows_of!(j)
            ))
            .bind(tenant.as_str())
            .bind(&key)
            .fetch_all(&mut **tx)
            .await?;
            let mut woke = false;
            for row in &waits {
                let wait = row.try_get::<Json<RunsWait>, _>("match")?.0;
                let mut so_far = match row.try_get::<Option<Json<Resume>>, _>("resume")? {
                    Some(Json(Resume::Runs { ended, .. })) => ended,
                    _ => Vec::new(),
                };
                if !so_far.iter().any(|r| r.run_id == ended.run_id) {
                    so_far.push(ended.clone());
                }
                let over = wait.is_over(&so_far);
                let waiting_run: String = row.get("run_id");
                let job: i64 = row.get("job_id");
                let resume = Resume::Runs {
                    ended: so_far,
                    timed_out: !over,
                };
                if over {
                    sqlx::query(
                        "DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2 AND path = $3
                           AND kind = 'runs'",
                    )
                    .bind(tenant.as_str())
                    .bind(&waiting_run)
                    .bind(row.get::<String, _>("path"))
                    .execute(&mut **tx)
                    .await?;
                    sqlx::query(concat!(
                        "UPDATE jobs SET resume = $3, run_after = ",
                        db_now!(),
                        "
                         WHERE tenant_id = $1 AND id = $2"
                    ))
                    .bind(tenant.as_str())
                    .bind(job)
                    .bind(Json(&resume))
                    .execute(&mut **tx)
                    .await?;
                    woke = true;
                } else {
                    sqlx::query("DELETE FROM waits WHERE tenant_id = $1 AND id = $2")
                        .bind(tenant.as_str())
                        .bind(row.get::<String, _>("id"))
                        .execute(&mut **tx)
                        .await?;
                    sqlx::query("UPDATE jobs SET resume = $3 WHERE tenant_id = $1 AND id = $2")
                        .bind(tenant.as_str())
                        .bind(job)
                        .bind(Json(&resume))
                        .execute(&mut **tx)
                        .await?;
                }
            }
            if woke && !notify_work!().is_empty() {
                sqlx::query(notify_work!()).execute(&mut **tx).await?;
            }
            Ok(())
        }

        /// The current version of the tenant's automation with this id, or
        /// else this name (the newest of that name).
        async fn automation_named(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id_or_name: &str,
        ) -> Result<Option<AutomationRow>> {
            let sql = format!(
                "{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND (a.id = $2 OR a.name = $2)
                 ORDER BY CASE WHEN a.id = $2 THEN 0 ELSE 1 END,
                    CASE WHEN a.status = 'archived' THEN 1 ELSE 0 END, a.created_at DESC LIMIT 1"
            );
            let row = sqlx::query(&sql)
                .bind(tenant.as_str())
                .bind(id_or_name)
                .fetch_optional(&mut **tx)
                .await?;
            row.map(|row| {
                let row = $crate::sql::Row::<<$db as $crate::sql::Native>::Driver>::new(
                    row,
                    "automations",
                );
                $crate::definitions::automation(&row)
            })
            .transpose()
        }

        /// Writes a child run (its event, the run, its first job) in the
        /// parent's transaction, or finds the run its idempotency key
        /// already started.
        async fn start_child_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            parent: &RunId,
            event: &NewEvent,
            run: &NewRun,
        ) -> Result<ChildStart> {
            if let Some(key) = &run.idempotency_key {
                let lock = idempotency_lock(tenant, &format!("run:{}:{key}", run.automation_id));
                lock_names(tx, vec![lock]).await?;
                let first = sqlx::query(
                    "SELECT id FROM runs
                     WHERE tenant_id = $1 AND automation_id = $2 AND idempotency_key = $3",
                )
                .bind(tenant.as_str())
                .bind(run.automation_id.as_str())
                .bind(key)
                .fetch_optional(&mut **tx)
                .await?;
                if let Some(first) = first {
                    let id = RunId::from(first.get::<String, _>("id"));
                    return Ok(ChildStart {
                        run_id: id,
                        created: false,
                    });
                }
            }
            let event_id = insert_event(tx, tenant, event, "dispatched")
                .await?
                .ok_or_else(|| {
                    StoreError::Taken("the child run's event exists already".into())
                })?;
            insert_runs(tx, &[(tenant.clone(), event_id, run.clone())], None).await?;
            sqlx::query("UPDATE runs SET parent_run_id = $3 WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.as_str())
                .bind(run.id.as_str())
                .bind(parent.as_str())
                .execute(&mut **tx)
                .await?;
            if !notify_work!().is_empty() {
                sqlx::query(notify_work!()).execute(&mut **tx).await?;
            }
            Ok(ChildStart {
                run_id: run.id.clone(),
                created: true,
            })
        }

        /// The runs a cancel of `top` reaches: `top`, then the runs its
        /// waits name, theirs, and so on, each once, parents before their
        /// children.
        async fn cancel_tree(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            top: &RunId,
        ) -> Result<Vec<RunId>> {
            let mut tree = vec![top.clone()];
            let mut next = 0;
            while next < tree.len() {
                let keys = sqlx::query(
                    "SELECT key FROM waits WHERE tenant_id = $1 AND run_id = $2 AND kind = 'runs'
                     ORDER BY id",
                )
                .bind(tenant.as_str())
                .bind(tree[next].as_str())
                .fetch_all(&mut **tx)
                .await?;
                for row in &keys {
                    let key: String = row.get("key");
                    let Some(child) = key.strip_prefix("run:") else {
                        continue;
                    };
                    if !tree.iter().any(|r| r.as_str() == child) {
                        tree.push(RunId::from(child));
                    }
                }
                next += 1;
            }
            Ok(tree)
        }
    };
}

pub(crate) use impl_children;
