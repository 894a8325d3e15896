//! One dispatch transaction: the dispatcher's decisions over the store's
//! mechanisms ([`DispatchTx`]).
//!
//! Of the events the store selects (round robin between tenants), a
//! crowding tenant's may wait for the next dispatch
//! ([`crate::fairness::Crowding`]); a full batch mostly of one tenant's
//! names its backlog ([`crate::fairness::filled_by`]). Each event's
//! candidates are looked up once per trigger and batch, its ticket's recent
//! runs counted for the loop protection (with the runs planned earlier in
//! the batch), and [`super::plan`] decides its runs; the loop protection's
//! notes go to the ticket's trace. Before an event's runs, the runs it
//! cancels (`flow.cancelOn`) are cancelled; each run of an automation with
//! a start control passes its key's row ([`super::gate`]) before the start
//! limits count it. The runs the dispatching process starts itself are
//! written already claimed by it (never a run its control holds).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tok_core::ids::{AutomationId, EventId, RunId, TenantId};
use tok_core::run::FlowStart;
use tok_store::{Candidate, Cause, ClaimedJob, Claims, DispatchTx, PendingEvent, Plan, now_ms};

use tok_core::limits::{START_WINDOW_MS, start_allowed, start_rate_exceeded};

use super::gate::{CancelPaths, Gated, Keys, cancel_on};
use super::plan::{PlannedOnTickets, TICKET_WINDOW_MS};
use crate::fairness::{self, Crowding};

/// The dispatcher's pure decision for one event: given the event, the
/// automations whose trigger matches and whether its tenant's runs may
/// begin their leading control steps, which runs to create.
pub(crate) type Planner<'a> = &'a (dyn Fn(&PendingEvent, &[Candidate], bool) -> Plan + Send + Sync);

/// Told the runs a dispatch writes, as they are written (for the stream).
pub(crate) type Noted<'a> = &'a (dyn Fn(&[(TenantId, EventId, tok_store::NewRun)]) + Send + Sync);

/// A dispatching process's offer to run new jobs itself. It is asked once
/// for each new run whose first step is due now and has no queue key, in
/// the order the runs are written, whether it takes that run's job.
pub(crate) struct Handoff<'a> {
    /// The node the taken jobs are leased to.
    pub(crate) node: &'a str,
    pub(crate) lease_ms: i64,
    pub(crate) take: &'a mut (dyn FnMut(&TenantId) -> bool + Send),
}

/// What one dispatch transaction did.
#[derive(Debug, Default)]
pub struct Dispatched {
    /// Events selected but left pending for the next dispatch (a crowding
    /// tenant's, while other tenants' went first).
    pub left: usize,
    /// When each event taken from the inbox was received (Unix ms), for the
    /// inbox lag.
    pub received_at: Vec<i64>,
    /// Jobs written claimed by the [`Handoff`]'s node, for it to run now.
    pub claimed: Vec<ClaimedJob>,
    /// The tenant whose events filled most of a full batch: it has a
    /// backlog, and other tenants' new events need not wait behind it
    /// (the dispatcher takes those apart, in the urgent lane).
    pub backlog: Option<TenantId>,
    /// Runs that ended in the dispatch (all their steps ran there, or a
    /// start limit refused them), for their traces (empty unless traces
    /// are exported).
    pub ended: Vec<(TenantId, tok_core::ids::RunId)>,
    /// The open runs events joined (a start control's debounce or batch),
    /// by event.
    pub joined: Vec<(EventId, tok_core::ids::RunId)>,
}

impl Dispatched {
    /// Events taken from the inbox.
    pub fn events(&self) -> usize {
        self.received_at.len()
    }
}

/// Which automations an event's trigger finds: the same for every event of
/// a batch with the same tenant, target, trigger key and kind.
type Trigger = (TenantId, Option<AutomationId>, Option<String>, String);

fn trigger(event: &PendingEvent) -> Trigger {
    (
        event.tenant_id.clone(),
        event.target_automation_id.clone(),
        event.trigger_key().map(str::to_owned),
        event.source_kind.clone(),
    )
}

/// Which events a dispatch takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Select<'a> {
    /// Up to this many pending events, fair between the tenants.
    Batch(u32),
    /// This one event alone, if it is still pending: the events of a batch
    /// that failed are dispatched again one by one, so that one event at
    /// fault does not hold back the others.
    One(&'a TenantId, &'a EventId),
}

/// Why a dispatch wrote nothing (its transaction rolled back: its events
/// are pending as before).
#[derive(Debug)]
pub(crate) enum Failure {
    /// The store failed.
    Store(tok_store::StoreError),
    /// Planning one event's runs failed (it panicked): that event is at
    /// fault, whatever the others.
    Planning {
        tenant: TenantId,
        event: EventId,
        message: String,
    },
}

impl From<tok_store::StoreError> for Failure {
    fn from(e: tok_store::StoreError) -> Self {
        Failure::Store(e)
    }
}

/// A dispatch that failed, with the events it had taken.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) failure: Failure,
    pub(crate) events: Vec<(TenantId, EventId)>,
}

/// Whether the runs of a tenant's events may begin their leading control
/// steps at dispatch (`false`: the authorizer denies its runs, and a claim
/// fails them at their first step). Asked once per tenant and dispatch.
pub(crate) type MayBegin<'a> =
    &'a (dyn Fn(TenantId) -> futures_util::future::BoxFuture<'static, bool> + Send + Sync);

/// What a dispatch decides with, besides its transaction: the planner,
/// whether a tenant's runs may begin, what the stream is told, and the
/// crowding kept between dispatches.
pub(crate) struct Deciders<'a> {
    pub(crate) planner: Planner<'a>,
    pub(crate) may_begin: MayBegin<'a>,
    pub(crate) noted: Noted<'a>,
    pub(crate) crowding: &'a Mutex<Crowding>,
}

