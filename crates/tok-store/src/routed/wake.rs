//! What the node holding the scheduler's wake asks over every tenant it
//! serves, on the routed store: the wake's lease, which is the shared
//! database's (one per cluster), and the schedules due, the operations
//! running and the queue's samples, each database asked for its own
//! tenants at once ([`RoutedStore::by_database`]) and the answers put
//! together. The calls about one tenant of these traits are written once
//! for every store (`crate::sql::Route`).

use async_trait::async_trait;
use tok_core::ids::{AutomationId, TenantId};

use super::RoutedStore;
use crate::{
    DueTrigger, Operation, OperationLoop, QueueSampling, Result, SchedulerWake, StaleSchedule,
};

#[async_trait]
impl SchedulerWake for RoutedStore {
    async fn hold_wake(
        &self,
        holder: &str,
        incarnation: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<bool> {
        self.shared()
            .hold_wake(holder, incarnation, now, lease_ms)
            .await
    }

    async fn release_wake(&self, incarnation: &str) -> Result<()> {
        self.shared().release_wake(incarnation).await
    }

    async fn stale_schedules(
        &self,
        tenants: &[TenantId],
    ) -> Result<(Vec<StaleSchedule>, Vec<(TenantId, AutomationId)>)> {
        let (mut stale, mut gone) = (Vec::new(), Vec::new());
        let parts = self
            .by_database("schedules", tenants, |db, tenants| async move {
                db.stale_schedules(&tenants).await
            })
            .await?;
        for (s, g) in parts {
            stale.extend(s);
            gone.extend(g);
        }
        Ok((stale, gone))
    }

    async fn due(&self, tenants: &[TenantId], now: i64, limit: u32) -> Result<Vec<DueTrigger>> {
        let parts = self
            .by_database("due schedules", tenants, |db, tenants| async move {
                db.due(&tenants, now, limit).await
            })
            .await?;
        let mut due: Vec<DueTrigger> = parts.into_iter().flatten().collect();
        due.sort_by_key(|d| d.due_at);
        due.truncate(limit as usize);
        Ok(due)
    }
}

#[async_trait]
impl OperationLoop for RoutedStore {
    async fn running_operations(&self, tenants: &[TenantId]) -> Result<Vec<Operation>> {
        let parts = self
            .by_database("running operations", tenants, |db, tenants| async move {
                db.running_operations(&tenants).await
            })
            .await?;
        Ok(parts.into_iter().flatten().collect())
    }
}

#[async_trait]
impl QueueSampling for RoutedStore {
    // Each database samples its own tenants, in one statement each.
    async fn sample_queue(&self, tenants: &[TenantId], at: i64, window_ms: i64) -> Result<u64> {
        let written = self
            .by_database("queue samples", tenants, |db, tenants| async move {
                db.sample_queue(&tenants, at, window_ms).await
            })
            .await?;
        Ok(written.into_iter().sum())
    }
}
