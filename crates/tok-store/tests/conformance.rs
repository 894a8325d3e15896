//! The store conformance suite: the behaviour every backend must show, run
//! against SQLite and PostgreSQL alike (`testing::backends()`), each test on
//! a fresh database of its own.
//!
//! Tests drive the store only through its public traits and assert on what a
//! caller gets back (claimed jobs, runs, pages, inbox answers). Raw SQL is
//! used in setup alone, to simulate what the API cannot do on purpose: an
//! event found pending again after its runs were written (a dispatcher that
//! crashed) and the passing of the inbox's 24-hour idempotency window.
//!
//! Timing: waits for a lease or delay to expire sleep well past it, and
//! nothing asserts on how long an operation took.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::Connection;
use tok_core::ids::{AutomationId, EventId, RunId, SourceId, TenantId};
use tok_store::testing::{TestDb, backends};
use tok_store::{
    Backend, Candidate, ClaimedJob, Lane, NewEvent, NewRun, NewSource, NewVersion, NextJob,
    PendingEvent, PgStore, Plan, QueueStore, Record, RunFilter, RunStatus, RunSummary, StepRecord,
    Store, StoreError,
};

// ---------------------------------------------------------------------------
// Setup helpers
// ---------------------------------------------------------------------------

/// A lease long enough that it never expires during a test.
const LONG_LEASE_MS: i64 = 60_000;
/// A lease a test waits out on purpose, and how long it waits.
const SHORT_LEASE_MS: i64 = 300;
const PAST_SHORT_LEASE: Duration = Duration::from_millis(1_500);

async fn tenant(store: &dyn Store, name: &str) -> TenantId {
    let key = tok_store::hash_secret(&tok_store::random_token());
    store
        .create_tenant(name, &key)
        .await
        .expect("create tenant")
        .id
}

async fn source(store: &dyn Store, tenant: &TenantId, name: &str) -> SourceId {
    let new = NewSource {
        name: name.into(),
        token: tok_store::random_token(),
        params: json!([]),
        critical: false,
        rate_limit: None,
        secret: None,
    };
    store
        .create_source(tenant, new)
        .await
        .expect("create source")
        .id
}

fn version(name: &str, trigger_kind: &str, trigger_key: Option<&str>) -> NewVersion {
    let definition = json!({
        "name": name,
        "trigger": { "kind": trigger_kind, "source": trigger_key },
        "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "hi" } }],
    });
    NewVersion {
        name: name.into(),
        hash: tok_store::hash_secret(&definition.to_string()),
        definition,
        trigger_kind: trigger_kind.into(),
        trigger_key: trigger_key.map(str::to_owned),
    }
}

/// An automation started by hand.
async fn manual_automation(store: &dyn Store, tenant: &TenantId, name: &str) -> AutomationId {
    let def = version(name, "manual", None);
    store
        .create_automation(tenant, def)
        .await
        .expect("create automation")
        .id
}

/// An automation triggered by webhooks of `source`.
async fn webhook_automation(
    store: &dyn Store,
    tenant: &TenantId,
    name: &str,
    source: &SourceId,
) -> AutomationId {
    let def = version(name, "webhook", Some(source.as_str()));
    store
        .create_automation(tenant, def)
        .await
        .expect("create automation")
        .id
}

fn webhook_event(source: &SourceId, key: &str) -> NewEvent {
    NewEvent {
        event_type: None,
        subject_ticket_id: None,
        source_id: Some(source.clone()),
        source_kind: "webhook".into(),
        idempotency_key: key.into(),
        payload: json!({ "kind": "order.created", "key": key }),
        params: json!({}),
        depth: 0,
        cause_run_id: None,
        origin_automation_id: None,
        target_automation_id: None,
    }
}

fn manual_event(automation: &AutomationId) -> NewEvent {
    NewEvent {
        event_type: None,
        subject_ticket_id: None,
        source_id: None,
        source_kind: "manual".into(),
        idempotency_key: tok_store::random_token(),
        payload: json!({}),
        params: json!({}),
        depth: 0,
        cause_run_id: None,
        origin_automation_id: None,
        target_automation_id: Some(automation.clone()),
    }
}

fn new_run(automation: &AutomationId, trigger: &str, queue_key: Option<&str>) -> NewRun {
    NewRun {
        subject_ticket_id: None,
        steps: Vec::new(),
        actions: 0,
        id: RunId::generate(),
        automation_id: automation.clone(),
        version: 1,
        trigger_type: trigger.into(),
        context: json!({ "n": 0 }),
        depth: 0,
        queue_key: queue_key.map(str::to_owned),
        priority: 0,
        first_path: Some("0".into()),
        idempotency_key: None,
    }
}

/// Starts one run by hand; its first job (path `0`) is ready at once.
async fn start(
    store: &dyn Store,
    tenant: &TenantId,
    automation: &AutomationId,
    trigger: &str,
    queue_key: Option<&str>,
) -> RunId {
    let run = new_run(automation, trigger, queue_key);
    store
        .start_run(tenant, manual_event(automation), run)
        .await
        .expect("start run")
}

/// What the engine's dispatcher does, minus filters: one run per candidate.
fn one_run_per_candidate(event: &PendingEvent, candidates: &[Candidate]) -> Plan {
    Plan {
        notes: Vec::new(),
        runs: candidates
            .iter()
            .map(|c| NewRun {
                subject_ticket_id: None,
                steps: Vec::new(),
                actions: 0,
                id: RunId::generate(),
                automation_id: c.automation_id.clone(),
                version: c.version,
                trigger_type: event.source_kind.clone(),
                context: json!({ "event": event.id }),
                depth: event.depth,
                queue_key: None,
                priority: 0,
                first_path: Some("0".into()),
                idempotency_key: None,
            })
            .collect(),
    }
}

fn step(path: &str, status: tok_store::StepStatus, output: Value) -> StepRecord {
    StepRecord {
        path: path.into(),
        step_id: format!("st_{}", path.replace('.', "_")),
        kind: "flow/log".into(),
        attempt: 1,
        status,
        input: Some(json!({ "in": path })),
        output: Some(output),
        error: None,
        log: vec![format!("step {path}")],
        started_at: 1,
        finished_at: 2,
    }
}

/// Ends the run: the job is deleted and the run takes `status`.
fn finish(job: &ClaimedJob, status: RunStatus) -> Record {
    Record {
        subject_ticket_id: None,
        steps: vec![step(&job.path, tok_store::StepStatus::Completed, json!({}))],
        context: job.context.clone(),
        actions: job.actions + 1,
        status,
        error: None,
        next: NextJob::Done,
    }
}

/// Runs `sql` on a connection of its own (test setup only).
async fn raw_sql(db: &TestDb, sql: &str) -> u64 {
    match db.backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&db.url)
                .await
                .expect("raw connection");
            let done = sqlx::query(sql).execute(&mut conn).await.expect("raw sql");
            conn.close().await.expect("close raw connection");
            done.rows_affected()
        }
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("raw connection");
            let done = sqlx::query(sql).execute(&mut conn).await.expect("raw sql");
            conn.close().await.expect("close raw connection");
            done.rows_affected()
        }
    }
}

async fn all_runs(store: &dyn Store, tenant: &TenantId) -> Vec<RunSummary> {
    let page = store
        .runs(tenant, &RunFilter::default(), 500, None)
        .await
        .expect("list runs");
    assert!(page.next_cursor.is_none(), "more than 500 runs in a test");
    page.items
}

fn run_ids(jobs: &[ClaimedJob]) -> HashSet<RunId> {
    jobs.iter().map(|j| j.run_id.clone()).collect()
}

// ---------------------------------------------------------------------------
// 1. Fairness between tenants
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_tenant_is_not_starved_by_a_large_backlog() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        fairness(&db).await;
        db.cleanup().await;
    }
}

async fn fairness(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let big = tenant(store, "big").await;
    let small = tenant(store, "small").await;

    // 10,000 runs for `big`, fast: 100 webhook automations on one source and
    // 100 events, each event starting one run per automation.
    let src = source(store, &big, "flood").await;
    for i in 0..100 {
        webhook_automation(store, &big, &format!("flood {i}"), &src).await;
    }
    for i in 0..100 {
        store
            .accept_event(&big, webhook_event(&src, &format!("e{i}")))
            .await
            .expect("accept");
    }
    let mut taken = 0;
    loop {
        let n = store
            .dispatch(std::slice::from_ref(&big), 25, &one_run_per_candidate)
            .await;
        match n.expect("dispatch") {
            0 => break,
            n => taken += n,
        }
    }
    assert_eq!(taken, 100, "{backend:?}");

    // Then 10 runs for `small`, queued after all of big's.
    let small_aut = manual_automation(store, &small, "small").await;
    let mut small_runs = HashSet::new();
    for _ in 0..10 {
        small_runs.insert(start(store, &small, &small_aut, "manual", None).await);
    }

    let both = [big.clone(), small.clone()];
    let stats = store.queue_stats(&both).await.expect("stats");
    assert_eq!(
        stats.ready, 10_010,
        "{backend:?}: jobs ready before claiming"
    );

    let mut small_done = 0;
    let mut batches = 0;
    while small_done < 10 {
        batches += 1;
        assert!(
            batches <= 3,
            "{backend:?}: small tenant still waiting after {batches} batches"
        );
        let jobs = store
            .claim(&both, "node-1", 8, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(jobs.len(), 8, "{backend:?}: a full batch is available");
        let small_in_batch = jobs.iter().filter(|j| j.tenant_id == small).count();
        let big_in_batch = jobs.iter().filter(|j| j.tenant_id == big).count();
        if batches == 1 {
            // Round robin: each tenant gets an equal share of the first batch.
            assert_eq!(
                small_in_batch, 4,
                "{backend:?}: small's share of the first batch"
            );
            assert_eq!(
                big_in_batch, 4,
                "{backend:?}: big's share of the first batch"
            );
        }
        for job in &jobs {
            if job.tenant_id == small {
                assert!(
                    small_runs.contains(&job.run_id),
                    "{backend:?}: a job of an unknown run"
                );
                small_done += 1;
            }
            store
                .record(job, finish(job, RunStatus::Completed))
                .await
                .expect("record");
        }
    }
    assert_eq!(
        batches, 3,
        "{backend:?}: 10 jobs at 4 per batch take 3 batches"
    );

    let small_stats = store
        .queue_stats(std::slice::from_ref(&small))
        .await
        .expect("stats");
    assert_eq!(
        (small_stats.ready, small_stats.running),
        (0, 0),
        "{backend:?}"
    );
    let big_stats = store
        .queue_stats(std::slice::from_ref(&big))
        .await
        .expect("stats");
    assert_eq!(
        big_stats.ready,
        10_000 - 14,
        "{backend:?}: big's backlog is mostly left"
    );
    for run in all_runs(store, &small).await {
        assert_eq!(
            run.status, "completed",
            "{backend:?}: small's run {}",
            run.id
        );
    }
}

// ---------------------------------------------------------------------------
// 2. One leased job per queue key
// ---------------------------------------------------------------------------

#[tokio::test]
async fn jobs_sharing_a_queue_key_are_never_leased_together() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        queue_keys(&db).await;
        db.cleanup().await;
    }
}

