//! [`DispatchTx`], the dispatcher's transaction: pending events of the inbox
//! become runs and their first jobs, one transaction per batch of events.
//!
//! The store offers the mechanisms only — select the events, find the
//! automations they trigger, count a ticket's recent runs, write the runs
//! and mark the events — and the dispatcher (`tok-engine`'s `dispatch`)
//! decides with them: which of the selected events a batch takes, which
//! runs each one starts, which of them the dispatching process runs itself.

use std::collections::HashSet;

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::{AutomationId, EventId, RunId, TenantId};
use tok_core::start::KeyState;

use crate::{Candidate, Cause, ClaimedJob, NewRun, PendingEvent, Result};

/// New runs whose first jobs [`DispatchTx::insert_runs`] writes already
/// claimed by the dispatching node, which starts them at once.
pub struct Claims<'a> {
    /// The node the jobs are leased to.
    pub node: &'a str,
    pub lease_ms: i64,
    /// The runs, by id; each has a first step due now and no queue key.
    pub runs: &'a HashSet<RunId>,
}

/// The dispatcher's transaction, open, for the tenants it was begun with
/// ([`crate::InboxStore::begin_dispatch`]). [`DispatchTx::commit`] commits
/// everything written through it; dropping it rolls back, and the events
/// stay pending for the next dispatch.
#[async_trait]
pub trait DispatchTx: Send {
    /// Up to `limit` pending events of the tenants, fair between them: each
    /// tenant's oldest first, round robin (every tenant's first event, then
    /// every tenant's second, …), any tenant filling the batch when the
    /// others have none. They stay locked until the transaction ends:
    /// another dispatch skips them.
    async fn pending_events(&mut self, limit: u32) -> Result<Vec<PendingEvent>>;

    /// The pending event `id` of `tenant` (one of the transaction's
    /// tenants), locked like [`DispatchTx::pending_events`]' events; `None`
    /// when it is no longer pending or another dispatch holds it. The
    /// dispatcher takes the events of a failed batch one at a time with it.
    async fn pending_event(
        &mut self,
        tenant: &TenantId,
        id: &EventId,
    ) -> Result<Option<PendingEvent>>;

    /// Writes `event` of `tenant` (one of the transaction's tenants) into
    /// the inbox, pending, in this transaction: a start that passes its
    /// automation's start controls as an event would (a manual or a
    /// scheduled start) dispatches it at once with
    /// [`DispatchTx::pending_event`]. Nothing of it is seen outside until
    /// the transaction commits, so no other dispatch takes it.
    async fn accept(&mut self, tenant: &TenantId, event: &crate::NewEvent) -> Result<EventId>;

    /// The active automations `event` triggers, with their current
    /// definitions: its target automation when it has one, else those whose
    /// trigger is its kind and [`PendingEvent::trigger_key`], by id.
    /// (`recent_runs_on_ticket` is 0: counting is
    /// [`DispatchTx::runs_on_ticket`].)
    async fn candidates(&mut self, event: &PendingEvent) -> Result<Vec<Candidate>>;

    /// Runs of `automation` on `ticket` created after `since` (Unix ms).
    async fn runs_on_ticket(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        ticket: &str,
        since: i64,
    ) -> Result<i64>;

    /// The tenant's quotas as the admin set them (its `startsPerMinute`
    /// is the start limit of its automations that set none).
    async fn tenant_limits(&mut self, tenant: &TenantId) -> Result<tok_core::quotas::TenantLimits>;

    /// The creation times (Unix ms) of the latest `limit` runs of
    /// `automation` created after `since`, newest first, refused runs left
    /// out: what `settings.limits.startsPerMinute` counts. The
    /// automation's starts stay locked until the transaction ends (a
    /// manual start of it waits).
    async fn recent_starts(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        since: i64,
        limit: u32,
    ) -> Result<Vec<i64>>;

    /// Writes a line to a ticket's trace.
    async fn trace(
        &mut self,
        tenant: &TenantId,
        ticket_id: &str,
        kind: &str,
        message: &str,
        cause: &Cause,
    ) -> Result<()>;

    /// Writes runs (with the steps the dispatch ran for them) and their
    /// first jobs, each kind of row in one statement. A run whose (event,
    /// automation) already has one is not written, nor its steps and job:
    /// dispatching an event again creates nothing twice. The jobs of
    /// `claims`' runs are written leased to its node and returned, in the
    /// order of `runs`, as many of each tenant's as its concurrency cap
    /// leaves room for (`settings.limits.concurrency`, counted across every
    /// process); the others are ready for any worker (and workers of other
    /// processes hear of them when the transaction commits).
    async fn insert_runs(
        &mut self,
        runs: &[(TenantId, EventId, NewRun)],
        claims: Option<Claims<'_>>,
    ) -> Result<Vec<ClaimedJob>>;

    /// The row of `key` of `automation`'s start control `control`
    /// (`tok_core::start`), with what the run it names is now; the key
    /// stays locked until the transaction ends, so a dispatch deciding on
    /// the same key waits for this one's decision.
    async fn flow_key(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        control: &str,
        key: &str,
    ) -> Result<Option<KeyState>>;

    /// Writes the row of a start control's key.
    async fn put_flow_key(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        control: &str,
        key: &str,
        state: &KeyState,
    ) -> Result<()>;

    /// The context of a written run.
    async fn run_context(&mut self, tenant: &TenantId, run: &RunId) -> Result<Option<Value>>;

    /// An event joins the open run `run` (a debounce's, a batch's): the
    /// run's context becomes `context` and its first job is due `delay_ms`
    /// from now. False, with nothing changed, when a worker claimed that
    /// job meanwhile (the run began; the event needs a run of its own).
    async fn join_run(
        &mut self,
        tenant: &TenantId,
        run: &RunId,
        context: &Value,
        delay_ms: i64,
    ) -> Result<bool>;

    /// Cancels the run `run` if it is unfinished, with `reason` as its
    /// error (and its compensation, like a cancel through the API); its
    /// `flow.cancelOn` rows go.
    async fn cancel_run(&mut self, tenant: &TenantId, run: &RunId, reason: &str) -> Result<()>;

    /// The (source, path) pairs of `flow.cancelOn` rows of the tenant's
    /// unfinished runs that events of one of `sources` may cancel (rows of
    /// finished runs that come up are deleted).
    async fn cancel_paths(
        &mut self,
        tenant: &TenantId,
        sources: &[&str],
    ) -> Result<Vec<(String, String)>>;

    /// The unfinished runs whose `flow.cancelOn` row of `source` says
    /// `value` at `path`, with the row's `where` (a filter): at most a
    /// thousand rows are read for one event, so one dispatch stays short.
    async fn cancel_matches(
        &mut self,
        tenant: &TenantId,
        source: &str,
        path: &str,
        value: &str,
    ) -> Result<Vec<(RunId, Option<Value>)>>;

    /// Marks events of the tenants dispatched.
    async fn mark_dispatched(&mut self, events: &[EventId]) -> Result<()>;

    async fn commit(self: Box<Self>) -> Result<()>;
}