/// Dispatches the pending events `select` names through `tx` and commits:
/// each taken event's runs and their first jobs are written and the event
/// is marked dispatched, all or nothing. `bulk`: a bulk dispatch (the
/// urgent one does not alternate with the crowd, see [`Crowding`]). On
/// failure, nothing is written, and the answer names the events taken.
pub(crate) async fn dispatch(
    tx: Box<dyn DispatchTx>,
    select: Select<'_>,
    bulk: bool,
    deciders: &Deciders<'_>,
    handoff: Option<Handoff<'_>>,
) -> Result<Dispatched, Failed> {
    let mut taken = Vec::new();
    let dispatched = dispatch_in(tx, select, bulk, deciders, handoff, &mut taken).await;
    dispatched.map_err(|failure| Failed {
        failure,
        events: taken,
    })
}

async fn dispatch_in(
    mut tx: Box<dyn DispatchTx>,
    select: Select<'_>,
    bulk: bool,
    deciders: &Deciders<'_>,
    mut handoff: Option<Handoff<'_>>,
    taken: &mut Vec<(TenantId, EventId)>,
) -> Result<Dispatched, Failure> {
    let Deciders {
        planner,
        may_begin,
        noted,
        crowding,
    } = *deciders;
    let (events, selected, backlog, crowd) = match select {
        Select::Batch(limit) => {
            let events = tx.pending_events(limit).await?;
            let owners: Vec<&TenantId> = events.iter().map(|e| &e.tenant_id).collect();
            let mut crowding = crowding.lock().unwrap_or_else(|e| e.into_inner());
            let backlog = fairness::filled_by(&owners, limit as usize);
            let crowd = crowding.leave(&owners, bulk);
            drop(crowding);
            let selected = events.len();
            (events, selected, backlog, crowd)
        }
        Select::One(tenant, id) => {
            let events: Vec<PendingEvent> =
                tx.pending_event(tenant, id).await?.into_iter().collect();
            let selected = events.len();
            (events, selected, None, None)
        }
    };
    let events: Vec<PendingEvent> = match &crowd {
        Some(crowd) => events
            .into_iter()
            .filter(|e| &e.tenant_id != crowd)
            .collect(),
        None => events,
    };
    taken.extend(events.iter().map(|e| (e.tenant_id.clone(), e.id.clone())));
    // Whether each tenant's runs may begin here, asked once per dispatch.
    let mut begins: HashMap<TenantId, bool> = HashMap::new();
    for event in &events {
        if !begins.contains_key(&event.tenant_id) {
            let may = may_begin(event.tenant_id.clone()).await;
            begins.insert(event.tenant_id.clone(), may);
        }
    }
    let now = now_ms();
    // Events of one batch mostly share their automations: each trigger is
    // looked up once per batch.
    let mut matching: HashMap<Trigger, Vec<Candidate>> = HashMap::new();
    let mut on_tickets = PlannedOnTickets::default();
    // Start limits: an automation's starts of the last minute, read (and
    // locked) once per batch, with the runs this batch starts added.
    let mut starts: HashMap<(TenantId, AutomationId), Vec<i64>> = HashMap::new();
    // The tenants' own start limit, for their automations that set none:
    // read once per tenant and batch.
    let mut tenant_limits: HashMap<TenantId, tok_core::quotas::TenantLimits> = HashMap::new();
    let mut runs = Vec::new();
    // The start controls' keys this batch decided on.
    let mut keys = Keys::default();
    let mut cancel_paths = CancelPaths::default();
    let mut joined = Vec::new();
    let mut dispatched: Vec<EventId> = Vec::with_capacity(events.len());
    let mut received_at = Vec::with_capacity(events.len());
    for event in &events {
        received_at.push(event.received_at);
        dispatched.push(event.id.clone());
        let key = trigger(event);
        if !matching.contains_key(&key) {
            let found = tx.candidates(event).await?;
            matching.insert(key.clone(), found);
        }
        // The runs this event cancels go before the runs it starts.
        cancel_on(&mut *tx, &mut cancel_paths, &mut runs, event).await?;
        let cached = &matching[&key];
        if cached.is_empty() {
            // No automation listens: nothing to plan.
            continue;
        }
        let begin = begins.get(&event.tenant_id).copied().unwrap_or(false);
        let plan_of = |candidates: &[Candidate]| plan_guarded(planner, event, candidates, begin);
        let plan = match &event.subject_ticket_id {
            None => plan_of(cached)?,
            Some(ticket) => {
                let mut found = cached.clone();
                for candidate in &mut found {
                    let written = tx
                        .runs_on_ticket(
                            &event.tenant_id,
                            &candidate.automation_id,
                            ticket,
                            now - TICKET_WINDOW_MS,
                        )
                        .await?;
                    let planned =
                        on_tickets.planned(&event.tenant_id, &candidate.automation_id, ticket);
                    candidate.recent_runs_on_ticket = written + planned;
                }
                let plan = plan_of(&found)?;
                on_tickets.add(event, ticket, &plan);
                plan
            }
        };
        for note in &plan.notes {
            let cause = Cause {
                automation_id: Some(note.automation_id.clone()),
                ..Default::default()
            };
            tx.trace(
                &event.tenant_id,
                &note.ticket_id,
                &note.kind,
                &note.message,
                &cause,
            )
            .await?;
        }
        let mut flow: HashMap<RunId, FlowStart> = plan
            .flow
            .into_iter()
            .map(|f| (f.run_id.clone(), f))
            .collect();
        for mut run in plan.runs {
            let mut key = None;
            if let Some(start) = flow.remove(&run.id) {
                match keys
                    .gate(&mut *tx, &mut runs, &event.tenant_id, &start, run, now)
                    .await?
                {
                    Gated::Joined(open) => {
                        joined.push((event.id.clone(), open));
                        continue;
                    }
                    Gated::Run(gated, _) if gated.skipped.is_some() => {
                        runs.push((event.tenant_id.clone(), event.id.clone(), *gated));
                        continue;
                    }
                    Gated::Run(gated, of) => {
                        run = *gated;
                        key = of;
                    }
                }
            }
            let own = starts_per_minute(cached, &run.automation_id);
            let tenant_limit = if own.is_none() {
                if !tenant_limits.contains_key(&event.tenant_id) {
                    let limits = tx.tenant_limits(&event.tenant_id).await?;
                    tenant_limits.insert(event.tenant_id.clone(), limits);
                }
                tenant_limits[&event.tenant_id].starts_per_minute
            } else {
                None
            };
            if let Some(per_minute) = own.or(tenant_limit) {
                let key = (event.tenant_id.clone(), run.automation_id.clone());
                if !starts.contains_key(&key) {
                    let since = now - START_WINDOW_MS;
                    let recent = tx
                        .recent_starts(&event.tenant_id, &run.automation_id, since, per_minute)
                        .await?;
                    starts.insert(key.clone(), recent);
                }
                let recent = starts.entry(key).or_default();
                match start_allowed(recent, per_minute, now) {
                    Ok(()) => recent.insert(0, now),
                    Err(_) => refuse(&mut run, per_minute),
                }
            }
            if let Some(key) = key {
                let written = run.refused.is_none().then_some(runs.len());
                keys.planned(&key, written);
            }
            runs.push((event.tenant_id.clone(), event.id.clone(), run));
        }
    }
    // The runs the dispatching node starts itself: their first step is due
    // now, and no queue key orders them behind another run's job.
    let mut taken = HashSet::new();
    if let Some(handoff) = handoff.as_mut() {
        for (tenant, _, run) in &runs {
            let due = run.first_path.is_some() && run.hold.is_none();
            if due && run.queue_key.is_none() && (handoff.take)(tenant) {
                taken.insert(run.id.clone());
            }
        }
    }
    let claims = handoff.as_ref().map(|h| Claims {
        node: h.node,
        lease_ms: h.lease_ms,
        runs: &taken,
    });
    let claimed = tx.insert_runs(&runs, claims).await?;
    noted(&runs);
    keys.write(&mut *tx).await?;
    if !dispatched.is_empty() {
        tx.mark_dispatched(&dispatched).await?;
    }
    tx.commit().await?;
    let ended = if crate::traces::enabled() {
        runs.iter()
            .filter(|(_, _, run)| run.first_path.is_none())
            .map(|(tenant, _, run)| (tenant.clone(), run.id.clone()))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Dispatched {
        left: selected - events.len(),
        received_at,
        claimed,
        backlog,
        ended,
        joined,
    })
}

