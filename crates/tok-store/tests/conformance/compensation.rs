//! Compensation in the store: cancelling a run whose context lists
//! completed steps to undo leaves it `compensating` with one job, at the
//! step undone first and carrying the cancel (`Resume::Cancel`) for the
//! decider, its waits and other jobs gone; a second cancel is refused; the
//! record that ends the compensation ends the run. A run with nothing to
//! undo is cancelled at once. Branches' records bring their completed steps
//! into the run's list; a failed run that undid its steps is not retried.

use tok_core::compensation::COMPENSABLE_KEY;
use tok_store::{Resume, SignalWait, StepStatus};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_cancelled_run_with_steps_to_undo_compensates_on_one_job,
    branch_records_add_their_completed_steps_to_the_runs_list,
    a_run_that_undid_its_steps_on_failure_is_not_retried,
);

async fn claim_all(store: &dyn Store, tenant: &TenantId) -> Vec<ClaimedJob> {
    store
        .claim(std::slice::from_ref(tenant), "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim")
}

/// Records `steps` and parks the run at `path` on a signal, with `context`.
fn parked_at(job: &ClaimedJob, path: &str, context: Value) -> Record {
    Record {
        subject_ticket_id: None,
        steps: vec![step(path, StepStatus::Waiting, json!({}))],
        context: context.into(),
        changed: tok_store::ContextChange::Whole,
        actions: job.actions + 1,
        status: RunStatus::Waiting,
        error: None,
        next: NextJob::Wait {
            path: path.into(),
            wait: SignalWait {
                key: "confirm".into(),
                subject: None,
                filter: None,
                lookback: false,
                due_at: None,
                ..Default::default()
            },
        },
    }
}

async fn a_cancelled_run_with_steps_to_undo_compensates_on_one_job(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let undoing = start(store, &t, &aut, "manual", None).await;
    let plain = start(store, &t, &aut, "manual", None).await;
    for job in claim_all(store, &t).await {
        let mut context = job.context.clone();
        if job.run_id == undoing {
            context[COMPENSABLE_KEY] = json!(["0", "1.do.2.0"]);
        }
        store
            .record(&job, parked_at(&job, "2", context))
            .await
            .expect("park");
    }

    let cancelled = store.cancel_run(&t, &plain).await.expect("cancel");
    assert_eq!(cancelled.status, "cancelled", "{backend:?}");
    assert!(cancelled.finished_at.is_some(), "{backend:?}");

    let compensating = store.cancel_run(&t, &undoing).await.expect("cancel");
    assert_eq!(compensating.status, "compensating", "{backend:?}");
    assert_eq!(compensating.finished_at, None, "{backend:?}");
    let detail = store.run(&t, &undoing).await.unwrap().expect("the run");
    assert!(detail.waits.is_empty(), "{backend:?}: the wait is gone");
    let again = store.cancel_run(&t, &undoing).await;
    assert!(
        matches!(&again, Err(StoreError::InvalidState(m)) if m.contains("compensating")),
        "{backend:?}: a second cancel is refused: {again:?}"
    );

    let jobs = claim_all(store, &t).await;
    assert_eq!(jobs.len(), 1, "{backend:?}: one job undoes the run");
    let job = &jobs[0];
    assert_eq!(job.run_id, undoing, "{backend:?}");
    assert_eq!(job.path, "1.do.2.0", "{backend:?}: the last completed step");
    assert_eq!(
        job.resume,
        Some(Resume::Cancel { error: None }),
        "{backend:?}"
    );
    let summary = all_runs(store, &t).await;
    let status = summary
        .iter()
        .find(|r| r.id == undoing)
        .map(|r| r.status.as_str());
    assert_eq!(
        status,
        Some("compensating"),
        "{backend:?}: a claim leaves it compensating"
    );

    let mut undo = step("1.do.2.0.compensate.0", StepStatus::Completed, json!({}));
    undo.step_id = "st_undo".into();
    let done = Record {
        subject_ticket_id: None,
        steps: vec![undo],
        context: job.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        actions: job.actions + 1,
        status: RunStatus::Cancelled,
        error: None,
        next: NextJob::Done,
    };
    store.record(job, done).await.expect("record");
    let detail = store.run(&t, &undoing).await.unwrap().expect("the run");
    assert_eq!(detail.run.status, "cancelled", "{backend:?}");
    assert!(detail.run.finished_at.is_some(), "{backend:?}");
    let paths: Vec<&str> = detail.steps.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["2", "1.do.2.0.compensate.0"], "{backend:?}");
    assert!(claim_all(store, &t).await.is_empty(), "{backend:?}");
}

async fn branch_records_add_their_completed_steps_to_the_runs_list(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let run = start(store, &t, &aut, "manual", None).await;
    let jobs = claim_all(store, &t).await;
    let fork = Record {
        subject_ticket_id: None,
        steps: vec![step("0", StepStatus::Waiting, json!({}))],
        context: jobs[0].context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        actions: 1,
        status: RunStatus::Running,
        error: None,
        next: NextJob::Fork {
            path: "0".into(),
            branches: vec![(0, "0.branches.0.0".into()), (1, "0.branches.1.0".into())],
            items: None,
        },
    };
    store.record(&jobs[0], fork).await.expect("fork");
    let mut branches = claim_all(store, &t).await;
    branches.sort_by(|a, b| b.path.cmp(&a.path));
    // Branch 1 records first, then branch 0; each from its own copy.
    for job in &branches {
        let mut context = job.context.clone();
        context[COMPENSABLE_KEY] = json!([job.path]);
        let branch = if job.path.contains(".1.") { 1 } else { 0 };
        let record = Record {
            subject_ticket_id: None,
            steps: vec![step(&job.path, StepStatus::Completed, json!({}))],
            context: context.into(),
            changed: tok_store::ContextChange::Whole,
            actions: job.actions + 1,
            status: RunStatus::Running,
            error: None,
            next: NextJob::BranchDone {
                parallel: "0".into(),
                branch,
                failed: None,
            },
        };
        store.record(job, record).await.expect("branch");
    }
    let detail = store.run(&t, &run).await.unwrap().expect("the run");
    assert_eq!(
        detail.context[COMPENSABLE_KEY],
        json!(["0.branches.1.0", "0.branches.0.0"]),
        "{backend:?}: neither branch's completed step is lost, in the order they came"
    );
}

async fn a_run_that_undid_its_steps_on_failure_is_not_retried(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let run = start(store, &t, &aut, "manual", None).await;
    let jobs = claim_all(store, &t).await;
    let mut failed = step("1", StepStatus::Failed, json!({}));
    failed.error = Some("HTTP 404".into());
    let record = Record {
        subject_ticket_id: None,
        steps: vec![
            failed,
            step("0.compensate.0", StepStatus::Completed, json!({})),
        ],
        context: jobs[0].context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        actions: 2,
        status: RunStatus::Failed,
        error: Some("step `st_1` failed: HTTP 404".into()),
        next: NextJob::Done,
    };
    store.record(&jobs[0], record).await.expect("record");
    let retried = store.retry_run(&t, &run).await;
    assert!(
        matches!(&retried, Err(StoreError::InvalidState(m)) if m.contains("undid")),
        "{backend:?}: {retried:?}"
    );
}
