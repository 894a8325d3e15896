//! The record transaction (`QueueStore::record`, `record_and_continue`):
//! all or nothing under the claim's fence; a step moves the job on, a retry
//! counts attempts, a finished run loses its job, a continued job keeps its
//! lease unless its run was paused. Records sent together share group
//! commits: text with U+0000 is stored made storable, and a record the
//! database refuses fails its own run and nothing else.

use super::*;

backend_tests!(
    run_on_fresh_db;
    record_step_writes_the_step_and_moves_the_job_on,
    record_retry_delays_the_same_step_and_counts_attempts,
    record_done_finishes_the_run_and_removes_its_job,
    a_continued_job_stays_leased_unless_its_run_was_paused,
    a_record_with_nul_in_its_text_is_stored_with_replacement_characters,
    a_record_the_database_refuses_fails_its_run_and_nothing_else,
);

async fn record_step_writes_the_step_and_moves_the_job_on(db: &TestDb) {
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
            held: None,
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
            context: json!({ "forged": true }).into(),
            changed: tok_store::ContextChange::Whole,
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
        context: json!({ "n": 1, "st_0": { "a": 1 } }).into(),
        changed: tok_store::ContextChange::Whole,
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
        context: detail.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
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

async fn record_retry_delays_the_same_step_and_counts_attempts(db: &TestDb) {
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
            context: job.context.clone().into(),
            changed: tok_store::ContextChange::Whole,
            actions: 1,
            status: RunStatus::Running,
            error: None,
            next: NextJob::Retry {
                path: job.path.clone(),
                attempts: job.attempt,
                delay_ms,
                held: None,
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

async fn record_done_finishes_the_run_and_removes_its_job(db: &TestDb) {
    let backend = db.backend;
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
}

async fn a_continued_job_stays_leased_unless_its_run_was_paused(db: &TestDb) {
    let backend = db.backend;
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
    let continued_record = |job: &ClaimedJob| Record {
        next: NextJob::Continue {
            path: "1".into(),
            lease_ms: 30_000,
        },
        status: RunStatus::Running,
        ..finish(job, RunStatus::Running)
    };
    // One run goes on under its claim, held by the same worker.
    let (going, paused) = (&jobs[0], &jobs[1]);
    let kept = store
        .record_and_continue(going, continued_record(going))
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
        .record_and_continue(paused, continued_record(paused))
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
    // The continued job records its next step under the same claim; a
    // token it does not hold is fenced off.
    let next = ClaimedJob {
        path: "1".into(),
        attempt: 1,
        ..going.clone()
    };
    let forged = ClaimedJob {
        claim_token: "not-the-claim".into(),
        ..next.clone()
    };
    assert!(matches!(
        store
            .record(&forged, finish(&forged, RunStatus::Completed))
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
        context: job.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
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

async fn a_record_with_nul_in_its_text_is_stored_with_replacement_characters(db: &TestDb) {
    let backend = db.backend;
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
}

async fn a_record_the_database_refuses_fails_its_run_and_nothing_else(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    refuse_poison(db, "run_steps", "error").await;
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
}
