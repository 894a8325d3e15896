//! The scheduler with a driven clock, on both backends: polls at their
//! interval with one pending run at a time, cron ticks in their zone, one
//! catch-up run after downtime (which a trigger filter may skip), paused
//! automations passed over, one run
//! per tick with two schedulers racing on one database, and the lease
//! taken over once its holder stops renewing. Nothing sleeps: the tests
//! set the clock and call one tick at a time.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tok_core::ids::{AutomationId, TenantId};
use tok_core::schedule::instant;
use tok_engine::Registry;
use tok_engine::definitions::prepare;
use tok_engine::scheduler::{ManualClock, Scheduler, SchedulerConfig, WakeReport};
use tok_store::testing::{TestDb, run_on_fresh_db};
use tok_store::{AutomationStatus, RunFilter, RunSummary, Store, backend_tests};

backend_tests!(
    run_on_fresh_db;
    polls_run_at_their_interval_with_one_pending_run_at_a_time,
    paused_automations_are_passed_over,
    cron_ticks_fire_once_each_and_downtime_gives_one_catch_up_run,
    a_trigger_filter_over_the_event_can_skip_catch_up_runs,
    two_schedulers_racing_on_one_database_start_one_run_per_tick,
    the_wake_moves_to_another_node_when_its_holder_stops,
);

/// 2026-12-01T10:00:30Z.
const T0: i64 = 1_796_119_230_000;

fn at(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

async fn tenant(store: &dyn Store) -> TenantId {
    let key = tok_store::hash_secret(&tok_store::random_token());
    store.create_tenant("acme", &key).await.unwrap().id
}

/// Saves an automation with `trigger` as the API does (validated).
async fn automation(store: &dyn Store, tenant: &TenantId, trigger: Value) -> AutomationId {
    let raw = json!({
        "name": "scheduled",
        "trigger": trigger,
        "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "tick" } }],
    })
    .to_string();
    let (_, version) = prepare(raw.as_bytes(), &Registry::with_builtins()).expect("valid");
    store.create_automation(tenant, version).await.unwrap().id
}

fn scheduler(store: &Arc<dyn Store>, node: &str, clock: &Arc<ManualClock>) -> Scheduler {
    Scheduler::new(
        store.clone(),
        node,
        SchedulerConfig {
            tick: Duration::from_secs(1),
            lease: Duration::from_secs(15),
            ..SchedulerConfig::default()
        },
        clock.clone(),
    )
}

async fn runs(store: &dyn Store, tenant: &TenantId) -> Vec<RunSummary> {
    let mut items = store
        .runs(tenant, &RunFilter::default(), 100, None)
        .await
        .unwrap()
        .items;
    items.reverse();
    items
}

/// What each run's `_event` says: (trigger, scheduledAt, catchUp).
async fn events(store: &dyn Store, tenant: &TenantId) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for run in runs(store, tenant).await {
        let detail = store.run(tenant, &run.id).await.unwrap().unwrap();
        let event = &detail.context["_event"];
        assert_eq!(event["type"], json!(run.trigger_type));
        assert_eq!(
            detail.actor,
            json!({ "kind": "system", "source": run.trigger_type }),
            "a poll's or a schedule's run is started by the platform"
        );
        out.push((
            run.trigger_type,
            event["scheduledAt"].as_str().unwrap_or_default().to_owned(),
            event["catchUp"] == json!(true),
        ));
    }
    out
}

fn fired(polls: usize, schedules: usize, skipped: usize) -> WakeReport {
    WakeReport {
        held: true,
        polls,
        schedules,
        skipped,
        stuck: 0,
        expired: 0,
    }
}

async fn polls_run_at_their_interval_with_one_pending_run_at_a_time(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let poll = automation(&*store, &t, json!({"kind": "poll", "intervalSec": 30})).await;
    let clock = Arc::new(ManualClock::at(T0));
    let s = scheduler(&store, "n1", &clock);
    let tenants = [t.clone()];

    // A new poll automation polls at once.
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(1, 0, 0));
    assert_eq!(
        store.next_run_at(&t, &poll).await.unwrap(),
        Some(T0 + 30_000)
    );
    clock.advance(Duration::from_secs(29));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 0));

    // Due, but the first poll run is still queued: no second one.
    clock.advance(Duration::from_secs(1));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 1));
    clock.advance(Duration::from_secs(60));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 1));
    assert_eq!(runs(&*store, &t).await.len(), 1);

    // Once it has ended, the next poll starts at the next tick.
    let first = runs(&*store, &t).await.remove(0);
    store.cancel_run(&t, &first.id).await.unwrap();
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(1, 0, 0));
    assert_eq!(
        events(&*store, &t).await,
        [
            ("poll".into(), instant(T0), false),
            ("poll".into(), instant(T0 + 30_000), true),
        ]
    );
    assert_eq!(
        store.next_run_at(&t, &poll).await.unwrap(),
        Some(T0 + 90_000 + 30_000),
        "the interval counts from the last poll run's start"
    );
}

