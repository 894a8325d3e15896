//! Conformance of waits for signals (README.md, "Waiting for a signal"): a
//! job recorded at a `wait_for_event` parks until a signal on its key whose
//! payload satisfies its `where` resumes it, or its timeout passes; a
//! signal that resumes no wait is buffered for a wait that starts within
//! the lookback window.
//!
//! Every test runs on SQLite and on PostgreSQL (`<test>::sqlite`,
//! `<test>::postgres`), each on a fresh database, and drives the store only
//! through its traits: what a worker claims (the job and its `resume`),
//! what a sender is answered, and what a run's detail shows. Retention
//! deletes a signal once past both its lookback and the idempotency window;
//! a starting wait reads the buffer a page at a time. Waits for a
//! timeout sleep well past it; nothing asserts on how long anything took.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tok_core::definition::Filter;
use tok_core::ids::{AutomationId, RunId, TenantId};
use tok_store::testing::{TestDb, backends, catch_unwind};
use tok_store::{
    Backend, Cause, ClaimedJob, NewEvent, NewRun, NewSignal, NewVersion, NextJob, Record, Resume,
    RunStatus, SignalSent, SignalWait, StepRecord, StepStatus, Store, Ticket, TicketWrite, WaitRow,
};

tok_store::backend_tests!(run;
    a_signal_resumes_a_waiting_run_with_its_payload,
    a_resumed_run_may_wait_again,
    a_where_decides_which_waits_a_signal_resumes,
    a_signal_sent_before_the_wait_is_taken_by_one_wait_only,
    waits_recorded_together_share_no_buffered_signal,
    a_wait_takes_only_a_buffered_signal_its_where_accepts,
    a_wait_without_lookback_ignores_the_buffer,
    a_buffered_signal_expires_after_its_lookback,
    a_wait_finds_the_oldest_match_past_a_page_of_others,
    retention_deletes_signals_past_their_lookback_and_the_idempotency_window,
    a_timed_out_wait_resumes_as_timed_out_and_a_later_signal_is_buffered,
    a_repeated_idempotency_key_answers_the_first_signal,
    another_tenants_signal_resumes_nothing,
    a_cancelled_runs_wait_is_gone_and_a_later_signal_is_buffered,
    a_cancelled_run_keeps_the_buffered_signal_it_took,
    a_paused_run_keeps_its_signal_for_when_it_is_resumed,
    a_signal_sent_in_a_record_transaction_resumes_waits_when_it_commits,
    signal_and_wait_on_distinct_keys_released_together_always_meet,
    signals_and_waits_on_one_key_released_together_pair_up_by_their_where,
    signals_and_waits_on_one_key_without_where_leave_no_wait_beside_a_buffered_signal,
    a_signal_resumes_only_the_waits_about_its_subject,
    a_starting_wait_takes_only_a_buffered_signal_about_its_subject,
    two_signals_at_once_on_two_keys_of_one_wait_resume_it_once_and_the_other_waits_for_it,
    a_ticket_write_resumes_the_condition_waits_its_new_state_satisfies,
    a_condition_that_holds_as_the_wait_parks_resumes_it_at_once,
);

// ---------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------

/// A lease that never expires during a test.
const LONG_LEASE_MS: i64 = 60_000;
/// The lookback of signals in tests that do not test it.
const LOOKBACK_MS: i64 = 600_000;
/// Pairs of (wait, signal) released together per round, and rounds.
const PAIRS: usize = 40;
const ROUNDS: usize = 5;

/// A migrated store with a tenant and a manual automation.
struct Fixture {
    backend: Backend,
    store: Arc<dyn Store>,
    tenant: TenantId,
    automation: AutomationId,
}

