//! A dispatch over tenants of several databases: one transaction on each
//! (see the module doc of [`super`]), each call to one bounded as every
//! call to its database is ([`Database::call`]). A database whose events
//! cannot be read is left out of this dispatch (its transaction rolled
//! back, its events pending for the next one); the others go on.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::join_all;
use serde_json::Value;
use tok_core::ids::{AutomationId, EventId, RunId, TenantId};
use tok_core::start::KeyState;

use super::database::Database;
use crate::dispatch::{Claims, DispatchTx};
use crate::{Candidate, Cause, ClaimedJob, NewEvent, NewRun, PendingEvent, Result, StoreError};

/// One database's transaction of the dispatch.
pub(super) struct Part {
    pub(super) db: Arc<Database>,
    pub(super) tx: Box<dyn DispatchTx>,
}

pub(super) struct SplitDispatch {
    /// `None`: left out after it failed.
    parts: Vec<Option<Part>>,
    /// Tenant → index in `parts`.
    by_tenant: HashMap<TenantId, usize>,
    /// Event selected by `pending_events` → index in `parts`.
    by_event: HashMap<EventId, usize>,
}

impl SplitDispatch {
    /// The dispatch over `parts`, each with the tenants it was begun for.
    pub(super) fn new(parts: Vec<(Part, Vec<TenantId>)>) -> Self {
        let mut split = Self {
            parts: Vec::with_capacity(parts.len()),
            by_tenant: HashMap::new(),
            by_event: HashMap::new(),
        };
        for (part, tenants) in parts {
            for tenant in tenants {
                split.by_tenant.insert(tenant, split.parts.len());
            }
            split.parts.push(Some(part));
        }
        split
    }

    fn part(&mut self, tenant: &TenantId) -> Result<&mut Part> {
        self.by_tenant
            .get(tenant)
            .and_then(|&i| self.parts[i].as_mut())
            .ok_or(StoreError::NotFound("tenant of this dispatch"))
    }
}

