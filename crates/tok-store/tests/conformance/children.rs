//! Runs that start and wait for other runs: a child written in its parent's
//! record transaction is a queued run of its own with `parent_run_id`; a
//! job parked on runs waits (holding no lease) until they end, learning
//! how each ended, and is due at once when they ended before it parked; a
//! run's end resumes the waits on it in its own record; a timeout hands the
//! job out with what ended so far; a signal on a run's key resumes no wait
//! on runs; a cancel takes the runs a run waits for with it; a run failed
//! outside the decider (a record of the group commit, `fail_run`) resumes
//! the run parked on it too.

use tok_store::{Cause, ChildStart, Resume, RunEnded, RunFailure, RunsMode, RunsWait, now_ms};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_child_started_in_a_record_is_a_queued_run_of_its_parent,
    a_run_that_ends_resumes_the_job_parked_on_it,
    a_wait_for_all_runs_counts_each_end_and_takes_ended_runs_at_once,
    a_wait_on_runs_times_out_with_what_ended_so_far,
    a_cancel_takes_the_runs_a_run_waits_for_with_it,
    a_run_failed_outside_the_decider_resumes_the_run_parked_on_it,
);

fn wait_on(runs: &[&RunId], mode: RunsMode, due_at: Option<i64>) -> NextJob {
    NextJob::WaitForRuns {
        path: "0".into(),
        wait: RunsWait {
            runs: runs.iter().map(|r| r.to_string()).collect(),
            mode,
            due_at,
        },
    }
}

fn parked(job: &ClaimedJob, next: NextJob) -> Record {
    Record {
        subject_ticket_id: None,
        steps: vec![step(&job.path, tok_store::StepStatus::Waiting, json!({}))],
        context: job.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        actions: job.actions + 1,
        status: RunStatus::Waiting,
        error: None,
        next,
    }
}

fn child_run(automation: &AutomationId, key: &str) -> (NewEvent, NewRun) {
    let mut run = new_run(automation, "parent", None);
    run.idempotency_key = Some(key.into());
    run.depth = 1;
    let mut event = manual_event(automation);
    event.source_kind = "parent".into();
    (event, run)
}