async fn run(backend: Backend, test: impl AsyncFnOnce(&Fixture)) {
    if !backends().contains(&backend) {
        return;
    }
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let tenant = new_tenant(&*store, "acme").await;
    let automation = automation(&*store, &tenant).await;
    let fx = Fixture {
        backend,
        store,
        tenant,
        automation,
    };
    let outcome = catch_unwind(test(&fx)).await;
    drop(fx);
    db.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn new_tenant(store: &dyn Store, name: &str) -> TenantId {
    let key = tok_store::hash_secret(&tok_store::random_token());
    store
        .create_tenant(name, &key)
        .await
        .expect("create tenant")
        .id
}

async fn automation(store: &dyn Store, tenant: &TenantId) -> AutomationId {
    let definition = json!({
        "name": "waits",
        "trigger": { "kind": "manual" },
        "steps": [{ "id": "st_wait", "type": "wait_for_event", "config": { "key": "k" } }],
    });
    let version = NewVersion {
        name: "waits".into(),
        hash: tok_store::hash_secret(&definition.to_string()),
        definition,
        trigger_kind: "manual".into(),
        trigger_key: None,
    };
    store
        .create_automation(tenant, version)
        .await
        .expect("create automation")
        .id
}

/// A wait on `key` for any payload, taking from the buffer, with no timeout.
fn on_key(key: &str) -> SignalWait {
    SignalWait {
        key: key.into(),
        subject: None,
        filter: None,
        lookback: true,
        due_at: None,
        ..Default::default()
    }
}

/// A wait on `key` about the ticket `subject`.
fn on_key_about(key: &str, subject: &str) -> SignalWait {
    SignalWait {
        subject: Some(subject.into()),
        ..on_key(key)
    }
}

/// A signal on `key` about the ticket `subject`.
fn signal_about(key: &str, subject: &str, payload: Value) -> NewSignal {
    NewSignal {
        subject: Some(subject.into()),
        ..signal(key, payload)
    }
}

/// A wait on `key` whose `where` is `field eq value`.
fn on_key_where(key: &str, field: &str, value: Value) -> SignalWait {
    let filter: Filter = serde_json::from_value(json!({
        "match": "all",
        "rules": [{ "field": field, "operator": "eq", "value": value }],
    }))
    .expect("a filter");
    SignalWait {
        filter: Some(filter),
        ..on_key(key)
    }
}

fn signal(key: &str, payload: Value) -> NewSignal {
    NewSignal {
        key: key.into(),
        subject: None,
        payload,
        idempotency_key: None,
        lookback_ms: LOOKBACK_MS,
        actor: None,
    }
}

fn step_record(job: &ClaimedJob, status: StepStatus) -> StepRecord {
    StepRecord {
        path: job.path.clone(),
        step_id: "st_wait".into(),
        kind: "wait_for_event".into(),
        attempt: job.attempt,
        status,
        input: None,
        output: None,
        error: None,
        log: Vec::new(),
        started_at: 1,
        finished_at: 2,
    }
}

/// The record of a job that reached a `wait_for_event` step.
fn waiting(job: &ClaimedJob, wait: SignalWait) -> Record {
    Record {
        subject_ticket_id: None,
        steps: vec![step_record(job, StepStatus::Waiting)],
        context: job.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        actions: job.actions + 1,
        status: RunStatus::Waiting,
        error: None,
        next: NextJob::Wait {
            path: job.path.clone(),
            wait,
        },
    }
}

/// The record that ends a run.
fn finished(job: &ClaimedJob) -> Record {
    Record {
        subject_ticket_id: None,
        steps: vec![step_record(job, StepStatus::Completed)],
        context: job.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        actions: job.actions + 1,
        status: RunStatus::Completed,
        error: None,
        next: NextJob::Done,
    }
}

fn resumed_by(sent: &SignalSent, payload: Value) -> Option<Resume> {
    Some(Resume::Signal {
        signal_id: sent.signal_id.clone(),
        payload,
        actor: None,
        subject: sent.subject.clone(),
        key: Some(sent.key.clone()),
    })
}

impl Fixture {
    /// Starts `n` runs and claims their first jobs.
    async fn claimed_runs(&self, n: usize) -> Vec<ClaimedJob> {
        self.claimed_runs_of(&self.tenant, &self.automation, n)
            .await
    }

    async fn claimed_runs_of(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
        n: usize,
    ) -> Vec<ClaimedJob> {
        let mut ids = HashSet::new();
        for _ in 0..n {
            let run = NewRun {
                id: RunId::generate(),
                automation_id: automation.clone(),
                version: 1,
                trigger_type: "manual".into(),
                context: json!({}),
                depth: 0,
                queue_key: None,
                priority: 0,
                first_path: Some("0".into()),
                idempotency_key: None,
                subject_ticket_id: None,
                steps: Vec::new(),
                actions: 0,
                refused: None,
                skipped: None,
                hold: None,
                start_by: None,
                cancels: Vec::new(),
                cancelled: None,
            };
            let event = NewEvent {
                source_kind: "manual".into(),
                idempotency_key: tok_store::random_token(),
                payload: json!({}),
                params: json!({}),
                target_automation_id: Some(automation.clone()),
                ..NewEvent::default()
            };
            let id = self
                .store
                .start_run(tenant, event, run)
                .await
                .expect("start a run");
            ids.insert(id);
        }
        let jobs = self.claim_all_of(tenant).await;
        assert_eq!(
            jobs.iter()
                .map(|j| j.run_id.clone())
                .collect::<HashSet<_>>(),
            ids,
            "{:?}: the new runs' jobs are claimed",
            self.backend
        );
        assert!(
            jobs.iter().all(|j| j.resume.is_none()),
            "{:?}",
            self.backend
        );
        jobs
    }

    /// A run whose job was recorded at a wait.
    async fn waiting_run(&self, wait: SignalWait) -> ClaimedJob {
        let job = self.claimed_runs(1).await.remove(0);
        self.store
            .record(&job, waiting(&job, wait))
            .await
            .expect("record a wait");
        job
    }

    /// Claims every ready job of the fixture's tenant.
    async fn claim_all(&self) -> Vec<ClaimedJob> {
        self.claim_all_of(&self.tenant).await
    }

    async fn claim_all_of(&self, tenant: &TenantId) -> Vec<ClaimedJob> {
        let mut all = Vec::new();
        loop {
            let jobs = self
                .store
                .claim(std::slice::from_ref(tenant), "node-1", 500, LONG_LEASE_MS)
                .await
                .expect("claim");
            if jobs.is_empty() {
                return all;
            }
            all.extend(jobs);
        }
    }

    /// Claims the one ready job, asserting it is `run`'s.
    async fn claim_only(&self, run: &RunId) -> ClaimedJob {
        let mut jobs = self.claim_all().await;
        assert_eq!(
            jobs.iter().map(|j| &j.run_id).collect::<Vec<_>>(),
            vec![run],
            "{:?}: exactly this run's job is ready",
            self.backend
        );
        jobs.remove(0)
    }

    async fn assert_nothing_ready(&self, why: &str) {
        let jobs = self.claim_all().await;
        assert!(
            jobs.is_empty(),
            "{:?}: {why}, yet these were claimed: {jobs:?}",
            self.backend
        );
    }

    async fn send(&self, signal: NewSignal) -> SignalSent {
        self.store
            .send_signal(&self.tenant, signal)
            .await
            .expect("send a signal")
    }

    /// The run's status and what it waits for.
    async fn waits(&self, run: &RunId) -> (String, Vec<WaitRow>) {
        let detail = self
            .store
            .run(&self.tenant, run)
            .await
            .expect("read the run")
            .expect("the run exists");
        (detail.run.status, detail.waits)
    }

    async fn finish(&self, job: &ClaimedJob) {
        self.store
            .record(job, finished(job))
            .await
            .expect("record the end");
    }
}

fn wait_row(key: &str, due_at: Option<i64>) -> WaitRow {
    WaitRow {
        kind: "event".into(),
        subject: None,
        path: "0".into(),
        key: key.into(),
        due_at,
    }
}

// ---------------------------------------------------------------------------
// One wait, one signal
// ---------------------------------------------------------------------------

async fn a_signal_resumes_a_waiting_run_with_its_payload(fx: &Fixture) {
    let b = fx.backend;
    let job = fx.waiting_run(on_key("order-1")).await;
    assert_eq!(
        fx.waits(&job.run_id).await,
        ("waiting".into(), vec![wait_row("order-1", None)]),
        "{b:?}: a waiting run shows what it waits for"
    );
    fx.assert_nothing_ready("a parked job with no timeout is never due")
        .await;

    let payload = json!({ "status": "paid", "amount": 12 });
    let sent = fx.send(signal("order-1", payload.clone())).await;
    assert_eq!(sent.resumed, vec![job.run_id.clone()], "{b:?}");
    assert!(
        !sent.buffered && !sent.duplicate && sent.signal_id.starts_with("sig_"),
        "{b:?}: {sent:?}"
    );
    assert_eq!(
        fx.waits(&job.run_id).await.1,
        Vec::new(),
        "{b:?}: the wait is gone"
    );

    let resumed = fx.claim_only(&job.run_id).await;
    assert_eq!(resumed.path, "0", "{b:?}: the job is at its wait step");
    assert_eq!(resumed.resume, resumed_by(&sent, payload), "{b:?}");

    // Moving on clears the resume: the next step is no resume.
    fx.store
        .record(
            &resumed,
            Record {
                next: NextJob::Step {
                    path: "1".into(),
                    delay_ms: 0,
                },
                status: RunStatus::Running,
                ..finished(&resumed)
            },
        )
        .await
        .expect("record the wait step");
    let next = fx.claim_only(&job.run_id).await;
    assert_eq!(
        (next.path.as_str(), next.resume.clone()),
        ("1", None),
        "{b:?}"
    );
    fx.finish(&next).await;

    let again = fx.send(signal("order-1", json!({}))).await;
    assert_eq!(
        (again.resumed.len(), again.buffered),
        (0, true),
        "{b:?}: a finished run is resumed no more"
    );
}

async fn a_resumed_run_may_wait_again(fx: &Fixture) {
    let b = fx.backend;
    let job = fx.waiting_run(on_key("first")).await;
    fx.send(signal("first", json!({ "n": 1 }))).await;
    let resumed = fx.claim_only(&job.run_id).await;
    let due_at = tok_store::now_ms() + LONG_LEASE_MS;
    fx.store
        .record(
            &resumed,
            waiting(
                &resumed,
                SignalWait {
                    due_at: Some(due_at),
                    ..on_key("second")
                },
            ),
        )
        .await
        .expect("record a second wait");
    assert_eq!(
        fx.waits(&job.run_id).await,
        ("waiting".into(), vec![wait_row("second", Some(due_at))]),
        "{b:?}: the new wait replaced the old"
    );
    let first = fx.send(signal("first", json!({}))).await;
    assert!(first.resumed.is_empty(), "{b:?}: the first key is done");
    let second = fx.send(signal("second", json!({ "n": 2 }))).await;
    assert_eq!(second.resumed, vec![job.run_id.clone()], "{b:?}");
    let again = fx.claim_only(&job.run_id).await;
    assert_eq!(
        again.resume,
        resumed_by(&second, json!({ "n": 2 })),
        "{b:?}"
    );
}

async fn a_where_decides_which_waits_a_signal_resumes(fx: &Fixture) {
    let b = fx.backend;
    let paid = fx
        .waiting_run(on_key_where("order-7", "status", json!("paid")))
        .await;
    let shipped = fx
        .waiting_run(on_key_where("order-7", "status", json!("shipped")))
        .await;

    let sent = fx
        .send(signal("order-7", json!({ "status": "shipped" })))
        .await;
    assert_eq!(sent.resumed, vec![shipped.run_id.clone()], "{b:?}");
    assert_eq!(
        fx.waits(&paid.run_id).await.1.len(),
        1,
        "{b:?}: the other wait still waits"
    );
    let resumed = fx.claim_only(&shipped.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&sent, json!({ "status": "shipped" })),
        "{b:?}"
    );

    let refunded = fx
        .send(signal("order-7", json!({ "status": "refunded" })))
        .await;
    assert_eq!(
        (refunded.resumed.len(), refunded.buffered),
        (0, true),
        "{b:?}: a payload no `where` accepts resumes nothing and is buffered"
    );
    let missing = fx.send(signal("order-7", json!({ "other": 1 }))).await;
    assert!(
        missing.resumed.is_empty(),
        "{b:?}: a missing field is no match"
    );
    fx.assert_nothing_ready("the `paid` wait saw no paid signal")
        .await;
}

