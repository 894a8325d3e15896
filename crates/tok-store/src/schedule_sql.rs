//! The scheduler's queries ([`ScheduleStore`](crate::ScheduleStore)) for
//! both backends (see `rows.rs` for why a macro per file): the wake's
//! lease row and the schedule rows of poll and schedule automations.

macro_rules! impl_schedule {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        #[async_trait::async_trait]
        impl $crate::schedule::ScheduleStore for $store {
            async fn hold_wake(
                &self,
                holder: &str,
                incarnation: &str,
                now: i64,
                lease_ms: i64,
            ) -> Result<bool> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let held = sqlx::query(
                    "INSERT INTO scheduler_lease (name, holder, incarnation, taken_at, expires_at)
                     VALUES ('wake', $1, $2, $3, $4)
                     ON CONFLICT (name) DO UPDATE SET
                        holder = excluded.holder,
                        incarnation = excluded.incarnation,
                        taken_at = CASE WHEN scheduler_lease.incarnation = excluded.incarnation
                            THEN scheduler_lease.taken_at ELSE excluded.taken_at END,
                        expires_at = excluded.expires_at
                     WHERE scheduler_lease.incarnation = excluded.incarnation
                        OR scheduler_lease.holder = excluded.holder
                        OR scheduler_lease.expires_at <= $3
                     RETURNING holder",
                )
                .bind(holder)
                .bind(incarnation)
                .bind(now)
                .bind(now + lease_ms)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
                tx.commit().await?;
                Ok(held)
            }

            async fn release_wake(&self, incarnation: &str) -> Result<()> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query("DELETE FROM scheduler_lease WHERE name = 'wake' AND incarnation = $1")
                    .bind(incarnation)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn stale_schedules(
                &self,
                tenants: &[TenantId],
            ) -> Result<(Vec<$crate::schedule::StaleSchedule>, Vec<(TenantId, AutomationId)>)> {
                if tenants.is_empty() {
                    return Ok((Vec::new(), Vec::new()));
                }
                let stale = sqlx::query(concat!(
                    "SELECT a.tenant_id, a.id, a.current_version, s.spec
                     FROM automations a
                     LEFT JOIN trigger_schedules s
                        ON s.tenant_id = a.tenant_id AND s.automation_id = a.id
                     WHERE a.tenant_id ", any_of!(1), " AND a.trigger_kind IN ('poll', 'schedule')
                       AND a.status <> 'archived'
                       AND (s.automation_id IS NULL OR s.version <> a.current_version)
                     ORDER BY a.tenant_id, a.id"
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .fetch_all(self.reader())
                .await?
                .iter()
                .map(|r| $crate::schedule::StaleSchedule {
                    tenant_id: TenantId::from(r.get::<String, _>("tenant_id")),
                    automation_id: AutomationId::from(r.get::<String, _>("id")),
                    version: r.get("current_version"),
                    spec: r.get("spec"),
                })
                .collect();
                let gone = sqlx::query(concat!(
                    "SELECT s.tenant_id, s.automation_id FROM trigger_schedules s
                     LEFT JOIN automations a ON a.tenant_id = s.tenant_id AND a.id = s.automation_id
                     WHERE s.tenant_id ", any_of!(1), "
                       AND (a.id IS NULL OR a.status = 'archived'
                            OR a.trigger_kind NOT IN ('poll', 'schedule'))
                     ORDER BY s.tenant_id, s.automation_id"
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .fetch_all(self.reader())
                .await?
                .iter()
                .map(|r| {
                    (
                        TenantId::from(r.get::<String, _>("tenant_id")),
                        AutomationId::from(r.get::<String, _>("automation_id")),
                    )
                })
                .collect();
                Ok((stale, gone))
            }

            async fn set_schedule(
                &self,
                tenant: &TenantId,
                automation: &AutomationId,
                version: i32,
                spec: &str,
                next_run_at: Option<i64>,
                keep_due: bool,
            ) -> Result<()> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query(
                    "INSERT INTO trigger_schedules (tenant_id, automation_id, version, spec, next_run_at)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (tenant_id, automation_id) DO UPDATE SET
                        version = excluded.version,
                        spec = excluded.spec,
                        next_run_at = CASE WHEN $6 THEN trigger_schedules.next_run_at
                            ELSE excluded.next_run_at END",
                )
                .bind(tenant.as_str())
                .bind(automation.as_str())
                .bind(version)
                .bind(spec)
                .bind(next_run_at)
                .bind(keep_due)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn remove_schedule(
                &self,
                tenant: &TenantId,
                automation: &AutomationId,
            ) -> Result<()> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query("DELETE FROM trigger_schedules WHERE tenant_id = $1 AND automation_id = $2")
                    .bind(tenant.as_str())
                    .bind(automation.as_str())
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn due(
                &self,
                tenants: &[TenantId],
                now: i64,
                limit: u32,
            ) -> Result<Vec<$crate::schedule::DueTrigger>> {
                if tenants.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(concat!(
                    "SELECT s.tenant_id, s.automation_id, s.version, s.spec, s.next_run_at, a.status,
                        r.status AS last_run_status
                     FROM trigger_schedules s
                     JOIN automations a ON a.tenant_id = s.tenant_id AND a.id = s.automation_id
                     LEFT JOIN runs r ON r.tenant_id = s.tenant_id AND r.id = s.last_run_id
                     WHERE s.tenant_id ", any_of!(1), " AND s.next_run_at <= $2
                     ORDER BY s.next_run_at, s.tenant_id, s.automation_id
                     LIMIT $3"
                ))
                .bind(list(tenants.iter().map(|t| t.as_str())))
                .bind(now)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| $crate::schedule::DueTrigger {
                        tenant_id: TenantId::from(r.get::<String, _>("tenant_id")),
                        automation_id: AutomationId::from(r.get::<String, _>("automation_id")),
                        version: r.get("version"),
                        spec: r.get("spec"),
                        due_at: r.get("next_run_at"),
                        status: AutomationStatus::parse(r.get::<&str, _>("status")),
                        last_run_status: r
                            .get::<Option<String>, _>("last_run_status")
                            .as_deref()
                            .and_then(RunStatus::parse),
                    })
                    .collect())
            }

            async fn advance(
                &self,
                tenant: &TenantId,
                automation: &AutomationId,
                from: i64,
                next: Option<i64>,
                run: Option<&RunId>,
                now: i64,
            ) -> Result<bool> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let moved = sqlx::query(
                    "UPDATE trigger_schedules SET next_run_at = $4,
                        last_run_id = COALESCE($5, last_run_id),
                        last_run_at = CASE WHEN $5 IS NULL THEN last_run_at ELSE $6 END
                     WHERE tenant_id = $1 AND automation_id = $2 AND next_run_at = $3",
                )
                .bind(tenant.as_str())
                .bind(automation.as_str())
                .bind(from)
                .bind(next)
                .bind(run.map(|r| r.as_str()))
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    > 0;
                tx.commit().await?;
                Ok(moved)
            }

            async fn next_run_at(
                &self,
                tenant: &TenantId,
                automation: &AutomationId,
            ) -> Result<Option<i64>> {
                Ok(sqlx::query(
                    "SELECT next_run_at FROM trigger_schedules
                     WHERE tenant_id = $1 AND automation_id = $2",
                )
                .bind(tenant.as_str())
                .bind(automation.as_str())
                .fetch_optional(self.reader())
                .await?
                .and_then(|r| r.get::<Option<i64>, _>("next_run_at")))
            }
        }
    };
}

pub(crate) use impl_schedule;
