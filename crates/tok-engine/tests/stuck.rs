//! Stuck runs, found by the scheduler's watch with a driven clock on both
//! backends: a run past `settings.runTimeout` (or the platform's
//! `TOK_RUN_TIMEOUT` without one) is failed with a `run_timeout` platform
//! incident, a wait a minute past its due time and
//! untaken gives `wait_overdue`, a job whose lease expired three times
//! gives `lease_expired_repeatedly`, and a ready job older than five minutes
//! while workers are free gives `queue_stalled`; one incident per cause. A
//! child run failed from outside the decider (its timeout, a definition
//! that no longer reads) fails the parent that waits for it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tok_core::ids::{AutomationId, RunId, TenantId};
use tok_engine::definitions::prepare;
use tok_engine::scheduler::{ManualClock, Scheduler, SchedulerConfig};
use tok_engine::{Engine, EngineConfig, Registry};
use tok_store::testing::{TestDb, run_on_fresh_db};
use tok_store::{Backend, PlatformIncident, Store, backend_tests, now_ms};

backend_tests!(
    run_on_fresh_db;
    a_run_past_its_timeout_fails_with_a_run_timeout_incident,
    the_platforms_run_timeout_holds_for_automations_without_their_own,
    a_child_failed_by_its_timeout_fails_the_parent_that_waits_for_it,
    a_child_whose_definition_no_longer_reads_fails_the_parent_that_waits_for_it,
    a_wait_overdue_and_untaken_gives_a_wait_overdue_incident,
    a_ready_job_waiting_while_workers_are_free_gives_queue_stalled,
    a_job_whose_lease_expired_three_times_gives_lease_expired_repeatedly,
);

const MINUTE: Duration = Duration::from_secs(60);

async fn tenant(store: &dyn Store) -> TenantId {
    let key = tok_store::hash_secret(&tok_store::random_token());
    store.create_tenant("acme", &key).await.unwrap().id
}

async fn automation(store: &dyn Store, tenant: &TenantId, definition: Value) -> AutomationId {
    let (_, version) = prepare(
        definition.to_string().as_bytes(),
        &Registry::with_builtins(),
    )
    .expect("valid");
    store.create_automation(tenant, version).await.unwrap().id
}

fn engine(store: &Arc<dyn Store>) -> Engine {
    Engine::new(
        store.clone(),
        Registry::with_builtins(),
        EngineConfig::default(),
    )
}

fn watcher(store: &Arc<dyn Store>, clock: &Arc<ManualClock>) -> Scheduler {
    Scheduler::new(
        store.clone(),
        "n1",
        SchedulerConfig::default(),
        clock.clone(),
    )
}

async fn open_incidents(store: &dyn Store) -> Vec<PlatformIncident> {
    store
        .platform_incidents(Some("open"), 100, None)
        .await
        .unwrap()
        .items
}

async fn a_run_past_its_timeout_fails_with_a_run_timeout_incident(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let steps = json!([{ "id": "st_log", "type": "flow/log", "config": { "message": "hi" } }]);
    let timed = automation(
        &*store,
        &t,
        json!({ "name": "Timed", "trigger": { "kind": "manual" }, "steps": steps,
                "settings": { "runTimeout": "1h" } }),
    )
    .await;
    let untimed = automation(
        &*store,
        &t,
        json!({ "name": "Untimed", "trigger": { "kind": "manual" }, "steps": steps }),
    )
    .await;
    // Written, never executed: no engine runs.
    let engine = engine(&store);
    let run = engine.start_run(&t, &timed, json!({}), None).await.unwrap();
    let other = engine
        .start_run(&t, &untimed, json!({}), None)
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::at(now_ms() + 59 * MINUTE.as_millis() as i64));
    let s = watcher(&store, &clock);
    let tenants = [t.clone()];

    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 0);
    clock.advance(2 * MINUTE);
    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 1);
    let failed = store.run(&t, &run).await.unwrap().unwrap().run;
    assert_eq!(failed.status, "failed");
    assert_eq!(
        failed.error.as_deref(),
        Some("run_timeout: the run did not finish within 1h (settings.runTimeout)")
    );
    let incidents = open_incidents(&*store).await;
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0].reason, "run_timeout");
    assert_eq!(incidents[0].run_id.as_deref(), Some(run.as_str()));
    assert_eq!(incidents[0].tenant_id.as_deref(), Some(t.as_str()));
    assert!(
        incidents[0].title.contains("\u{201c}Timed\u{201d}"),
        "{incidents:?}"
    );

    // Failed once; the automation without a timeout keeps its run.
    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 0);
    let kept = store.run(&t, &other).await.unwrap().unwrap().run;
    assert_eq!(kept.status, "queued");
    assert_eq!(open_incidents(&*store).await.len(), 1);
}