async fn a_signal_sent_before_the_wait_is_taken_by_one_wait_only(fx: &Fixture) {
    let b = fx.backend;
    let early = fx.send(signal("invoice-3", json!({ "early": true }))).await;
    assert_eq!(
        (early.resumed.len(), early.buffered),
        (0, true),
        "{b:?}: nothing waits yet"
    );

    let first = fx.waiting_run(on_key("invoice-3")).await;
    assert_eq!(
        fx.waits(&first.run_id).await.1,
        Vec::new(),
        "{b:?}: a wait that took a buffered signal does not park"
    );
    let resumed = fx.claim_only(&first.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&early, json!({ "early": true })),
        "{b:?}"
    );

    let second = fx.waiting_run(on_key("invoice-3")).await;
    assert_eq!(
        fx.waits(&second.run_id).await.1,
        vec![wait_row("invoice-3", None)],
        "{b:?}: the buffered signal went to the first wait alone"
    );
    fx.assert_nothing_ready("the second wait parked").await;
}

async fn waits_recorded_together_share_no_buffered_signal(fx: &Fixture) {
    let b = fx.backend;
    let early = fx.send(signal("k", json!({}))).await;
    let jobs = fx.claimed_runs(2).await;
    // Recorded at once, so the two records may share a group commit.
    let (one, two) = tokio::join!(
        fx.store.record(&jobs[0], waiting(&jobs[0], on_key("k"))),
        fx.store.record(&jobs[1], waiting(&jobs[1], on_key("k"))),
    );
    one.and(two).expect("record both waits");
    let resumed = fx.claim_all().await;
    assert_eq!(resumed.len(), 1, "{b:?}: one wait took the signal");
    assert_eq!(resumed[0].resume, resumed_by(&early, json!({})), "{b:?}");
    let parked = jobs
        .iter()
        .find(|j| j.run_id != resumed[0].run_id)
        .expect("the other run");
    assert_eq!(fx.waits(&parked.run_id).await.1.len(), 1, "{b:?}");
}

async fn a_wait_takes_only_a_buffered_signal_its_where_accepts(fx: &Fixture) {
    let b = fx.backend;
    let one = fx.send(signal("k", json!({ "n": 1 }))).await;
    let two = fx.send(signal("k", json!({ "n": 2 }))).await;
    let three = fx.waiting_run(on_key_where("k", "n", json!(3))).await;
    assert_eq!(fx.waits(&three.run_id).await.1.len(), 1, "{b:?}: parked");

    let wants_two = fx.waiting_run(on_key_where("k", "n", json!(2))).await;
    let job = fx.claim_only(&wants_two.run_id).await;
    assert_eq!(job.resume, resumed_by(&two, json!({ "n": 2 })), "{b:?}");

    let any = fx.waiting_run(on_key("k")).await;
    let job = fx.claim_only(&any.run_id).await;
    assert_eq!(
        job.resume,
        resumed_by(&one, json!({ "n": 1 })),
        "{b:?}: the oldest buffered signal left"
    );
}

async fn a_wait_without_lookback_ignores_the_buffer(fx: &Fixture) {
    let b = fx.backend;
    fx.send(signal("k", json!({ "old": true }))).await;
    let job = fx
        .waiting_run(SignalWait {
            lookback: false,
            ..on_key("k")
        })
        .await;
    assert_eq!(fx.waits(&job.run_id).await.1.len(), 1, "{b:?}: parked");
    fx.assert_nothing_ready("the wait looked at no buffered signal")
        .await;
    let fresh = fx.send(signal("k", json!({ "old": false }))).await;
    assert_eq!(fresh.resumed, vec![job.run_id.clone()], "{b:?}");
    let resumed = fx.claim_only(&job.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&fresh, json!({ "old": false })),
        "{b:?}"
    );
}

