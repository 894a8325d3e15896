//! Offboarding (docs/operations.md, "Offboarding a tenant"): the holder of
//! the wake erases the rows of the tenants being deleted, in batches, until
//! none is left, then ends each deletion with the platform's audit row of
//! it ([`tok_store::OffboardingStore`]).
//!
//! A pass takes at most [`SchedulerConfig::erasure_batches`] batches of
//! [`SchedulerConfig::erasure_batch`] rows, table by table in the order of
//! [`tok_store::ERASED`], each batch its own short statement (on SQLite in
//! the writer's bulk lane, behind any claim, record or webhook). A pass
//! that ran out of batches leaves the rest to the next, a tick later. Its
//! progress is the rows: a pass cut short (a crash, the lease moving to
//! another node) is taken up by the next holder from what is left.
//!
//! [`SchedulerConfig::erasure_batches`]: super::SchedulerConfig::erasure_batches
//! [`SchedulerConfig::erasure_batch`]: super::SchedulerConfig::erasure_batch

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tok_core::ids::TenantId;
use tok_store::{ERASED, Finished, NewAudit, Target};

use super::Scheduler;
use crate::{Inner, Result};

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErasureReport {
    /// Rows erased.
    pub erased: u64,
    /// Tenants whose deletion ended: no row of them is left.
    pub finished: Vec<TenantId>,
    /// Rows are left for the next pass.
    pub more: bool,
}

/// The platform's audit row of a deletion that ended: the tenant by its id
/// alone, none of its data.
fn erased_row(tenant: &TenantId, asked_at: Option<i64>) -> NewAudit {
    NewAudit {
        tenant_id: None,
        actor: tok_store::Actor {
            kind: tok_store::ActorKind::Platform,
            id: None,
            name: Some("tok (scheduler)".into()),
        },
        action: "tenant.erased".into(),
        target: Target {
            kind: "tenant".into(),
            id: Some(tenant.to_string()),
        },
        summary: Some(match asked_at {
            Some(at) => format!(
                "every row of the tenant erased (its deletion was asked at {})",
                tok_store::rfc3339::format(at)
            ),
            None => "every row of the tenant erased".into(),
        }),
    }
}

impl Scheduler {
    /// One pass of the erasure of the tenants being deleted, lease or not
    /// (the engine's holder runs one every tick while rows are left).
    pub async fn erase_deleted_tenants(&self) -> Result<ErasureReport> {
        let store = &*self.store;
        let mut report = ErasureReport::default();
        let mut budget = self.config.erasure_batches.max(1);
        for tenant in store.deleting_tenants().await? {
            match self.erase(&tenant, &mut budget, &mut report).await {
                Err(e) if e.is_tenant_database_away() => {
                    tracing::warn!(%tenant, error = %e, "the erasure of a deleted tenant waits for its database");
                    report.more = true;
                }
                other => other?,
            }
            if budget == 0 {
                report.more = true;
                break;
            }
        }
        Ok(report)
    }

    /// Erases what `budget` allows of `tenant`'s rows, and ends its
    /// deletion once none is left.
    async fn erase(
        &self,
        tenant: &TenantId,
        budget: &mut u32,
        report: &mut ErasureReport,
    ) -> tok_store::Result<()> {
        let store = &*self.store;
        let batch = self.config.erasure_batch.max(1);
        for table in ERASED {
            loop {
                if *budget == 0 {
                    return Ok(());
                }
                *budget -= 1;
                let erased = store.erase_tenant_rows(tenant, table.name, batch).await?;
                report.erased += erased;
                metrics::counter!("tok_tenant_rows_erased_total").increment(erased);
                if erased == 0 {
                    break;
                }
                // Whatever else waits for the database goes first.
                tokio::task::yield_now().await;
            }
        }
        let asked_at = store.tenant(tenant).await?.and_then(|t| t.deleting_since);
        match store
            .finish_tenant_deletion(tenant, erased_row(tenant, asked_at))
            .await?
        {
            Finished::Done => {
                tracing::info!(%tenant, "a deleted tenant's rows are all erased, and its row with them");
                report.finished.push(tenant.clone());
            }
            // Written meanwhile by a step that was under way: the next
            // pass takes it.
            Finished::RowsLeft(table) => {
                tracing::debug!(%tenant, table, "rows of a deleted tenant were written meanwhile");
                report.more = true;
            }
            Finished::NotDeleting => {}
        }
        Ok(())
    }
}

/// The holder's erasure, beside the wake loop so that a long pass never
/// delays a tick: a pass every tick while this node holds the lease (a
/// pass with no tenant being deleted is one small read).
pub(super) async fn offboarding_loop(
    scheduler: Arc<Scheduler>,
    inner: Arc<Inner>,
    holds: Arc<AtomicBool>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let tick = inner.config.scheduler.tick;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = shutdown.changed() => {}
        }
        if crate::stopping(&shutdown) {
            return;
        }
        if !holds.load(Ordering::SeqCst) {
            continue;
        }
        match scheduler.erase_deleted_tenants().await {
            Ok(report) if !report.finished.is_empty() => {
                tracing::info!(tenants = report.finished.len(), "deleted tenants erased");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the erasure of deleted tenants failed; trying again next tick")
            }
        }
    }
}