async fn queue_keys(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "tickets").await;
    let first = start(store, &t, &aut, "manual", Some("ticket:1")).await;
    let second = start(store, &t, &aut, "manual", Some("ticket:1")).await;
    let third = start(store, &t, &aut, "manual", Some("ticket:1")).await;
    let other_key = start(store, &t, &aut, "manual", Some("ticket:2")).await;
    let no_key_a = start(store, &t, &aut, "manual", None).await;
    let no_key_b = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    // One batch with room for all: only one of ticket:1's jobs is in it.
    let batch = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    let claimed = run_ids(&batch);
    assert_eq!(batch.len(), 4, "{backend:?}: {claimed:?}");
    let keyed: Vec<_> = [&first, &second, &third]
        .into_iter()
        .filter(|r| claimed.contains(*r))
        .collect();
    assert_eq!(
        keyed,
        vec![&first],
        "{backend:?}: the oldest job of ticket:1, alone"
    );
    for run in [&other_key, &no_key_a, &no_key_b] {
        assert!(
            claimed.contains(run),
            "{backend:?}: {run} (other key or no key) is claimed too"
        );
    }

    // While ticket:1's job is leased, its other jobs stay put, for any node.
    let again = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        again.is_empty(),
        "{backend:?}: claimed {:?}",
        run_ids(&again)
    );

    // Recording the holder's outcome frees the key for the next job.
    let holder = batch.iter().find(|j| j.run_id == first).unwrap();
    store
        .record(holder, finish(holder, RunStatus::Completed))
        .await
        .expect("record");
    let next = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(next.len(), 1, "{backend:?}: {:?}", run_ids(&next));
    assert!(
        next[0].run_id == second || next[0].run_id == third,
        "{backend:?}"
    );
    let blocked = store
        .claim(&tenants, "node-3", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        blocked.is_empty(),
        "{backend:?}: the third ticket:1 job waits its turn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_never_share_a_job_or_a_queue_key() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        concurrent_claims(&db).await;
        db.cleanup().await;
    }
}

async fn concurrent_claims(db: &TestDb) {
    let backend = db.backend;
    let store: Arc<dyn Store> = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    // 30 jobs without a key and 4 keys with 5 jobs each; a key's jobs lie
    // close together, so one batch's candidates hold several of them.
    let mut key_of = std::collections::HashMap::new();
    for i in 0..50 {
        let key = (i % 2 == 0 && i < 40).then(|| format!("ticket:{}", i / 10));
        let run = start(&*store, &t, &aut, "manual", key.as_deref()).await;
        key_of.insert(run, key);
    }
    let keyed = key_of.values().filter(|k| k.is_some()).count();
    let keys: HashSet<_> = key_of.values().flatten().cloned().collect();
    assert_eq!((keyed, keys.len()), (20, 4));
    let claimable = key_of.len() - keyed + keys.len();

    let claimers: Vec<_> = (0..6)
        .map(|i| {
            let store = Arc::clone(&store);
            let tenants = vec![t.clone()];
            tokio::spawn(async move {
                store
                    .claim(&tenants, &format!("node-{i}"), 8, LONG_LEASE_MS)
                    .await
            })
        })
        .collect();
    let mut claimed: Vec<ClaimedJob> = Vec::new();
    for c in claimers {
        claimed.extend(c.await.expect("claimer task").expect("claim"));
    }
    // Then one node claims what is left, batch after batch, while every
    // lease is still held.
    loop {
        let more = store
            .claim(std::slice::from_ref(&t), "node-x", 8, LONG_LEASE_MS)
            .await;
        let more = more.expect("claim");
        if more.is_empty() {
            break;
        }
        claimed.extend(more);
    }

    let ids: HashSet<_> = claimed.iter().map(|j| j.id).collect();
    assert_eq!(
        ids.len(),
        claimed.len(),
        "{backend:?}: a job was leased twice"
    );
    let mut held_keys = HashSet::new();
    for job in &claimed {
        if let Some(key) = &key_of[&job.run_id] {
            assert!(
                held_keys.insert(key.clone()),
                "{backend:?}: two leased jobs on {key}"
            );
        }
    }
    assert_eq!(held_keys, keys, "{backend:?}: every key got one job");
    assert_eq!(
        claimed.len(),
        claimable,
        "{backend:?}: every claimable job was claimed"
    );
}

#[tokio::test]
async fn released_claims_are_claimable_at_once_and_fence_their_old_holder() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let t = tenant(store, "acme").await;
        let aut = manual_automation(store, &t, "a").await;
        let run = start(store, &t, &aut, "manual", None).await;
        let tenants = [t.clone()];

        let old = store
            .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(old.len(), 1, "{backend:?}");
        // node-1 restarts: it gives back what it held, without waiting a lease out.
        let released = store.release_claims("node-1").await.expect("release");
        assert_eq!(released, 1, "{backend:?}");
        let new = store
            .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(
            new.len(),
            1,
            "{backend:?}: the released job is claimable at once"
        );
        assert_eq!(
            (new[0].run_id.clone(), new[0].attempt),
            (run, 2),
            "{backend:?}"
        );
        // The claim from before the restart can no longer record.
        let err = store
            .record(&old[0], finish(&old[0], RunStatus::Completed))
            .await
            .expect_err("record under a released claim");
        assert!(
            matches!(err, StoreError::LeaseLost(_)),
            "{backend:?}: {err}"
        );
        store
            .record(&new[0], finish(&new[0], RunStatus::Completed))
            .await
            .expect("record");
        db.cleanup().await;
    }
}

// ---------------------------------------------------------------------------
// 3. Leases: expiry, takeover, heartbeat
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_live_lease_keeps_other_nodes_away() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let t = tenant(&*store, "acme").await;
        let aut = manual_automation(&*store, &t, "a").await;
        start(&*store, &t, &aut, "manual", None).await;
        let tenants = [t.clone()];

        let held = store
            .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(held.len(), 1, "{backend:?}");
        let other = store
            .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert!(
            other.is_empty(),
            "{backend:?}: a leased job was claimed again"
        );
        let stats = store.queue_stats(&tenants).await.expect("stats");
        assert_eq!((stats.ready, stats.running), (0, 1), "{backend:?}");
        drop(store);
        db.cleanup().await;
    }
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_by_another_node() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let t = tenant(&*store, "acme").await;
        let aut = manual_automation(&*store, &t, "a").await;
        let run = start(&*store, &t, &aut, "manual", None).await;
        let tenants = [t.clone()];

        let first = store
            .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(first.len(), 1, "{backend:?}");
        assert_eq!(
            (first[0].run_id.clone(), first[0].attempt),
            (run.clone(), 1),
            "{backend:?}"
        );

        tokio::time::sleep(PAST_SHORT_LEASE).await;
        let second = store
            .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(second.len(), 1, "{backend:?}: the expired job is claimable");
        assert_eq!(second[0].id, first[0].id, "{backend:?}: the same job");
        assert_eq!(second[0].run_id, run, "{backend:?}");
        assert_eq!(
            second[0].attempt, 2,
            "{backend:?}: the takeover is the second attempt"
        );
        assert_ne!(
            second[0].claim_token, first[0].claim_token,
            "{backend:?}: a new token"
        );

        // The original node no longer holds anything to extend, and the new
        // holder's lease keeps a third node away.
        let extended = store
            .heartbeat("node-1", &[first[0].id], LONG_LEASE_MS)
            .await
            .expect("hb");
        assert_eq!(extended, 0, "{backend:?}: node-1 extended node-2's lease");
        let third = store
            .claim(&tenants, "node-3", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert!(third.is_empty(), "{backend:?}");
        drop(store);
        db.cleanup().await;
    }
}

#[tokio::test]
async fn a_heartbeat_keeps_a_lease_alive_past_its_first_expiry() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let t = tenant(&*store, "acme").await;
        let aut = manual_automation(&*store, &t, "a").await;
        start(&*store, &t, &aut, "manual", None).await;
        let tenants = [t.clone()];

        let held = store
            .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(held.len(), 1, "{backend:?}");
        // Another node cannot extend a lease it does not hold.
        let foreign = store
            .heartbeat("node-2", &[held[0].id], LONG_LEASE_MS)
            .await
            .expect("hb");
        assert_eq!(foreign, 0, "{backend:?}");
        let extended = store
            .heartbeat("node-1", &[held[0].id], LONG_LEASE_MS)
            .await
            .expect("hb");
        assert_eq!(extended, 1, "{backend:?}");

        tokio::time::sleep(PAST_SHORT_LEASE).await;
        let other = store
            .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert!(
            other.is_empty(),
            "{backend:?}: a heartbeated job was taken over"
        );
        store
            .record(&held[0], finish(&held[0], RunStatus::Completed))
            .await
            .expect("record");
        drop(store);
        db.cleanup().await;
    }
}

// ---------------------------------------------------------------------------
// 4. The claim token fences a stale worker
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_stale_worker_cannot_record_after_a_takeover() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        stale_worker(&db).await;
        db.cleanup().await;
    }
}