async fn the_platforms_run_timeout_holds_for_automations_without_their_own(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let steps = json!([{ "id": "st_log", "type": "flow/log", "config": { "message": "hi" } }]);
    let own = automation(
        &*store,
        &t,
        json!({ "name": "Own", "trigger": { "kind": "manual" }, "steps": steps,
                "settings": { "runTimeout": "3h" } }),
    )
    .await;
    let plain = automation(
        &*store,
        &t,
        json!({ "name": "Plain", "trigger": { "kind": "manual" }, "steps": steps }),
    )
    .await;
    let engine = engine(&store);
    let kept = engine.start_run(&t, &own, json!({}), None).await.unwrap();
    let timed = engine.start_run(&t, &plain, json!({}), None).await.unwrap();
    let clock = Arc::new(ManualClock::at(now_ms() + 119 * MINUTE.as_millis() as i64));
    let config = SchedulerConfig {
        run_timeout: Some(2 * 60 * MINUTE),
        ..SchedulerConfig::default()
    };
    let s = Scheduler::new(store.clone(), "n1", config, clock.clone());
    let tenants = [t.clone()];

    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 0);
    clock.advance(2 * MINUTE);
    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 1);
    let failed = store.run(&t, &timed).await.unwrap().unwrap().run;
    assert_eq!(failed.status, "failed");
    assert_eq!(
        failed.error.as_deref(),
        Some("run_timeout: the run did not finish within 2h (TOK_RUN_TIMEOUT)")
    );
    // The automation's own timeout (3h) is longer than the platform's.
    let own_run = store.run(&t, &kept).await.unwrap().unwrap().run;
    assert_eq!(own_run.status, "queued");
}

async fn a_child_failed_by_its_timeout_fails_the_parent_that_waits_for_it(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let child = automation(
        &*store,
        &t,
        json!({ "name": "Slow child", "trigger": { "kind": "manual" },
                "steps": [{ "id": "st_wait", "type": "wait_for_event", "config": { "key": "never" } }],
                "settings": { "runTimeout": "1h" } }),
    )
    .await;
    let parent = automation(
        &*store,
        &t,
        json!({ "name": "Parent", "trigger": { "kind": "manual" },
                "steps": [{ "id": "st_child", "type": "run_workflow",
                            "config": { "automation": child.as_str(), "input": {} } }] }),
    )
    .await;
    let engine = engine(&store);
    engine.refresh_tenants().await.unwrap();
    let running = engine.start(true).await.unwrap();
    let run = engine
        .start_run(&t, &parent, json!({}), None)
        .await
        .unwrap();
    wait_for_status(&*store, &t, &run, "waiting").await;
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    let child_run = RunId::from(
        detail.waits[0]
            .key
            .strip_prefix("run:")
            .expect("the parent waits on its child")
            .to_owned(),
    );
    wait_for_status(&*store, &t, &child_run, "waiting").await;

    let clock = Arc::new(ManualClock::at(now_ms() + 61 * MINUTE.as_millis() as i64));
    let s = watcher(&store, &clock);
    assert_eq!(s.watch(std::slice::from_ref(&t)).await.unwrap().stuck, 1);
    wait_for_status(&*store, &t, &run, "failed").await;
    running.shutdown().await;

    let failed = store.run(&t, &run).await.unwrap().unwrap();
    let error = failed.run.error.clone().unwrap_or_default();
    assert!(
        error.contains("child_failed") && error.contains("run_timeout"),
        "the parent's step fails with the child's error: {error}"
    );
    // The child failed like a run the decider fails: a tenant incident.
    let incidents = store.incidents(&t, None, 10, None).await.unwrap().items;
    let of_child: Vec<_> = incidents
        .iter()
        .filter(|i| i.run_id.as_deref() == Some(child_run.as_str()))
        .collect();
    assert_eq!(of_child.len(), 1, "{incidents:?}");
    assert!(
        of_child[0].title.contains("\u{201c}Slow child\u{201d}"),
        "{incidents:?}"
    );
    assert_eq!(
        of_child[0].detail["message"],
        json!(error_of(&*store, &t, &child_run).await)
    );
}

