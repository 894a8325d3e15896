//! The dispatcher's transaction for both backends ([`crate::DispatchTx`]):
//! its mechanisms, each a statement or a few; what a dispatch decides with
//! them is the engine's (see `rows.rs` for why a macro per file).

macro_rules! impl_dispatch {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        fn event_from_row(row: &<$db as sqlx::Database>::Row) -> PendingEvent {
            PendingEvent {
                id: EventId::from(row.get::<String, _>("id")),
                tenant_id: TenantId::from(row.get::<String, _>("tenant_id")),
                source_id: row.get::<Option<String>, _>("source_id").map(SourceId::from),
                source_kind: row.get("source_kind"),
                payload: row.get::<Json<Value>, _>("payload").0,
                params: row.get::<Json<Value>, _>("params").0,
                depth: row.get("depth"),
                cause_run_id: row.get::<Option<String>, _>("cause_run_id").map(RunId::from),
                origin_automation_id: row
                    .get::<Option<String>, _>("origin_automation_id")
                    .map(AutomationId::from),
                target_automation_id: row
                    .get::<Option<String>, _>("target_automation_id")
                    .map(AutomationId::from),
                event_type: row.get("event_type"),
                subject_ticket_id: row.get("subject_ticket_id"),
                received_at: row.get("received_at"),
                traceparent: row.get("traceparent"),
            }
        }

        /// Writes runs (with the steps the dispatch ran for them) and their
        /// first jobs, a statement for all runs, one for their steps and one
        /// for all jobs; returns the ids of the runs written (a run whose
        /// (event, automation) already had one is not) and the jobs written
        /// claimed for `handed`'s node.
        /// The creation times of the automation's latest `limit` starts
        /// after `since`, newest first (refused runs are no starts), with
        /// the automation's starts locked until the transaction ends, so
        /// that two transactions starting its runs count one after the
        /// other.
        async fn recent_starts_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            automation: &AutomationId,
            since: i64,
            limit: u32,
        ) -> Result<Vec<i64>> {
            let lock = key_lock(tenant, &format!("starts:{automation}"));
            lock_names(tx, vec![lock]).await?;
            let rows = sqlx::query(
                "SELECT created_at FROM runs
                 WHERE tenant_id = $1 AND automation_id = $2 AND created_at > $3
                   AND status NOT IN ('refused', 'skipped')
                 ORDER BY created_at DESC
                 LIMIT $4",
            )
            .bind(tenant.as_str())
            .bind(automation.as_str())
            .bind(since)
            .bind(i64::from(limit))
            .fetch_all(&mut **tx)
            .await?;
            Ok(rows.iter().map(|r| r.get::<i64, _>("created_at")).collect())
        }

        async fn insert_runs(
            tx: &mut sqlx::Transaction<'_, $db>,
            runs: &[(TenantId, EventId, NewRun)],
            handed: Option<&$crate::rows::HandedOff<'_>>,
        ) -> Result<(std::collections::HashSet<String>, Vec<ClaimedJob>)> {
            if runs.is_empty() {
                return Ok(Default::default());
            }
            $crate::fault::refuses_dispatch(runs.iter().map(|(_, _, run)| &run.context))?;
            let now = now_ms();
            let is_handed = |run: &NewRun| handed.is_some_and(|h| h.runs.contains(&run.id));
            let rows: Vec<$crate::rows::RunRow> = runs
                .iter()
                .map(|(tenant_id, event_id, run)| {
                    // A run whose first steps ran in the dispatch has started.
                    let started = !run.steps.is_empty();
                    let (status, started_at, finished_at) = match run.first_path {
                        _ if run.refused.is_some() => (RunStatus::Refused, None, Some(now)),
                        _ if run.skipped.is_some() => (RunStatus::Skipped, None, Some(now)),
                        _ if run.cancelled.is_some() => (RunStatus::Cancelled, None, Some(now)),
                        Some(_) if is_handed(run) || started => (RunStatus::Running, Some(now), None),
                        Some(_) => (RunStatus::Queued, None, None),
                        None => (RunStatus::Completed, started.then_some(now), Some(now)),
                    };
                    let start = $crate::rows::RunStart {
                        status: status.as_str(),
                        error: run
                            .refused
                            .as_deref()
                            .or(run.skipped.as_deref())
                            .or(run.cancelled.as_deref()),
                        started_at,
                        finished_at,
                    };
                    $crate::rows::RunRow::new(tenant_id, event_id, run, start)
                })
                .collect();
            let written: std::collections::HashSet<String> = sqlx::query(concat!(
                "INSERT INTO runs (id, tenant_id, automation_id, version, event_id, trigger_type,
                    status, depth, queue_key, context, actions, created_at, started_at,
                    finished_at, idempotency_key, subject_ticket_id, error, priority, start_by, body)
                 SELECT x.value ->> 'id', x.value ->> 'tenant_id', x.value ->> 'automation_id',
                    CAST(x.value ->> 'version' AS INTEGER), x.value ->> 'event_id',
                    x.value ->> 'trigger_type', x.value ->> 'status',
                    CAST(x.value ->> 'depth' AS INTEGER), x.value ->> 'queue_key',
                    x.value -> 'context', CAST(x.value ->> 'actions' AS INTEGER), $2,
                    CAST(x.value ->> 'started_at' AS BIGINT),
                    CAST(x.value ->> 'finished_at' AS BIGINT),
                    x.value ->> 'idempotency_key', x.value ->> 'subject_ticket_id',
                    x.value ->> 'error', CAST(x.value ->> 'priority' AS INTEGER),
                    CAST(x.value ->> 'start_by' AS BIGINT), x.value -> 'context' -> '_body'
                 FROM ", batch_rows!(1), "
                 WHERE true
                 ORDER BY x.key
                 ON CONFLICT (event_id, automation_id) DO NOTHING
                 RETURNING id"
            ))
            .bind(Json(&rows))
            .bind(now)
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|r| r.get::<String, _>("id"))
            .collect();
            let steps: Vec<$crate::rows::StepRow> = runs
                .iter()
                .filter(|(_, _, run)| written.contains(run.id.as_str()))
                .flat_map(|(tenant_id, _, run)| {
                    // Written with its run, whose context is whole: no change.
                    run.steps
                        .iter()
                        .map(move |step| $crate::rows::StepRow::new(&run.id, tenant_id, step, None))
                })
                .collect();
            insert_steps(tx, &steps, now).await?;
            let cancels: Vec<$crate::rows::CancelRow> = runs
                .iter()
                .filter(|(_, _, run)| written.contains(run.id.as_str()))
                .filter(|(_, _, run)| run.first_path.is_some() && run.refused.is_none())
                .flat_map(|(tenant_id, _, run)| {
                    run.cancels
                        .iter()
                        .map(move |key| $crate::rows::CancelRow::new(tenant_id, &run.id, key))
                })
                .collect();
            if !cancels.is_empty() {
                sqlx::query(concat!(
                    "INSERT INTO run_cancels (tenant_id, source, path, value, run_id, filter,
                        created_at)
                     SELECT x.value ->> 'tenant_id', x.value ->> 'source', x.value ->> 'path',
                        x.value ->> 'value',
                        x.value ->> 'run_id', NULLIF(x.value -> 'filter', 'null'), $2
                     FROM ", batch_rows!(1), "
                     WHERE true
                     ORDER BY x.key
                     ON CONFLICT DO NOTHING"
                ))
                .bind(Json(&cancels))
                .bind(now)
                .execute(&mut **tx)
                .await?;
            }
            // A run of a ticket that ended in the dispatch (its steps all
            // ran here) says so in the ticket's trace.
            let ends: Vec<(&TenantId, &RunId, RunStatus, Option<&str>)> = rows
                .iter()
                .filter(|r| r.status == RunStatus::Completed.as_str())
                .filter(|r| r.subject_ticket_id.is_some() && written.contains(r.id.as_str()))
                .map(|r| (r.tenant_id, r.id, RunStatus::Completed, None))
                .collect();
            trace_run_ends(tx, &ends).await?;
            let jobs: Vec<$crate::rows::JobRow> = runs
                .iter()
                .filter(|(_, _, run)| written.contains(run.id.as_str()))
                .filter(|(_, _, run)| {
                    run.refused.is_none() && run.skipped.is_none() && run.cancelled.is_none()
                })
                .filter_map(|(tenant_id, _, run)| {
                    let path = run.first_path.as_deref()?;
                    let claim = handed.filter(|_| is_handed(run));
                    Some($crate::rows::JobRow {
                        run_id: &run.id,
                        tenant_id,
                        path,
                        queue_key: run.queue_key.as_deref(),
                        priority: run.priority,
                        attempts: i32::from(claim.is_some()),
                        locked_by: claim.map(|h| h.node),
                        claim_token: claim.map(|h| h.token),
                        delay_ms: run.hold.as_ref().map_or(0, |h| h.delay_ms),
                        resume: run.hold.as_ref().map(|h| &h.resume),
                    })
                })
                .collect();
            if jobs.is_empty() {
                return Ok((written, Vec::new()));
            }
            let ids = sqlx::query(concat!(
                "INSERT INTO jobs (run_id, tenant_id, path, run_after, attempts, queue_key,
                    priority, created_at, locked_by, locked_until, claim_token, resume)
                 SELECT x.value ->> 'run_id', x.value ->> 'tenant_id', x.value ->> 'path', ",
                    db_now!(), " + CAST(x.value ->> 'delay_ms' AS BIGINT),
                    CAST(x.value ->> 'attempts' AS INTEGER), x.value ->> 'queue_key',
                    CAST(x.value ->> 'priority' AS INTEGER), $2, x.value ->> 'locked_by',
                    CASE WHEN x.value ->> 'locked_by' IS NULL THEN NULL
                        ELSE ", db_now!(), " + $3 END,
                    x.value ->> 'claim_token', NULLIF(x.value -> 'resume', 'null')
                 FROM ", batch_rows!(1), "
                 ORDER BY x.key
                 RETURNING id, run_id"
            ))
            .bind(Json(&jobs))
            .bind(now)
            .bind(handed.map_or(0, |h| h.lease_ms))
            .fetch_all(&mut **tx)
            .await?;
            let Some(handed) = handed else {
                return Ok((written, Vec::new()));
            };
            let ids: std::collections::HashMap<String, i64> = ids
                .iter()
                .map(|r| (r.get::<String, _>("run_id"), r.get::<i64, _>("id")))
                .collect();
            let claimed = runs
                .iter()
                .filter(|(_, _, run)| is_handed(run))
                .filter_map(|(tenant_id, _, run)| {
                    Some(ClaimedJob {
                        id: JobId(*ids.get(run.id.as_str())?),
                        tenant_id: tenant_id.clone(),
                        run_id: run.id.clone(),
                        path: run.first_path.clone()?,
                        attempt: 1,
                        row_attempts: 1,
                        claim_token: handed.token.to_string(),
                        automation_id: run.automation_id.clone(),
                        version: run.version,
                        context: run.context.clone(),
                        actions: run.actions,
                        depth: run.depth,
                        subject_ticket_id: run.subject_ticket_id.clone(),
                        resume: None,
                    })
                })
                .collect();
            Ok((written, claimed))
        }


        /// Of the runs `handed` names, those the dispatching node may take
        /// within their tenants' concurrency caps (`caps/`), in the
        /// order of `runs`: a capped tenant's runs past what its cap leaves
        /// are written ready for any claim instead.
        async fn handed_within_caps(
            tx: &mut sqlx::Transaction<'_, $db>,
            runs: &[(TenantId, EventId, NewRun)],
            handed: &std::collections::HashSet<RunId>,
        ) -> Result<std::collections::HashSet<RunId>> {
            let mut tenants: Vec<&str> = runs
                .iter()
                .filter(|(_, _, run)| handed.contains(&run.id))
                .map(|(tenant, _, _)| tenant.as_str())
                .collect();
            tenants.sort_unstable();
            tenants.dedup();
            let caps = $crate::caps::caps_of(tx, &tenants).await?;
            if caps.is_empty() {
                return Ok(handed.clone());
            }
            let mut room = $crate::caps::room_under_caps(tx, &caps, &[]).await?;
            Ok(runs
                .iter()
                .filter(|(_, _, run)| handed.contains(&run.id))
                .filter(|(tenant, _, _)| match room.get_mut(tenant.as_str()) {
                    Some(0) => false,
                    Some(left) => {
                        *left -= 1;
                        true
                    }
                    None => true,
                })
                .map(|(_, _, run)| run.id.clone())
                .collect())
        }

        /// The open dispatch transaction of some tenants.
        pub(crate) struct OpenDispatch {
            tx: sqlx::Transaction<'static, $db>,
            tenants: Vec<TenantId>,
            /// The writer's turn (SQLite), held until the transaction ends.
            _turn: Option<$crate::gate::Turn>,
        }

        /// Opens a dispatch transaction of `tenants` in `lane`
        /// ([`InboxStore::begin_dispatch`]).
        async fn begin_dispatch_in(
            store: &$store,
            tenants: &[TenantId],
            lane: Lane,
        ) -> Result<Box<dyn DispatchTx>> {
            let writer = store.writer_in(lane).await;
            let mut tx = writer.begin().await?;
            if !plan_prelude!().is_empty() {
                sqlx::Executor::execute(&mut *tx, plan_prelude!()).await?;
            }
            Ok(Box::new(OpenDispatch {
                tx,
                tenants: tenants.to_vec(),
                _turn: writer.into_turn(),
            }))
        }

        #[async_trait::async_trait]
        impl DispatchTx for OpenDispatch {
            async fn accept(&mut self, tenant: &TenantId, event: &NewEvent) -> Result<EventId> {
                if !self.tenants.contains(tenant) {
                    return Err(StoreError::NotFound("tenant of this dispatch"));
                }
                $crate::storable::check_event(event)?;
                insert_event(&mut self.tx, tenant, event, "pending")
                    .await?
                    .ok_or_else(|| StoreError::Taken("event idempotency key taken".into()))
            }

            async fn tenant_limits(&mut self, tenant: &TenantId) -> Result<tok_core::quotas::TenantLimits> {
                tenant_limits_in(&mut self.tx, tenant).await
            }

            async fn pending_events(&mut self, limit: u32) -> Result<Vec<PendingEvent>> {
                if self.tenants.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(PENDING_EVENTS)
                    .bind(list(self.tenants.iter().map(|t| t.as_str())))
                    .bind(i64::from(limit))
                    .bind(i64::from(limit))
                    .fetch_all(&mut *self.tx)
                    .await?;
                Ok(rows.iter().map(event_from_row).collect())
            }

            async fn pending_event(
                &mut self,
                tenant: &TenantId,
                id: &EventId,
            ) -> Result<Option<PendingEvent>> {
                if !self.tenants.contains(tenant) {
                    return Ok(None);
                }
                let row = sqlx::query(concat!(
                    "SELECT id, tenant_id, source_id, source_kind, payload, params, depth,
                        cause_run_id, origin_automation_id, target_automation_id, event_type,
                        subject_ticket_id, received_at, traceparent
                     FROM event_inbox
                     WHERE tenant_id = $1 AND id = $2 AND status = 'pending' ",
                    lock_rows_skip_locked!()
                ))
                .bind(tenant.as_str())
                .bind(id.as_str())
                .fetch_optional(&mut *self.tx)
                .await?;
                Ok(row.as_ref().map(event_from_row))
            }

            async fn candidates(&mut self, event: &PendingEvent) -> Result<Vec<Candidate>> {
                // Webhooks are found by source, internal events by type.
                let found = match &event.target_automation_id {
                    Some(target) => {
                        let sql = format!(
                            "{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND a.id = $2
                                   AND a.status = 'active'"
                        );
                        sqlx::query(&sql)
                            .bind(event.tenant_id.as_str())
                            .bind(target.as_str())
                            .fetch_all(&mut *self.tx)
                            .await?
                    }
                    None => {
                        let sql = format!(
                            "{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND a.trigger_kind = $2
                                   AND a.trigger_key = $3 AND a.status = 'active'
                                 ORDER BY a.id"
                        );
                        sqlx::query(&sql)
                            .bind(event.tenant_id.as_str())
                            .bind(&event.source_kind)
                            .bind(event.trigger_key())
                            .fetch_all(&mut *self.tx)
                            .await?
                    }
                };
                Ok(found
                    .iter()
                    .map(|r| Candidate {
                        automation_id: AutomationId::from(r.get::<String, _>("id")),
                        name: r.get("name"),
                        version: r.get("current_version"),
                        definition: r.get::<Json<Value>, _>("definition").0,
                        recent_runs_on_ticket: 0,
                    })
                    .collect())
            }

            async fn runs_on_ticket(
                &mut self,
                tenant: &TenantId,
                automation: &AutomationId,
                ticket: &str,
                since: i64,
            ) -> Result<i64> {
                let row = sqlx::query(
                    "SELECT COUNT(*) AS n FROM runs
                     WHERE tenant_id = $1 AND subject_ticket_id = $2 AND automation_id = $3
                       AND created_at > $4",
                )
                .bind(tenant.as_str())
                .bind(ticket)
                .bind(automation.as_str())
                .bind(since)
                .fetch_one(&mut *self.tx)
                .await?;
                Ok(row.get("n"))
            }

            async fn recent_starts(
                &mut self,
                tenant: &TenantId,
                automation: &AutomationId,
                since: i64,
                limit: u32,
            ) -> Result<Vec<i64>> {
                recent_starts_in(&mut self.tx, tenant, automation, since, limit).await
            }

            async fn trace(
                &mut self,
                tenant: &TenantId,
                ticket_id: &str,
                kind: &str,
                message: &str,
                cause: &Cause,
            ) -> Result<()> {
                trace_in(&mut self.tx, tenant, ticket_id, kind, message, cause).await
            }

            async fn insert_runs(
                &mut self,
                runs: &[(TenantId, EventId, NewRun)],
                claims: Option<Claims<'_>>,
            ) -> Result<Vec<ClaimedJob>> {
                let token = random_token();
                let within = match &claims {
                    Some(c) => Some(handed_within_caps(&mut self.tx, runs, c.runs).await?),
                    None => None,
                };
                let handed = claims.as_ref().zip(within.as_ref()).map(|(c, within)| {
                    $crate::rows::HandedOff {
                        node: c.node,
                        lease_ms: c.lease_ms,
                        token: &token,
                        runs: within,
                    }
                });
                let (written, claimed) = insert_runs(&mut self.tx, runs, handed.as_ref()).await?;
                if written.len() > claimed.len() && !notify_work!().is_empty() {
                    // Workers in other processes hear of the new jobs at commit.
                    sqlx::query(notify_work!()).execute(&mut *self.tx).await?;
                }
                Ok(claimed)
            }

            async fn flow_key(
                &mut self,
                tenant: &TenantId,
                automation: &AutomationId,
                control: &str,
                key: &str,
            ) -> Result<Option<tok_core::start::KeyState>> {
                use tok_core::start::{KeyRun, KeyState};
                let lock = flow_lock(tenant, automation.as_str(), control, key);
                lock_names(&mut self.tx, vec![lock]).await?;
                let row = sqlx::query(
                    "SELECT f.run_id, f.opened_at, f.count, f.next_at, r.status,
                        (SELECT COUNT(*) FROM jobs j
                         WHERE j.tenant_id = f.tenant_id AND j.run_id = f.run_id
                           AND j.locked_by IS NULL AND j.attempts = 0) AS unclaimed
                     FROM flow_keys f
                     LEFT JOIN runs r ON r.tenant_id = f.tenant_id AND r.id = f.run_id
                     WHERE f.tenant_id = $1 AND f.automation_id = $2 AND f.control = $3
                       AND f.key = $4",
                )
                .bind(tenant.as_str())
                .bind(automation.as_str())
                .bind(control)
                .bind(key)
                .fetch_optional(&mut *self.tx)
                .await?;
                Ok(row.map(|r| {
                    let status = r
                        .get::<Option<String>, _>("status")
                        .and_then(|s| RunStatus::parse(&s));
                    let run = match status {
                        None => KeyRun::Ended,
                        Some(s) if s.is_final() => KeyRun::Ended,
                        Some(RunStatus::Queued) if r.get::<i64, _>("unclaimed") > 0 => KeyRun::Open,
                        Some(_) => KeyRun::Active,
                    };
                    KeyState {
                        run_id: r.get("run_id"),
                        run,
                        opened_at: r.get("opened_at"),
                        count: r.get("count"),
                        next_at: r.get("next_at"),
                    }
                }))
            }

            async fn put_flow_key(
                &mut self,
                tenant: &TenantId,
                automation: &AutomationId,
                control: &str,
                key: &str,
                state: &tok_core::start::KeyState,
            ) -> Result<()> {
                sqlx::query(
                    "INSERT INTO flow_keys (tenant_id, automation_id, control, key, run_id,
                        opened_at, count, next_at, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (tenant_id, automation_id, control, key) DO UPDATE SET
                        run_id = excluded.run_id, opened_at = excluded.opened_at,
                        count = excluded.count, next_at = excluded.next_at,
                        updated_at = excluded.updated_at",
                )
                .bind(tenant.as_str())
                .bind(automation.as_str())
                .bind(control)
                .bind(key)
                .bind(&state.run_id)
                .bind(state.opened_at)
                .bind(state.count)
                .bind(state.next_at)
                .bind(now_ms())
                .execute(&mut *self.tx)
                .await?;
                Ok(())
            }

            async fn run_context(&mut self, tenant: &TenantId, run: &RunId) -> Result<Option<Value>> {
                context_in(&mut self.tx, tenant, run).await
            }

            async fn join_run(
                &mut self,
                tenant: &TenantId,
                run: &RunId,
                context: &Value,
                delay_ms: i64,
            ) -> Result<bool> {
                // A claim takes the job's row first: this update waits for
                // a claim in flight and then finds the job taken.
                let moved = sqlx::query(concat!(
                    "UPDATE jobs SET run_after = ", db_now!(), " + $3
                     WHERE tenant_id = $1 AND run_id = $2 AND locked_by IS NULL AND attempts = 0"
                ))
                .bind(tenant.as_str())
                .bind(run.as_str())
                .bind(delay_ms)
                .execute(&mut *self.tx)
                .await?
                .rows_affected();
                if moved == 0 {
                    return Ok(false);
                }
                let updated = sqlx::query(
                    "UPDATE runs SET context = $3 WHERE tenant_id = $1 AND id = $2
                       AND status = 'queued'",
                )
                .bind(tenant.as_str())
                .bind(run.as_str())
                .bind(Json(context))
                .execute(&mut *self.tx)
                .await?
                .rows_affected();
                Ok(updated == 1)
            }

            async fn cancel_run(&mut self, tenant: &TenantId, run: &RunId, reason: &str) -> Result<()> {
                match run_status(&mut self.tx, tenant, run).await {
                    Ok(status) if !status.is_final() && status != RunStatus::Compensating => {
                        cancel_in(&mut self.tx, tenant, run, Some(reason.to_owned())).await?;
                    }
                    Ok(_) | Err(StoreError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
                sqlx::query("DELETE FROM run_cancels WHERE tenant_id = $1 AND run_id = $2")
                    .bind(tenant.as_str())
                    .bind(run.as_str())
                    .execute(&mut *self.tx)
                    .await?;
                Ok(())
            }

            async fn cancel_paths(
                &mut self,
                tenant: &TenantId,
                sources: &[&str],
            ) -> Result<Vec<(String, String)>> {
                if sources.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(concat!(
                    "SELECT DISTINCT source, path FROM run_cancels
                     WHERE tenant_id = $1 AND source ", any_of!(2), "
                     ORDER BY source, path"
                ))
                .bind(tenant.as_str())
                .bind(list(sources.iter().copied()))
                .fetch_all(&mut *self.tx)
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| (r.get::<String, _>("source"), r.get::<String, _>("path")))
                    .collect())
            }

            async fn cancel_matches(
                &mut self,
                tenant: &TenantId,
                source: &str,
                path: &str,
                value: &str,
            ) -> Result<Vec<(RunId, Option<Value>)>> {
                let rows = sqlx::query(
                    "SELECT c.run_id, c.filter, r.status FROM run_cancels c
                     LEFT JOIN runs r ON r.tenant_id = c.tenant_id AND r.id = c.run_id
                     WHERE c.tenant_id = $1 AND c.source = $2 AND c.path = $3 AND c.value = $4
                     ORDER BY c.run_id
                     LIMIT 1000",
                )
                .bind(tenant.as_str())
                .bind(source)
                .bind(path)
                .bind(value)
                .fetch_all(&mut *self.tx)
                .await?;
                let mut live = Vec::new();
                for r in &rows {
                    let run = RunId::from(r.get::<String, _>("run_id"));
                    let over = r
                        .get::<Option<String>, _>("status")
                        .and_then(|s| RunStatus::parse(&s))
                        .is_none_or(RunStatus::is_final);
                    if over {
                        // Its run ended: the row is of no use any more.
                        sqlx::query("DELETE FROM run_cancels WHERE tenant_id = $1 AND run_id = $2")
                            .bind(tenant.as_str())
                            .bind(run.as_str())
                            .execute(&mut *self.tx)
                            .await?;
                        continue;
                    }
                    let filter = r.get::<Option<Json<Value>>, _>("filter").map(|j| j.0);
                    live.push((run, filter));
                }
                Ok(live)
            }

            async fn mark_dispatched(&mut self, events: &[EventId]) -> Result<()> {
                sqlx::query(concat!(
                    "UPDATE event_inbox SET status = 'dispatched', dispatched_at = $3
                         WHERE tenant_id ", unindexed_any_of!(1), " AND id ", any_of!(2)
                ))
                .bind(list(self.tenants.iter().map(|t| t.as_str())))
                .bind(list(events.iter().map(|e| e.as_str())))
                .bind(now_ms())
                .execute(&mut *self.tx)
                .await?;
                Ok(())
            }

            async fn commit(self: Box<Self>) -> Result<()> {
                let OpenDispatch { tx, _turn, .. } = *self;
                tx.commit().await?;
                Ok(())
            }
        }
    };
}

pub(crate) use impl_dispatch;