async fn stale_worker(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let run = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let stale = store
        .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(stale.len(), 1, "{backend:?}");
    let stale = &stale[0];
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let fresh = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(fresh.len(), 1, "{backend:?}");
    let fresh = &fresh[0];
    let before = store.run(&t, &run).await.expect("run").expect("run exists");

    // The paused worker wakes up and tries to finish the step: rejected.
    let stale_record = Record {
        subject_ticket_id: None,
        steps: vec![step(
            "0",
            tok_store::StepStatus::Completed,
            json!({ "by": "node-1" }),
        )],
        context: json!({ "n": 1, "by": "node-1" }),
        actions: 1,
        status: RunStatus::Running,
        error: None,
        next: NextJob::Step {
            path: "1".into(),
            delay_ms: 0,
        },
    };
    let err = store
        .record(stale, stale_record.clone())
        .await
        .expect_err("stale record");
    assert!(
        matches!(err, StoreError::LeaseLost(id) if id == stale.id),
        "{backend:?}: {err}"
    );

    // Nothing of it was written, and the new holder still holds the job.
    let after = store.run(&t, &run).await.expect("run").expect("run exists");
    assert!(after.steps.is_empty(), "{backend:?}: {:?}", after.steps);
    assert_eq!(after.context, before.context, "{backend:?}");
    assert_eq!(
        (after.run.status.as_str(), after.run.actions),
        ("running", 0),
        "{backend:?}"
    );
    let nobody = store
        .claim(&tenants, "node-3", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        nobody.is_empty(),
        "{backend:?}: the rejected record released the job"
    );

    // The new holder's record succeeds.
    let fresh_record = Record {
        subject_ticket_id: None,
        steps: vec![step(
            "0",
            tok_store::StepStatus::Completed,
            json!({ "by": "node-2" }),
        )],
        context: json!({ "n": 1, "by": "node-2" }),
        actions: 1,
        status: RunStatus::Completed,
        error: None,
        next: NextJob::Done,
    };
    store
        .record(fresh, fresh_record)
        .await
        .expect("the holder's record");
    let done = store.run(&t, &run).await.expect("run").expect("run exists");
    assert_eq!(done.run.status, "completed", "{backend:?}");
    assert_eq!(
        done.context,
        json!({ "n": 1, "by": "node-2" }),
        "{backend:?}"
    );
    assert_eq!(done.steps.len(), 1, "{backend:?}");
    assert_eq!(
        done.steps[0].output,
        Some(json!({ "by": "node-2" })),
        "{backend:?}"
    );

    // A stale record arriving after the job is gone is rejected as well.
    let err = store
        .record(stale, stale_record)
        .await
        .expect_err("stale record");
    assert!(
        matches!(err, StoreError::LeaseLost(_)),
        "{backend:?}: {err}"
    );
    let still = store.run(&t, &run).await.expect("run").expect("run exists");
    assert_eq!(
        (still.run.status.as_str(), still.steps.len()),
        ("completed", 1),
        "{backend:?}"
    );
}

// ---------------------------------------------------------------------------
// 5. The record transaction: all or nothing
// ---------------------------------------------------------------------------

#[tokio::test]
async fn record_step_writes_the_step_and_moves_the_job_on() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        record_step(&db).await;
        db.cleanup().await;
    }
}

async fn record_step(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let run = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let job = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(job.len(), 1, "{backend:?}");
    let job = &job[0];
    assert_eq!(
        (job.path.as_str(), job.attempt, job.actions),
        ("0", 1, 0),
        "{backend:?}"
    );
    assert_eq!(job.context, json!({ "n": 0 }), "{backend:?}");
    let started = store.run(&t, &run).await.expect("run").expect("run exists");
    assert_eq!(
        started.run.status, "running",
        "{backend:?}: a claim marks the run running"
    );
    assert!(started.run.started_at.is_some(), "{backend:?}");

    // A record under a token that is not the holder's changes nothing, whatever it asks.
    let forged = ClaimedJob {
        claim_token: tok_store::random_token(),
        ..job.clone()
    };
    for next in [
        NextJob::Step {
            path: "1".into(),
            delay_ms: 0,
        },
        NextJob::Retry {
            path: "0".into(),
            attempts: 1,
            delay_ms: 0,
        },
        NextJob::Done,
    ] {
        let record = Record {
            subject_ticket_id: None,
            steps: vec![step(
                "0",
                tok_store::StepStatus::Completed,
                json!({ "forged": true }),
            )],
            context: json!({ "forged": true }),
            actions: 9,
            status: RunStatus::Completed,
            error: Some("forged".into()),
            next: next.clone(),
        };
        let err = store
            .record(&forged, record)
            .await
            .expect_err("forged record");
        assert!(
            matches!(err, StoreError::LeaseLost(_)),
            "{backend:?} {next:?}: {err}"
        );
    }
    let unchanged = store.run(&t, &run).await.expect("run").expect("run exists");
    assert!(unchanged.steps.is_empty(), "{backend:?}");
    assert_eq!(unchanged.context, json!({ "n": 0 }), "{backend:?}");
    assert_eq!(unchanged.run.status, "running", "{backend:?}");
    assert_eq!(
        (unchanged.run.actions, unchanged.run.error.clone()),
        (0, None),
        "{backend:?}"
    );
    assert_eq!(unchanged.run.finished_at, None, "{backend:?}");
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.running),
        (0, 1),
        "{backend:?}: still leased"
    );

    // The holder records step 0 and moves the run to step 1, due now.
    let record = Record {
        subject_ticket_id: None,
        steps: vec![step(
            "0",
            tok_store::StepStatus::Completed,
            json!({ "a": 1 }),
        )],
        context: json!({ "n": 1, "st_0": { "a": 1 } }),
        actions: 1,
        status: RunStatus::Running,
        error: None,
        next: NextJob::Step {
            path: "1".into(),
            delay_ms: 0,
        },
    };
    store.record(job, record).await.expect("record");
    let detail = store.run(&t, &run).await.expect("run").expect("run exists");
    assert_eq!(detail.run.status, "running", "{backend:?}");
    assert_eq!(detail.run.actions, 1, "{backend:?}");
    assert_eq!(
        detail.context,
        json!({ "n": 1, "st_0": { "a": 1 } }),
        "{backend:?}"
    );
    assert_eq!(detail.steps.len(), 1, "{backend:?}");
    let row = &detail.steps[0];
    assert_eq!(
        (row.path.as_str(), row.step_id.as_str()),
        ("0", "st_0"),
        "{backend:?}"
    );
    assert_eq!(
        (row.status.as_str(), row.attempt),
        ("completed", 1),
        "{backend:?}"
    );
    assert_eq!(row.input, Some(json!({ "in": "0" })), "{backend:?}");
    assert_eq!(row.output, Some(json!({ "a": 1 })), "{backend:?}");
    assert_eq!(row.log, json!(["step 0"]), "{backend:?}");

    let next = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(
        next.len(),
        1,
        "{backend:?}: the job at its new path is claimable"
    );
    let next = &next[0];
    assert_eq!(
        (next.run_id.clone(), next.path.as_str()),
        (run.clone(), "1"),
        "{backend:?}"
    );
    assert_eq!(
        next.attempt, 1,
        "{backend:?}: a new step starts at attempt 1"
    );
    assert_eq!(
        (next.actions, next.context.clone()),
        (1, detail.context.clone()),
        "{backend:?}"
    );

    // A step due later (a `wait`) is not claimable before it is due.
    let record = Record {
        subject_ticket_id: None,
        steps: vec![step("1", tok_store::StepStatus::Completed, json!({}))],
        context: detail.context.clone(),
        actions: 2,
        status: RunStatus::Waiting,
        error: None,
        next: NextJob::Step {
            path: "2".into(),
            delay_ms: LONG_LEASE_MS,
        },
    };
    store.record(next, record).await.expect("record");
    let none = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        none.is_empty(),
        "{backend:?}: a job due in a minute was claimed"
    );
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.scheduled, stats.running),
        (0, 1, 0),
        "{backend:?}"
    );
    let waiting = store.run(&t, &run).await.expect("run").expect("run exists");
    assert_eq!(
        (waiting.run.status.as_str(), waiting.steps.len()),
        ("waiting", 2),
        "{backend:?}"
    );
}

#[tokio::test]
async fn record_retry_delays_the_same_step_and_counts_attempts() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        record_retry(&db).await;
        db.cleanup().await;
    }
}

async fn record_retry(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let later = start(store, &t, &aut, "manual", None).await;
    let soon = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let jobs = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(
        run_ids(&jobs),
        HashSet::from([later.clone(), soon.clone()]),
        "{backend:?}"
    );
    for job in &jobs {
        let delay_ms = if job.run_id == later {
            LONG_LEASE_MS
        } else {
            SHORT_LEASE_MS
        };
        let mut failed = step(&job.path, tok_store::StepStatus::Retrying, json!({}));
        failed.error = Some("service answered 503".into());
        let record = Record {
            subject_ticket_id: None,
            steps: vec![failed],
            context: job.context.clone(),
            actions: 1,
            status: RunStatus::Running,
            error: None,
            next: NextJob::Retry {
                path: job.path.clone(),
                attempts: job.attempt,
                delay_ms,
            },
        };
        store.record(job, record).await.expect("record");
    }
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(
        (stats.running, stats.ready + stats.scheduled),
        (0, 2),
        "{backend:?}"
    );

    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let retried = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(
        retried.len(),
        1,
        "{backend:?}: only the retry that is due: {retried:?}"
    );
    let retried = &retried[0];
    assert_eq!(retried.run_id, soon, "{backend:?}");
    assert_eq!(
        (retried.path.as_str(), retried.attempt),
        ("0", 2),
        "{backend:?}"
    );
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(
        (stats.scheduled, stats.running),
        (1, 1),
        "{backend:?}: `later` still waits"
    );

    let detail = store
        .run(&t, &later)
        .await
        .expect("run")
        .expect("run exists");
    assert_eq!(detail.steps.len(), 1, "{backend:?}");
    assert_eq!(detail.steps[0].status, "retrying", "{backend:?}");
    assert_eq!(
        detail.steps[0].error.as_deref(),
        Some("service answered 503"),
        "{backend:?}"
    );
}

