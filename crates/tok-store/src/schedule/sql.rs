//! [`ScheduleStore`] on every store, on the tenant's database, and
//! [`SchedulerWake`] on a store of one database: the same SQL on both
//! databases, but for how a list of tenants is bound. The wake's lease row
//! and the schedule rows of poll and schedule automations.

use async_trait::async_trait;
use tok_core::ids::{AutomationId, RunId, TenantId};

use super::{DueTrigger, ScheduleStore, SchedulerWake, StaleSchedule};
use crate::sql::{Driver, DriverOf, Route, SqlStore, on};
use crate::{AutomationStatus, Result, RunStatus};

/// On a store of one database, the lease and every tenant's schedules are
/// in it: one statement for all the tenants asked.
#[async_trait]
impl<S: SqlStore> SchedulerWake for S {
    async fn hold_wake(
        &self,
        holder: &str,
        incarnation: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<bool> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        let held = on(
            "scheduler_lease",
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
        .text(holder)
        .text(incarnation)
        .int(now)
        .int(now + lease_ms)
        .fetch_optional::<S::Driver>(&mut tx)
        .await?
        .is_some();
        tx.commit().await?;
        Ok(held)
    }

    async fn release_wake(&self, incarnation: &str) -> Result<()> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        on(
            "scheduler_lease",
            "DELETE FROM scheduler_lease WHERE name = 'wake' AND incarnation = $1",
        )
        .text(incarnation)
        .execute::<S::Driver>(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn stale_schedules(
        &self,
        tenants: &[TenantId],
    ) -> Result<(Vec<StaleSchedule>, Vec<(TenantId, AutomationId)>)> {
        if tenants.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut conn = self.reader().acquire().await?;
        let sql = format!(
            "SELECT a.tenant_id, a.id, a.current_version, s.spec
             FROM automations a
             LEFT JOIN trigger_schedules s
                ON s.tenant_id = a.tenant_id AND s.automation_id = a.id
             WHERE a.tenant_id {} AND a.trigger_kind IN ('poll', 'schedule')
               AND a.status <> 'archived'
               AND (s.automation_id IS NULL OR s.version <> a.current_version)
             ORDER BY a.tenant_id, a.id",
            S::Driver::any_of(1)
        );
        let stale = on("automations", &sql)
            .texts(tenants.iter().map(|t| t.as_str()))
            .fetch_all::<S::Driver>(&mut conn)
            .await?
            .iter()
            .map(|r| {
                Ok(StaleSchedule {
                    tenant_id: TenantId::from(r.text("tenant_id")?),
                    automation_id: AutomationId::from(r.text("id")?),
                    version: r.int32("current_version")?,
                    spec: r.opt_text("spec")?,
                })
            })
            .collect::<Result<_>>()?;
        let sql = format!(
            "SELECT s.tenant_id, s.automation_id FROM trigger_schedules s
             LEFT JOIN automations a ON a.tenant_id = s.tenant_id AND a.id = s.automation_id
             WHERE s.tenant_id {}
               AND (a.id IS NULL OR a.status = 'archived'
                    OR a.trigger_kind NOT IN ('poll', 'schedule'))
             ORDER BY s.tenant_id, s.automation_id",
            S::Driver::any_of(1)
        );
        let gone = on("trigger_schedules", &sql)
            .texts(tenants.iter().map(|t| t.as_str()))
            .fetch_all::<S::Driver>(&mut conn)
            .await?
            .iter()
            .map(|r| {
                Ok((
                    TenantId::from(r.text("tenant_id")?),
                    AutomationId::from(r.text("automation_id")?),
                ))
            })
            .collect::<Result<_>>()?;
        Ok((stale, gone))
    }

    async fn due(&self, tenants: &[TenantId], now: i64, limit: u32) -> Result<Vec<DueTrigger>> {
        if tenants.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT s.tenant_id, s.automation_id, s.version, s.spec, s.next_run_at, a.status,
                r.status AS last_run_status
             FROM trigger_schedules s
             JOIN automations a ON a.tenant_id = s.tenant_id AND a.id = s.automation_id
             LEFT JOIN runs r ON r.tenant_id = s.tenant_id AND r.id = s.last_run_id
             WHERE s.tenant_id {} AND s.next_run_at <= $2
             ORDER BY s.next_run_at, s.tenant_id, s.automation_id
             LIMIT $3",
            S::Driver::any_of(1)
        );
        let mut conn = self.reader().acquire().await?;
        let rows = on("trigger_schedules", &sql)
            .texts(tenants.iter().map(|t| t.as_str()))
            .int(now)
            .int(i64::from(limit))
            .fetch_all::<S::Driver>(&mut conn)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DueTrigger {
                    tenant_id: TenantId::from(r.text("tenant_id")?),
                    automation_id: AutomationId::from(r.text("automation_id")?),
                    version: r.int32("version")?,
                    spec: r.text("spec")?,
                    due_at: r.int("next_run_at")?,
                    status: AutomationStatus::parse(&r.text("status")?),
                    last_run_status: r
                        .opt_text("last_run_status")?
                        .as_deref()
                        .and_then(RunStatus::parse),
                })
            })
            .collect()
    }
}

#[async_trait]
impl<R: Route> ScheduleStore for R {
    async fn set_schedule(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
        version: i32,
        spec: &str,
        next_run_at: Option<i64>,
        keep_due: bool,
    ) -> Result<()> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            on(
                "trigger_schedules",
                "INSERT INTO trigger_schedules (tenant_id, automation_id, version, spec, next_run_at)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (tenant_id, automation_id) DO UPDATE SET
                    version = excluded.version,
                    spec = excluded.spec,
                    next_run_at = CASE WHEN $6 THEN trigger_schedules.next_run_at
                        ELSE excluded.next_run_at END",
            )
            .text(tenant.as_str())
            .text(automation.as_str())
            .int32(version)
            .text(spec)
            .opt_int(next_run_at)
            .bool(keep_due)
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn remove_schedule(&self, tenant: &TenantId, automation: &AutomationId) -> Result<()> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            on(
                "trigger_schedules",
                "DELETE FROM trigger_schedules WHERE tenant_id = $1 AND automation_id = $2",
            )
            .text(tenant.as_str())
            .text(automation.as_str())
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
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
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            let moved = on(
                "trigger_schedules",
                "UPDATE trigger_schedules SET next_run_at = $4,
                    last_run_id = COALESCE($5, last_run_id),
                    last_run_at = CASE WHEN $5 IS NULL THEN last_run_at ELSE $6 END
                 WHERE tenant_id = $1 AND automation_id = $2 AND next_run_at = $3",
            )
            .text(tenant.as_str())
            .text(automation.as_str())
            .int(from)
            .opt_int(next)
            .opt_text(run.map(|r| r.as_str()))
            .int(now)
            .execute::<DriverOf<R>>(&mut tx)
            .await?
                > 0;
            tx.commit().await?;
            Ok(moved)
        })
        .await
    }

    async fn next_run_at(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
    ) -> Result<Option<i64>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let row = on(
                "trigger_schedules",
                "SELECT next_run_at FROM trigger_schedules
                 WHERE tenant_id = $1 AND automation_id = $2",
            )
            .text(tenant.as_str())
            .text(automation.as_str())
            .fetch_optional::<DriverOf<R>>(&mut conn)
            .await?;
            Ok(row.map(|r| r.opt_int("next_run_at")).transpose()?.flatten())
        })
        .await
    }
}