async fn a_child_whose_definition_no_longer_reads_fails_the_parent_that_waits_for_it(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let child = automation(
        &*store,
        &t,
        json!({ "name": "Child", "trigger": { "kind": "manual" },
                "steps": [{ "id": "st_wait", "type": "wait_for_event", "config": { "key": "go" } }] }),
    )
    .await;
    let parent = automation(
        &*store,
        &t,
        json!({ "name": "Parent", "trigger": { "kind": "manual" },
                "steps": [{ "id": "st_child", "type": "run_workflow",
                            "config": { "automation": child.as_str(), "input": {} } }] }),
    )
    .await;
    let first = engine(&store);
    first.refresh_tenants().await.unwrap();
    let running = first.start(true).await.unwrap();
    let run = first.start_run(&t, &parent, json!({}), None).await.unwrap();
    wait_for_status(&*store, &t, &run, "waiting").await;
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    let child_run = RunId::from(detail.waits[0].key.strip_prefix("run:").unwrap().to_owned());
    wait_for_status(&*store, &t, &child_run, "waiting").await;
    running.shutdown().await;

    // The child's stored version stops reading (written by hand); a new
    // process, which has not read it yet, claims the child when it resumes.
    raw(
        db,
        &format!(
            "UPDATE automation_versions SET definition = '{{\"steps\": 5}}' \
             WHERE automation_id = '{child}'"
        ),
    )
    .await;
    let second = engine(&store);
    second.refresh_tenants().await.unwrap();
    let running = second.start(true).await.unwrap();
    let signal = tok_store::NewSignal {
        key: "go".into(),
        subject: None,
        payload: json!({}),
        idempotency_key: None,
        lookback_ms: 0,
        actor: None,
    };
    store.send_signal(&t, signal).await.unwrap();
    wait_for_status(&*store, &t, &run, "failed").await;
    running.shutdown().await;

    let child_error = error_of(&*store, &t, &child_run).await;
    assert!(child_error.contains("does not parse"), "{child_error}");
    assert_eq!(
        store.run(&t, &child_run).await.unwrap().unwrap().run.status,
        "failed"
    );
    let error = error_of(&*store, &t, &run).await;
    assert!(
        error.contains("child_failed") && error.contains(&child_error),
        "the parent's step fails with the child's error: {error}"
    );
    let incidents = store.incidents(&t, None, 10, None).await.unwrap().items;
    assert!(
        incidents
            .iter()
            .any(|i| i.run_id.as_deref() == Some(child_run.as_str())),
        "the child's failure opened an incident: {incidents:?}"
    );
}

async fn error_of(store: &dyn Store, t: &TenantId, run: &RunId) -> String {
    let detail = store.run(t, run).await.unwrap().unwrap();
    detail.run.error.unwrap_or_default()
}