#[tokio::test]
async fn record_done_finishes_the_run_and_removes_its_job() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let t = tenant(store, "acme").await;
        let aut = manual_automation(store, &t, "a").await;
        let ok = start(store, &t, &aut, "manual", None).await;
        let bad = start(store, &t, &aut, "manual", None).await;
        let tenants = [t.clone()];

        let jobs = store
            .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(jobs.len(), 2, "{backend:?}");
        for job in &jobs {
            let mut record = finish(job, RunStatus::Completed);
            if job.run_id == bad {
                record.status = RunStatus::Failed;
                record.error = Some("service answered 400".into());
                record.steps[0].status = tok_store::StepStatus::Failed;
            }
            store.record(job, record).await.expect("record");
        }

        let left = store
            .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert!(left.is_empty(), "{backend:?}: {left:?}");
        let stats = store.queue_stats(&tenants).await.expect("stats");
        assert_eq!(
            (stats.ready, stats.scheduled, stats.running),
            (0, 0, 0),
            "{backend:?}"
        );

        let ok = store.run(&t, &ok).await.expect("run").expect("run exists");
        assert_eq!(
            (ok.run.status.as_str(), ok.run.error.clone()),
            ("completed", None),
            "{backend:?}"
        );
        assert!(ok.run.finished_at.is_some(), "{backend:?}");
        let bad = store.run(&t, &bad).await.expect("run").expect("run exists");
        assert_eq!(bad.run.status, "failed", "{backend:?}");
        assert_eq!(
            bad.run.error.as_deref(),
            Some("service answered 400"),
            "{backend:?}"
        );
        assert!(bad.run.finished_at.is_some(), "{backend:?}");
        assert_eq!(bad.steps[0].status, "failed", "{backend:?}");
        db.cleanup().await;
    }
}

// ---------------------------------------------------------------------------
// 6. Dispatch: one run per (event, automation), only the given tenants
// ---------------------------------------------------------------------------

#[tokio::test]
async fn dispatching_an_event_again_creates_no_second_run() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        redispatch(&db).await;
        db.cleanup().await;
    }
}

async fn redispatch(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    let orders = webhook_automation(store, &t, "orders", &src).await;
    let audit = webhook_automation(store, &t, "audit", &src).await;
    let tenants = [t.clone()];

    let (event, _) = store
        .accept_event(&t, webhook_event(&src, "order-1"))
        .await
        .expect("accept");
    let taken = store
        .dispatch(&tenants, 10, &one_run_per_candidate)
        .await
        .expect("dispatch");
    assert_eq!(taken, 1, "{backend:?}");
    let first = all_runs(store, &t).await;
    let automations: HashSet<_> = first.iter().map(|r| r.automation_id.clone()).collect();
    assert_eq!(automations, HashSet::from([orders, audit]), "{backend:?}");
    assert!(first.iter().all(|r| r.event_id == event), "{backend:?}");
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!((stats.ready, stats.pending_events), (2, 0), "{backend:?}");

    // A crash after the runs were written but before the event's mark was
    // seen: the event is pending again and the dispatcher takes it again.
    let marked = raw_sql(
        db,
        &format!(
            "UPDATE event_inbox SET status = 'pending', dispatched_at = NULL WHERE id = '{event}'"
        ),
    )
    .await;
    assert_eq!(marked, 1, "{backend:?}");
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(stats.pending_events, 1, "{backend:?}");
    let taken = store
        .dispatch(&tenants, 10, &one_run_per_candidate)
        .await
        .expect("dispatch");
    assert_eq!(taken, 1, "{backend:?}");

    let second = all_runs(store, &t).await;
    let ids = |runs: &[RunSummary]| runs.iter().map(|r| r.id.clone()).collect::<HashSet<_>>();
    assert_eq!(
        ids(&second),
        ids(&first),
        "{backend:?}: the same two runs, no new ones"
    );
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.pending_events),
        (2, 0),
        "{backend:?}: no extra jobs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_dispatchers_create_one_run_per_event_and_automation() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        concurrent_dispatch(&db).await;
        db.cleanup().await;
    }
}

async fn concurrent_dispatch(db: &TestDb) {
    let backend = db.backend;
    let store: Arc<dyn Store> = db.store().await;
    let t = tenant(&*store, "acme").await;
    let src = source(&*store, &t, "eshop").await;
    webhook_automation(&*store, &t, "orders", &src).await;
    webhook_automation(&*store, &t, "audit", &src).await;
    let mut events = HashSet::new();
    for i in 0..40 {
        let (id, _) = store
            .accept_event(&t, webhook_event(&src, &format!("o{i}")))
            .await
            .unwrap();
        events.insert(id);
    }

    let dispatchers: Vec<_> = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            let tenants = vec![t.clone()];
            tokio::spawn(async move {
                let mut taken = 0;
                loop {
                    match store.dispatch(&tenants, 3, &one_run_per_candidate).await {
                        Ok(0) => return Ok(taken),
                        Ok(n) => taken += n,
                        Err(e) => return Err(e),
                    }
                }
            })
        })
        .collect();
    let mut taken = 0;
    for d in dispatchers {
        taken += d.await.expect("dispatcher task").expect("dispatch");
    }
    assert!(taken >= 40, "{backend:?}: only {taken} of 40 events taken");

    let runs = all_runs(&*store, &t).await;
    let pairs: HashSet<(EventId, AutomationId)> = runs
        .iter()
        .map(|r| (r.event_id.clone(), r.automation_id.clone()))
        .collect();
    assert_eq!(runs.len(), 80, "{backend:?}: two automations x 40 events");
    assert_eq!(
        pairs.len(),
        80,
        "{backend:?}: a duplicate (event, automation) run"
    );
    let seen: HashSet<EventId> = pairs.iter().map(|(e, _)| e.clone()).collect();
    assert_eq!(seen, events, "{backend:?}");
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!((stats.ready, stats.pending_events), (80, 0), "{backend:?}");
}

#[tokio::test]
async fn dispatch_takes_only_the_given_tenants_events() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let a = tenant(store, "a").await;
        let b = tenant(store, "b").await;
        let src_a = source(store, &a, "eshop").await;
        let src_b = source(store, &b, "eshop").await;
        webhook_automation(store, &a, "orders", &src_a).await;
        webhook_automation(store, &b, "orders", &src_b).await;
        store
            .accept_event(&a, webhook_event(&src_a, "same-key"))
            .await
            .expect("accept");
        store
            .accept_event(&b, webhook_event(&src_b, "same-key"))
            .await
            .expect("accept");

        let seen = std::sync::Mutex::new(Vec::new());
        let planner = |event: &PendingEvent, candidates: &[Candidate]| {
            seen.lock().unwrap().push(event.tenant_id.clone());
            one_run_per_candidate(event, candidates)
        };
        let taken = store
            .dispatch(std::slice::from_ref(&a), 10, &planner)
            .await
            .expect("dispatch");
        assert_eq!(taken, 1, "{backend:?}");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![a.clone()],
            "{backend:?}: planner saw other tenants"
        );
        assert_eq!(all_runs(store, &a).await.len(), 1, "{backend:?}");
        assert!(
            all_runs(store, &b).await.is_empty(),
            "{backend:?}: b's event was dispatched"
        );
        let b_stats = store
            .queue_stats(std::slice::from_ref(&b))
            .await
            .expect("stats");
        assert_eq!(
            (b_stats.pending_events, b_stats.ready),
            (1, 0),
            "{backend:?}"
        );

        let taken = store
            .dispatch(std::slice::from_ref(&b), 10, &planner)
            .await
            .expect("dispatch");
        assert_eq!(taken, 1, "{backend:?}");
        assert_eq!(all_runs(store, &b).await.len(), 1, "{backend:?}");
        assert_eq!(all_runs(store, &a).await.len(), 1, "{backend:?}");
        db.cleanup().await;
    }
}

#[tokio::test]
async fn an_event_no_automation_listens_to_is_dispatched_without_planning() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let t = tenant(store, "t").await;
        let quiet = source(store, &t, "quiet").await;
        let busy = source(store, &t, "busy").await;
        webhook_automation(store, &t, "orders", &busy).await;
        store
            .accept_event(&t, webhook_event(&quiet, "unheard"))
            .await
            .expect("accept");
        store
            .accept_event(&t, webhook_event(&busy, "heard"))
            .await
            .expect("accept");

        let planned = std::sync::Mutex::new(Vec::new());
        let planner = |event: &PendingEvent, candidates: &[Candidate]| {
            planned.lock().unwrap().push(event.source_id.clone());
            one_run_per_candidate(event, candidates)
        };
        let taken = store
            .dispatch(std::slice::from_ref(&t), 10, &planner)
            .await
            .expect("dispatch");
        assert_eq!(taken, 2, "{backend:?}: both events taken");
        assert_eq!(
            *planned.lock().unwrap(),
            vec![Some(busy.clone())],
            "{backend:?}: only the event with an automation is planned"
        );
        let stats = store
            .queue_stats(std::slice::from_ref(&t))
            .await
            .expect("stats");
        assert_eq!(
            stats.pending_events, 0,
            "{backend:?}: the unheard event stays pending"
        );
        assert_eq!(all_runs(store, &t).await.len(), 1, "{backend:?}");
        db.cleanup().await;
    }
}