async fn a_buffered_signal_expires_after_its_lookback(fx: &Fixture) {
    let b = fx.backend;
    fx.send(NewSignal {
        lookback_ms: 200,
        ..signal("k", json!({}))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let job = fx.waiting_run(on_key("k")).await;
    assert_eq!(
        fx.waits(&job.run_id).await.1.len(),
        1,
        "{b:?}: the expired signal is not taken"
    );
    fx.assert_nothing_ready("the only signal expired").await;
}

async fn a_timed_out_wait_resumes_as_timed_out_and_a_later_signal_is_buffered(fx: &Fixture) {
    let b = fx.backend;
    let due_at = tok_store::now_ms() + 300;
    let job = fx
        .waiting_run(SignalWait {
            due_at: Some(due_at),
            ..on_key("k")
        })
        .await;
    assert_eq!(
        fx.waits(&job.run_id).await.1,
        vec![wait_row("k", Some(due_at))],
        "{b:?}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let timed_out = fx.claim_only(&job.run_id).await;
    assert_eq!(timed_out.resume, Some(Resume::TimedOut), "{b:?}");

    let late = fx.send(signal("k", json!({ "late": true }))).await;
    assert_eq!(
        (late.resumed.len(), late.buffered),
        (0, true),
        "{b:?}: the timeout won"
    );
    fx.finish(&timed_out).await;
    assert_eq!(
        fx.waits(&job.run_id).await,
        ("completed".into(), Vec::new()),
        "{b:?}"
    );

    let next = fx.waiting_run(on_key("k")).await;
    let resumed = fx.claim_only(&next.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&late, json!({ "late": true })),
        "{b:?}: the late signal was buffered"
    );
}

async fn a_repeated_idempotency_key_answers_the_first_signal(fx: &Fixture) {
    let b = fx.backend;
    let first_run = fx.waiting_run(on_key("k")).await;
    let keyed = NewSignal {
        idempotency_key: Some("delivery-1".into()),
        ..signal("k", json!({ "try": 1 }))
    };
    let first = fx.send(keyed.clone()).await;
    assert_eq!(
        (first.resumed.clone(), first.duplicate),
        (vec![first_run.run_id.clone()], false),
        "{b:?}"
    );
    let resumed = fx.claim_only(&first_run.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&first, json!({ "try": 1 })),
        "{b:?}"
    );

    let second_run = fx.waiting_run(on_key("k")).await;
    let repeat = fx
        .send(NewSignal {
            payload: json!({ "try": 2 }),
            ..keyed.clone()
        })
        .await;
    assert_eq!(
        repeat,
        SignalSent {
            duplicate: true,
            ..first.clone()
        },
        "{b:?}: the first answer again"
    );
    assert_eq!(
        fx.waits(&second_run.run_id).await.1.len(),
        1,
        "{b:?}: the repeat resumed nothing"
    );
    fx.assert_nothing_ready("the repeat resumed nothing").await;

    // A buffered signal's repeat is answered as buffered, and buffers nothing more.
    let buffered = NewSignal {
        idempotency_key: Some("delivery-2".into()),
        ..signal("other", json!({}))
    };
    let once = fx.send(buffered.clone()).await;
    let twice = fx.send(buffered).await;
    assert!(once.buffered && !once.duplicate, "{b:?}");
    assert_eq!(
        twice,
        SignalSent {
            duplicate: true,
            ..once.clone()
        },
        "{b:?}"
    );
    let taker = fx.waiting_run(on_key("other")).await;
    fx.claim_only(&taker.run_id).await;
    let late = fx.waiting_run(on_key("other")).await;
    assert_eq!(
        fx.waits(&late.run_id).await.1.len(),
        1,
        "{b:?}: one signal was buffered, not two"
    );
}

async fn another_tenants_signal_resumes_nothing(fx: &Fixture) {
    let b = fx.backend;
    let job = fx.waiting_run(on_key("shared-key")).await;
    let other = new_tenant(&*fx.store, "other").await;
    let sent = fx
        .store
        .send_signal(&other, signal("shared-key", json!({})))
        .await
        .expect("send as the other tenant");
    assert_eq!(
        (sent.resumed.len(), sent.buffered),
        (0, true),
        "{b:?}: {sent:?}"
    );
    assert_eq!(
        fx.waits(&job.run_id).await.1.len(),
        1,
        "{b:?}: still waiting"
    );
    fx.assert_nothing_ready("another tenant's signal resumed nothing")
        .await;

    // Nor does this tenant's new wait take the other's buffered signal.
    let late = fx.waiting_run(on_key("shared-key")).await;
    assert_eq!(fx.waits(&late.run_id).await.1.len(), 1, "{b:?}: parked");
    // While the other tenant's own wait does.
    let theirs = automation(&*fx.store, &other).await;
    let job = fx.claimed_runs_of(&other, &theirs, 1).await.remove(0);
    fx.store
        .record(&job, waiting(&job, on_key("shared-key")))
        .await
        .expect("record the other tenant's wait");
    let resumed = fx.claim_all_of(&other).await;
    assert_eq!(resumed.len(), 1, "{b:?}");
    assert_eq!(resumed[0].resume, resumed_by(&sent, json!({})), "{b:?}");
}

async fn a_cancelled_runs_wait_is_gone_and_a_later_signal_is_buffered(fx: &Fixture) {
    let b = fx.backend;
    let job = fx.waiting_run(on_key("k")).await;
    let cancelled = fx
        .store
        .cancel_run(&fx.tenant, &job.run_id)
        .await
        .expect("cancel");
    assert_eq!(cancelled.status, "cancelled", "{b:?}");
    assert_eq!(
        fx.waits(&job.run_id).await,
        ("cancelled".into(), Vec::new()),
        "{b:?}"
    );
    let sent = fx.send(signal("k", json!({}))).await;
    assert_eq!((sent.resumed.len(), sent.buffered), (0, true), "{b:?}");
    fx.assert_nothing_ready("a cancelled run has no job").await;
}

async fn a_cancelled_run_keeps_the_buffered_signal_it_took(fx: &Fixture) {
    let b = fx.backend;
    fx.send(signal("k", json!({}))).await;
    let job = fx.waiting_run(on_key("k")).await;
    fx.store
        .cancel_run(&fx.tenant, &job.run_id)
        .await
        .expect("cancel before the resumed job ran");
    fx.assert_nothing_ready("the cancelled run's job is gone")
        .await;
    let next = fx.waiting_run(on_key("k")).await;
    assert_eq!(
        fx.waits(&next.run_id).await.1.len(),
        1,
        "{b:?}: the signal was delivered once, to the run that was cancelled"
    );
}

async fn a_paused_run_keeps_its_signal_for_when_it_is_resumed(fx: &Fixture) {
    let b = fx.backend;
    let job = fx.waiting_run(on_key("k")).await;
    fx.store
        .pause_run(&fx.tenant, &job.run_id)
        .await
        .expect("pause");
    let sent = fx.send(signal("k", json!({ "x": 1 }))).await;
    assert_eq!(
        sent.resumed,
        vec![job.run_id.clone()],
        "{b:?}: a paused run's wait is resumed"
    );
    fx.assert_nothing_ready("a paused run's job is held").await;
    let run = fx
        .store
        .resume_run(&fx.tenant, &job.run_id)
        .await
        .expect("resume");
    assert_eq!(run.status, "queued", "{b:?}: its job is ready");
    let resumed = fx.claim_only(&job.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&sent, json!({ "x": 1 })),
        "{b:?}"
    );
}