async fn claim_one(store: &dyn Store, tenant: &TenantId, run: &RunId) -> ClaimedJob {
    let jobs = store
        .claim(std::slice::from_ref(tenant), "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    jobs.into_iter()
        .find(|j| &j.run_id == run)
        .unwrap_or_else(|| panic!("the job of {run} is not claimable"))
}

/// Claims every ready job of the tenant, by run.
async fn claim_all(
    store: &dyn Store,
    tenant: &TenantId,
) -> std::collections::HashMap<RunId, ClaimedJob> {
    claimable(store, tenant)
        .await
        .into_iter()
        .map(|j| (j.run_id.clone(), j))
        .collect()
}

async fn claimable(store: &dyn Store, tenant: &TenantId) -> Vec<ClaimedJob> {
    store
        .claim(std::slice::from_ref(tenant), "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim")
}

/// A parent run whose claimed job starts a child (key `key`) in its
/// record and parks on it; returns the parent and the child.
async fn parent_waiting_on_child(
    store: &dyn Store,
    tenant: &TenantId,
    automation: &AutomationId,
    key: &str,
) -> (RunId, ChildStart) {
    let parent = start(store, tenant, automation, "manual", None).await;
    let job = claim_one(store, tenant, &parent).await;
    let mut tx = store.begin_record(&job).await.expect("begin");
    let (event, run) = child_run(automation, key);
    let child = tx.start_child(event, run).await.expect("start the child");
    let wait = wait_on(&[&child.run_id], RunsMode::All, None);
    tx.commit(parked(&job, wait)).await.expect("commit");
    (parent, child)
}

/// Ends the job's run with `output`, kept in its context as the engine
/// keeps it (`_output`), and tells the waits on it.
async fn end_run(store: &dyn Store, job: &ClaimedJob, status: RunStatus, output: Value) {
    let mut tx = store.begin_record(job).await.expect("begin");
    tx.run_ended(RunEnded {
        run_id: job.run_id.to_string(),
        status,
        output: output.clone(),
        error: None,
    })
    .await
    .expect("the end reaches its waits");
    let mut record = finish(job, status);
    std::sync::Arc::make_mut(&mut record.context)["_output"] = output;
    tx.commit(record).await.expect("commit");
}

async fn a_child_started_in_a_record_is_a_queued_run_of_its_parent(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let (parent, child) = parent_waiting_on_child(store, &t, &aut, "k-1").await;
    assert!(child.created, "{backend:?}");

    let detail = store
        .run(&t, &child.run_id)
        .await
        .unwrap()
        .expect("the child");
    assert_eq!(detail.run.status, "queued", "{backend:?}");
    assert_eq!(detail.run.trigger_type, "parent", "{backend:?}");
    assert_eq!(
        detail.run.parent_run_id.as_ref(),
        Some(&parent),
        "{backend:?}"
    );
    let waiting = store.run(&t, &parent).await.unwrap().expect("the parent");
    assert_eq!(waiting.run.status, "waiting", "{backend:?}");
    assert_eq!(waiting.waits.len(), 1, "{backend:?}");
    assert_eq!(waiting.waits[0].kind, "runs", "{backend:?}");
    assert_eq!(waiting.waits[0].key, format!("run:{}", child.run_id));

    // Only the child can be claimed: the parent holds no job that is due.
    let ready = claimable(store, &t).await;
    assert_eq!(
        run_ids(&ready),
        HashSet::from([child.run_id.clone()]),
        "{backend:?}"
    );

    // The same key starts no second child, from any run.
    let other = start(store, &t, &aut, "manual", None).await;
    let job = claim_one(store, &t, &other).await;
    let mut tx = store.begin_record(&job).await.expect("begin");
    let (event, run) = child_run(&aut, "k-1");
    let again = tx.start_child(event, run).await.expect("start again");
    assert_eq!(
        again,
        ChildStart {
            run_id: child.run_id.clone(),
            created: false
        },
        "{backend:?}"
    );
    tx.commit(finish(&job, RunStatus::Completed))
        .await
        .expect("commit");
    let children = store
        .runs(
            &t,
            &RunFilter {
                parent_run_id: Some(parent.to_string()),
                ..RunFilter::default()
            },
            50,
            None,
        )
        .await
        .expect("list");
    assert_eq!(children.items.len(), 1, "{backend:?}");
}

async fn a_run_that_ends_resumes_the_job_parked_on_it(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let (parent, child) = parent_waiting_on_child(store, &t, &aut, "k-2").await;

    // A signal on the child's key is not the child's end.
    let signal = tok_store::NewSignal {
        key: format!("run:{}", child.run_id),
        subject: None,
        payload: json!({}),
        idempotency_key: None,
        lookback_ms: 0,
        actor: None,
    };
    let sent = store.send_signal(&t, signal).await.expect("send");
    assert!(sent.resumed.is_empty(), "{backend:?}");

    let job = claim_one(store, &t, &child.run_id).await;
    end_run(store, &job, RunStatus::Completed, json!({ "n": 7 })).await;
    let resumed = claim_one(store, &t, &parent).await;
    assert_eq!(
        resumed.resume,
        Some(Resume::Runs {
            ended: vec![RunEnded {
                run_id: child.run_id.to_string(),
                status: RunStatus::Completed,
                output: json!({ "n": 7 }),
                error: None,
            }],
            timed_out: false,
        }),
        "{backend:?}"
    );
    let detail = store.run(&t, &parent).await.unwrap().expect("the parent");
    assert!(detail.waits.is_empty(), "{backend:?}: the wait is over");
}

async fn a_wait_for_all_runs_counts_each_end_and_takes_ended_runs_at_once(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let a = start(store, &t, &aut, "manual", None).await;
    let b = start(store, &t, &aut, "manual", None).await;
    let waiter = start(store, &t, &aut, "manual", None).await;
    let mut jobs = claim_all(store, &t).await;
    end_run(store, &jobs[&a], RunStatus::Completed, json!("A")).await;
    let job = jobs.remove(&waiter).expect("the waiter's job");
    let tx = store.begin_record(&job).await.expect("begin");
    tx.commit(parked(&job, wait_on(&[&a, &b], RunsMode::All, None)))
        .await
        .expect("park");
    let detail = store.run(&t, &waiter).await.unwrap().expect("the waiter");
    assert_eq!(
        detail.waits.len(),
        1,
        "{backend:?}: only b is still awaited"
    );
    assert_eq!(detail.waits[0].key, format!("run:{b}"), "{backend:?}");

    end_run(store, &jobs[&b], RunStatus::Completed, json!("B")).await;
    let resumed = claim_one(store, &t, &waiter).await;
    let Some(Resume::Runs { ended, timed_out }) = resumed.resume else {
        panic!("{backend:?}: resumed with the runs: {:?}", resumed.resume);
    };
    assert!(!timed_out, "{backend:?}");
    let outputs: Vec<Value> = ended.iter().map(|r| r.output.clone()).collect();
    assert_eq!(outputs, vec![json!("A"), json!("B")], "{backend:?}");

    // Both ended before this wait began: it is due as it parks.
    let late = start(store, &t, &aut, "manual", None).await;
    let job = claim_one(store, &t, &late).await;
    let tx = store.begin_record(&job).await.expect("begin");
    tx.commit(parked(&job, wait_on(&[&a, &b], RunsMode::All, None)))
        .await
        .expect("park");
    let resumed = claim_one(store, &t, &late).await;
    assert!(
        matches!(&resumed.resume, Some(Resume::Runs { ended, timed_out: false }) if ended.len() == 2),
        "{backend:?}: {:?}",
        resumed.resume
    );
}

async fn a_wait_on_runs_times_out_with_what_ended_so_far(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let a = start(store, &t, &aut, "manual", None).await;
    let b = start(store, &t, &aut, "manual", None).await;
    let waiter = start(store, &t, &aut, "manual", None).await;
    let mut jobs = claim_all(store, &t).await;
    let job = jobs.remove(&waiter).expect("the waiter's job");
    let tx = store.begin_record(&job).await.expect("begin");
    let due = tok_store::now_ms() + 300;
    tx.commit(parked(&job, wait_on(&[&a, &b], RunsMode::All, Some(due))))
        .await
        .expect("park");
    end_run(store, &jobs[&a], RunStatus::Completed, json!("A")).await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let jobs = claimable(store, &t).await;
    let timed_out = jobs
        .iter()
        .find(|j| j.run_id == waiter)
        .unwrap_or_else(|| panic!("{backend:?}: the waiter is due at its timeout"));
    let Some(Resume::Runs { ended, timed_out }) = &timed_out.resume else {
        panic!("{backend:?}: {:?}", timed_out.resume);
    };
    assert!(*timed_out, "{backend:?}");
    assert_eq!(ended.len(), 1, "{backend:?}");
    assert_eq!(ended[0].run_id, a.to_string(), "{backend:?}");
}

async fn a_cancel_takes_the_runs_a_run_waits_for_with_it(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let (parent, child) = parent_waiting_on_child(store, &t, &aut, "k-3").await;
    // The child waits for a grandchild in turn.
    let job = claim_one(store, &t, &child.run_id).await;
    let mut tx = store.begin_record(&job).await.expect("begin");
    let (event, run) = child_run(&aut, "k-4");
    let grandchild = tx.start_child(event, run).await.expect("grandchild");
    tx.commit(parked(
        &job,
        wait_on(&[&grandchild.run_id], RunsMode::All, None),
    ))
    .await
    .expect("park");

    let cancelled = store.cancel_run(&t, &parent).await.expect("cancel");
    assert_eq!(cancelled.status, "cancelled", "{backend:?}");
    for run in [&parent, &child.run_id, &grandchild.run_id] {
        let detail = store.run(&t, run).await.unwrap().expect("a run");
        assert_eq!(detail.run.status, "cancelled", "{backend:?}: {run}");
        assert!(detail.waits.is_empty(), "{backend:?}: {run}");
    }
    assert!(
        claimable(store, &t).await.is_empty(),
        "{backend:?}: no job is left"
    );
}

async fn a_run_failed_outside_the_decider_resumes_the_run_parked_on_it(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let (parent_a, child_a) = parent_waiting_on_child(store, &t, &aut, "k-a").await;
    let failed = |run: &RunId, error: &str| {
        Some(Resume::Runs {
            ended: vec![RunEnded {
                run_id: run.to_string(),
                status: RunStatus::Failed,
                output: Value::Null,
                error: Some(error.to_owned()),
            }],
            timed_out: false,
        })
    };

    // A record with no effects that fails the child (its job's path no
    // longer reads, say): written by the group commit.
    let job = claim_one(store, &t, &child_a.run_id).await;
    let mut record = finish(&job, RunStatus::Failed);
    record.error = Some("job path `x` is not valid".into());
    std::sync::Arc::make_mut(&mut record.context)["_event"] = json!({ "parentRunId": parent_a });
    store.record(&job, record).await.expect("record");
    let resumed = claim_one(store, &t, &parent_a).await;
    assert_eq!(
        resumed.resume,
        failed(&child_a.run_id, "job path `x` is not valid"),
        "{backend:?}"
    );

    // The scheduler's run_timeout.
    let (parent_b, child_b) = parent_waiting_on_child(store, &t, &aut, "k-b").await;
    let failure = RunFailure {
        error: "run_timeout: too long".into(),
        incident: None,
        event: None,
        cause: Cause::default(),
    };
    assert!(
        store
            .fail_run(&t, &child_b.run_id, failure, now_ms())
            .await
            .unwrap()
    );
    let resumed = claim_one(store, &t, &parent_b).await;
    assert_eq!(
        resumed.resume,
        failed(&child_b.run_id, "run_timeout: too long"),
        "{backend:?}"
    );
}
