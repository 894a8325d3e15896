//! The job queue ([`QueueStore`](crate::QueueStore)): claims, heartbeats,
//! releases and statistics, for both backends (see `rows.rs` for why a
//! macro per file).

macro_rules! impl_queue {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// Why a claimed job was handed out again. A value this version
        /// cannot read is logged and the job claimed as a fresh one.
        fn resume_from_row(row: &<$db as sqlx::Database>::Row) -> Option<Resume> {
            match row.try_get::<Option<Json<Resume>>, _>("resume") {
                Ok(resume) => resume.map(|r| r.0),
                Err(e) => {
                    tracing::warn!(job = row.get::<i64, _>("id"), error = %e, "unreadable resume of a claimed job");
                    None
                }
            }
        }

        #[async_trait::async_trait]
        impl QueueStore for $store {
            async fn claim_except(
                &self,
                tenants: &[TenantId],
                node: &str,
                limit: u32,
                lease_ms: i64,
                running: &[JobId],
            ) -> Result<Vec<ClaimedJob>> {
                if tenants.is_empty() || limit == 0 {
                    return Ok(Vec::new());
                }
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::Executor::execute(&mut *tx, claim_prelude!()).await?;
                // Each tenant's first claimable jobs, over-fetched so that
                // jobs sharing a queue key or past a cap can be dropped;
                // which of them this claim takes is `fairness::pick`'s.
                let rows = sqlx::query(CLAIM_CANDIDATES)
                    .bind(list(tenants.iter().map(|t| t.as_str())))
                    .bind(i64::from(limit))
                    .bind(i64::from(limit * tok_core::fairness::CANDIDATES_PER_SLOT))
                    .fetch_all(&mut *tx)
                    .await?;
                // A tenant with a concurrency cap gets what its cap leaves
                // of its leases (`caps/`); the others are not counted.
                let caps: std::collections::HashMap<String, i64> = rows
                    .iter()
                    .filter_map(|row| {
                        Some((row.get::<String, _>("tenant_id"), row.get::<Option<i64>, _>("cap")?))
                    })
                    .collect();
                let mut room = $crate::caps::room_under_caps(&mut tx, &caps, running).await?;
                let candidates: Vec<tok_core::fairness::Candidate> = rows
                    .iter()
                    .map(|row| tok_core::fairness::Candidate {
                        id: row.get("id"),
                        tenant: row.get("tenant_id"),
                        queue_key: row.get("queue_key"),
                        priority: row.get("priority"),
                        run_after: row.get("run_after"),
                    })
                    .collect();
                let running_ids: Vec<i64> = running.iter().map(|j| j.0).collect();
                // Bulk work holds at most half this process's slots.
                let bulk = if candidates.iter().any(|c| tok_core::fairness::is_bulk(c.priority)) {
                    let running_bulk: i64 = if running_ids.is_empty() {
                        0
                    } else {
                        sqlx::query_scalar(concat!(
                            "SELECT COUNT(*) FROM jobs WHERE id ", any_of!(1), " AND priority < $2"
                        ))
                        .bind(list(running_ids.iter().copied()))
                        .bind(-100_i64)
                        .fetch_one(&mut *tx)
                        .await?
                    };
                    let slots = running_ids.len() + limit as usize;
                    tok_core::fairness::bulk_room(slots, usize::try_from(running_bulk).unwrap_or(0))
                } else {
                    usize::MAX
                };
                let mut picked = tok_core::fairness::pick_within(
                    &candidates,
                    &mut room,
                    &running_ids,
                    limit as usize,
                    bulk,
                );
                let keys: std::collections::HashSet<&str> =
                    picked.iter().filter_map(|p| p.key.as_deref()).collect();
                // A job with a queue key is taken only under its key's lock,
                // held to the commit, so two claims never take two jobs of
                // one key: the take below, a statement after the lock, sees
                // every lease committed by the claim that held it before.
                if !CLAIM_KEYS.is_empty() && !keys.is_empty() {
                    let got: std::collections::HashSet<String> = sqlx::query_scalar(CLAIM_KEYS)
                        .bind(list(keys.iter().copied()))
                        .fetch_all(&mut *tx)
                        .await?
                        .into_iter()
                        .collect();
                    picked.retain(|p| p.key.as_ref().is_none_or(|k| got.contains(k)));
                }
                let ids: Vec<i64> = picked.iter().map(|p| p.id).collect();
                if ids.is_empty() {
                    tx.commit().await?;
                    return Ok(Vec::new());
                }
                // The take locks only the rows it leases and their runs'
                // rows, skipping a job when another transaction holds
                // either (runs before jobs, the store's lock order: a
                // cancel or a record holding the run is never waited for
                // while this holds the job), and checks each again against
                // what has been committed since the candidates were read.
                let token = random_token();
                let jobs = sqlx::query(concat!(
                    "UPDATE jobs SET locked_by = $1, locked_until = ", db_now!(), " + $2,
                        claim_token = $3, attempts = attempts + 1,
                        lease_expiries = lease_expiries
                            + CASE WHEN locked_until IS NULL THEN 0 ELSE 1 END
                     WHERE id IN (
                        SELECT k.id FROM jobs k
                        JOIN runs r ON r.tenant_id ", unindexed!(), " = k.tenant_id AND r.id = k.run_id
                        WHERE k.id ", any_of!(4), "
                          AND (k.locked_until IS NULL OR k.locked_until < ", db_now!(), ")
                          AND NOT k.held
                          AND (k.queue_key IS NULL OR NOT EXISTS (
                                SELECT 1 FROM jobs q
                                WHERE q.tenant_id = k.tenant_id AND q.queue_key = k.queue_key
                                  AND q.id <> k.id
                                  AND (q.locked_until >= ", db_now!(), "
                                       OR (q.id < k.id AND NOT q.held AND q.run_after <= ", db_now!(), "))))
                        ", lock_rows_skip_locked!(k, r), ")
                     RETURNING id, tenant_id, run_id, path, attempts, resume"
                ))
                .bind(node)
                .bind(lease_ms)
                .bind(&token)
                .bind(list(ids.iter().copied()))
                .fetch_all(&mut *tx)
                .await?;
                let run_ids: Vec<String> = jobs.iter().map(|j| j.get::<String, _>("run_id")).collect();
                sqlx::query(concat!(
                    "UPDATE runs SET status = 'running', started_at = COALESCE(started_at, $2)
                     WHERE tenant_id ", unindexed_any_of!(1), " AND id ", any_of!(4), " AND status IN ('queued', 'waiting')"
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .bind(now_ms())
                .bind(0_i64)
                .bind(list(run_ids.iter().map(|r| r.as_str())))
                .execute(&mut *tx)
                .await?;
                let runs = sqlx::query(concat!(
                    "SELECT id, tenant_id, automation_id, version, context, actions, depth,
                        subject_ticket_id, cursor_job, cursor_path, cursor_base,
                        context_upto, tail_since
                     FROM runs
                     WHERE tenant_id ", unindexed_any_of!(1), " AND id ", any_of!(2)
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .bind(list(run_ids.iter().map(|r| r.as_str())))
                .fetch_all(&mut *tx)
                .await?;
                // Each run's context as it is now: what its step rows
                // changed since it was written whole, folded over it, read
                // while this claim holds the runs' rows.
                let mut contexts: Vec<(String, String, Value, $crate::record::contexts::Stored)> = runs
                    .iter()
                    .map(|r| {
                        Ok((
                            r.get::<String, _>("tenant_id"),
                            r.get::<String, _>("id"),
                            r.get::<Json<Value>, _>("context").0,
                            stored_of(r)?,
                        ))
                    })
                    .collect::<Result<_>>()?;
                for tenant in tenants {
                    let mut of_tenant: Vec<(&str, &mut Value, $crate::record::contexts::Stored)> = contexts
                        .iter_mut()
                        .filter(|(t, _, _, _)| t == tenant.as_str())
                        .map(|(_, run, context, stored)| (run.as_str(), context, *stored))
                        .collect();
                    fold_changes(&mut *tx, tenant, &mut of_tenant).await?;
                }
                tx.commit().await?;
                let mut contexts: std::collections::HashMap<String, Value> = contexts
                    .into_iter()
                    .map(|(_, run, context, _)| (run, context))
                    .collect();
                let runs: std::collections::HashMap<String, _> = runs
                    .into_iter()
                    .map(|r| (r.get::<String, _>("id"), r))
                    .collect();
                Ok(jobs
                    .iter()
                    .filter_map(|job| {
                        let run_id: String = job.get("run_id");
                        // Jobs of one run (its parallel branches) share its row.
                        let run = runs.get(&run_id)?;
                        let id: i64 = job.get("id");
                        let row_attempts: i32 = job.get("attempts");
                        // A job that went on under a lease since it was
                        // last written is where its run's row says, and
                        // its step's attempts count from there.
                        let (path, attempt) = match run.get::<Option<i64>, _>("cursor_job") {
                            Some(cursor) if cursor == id => (
                                run.get::<Option<String>, _>("cursor_path").unwrap_or_default(),
                                (row_attempts - run.get::<Option<i32>, _>("cursor_base").unwrap_or(0)).max(1),
                            ),
                            _ => (job.get("path"), row_attempts),
                        };
                        // A run's branches share its context: each gets a copy.
                        let context = match jobs.iter().filter(|j| j.get::<String, _>("run_id") == run_id).count() {
                            1 => contexts.remove(&run_id).unwrap_or_default(),
                            _ => contexts.get(&run_id).cloned().unwrap_or_default(),
                        };
                        Some(ClaimedJob {
                            id: JobId(id),
                            tenant_id: TenantId::from(job.get::<String, _>("tenant_id")),
                            run_id: RunId::from(run_id),
                            path,
                            attempt,
                            row_attempts,
                            claim_token: token.clone(),
                            automation_id: AutomationId::from(run.get::<String, _>("automation_id")),
                            version: run.get("version"),
                            context,
                            actions: run.get("actions"),
                            depth: run.get("depth"),
                            subject_ticket_id: run.get("subject_ticket_id"),
                            resume: resume_from_row(job),
                        })
                    })
                    .collect())
            }

            async fn heartbeat(
                &self,
                node: &str,
                claims: &[(JobId, String)],
                lease_ms: i64,
            ) -> Result<Vec<JobId>> {
                if claims.is_empty() {
                    return Ok(Vec::new());
                }
                let rows: Vec<$crate::rows::LeaseRow> = claims
                    .iter()
                    .map(|(job, token)| $crate::rows::LeaseRow { id: job.0, token })
                    .collect();
                // A lease is extended only under the token it was claimed
                // with. Rows are locked in id order, like a record batch's
                // fence, and a row a record holds right now is skipped (that
                // record moves the lease on itself): the heartbeat never
                // deadlocks with a record. Both updates go in one turn at
                // the writer.
                let writer = self.writer().await;
                let extended: Vec<i64> = sqlx::query(concat!(
                    "UPDATE jobs SET locked_until = ", db_now!(), " + $4
                     WHERE id IN (SELECT j.id FROM ", batch_keys!(2), "
                                  JOIN jobs j ON j.id = CAST(x.value ->> 'id' AS BIGINT)
                                     AND j.claim_token = x.value ->> 'token'
                                  WHERE j.id ", any_of!(3), " AND j.locked_by = $1
                                  ORDER BY j.id ", lock_rows_skip_locked!(j), ")
                     RETURNING id"
                ))
                .bind(node)
                .bind(Json(&rows))
                .bind(list(claims.iter().map(|(job, _)| job.0)))
                .bind(lease_ms)
                .fetch_all(&*writer)
                .await?
                .iter()
                .map(|r| r.get::<i64, _>("id"))
                .collect();
                if extended.is_empty() {
                    return Ok(Vec::new());
                }
                // Connection slots held by these jobs live as long as their leases.
                sqlx::query(concat!(
                    "UPDATE connection_slots SET expires_at = ", db_now!(), " + $2
                     WHERE job_id ", any_of!(1)
                ))
                .bind(list(extended.iter().copied()))
                .bind(lease_ms)
                .execute(&*writer)
                .await?;
                Ok(extended.into_iter().map(JobId).collect())
            }

            async fn record(&self, job: &ClaimedJob, record: Record) -> Result<()> {
                self.records.submit((job.clone(), record)).await.map(|_| ())
            }

            async fn record_and_continue(&self, job: &ClaimedJob, record: Record) -> Result<bool> {
                self.records.submit((job.clone(), record)).await
            }

            async fn release_claims(&self, node: &str) -> Result<u64> {
                let done = sqlx::query(concat!(
                    "UPDATE jobs SET locked_by = NULL, locked_until = NULL, claim_token = NULL
                     WHERE ", leases_of_node!()
                ))
                .bind(node)
                .execute(&*self.writer().await)
                .await?;
                Ok(done.rows_affected())
            }

            async fn held_counts(&self, tenants: &[TenantId]) -> Result<Vec<(String, i64)>> {
                if tenants.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(concat!(
                    "SELECT kind, COUNT(*) AS n FROM (
                        SELECT CASE WHEN kind = 'runs' THEN 'runs'
                                    WHEN kind = 'condition' THEN 'condition'
                                    WHEN key LIKE 'approval:%' THEN 'approval'
                                    ELSE 'signal' END AS kind
                        FROM waits WHERE tenant_id ", any_of!(1), "
                        UNION ALL
                        SELECT CASE WHEN resume IS NULL THEN 'timer'
                                    ELSE resume ->> 'limit' END AS kind
                        FROM jobs, (SELECT ", db_now!(), " AS n) clock
                        WHERE tenant_id ", any_of!(1), " AND run_after > n
                          AND (locked_until IS NULL OR locked_until < n) AND NOT held
                          AND (resume IS NULL OR resume ->> 'kind' = 'deferred')
                     ) held
                     GROUP BY kind ORDER BY kind"
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| (r.get::<String, _>("kind"), r.get::<i64, _>("n")))
                    .collect())
            }

            async fn queue_stats(&self, tenants: &[TenantId]) -> Result<QueueStats> {
                if tenants.is_empty() {
                    return Ok(QueueStats::default());
                }
                let row = sqlx::query(concat!(
                    "SELECT
                        COALESCE(SUM(CASE WHEN run_after <= n AND (locked_until IS NULL OR locked_until < n) THEN 1 ELSE 0 END), 0) AS ready,
                        COALESCE(SUM(CASE WHEN run_after > n AND (locked_until IS NULL OR locked_until < n) THEN 1 ELSE 0 END), 0) AS scheduled,
                        COALESCE(SUM(CASE WHEN locked_until >= n THEN 1 ELSE 0 END), 0) AS running,
                        MIN(CASE WHEN run_after <= n AND (locked_until IS NULL OR locked_until < n) THEN n - run_after END) AS oldest
                     FROM jobs, (SELECT ", db_now!(), " AS n) clock
                     WHERE tenant_id ", any_of!(1)
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .fetch_one(self.reader())
                .await?;
                let pending = sqlx::query(concat!(
                    "SELECT COUNT(*) AS pending FROM event_inbox
                     WHERE status = 'pending' AND tenant_id ", any_of!(1)
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .fetch_one(self.reader())
                .await?;
                Ok(QueueStats {
                    ready: row.get::<i64, _>("ready"),
                    scheduled: row.get::<i64, _>("scheduled"),
                    running: row.get::<i64, _>("running"),
                    oldest_ready_ms: row.get::<Option<i64>, _>("oldest"),
                    pending_events: pending.get::<i64, _>("pending"),
                })
            }
        }
    };
}

pub(crate) use impl_queue;