async fn a_signal_sent_in_a_record_transaction_resumes_waits_when_it_commits(fx: &Fixture) {
    let b = fx.backend;
    let waiter = fx.waiting_run(on_key("k")).await;
    let emitter = fx.claimed_runs(1).await.remove(0);

    // Rolled back: nothing happened.
    let mut tx = fx.store.begin_record(&emitter).await.expect("begin");
    let dropped = tx.send_signal(signal("k", json!({ "n": 0 }))).await;
    assert_eq!(
        dropped.expect("send in the record").resumed,
        vec![waiter.run_id.clone()],
        "{b:?}"
    );
    drop(tx);
    assert_eq!(
        fx.waits(&waiter.run_id).await.1.len(),
        1,
        "{b:?}: a rolled back send resumed nothing"
    );

    let mut tx = fx.store.begin_record(&emitter).await.expect("begin");
    let sent = tx
        .send_signal(signal("k", json!({ "n": 1 })))
        .await
        .expect("send in the record");
    tx.commit(finished(&emitter)).await.expect("commit");
    assert_eq!(sent.resumed, vec![waiter.run_id.clone()], "{b:?}");
    let resumed = fx.claim_only(&waiter.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&sent, json!({ "n": 1 })),
        "{b:?}"
    );

    // Neither rolled back send was buffered.
    let late = fx.waiting_run(on_key("k")).await;
    assert_eq!(fx.waits(&late.run_id).await.1.len(), 1, "{b:?}: parked");
}

// ---------------------------------------------------------------------------
// Concurrency: signal and wait released together
// ---------------------------------------------------------------------------

/// Records each job's wait and sends each signal at once, every one from
/// its own task, released together by a barrier; returns the answers.
async fn race(
    fx: &Fixture,
    waits: Vec<(ClaimedJob, SignalWait)>,
    signals: Vec<NewSignal>,
) -> Vec<SignalSent> {
    let barrier = Arc::new(tokio::sync::Barrier::new(waits.len() + signals.len()));
    let mut recorded = Vec::new();
    for (job, wait) in waits {
        let (store, barrier) = (fx.store.clone(), barrier.clone());
        recorded.push(tokio::spawn(async move {
            barrier.wait().await;
            store.record(&job, waiting(&job, wait)).await
        }));
    }
    let mut sent = Vec::new();
    for signal in signals {
        let (store, barrier, tenant) = (fx.store.clone(), barrier.clone(), fx.tenant.clone());
        sent.push(tokio::spawn(async move {
            barrier.wait().await;
            store.send_signal(&tenant, signal).await
        }));
    }
    for task in recorded {
        task.await.expect("a wait task").expect("record a wait");
    }
    let mut answers = Vec::new();
    for task in sent {
        answers.push(task.await.expect("a signal task").expect("send a signal"));
    }
    answers
}

/// Each job's run is resumed by its own signal exactly once, whichever of
/// the pair came first.
async fn assert_paired(fx: &Fixture, jobs: &[ClaimedJob], answers: &[SignalSent], round: usize) {
    let b = fx.backend;
    let claimed = fx.claim_all().await;
    let by_run: HashMap<&RunId, &ClaimedJob> = claimed.iter().map(|j| (&j.run_id, j)).collect();
    assert_eq!(
        (by_run.len(), claimed.len()),
        (jobs.len(), jobs.len()),
        "{b:?} round {round}: every run is resumed, once"
    );
    for (i, (job, sent)) in jobs.iter().zip(answers).enumerate() {
        let resumed = by_run[&job.run_id];
        assert_eq!(
            resumed.resume,
            resumed_by(sent, json!({ "i": i })),
            "{b:?} round {round}: run {i} carries its own signal"
        );
        let direct = sent.resumed == vec![job.run_id.clone()] && !sent.buffered;
        let from_buffer = sent.resumed.is_empty() && sent.buffered;
        assert!(
            direct || from_buffer,
            "{b:?} round {round}: signal {i} resumed its run or was buffered for it: {sent:?}"
        );
        assert_eq!(fx.waits(&job.run_id).await.1, Vec::new(), "{b:?}");
    }
    for job in &claimed {
        fx.finish(job).await;
    }
}

async fn signal_and_wait_on_distinct_keys_released_together_always_meet(fx: &Fixture) {
    for round in 0..ROUNDS {
        let jobs = fx.claimed_runs(PAIRS).await;
        let key = |i: usize| format!("round-{round}-key-{i}");
        let waits = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| (job.clone(), on_key(&key(i))))
            .collect();
        let signals = (0..PAIRS)
            .map(|i| signal(&key(i), json!({ "i": i })))
            .collect();
        let answers = race(fx, waits, signals).await;
        assert_paired(fx, &jobs, &answers, round).await;
    }
}

async fn signals_and_waits_on_one_key_released_together_pair_up_by_their_where(fx: &Fixture) {
    for round in 0..ROUNDS {
        let jobs = fx.claimed_runs(PAIRS).await;
        let key = format!("round-{round}");
        let waits = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| (job.clone(), on_key_where(&key, "i", json!(i))))
            .collect();
        let signals = (0..PAIRS)
            .map(|i| signal(&key, json!({ "i": i })))
            .collect();
        let answers = race(fx, waits, signals).await;
        assert_paired(fx, &jobs, &answers, round).await;
    }
}