#[async_trait]
impl DispatchTx for SplitDispatch {
    async fn pending_events(&mut self, limit: u32) -> Result<Vec<PendingEvent>> {
        let read = join_all(self.parts.iter_mut().map(|slot| async move {
            match slot {
                Some(part) => Some(part.db.call(part.tx.pending_events(limit)).await),
                None => None,
            }
        }))
        .await;
        let mut all = Vec::new();
        let mut failed = None;
        let mut answered = 0;
        for (i, events) in read.into_iter().enumerate() {
            match events {
                None => {}
                Some(Ok(events)) => {
                    answered += 1;
                    // Each database's events come fair between its
                    // tenants; put together, every tenant's first event
                    // comes before any tenant's second, whatever its
                    // database.
                    let mut rank: HashMap<TenantId, usize> = HashMap::new();
                    for event in events {
                        let r = rank.entry(event.tenant_id.clone()).or_default();
                        all.push((*r, event.received_at, i, event));
                        *r += 1;
                    }
                }
                Some(Err(e)) => {
                    if let Some(part) = self.parts[i].take() {
                        part.db.skipped("dispatch", &e);
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        if answered == 0
            && let Some(e) = failed
        {
            return Err(e);
        }
        if answered > 1 {
            all.sort_by_key(|(rank, received_at, i, _)| (*rank, *received_at, *i));
        }
        all.truncate(limit as usize);
        Ok(all
            .into_iter()
            .map(|(_, _, i, event)| {
                self.by_event.insert(event.id.clone(), i);
                event
            })
            .collect())
    }

    async fn pending_event(
        &mut self,
        tenant: &TenantId,
        id: &EventId,
    ) -> Result<Option<PendingEvent>> {
        let Some(&i) = self.by_tenant.get(tenant) else {
            return Ok(None);
        };
        let Some(part) = self.parts[i].as_mut() else {
            return Ok(None);
        };
        let event = part.db.call(part.tx.pending_event(tenant, id)).await?;
        if let Some(event) = &event {
            self.by_event.insert(event.id.clone(), i);
        }
        Ok(event)
    }

    async fn accept(&mut self, tenant: &TenantId, event: &NewEvent) -> Result<EventId> {
        let part = self.part(tenant)?;
        part.db.call(part.tx.accept(tenant, event)).await
    }

    async fn candidates(&mut self, event: &PendingEvent) -> Result<Vec<Candidate>> {
        let part = self.part(&event.tenant_id)?;
        part.db.call(part.tx.candidates(event)).await
    }

    async fn runs_on_ticket(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        ticket: &str,
        since: i64,
    ) -> Result<i64> {
        let part = self.part(tenant)?;
        let asked = part.tx.runs_on_ticket(tenant, automation, ticket, since);
        part.db.call(asked).await
    }

    async fn tenant_limits(&mut self, tenant: &TenantId) -> Result<tok_core::quotas::TenantLimits> {
        let part = self.part(tenant)?;
        part.db.call(part.tx.tenant_limits(tenant)).await
    }

    async fn recent_starts(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        since: i64,
        limit: u32,
    ) -> Result<Vec<i64>> {
        let part = self.part(tenant)?;
        let asked = part.tx.recent_starts(tenant, automation, since, limit);
        part.db.call(asked).await
    }

    async fn trace(
        &mut self,
        tenant: &TenantId,
        ticket_id: &str,
        kind: &str,
        message: &str,
        cause: &Cause,
    ) -> Result<()> {
        let part = self.part(tenant)?;
        let written = part.tx.trace(tenant, ticket_id, kind, message, cause);
        part.db.call(written).await
    }

    async fn insert_runs(
        &mut self,
        runs: &[(TenantId, EventId, NewRun)],
        claims: Option<Claims<'_>>,
    ) -> Result<Vec<ClaimedJob>> {
        let mut by_part: Vec<Vec<(TenantId, EventId, NewRun)>> = vec![Vec::new(); self.parts.len()];
        for run in runs {
            let i = *self
                .by_tenant
                .get(&run.0)
                .ok_or(StoreError::NotFound("tenant of this dispatch"))?;
            by_part[i].push(run.clone());
        }
        let mut claimed = Vec::new();
        for (slot, runs) in self.parts.iter_mut().zip(&by_part) {
            if runs.is_empty() {
                continue;
            }
            let part = slot
                .as_mut()
                .ok_or(StoreError::NotFound("database of this dispatch"))?;
            let claims = claims.as_ref().map(|c| Claims {
                node: c.node,
                lease_ms: c.lease_ms,
                runs: c.runs,
            });
            claimed.extend(part.db.call(part.tx.insert_runs(runs, claims)).await?);
        }
        // In the order of `runs`, as one database answers.
        let order: HashMap<&RunId, usize> = runs
            .iter()
            .enumerate()
            .map(|(n, (_, _, run))| (&run.id, n))
            .collect();
        claimed.sort_by_key(|job| order.get(&job.run_id).copied().unwrap_or(usize::MAX));
        Ok(claimed)
    }

    async fn flow_key(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        control: &str,
        key: &str,
    ) -> Result<Option<KeyState>> {
        let part = self.part(tenant)?;
        let asked = part.tx.flow_key(tenant, automation, control, key);
        part.db.call(asked).await
    }

    async fn put_flow_key(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        control: &str,
        key: &str,
        state: &KeyState,
    ) -> Result<()> {
        let part = self.part(tenant)?;
        let written = part
            .tx
            .put_flow_key(tenant, automation, control, key, state);
        part.db.call(written).await
    }

    async fn run_context(&mut self, tenant: &TenantId, run: &RunId) -> Result<Option<Value>> {
        let part = self.part(tenant)?;
        part.db.call(part.tx.run_context(tenant, run)).await
    }

    async fn join_run(
        &mut self,
        tenant: &TenantId,
        run: &RunId,
        context: &Value,
        delay_ms: i64,
    ) -> Result<bool> {
        let part = self.part(tenant)?;
        let joined = part.tx.join_run(tenant, run, context, delay_ms);
        part.db.call(joined).await
    }

    async fn cancel_run(&mut self, tenant: &TenantId, run: &RunId, reason: &str) -> Result<()> {
        let part = self.part(tenant)?;
        part.db.call(part.tx.cancel_run(tenant, run, reason)).await
    }

    async fn cancel_paths(
        &mut self,
        tenant: &TenantId,
        sources: &[&str],
    ) -> Result<Vec<(String, String)>> {
        let part = self.part(tenant)?;
        part.db.call(part.tx.cancel_paths(tenant, sources)).await
    }

    async fn cancel_matches(
        &mut self,
        tenant: &TenantId,
        source: &str,
        path: &str,
        value: &str,
    ) -> Result<Vec<(RunId, Option<Value>)>> {
        let part = self.part(tenant)?;
        let asked = part.tx.cancel_matches(tenant, source, path, value);
        part.db.call(asked).await
    }

    async fn mark_dispatched(&mut self, events: &[EventId]) -> Result<()> {
        let mut by_part: Vec<Vec<EventId>> = vec![Vec::new(); self.parts.len()];
        for event in events {
            let i = *self
                .by_event
                .get(event)
                .ok_or(StoreError::NotFound("event of this dispatch"))?;
            by_part[i].push(event.clone());
        }
        for (slot, events) in self.parts.iter_mut().zip(&by_part) {
            if events.is_empty() {
                continue;
            }
            let part = slot
                .as_mut()
                .ok_or(StoreError::NotFound("database of this dispatch"))?;
            part.db.call(part.tx.mark_dispatched(events)).await?;
        }
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        let committed =
            join_all(self.parts.into_iter().flatten().map(|part| async move {
                (part.db.clone(), part.db.call(part.tx.commit()).await)
            }))
            .await;
        let mut failed = None;
        for (db, answer) in committed {
            if let Err(e) = answer {
                tracing::warn!(database = %db.name, error = %e, "a dispatch commit failed on one database; its events stay pending");
                failed.get_or_insert(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