#[tokio::test]
async fn a_crowding_tenants_events_wait_for_one_dispatch_of_the_others() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let mut tenants = Vec::new();
        for (name, events) in [("big", 10), ("b", 2), ("c", 2)] {
            let t = tenant(store, name).await;
            let src = source(store, &t, "eshop").await;
            webhook_automation(store, &t, "orders", &src).await;
            for i in 0..events {
                store
                    .accept_event(&t, webhook_event(&src, &format!("{name}-{i}")))
                    .await
                    .expect("accept");
            }
            tenants.push((t, src));
        }
        let ids: Vec<TenantId> = tenants.iter().map(|(t, _)| t.clone()).collect();
        let runs_of = |i: usize| all_runs(store, &tenants[i].0);

        // Round robin picks 8 of big's events and all 4 of the others':
        // big crowds the batch, so the others go first, alone.
        let first = store
            .dispatch_handing_off(&ids, 12, &one_run_per_candidate, None, Lane::Bulk)
            .await
            .expect("dispatch");
        assert_eq!((first.events(), first.left), (4, 8), "{backend:?}");
        assert_eq!(runs_of(0).await.len(), 0, "{backend:?}: big waited");
        assert_eq!(runs_of(1).await.len(), 2, "{backend:?}");
        assert_eq!(runs_of(2).await.len(), 2, "{backend:?}");

        // The next dispatch takes the batch in order, another tenant's new
        // event with it: big waits for one dispatch at most.
        store
            .accept_event(&tenants[1].0, webhook_event(&tenants[1].1, "b-late"))
            .await
            .expect("accept");
        let second = store
            .dispatch_handing_off(&ids, 12, &one_run_per_candidate, None, Lane::Bulk)
            .await
            .expect("dispatch");
        assert_eq!((second.events(), second.left), (11, 0), "{backend:?}");
        assert_eq!(runs_of(0).await.len(), 10, "{backend:?}");
        assert_eq!(runs_of(1).await.len(), 3, "{backend:?}");
        db.cleanup().await;
    }
}

#[tokio::test]
async fn a_full_dispatch_names_the_tenant_whose_backlog_filled_it() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let big = tenant(store, "big").await;
        let big_src = source(store, &big, "eshop").await;
        webhook_automation(store, &big, "orders", &big_src).await;
        for i in 0..10 {
            store
                .accept_event(&big, webhook_event(&big_src, &format!("big-{i}")))
                .await
                .expect("accept");
        }
        let small = tenant(store, "small").await;
        let small_src = source(store, &small, "eshop").await;
        webhook_automation(store, &small, "orders", &small_src).await;
        let both = [big.clone(), small.clone()];

        let first = store
            .dispatch_handing_off(&both, 4, &one_run_per_candidate, None, Lane::Bulk)
            .await
            .expect("dispatch");
        assert_eq!(first.events(), 4, "{backend:?}");
        assert_eq!(first.backlog.as_ref(), Some(&big), "{backend:?}");

        // The small tenant's new event is dispatched apart, urgently.
        store
            .accept_event(&small, webhook_event(&small_src, "small-0"))
            .await
            .expect("accept");
        let urgent = store
            .dispatch_handing_off(
                std::slice::from_ref(&small),
                4,
                &one_run_per_candidate,
                None,
                Lane::Urgent,
            )
            .await
            .expect("urgent dispatch");
        assert_eq!((urgent.events(), urgent.backlog), (1, None), "{backend:?}");
        assert_eq!(all_runs(store, &small).await.len(), 1, "{backend:?}");
        let stats = store.queue_stats(&both).await.expect("stats");
        assert_eq!(stats.pending_events, 6, "{backend:?}: big's backlog waits");

        // A batch that is not full leaves no backlog behind.
        let rest = store
            .dispatch_handing_off(&both, 10, &one_run_per_candidate, None, Lane::Bulk)
            .await
            .expect("dispatch");
        assert_eq!((rest.events(), rest.backlog), (6, None), "{backend:?}");
        assert_eq!(all_runs(store, &big).await.len(), 10, "{backend:?}");
        db.cleanup().await;
    }
}

#[tokio::test]
async fn a_dispatch_writes_the_steps_its_runs_already_ran() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let t = tenant(store, "acme").await;
        let src = source(store, &t, "eshop").await;
        webhook_automation(store, &t, "orders", &src).await;
        for key in ["done", "goes-on"] {
            store
                .accept_event(&t, webhook_event(&src, key))
                .await
                .expect("accept");
        }
        // The first event's run ran all of its (two) steps at dispatch; the
        // second's ran one and goes on at `1` in a worker.
        let planner = |event: &PendingEvent, candidates: &[Candidate]| {
            let mut plan = one_run_per_candidate(event, candidates);
            let done = event.payload["key"] == "done";
            for run in &mut plan.runs {
                run.steps = if done {
                    vec![
                        step("0", tok_store::StepStatus::Completed, json!({ "a": 1 })),
                        step("1", tok_store::StepStatus::Completed, json!({})),
                    ]
                } else {
                    vec![step(
                        "0",
                        tok_store::StepStatus::Completed,
                        json!({ "a": 1 }),
                    )]
                };
                run.actions = run.steps.len() as i32;
                run.first_path = (!done).then(|| "1".to_string());
            }
            plan
        };
        store
            .dispatch(std::slice::from_ref(&t), 10, &planner)
            .await
            .expect("dispatch");
        let runs = all_runs(store, &t).await;
        assert_eq!(runs.len(), 2, "{backend:?}");
        for run in &runs {
            let detail = store.run(&t, &run.id).await.unwrap().expect("run");
            let paths: Vec<&str> = detail.steps.iter().map(|s| s.path.as_str()).collect();
            assert!(run.started_at.is_some(), "{backend:?}: the run has started");
            match run.status.as_str() {
                "completed" => {
                    assert_eq!(paths, ["0", "1"], "{backend:?}");
                    assert_eq!(run.actions, 2, "{backend:?}");
                    assert!(run.finished_at.is_some(), "{backend:?}");
                }
                "running" => {
                    assert_eq!(paths, ["0"], "{backend:?}");
                    assert_eq!(run.actions, 1, "{backend:?}");
                }
                other => panic!("{backend:?}: a run {other}"),
            }
        }
        let mut statuses: Vec<&str> = runs.iter().map(|r| r.status.as_str()).collect();
        statuses.sort();
        assert_eq!(statuses, ["completed", "running"], "{backend:?}");
        // One job, for the run that goes on, at its next step.
        let jobs = store
            .claim(std::slice::from_ref(&t), "node", 10, 30_000)
            .await
            .expect("claim");
        assert_eq!(jobs.len(), 1, "{backend:?}");
        assert_eq!(
            (jobs[0].path.as_str(), jobs[0].actions),
            ("1", 1),
            "{backend:?}"
        );
        db.cleanup().await;
    }
}

#[tokio::test]
async fn a_dispatch_hands_the_jobs_it_was_offered_to_its_node_already_claimed() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let t = tenant(store, "acme").await;
        let src = source(store, &t, "eshop").await;
        webhook_automation(store, &t, "orders", &src).await;
        for key in ["a", "b", "c"] {
            store
                .accept_event(&t, webhook_event(&src, key))
                .await
                .expect("accept");
        }

        // The dispatching node has two free slots.
        let mut offered = Vec::new();
        let mut take = |tenant: &TenantId| {
            offered.push(tenant.clone());
            offered.len() <= 2
        };
        let handoff = tok_store::Handoff {
            node: "node-1",
            lease_ms: LONG_LEASE_MS,
            take: &mut take,
        };
        let dispatched = store
            .dispatch_handing_off(
                std::slice::from_ref(&t),
                10,
                &one_run_per_candidate,
                Some(handoff),
                Lane::Bulk,
            )
            .await
            .expect("dispatch");
        assert_eq!(dispatched.events(), 3, "{backend:?}");
        assert_eq!(
            offered,
            vec![t.clone(); 3],
            "{backend:?}: asked once per new run"
        );
        let handed = dispatched.claimed;
        assert_eq!(handed.len(), 2, "{backend:?}: the two runs it took");
        for job in &handed {
            assert_eq!((job.attempt, job.path.as_str()), (1, "0"), "{backend:?}");
            let detail = store
                .run(&t, &job.run_id)
                .await
                .expect("run")
                .expect("exists");
            assert_eq!(detail.run.status, "running", "{backend:?}");
            assert!(detail.run.started_at.is_some(), "{backend:?}");
            assert_eq!(job.context, detail.context, "{backend:?}");
        }

        // Another node finds only the run the dispatch did not take.
        let others = store
            .claim(std::slice::from_ref(&t), "node-2", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(others.len(), 1, "{backend:?}: the handed jobs are leased");
        assert!(
            !run_ids(&handed).contains(&others[0].run_id),
            "{backend:?}: a handed job was claimed again"
        );

        // The handed claim's token is the lease: its record is accepted.
        store
            .record(&handed[0], finish(&handed[0], RunStatus::Completed))
            .await
            .expect("record with the handed claim");
        let detail = store
            .run(&t, &handed[0].run_id)
            .await
            .expect("run")
            .expect("exists");
        assert_eq!(detail.run.status, "completed", "{backend:?}");
        db.cleanup().await;
    }
}

#[tokio::test]
async fn a_manual_start_with_a_repeated_key_returns_the_first_run() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let t = tenant(store, "acme").await;
        let aut = manual_automation(store, &t, "a").await;
        let other = manual_automation(store, &t, "b").await;
        let keyed = |aut: &AutomationId| NewRun {
            subject_ticket_id: None,
            idempotency_key: Some("order-5001".into()),
            ..new_run(aut, "manual", None)
        };

        let first = store
            .start_run(&t, manual_event(&aut), keyed(&aut))
            .await
            .unwrap();
        let again = store
            .start_run(&t, manual_event(&aut), keyed(&aut))
            .await
            .unwrap();
        assert_eq!(again, first, "{backend:?}");
        let elsewhere = store
            .start_run(&t, manual_event(&other), keyed(&other))
            .await
            .unwrap();
        assert_ne!(elsewhere, first, "{backend:?}: the key is per automation");
        assert_eq!(all_runs(store, &t).await.len(), 2, "{backend:?}");
        let stats = store.queue_stats(std::slice::from_ref(&t)).await.unwrap();
        assert_eq!(stats.ready, 2, "{backend:?}: one job per run");

        // A run of an empty tree completes at once and leaves no job.
        let empty = NewRun {
            subject_ticket_id: None,
            first_path: None,
            ..new_run(&aut, "manual", None)
        };
        let empty = store
            .start_run(&t, manual_event(&aut), empty)
            .await
            .unwrap();
        let detail = store.run(&t, &empty).await.unwrap().expect("run exists");
        assert_eq!(detail.run.status, "completed", "{backend:?}");
        assert!(detail.run.finished_at.is_some(), "{backend:?}");
        let stats = store.queue_stats(std::slice::from_ref(&t)).await.unwrap();
        assert_eq!(stats.ready, 2, "{backend:?}");
        db.cleanup().await;
    }
}