async fn signals_and_waits_on_one_key_without_where_leave_no_wait_beside_a_buffered_signal(
    fx: &Fixture,
) {
    let b = fx.backend;
    for round in 0..ROUNDS {
        let jobs = fx.claimed_runs(PAIRS).await;
        let key = format!("round-{round}");
        let waits = jobs.iter().map(|job| (job.clone(), on_key(&key))).collect();
        let signals = (0..PAIRS)
            .map(|i| signal(&key, json!({ "i": i })))
            .collect();
        let answers = race(fx, waits, signals).await;

        let claimed = fx.claim_all().await;
        let runs: HashSet<&RunId> = jobs.iter().map(|j| &j.run_id).collect();
        let claimed_runs: HashSet<&RunId> = claimed.iter().map(|j| &j.run_id).collect();
        assert_eq!(claimed_runs.len(), claimed.len(), "{b:?}: no run twice");
        assert!(claimed_runs.is_subset(&runs), "{b:?}");
        let by_id: HashMap<&str, &SignalSent> =
            answers.iter().map(|s| (s.signal_id.as_str(), s)).collect();
        let mut taken_from_buffer = HashSet::new();
        let mut resumed_directly = HashSet::new();
        for sent in &answers {
            for run in &sent.resumed {
                assert!(
                    resumed_directly.insert(run.clone()),
                    "{b:?} round {round}: {run} resumed by two signals"
                );
            }
        }
        for job in &claimed {
            let Some(Resume::Signal { signal_id, .. }) = &job.resume else {
                panic!(
                    "{b:?} round {round}: {} claimed without a signal",
                    job.run_id
                );
            };
            let sent = by_id[signal_id.as_str()];
            if sent.buffered {
                assert!(
                    taken_from_buffer.insert(signal_id.clone()),
                    "{b:?} round {round}: buffered {signal_id} taken by two runs"
                );
            } else {
                assert!(
                    sent.resumed.contains(&job.run_id),
                    "{b:?} round {round}: {} carries {signal_id}, which did not resume it",
                    job.run_id
                );
            }
        }
        assert_eq!(
            resumed_directly.len() + taken_from_buffer.len(),
            claimed.len(),
            "{b:?} round {round}: every run resumed directly was claimed"
        );
        let buffered = answers.iter().filter(|s| s.buffered).count();
        let parked = jobs.len() - claimed.len();
        assert!(
            parked == 0 || taken_from_buffer.len() == buffered,
            "{b:?} round {round}: {parked} waits parked beside {} unconsumed buffered signals",
            buffered - taken_from_buffer.len()
        );
        for job in &claimed {
            fx.finish(job).await;
        }
        for job in jobs.iter().filter(|j| !claimed_runs.contains(&j.run_id)) {
            fx.store
                .cancel_run(&fx.tenant, &job.run_id)
                .await
                .expect("cancel a parked run");
        }
    }
}

async fn a_wait_finds_the_oldest_match_past_a_page_of_others(fx: &Fixture) {
    let b = fx.backend;
    // More than two pages of signals the wait does not want, then two it does.
    for n in 0..250 {
        fx.send(signal("k", json!({ "n": n }))).await;
        if n == 0 {
            // The oldest, alone in its millisecond (see below).
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
    let first = fx.send(signal("k", json!({ "n": "wanted", "i": 1 }))).await;
    // The buffer's order is the time received, in milliseconds (two of one
    // millisecond go in id order, which is not the order sent): the second
    // is sent in a later one.
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let second = fx.send(signal("k", json!({ "n": "wanted", "i": 2 }))).await;
    assert!(first.buffered && second.buffered, "{b:?}");

    let wants = fx
        .waiting_run(on_key_where("k", "n", json!("wanted")))
        .await;
    let job = fx.claim_only(&wants.run_id).await;
    assert_eq!(
        job.resume,
        resumed_by(&first, json!({ "n": "wanted", "i": 1 })),
        "{b:?}: the oldest matching signal, past 250 others"
    );
    let next = fx
        .waiting_run(on_key_where("k", "n", json!("wanted")))
        .await;
    let job = fx.claim_only(&next.run_id).await;
    assert_eq!(
        job.resume,
        resumed_by(&second, json!({ "n": "wanted", "i": 2 })),
        "{b:?}"
    );
    let none = fx
        .waiting_run(on_key_where("k", "n", json!("wanted")))
        .await;
    assert_eq!(
        fx.waits(&none.run_id).await.1.len(),
        1,
        "{b:?}: none left, it parks"
    );
    // The others are still there, oldest first.
    let any = fx.waiting_run(on_key("k")).await;
    let job = fx.claim_only(&any.run_id).await;
    assert!(
        matches!(&job.resume, Some(Resume::Signal { payload, .. }) if payload == &json!({ "n": 0 })),
        "{b:?}: {:?}",
        job.resume
    );
}

async fn retention_deletes_signals_past_their_lookback_and_the_idempotency_window(fx: &Fixture) {
    let b = fx.backend;
    const HOUR_MS: i64 = 3_600_000;
    let keyed = |key: &str, lookback_ms: i64| NewSignal {
        idempotency_key: Some(key.into()),
        lookback_ms,
        ..signal("k", json!({ "key": key }))
    };
    // Buffered for ten minutes; buffered for two days; taken by a wait at once.
    fx.send(keyed("short", 10 * 60_000)).await;
    let long = fx.send(keyed("long", 48 * HOUR_MS)).await;
    let waiting = fx.waiting_run(on_key("other")).await;
    let taken = fx
        .send(NewSignal {
            key: "other".into(),
            subject: None,
            ..keyed("taken", 10 * 60_000)
        })
        .await;
    assert_eq!(taken.resumed, vec![waiting.run_id.clone()], "{b:?}");
    fx.claim_only(&waiting.run_id).await;
    let other = new_tenant(&*fx.store, "other").await;
    fx.store
        .send_signal(&other, keyed("short", 10 * 60_000))
        .await
        .unwrap();
    let now = tok_store::now_ms();

    // Within the idempotency window nothing goes, though the short
    // lookback and the taken signal are over: their keys still deduplicate.
    let kept = fx
        .store
        .expire_signals(&fx.tenant, now + 23 * HOUR_MS, 100)
        .await
        .unwrap();
    assert_eq!(kept, 0, "{b:?}");
    assert!(
        fx.send(keyed("short", 10 * 60_000)).await.duplicate,
        "{b:?}"
    );
    assert!(
        fx.send(keyed("taken", 10 * 60_000)).await.duplicate,
        "{b:?}"
    );

    // Past the window, a batch at a time: the short and the taken signal
    // go, the one still within its lookback stays.
    let later = now + 25 * HOUR_MS;
    let mut deleted = Vec::new();
    loop {
        let n = fx.store.expire_signals(&fx.tenant, later, 1).await.unwrap();
        if n == 0 {
            break;
        }
        deleted.push(n);
    }
    assert_eq!(deleted, vec![1, 1], "{b:?}: one batch of one per signal");
    assert!(
        !fx.send(keyed("short", 10 * 60_000)).await.duplicate,
        "{b:?}: gone"
    );
    assert!(
        !fx.send(keyed("taken", 10 * 60_000)).await.duplicate,
        "{b:?}: gone"
    );
    let again = fx.send(keyed("long", 48 * HOUR_MS)).await;
    assert!(
        again.duplicate && again.signal_id == long.signal_id,
        "{b:?}: kept"
    );
    // Another tenant's signals are not its to delete.
    let theirs = fx
        .store
        .send_signal(&other, keyed("short", 0))
        .await
        .unwrap();
    assert!(theirs.duplicate, "{b:?}: the other tenant's signal stayed");
    assert_eq!(
        fx.store.expire_signals(&other, later, 100).await.unwrap(),
        1,
        "{b:?}"
    );
}

// ---------------------------------------------------------------------------
// Subjects
// ---------------------------------------------------------------------------

/// Waits on one key about two tickets and about none: a signal resumes only
/// the waits about its own ticket, one about no ticket only the wait about
/// none, and one about a third ticket nothing (it is buffered). The wait's
/// subject shows in the run's detail and comes with the resume; a repeat
/// of an idempotency key answers the first send's subject.
async fn a_signal_resumes_only_the_waits_about_its_subject(fx: &Fixture) {
    let b = fx.backend;
    let about_a = fx.waiting_run(on_key_about("shipped", "tk_a")).await;
    let about_b = fx.waiting_run(on_key_about("shipped", "tk_b")).await;
    let about_none = fx.waiting_run(on_key("shipped")).await;
    assert_eq!(
        fx.waits(&about_a.run_id).await.1,
        vec![WaitRow {
            subject: Some("tk_a".into()),
            ..wait_row("shipped", None)
        }],
        "{b:?}: the wait shows its subject"
    );

    let none = fx.send(signal("shipped", json!({ "n": 1 }))).await;
    assert_eq!(
        (none.resumed.clone(), none.subject.clone()),
        (vec![about_none.run_id.clone()], None),
        "{b:?}: a signal about no ticket resumes only the wait about none"
    );
    let resumed = fx.claim_only(&about_none.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&none, json!({ "n": 1 })),
        "{b:?}"
    );

    let other = fx
        .send(signal_about("shipped", "tk_c", json!({ "n": 2 })))
        .await;
    assert!(
        other.resumed.is_empty() && other.buffered,
        "{b:?}: a signal about another ticket resumes nothing: {other:?}"
    );
    fx.assert_nothing_ready("no wait is about tk_c").await;

    let keyed = NewSignal {
        idempotency_key: Some("delivery-a".into()),
        ..signal_about("shipped", "tk_a", json!({ "n": 3 }))
    };
    let to_a = fx.send(keyed.clone()).await;
    assert_eq!(
        (to_a.resumed.clone(), to_a.subject.as_deref()),
        (vec![about_a.run_id.clone()], Some("tk_a")),
        "{b:?}: only the wait about tk_a"
    );
    let resumed = fx.claim_only(&about_a.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&to_a, json!({ "n": 3 })),
        "{b:?}"
    );
    let repeat = fx
        .send(NewSignal {
            subject: Some("tk_b".into()),
            ..keyed
        })
        .await;
    assert_eq!(
        repeat,
        SignalSent {
            duplicate: true,
            ..to_a.clone()
        },
        "{b:?}: a repeat answers the first send, its subject too"
    );
    assert_eq!(
        fx.waits(&about_b.run_id).await,
        (
            "waiting".into(),
            vec![WaitRow {
                subject: Some("tk_b".into()),
                ..wait_row("shipped", None)
            }]
        ),
        "{b:?}: the repeat resumed nothing"
    );

    let to_b = fx
        .send(signal_about("shipped", "tk_b", json!({ "n": 4 })))
        .await;
    assert_eq!(to_b.resumed, vec![about_b.run_id.clone()], "{b:?}");
    let resumed = fx.claim_only(&about_b.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&to_b, json!({ "n": 4 })),
        "{b:?}"
    );
}