async fn paused_automations_are_passed_over(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let cron = automation(
        &*store,
        &t,
        json!({"kind": "schedule", "cron": "* * * * *"}),
    )
    .await;
    let clock = Arc::new(ManualClock::at(T0));
    let s = scheduler(&store, "n1", &clock);
    let tenants = [t.clone()];
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 0));

    store
        .set_automation_status(&t, &cron, AutomationStatus::Paused)
        .await
        .unwrap();
    clock.set(at("2026-12-01T10:05:10Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 1));
    assert!(runs(&*store, &t).await.is_empty());

    // Resumed: the ticks missed while paused are not made up for.
    store
        .set_automation_status(&t, &cron, AutomationStatus::Active)
        .await
        .unwrap();
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 0));
    clock.set(at("2026-12-01T10:06:00Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 1, 0));
}

async fn cron_ticks_fire_once_each_and_downtime_gives_one_catch_up_run(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let cron = automation(
        &*store,
        &t,
        json!({"kind": "schedule", "cron": "0 * * * *", "timezone": "Europe/Prague"}),
    )
    .await;
    let clock = Arc::new(ManualClock::at(T0));
    let s = scheduler(&store, "n1", &clock);
    let tenants = [t.clone()];

    // Saved at 10:00:30 UTC (11:00:30 in Prague): due at the next full hour.
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 0));
    assert_eq!(
        store.next_run_at(&t, &cron).await.unwrap(),
        Some(at("2026-12-01T11:00:00Z"))
    );
    clock.set(at("2026-12-01T10:59:59Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 0));
    clock.set(at("2026-12-01T11:00:00.300Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 1, 0));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 0));

    // Down from 11:10 to 14:20: three ticks missed, one run for them.
    clock.set(at("2026-12-01T14:20:00Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 1, 0));
    clock.set(at("2026-12-01T14:21:00Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 0));
    assert_eq!(
        events(&*store, &t).await,
        [
            ("schedule".into(), "2026-12-01T11:00:00Z".into(), false),
            ("schedule".into(), "2026-12-01T12:00:00Z".into(), true),
        ]
    );
    assert_eq!(
        store.next_run_at(&t, &cron).await.unwrap(),
        Some(at("2026-12-01T15:00:00Z"))
    );
}

async fn a_trigger_filter_over_the_event_can_skip_catch_up_runs(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let cron = automation(
        &*store,
        &t,
        json!({"kind": "schedule", "cron": "0 * * * *",
               "filter": {"rules": [{"field": "_event.catchUp", "operator": "eq", "value": false}]}}),
    )
    .await;
    let clock = Arc::new(ManualClock::at(T0));
    let s = scheduler(&store, "n1", &clock);
    let tenants = [t.clone()];
    s.wake(&tenants).await.unwrap();
    clock.set(at("2026-12-01T11:00:01Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 1, 0));
    // Down over 12:00 and 13:00: the catch-up run is filtered out, and
    // the schedule goes on at 14:00.
    clock.set(at("2026-12-01T13:30:00Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 0, 1));
    assert_eq!(
        store.next_run_at(&t, &cron).await.unwrap(),
        Some(at("2026-12-01T14:00:00Z"))
    );
    clock.set(at("2026-12-01T14:00:00Z"));
    assert_eq!(s.wake(&tenants).await.unwrap(), fired(0, 1, 0));
    let ticks: Vec<String> = events(&*store, &t).await.into_iter().map(|e| e.1).collect();
    assert_eq!(ticks, ["2026-12-01T11:00:00Z", "2026-12-01T14:00:00Z"]);
}

async fn two_schedulers_racing_on_one_database_start_one_run_per_tick(db: &TestDb) {
    // Two processes' stores on one database, each with a scheduler that
    // ignores the lease (as a holder that lost it mid-tick would).
    let (one, two) = (db.store().await, db.store().await);
    let t = tenant(&*one).await;
    automation(
        &*one,
        &t,
        json!({"kind": "schedule", "cron": "*/2 * * * * *"}),
    )
    .await;
    let clock = Arc::new(ManualClock::at(at("2026-12-01T10:00:00.500Z")));
    let (a, b) = (scheduler(&one, "a", &clock), scheduler(&two, "b", &clock));
    let tenants = [t.clone()];
    a.fire_due(&tenants).await.unwrap();
    let mut fired = 0;
    for _ in 0..10 {
        clock.advance(Duration::from_secs(2));
        let (x, y) = tokio::join!(a.fire_due(&tenants), b.fire_due(&tenants));
        fired += x.unwrap().schedules + y.unwrap().schedules;
    }
    let ticks: Vec<String> = events(&*one, &t).await.into_iter().map(|e| e.1).collect();
    let expected: Vec<String> = (1..=10)
        .map(|i| instant(at("2026-12-01T10:00:00Z") + i * 2_000))
        .collect();
    assert_eq!(ticks, expected, "each tick has exactly one run");
    assert!(
        fired >= 10,
        "both may count a tick they raced for, never fewer"
    );
}

async fn the_wake_moves_to_another_node_when_its_holder_stops(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    automation(
        &*store,
        &t,
        json!({"kind": "schedule", "cron": "*/2 * * * * *"}),
    )
    .await;
    let clock = Arc::new(ManualClock::at(at("2026-12-01T10:00:00.500Z")));
    let (a, b) = (
        scheduler(&store, "a", &clock),
        scheduler(&store, "b", &clock),
    );
    let tenants = [t.clone()];
    assert!(a.wake(&tenants).await.unwrap().held);
    assert!(!b.wake(&tenants).await.unwrap().held);
    clock.advance(Duration::from_secs(2));
    assert_eq!(b.wake(&tenants).await.unwrap(), WakeReport::default());
    assert_eq!(a.wake(&tenants).await.unwrap(), fired(0, 1, 0));

    // `a` dies: within one lease `b` holds the wake and fires the tick due.
    clock.advance(Duration::from_secs(14));
    assert!(!b.wake(&tenants).await.unwrap().held);
    clock.advance(Duration::from_secs(1));
    assert_eq!(b.wake(&tenants).await.unwrap(), fired(0, 1, 0));
    assert_eq!(
        runs(&*store, &t).await.len(),
        2,
        "one catch-up run for a's ticks"
    );

    // A clean stop hands over at once.
    b.release().await.unwrap();
    assert!(a.wake(&tenants).await.unwrap().held);
}

/// Counts the statements sqlx runs (its `sqlx::query` events) in the
/// future it is given to, whatever thread polls it.
#[derive(Default)]
struct Statements(std::sync::atomic::AtomicUsize);

impl tracing::Subscriber for Statements {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target() == "sqlx::query" {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// How many statements `future` runs (PostgreSQL: sqlx runs them in the
/// caller's task; SQLite's run on a thread of their own, out of sight).
async fn statements<F: std::future::Future>(
    counter: &Arc<Statements>,
    future: F,
) -> (F::Output, usize) {
    use tracing::instrument::WithSubscriber as _;
    // Other tests' threads may have registered sqlx's callsite while no
    // subscriber wanted it: make tracing ask again.
    tracing::callsite::rebuild_interest_cache();
    counter.0.store(0, std::sync::atomic::Ordering::SeqCst);
    let out = future
        .with_subscriber(tracing::Dispatch::from(counter.clone()))
        .await;
    (out, counter.0.swap(0, std::sync::atomic::Ordering::SeqCst))
}

/// A tick reads the schedule rows of every tenant together: with 100
/// tenants of a cron automation each, a quiet tick is three statements
/// (stale rows, rows to remove, due rows), not three per tenant; a tick
/// with every tenant due still reads them once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_reads_for_every_tenant_at_once_postgres() {
    run_on_fresh_db(tok_store::Backend::Postgres, async |db: &TestDb| {
        let store = db.store().await;
        let mut tenants = Vec::new();
        for _ in 0..100 {
            let t = tenant(&*store).await;
            automation(
                &*store,
                &t,
                json!({"kind": "schedule", "cron": "0 * * * *", "timezone": "UTC"}),
            )
            .await;
            tenants.push(t);
        }
        let clock = Arc::new(ManualClock::at(at("2026-12-01T10:00:30Z")));
        let s = scheduler(&store, "n1", &clock);
        let counter = Arc::new(Statements::default());
        let _registered = tracing::Dispatch::from(counter.clone());
        // The first tick writes the 100 schedule rows (due at 11:00).
        let (report, first) = statements(&counter, s.fire_due(&tenants)).await;
        assert_eq!(report.unwrap().schedules, 0);
        assert!(first > 100, "{first} statements: each row written");
        let (report, quiet) = statements(&counter, s.fire_due(&tenants)).await;
        assert_eq!(report.unwrap(), WakeReport::default());
        assert_eq!(quiet, 3, "a quiet tick with 100 tenants");

        clock.set(at("2026-12-01T11:00:00Z"));
        let (report, due) = statements(&counter, s.fire_due(&tenants)).await;
        assert_eq!(report.unwrap().schedules, 100);
        // Three reads, then each run's own writes.
        let (_, after) = statements(&counter, s.fire_due(&tenants)).await;
        assert_eq!(after, 3);
        assert!(due > 3, "{due}");
        for t in &tenants {
            assert_eq!(runs(&*store, t).await.len(), 1);
        }
    })
    .await;
}