/// Plans `event`'s runs; a planner that panics fails the dispatch with the
/// event named as the one at fault (the panic is caught, like a claim's).
fn plan_guarded(
    planner: Planner<'_>,
    event: &PendingEvent,
    candidates: &[Candidate],
    begin: bool,
) -> Result<Plan, Failure> {
    let planned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        planner(event, candidates, begin)
    }));
    planned.map_err(|panic| Failure::Planning {
        tenant: event.tenant_id.clone(),
        event: event.id.clone(),
        message: crate::panic_message(&*panic),
    })
}

/// The `settings.limits.startsPerMinute` of a candidate automation.
fn starts_per_minute(candidates: &[Candidate], automation: &AutomationId) -> Option<u32> {
    let candidate = candidates.iter().find(|c| &c.automation_id == automation)?;
    let limit = candidate.definition["settings"]["limits"]["startsPerMinute"].as_u64()?;
    Some(u32::try_from(limit).unwrap_or(u32::MAX))
}

/// A run over its automation's start limit is written `refused`: no step
/// ran or runs (the pure steps the plan ran for it are dropped), and no
/// incident is opened for it — a burst of events would open one per run;
/// the runs listing shows them, with the error.
fn refuse(run: &mut tok_store::NewRun, per_minute: u32) {
    tracing::info!(run = %run.id, automation = %run.automation_id, per_minute, "start refused: over the automation's start limit");
    run.refused = Some(start_rate_exceeded(per_minute));
    run.first_path = None;
    run.steps.clear();
    run.actions = 0;
}

#[cfg(test)]
mod tests {
    //! The dispatch's decisions over a store that only answers (no
    //! database): crowding, the loop protection's count and notes, the
    //! ticket's queue key, the hand-off.

    use std::sync::Arc;

    use async_trait::async_trait;
    use serde_json::json;
    use tok_core::ids::{RunId, TenantId};
    use tok_core::run::Resume;
    use tok_store::{Candidate, NewRun, PendingEvent, Result};

    use super::*;
    use crate::dispatch::plan;
    use crate::{DefinitionCache, Fairness, Registry};

    /// What the dispatch asked of the store and wrote through it.
    #[derive(Default)]
    struct Written {
        runs: Vec<(TenantId, EventId, NewRun)>,
        claimed_runs: Vec<RunId>,
        trace: Vec<(String, String, String)>,
        marked: Vec<EventId>,
        lookups: usize,
        committed: bool,
        /// Start controls' rows by (control, key), and how often read.
        keys: HashMap<(String, String), tok_core::start::KeyState>,
        key_reads: usize,
        cancelled: Vec<(RunId, String)>,
    }