/// Signals buffered on one key about a ticket, about none and about
/// another ticket: a starting wait takes the oldest one about its own
/// subject only, passing older signals about others, and a wait about a
/// ticket nothing was sent about parks.
async fn a_starting_wait_takes_only_a_buffered_signal_about_its_subject(fx: &Fixture) {
    let b = fx.backend;
    let for_b = fx
        .send(signal_about("shipped", "tk_b", json!({ "for": "b" })))
        .await;
    let for_none = fx.send(signal("shipped", json!({ "for": "none" }))).await;
    let for_a = fx
        .send(signal_about("shipped", "tk_a", json!({ "for": "a" })))
        .await;
    assert!(
        for_b.buffered && for_none.buffered && for_a.buffered,
        "{b:?}: nothing waits yet"
    );

    let about_a = fx.waiting_run(on_key_about("shipped", "tk_a")).await;
    let resumed = fx.claim_only(&about_a.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&for_a, json!({ "for": "a" })),
        "{b:?}: the wait about tk_a passes the older signals about others"
    );
    assert_eq!(fx.waits(&about_a.run_id).await.1, Vec::new(), "{b:?}");

    let about_c = fx.waiting_run(on_key_about("shipped", "tk_c")).await;
    assert_eq!(
        fx.waits(&about_c.run_id).await.1.len(),
        1,
        "{b:?}: nothing was sent about tk_c: the wait parks"
    );
    fx.assert_nothing_ready("no buffered signal is about tk_c")
        .await;

    let about_none = fx.waiting_run(on_key("shipped")).await;
    let resumed = fx.claim_only(&about_none.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&for_none, json!({ "for": "none" })),
        "{b:?}: a wait about no ticket takes the signal about none, not the older one about tk_b"
    );

    let about_b = fx.waiting_run(on_key_about("shipped", "tk_b")).await;
    let resumed = fx.claim_only(&about_b.run_id).await;
    assert_eq!(
        resumed.resume,
        resumed_by(&for_b, json!({ "for": "b" })),
        "{b:?}"
    );
    let again = fx.waiting_run(on_key_about("shipped", "tk_b")).await;
    assert_eq!(
        fx.waits(&again.run_id).await.1.len(),
        1,
        "{b:?}: the signal about tk_b was taken once"
    );
}

// ---------------------------------------------------------------------------
// Several keys, and a ticket's condition
// ---------------------------------------------------------------------------