// ---------------------------------------------------------------------------
// 7. Inbox idempotency
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_repeated_idempotency_key_finds_the_first_event_within_a_day() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        inbox_idempotency(&db).await;
        db.cleanup().await;
    }
}

async fn inbox_idempotency(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let eshop = source(store, &t, "eshop").await;
    let converter = source(store, &t, "converter").await;

    let (first, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k1"))
        .await
        .unwrap();
    assert!(!accepted.duplicate, "{backend:?}");
    let (again, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k1"))
        .await
        .unwrap();
    assert_eq!(
        (again.clone(), accepted.duplicate),
        (first.clone(), true),
        "{backend:?}"
    );

    let (other_key, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k2"))
        .await
        .unwrap();
    assert!(
        !accepted.duplicate && other_key != first,
        "{backend:?}: a new key is a new event"
    );
    let (other_source, accepted) = store
        .accept_event(&t, webhook_event(&converter, "k1"))
        .await
        .unwrap();
    assert!(
        !accepted.duplicate,
        "{backend:?}: the key belongs to its source"
    );
    assert!(
        other_source != first && other_source != other_key,
        "{backend:?}"
    );
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!(
        stats.pending_events, 3,
        "{backend:?}: the duplicate wrote no row"
    );

    // A day and an hour later, the same key is a new event (and is itself
    // deduplicated from then on).
    let day_and_hour = 25 * 60 * 60 * 1000;
    let sql = format!(
        "UPDATE event_inbox SET received_at = received_at - {day_and_hour} WHERE id = '{first}'"
    );
    assert_eq!(raw_sql(db, &sql).await, 1, "{backend:?}");
    let (late, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k1"))
        .await
        .unwrap();
    assert!(!accepted.duplicate, "{backend:?}: outside the window");
    assert_ne!(late, first, "{backend:?}");
    let (late_again, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k1"))
        .await
        .unwrap();
    assert_eq!(
        (late_again, accepted.duplicate),
        (late, true),
        "{backend:?}"
    );
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!(
        stats.pending_events, 4,
        "{backend:?}: the old event is kept"
    );
}

#[tokio::test]
async fn webhooks_sent_together_are_each_new_or_a_duplicate_once() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        inbox_batch_with_duplicates(&db).await;
        db.cleanup().await;
    }
}

/// Webhooks sent at once share group commits, where new keys, keys already
/// taken, and one new key sent ten times in the same moment mix.
async fn inbox_batch_with_duplicates(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let eshop = source(&*store, &t, "eshop").await;
    let mut first = std::collections::HashMap::new();
    for key in ["old-1", "old-2", "old-3"] {
        let (id, _) = store
            .accept_event(&t, webhook_event(&eshop, key))
            .await
            .unwrap();
        first.insert(key.to_string(), id);
    }

    let keys: Vec<String> = (0..30)
        .map(|i| match i % 3 {
            0 => format!("old-{}", i % 9 / 3 + 1),
            1 => format!("new-{i}"),
            _ => "repeated".to_string(),
        })
        .collect();
    let sent: Vec<_> = keys
        .iter()
        .map(|key| {
            let (store, t, event) = (store.clone(), t.clone(), webhook_event(&eshop, key));
            tokio::spawn(async move { store.accept_event(&t, event).await })
        })
        .collect();
    let mut new_by_key: std::collections::HashMap<String, Vec<_>> = Default::default();
    let mut ids_by_key: std::collections::HashMap<String, std::collections::HashSet<_>> =
        Default::default();
    for (key, sent) in keys.iter().zip(sent) {
        let (id, accepted) = sent.await.unwrap().expect("accepted");
        if !accepted.duplicate {
            new_by_key.entry(key.clone()).or_default().push(id.clone());
        }
        ids_by_key.entry(key.clone()).or_default().insert(id);
    }
    for (key, ids) in &ids_by_key {
        assert_eq!(
            ids.len(),
            1,
            "{backend:?}: every webhook with {key} names one event"
        );
        match first.get(key) {
            Some(id) => {
                assert!(ids.contains(id), "{backend:?}: {key} finds its first event");
                assert!(
                    !new_by_key.contains_key(key),
                    "{backend:?}: {key} was taken before"
                );
            }
            None => assert_eq!(
                new_by_key.get(key).map(Vec::len),
                Some(1),
                "{backend:?}: {key} is new exactly once"
            ),
        }
    }
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!(
        stats.pending_events,
        3 + 10 + 1,
        "{backend:?}: one row per key"
    );
}

// ---------------------------------------------------------------------------
// 8. Tenant scoping
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_tenant_never_sees_another_tenants_rows() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        tenant_scoping(&db).await;
        db.cleanup().await;
    }
}

async fn tenant_scoping(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let src_a = source(store, &a, "eshop").await;
    let src_b = source(store, &b, "eshop").await;
    let aut_a = manual_automation(store, &a, "orders").await;
    let aut_b = manual_automation(store, &b, "orders").await;
    let mut runs_a = HashSet::new();
    let mut runs_b = HashSet::new();
    for _ in 0..3 {
        runs_a.insert(start(store, &a, &aut_a, "manual", None).await);
        runs_b.insert(start(store, &b, &aut_b, "manual", None).await);
    }
    let run_b = runs_b.iter().next().unwrap().clone();

    // Reads by id.
    assert!(
        store.run(&a, &run_b).await.unwrap().is_none(),
        "{backend:?}: run"
    );
    assert!(
        store.run(&b, &run_b).await.unwrap().is_some(),
        "{backend:?}: run"
    );
    assert!(
        store.automation(&a, &aut_b).await.unwrap().is_none(),
        "{backend:?}: automation"
    );
    assert!(
        store
            .automation_version(&a, &aut_b, 1)
            .await
            .unwrap()
            .is_none(),
        "{backend:?}"
    );
    assert!(
        store.source(&a, &src_b).await.unwrap().is_none(),
        "{backend:?}: source"
    );
    assert!(
        store.source(&a, &src_a).await.unwrap().is_some(),
        "{backend:?}: source"
    );

    // Listings.
    let listed: HashSet<RunId> = all_runs(store, &a)
        .await
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, runs_a, "{backend:?}: runs");
    let filter = RunFilter {
        automation_id: Some(aut_b.to_string()),
        ..RunFilter::default()
    };
    let page = store.runs(&a, &filter, 50, None).await.unwrap();
    assert!(
        page.items.is_empty(),
        "{backend:?}: runs filtered by b's automation"
    );
    let automations: Vec<_> = store
        .automations(&a)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(automations, vec![aut_a.clone()], "{backend:?}: automations");
    let sources: Vec<_> = store
        .sources(&a)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(sources, vec![src_a.clone()], "{backend:?}: sources");

    // Writes aimed at the other tenant's rows do nothing.
    let paused = store
        .set_automation_status(&a, &aut_b, tok_store::AutomationStatus::Paused)
        .await
        .unwrap();
    assert!(!paused, "{backend:?}: a paused b's automation");
    let saved = store
        .save_version(&a, &aut_b, version("stolen", "manual", None))
        .await;
    assert!(
        matches!(saved, Err(StoreError::NotFound(_))),
        "{backend:?}: {saved:?}"
    );
    let b_aut = store
        .automation(&b, &aut_b)
        .await
        .unwrap()
        .expect("b's automation");
    assert_eq!(
        (b_aut.version, b_aut.name.as_str()),
        (1, "orders"),
        "{backend:?}"
    );
    assert_eq!(
        b_aut.status,
        tok_store::AutomationStatus::Active,
        "{backend:?}"
    );

    // The queue: a claim for a serves a's jobs only, however large the batch.
    let jobs = store
        .claim(std::slice::from_ref(&a), "node-1", 100, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(run_ids(&jobs), runs_a, "{backend:?}: claim");
    assert!(jobs.iter().all(|j| j.tenant_id == a), "{backend:?}");
    let more = store
        .claim(std::slice::from_ref(&a), "node-1", 100, LONG_LEASE_MS)
        .await
        .unwrap();
    assert!(more.is_empty(), "{backend:?}: {more:?}");
    let b_stats = store.queue_stats(std::slice::from_ref(&b)).await.unwrap();
    assert_eq!(
        (b_stats.ready, b_stats.running),
        (3, 0),
        "{backend:?}: b's jobs untouched"
    );
    for run in all_runs(store, &b).await {
        assert_eq!(
            run.status, "queued",
            "{backend:?}: a claim for a touched b's run"
        );
    }
    let jobs_b = store
        .claim(std::slice::from_ref(&b), "node-1", 100, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(run_ids(&jobs_b), runs_b, "{backend:?}");
}

// ---------------------------------------------------------------------------
// 9. The runs listing
// ---------------------------------------------------------------------------

#[tokio::test]
async fn runs_are_listed_newest_first_with_filters_and_cursor_pages() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        runs_listing(&db).await;
        db.cleanup().await;
    }
}

