//! Parallel branches in the queue: a record that forks parks its job and
//! starts a job per branch, each claimable on its own at once; branches'
//! records write their outputs over the run's context (neither's is lost)
//! and add their actions; the parked job is due exactly when the last
//! branch is done; a failed branch makes it due at once and cancels the
//! other branches' jobs and waits.

use tok_store::{Resume, StepStatus};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_fork_starts_a_claimable_job_per_branch_and_parks_its_own,
    branches_share_the_context_and_join_once_when_the_last_is_done,
    a_failed_branch_ends_the_join_at_once_and_cancels_the_others,
);

fn record(job: &ClaimedJob, steps: Vec<StepRecord>, next: NextJob) -> Record {
    Record {
        subject_ticket_id: None,
        actions: job.actions + steps.len() as i32,
        steps,
        context: job.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        status: RunStatus::Running,
        error: None,
        next,
    }
}

fn fork(job: &ClaimedJob) -> Record {
    let next = NextJob::Fork {
        path: "0".into(),
        branches: vec![(0, "0.branches.0.0".into()), (1, "0.branches.1.0".into())],
    };
    record(job, vec![step("0", StepStatus::Waiting, json!({}))], next)
}

fn branch_done(job: &ClaimedJob, branch: usize, output: Value, failed: Option<&str>) -> Record {
    let mut done = step(&job.path, StepStatus::Completed, output);
    done.step_id = format!("st_branch_{branch}");
    let next = NextJob::BranchDone {
        parallel: "0".into(),
        branch,
        failed: failed.map(str::to_owned),
    };
    record(job, vec![done], next)
}

async fn claim_all(store: &dyn Store, tenant: &TenantId) -> Vec<ClaimedJob> {
    store
        .claim(std::slice::from_ref(tenant), "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim")
}

/// A run forked at its step `0`; returns its id and its two branch jobs
/// (branch 0 first), claimed.
async fn forked(store: &dyn Store, tenant: &TenantId) -> (RunId, Vec<ClaimedJob>) {
    let aut = manual_automation(store, tenant, "a").await;
    let run = start(store, tenant, &aut, "manual", None).await;
    let jobs = claim_all(store, tenant).await;
    assert_eq!(jobs.len(), 1);
    store.record(&jobs[0], fork(&jobs[0])).await.expect("fork");
    let mut branches = claim_all(store, tenant).await;
    branches.sort_by(|a, b| a.path.cmp(&b.path));
    (run, branches)
}

async fn a_fork_starts_a_claimable_job_per_branch_and_parks_its_own(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, branches) = forked(store, &t).await;
    let paths: Vec<&str> = branches.iter().map(|j| j.path.as_str()).collect();
    assert_eq!(paths, ["0.branches.0.0", "0.branches.1.0"], "{backend:?}");
    assert!(branches.iter().all(|j| j.run_id == run), "{backend:?}");
    assert!(
        claim_all(store, &t).await.is_empty(),
        "{backend:?}: the parallel step's own job is parked"
    );
}

async fn branches_share_the_context_and_join_once_when_the_last_is_done(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, branches) = forked(store, &t).await;
    // Both branches were claimed with the same context; each records its own output.
    store
        .record(
            &branches[0],
            branch_done(&branches[0], 0, json!({ "a": 1 }), None),
        )
        .await
        .expect("branch 0");
    assert!(
        claim_all(store, &t).await.is_empty(),
        "{backend:?}: one branch done of two joins nothing"
    );
    store
        .record(
            &branches[1],
            branch_done(&branches[1], 1, json!({ "b": 2 }), None),
        )
        .await
        .expect("branch 1");
    let joined = claim_all(store, &t).await;
    assert_eq!(joined.len(), 1, "{backend:?}: the join is due once");
    let joined = &joined[0];
    assert_eq!(joined.path, "0", "{backend:?}");
    assert_eq!(
        joined.resume,
        Some(Resume::Branches {
            total: 2,
            done: vec![0, 1],
            failed: None
        }),
        "{backend:?}"
    );
    assert_eq!(
        joined.context["st_branch_0"],
        json!({ "a": 1 }),
        "{backend:?}"
    );
    assert_eq!(
        joined.context["st_branch_1"],
        json!({ "b": 2 }),
        "{backend:?}"
    );
    assert_eq!(
        joined.actions, 3,
        "{backend:?}: the fork's step and one per branch"
    );
    let detail = store.run(&t, &run).await.unwrap().expect("the run");
    assert_eq!(detail.steps.len(), 3, "{backend:?}");
}

async fn a_failed_branch_ends_the_join_at_once_and_cancels_the_others(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, branches) = forked(store, &t).await;
    // Branch 0 parks on a signal; branch 1 fails.
    let wait = tok_store::SignalWait {
        key: "never".into(),
        subject: None,
        filter: None,
        lookback: false,
        due_at: None,
        ..Default::default()
    };
    let parked = record(
        &branches[0],
        vec![step("0.branches.0.0", StepStatus::Waiting, json!({}))],
        NextJob::Wait {
            path: "0.branches.0.0".into(),
            wait,
        },
    );
    store
        .record(&branches[0], parked)
        .await
        .expect("branch 0 waits");
    assert_eq!(store.run(&t, &run).await.unwrap().unwrap().waits.len(), 1);
    store
        .record(
            &branches[1],
            branch_done(&branches[1], 1, json!({}), Some("HTTP 404")),
        )
        .await
        .expect("branch 1 fails");
    let joined = claim_all(store, &t).await;
    assert_eq!(
        joined.len(),
        1,
        "{backend:?}: only the parallel step's job is left"
    );
    assert_eq!(joined[0].path, "0", "{backend:?}");
    assert_eq!(
        joined[0].resume,
        Some(Resume::Branches {
            total: 2,
            done: vec![1],
            failed: Some("branch 1 failed: HTTP 404".into())
        }),
        "{backend:?}"
    );
    let detail = store.run(&t, &run).await.unwrap().expect("the run");
    assert!(
        detail.waits.is_empty(),
        "{backend:?}: the other branch's wait went"
    );
}