    /// A dispatch transaction that selects `events`, finds `candidates`
    /// for events of a source with automations, and counts `earlier` runs
    /// on any ticket.
    struct Answers {
        events: Vec<PendingEvent>,
        candidates: Vec<Candidate>,
        earlier: i64,
        written: Arc<Mutex<Written>>,
    }

    impl Answers {
        fn written(&self) -> std::sync::MutexGuard<'_, Written> {
            self.written.lock().unwrap()
        }
    }

    #[async_trait]
    impl DispatchTx for Answers {
        async fn pending_events(&mut self, limit: u32) -> Result<Vec<PendingEvent>> {
            Ok(self.events.iter().take(limit as usize).cloned().collect())
        }

        async fn pending_event(
            &mut self,
            tenant: &TenantId,
            id: &EventId,
        ) -> Result<Option<PendingEvent>> {
            let found = self
                .events
                .iter()
                .find(|e| &e.tenant_id == tenant && &e.id == id);
            Ok(found.cloned())
        }

        async fn accept(&mut self, _: &TenantId, _: &tok_store::NewEvent) -> Result<EventId> {
            Err(tok_store::StoreError::Invariant(
                "these answers take no event of a start".into(),
            ))
        }

        async fn candidates(&mut self, event: &PendingEvent) -> Result<Vec<Candidate>> {
            self.written().lookups += 1;
            Ok(match event.trigger_key() {
                Some("quiet") => Vec::new(),
                _ => self.candidates.clone(),
            })
        }

        async fn runs_on_ticket(
            &mut self,
            _tenant: &TenantId,
            _automation: &AutomationId,
            _ticket: &str,
            since: i64,
        ) -> Result<i64> {
            assert!(now_ms() - since >= TICKET_WINDOW_MS, "the last minute");
            Ok(self.earlier)
        }

        async fn tenant_limits(
            &mut self,
            _tenant: &TenantId,
        ) -> Result<tok_core::quotas::TenantLimits> {
            Ok(Default::default())
        }

        async fn recent_starts(
            &mut self,
            _tenant: &TenantId,
            _automation: &AutomationId,
            _since: i64,
            _limit: u32,
        ) -> Result<Vec<i64>> {
            Ok(Vec::new())
        }

        async fn trace(
            &mut self,
            _tenant: &TenantId,
            ticket_id: &str,
            kind: &str,
            message: &str,
            cause: &Cause,
        ) -> Result<()> {
            assert!(cause.automation_id.is_some(), "the skipped automation");
            let line = (ticket_id.into(), kind.into(), message.into());
            self.written().trace.push(line);
            Ok(())
        }

        async fn insert_runs(
            &mut self,
            runs: &[(TenantId, EventId, NewRun)],
            claims: Option<Claims<'_>>,
        ) -> Result<Vec<ClaimedJob>> {
            let mut written = self.written();
            written.runs.extend(runs.iter().cloned());
            if let Some(claims) = claims {
                let ids = runs.iter().map(|(_, _, run)| &run.id);
                written.claimed_runs = ids
                    .filter(|id| claims.runs.contains(*id))
                    .cloned()
                    .collect();
            }
            Ok(Vec::new())
        }

        async fn flow_key(
            &mut self,
            _tenant: &TenantId,
            _automation: &AutomationId,
            control: &str,
            key: &str,
        ) -> Result<Option<tok_core::start::KeyState>> {
            let mut written = self.written();
            written.key_reads += 1;
            Ok(written.keys.get(&(control.into(), key.into())).cloned())
        }

        async fn put_flow_key(
            &mut self,
            _tenant: &TenantId,
            _automation: &AutomationId,
            control: &str,
            key: &str,
            state: &tok_core::start::KeyState,
        ) -> Result<()> {
            let id = (control.to_owned(), key.to_owned());
            self.written().keys.insert(id, state.clone());
            Ok(())
        }

        async fn run_context(
            &mut self,
            _tenant: &TenantId,
            run: &RunId,
        ) -> Result<Option<serde_json::Value>> {
            let written = self.written();
            let found = written.runs.iter().find(|(_, _, r)| &r.id == run);
            Ok(found.map(|(_, _, r)| r.context.clone()))
        }

        async fn join_run(
            &mut self,
            _tenant: &TenantId,
            run: &RunId,
            context: &serde_json::Value,
            delay_ms: i64,
        ) -> Result<bool> {
            let mut written = self.written();
            let found = written.runs.iter_mut().find(|(_, _, r)| &r.id == run);
            let Some((_, _, open)) = found else {
                return Ok(false);
            };
            open.context = context.clone();
            if let Some(hold) = &mut open.hold {
                hold.delay_ms = delay_ms;
            }
            Ok(true)
        }

        async fn cancel_paths(
            &mut self,
            _tenant: &TenantId,
            sources: &[&str],
        ) -> Result<Vec<(String, String)>> {
            let written = self.written();
            let mut paths: Vec<(String, String)> = written
                .runs
                .iter()
                .flat_map(|(_, _, r)| r.cancels.iter())
                .filter(|k| sources.contains(&k.source.as_str()))
                .map(|k| (k.source.clone(), k.path.clone()))
                .collect();
            paths.sort();
            paths.dedup();
            Ok(paths)
        }

        async fn cancel_matches(
            &mut self,
            _tenant: &TenantId,
            source: &str,
            path: &str,
            value: &str,
        ) -> Result<Vec<(RunId, Option<serde_json::Value>)>> {
            let written = self.written();
            Ok(written
                .runs
                .iter()
                .filter(|(_, _, r)| {
                    r.cancels
                        .iter()
                        .any(|k| k.source == source && k.path == path && k.value == value)
                })
                .map(|(_, _, r)| (r.id.clone(), None))
                .collect())
        }

        async fn cancel_run(
            &mut self,
            _tenant: &TenantId,
            run: &RunId,
            reason: &str,
        ) -> Result<()> {
            self.written()
                .cancelled
                .push((run.clone(), reason.to_owned()));
            Ok(())
        }

        async fn mark_dispatched(&mut self, events: &[EventId]) -> Result<()> {
            self.written().marked.extend(events.iter().cloned());
            Ok(())
        }

        async fn commit(self: Box<Self>) -> Result<()> {
            self.written().committed = true;
            Ok(())
        }
    }

    fn event(n: usize, tenant: &str, source: &str, ticket: Option<&str>) -> PendingEvent {
        PendingEvent {
            id: EventId::from(format!("ev_{tenant}_{n}")),
            tenant_id: TenantId::from(tenant.to_string()),
            source_id: None,
            source_kind: "event".into(),
            payload: json!({ "n": n }),
            params: json!({}),
            depth: 0,
            cause_run_id: None,
            origin_automation_id: None,
            target_automation_id: None,
            event_type: Some(source.into()),
            subject_ticket_id: ticket.map(str::to_owned),
            received_at: n as i64,
            traceparent: None,
        }
    }

    /// Events by tenant, one letter each (`"aab"`: two of `a`, one of `b`).
    fn events(spec: &str) -> Vec<PendingEvent> {
        let each = spec.chars().enumerate();
        each.map(|(n, t)| event(n, &t.to_string(), "ticket.updated", None))
            .collect()
    }

    fn watcher() -> Candidate {
        let definition = json!({
            "name": "Watcher",
            "trigger": { "kind": "event", "event": "ticket.updated" },
            "steps": [{ "id": "call", "type": "bench/anything", "config": {} }]
        });
        Candidate {
            automation_id: AutomationId::from("aut_watcher".to_string()),
            name: "Watcher".into(),
            version: 1,
            definition,
            recent_runs_on_ticket: 0,
        }
    }

    fn answers(events: Vec<PendingEvent>, earlier: i64) -> (Box<Answers>, Arc<Mutex<Written>>) {
        answers_for(events, earlier, watcher(), Arc::default())
    }

    fn answers_for(
        events: Vec<PendingEvent>,
        earlier: i64,
        candidate: Candidate,
        written: Arc<Mutex<Written>>,
    ) -> (Box<Answers>, Arc<Mutex<Written>>) {
        let tx = Answers {
            events,
            candidates: vec![candidate],
            earlier,
            written: written.clone(),
        };
        (Box::new(tx), written)
    }

    /// Dispatches through `tx` with the engine's planner, `take` offered
    /// every new run's job.
    async fn run(
        tx: Box<Answers>,
        limit: u32,
        bulk: bool,
        crowding: &Mutex<Crowding>,
        take: Option<&mut (dyn FnMut(&TenantId) -> bool + Send)>,
    ) -> Dispatched {
        let (defs, registry) = (DefinitionCache::default(), Registry::with_builtins());
        let fairness = Fairness::default();
        let planner = |event: &PendingEvent, candidates: &[Candidate], begin: bool| {
            plan::plan(event, candidates, &defs, &registry, &fairness, begin)
        };
        let handoff = take.map(|take| Handoff {
            node: "node-1",
            lease_ms: 30_000,
            take,
        });
        let deciders = Deciders {
            planner: &planner,
            may_begin: &|_| Box::pin(async { true }),
            noted: &|_| {},
            crowding,
        };
        dispatch(tx, Select::Batch(limit), bulk, &deciders, handoff)
            .await
            .expect("dispatch")
    }

    fn tenants_of(written: &Written) -> String {
        let runs = written.runs.iter();
        runs.map(|(t, _, _)| t.as_str().to_string()).collect()
    }

    #[tokio::test]
    async fn a_crowding_tenants_events_wait_for_one_dispatch_of_the_others() {
        let crowding = Mutex::new(Crowding::default());
        // (selected, bulk?, tenants of the runs written, events left)
        let table: [(&str, bool, &str, usize); 4] = [
            ("abcabcaaaaaa", true, "bcbc", 8),
            ("abcabcaaaaaa", true, "abcabcaaaaaa", 0),
            ("abcaaaa", false, "bc", 5), // urgent: takes the others apart
            ("abcaaaa", true, "bc", 5),  // and the bulk one still alternates
        ];
        for (i, (selected, bulk, ran, left)) in table.into_iter().enumerate() {
            let (tx, written) = answers(events(selected), 0);
            let d = run(tx, 12, bulk, &crowding, None).await;
            let written = written.lock().unwrap();
            assert_eq!(tenants_of(&written), ran, "row {i}");
            assert_eq!((d.left, d.events()), (left, ran.len()), "row {i}");
            assert_eq!(written.marked.len(), ran.len(), "row {i}: the taken ones");
            assert!(written.committed, "row {i}");
        }
    }

    #[tokio::test]
    async fn a_planner_that_panics_names_its_event_and_nothing_is_written() {
        let (tx, written) = answers(events("abab"), 0);
        let (defs, registry) = (DefinitionCache::default(), Registry::with_builtins());
        let fairness = Fairness::default();
        let planner = |event: &PendingEvent, candidates: &[Candidate], begin: bool| {
            assert!(event.id.as_str() != "ev_b_1", "a fault in planning");
            plan::plan(event, candidates, &defs, &registry, &fairness, begin)
        };
        let crowding = Mutex::default();
        let deciders = Deciders {
            planner: &planner,
            may_begin: &|_| Box::pin(async { true }),
            noted: &|_| {},
            crowding: &crowding,
        };
        let failed = dispatch(tx, Select::Batch(8), true, &deciders, None)
            .await
            .expect_err("the dispatch fails");
        let Failure::Planning {
            tenant,
            event,
            message,
        } = failed.failure
        else {
            panic!("a planning failure: {:?}", failed.failure);
        };
        assert_eq!((tenant.as_str(), event.as_str()), ("b", "ev_b_1"));
        assert!(message.contains("a fault in planning"), "{message}");
        assert_eq!(failed.events.len(), 4, "every event taken is named");
        let written = written.lock().unwrap();
        assert!(!written.committed && written.runs.is_empty() && written.marked.is_empty());
    }

    #[tokio::test]
    async fn one_event_is_dispatched_alone_and_a_tenant_that_may_not_begin_begins_nothing() {
        let selected = events("abab");
        let one = selected[3].clone();
        let (tx, written) = answers_for(selected, 0, watcher(), Arc::default());
        {
            // The watcher begins with a control step, for this test.
            let mut tx = tx;
            tx.candidates[0].definition["steps"] = json!([
                { "id": "st_set", "type": "set", "config": { "values": { "n": "{{_body.n}}" } } },
                { "id": "call", "type": "bench/anything", "config": {} }
            ]);
            let (defs, registry) = (DefinitionCache::default(), Registry::with_builtins());
            let fairness = Fairness::default();
            let planner = |event: &PendingEvent, candidates: &[Candidate], begin: bool| {
                plan::plan(event, candidates, &defs, &registry, &fairness, begin)
            };
            let crowding = Mutex::default();
            let deciders = Deciders {
                planner: &planner,
                may_begin: &|_| Box::pin(async { false }),
                noted: &|_| {},
                crowding: &crowding,
            };
            let select = Select::One(&one.tenant_id, &one.id);
            let d = dispatch(tx, select, true, &deciders, None)
                .await
                .expect("dispatch");
            assert_eq!((d.events(), d.left, d.backlog), (1, 0, None));
        }
        let written = written.lock().unwrap();
        assert_eq!(written.marked, std::slice::from_ref(&one.id));
        assert_eq!(written.runs.len(), 1);
        let run = &written.runs[0].2;
        assert!(run.steps.is_empty(), "no step begun: {:?}", run.steps);
        assert_eq!(run.first_path.as_deref(), Some("0"));
    }

    #[tokio::test]
    async fn a_full_batch_mostly_of_one_tenant_names_its_backlog() {
        // (selected, asked for, backlog)
        let table: [(&str, u32, Option<&str>); 3] =
            [("aaaa", 4, Some("a")), ("aaab", 8, None), ("aabb", 4, None)];
        for (selected, limit, backlog) in table {
            let (tx, _) = answers(events(selected), 0);
            let d = run(tx, limit, true, &Mutex::default(), None).await;
            let want = backlog.map(|t| TenantId::from(t.to_string()));
            assert_eq!(d.backlog, want, "{selected} of {limit}");
        }
    }

    #[tokio::test]
    async fn runs_on_one_ticket_are_counted_across_the_batch_and_past_five_noted() {
        let max = plan::MAX_RUNS_PER_TICKET_PER_MINUTE as usize;
        // (runs in the last minute, events of the ticket, runs started)
        let table: [(i64, usize, usize); 4] = [(0, 3, 3), (0, 7, max), (3, 4, 2), (5, 2, 0)];
        for (earlier, events, started) in table {
            let selected = (0..events).map(|n| event(n, "a", "ticket.updated", Some("tk_1")));
            let (tx, written) = answers(selected.collect(), earlier);
            let d = run(tx, 16, true, &Mutex::default(), None).await;
            let written = written.lock().unwrap();
            let case = format!("{earlier} earlier, {events} events");
            assert_eq!(d.events(), events, "{case}: every event is taken");
            assert_eq!(written.runs.len(), started, "{case}");
            assert_eq!(written.trace.len(), events - started, "{case}");
            for (ticket, kind, message) in &written.trace {
                assert_eq!(
                    (ticket.as_str(), kind.as_str()),
                    ("tk_1", "loop_protection")
                );
                assert!(message.contains("Watcher") && message.contains("last minute"));
            }
            for (_, _, run) in &written.runs {
                assert_eq!(run.queue_key.as_deref(), Some("ticket:tk_1"), "{case}");
                assert_eq!(run.subject_ticket_id.as_deref(), Some("tk_1"), "{case}");
            }
        }
    }

    #[tokio::test]
    async fn a_trigger_is_looked_up_once_per_batch_and_an_unheard_event_is_only_marked() {
        let mut selected = events("aa");
        selected.push(event(2, "a", "quiet", None));
        selected.push(event(3, "b", "ticket.updated", None));
        let (tx, written) = answers(selected, 0);
        let d = run(tx, 16, true, &Mutex::default(), None).await;
        let written = written.lock().unwrap();
        assert_eq!(d.events(), 4);
        assert_eq!(written.marked.len(), 4, "the unheard one too");
        assert_eq!(tenants_of(&written), "aab", "no run for the unheard one");
        assert_eq!(written.lookups, 3, "a's trigger, a's quiet one, b's");
    }

    #[tokio::test]
    async fn the_dispatching_node_is_offered_the_runs_with_no_queue_key() {
        let mut selected = events("ab");
        selected.push(event(2, "c", "ticket.updated", Some("tk_1")));
        let (tx, written) = answers(selected, 0);
        let mut offered = Vec::new();
        let mut take = |tenant: &TenantId| {
            offered.push(tenant.to_string());
            tenant.as_str() == "b"
        };
        run(tx, 16, true, &Mutex::default(), Some(&mut take)).await;
        let written = written.lock().unwrap();
        assert_eq!(offered, ["a", "b"], "not the run queued behind its ticket");
        let b = written.runs.iter().find(|(t, _, _)| t.as_str() == "b");
        assert_eq!(written.claimed_runs, [b.unwrap().2.id.clone()]);
    }

    /// The watcher with `flow`.
    fn controlled(flow: serde_json::Value) -> Candidate {
        let mut candidate = watcher();
        candidate.definition["flow"] = flow;
        candidate
    }

    /// Events of tenant `a` whose bodies name `keys` (`"aab"`: two of key
    /// `a`, one of `b`), numbered from `from`.
    fn keyed(keys: &str, from: usize) -> Vec<PendingEvent> {
        keys.chars()
            .enumerate()
            .map(|(n, key)| {
                let mut e = event(from + n, "a", "ticket.updated", None);
                e.payload = json!({ "n": from + n, "customer": key.to_string() });
                e
            })
            .collect()
    }

    fn bodies(run: &NewRun, field: &str) -> serde_json::Value {
        run.context[field].clone()
    }

    #[tokio::test]
    async fn debounced_events_of_a_key_join_one_held_run_in_the_batch_and_after_it() {
        let written = Arc::default();
        let debounce =
            || controlled(json!({ "debounce": { "key": "{{_body.customer}}", "period": "10s" } }));
        let (tx, _) = answers_for(keyed("aaba", 0), 0, debounce(), Arc::clone(&written));
        let mut take = |_: &TenantId| true;
        run(tx, 16, true, &Mutex::default(), Some(&mut take)).await;
        {
            let w = written.lock().unwrap();
            assert_eq!(w.runs.len(), 2, "one run per key");
            assert_eq!(w.key_reads, 2, "each key's row read once per batch");
            let a = &w.runs[0].2;
            assert_eq!(bodies(a, "_body")["n"], 3, "the last body");
            let hold = a.hold.as_ref().expect("held");
            assert!((9_000..=10_000).contains(&hold.delay_ms), "{hold:?}");
            assert!(matches!(&hold.resume, Resume::Deferred { limit, .. } if limit == "debounce"));
            assert!(a.steps.is_empty(), "begun when due, not at dispatch");
            assert!(
                w.claimed_runs.is_empty(),
                "a held run is no one's to start now"
            );
        }
        // The next dispatch's event of key a joins the written run.
        let (tx, _) = answers_for(keyed("a", 9), 0, debounce(), Arc::clone(&written));
        run(tx, 16, true, &Mutex::default(), None).await;
        let w = written.lock().unwrap();
        assert_eq!(w.runs.len(), 2, "no third run");
        assert_eq!(bodies(&w.runs[0].2, "_body")["n"], 9);
        assert_eq!(w.keys[&("debounce".into(), "a".into())].count, 4);
    }

    #[tokio::test]
    async fn twelve_batched_events_make_runs_of_five_five_and_two_with_their_bodies() {
        let written = Arc::default();
        let batch = controlled(json!({ "batch": { "maxSize": 5, "timeout": "1m" } }));
        let (tx, _) = answers_for(keyed(&"x".repeat(12), 0), 0, batch, Arc::clone(&written));
        run(tx, 16, true, &Mutex::default(), None).await;
        let w = written.lock().unwrap();
        let sizes: Vec<usize> = w
            .runs
            .iter()
            .map(|(_, _, r)| bodies(r, "_events").as_array().unwrap().len())
            .collect();
        assert_eq!(sizes, [5, 5, 2]);
        let ns: Vec<&serde_json::Value> = w.runs[1].2.context["_events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| &b["n"])
            .collect();
        assert_eq!(ns, [5, 6, 7, 8, 9], "in order");
        let delays: Vec<i64> = w
            .runs
            .iter()
            .map(|(_, _, r)| r.hold.as_ref().unwrap().delay_ms)
            .collect();
        assert_eq!(&delays[..2], [0, 0], "a full batch is due at once");
        assert!(
            delays[2] > 50_000,
            "the last waits for its timeout: {delays:?}"
        );
    }

    #[tokio::test]
    async fn singleton_skip_writes_skipped_runs_and_cancel_replaces_the_active_one() {
        let written: Arc<Mutex<Written>> = Arc::default();
        let skip =
            || controlled(json!({ "singleton": { "key": "{{_body.customer}}", "mode": "skip" } }));
        let (tx, _) = answers_for(keyed("aab", 0), 0, skip(), Arc::clone(&written));
        run(tx, 16, true, &Mutex::default(), None).await;
        {
            let w = written.lock().unwrap();
            let skipped: Vec<bool> = w.runs.iter().map(|(_, _, r)| r.skipped.is_some()).collect();
            assert_eq!(skipped, [false, true, false]);
            let why = w.runs[1].2.skipped.as_deref().unwrap();
            assert!(
                why.contains(w.runs[0].2.id.as_str()) && why.contains("\u{201c}a\u{201d}"),
                "{why}"
            );
            assert_eq!(w.runs[1].2.first_path, None);
        }
        // A run of the key written before: cancel mode cancels it.
        let (first, _) = {
            let w = written.lock().unwrap();
            (w.runs[0].2.id.clone(), ())
        };
        let cancel =
            controlled(json!({ "singleton": { "key": "{{_body.customer}}", "mode": "cancel" } }));
        written.lock().unwrap().keys.insert(
            ("singleton".into(), "a".into()),
            tok_core::start::KeyState {
                run_id: first.to_string(),
                run: tok_core::start::KeyRun::Active,
                opened_at: 0,
                count: 1,
                next_at: 0,
            },
        );
        let (tx, _) = answers_for(keyed("aa", 5), 0, cancel, Arc::clone(&written));
        run(tx, 16, true, &Mutex::default(), None).await;
        let w = written.lock().unwrap();
        assert_eq!(w.cancelled.len(), 1, "{:?}", w.cancelled);
        assert_eq!(w.cancelled[0].0, first);
        let new: Vec<&NewRun> = w.runs[3..].iter().map(|(_, _, r)| r).collect();
        assert_eq!(new.len(), 2);
        assert!(
            new[0]
                .skipped
                .as_deref()
                .is_some_and(|s| s.contains("replaced")),
            "the second replaced the first before it was written"
        );
        assert!(new[1].skipped.is_none());
        assert_eq!(
            w.keys[&("singleton".into(), "a".into())].run_id,
            new[1].id.as_str()
        );
    }

    #[tokio::test]
    async fn an_event_of_cancel_on_cancels_the_matching_runs_written_or_planned_before_it() {
        let written: Arc<Mutex<Written>> = Arc::default();
        let cancelling = || {
            controlled(
                json!({ "cancelOn": [{ "source": "order.cancelled", "match": "_body.customer" }] }),
            )
        };
        let (tx, _) = answers_for(keyed("ab", 0), 0, cancelling(), Arc::clone(&written));
        run(tx, 16, true, &Mutex::default(), None).await;
        let (a, b) = {
            let w = written.lock().unwrap();
            assert_eq!(w.runs[0].2.cancels[0].value, "\"a\"");
            (w.runs[0].2.id.clone(), w.runs[1].2.id.clone())
        };
        // Later: an order of c, then c's and a's cancels, in one dispatch.
        let mut later = keyed("c", 2);
        for (n, customer) in [(3, "c"), (4, "a")] {
            let mut e = event(n, "a", "order.cancelled", None);
            e.payload = json!({ "customer": customer });
            later.push(e);
        }
        let (tx, _) = answers_for(later, 0, cancelling(), Arc::clone(&written));
        run(tx, 16, true, &Mutex::default(), None).await;
        let w = written.lock().unwrap();
        let cancelled: Vec<&RunId> = w.cancelled.iter().map(|(r, _)| r).collect();
        assert_eq!(cancelled, [&a], "a's written run, not b's");
        assert!(w.cancelled[0].1.contains("ev_a_4"), "{:?}", w.cancelled);
        let c = w
            .runs
            .iter()
            .find(|(_, _, r)| r.context["_body"]["customer"] == "c")
            .unwrap();
        assert!(
            c.2.cancelled
                .as_deref()
                .is_some_and(|s| s.contains("ev_a_3")),
            "{:?}",
            c.2.cancelled
        );
        assert_eq!(c.2.first_path, None, "never started");
        assert!(!w.cancelled.iter().any(|(r, _)| r == &b));
    }

    #[tokio::test]
    async fn singleton_queue_holds_the_keys_later_runs_on_the_keys_queue() {
        let written: Arc<Mutex<Written>> = Arc::default();
        let queue =
            controlled(json!({ "singleton": { "key": "{{_body.customer}}", "mode": "queue" } }));
        let (tx, _) = answers_for(keyed("aab", 0), 0, queue, Arc::clone(&written));
        let mut take = |_: &TenantId| true;
        run(tx, 16, true, &Mutex::default(), Some(&mut take)).await;
        let w = written.lock().unwrap();
        let held: Vec<Option<&str>> = w
            .runs
            .iter()
            .map(|(_, _, r)| match r.hold.as_ref().map(|h| &h.resume) {
                Some(Resume::Deferred { limit, .. }) => Some(limit.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            held,
            [None, Some("singleton"), None],
            "a's second waits, b's runs"
        );
        let queued = &w.runs[1].2;
        assert_eq!(
            queued.queue_key.as_deref(),
            Some(format!("flow:{}/a", queued.automation_id).as_str())
        );
        assert!(queued.steps.is_empty() && queued.first_path.is_some());
        let row = &w.keys[&("singleton".into(), "a".into())];
        assert_eq!(
            (row.run_id.as_str(), row.count),
            (w.runs[0].2.id.as_str(), 1)
        );
        assert_eq!(
            w.claimed_runs.len(),
            2,
            "the queued one is no one's to start now"
        );
    }

    #[tokio::test]
    async fn a_batch_whose_bodies_would_pass_their_bound_goes_as_it_is() {
        let written: Arc<Mutex<Written>> = Arc::default();
        let batch = controlled(json!({ "batch": { "maxSize": 10, "timeout": "1m" } }));
        let mut events = keyed("xxxxx", 0);
        let big = "b".repeat(400 * 1024);
        for e in &mut events {
            e.payload["pad"] = json!(big);
        }
        let (tx, _) = answers_for(events, 0, batch, Arc::clone(&written));
        run(tx, 16, true, &Mutex::default(), None).await;
        let w = written.lock().unwrap();
        let sizes: Vec<usize> = w
            .runs
            .iter()
            .map(|(_, _, r)| bodies(r, "_events").as_array().unwrap().len())
            .collect();
        assert_eq!(
            sizes,
            [2, 2, 1],
            "at most {} bytes of bodies a run",
            tok_core::start::MAX_BATCH_BYTES
        );
        let delays: Vec<i64> = w
            .runs
            .iter()
            .map(|(_, _, r)| r.hold.as_ref().unwrap().delay_ms)
            .collect();
        assert_eq!(&delays[..2], [0, 0], "a full batch goes at once");
    }
}