async fn a_wait_overdue_and_untaken_gives_a_wait_overdue_incident(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let waiting = automation(
        &*store,
        &t,
        json!({ "name": "Await", "trigger": { "kind": "manual" },
                "steps": [{ "id": "st_wait", "type": "wait_for_event",
                            "config": { "key": "payment", "timeout": "1h" } }] }),
    )
    .await;
    let engine = engine(&store);
    engine.refresh_tenants().await.unwrap();
    let running = engine.start(true).await.unwrap();
    let run = engine
        .start_run(&t, &waiting, json!({}), None)
        .await
        .unwrap();
    wait_for_status(&*store, &t, &run, "waiting").await;
    // No worker from now on: the timeout, when due, is taken by nobody.
    running.shutdown().await;

    let clock = Arc::new(ManualClock::at(now_ms() + 60 * MINUTE.as_millis() as i64));
    let s = watcher(&store, &clock);
    let tenants = [t.clone()];
    assert_eq!(
        s.watch(&tenants).await.unwrap().stuck,
        0,
        "due, not yet overdue"
    );
    clock.advance(2 * MINUTE);
    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 1);
    // Seen again while open: one incident, two occurrences.
    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 1);
    let incidents = open_incidents(&*store).await;
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0].reason, "wait_overdue");
    assert_eq!(incidents[0].run_id.as_deref(), Some(run.as_str()));
    assert_eq!(incidents[0].occurrences, 2);

    // Resolved, and seen again: a new incident.
    assert!(
        store
            .resolve_platform_incident(&incidents[0].id, clock_now(&clock))
            .await
            .unwrap()
    );
    s.watch(&tenants).await.unwrap();
    let again = open_incidents(&*store).await;
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].id, incidents[0].id);
}

async fn a_ready_job_waiting_while_workers_are_free_gives_queue_stalled(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let a = automation(
        &*store,
        &t,
        json!({ "name": "A", "trigger": { "kind": "manual" },
                "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "hi" } }] }),
    )
    .await;
    engine(&store)
        .start_run(&t, &a, json!({}), None)
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::at(now_ms()));
    let tenants = [t.clone()];
    let busy = watcher(&store, &clock).with_free_slots(Arc::new(|| 0));
    let free = watcher(&store, &clock).with_free_slots(Arc::new(|| 4));
    assert_eq!(free.watch(&tenants).await.unwrap().stuck, 0, "a fresh job");

    // The job became ready six minutes ago (the queue's age is the
    // database's clock, so the row is moved back instead).
    age_jobs(db, 6 * 60_000).await;
    assert_eq!(
        busy.watch(&tenants).await.unwrap().stuck,
        0,
        "every slot busy: a backlog, not a stall"
    );
    assert_eq!(free.watch(&tenants).await.unwrap().stuck, 1);
    let incidents = open_incidents(&*store).await;
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0].reason, "queue_stalled");
    assert_eq!(incidents[0].tenant_id, None);
}

async fn a_job_whose_lease_expired_three_times_gives_lease_expired_repeatedly(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store).await;
    let a = automation(
        &*store,
        &t,
        json!({ "name": "A", "trigger": { "kind": "manual" },
                "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "hi" } }] }),
    )
    .await;
    let run = engine(&store)
        .start_run(&t, &a, json!({}), None)
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::at(now_ms()));
    let s = watcher(&store, &clock);
    let tenants = [t.clone()];
    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 0);
    // Three workers died on it (the conformance suite shows the count).
    raw(db, "UPDATE jobs SET lease_expiries = 3").await;
    assert_eq!(s.watch(&tenants).await.unwrap().stuck, 1);
    let incidents = open_incidents(&*store).await;
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0].reason, "lease_expired_repeatedly");
    assert_eq!(incidents[0].run_id.as_deref(), Some(run.as_str()));
    assert_eq!(incidents[0].detail["lease_expiries"], 3);
}

fn clock_now(clock: &ManualClock) -> i64 {
    use tok_engine::scheduler::Clock as _;
    clock.now_ms()
}

async fn wait_for_status(store: &dyn Store, t: &TenantId, run: &RunId, status: &str) {
    for _ in 0..600 {
        let detail = store.run(t, run).await.unwrap().unwrap();
        if detail.run.status == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("run {run} never became {status}");
}

/// Moves every job's due time `by_ms` into the past.
async fn age_jobs(db: &TestDb, by_ms: i64) {
    raw(
        db,
        &format!("UPDATE jobs SET run_after = run_after - {by_ms}"),
    )
    .await;
}

/// Runs setup SQL underneath the store (what the API cannot do on purpose).
async fn raw(db: &TestDb, sql: &str) {
    match db.backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            sqlx::query(sql).execute(&pool).await.unwrap();
            pool.close().await;
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            sqlx::query(sql).execute(&pool).await.unwrap();
            pool.close().await;
        }
    }
}