async fn runs_listing(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let x = manual_automation(store, &t, "x").await;
    let y = manual_automation(store, &t, "y").await;
    // r1..r5, oldest first: (automation, trigger). Run ids order by creation
    // time to the millisecond, so the runs are created a few ms apart.
    let plan = [
        (&x, "manual"),
        (&x, "webhook"),
        (&x, "manual"),
        (&y, "webhook"),
        (&y, "manual"),
    ];
    let mut r = Vec::new();
    for (aut, trigger) in plan {
        r.push(start(store, &t, aut, trigger, None).await);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    // r2 and r4 complete, r5 fails, r1 and r3 stay running.
    let jobs = store
        .claim(std::slice::from_ref(&t), "node-1", 10, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 5, "{backend:?}");
    for job in &jobs {
        let status = if job.run_id == r[1] || job.run_id == r[3] {
            RunStatus::Completed
        } else if job.run_id == r[4] {
            RunStatus::Failed
        } else {
            continue;
        };
        store.record(job, finish(job, status)).await.unwrap();
    }

    let tenant = &t;
    let list = |filter: RunFilter| async move {
        let page = store.runs(tenant, &filter, 50, None).await.unwrap();
        assert!(
            page.next_cursor.is_none(),
            "{backend:?}: one page holds them all"
        );
        page.items.into_iter().map(|s| s.id).collect::<Vec<_>>()
    };
    let status = |s: &str| RunFilter {
        status: Some(s.into()),
        ..RunFilter::default()
    };
    let newest_first = |idx: &[usize]| idx.iter().map(|&i| r[i].clone()).collect::<Vec<_>>();
    assert_eq!(
        list(RunFilter::default()).await,
        newest_first(&[4, 3, 2, 1, 0]),
        "{backend:?}"
    );
    assert_eq!(
        list(status("completed")).await,
        newest_first(&[3, 1]),
        "{backend:?}"
    );
    assert_eq!(
        list(status("failed")).await,
        newest_first(&[4]),
        "{backend:?}"
    );
    assert_eq!(
        list(status("running")).await,
        newest_first(&[2, 0]),
        "{backend:?}"
    );
    assert_eq!(
        list(status("queued")).await,
        newest_first(&[]),
        "{backend:?}"
    );
    let by_aut = RunFilter {
        automation_id: Some(y.to_string()),
        ..RunFilter::default()
    };
    assert_eq!(list(by_aut).await, newest_first(&[4, 3]), "{backend:?}");
    let by_trigger = RunFilter {
        trigger_type: Some("webhook".into()),
        ..RunFilter::default()
    };
    assert_eq!(list(by_trigger).await, newest_first(&[3, 1]), "{backend:?}");
    let combined = RunFilter {
        status: Some("running".into()),
        automation_id: Some(x.to_string()),
        trigger_type: Some("manual".into()),
    };
    assert_eq!(list(combined).await, newest_first(&[2, 0]), "{backend:?}");

    // Pages of 2 over 5 runs: 2, 2, 1, the last without a cursor.
    let pages = pages_of(store, &t, &RunFilter::default(), 2).await;
    let sizes: Vec<usize> = pages.iter().map(|(items, _)| items.len()).collect();
    assert_eq!(sizes, vec![2, 2, 1], "{backend:?}");
    let cursors: Vec<bool> = pages.iter().map(|(_, more)| *more).collect();
    assert_eq!(cursors, vec![true, true, false], "{backend:?}");
    let walked: Vec<RunId> = pages.into_iter().flat_map(|(items, _)| items).collect();
    assert_eq!(
        walked,
        newest_first(&[4, 3, 2, 1, 0]),
        "{backend:?}: no duplicates, no gaps"
    );

    // A limit equal to the count: one page, no cursor. And pages under a filter.
    let pages = pages_of(store, &t, &RunFilter::default(), 5).await;
    assert_eq!(pages.len(), 1, "{backend:?}");
    assert!(!pages[0].1, "{backend:?}");
    let by_x = RunFilter {
        automation_id: Some(x.to_string()),
        ..RunFilter::default()
    };
    let pages = pages_of(store, &t, &by_x, 2).await;
    let walked: Vec<RunId> = pages.into_iter().flat_map(|(items, _)| items).collect();
    assert_eq!(walked, newest_first(&[2, 1, 0]), "{backend:?}");
}

/// Every page of a listing, following `next_cursor`: (ids, had a cursor).
async fn pages_of(
    store: &dyn Store,
    tenant: &TenantId,
    filter: &RunFilter,
    limit: u32,
) -> Vec<(Vec<RunId>, bool)> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .runs(tenant, filter, limit, cursor.as_deref())
            .await
            .unwrap();
        let ids = page.items.into_iter().map(|s| s.id).collect();
        pages.push((ids, page.next_cursor.is_some()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return pages,
        }
        assert!(pages.len() <= 10, "the cursor never ends");
    }
}

// ---------------------------------------------------------------------------
// 10. Migrations
// ---------------------------------------------------------------------------

#[tokio::test]
async fn migrating_again_is_harmless_and_keeps_the_data() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let t = tenant(&*store, "acme").await;
        let aut = manual_automation(&*store, &t, "a").await;
        let run = start(&*store, &t, &aut, "manual", None).await;

        store
            .migrate()
            .await
            .expect("second migrate on the same store");
        let other = tok_store::connect(&db.url, 2).await.expect("connect");
        other.migrate().await.expect("migrate from a second store");

        assert_eq!(
            other.tenant(&t).await.unwrap().map(|x| x.name),
            Some("acme".into())
        );
        assert!(other.run(&t, &run).await.unwrap().is_some(), "{backend:?}");
        let jobs = other
            .claim(std::slice::from_ref(&t), "n", 10, LONG_LEASE_MS)
            .await
            .unwrap();
        assert_eq!(run_ids(&jobs), HashSet::from([run]), "{backend:?}");
        drop((store, other));
        db.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_on_a_fresh_postgres_database_all_succeed() {
    // PostgreSQL only: it is the backend many processes share, and the one
    // whose migrations are serialized between processes.
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    for round in 0..3 {
        let db = TestDb::create(Backend::Postgres).await;
        let mut stores = Vec::new();
        for _ in 0..4 {
            stores.push(Arc::new(
                PgStore::connect(&db.url, 2).await.expect("connect"),
            ));
        }
        let tasks: Vec<_> = stores
            .iter()
            .map(|s| {
                let s = Arc::clone(s);
                tokio::spawn(async move { s.migrate().await })
            })
            .collect();
        for task in tasks {
            task.await
                .expect("migrate task")
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let store = &*stores[0];
        let t = tenant(store, "acme").await;
        let aut = manual_automation(store, &t, "a").await;
        start(store, &t, &aut, "manual", None).await;
        let jobs = stores[3]
            .claim(&[t], "n", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(jobs.len(), 1, "round {round}");
        drop(stores);
        db.cleanup().await;
    }
}

#[tokio::test]
async fn dispatch_takes_a_small_tenants_event_before_a_large_backlog() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let big = tenant(store, "big").await;
        let small = tenant(store, "small").await;
        let src_big = source(store, &big, "eshop").await;
        let src_small = source(store, &small, "eshop").await;
        webhook_automation(store, &big, "orders", &src_big).await;
        webhook_automation(store, &small, "orders", &src_small).await;
        for n in 0..300 {
            store
                .accept_event(&big, webhook_event(&src_big, &format!("big-{n}")))
                .await
                .expect("accept");
        }
        // The small tenant's event arrives after the whole backlog.
        store
            .accept_event(&small, webhook_event(&src_small, "small-0"))
            .await
            .expect("accept");

        let seen = std::sync::Mutex::new(Vec::new());
        let planner = |event: &PendingEvent, candidates: &[Candidate]| {
            seen.lock().unwrap().push(event.tenant_id.clone());
            one_run_per_candidate(event, candidates)
        };
        let tenants = [big.clone(), small.clone()];
        let taken = store
            .dispatch(&tenants, 8, &planner)
            .await
            .expect("dispatch");
        // The large tenant crowds the batch (7 of its 8 events), so the
        // small tenant's event is dispatched first, on its own.
        assert_eq!(taken, 1, "{backend:?}");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![small.clone()],
            "{backend:?}: the first dispatch did not take the small tenant's event alone"
        );
        assert_eq!(all_runs(store, &small).await.len(), 1, "{backend:?}");
        db.cleanup().await;
    }
}

#[tokio::test]
async fn a_continued_job_stays_leased_unless_its_run_was_paused() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let store = &*store;
        let t = tenant(store, "acme").await;
        let automation = manual_automation(store, &t, "steps").await;
        let tenants = [t.clone()];
        let mut runs = Vec::new();
        for _ in 0..2 {
            runs.push(start(store, &t, &automation, "manual", None).await);
        }
        let jobs = store
            .claim(&tenants, "node-a", 2, 30_000)
            .await
            .expect("claim");
        assert_eq!(jobs.len(), 2, "{backend:?}");
        let continued_record = |job: &ClaimedJob, token: &str| Record {
            next: NextJob::Continue {
                path: "1".into(),
                token: token.into(),
                lease_ms: 30_000,
            },
            status: RunStatus::Running,
            ..finish(job, RunStatus::Running)
        };
        // One run goes on under a new token, held by the same worker.
        let (going, paused) = (&jobs[0], &jobs[1]);
        let kept = store
            .record_and_continue(going, continued_record(going, "token-2"))
            .await
            .expect("record");
        assert!(kept, "{backend:?}");
        assert!(
            store
                .claim(&tenants, "node-b", 10, 30_000)
                .await
                .expect("claim")
                .is_empty(),
            "{backend:?}: a continued job was claimable by another node"
        );
        // The other run is paused while its step runs: it is released and held.
        store.pause_run(&t, &paused.run_id).await.expect("pause");
        let kept = store
            .record_and_continue(paused, continued_record(paused, "token-3"))
            .await
            .expect("record");
        assert!(!kept, "{backend:?}: a paused run kept its lease");
        let run = store.run(&t, &paused.run_id).await.unwrap().unwrap();
        assert_eq!(run.run.status, "paused", "{backend:?}");
        assert!(
            store
                .claim(&tenants, "node-b", 10, 30_000)
                .await
                .expect("claim")
                .is_empty(),
            "{backend:?}: a job was claimable while one is leased and one held"
        );
        // The continued job records under its new token; the old one is fenced off.
        let next = ClaimedJob {
            path: "1".into(),
            claim_token: "token-2".into(),
            ..going.clone()
        };
        assert!(matches!(
            store
                .record(going, finish(going, RunStatus::Completed))
                .await,
            Err(StoreError::LeaseLost(_))
        ));
        store
            .record(&next, finish(&next, RunStatus::Completed))
            .await
            .expect("record");
        assert_eq!(
            store
                .run(&t, &going.run_id)
                .await
                .unwrap()
                .unwrap()
                .run
                .status,
            "completed"
        );
        store.resume_run(&t, &paused.run_id).await.expect("resume");
        let again = store
            .claim(&tenants, "node-b", 10, 30_000)
            .await
            .expect("claim");
        assert_eq!(again.len(), 1, "{backend:?}");
        assert_eq!(
            (again[0].run_id.clone(), again[0].path.as_str()),
            (paused.run_id.clone(), "1")
        );
        db.cleanup().await;
    }
}

