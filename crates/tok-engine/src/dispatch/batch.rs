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
//! notes go to the ticket's trace. The runs the dispatching process starts
//! itself are written already claimed by it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tok_core::ids::{AutomationId, EventId, TenantId};
use tok_store::{
    Candidate, Cause, ClaimedJob, Claims, DispatchTx, PendingEvent, Plan, Result, now_ms,
};

use tok_core::limits::{START_WINDOW_MS, start_allowed, start_rate_exceeded};

use super::plan::{PlannedOnTickets, TICKET_WINDOW_MS};
use crate::fairness::{self, Crowding};

/// The dispatcher's pure decision for one event: given the event and the
/// automations whose trigger matches, which runs to create.
pub(crate) type Planner<'a> = &'a (dyn Fn(&PendingEvent, &[Candidate]) -> Plan + Send + Sync);

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

/// Dispatches up to `limit` pending events through `tx` and commits: each
/// taken event's runs and their first jobs are written and the event is
/// marked dispatched, all or nothing. `bulk`: a bulk dispatch (the urgent
/// one does not alternate with the crowd, see [`Crowding`]).
pub(crate) async fn dispatch(
    mut tx: Box<dyn DispatchTx>,
    limit: u32,
    bulk: bool,
    crowding: &Mutex<Crowding>,
    planner: Planner<'_>,
    mut handoff: Option<Handoff<'_>>,
) -> Result<Dispatched> {
    let events = tx.pending_events(limit).await?;
    let selected = events.len();
    let (backlog, crowd) = {
        let owners: Vec<&TenantId> = events.iter().map(|e| &e.tenant_id).collect();
        let mut crowding = crowding.lock().unwrap_or_else(|e| e.into_inner());
        (
            fairness::filled_by(&owners, limit as usize),
            crowding.leave(&owners, bulk),
        )
    };
    let events: Vec<PendingEvent> = match &crowd {
        Some(crowd) => events
            .into_iter()
            .filter(|e| &e.tenant_id != crowd)
            .collect(),
        None => events,
    };
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
        let cached = &matching[&key];
        if cached.is_empty() {
            // No automation listens: nothing to plan.
            continue;
        }
        let plan = match &event.subject_ticket_id {
            None => planner(event, cached),
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
                let plan = planner(event, &found);
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
        for mut run in plan.runs {
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
            runs.push((event.tenant_id.clone(), event.id.clone(), run));
        }
    }
    // The runs the dispatching node starts itself: their first step is due
    // now, and no queue key orders them behind another run's job.
    let mut taken = HashSet::new();
    if let Some(handoff) = handoff.as_mut() {
        for (tenant, _, run) in &runs {
            if run.first_path.is_some() && run.queue_key.is_none() && (handoff.take)(tenant) {
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
    use tok_store::{Candidate, NewRun, PendingEvent};

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
        let written = Arc::new(Mutex::new(Written::default()));
        let tx = Answers {
            events,
            candidates: vec![watcher()],
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
        let planner = |event: &PendingEvent, candidates: &[Candidate]| {
            plan::plan(event, candidates, &defs, &registry, &fairness)
        };
        let handoff = take.map(|take| Handoff {
            node: "node-1",
            lease_ms: 30_000,
            take,
        });
        dispatch(tx, limit, bulk, crowding, &planner, handoff)
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
}
