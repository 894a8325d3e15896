//! Parallel branches in the queue: a record that forks parks its job and
//! starts a job per branch, each claimable on its own at once; branches'
//! records write their outputs over the run's context (neither's is lost)
//! and add their actions; the parked job is due exactly when the last
//! branch is done; a failed branch makes it due at once and cancels the
//! other branches' jobs and waits.

use tok_core::for_each::ItemsJoin;
use tok_store::{Resume, StepStatus};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_fork_starts_a_claimable_job_per_branch_and_parks_its_own,
    branches_share_the_context_and_join_once_when_the_last_is_done,
    a_failed_branch_ends_the_join_at_once_and_cancels_the_others,
    items_start_as_others_end_never_more_than_concurrency_at_once,
    a_met_rule_cancels_the_items_in_flight,
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
        items: None,
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
            failed: None,
            items: None,
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
            failed: Some("branch 1 failed: HTTP 404".into()),
            items: None,
        }),
        "{backend:?}"
    );
    let detail = store.run(&t, &run).await.unwrap().expect("the run");
    assert!(
        detail.waits.is_empty(),
        "{backend:?}: the other branch's wait went"
    );
}

fn fork_items(job: &ClaimedJob, total: usize, concurrency: usize, need: usize) -> Record {
    let first = total.min(concurrency);
    let next = NextJob::Fork {
        path: "0".into(),
        branches: (0..first).map(|n| (n, format!("0.items.{n}.0"))).collect(),
        items: Some(ItemsJoin {
            total,
            started: first,
            concurrency,
            need,
            cancelled: Vec::new(),
        }),
    };
    record(job, vec![step("0", StepStatus::Waiting, json!({}))], next)
}

/// Item `n`'s job (at `job.path`) ran its one step and is done.
fn item_done(job: &ClaimedJob, n: usize, failed: Option<&str>) -> Record {
    let mut done = step(&job.path, StepStatus::Completed, json!({ "n": n }));
    done.step_id = "st_ask".into();
    let next = NextJob::BranchDone {
        parallel: "0".into(),
        branch: n,
        failed: failed.map(str::to_owned),
    };
    record(job, vec![done], next)
}

fn item_of(job: &ClaimedJob) -> usize {
    job.path
        .strip_prefix("0.items.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{} is not an item's job", job.path))
}

/// A run whose step `0` forked `total` items, `concurrency` at once, done
/// when `need` are; returns the item jobs it started, claimed.
async fn forked_items(
    store: &dyn Store,
    tenant: &TenantId,
    total: usize,
    concurrency: usize,
    need: usize,
) -> Vec<ClaimedJob> {
    let aut = manual_automation(store, tenant, "a").await;
    start(store, tenant, &aut, "manual", None).await;
    let jobs = claim_all(store, tenant).await;
    let record = fork_items(&jobs[0], total, concurrency, need);
    store.record(&jobs[0], record).await.expect("fork");
    claim_all(store, tenant).await
}

async fn items_start_as_others_end_never_more_than_concurrency_at_once(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let mut running = forked_items(store, &t, 5, 2, 5).await;
    let mut started: Vec<usize> = running.iter().map(item_of).collect();
    started.sort();
    assert_eq!(started, [0, 1], "{backend:?}: the first two items start");
    let mut finished = Vec::new();
    while let Some(job) = running.pop() {
        let n = item_of(&job);
        store
            .record(&job, item_done(&job, n, None))
            .await
            .expect("item done");
        finished.push(n);
        let claimed = claim_all(store, &t).await;
        for job in claimed {
            if job.path == "0" {
                assert_eq!(
                    finished.len(),
                    5,
                    "{backend:?}: joined before every item was done"
                );
                let Some(Resume::Branches {
                    total,
                    done,
                    failed,
                    items,
                }) = &job.resume
                else {
                    panic!(
                        "{backend:?}: the join carries no branches: {:?}",
                        job.resume
                    );
                };
                assert_eq!((*total, failed), (5, &None), "{backend:?}");
                assert_eq!(done, &finished, "{backend:?}: done in the order they were");
                assert_eq!(items.as_ref().map(|i| i.started), Some(5), "{backend:?}");
                for n in 0..5 {
                    let key = format!("_item:0:{n}");
                    assert_eq!(
                        job.context[key.as_str()],
                        json!({ "st_ask": { "n": n } }),
                        "{backend:?}: item {n}'s outputs are kept apart"
                    );
                }
                assert!(job.context.get("st_ask").is_none(), "{backend:?}");
                return;
            }
            started.push(item_of(&job));
            running.push(job);
        }
        assert!(
            running.len() <= 2,
            "{backend:?}: {} items run at once, more than the concurrency of 2",
            running.len()
        );
    }
    panic!("{backend:?}: the items ran out without a join (started {started:?})");
}

async fn a_met_rule_cancels_the_items_in_flight(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let running = forked_items(store, &t, 6, 3, 1).await;
    assert_eq!(running.len(), 3, "{backend:?}");
    let first = &running[1];
    let n = item_of(first);
    store
        .record(first, item_done(first, n, None))
        .await
        .expect("item done");
    let claimed = claim_all(store, &t).await;
    assert_eq!(
        claimed.len(),
        1,
        "{backend:?}: only the join is due, no new item"
    );
    let Some(Resume::Branches { done, items, .. }) = &claimed[0].resume else {
        panic!("{backend:?}: {:?}", claimed[0].resume);
    };
    assert_eq!(done, &vec![n], "{backend:?}");
    let mut cancelled: Vec<usize> = (0..3).filter(|m| *m != n).collect();
    cancelled.sort();
    assert_eq!(
        items.as_ref().map(|i| i.cancelled.clone()),
        Some(cancelled),
        "{backend:?}"
    );
    // A cancelled item's step that was in flight finds its job gone.
    let late = &running[0];
    let recorded = store
        .record(late, item_done(late, item_of(late), None))
        .await;
    assert!(
        recorded.is_err(),
        "{backend:?}: a cancelled item recorded: {recorded:?}"
    );
}