/// Two signals sent at the same moment on the two keys of each wait: the
/// first to commit resumes the wait (and takes all its rows), the second
/// finds them gone and is buffered, never overwriting the first's resume.
/// The wait parking again on its missing key without lookback, from when
/// it began, takes that buffered signal at once.
async fn two_signals_at_once_on_two_keys_of_one_wait_resume_it_once_and_the_other_waits_for_it(
    fx: &Fixture,
) {
    let b = fx.backend;
    for round in 0..ROUNDS {
        let began = tok_store::now_ms();
        let jobs = fx.claimed_runs(PAIRS).await;
        let keys = |i: usize| (format!("r{round}-paid-{i}"), format!("r{round}-packed-{i}"));
        for (i, job) in jobs.iter().enumerate() {
            let (paid, packed) = keys(i);
            let wait = SignalWait {
                also: vec![packed.clone()],
                lookback: false,
                ..on_key(&paid)
            };
            fx.store
                .record(job, waiting(job, wait))
                .await
                .expect("record a wait on two keys");
            let mut rows = fx.waits(&job.run_id).await.1;
            rows.sort_by(|x, y| x.key.cmp(&y.key));
            let one_per_key = vec![wait_row(&packed, None), wait_row(&paid, None)];
            assert_eq!(rows, one_per_key, "{b:?}: a row per key");
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(2 * PAIRS));
        let mut tasks = Vec::new();
        for i in 0..PAIRS {
            let (paid, packed) = keys(i);
            for key in [paid, packed] {
                let (store, barrier, tenant) =
                    (fx.store.clone(), barrier.clone(), fx.tenant.clone());
                tasks.push(tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .send_signal(&tenant, signal(&key, json!({ "i": i })))
                        .await
                }));
            }
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("a signal task").expect("send a signal"));
        }
        let claimed = fx.claim_all().await;
        let by_run: HashMap<&RunId, &ClaimedJob> = claimed.iter().map(|j| (&j.run_id, j)).collect();
        assert_eq!(
            (by_run.len(), claimed.len()),
            (PAIRS, PAIRS),
            "{b:?} round {round}: every wait is resumed, once"
        );
        for (i, job) in jobs.iter().enumerate() {
            let pair = &answers[2 * i..2 * i + 2];
            let (winner, loser) = match pair[0].resumed.is_empty() {
                true => (&pair[1], &pair[0]),
                false => (&pair[0], &pair[1]),
            };
            assert_eq!(
                winner.resumed,
                vec![job.run_id.clone()],
                "{b:?} round {round}"
            );
            assert!(
                loser.buffered && loser.resumed.is_empty(),
                "{b:?} round {round}: the second signal of wait {i} is buffered: {loser:?}"
            );
            let resumed = by_run[&job.run_id];
            assert_eq!(
                resumed.resume,
                resumed_by(winner, json!({ "i": i })),
                "{b:?} round {round}: wait {i} carries the signal that resumed it"
            );
            assert_eq!(
                fx.waits(&job.run_id).await.1,
                vec![],
                "{b:?}: every row taken"
            );

            // Parked again on the key still missing, from when it began.
            let again = SignalWait {
                lookback: false,
                since: Some(began),
                ..on_key(&loser.key)
            };
            fx.store
                .record(resumed, waiting(resumed, again))
                .await
                .expect("park again");
        }
        let taken = fx.claim_all().await;
        let by_run: HashMap<&RunId, &ClaimedJob> = taken.iter().map(|j| (&j.run_id, j)).collect();
        assert_eq!(
            by_run.len(),
            PAIRS,
            "{b:?} round {round}: every buffered signal is taken"
        );
        for (i, job) in jobs.iter().enumerate() {
            let pair = &answers[2 * i..2 * i + 2];
            let loser = pair.iter().find(|s| s.buffered).expect("a buffered one");
            assert_eq!(
                by_run[&job.run_id].resume,
                resumed_by(loser, json!({ "i": i })),
                "{b:?} round {round}: wait {i} takes its buffered signal"
            );
            fx.finish(by_run[&job.run_id]).await;
        }
    }
}

/// A ticket of the fixture's tenant in `status`, written as the API
/// writes it: created, or updated (over its last write).
async fn write_ticket(fx: &Fixture, id: &str, status: &str, created: bool) -> Ticket {
    let now = tok_store::now_ms();
    let ticket = Ticket {
        id: id.into(),
        external_id: format!("ext-{id}"),
        type_id: None,
        type_name: None,
        title: None,
        status: Some(status.into()),
        closed: false,
        tags: Vec::new(),
        fields: serde_json::Map::new(),
        assignee_id: None,
        assignee_name: None,
        created_at: now,
        updated_at: now,
    };
    let write = TicketWrite {
        ticket: ticket.clone(),
        created,
        changes: vec!["status".into()],
        trace: vec![format!("Status: {status}")],
    };
    let cause = Cause {
        actor: "api".into(),
        ..Cause::default()
    };
    fx.store
        .write_ticket(&fx.tenant, write, None, &cause)
        .await
        .expect("write a ticket");
    ticket
}

/// A `wait_for_condition`'s wait: until ticket `ticket` is `shipped`.
fn until_shipped(ticket: &str) -> SignalWait {
    SignalWait {
        key: tok_core::waits::CONDITION_KEY.into(),
        subject: Some(ticket.into()),
        filter: Some(
            serde_json::from_value(json!({
                "rules": [{ "field": "status", "operator": "eq", "value": "shipped" }]
            }))
            .expect("a filter"),
        ),
        lookback: false,
        ..SignalWait::default()
    }
}

async fn a_ticket_write_resumes_the_condition_waits_its_new_state_satisfies(fx: &Fixture) {
    let b = fx.backend;
    let id = tok_core::ids::new_id("tkt");
    let other = tok_core::ids::new_id("tkt");
    write_ticket(fx, &id, "new", true).await;
    write_ticket(fx, &other, "new", true).await;
    let job = fx.waiting_run(until_shipped(&id)).await;
    let bystander = fx.waiting_run(until_shipped(&other)).await;
    assert_eq!(
        fx.waits(&job.run_id).await,
        (
            "waiting".into(),
            vec![WaitRow {
                kind: "condition".into(),
                subject: Some(id.clone()),
                ..wait_row(tok_core::waits::CONDITION_KEY, None)
            }]
        ),
        "{b:?}: the run waits on its ticket"
    );
    fx.assert_nothing_ready("the ticket is not shipped").await;

    write_ticket(fx, &id, "packed", false).await;
    fx.assert_nothing_ready("a change that does not satisfy the rules resumes nothing")
        .await;
    assert_eq!(
        fx.waits(&job.run_id).await.1.len(),
        1,
        "{b:?}: still waiting"
    );
    let signal_on_key = fx
        .send(signal(tok_core::waits::CONDITION_KEY, json!({})))
        .await;
    assert!(
        signal_on_key.resumed.is_empty(),
        "{b:?}: no signal resumes a condition"
    );

    let shipped = write_ticket(fx, &id, "shipped", false).await;
    let resumed = fx.claim_only(&job.run_id).await;
    assert_eq!(
        resumed.resume,
        Some(Resume::Condition {
            ticket: shipped.event_view()
        }),
        "{b:?}: resumed with the ticket as it is now"
    );
    assert_eq!(
        fx.waits(&job.run_id).await.1,
        vec![],
        "{b:?}: the wait is taken"
    );
    assert_eq!(
        fx.waits(&bystander.run_id).await.1.len(),
        1,
        "{b:?}: another ticket's wait stays"
    );
    fx.finish(&resumed).await;
}

async fn a_condition_that_holds_as_the_wait_parks_resumes_it_at_once(fx: &Fixture) {
    let b = fx.backend;
    let id = tok_core::ids::new_id("tkt");
    let shipped = write_ticket(fx, &id, "shipped", true).await;
    let job = fx.waiting_run(until_shipped(&id)).await;
    let resumed = fx.claim_only(&job.run_id).await;
    assert_eq!(
        resumed.resume,
        Some(Resume::Condition {
            ticket: shipped.event_view()
        }),
        "{b:?}"
    );
    assert_eq!(
        fx.waits(&job.run_id).await.1,
        vec![],
        "{b:?}: no wait is left"
    );
    // Another tenant's ticket of the same id is not the run's ticket.
    let missing = fx.waiting_run(until_shipped("tkt_of_no_one")).await;
    fx.assert_nothing_ready("a ticket the tenant does not have holds nothing")
        .await;
    assert_eq!(fx.waits(&missing.run_id).await.1.len(), 1, "{b:?}");
}
