//! The dispatcher's transaction for both backends: pending events of the
//! inbox become runs and their first jobs (see `rows.rs` for why a macro
//! per file).

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
            }
        }

        /// Runs of an automation on a ticket started within the last minute.
        async fn recent_runs(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            automation: &AutomationId,
            ticket: &str,
            now: i64,
        ) -> Result<i64> {
            let row = sqlx::query(
                "SELECT COUNT(*) AS n FROM runs
                 WHERE tenant_id = $1 AND subject_ticket_id = $2 AND automation_id = $3
                   AND created_at > $4",
            )
            .bind(tenant.as_str())
            .bind(ticket)
            .bind(automation.as_str())
            .bind(now - 60_000)
            .fetch_one(&mut **tx)
            .await?;
            Ok(row.get("n"))
        }

        /// Writes runs (with the steps the dispatch ran for them) and their
        /// first jobs, a statement for all runs, one for their steps and one
        /// for all jobs; returns the ids of the runs written (a run whose
        /// (event, automation) already had one is not) and the jobs written
        /// claimed for `handed`'s node.
        async fn insert_runs(
            tx: &mut sqlx::Transaction<'_, $db>,
            runs: &[(TenantId, EventId, NewRun)],
            handed: Option<&$crate::rows::HandedOff<'_>>,
        ) -> Result<(std::collections::HashSet<String>, Vec<ClaimedJob>)> {
            if runs.is_empty() {
                return Ok(Default::default());
            }
            let now = now_ms();
            let is_handed = |run: &NewRun| handed.is_some_and(|h| h.runs.contains(run.id.as_str()));
            let rows: Vec<$crate::rows::RunRow> = runs
                .iter()
                .map(|(tenant_id, event_id, run)| {
                    // A run whose first steps ran in the dispatch has started.
                    let started = !run.steps.is_empty();
                    let (status, started_at, finished_at) = match run.first_path {
                        Some(_) if is_handed(run) || started => (RunStatus::Running, Some(now), None),
                        Some(_) => (RunStatus::Queued, None, None),
                        None => (RunStatus::Completed, started.then_some(now), Some(now)),
                    };
                    $crate::rows::RunRow {
                        tenant_id,
                        event_id,
                        status: status.as_str(),
                        started_at,
                        finished_at,
                        run,
                    }
                })
                .collect();
            let written: std::collections::HashSet<String> = sqlx::query(concat!(
                "INSERT INTO runs (id, tenant_id, automation_id, version, event_id, trigger_type,
                    status, depth, queue_key, context, actions, created_at, started_at,
                    finished_at, idempotency_key, subject_ticket_id)
                 SELECT x.value ->> 0, x.value ->> 1, x.value ->> 2,
                    CAST(x.value ->> 3 AS INTEGER), x.value ->> 4,
                    x.value ->> 5, x.value ->> 6,
                    CAST(x.value ->> 7 AS INTEGER), x.value ->> 8,
                    x.value -> 9, CAST(x.value ->> 14 AS INTEGER), $2, CAST(x.value ->> 10 AS BIGINT),
                    CAST(x.value ->> 11 AS BIGINT),
                    x.value ->> 12, x.value ->> 13
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
                    run.steps.iter().map(move |step| $crate::rows::StepRow {
                        run_id: &run.id,
                        tenant_id,
                        step,
                    })
                })
                .collect();
            insert_steps(tx, &steps, now).await?;
            let jobs: Vec<$crate::rows::JobRow> = runs
                .iter()
                .filter(|(_, _, run)| written.contains(run.id.as_str()))
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
                    })
                })
                .collect();
            if jobs.is_empty() {
                return Ok((written, Vec::new()));
            }
            let ids = sqlx::query(concat!(
                "INSERT INTO jobs (run_id, tenant_id, path, run_after, attempts, queue_key,
                    priority, created_at, locked_by, locked_until, claim_token)
                 SELECT x.value ->> 0, x.value ->> 1, x.value ->> 2, ",
                    db_now!(), ", CAST(x.value ->> 3 AS INTEGER), x.value ->> 4,
                    CAST(x.value ->> 5 AS INTEGER), $2, x.value ->> 6,
                    CASE WHEN x.value ->> 6 IS NULL THEN NULL ELSE ", db_now!(), " + $3 END,
                    x.value ->> 7
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

        /// The dispatcher's transaction ([`InboxStore::dispatch_handing_off`]).
        async fn dispatch_events(
            store: &$store,
            tenants: &[TenantId],
            limit: u32,
            planner: Planner<'_>,
            mut handoff: Option<Handoff<'_>>,
            lane: Lane,
        ) -> Result<Dispatched> {
            if tenants.is_empty() {
                return Ok(Dispatched::default());
            }
            let writer = store.writer_in(lane).await;
            let mut tx = writer.begin().await?;
            if !plan_prelude!().is_empty() {
                sqlx::Executor::execute(&mut *tx, plan_prelude!()).await?;
            }
            // Fair between tenants like the claim: each tenant's oldest
            // events first, round robin (any tenant may fill the batch
            // when the others have nothing), so a tenant with a backlog
            // of thousands does not hold back another tenant's event.
            let per_tenant = i64::from(limit);
            let rows = sqlx::query(dispatch_select!())
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .bind(i64::from(limit))
                .bind(per_tenant)
                .fetch_all(&mut *tx)
                .await?;
            // Others first: when one tenant has `DISPATCH_CROWDING` or
            // more of the batch's events and other tenants have some too,
            // this dispatch takes only the others' (a short transaction,
            // so their runs do not wait behind the crowd's); the next one
            // takes its batch in order, so the crowding tenant waits for
            // at most one. (Rolled back, it leaves the flag set: the next
            // dispatch then goes in order, which is always safe.)
            let selected = rows.len();
            let went_first = store.others_went_first.load(std::sync::atomic::Ordering::Relaxed);
            let owners: Vec<String> = rows.iter().map(|row| row.get("tenant_id")).collect();
            // A full batch mostly of one tenant's events: it has more waiting.
            let backlog = match selected as u64 == u64::from(limit) {
                true => $crate::batch::filling(&owners).map(|t| TenantId::from(t.clone())),
                false => None,
            };
            let rows = match $crate::batch::crowding(&owners, $crate::rows::DISPATCH_CROWDING) {
                Some(crowd) if !went_first => rows
                    .into_iter()
                    .zip(&owners)
                    .filter(|(_, owner)| *owner != crowd)
                    .map(|(row, _)| row)
                    .collect(),
                _ => rows,
            };
            if lane == Lane::Bulk {
                // An urgent dispatch takes other tenants' events out of
                // turn; the alternation is the bulk dispatches'.
                store.others_went_first
                    .store(rows.len() < selected, std::sync::atomic::Ordering::Relaxed);
            }
            let now = now_ms();
            // Events of one batch mostly share their automations: each
            // trigger is looked up once per batch.
            let mut matching: std::collections::HashMap<(String, Option<String>, Option<String>, String), Vec<Candidate>> =
                std::collections::HashMap::new();
            // Runs planned earlier in this batch count for the loop
            // protection like runs already written.
            let mut planned_on_ticket: std::collections::HashMap<(String, String, String), i64> =
                std::collections::HashMap::new();
            let mut runs = Vec::new();
            let mut dispatched = Vec::with_capacity(rows.len());
            let mut received_at = Vec::with_capacity(rows.len());
            for row in &rows {
                received_at.push(row.get::<i64, _>("received_at"));
                // Webhooks are found by source, internal events by type.
                let tenant: String = row.get("tenant_id");
                let target: Option<String> = row.get("target_automation_id");
                let source_kind: String = row.get("source_kind");
                let key = row
                    .get::<Option<String>, _>("event_type")
                    .or_else(|| row.get::<Option<String>, _>("source_id"));
                let lookup = (tenant, target, key, source_kind);
                if !matching.contains_key(&lookup) {
                    let (tenant, target, key, source_kind) = &lookup;
                    let found = match target {
                        Some(target) => {
                            let sql = format!(
                                "{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND a.id = $2
                                       AND a.status = 'active'"
                            );
                            sqlx::query(&sql)
                                .bind(tenant)
                                .bind(target)
                                .fetch_all(&mut *tx)
                                .await?
                        }
                        None => {
                            let sql = format!(
                                "{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND a.trigger_kind = $2
                                       AND a.trigger_key = $3 AND a.status = 'active'
                                     ORDER BY a.id"
                            );
                            sqlx::query(&sql)
                                .bind(tenant)
                                .bind(source_kind)
                                .bind(key.as_deref())
                                .fetch_all(&mut *tx)
                                .await?
                        }
                    };
                    let found = found
                        .iter()
                        .map(|r| Candidate {
                            automation_id: AutomationId::from(r.get::<String, _>("id")),
                            name: r.get("name"),
                            version: r.get("current_version"),
                            definition: r.get::<Json<Value>, _>("definition").0,
                            recent_runs_on_ticket: 0,
                        })
                        .collect();
                    matching.insert(lookup.clone(), found);
                }
                let cached = &matching[&lookup];
                let id: String = row.get("id");
                if cached.is_empty() {
                    // No automation listens: nothing to plan, and the
                    // payload is never read.
                    dispatched.push(id);
                    continue;
                }
                let event = event_from_row(row);
                let plan = match &event.subject_ticket_id {
                    None => planner(&event, cached),
                    Some(ticket) => {
                        let mut found = cached.clone();
                        for candidate in &mut found {
                            let written = recent_runs(
                                &mut tx,
                                &event.tenant_id,
                                &candidate.automation_id,
                                ticket,
                                now,
                            )
                            .await?;
                            let planned = planned_on_ticket
                                .get(&(
                                    event.tenant_id.to_string(),
                                    candidate.automation_id.to_string(),
                                    ticket.clone(),
                                ))
                                .copied()
                                .unwrap_or(0);
                            candidate.recent_runs_on_ticket = written + planned;
                        }
                        let plan = planner(&event, &found);
                        for run in &plan.runs {
                            *planned_on_ticket
                                .entry((
                                    event.tenant_id.to_string(),
                                    run.automation_id.to_string(),
                                    ticket.clone(),
                                ))
                                .or_default() += 1;
                        }
                        plan
                    }
                };
                for note in &plan.notes {
                    let cause = $crate::desk::Cause {
                        automation_id: Some(note.automation_id.clone()),
                        ..Default::default()
                    };
                    trace_in(&mut tx, &event.tenant_id, &note.ticket_id, &note.kind, &note.message, &cause)
                        .await?;
                }
                for run in plan.runs {
                    runs.push((event.tenant_id.clone(), event.id.clone(), run));
                }
                dispatched.push(id);
            }
            // The runs the dispatching node starts itself: their first
            // step is due now, and no queue key orders them behind
            // another run's job.
            let token = random_token();
            let mut taken = std::collections::HashSet::new();
            if let Some(handoff) = handoff.as_mut() {
                for (tenant, _, run) in &runs {
                    if run.first_path.is_some() && run.queue_key.is_none() && (handoff.take)(tenant) {
                        taken.insert(run.id.as_str());
                    }
                }
            }
            let handed = handoff.as_ref().map(|h| $crate::rows::HandedOff {
                node: h.node,
                lease_ms: h.lease_ms,
                token: &token,
                runs: &taken,
            });
            let (written, claimed) = insert_runs(&mut tx, &runs, handed.as_ref()).await?;
            if written.len() > claimed.len() && !notify_work!().is_empty() {
                // Workers in other processes hear of the new jobs at commit.
                sqlx::query(notify_work!()).execute(&mut *tx).await?;
            }
            sqlx::query(concat!(
                "UPDATE event_inbox SET status = 'dispatched', dispatched_at = $3
                     WHERE tenant_id ", unindexed_any_of!(1), " AND id ", any_of!(2)
            ))
            .bind(list(tenants.iter().map(|t| t.as_str())))
            .bind(list(dispatched.iter().map(|e| e.as_str())))
            .bind(now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(Dispatched {
                left: selected - rows.len(),
                received_at,
                claimed,
                backlog,
            })
        }
    };
}

pub(crate) use impl_dispatch;
