//! The live stream: what happened to a tenant's runs, steps, tickets and
//! incidents, as events published after their transaction committed, for
//! `GET /api/stream` to send to dashboards.
//!
//! Data flows: the runner, the dispatcher and the API call
//! [`Stream::publish`] after a commit. With one process (SQLite) the event
//! goes straight to the [`Hub`]. With processes sharing a PostgreSQL
//! ([`Stream::relay`]), it goes to a small outbox instead; a publisher task
//! sends the outbox every [`RELAY_EVERY`] as a few `NOTIFY` payloads on a
//! connection of its own, so no record transaction carries an extra
//! statement, and every process that serves the API listens on a direct
//! connection and feeds what arrives (its own events included) to its hub.
//!
//! The hub keeps, per tenant, a bounded ring of recent events (what a
//! reconnecting client missed, by `Last-Event-ID`) and a bounded
//! `broadcast` channel. Nothing here waits for a client: a client that
//! falls behind the channel is told to reload, and a full outbox drops its
//! oldest events and tells the tenant's clients to reload.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tok_core::ids::{RunId, TenantId};
use tok_store::{ClaimedJob, NewRun, Record, RunStatus, StepRecord, StepStatus, Store};
use tokio::sync::{broadcast, watch};

/// How often a process sends its committed events to the others.
pub const RELAY_EVERY: Duration = Duration::from_millis(100);
/// Largest `NOTIFY` payload sent (PostgreSQL refuses more than 8000 bytes).
pub const MAX_PAYLOAD: usize = 7900;
/// Events an outbox holds between two sends before it drops the oldest.
const OUTBOX_CAP: usize = 20_000;
/// Events a slow client may be behind before it is told to reload.
const CHANNEL_CAP: usize = 1024;
/// What a reconnecting client can be given again: the last few minutes,
/// up to this many events per tenant.
const RING_CAP: usize = 1000;
const RING_AGE: Duration = Duration::from_secs(5 * 60);

/// The kinds of event the stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    #[serde(rename = "run.updated")]
    RunUpdated,
    #[serde(rename = "step.recorded")]
    StepRecorded,
    #[serde(rename = "ticket.updated")]
    TicketUpdated,
    /// A new incident was opened.
    #[serde(rename = "incident.opened")]
    IncidentOpened,
    /// The open incident of the same source happened again: its
    /// occurrences went up.
    #[serde(rename = "incident.updated")]
    IncidentUpdated,
    /// Events were lost to this client (it fell behind, or what it asked to
    /// replay is gone): it should load its view again.
    #[serde(rename = "reload")]
    Reload,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::RunUpdated => "run.updated",
            Kind::StepRecorded => "step.recorded",
            Kind::TicketUpdated => "ticket.updated",
            Kind::IncidentOpened => "incident.opened",
            Kind::IncidentUpdated => "incident.updated",
            Kind::Reload => "reload",
        }
    }
}

/// One event as a client receives it.
#[derive(Debug, Clone)]
pub struct Event {
    /// `<process start>-<sequence>` of the process that published it,
    /// increasing within that process. Every process that follows a relay
    /// gives an event the id its publisher gave it, so a client may
    /// reconnect to another API process with its `Last-Event-ID`.
    pub id: String,
    pub kind: Kind,
    /// The event's JSON, written once for every client that follows.
    pub data: Box<str>,
}

/// What a subscriber gets: the events it missed, then live ones.
pub struct Subscription {
    /// Events after the client's `Last-Event-ID`, oldest first.
    pub missed: Vec<Arc<Event>>,
    /// The client's `Last-Event-ID` is no longer (or never was) in the
    /// ring: what it missed cannot be given again.
    pub gap: bool,
    pub live: broadcast::Receiver<Arc<Event>>,
    /// Turns true when the process stops serving ([`Stream::close`]).
    pub closed: watch::Receiver<bool>,
}

