//! The stuck-run watch's queries ([`WatchStore`](crate::WatchStore)) for
//! both backends (see `rows.rs` for why a macro per file).

macro_rules! impl_watch {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        fn platform_incident_from_row(
            r: &<$db as sqlx::Database>::Row,
        ) -> $crate::watch::PlatformIncident {
            $crate::watch::PlatformIncident {
                id: r.get("id"),
                reason: r.get("reason"),
                source: r.get("source"),
                tenant_id: r.get("tenant_id"),
                run_id: r.get("run_id"),
                title: r.get("title"),
                detail: r.get::<Json<Value>, _>("detail").0,
                status: r.get("status"),
                occurrences: r.get("occurrences"),
                created_at: r.get("created_at"),
                updated_at: r.get("updated_at"),
                resolved_at: r.get("resolved_at"),
            }
        }

        #[async_trait::async_trait]
        impl $crate::watch::WatchStore for $store {
            async fn overdue_waits(
                &self,
                tenant: &TenantId,
                due_before: i64,
                now: i64,
                limit: u32,
            ) -> Result<Vec<$crate::watch::OverdueWait>> {
                let rows = sqlx::query(
                    "SELECT DISTINCT w.run_id, w.path, w.due_at FROM waits w
                     JOIN jobs j ON j.tenant_id = w.tenant_id AND j.run_id = w.run_id
                     WHERE w.tenant_id = $1 AND w.due_at < $2
                       AND (j.locked_until IS NULL OR j.locked_until < $3)
                     ORDER BY w.due_at, w.run_id
                     LIMIT $4",
                )
                .bind(tenant.as_str())
                .bind(due_before)
                .bind(now)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| $crate::watch::OverdueWait {
                        run_id: RunId::from(r.get::<String, _>("run_id")),
                        path: r.get("path"),
                        due_at: r.get("due_at"),
                    })
                    .collect())
            }

            async fn leases_expired_repeatedly(
                &self,
                tenant: &TenantId,
                limit: u32,
            ) -> Result<Vec<$crate::watch::ExpiringJob>> {
                // The literal 3 is the partial index's, so the index is used.
                const _: () = assert!($crate::watch::LEASE_EXPIRIES == 3);
                let rows = sqlx::query(
                    "SELECT run_id, path, lease_expiries FROM jobs
                     WHERE tenant_id = $1 AND lease_expiries >= 3
                     ORDER BY run_id
                     LIMIT $2",
                )
                .bind(tenant.as_str())
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| $crate::watch::ExpiringJob {
                        run_id: RunId::from(r.get::<String, _>("run_id")),
                        path: r.get("path"),
                        lease_expiries: r.get("lease_expiries"),
                    })
                    .collect())
            }

            async fn unfinished_runs(
                &self,
                tenant: &TenantId,
                automation: &AutomationId,
                created_before: i64,
                limit: u32,
            ) -> Result<Vec<$crate::watch::UnfinishedRun>> {
                let rows = sqlx::query(
                    "SELECT id, created_at FROM runs
                     WHERE tenant_id = $1 AND automation_id = $2
                       AND status IN ('queued', 'running', 'waiting') AND created_at < $3
                     ORDER BY created_at, id
                     LIMIT $4",
                )
                .bind(tenant.as_str())
                .bind(automation.as_str())
                .bind(created_before)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| $crate::watch::UnfinishedRun {
                        id: RunId::from(r.get::<String, _>("id")),
                        created_at: r.get("created_at"),
                    })
                    .collect())
            }

            async fn unstarted_past(
                &self,
                tenants: &[TenantId],
                now: i64,
                limit: u32,
            ) -> Result<Vec<$crate::watch::UnstartedRun>> {
                if tenants.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(concat!(
                    "SELECT tenant_id, id, start_by FROM runs
                     WHERE start_by IS NOT NULL AND status = 'queued' AND start_by < $2
                       AND tenant_id ",
                    unindexed_any_of!(1),
                    "
                     ORDER BY start_by
                     LIMIT $3"
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .bind(now)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| $crate::watch::UnstartedRun {
                        tenant_id: TenantId::from(r.get::<String, _>("tenant_id")),
                        run_id: RunId::from(r.get::<String, _>("id")),
                        start_by: r.get("start_by"),
                    })
                    .collect())
            }

            async fn singletons_to_release(
                &self,
                tenants: &[TenantId],
                limit: u32,
            ) -> Result<Vec<$crate::watch::SingletonKey>> {
                if tenants.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(concat!(
                    "SELECT f.tenant_id, f.automation_id, f.key FROM flow_keys f
                     LEFT JOIN runs r ON r.tenant_id = f.tenant_id AND r.id = f.run_id
                     WHERE f.control = 'singleton' AND f.count > 0
                       AND f.tenant_id ", unindexed_any_of!(1), "
                       AND (r.id IS NULL OR r.status IN
                            ('completed', 'failed', 'cancelled', 'refused', 'skipped', 'expired'))
                     ORDER BY f.updated_at
                     LIMIT $2"
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| $crate::watch::SingletonKey {
                        tenant_id: TenantId::from(r.get::<String, _>("tenant_id")),
                        automation_id: AutomationId::from(r.get::<String, _>("automation_id")),
                        key: r.get("key"),
                    })
                    .collect())
            }

            async fn release_singleton(
                &self,
                key: &$crate::watch::SingletonKey,
            ) -> Result<Option<RunId>> {
                let tenant = &key.tenant_id;
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let lock = flow_lock(tenant, key.automation_id.as_str(), "singleton", &key.key);
                lock_names(&mut tx, vec![lock]).await?;
                let row = sqlx::query(
                    "SELECT f.count, r.status FROM flow_keys f
                     LEFT JOIN runs r ON r.tenant_id = f.tenant_id AND r.id = f.run_id
                     WHERE f.tenant_id = $1 AND f.automation_id = $2 AND f.control = 'singleton'
                       AND f.key = $3",
                )
                .bind(tenant.as_str())
                .bind(key.automation_id.as_str())
                .bind(&key.key)
                .fetch_optional(&mut *tx)
                .await?;
                let ended = row.as_ref().is_some_and(|r| {
                    r.get::<i64, _>("count") > 0
                        && r.get::<Option<String>, _>("status")
                            .and_then(|s| RunStatus::parse(&s))
                            .is_none_or(RunStatus::is_final)
                });
                if !ended {
                    tx.rollback().await?;
                    return Ok(None);
                }
                let queue = tok_core::start::singleton_queue_key(key.automation_id.as_str(), &key.key);
                let next = sqlx::query(
                    "SELECT j.id, j.run_id FROM jobs j
                     WHERE j.tenant_id = $1 AND j.queue_key = $2 AND j.locked_by IS NULL
                       AND j.resume ->> 'limit' = 'singleton'
                     ORDER BY j.id
                     LIMIT 1",
                )
                .bind(tenant.as_str())
                .bind(&queue)
                .fetch_optional(&mut *tx)
                .await?;
                let released = match &next {
                    Some(job) => {
                        // Released, the job leaves the key's queue for its
                        // run's ticket's (if it has one): from its first step
                        // on it is serialized with the ticket's other runs.
                        sqlx::query(concat!(
                            "UPDATE jobs SET run_after = ", db_now!(), ", resume = NULL,
                                queue_key = (SELECT CASE WHEN r.subject_ticket_id IS NULL
                                                         THEN NULL
                                                         ELSE 'ticket:' || r.subject_ticket_id END
                                             FROM runs r
                                             WHERE r.tenant_id = jobs.tenant_id
                                               AND r.id = jobs.run_id)
                             WHERE tenant_id = $1 AND id = $2"
                        ))
                        .bind(tenant.as_str())
                        .bind(job.get::<i64, _>("id"))
                        .execute(&mut *tx)
                        .await?;
                        Some(RunId::from(job.get::<String, _>("run_id")))
                    }
                    None => None,
                };
                sqlx::query(
                    "UPDATE flow_keys SET run_id = COALESCE($4, run_id),
                        count = CASE WHEN $4 IS NULL THEN 0 ELSE count - 1 END, updated_at = $5
                     WHERE tenant_id = $1 AND automation_id = $2 AND control = 'singleton'
                       AND key = $3",
                )
                .bind(tenant.as_str())
                .bind(key.automation_id.as_str())
                .bind(&key.key)
                .bind(released.as_ref().map(|r| r.as_str()))
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(released)
            }

            async fn expire_run(
                &self,
                tenant: &TenantId,
                run: &RunId,
                error: &str,
                now: i64,
            ) -> Result<bool> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                // The jobs first, as a claim takes them: a claim in flight
                // is waited for, and then its job is no longer unclaimed.
                sqlx::query(
                    "DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2 AND locked_by IS NULL",
                )
                .bind(tenant.as_str())
                .bind(run.as_str())
                .execute(&mut *tx)
                .await?;
                let claimed: i64 = sqlx::query(
                    "SELECT COUNT(*) AS n FROM jobs WHERE tenant_id = $1 AND run_id = $2",
                )
                .bind(tenant.as_str())
                .bind(run.as_str())
                .fetch_one(&mut *tx)
                .await?
                .get("n");
                let expired = claimed == 0
                    && sqlx::query(
                        "UPDATE runs SET status = 'expired', error = $3, finished_at = $4
                         WHERE tenant_id = $1 AND id = $2 AND status = 'queued'
                           AND started_at IS NULL",
                    )
                    .bind(tenant.as_str())
                    .bind(run.as_str())
                    .bind(error)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                        > 0;
                if !expired {
                    tx.rollback().await?;
                    return Ok(false);
                }
                sqlx::query("DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2")
                    .bind(tenant.as_str())
                    .bind(run.as_str())
                    .execute(&mut *tx)
                    .await?;
                trace_run_ends(&mut tx, &[(tenant, run, RunStatus::Expired, Some(error))]).await?;
                let ended = RunEnded {
                    run_id: run.to_string(),
                    status: RunStatus::Expired,
                    output: Value::Null,
                    error: Some(error.to_owned()),
                };
                run_ended_in(&mut tx, tenant, &ended).await?;
                tx.commit().await?;
                Ok(true)
            }

            async fn fail_run(
                &self,
                tenant: &TenantId,
                run: &RunId,
                failure: $crate::watch::RunFailure,
                now: i64,
            ) -> Result<bool> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let failed = sqlx::query(
                    "UPDATE runs SET status = 'failed', error = $3, finished_at = $4
                     WHERE tenant_id = $1 AND id = $2
                       AND status IN ('queued', 'running', 'waiting')",
                )
                .bind(tenant.as_str())
                .bind(run.as_str())
                .bind(&failure.error)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    > 0;
                if !failed {
                    return Ok(false);
                }
                for sql in [
                    "DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2",
                    "DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2",
                ] {
                    sqlx::query(sql)
                        .bind(tenant.as_str())
                        .bind(run.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
                jobs_gone_outside_a_record(&mut tx, tenant, run, true).await?;
                let error = Some(failure.error.as_str());
                trace_run_ends(&mut tx, &[(tenant, run, RunStatus::Failed, error)]).await?;
                let ended = RunEnded {
                    run_id: run.to_string(),
                    status: RunStatus::Failed,
                    output: Value::Null,
                    error: Some(failure.error.clone()),
                };
                run_ended_in(&mut tx, tenant, &ended).await?;
                if let Some(incident) = failure.incident {
                    open_incident_in(&mut *tx, tenant, incident).await?;
                }
                if let Some(event) = failure.event {
                    emit_in(&mut *tx, tenant, event, &failure.cause).await?;
                }
                tx.commit().await?;
                Ok(true)
            }

            async fn open_platform_incident(
                &self,
                incident: $crate::watch::NewPlatformIncident,
                now: i64,
            ) -> Result<(String, bool)> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let id = new_id("pin");
                let inserted = sqlx::query(
                    "INSERT INTO platform_incidents (id, reason, source, tenant_id, run_id, title,
                        detail, status, occurrences, created_at, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, 'open', 1, $8, $8)
                     ON CONFLICT (source) WHERE status = 'open' DO NOTHING
                     RETURNING id",
                )
                .bind(&id)
                .bind(incident.reason)
                .bind(&incident.source)
                .bind(incident.tenant_id.as_ref().map(|t| t.as_str()))
                .bind(incident.run_id.as_ref().map(|r| r.as_str()))
                .bind(&incident.title)
                .bind(Json(&incident.detail))
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
                let opened = match inserted {
                    Some(_) => (id, true),
                    None => {
                        let existing = sqlx::query(
                            "UPDATE platform_incidents
                             SET occurrences = occurrences + 1, updated_at = $2
                             WHERE source = $1 AND status = 'open'
                             RETURNING id",
                        )
                        .bind(&incident.source)
                        .bind(now)
                        .fetch_one(&mut *tx)
                        .await?;
                        (existing.get("id"), false)
                    }
                };
                tx.commit().await?;
                Ok(opened)
            }

            async fn platform_incidents(
                &self,
                status: Option<&str>,
                limit: u32,
                before: Option<&str>,
            ) -> Result<$crate::Page<$crate::watch::PlatformIncident>> {
                let rows = sqlx::query(
                    "SELECT id, reason, source, tenant_id, run_id, title, detail, status,
                        occurrences, created_at, updated_at, resolved_at
                     FROM platform_incidents
                     WHERE (CAST($1 AS TEXT) IS NULL OR status = $1)
                       AND (CAST($3 AS TEXT) IS NULL OR id < $3)
                     ORDER BY id DESC
                     LIMIT $2",
                )
                .bind(status)
                .bind(i64::from(limit) + 1)
                .bind(before)
                .fetch_all(self.reader())
                .await?;
                let items = rows.iter().map(platform_incident_from_row).collect();
                Ok($crate::Page::of(
                    items,
                    limit,
                    |i: &$crate::watch::PlatformIncident| i.id.clone(),
                ))
            }

            async fn resolve_platform_incident(&self, id: &str, now: i64) -> Result<bool> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let resolved = sqlx::query(
                    "UPDATE platform_incidents SET status = 'resolved', resolved_at = $2,
                        updated_at = $2
                     WHERE id = $1 AND status = 'open'",
                )
                .bind(id)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    > 0;
                tx.commit().await?;
                Ok(resolved)
            }
        }
    };
}

pub(crate) use impl_watch;