// ---------------------------------------------------------------------------
// 11. Rows a database refuses
// ---------------------------------------------------------------------------

/// Makes the database refuse, from now on, rows of `table` whose `column`
/// is `'poison'`: what any database may refuse in one row (here a check on
/// PostgreSQL, a trigger on SQLite), beyond what the store checks itself.
async fn refuse_poison(db: &TestDb, table: &str, column: &str) {
    let sql = match db.backend {
        Backend::Postgres => format!(
            "ALTER TABLE {table} ADD CONSTRAINT {table}_refuses_poison
             CHECK ({column} IS DISTINCT FROM 'poison')"
        ),
        Backend::Sqlite => format!(
            "CREATE TRIGGER {table}_refuses_poison BEFORE INSERT ON {table}
             WHEN NEW.{column} = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
        ),
    };
    raw_sql(db, &sql).await;
}

/// Sends `events` at once (so that they share group commits) and returns
/// each answer, in order.
async fn accept_together(
    store: &Arc<dyn Store>,
    events: Vec<(TenantId, NewEvent)>,
) -> Vec<tok_store::Result<(EventId, tok_store::Accepted)>> {
    let sent: Vec<_> = events
        .into_iter()
        .map(|(t, event)| {
            let store = store.clone();
            tokio::spawn(async move { store.accept_event(&t, event).await })
        })
        .collect();
    let mut answers = Vec::new();
    for sent in sent {
        answers.push(sent.await.expect("accept task"));
    }
    answers
}

/// Three tenants' webhooks, twenty each, with `bad` among them (in the
/// middle of the second tenant's); returns the tenants and the events.
async fn many_webhooks(
    store: &dyn Store,
    bad: impl Fn(&SourceId) -> NewEvent,
) -> (Vec<TenantId>, Vec<(TenantId, NewEvent)>) {
    let mut tenants = Vec::new();
    let mut events = Vec::new();
    for name in ["acme", "globex", "initech"] {
        let t = tenant(store, name).await;
        let src = source(store, &t, "shop").await;
        for i in 0..20 {
            if name == "globex" && i == 10 {
                events.push((t.clone(), bad(&src)));
            }
            events.push((t.clone(), webhook_event(&src, &format!("{name}-{i}"))));
        }
        tenants.push(t);
    }
    (tenants, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_with_nul_in_its_json_is_refused_and_its_batch_mates_are_accepted() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let (tenants, events) = many_webhooks(&*store, |src| NewEvent {
            payload: json!({ "customer": { "name": "Ann\u{0}" } }),
            ..webhook_event(src, "with-nul")
        })
        .await;
        let answers = accept_together(&store, events).await;
        let mut refused = Vec::new();
        for answer in answers {
            match answer {
                Ok((_, accepted)) => assert!(!accepted.duplicate, "{backend:?}"),
                Err(e) => refused.push(e),
            }
        }
        assert_eq!(refused.len(), 1, "{backend:?}: {refused:?}");
        match &refused[0] {
            StoreError::Refused(message) => {
                assert!(
                    message.contains("U+0000") && message.contains("/customer/name"),
                    "{backend:?}: the refusal says what and where: {message}"
                );
            }
            other => panic!("{backend:?}: refused as {other:?}"),
        }
        let stats = store.queue_stats(&tenants).await.expect("stats");
        assert_eq!(
            stats.pending_events, 60,
            "{backend:?}: every other webhook is in the inbox, and not the refused one"
        );
        // A manual start with such input is refused alike.
        let aut = manual_automation(&*store, &tenants[0], "by hand").await;
        let err = store
            .start_run(
                &tenants[0],
                NewEvent {
                    payload: json!({ "note": "\u{0}" }),
                    ..manual_event(&aut)
                },
                new_run(&aut, "manual", None),
            )
            .await
            .expect_err("a start with U+0000 in its input");
        assert!(
            matches!(&err, StoreError::Refused(m) if m.contains("/note")),
            "{backend:?}: {err:?}"
        );
        db.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_the_database_refuses_fails_alone() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        refuse_poison(&db, "event_inbox", "idempotency_key").await;
        let (tenants, events) = many_webhooks(&*store, |src| webhook_event(src, "poison")).await;
        let answers = accept_together(&store, events).await;
        let refused: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
        assert_eq!(refused.len(), 1, "{backend:?}: {refused:?}");
        assert!(
            matches!(refused[0], Err(StoreError::Refused(m)) if m.contains("refused to store this event")),
            "{backend:?}: {:?}",
            refused[0]
        );
        let stats = store.queue_stats(&tenants).await.expect("stats");
        assert_eq!(stats.pending_events, 60, "{backend:?}");
        db.cleanup().await;
    }
}

/// Three tenants' runs, eight each, all claimed: the jobs, and the tenants.
async fn many_claimed(store: &dyn Store) -> (Vec<TenantId>, Vec<ClaimedJob>) {
    let mut tenants = Vec::new();
    for name in ["acme", "globex", "initech"] {
        let t = tenant(store, name).await;
        let aut = manual_automation(store, &t, "a").await;
        for _ in 0..8 {
            start(store, &t, &aut, "manual", None).await;
        }
        tenants.push(t);
    }
    let jobs = store
        .claim(&tenants, "node-1", 100, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 24);
    (tenants, jobs)
}

/// Step `0` done, the run going on at `1`; its step's error is `error`.
fn step_done(job: &ClaimedJob, error: Option<&str>) -> Record {
    let mut done = step("0", tok_store::StepStatus::Completed, json!({ "ok": true }));
    done.error = error.map(str::to_owned);
    Record {
        subject_ticket_id: None,
        steps: vec![done],
        context: job.context.clone(),
        actions: job.actions + 1,
        status: RunStatus::Running,
        error: None,
        next: NextJob::Step {
            path: "1".into(),
            delay_ms: 0,
        },
    }
}

/// Records every job at once (so that they share group commits), `bad`'s
/// with `bad_record`; returns each answer, in order.
async fn record_together(
    store: &Arc<dyn Store>,
    jobs: &[ClaimedJob],
    bad: usize,
    bad_record: Record,
) -> Vec<tok_store::Result<()>> {
    let mut bad_record = Some(bad_record);
    let sent: Vec<_> = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| {
            let record = match i == bad {
                true => bad_record.take().expect("one bad record"),
                false => step_done(job, None),
            };
            let (store, job) = (store.clone(), job.clone());
            tokio::spawn(async move { store.record(&job, record).await })
        })
        .collect();
    let mut answers = Vec::new();
    for sent in sent {
        answers.push(sent.await.expect("record task"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_with_nul_in_its_text_is_stored_with_replacement_characters() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let (tenants, jobs) = many_claimed(&*store).await;
        let bad = 12;
        let mut nul = step_done(&jobs[bad], Some("bad\u{0}byte"));
        nul.steps[0].log = vec!["log\u{0}line".into()];
        nul.steps[0].output = Some(json!({ "body": "a\u{0}b" }));
        let answers = record_together(&store, &jobs, bad, nul).await;
        for answer in &answers {
            assert!(answer.is_ok(), "{backend:?}: {answer:?}");
        }
        let job = &jobs[bad];
        let run = store
            .run(&job.tenant_id, &job.run_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(run.steps.len(), 1, "{backend:?}");
        let written = &run.steps[0];
        assert_eq!(
            written.error.as_deref(),
            Some("bad\u{FFFD}byte"),
            "{backend:?}"
        );
        assert_eq!(written.log, json!(["log\u{FFFD}line"]), "{backend:?}");
        assert_eq!(
            written.output,
            Some(json!({ "body": "a\u{FFFD}b" })),
            "{backend:?}"
        );
        // Every run moved on to its next step, the bad one too.
        let next = store
            .claim(&tenants, "node-1", 100, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(next.len(), 24, "{backend:?}");
        assert!(next.iter().all(|j| j.path == "1"), "{backend:?}");
        db.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_the_database_refuses_fails_its_run_and_nothing_else() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        refuse_poison(&db, "run_steps", "error").await;
        let (tenants, jobs) = many_claimed(&*store).await;
        let bad = 12;
        let poison = step_done(&jobs[bad], Some("poison"));
        let answers = record_together(&store, &jobs, bad, poison).await;
        for answer in &answers {
            assert!(answer.is_ok(), "{backend:?}: {answer:?}");
        }
        let job = &jobs[bad];
        let run = store
            .run(&job.tenant_id, &job.run_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(run.run.status, "failed", "{backend:?}");
        let error = run.run.error.clone().unwrap_or_default();
        assert!(
            error.contains("could not be stored") && error.contains("st_0"),
            "{backend:?}: the run says why it failed: {error}"
        );
        assert_eq!(
            run.context, job.context,
            "{backend:?}: as it was at the claim"
        );
        assert_eq!(run.steps.len(), 1, "{backend:?}");
        assert_eq!(
            (run.steps[0].path.as_str(), run.steps[0].status.as_str()),
            ("0", "failed"),
            "{backend:?}"
        );
        // The others moved on; the refused one's job is gone, not run again.
        let next = store
            .claim(&tenants, "node-1", 100, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(next.len(), 23, "{backend:?}");
        assert!(next.iter().all(|j| j.path == "1" && j.run_id != job.run_id));
        // A retry runs the refused step again.
        store
            .retry_run(&job.tenant_id, &job.run_id)
            .await
            .expect("retry");
        let again = store
            .claim(&tenants, "node-1", 100, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(
            again
                .iter()
                .map(|j| (j.run_id.clone(), j.path.as_str()))
                .collect::<Vec<_>>(),
            vec![(job.run_id.clone(), "0")],
            "{backend:?}"
        );
        db.cleanup().await;
    }
}