/// An event as it travels between processes: its id is given as it
/// leaves its publisher (`None` before).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pending {
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(rename = "t")]
    tenant: TenantId,
    #[serde(rename = "k")]
    kind: Kind,
    #[serde(rename = "d")]
    data: Value,
}

/// The live stream of this process; cheap to clone.
#[derive(Clone)]
pub struct Stream {
    hub: Arc<Hub>,
}

struct Hub {
    boot: String,
    /// The sequence of the ids this process gives.
    seq: AtomicU64,
    /// The order events arrive in this process's hub (the rings' order).
    arrived: AtomicU64,
    tenants: Mutex<HashMap<TenantId, Channel>>,
    /// `Some` while a relay carries events between processes.
    outbox: Mutex<Option<Outbox>>,
    closed: watch::Sender<bool>,
}

struct Channel {
    live: broadcast::Sender<Arc<Event>>,
    /// Recent events, with when and in which order they arrived.
    ring: VecDeque<(Instant, u64, Arc<Event>)>,
    /// The id of the newest event that left the ring.
    evicted: Option<String>,
}

#[derive(Default)]
struct Outbox {
    events: VecDeque<Pending>,
    /// Tenants whose events were dropped from a full outbox.
    dropped: HashSet<TenantId>,
}

impl Default for Stream {
    fn default() -> Self {
        // Random per start: an id from an earlier start (or another
        // process) is recognised as not replayable.
        let boot: u32 = rand::random();
        Self {
            hub: Arc::new(Hub {
                boot: format!("{boot:08x}"),
                seq: AtomicU64::new(0),
                arrived: AtomicU64::new(0),
                tenants: Mutex::default(),
                outbox: Mutex::default(),
                closed: watch::channel(false).0,
            }),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Stream {
    /// Publishes an event of `tenant` that has committed. Never waits.
    pub fn publish(&self, tenant: &TenantId, kind: Kind, data: Value) {
        let pending = Pending {
            id: None,
            tenant: tenant.clone(),
            kind,
            data,
        };
        let mut outbox = lock(&self.hub.outbox);
        match outbox.as_mut() {
            Some(outbox) => {
                if outbox.events.len() >= OUTBOX_CAP
                    && let Some(old) = outbox.events.pop_front()
                {
                    outbox.dropped.insert(old.tenant);
                }
                outbox.events.push_back(pending);
            }
            None => {
                drop(outbox);
                self.deliver(pending);
            }
        }
    }

    /// Ends every subscription: the process stops serving, and an open
    /// stream must not hold its shutdown up.
    pub fn close(&self) {
        self.hub.closed.send_replace(true);
    }

    /// Subscribes to `tenant`'s events, with those after `last_event_id`.
    ///
    /// What the client missed is what followed its last event in the
    /// tenant's ring: every process following a relay received the same
    /// events in the same order (PostgreSQL delivers notifications in
    /// commit order), under the ids their publishers gave them, so the id
    /// of another API process is found as well as one of this process.
    /// An id not in the ring (too old, from an earlier start, or from a
    /// process whose events this one did not receive) is a gap: reload.
    pub fn subscribe(&self, tenant: &TenantId, last_event_id: Option<&str>) -> Subscription {
        let mut tenants = lock(&self.hub.tenants);
        let channel = tenants.entry(tenant.clone()).or_insert_with(Channel::new);
        let live = channel.live.subscribe();
        let closed = self.hub.closed.subscribe();
        let Some(last) = last_event_id.map(str::trim).filter(|s| !s.is_empty()) else {
            return Subscription {
                missed: Vec::new(),
                gap: false,
                live,
                closed,
            };
        };
        channel.expire();
        let after = channel.ring.iter().position(|(_, _, e)| e.id == last);
        let (missed, gap) = match after {
            Some(at) => (channel.ring.iter().skip(at + 1).collect(), false),
            // Its last event left the ring, and everything since is in it.
            None if channel.evicted.as_deref() == Some(last) => {
                (channel.ring.iter().collect(), false)
            }
            None => (Vec::new(), true),
        };
        Subscription {
            missed: missed.into_iter().map(|(_, _, e)| e.clone()).collect(),
            gap,
            live,
            closed,
        }
    }

    /// The next id of this process.
    fn next_id(&self) -> String {
        let seq = self.hub.seq.fetch_add(1, Ordering::SeqCst) + 1;
        format!("{}-{seq}", self.hub.boot)
    }

    /// Sends `pending` to the tenant's clients, with the id its publisher
    /// gave it (or one of this process's).
    fn deliver(&self, pending: Pending) {
        let mut tenants = lock(&self.hub.tenants);
        let id = pending.id.unwrap_or_else(|| self.next_id());
        let arrived = self.hub.arrived.fetch_add(1, Ordering::SeqCst) + 1;
        let event = Arc::new(Event {
            id,
            kind: pending.kind,
            data: pending.data.to_string().into(),
        });
        let channel = tenants.entry(pending.tenant).or_insert_with(Channel::new);
        channel
            .ring
            .push_back((Instant::now(), arrived, event.clone()));
        if channel.ring.len() > RING_CAP
            && let Some((_, _, old)) = channel.ring.pop_front()
        {
            channel.evicted = Some(old.id.clone());
        }
        channel.expire();
        // No receiver is fine: nobody follows this tenant now.
        let _ = channel.live.send(event);
    }

    /// Turns this process's publishing over to the store's relay (when the
    /// store has one: processes sharing a PostgreSQL), and, with `listen`,
    /// feeds this process's hub from what every process sends. Returns the
    /// tasks doing it; they end with the process.
    pub async fn relay(
        &self,
        store: &Arc<dyn Store>,
        listen: bool,
    ) -> tok_store::Result<Vec<tokio::task::JoinHandle<()>>> {
        let Some(mut relay) = store.stream_relay().await? else {
            return Ok(Vec::new());
        };
        let mut tasks = Vec::new();
        if listen {
            let hub = Arc::downgrade(&self.hub);
            store
                .listen_stream(Arc::new(move |payload: Option<&str>| {
                    let Some(hub) = hub.upgrade() else {
                        return false;
                    };
                    let stream = Stream { hub };
                    match payload {
                        Some(payload) => stream.received(payload),
                        None => stream.reload_all("the stream's connection was lost"),
                    }
                    true
                }))
                .await?;
        }
        *lock(&self.hub.outbox) = Some(Outbox::default());
        let stream = self.clone();
        tasks.push(tokio::spawn(async move {
            let mut seq = 0u64;
            loop {
                tokio::time::sleep(RELAY_EVERY).await;
                let payloads = stream.take_payloads(&mut seq);
                if payloads.is_empty() {
                    continue;
                }
                if let Err(e) = relay.send(&payloads).await {
                    tracing::warn!(error = %e, events = payloads.len(), "could not send stream events to other processes; their dashboards reload");
                }
            }
        }));
        Ok(tasks)
    }

    /// Empties the outbox into payloads of at most [`MAX_PAYLOAD`] bytes:
    /// a sequence number (PostgreSQL folds equal payloads of one
    /// transaction into one) and one event per line.
    fn take_payloads(&self, seq: &mut u64) -> Vec<String> {
        let (events, dropped) = {
            let mut outbox = lock(&self.hub.outbox);
            let Some(outbox) = outbox.as_mut() else {
                return Vec::new();
            };
            (
                std::mem::take(&mut outbox.events),
                std::mem::take(&mut outbox.dropped),
            )
        };
        let reloads = dropped.into_iter().map(|tenant| Pending {
            id: None,
            tenant,
            kind: Kind::Reload,
            data: json!({ "reason": "events were dropped" }),
        });
        let mut payloads = Vec::new();
        let mut current = String::new();
        for mut event in reloads.chain(events) {
            // The id every process that receives it gives it.
            event.id = Some(self.next_id());
            let mut line = serde_json::to_string(&event).unwrap_or_default();
            if line.len() + 24 > MAX_PAYLOAD {
                // Too large to send whole: the kind and the tenant still
                // tell its clients to look again.
                let shrunk = Pending {
                    data: json!({ "truncated": true }),
                    ..event
                };
                line = serde_json::to_string(&shrunk).unwrap_or_default();
            }
            if !current.is_empty() && current.len() + 1 + line.len() > MAX_PAYLOAD {
                payloads.push(std::mem::take(&mut current));
            }
            if current.is_empty() {
                *seq += 1;
                current = seq.to_string();
            }
            current.push('\n');
            current.push_str(&line);
        }
        if !current.is_empty() {
            payloads.push(current);
        }
        payloads
    }

    /// Tells every client to reload: events may have been lost.
    fn reload_all(&self, reason: &str) {
        let tenants: Vec<TenantId> = lock(&self.hub.tenants).keys().cloned().collect();
        for tenant in tenants {
            self.deliver(Pending {
                id: None,
                tenant,
                kind: Kind::Reload,
                data: json!({ "reason": reason }),
            });
        }
    }

    /// One payload from the relay: its events, in order, to the hub.
    fn received(&self, payload: &str) {
        for line in payload.lines().skip(1) {
            match serde_json::from_str::<Pending>(line) {
                Ok(event) => self.deliver(event),
                Err(e) => tracing::warn!(error = %e, "a stream payload could not be read"),
            }
        }
    }
}

impl Channel {
    fn new() -> Self {
        Self {
            live: broadcast::channel(CHANNEL_CAP).0,
            ring: VecDeque::new(),
            evicted: None,
        }
    }

    fn expire(&mut self) {
        while let Some((at, _, _)) = self.ring.front() {
            if at.elapsed() <= RING_AGE {
                break;
            }
            if let Some((_, _, old)) = self.ring.pop_front() {
                self.evicted = Some(old.id.clone());
            }
        }
    }
}

/// The events of one record, taken before it is written and published
/// once it has committed.
pub(crate) struct Recorded {
    tenant: TenantId,
    events: Vec<(Kind, Value)>,
}

impl Recorded {
    pub(crate) fn of(job: &ClaimedJob, record: &Record) -> Self {
        let mut events = Vec::new();
        for step in &record.steps {
            events.push((Kind::StepRecorded, step_recorded(&job.run_id, step)));
            if step.status == StepStatus::Completed {
                if step.kind == "incident/create" {
                    // The step's output says which incident, and whether
                    // it is new or a repeat of the open one.
                    let output = step.output.as_ref();
                    let id = output
                        .and_then(|o| o.get("incidentId"))
                        .and_then(Value::as_str);
                    let created = output
                        .and_then(|o| o.get("created"))
                        .and_then(Value::as_bool);
                    events.push(incident(&job.run_id, id, created != Some(false)));
                } else if step.kind.starts_with("ticket/") {
                    events.push((
                        Kind::TicketUpdated,
                        json!({ "ticket_id": record.subject_ticket_id, "run_id": job.run_id }),
                    ));
                }
            }
        }
        events.push((Kind::RunUpdated, run_updated(job, record.status)));
        Self {
            tenant: job.tenant_id.clone(),
            events,
        }
    }

    /// The record's transaction opened the incident `id` (`created`), or
    /// counted one more occurrence of it: a failed run's, a failed undo's.
    pub(crate) fn incident(&mut self, run_id: &RunId, id: &str, created: bool) {
        self.events.push(incident(run_id, Some(id), created));
    }

    pub(crate) fn publish(self, stream: &Stream) {
        for (kind, data) in self.events {
            stream.publish(&self.tenant, kind, data);
        }
    }
}

/// `incident.opened` for a new incident, `incident.updated` for another
/// occurrence of an open one.
fn incident(run_id: &RunId, id: Option<&str>, created: bool) -> (Kind, Value) {
    let kind = match created {
        true => Kind::IncidentOpened,
        false => Kind::IncidentUpdated,
    };
    (kind, json!({ "run_id": run_id, "incident_id": id }))
}

fn step_recorded(run_id: &RunId, step: &StepRecord) -> Value {
    json!({
        "run_id": run_id,
        "path": step.path,
        "step_id": step.step_id,
        "type": step.kind,
        "attempt": step.attempt,
        "status": step.status.as_str(),
        "error": step.error,
    })
}

fn run_updated(job: &ClaimedJob, status: RunStatus) -> Value {
    run_update(&job.run_id, &job.automation_id, status)
}

/// The data of a `run.updated` event: the run, its automation, its status.
pub(crate) fn run_update(
    run: &tok_core::ids::RunId,
    automation: &tok_core::ids::AutomationId,
    status: RunStatus,
) -> Value {
    json!({
        "run_id": run,
        "automation_id": automation,
        "status": status.as_str(),
    })
}

/// The runs a dispatch wrote, published once the dispatch committed: each
/// as its start control left it (an event that joined an open run made
/// none), with what holds it.
#[derive(Default)]
pub(crate) struct Planned {
    runs: Mutex<Vec<(TenantId, Kind, Value)>>,
}

impl Planned {
    /// Notes the runs a dispatch writes (called inside the dispatch, with
    /// the runs as they are written).
    pub(crate) fn note(&self, written: &[(TenantId, tok_core::ids::EventId, NewRun)]) {
        let mut runs = lock(&self.runs);
        let now = tok_store::now_ms();
        for (tenant, _, run) in written {
            for step in &run.steps {
                runs.push((
                    tenant.clone(),
                    Kind::StepRecorded,
                    step_recorded(&run.id, step),
                ));
            }
            let status = match run {
                r if r.refused.is_some() => RunStatus::Refused,
                r if r.skipped.is_some() => RunStatus::Skipped,
                r if r.cancelled.is_some() => RunStatus::Cancelled,
                r if r.first_path.is_none() => RunStatus::Completed,
                _ => RunStatus::Queued,
            };
            let mut data = json!({
                "run_id": run.id,
                "automation_id": run.automation_id,
                "status": status.as_str(),
            });
            if let Some(hold) = &run.hold
                && let tok_core::run::Resume::Deferred { limit, reason } = &hold.resume
            {
                let until = tok_store::rfc3339::format(now + hold.delay_ms);
                data["blocked_by"] =
                    json!({ "kind": limit, "until": until, "detail": { "reason": reason } });
            }
            runs.push((tenant.clone(), Kind::RunUpdated, data));
        }
    }

    pub(crate) fn publish(self, stream: &Stream) {
        for (tenant, kind, data) in self.runs.into_inner().unwrap_or_else(|e| e.into_inner()) {
            stream.publish(&tenant, kind, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relaying() -> Stream {
        let stream = Stream::default();
        *lock(&stream.hub.outbox) = Some(Outbox::default());
        stream
    }

    #[test]
    fn the_outbox_goes_out_in_payloads_under_the_limit_in_order() {
        let sender = relaying();
        let tenant = TenantId::from("t1");
        let filler = "x".repeat(300);
        for n in 0..200 {
            sender.publish(
                &tenant,
                Kind::StepRecorded,
                json!({ "n": n, "filler": filler }),
            );
        }
        sender.publish(
            &tenant,
            Kind::RunUpdated,
            json!({ "huge": "y".repeat(20_000) }),
        );
        let mut seq = 0;
        let payloads = sender.take_payloads(&mut seq);
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|p| p.len() <= MAX_PAYLOAD));
        assert!(
            sender.take_payloads(&mut seq).is_empty(),
            "the outbox is empty after"
        );

        let receiver = Stream::default();
        let mut live = receiver.subscribe(&tenant, None).live;
        for payload in &payloads {
            receiver.received(payload);
        }
        let mut got = Vec::new();
        while let Ok(event) = live.try_recv() {
            got.push(event);
        }
        let data = |e: &Event| serde_json::from_str::<Value>(&e.data).unwrap();
        let numbers: Vec<i64> = got.iter().filter_map(|e| data(e)["n"].as_i64()).collect();
        assert_eq!(numbers, (0..200).collect::<Vec<_>>());
        let last = got.last().unwrap();
        assert_eq!(last.kind, Kind::RunUpdated);
        assert_eq!(data(last), json!({ "truncated": true }));
    }

    #[test]
    fn every_receiver_gives_an_event_its_publishers_id_so_another_one_replays_it() {
        let sender = relaying();
        let tenant = TenantId::from("t1");
        for n in 0..5 {
            sender.publish(&tenant, Kind::RunUpdated, json!({ "n": n }));
        }
        let payloads = sender.take_payloads(&mut 0);
        let (one, two) = (Stream::default(), Stream::default());
        let mut live = one.subscribe(&tenant, None).live;
        for payload in &payloads {
            one.received(payload);
            two.received(payload);
        }
        let seen: Vec<Arc<Event>> = std::iter::from_fn(|| live.try_recv().ok()).collect();
        assert_eq!(seen.len(), 5);
        assert!(seen.iter().all(|e| e.id.starts_with(&sender.hub.boot)));
        // A client of `one` that saw two events reconnects to `two`.
        let again = two.subscribe(&tenant, Some(&seen[1].id));
        assert!(!again.gap);
        let missed: Vec<&str> = again.missed.iter().map(|e| e.id.as_str()).collect();
        let expected: Vec<&str> = seen[2..].iter().map(|e| e.id.as_str()).collect();
        assert_eq!(missed, expected);
        // An id `two` never received is a gap.
        assert!(
            two.subscribe(&tenant, Some(&format!("{}-99", sender.hub.boot)))
                .gap
        );
    }

    #[test]
    fn a_full_outbox_drops_its_oldest_and_tells_the_tenant_to_reload() {
        let sender = relaying();
        let tenant = TenantId::from("t1");
        for n in 0..OUTBOX_CAP + 5 {
            sender.publish(&tenant, Kind::StepRecorded, json!({ "n": n }));
        }
        let mut seq = 0;
        let payloads = sender.take_payloads(&mut seq);
        let first = payloads[0].lines().nth(1).unwrap();
        assert!(first.contains("\"reload\""), "{first}");
    }

    #[test]
    fn a_reconnect_gets_what_it_missed_or_is_told_it_is_gone() {
        let stream = Stream::default();
        let (a, b) = (TenantId::from("a"), TenantId::from("b"));
        let mut live = stream.subscribe(&a, None).live;
        stream.publish(&a, Kind::RunUpdated, json!({ "n": 1 }));
        let first = live.try_recv().unwrap();
        stream.publish(&b, Kind::RunUpdated, json!({ "n": 2 }));
        stream.publish(&a, Kind::RunUpdated, json!({ "n": 3 }));
        stream.publish(&a, Kind::StepRecorded, json!({ "n": 4 }));

        let again = stream.subscribe(&a, Some(&first.id));
        assert!(!again.gap);
        let missed: Vec<&str> = again.missed.iter().map(|e| &*e.data).collect();
        assert_eq!(
            missed,
            [r#"{"n":3}"#, r#"{"n":4}"#],
            "only a's, only after the id"
        );

        let other_start = stream.subscribe(&a, Some("ffffffff-1"));
        assert!(other_start.gap && other_start.missed.is_empty());
        let nonsense = stream.subscribe(&a, Some("not an id"));
        assert!(nonsense.gap);

        for n in 0..RING_CAP + 1 {
            stream.publish(&a, Kind::RunUpdated, json!({ "n": n }));
        }
        let too_late = stream.subscribe(&a, Some(&first.id));
        assert!(too_late.gap, "the events after it left the ring");
    }
}
