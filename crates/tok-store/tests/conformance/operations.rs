//! Bulk operations (`OperationStore`): an operation acts on a run once
//! however often it is asked to (a page done again after a restart), counts
//! what it did and what it could not, stops acting once cancelled, and each
//! tenant's oldest running operation is the one its pages come from. A
//! run a bulk retry queues goes after its tenant's live runs, even later
//! ones; a run retried by hand does not.

use super::*;
use tok_store::{Applied, NewOperation, OperationAction, RunAction};

backend_tests!(
    run_on_fresh_db;
    an_operation_acts_on_each_run_once_and_stops_when_cancelled,
    an_operation_whose_count_was_partial_counts_the_runs_it_acts_on,
    a_bulk_retry_goes_after_live_runs_and_a_retry_by_hand_does_not,
);

fn retry_all() -> NewOperation {
    NewOperation {
        action: OperationAction::Retry,
        version: "original".into(),
        filter: json!({ "status": "failed" }),
        total: 2,
        actor: None,
    }
}

async fn an_operation_acts_on_each_run_once_and_stops_when_cancelled(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let other = tenant(store, "beta").await;
    let x = manual_automation(store, &t, "x").await;
    let runs = [
        start(store, &t, &x, "manual", None).await,
        start(store, &t, &x, "manual", None).await,
    ];
    let jobs = store
        .claim(std::slice::from_ref(&t), "node-1", 10, LONG_LEASE_MS)
        .await
        .unwrap();
    for job in &jobs {
        let mut failed = finish(job, RunStatus::Failed);
        failed.steps = vec![step(&job.path, tok_store::StepStatus::Failed, json!({}))];
        failed.error = Some("the step failed".into());
        store.record(job, failed).await.unwrap();
    }

    let op = store.create_operation(&t, retry_all()).await.unwrap();
    // Operations run oldest first by `created_at` (milliseconds), then by
    // id, and two ids made in one millisecond are in no order: `later` is
    // made in a later millisecond.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let later = store.create_operation(&t, retry_all()).await.unwrap();
    let theirs = store.create_operation(&other, retry_all()).await.unwrap();
    let mut running: Vec<_> = store
        .running_operations(&[t.clone(), other.clone()])
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    running.sort();
    let mut oldest = vec![op.id.clone(), theirs.id.clone()];
    oldest.sort();
    assert_eq!(running, oldest, "{backend:?}: each tenant's oldest");

    let retry = RunAction::Retry { version: None };
    assert_eq!(
        store
            .apply(&t, &op.id, &runs[0], retry.clone())
            .await
            .unwrap(),
        Applied::Done(RunStatus::Queued),
        "{backend:?}"
    );
    assert_eq!(
        store
            .apply(&t, &op.id, &runs[0], retry.clone())
            .await
            .unwrap(),
        Applied::Already,
        "{backend:?}: the same run again"
    );
    let run = store.run(&t, &runs[0]).await.unwrap().unwrap();
    assert_eq!(run.run.status, "queued", "{backend:?}");
    assert_eq!(
        store
            .apply(&t, &op.id, &runs[1], RunAction::Refuse("not moved".into()))
            .await
            .unwrap(),
        Applied::Failed("not moved".into()),
        "{backend:?}"
    );
    let seen = store.operation(&t, &op.id).await.unwrap().unwrap();
    assert_eq!(
        (seen.done, seen.failed, seen.status.as_str()),
        (1, 1, "running")
    );
    assert_eq!(
        store.operation_failures(&t, &op.id, 10).await.unwrap(),
        vec![(runs[1].clone(), "not moved".to_owned())],
        "{backend:?}"
    );
    // Another operation acts on the run the first retried: it is not failed.
    match store
        .apply(&t, &later.id, &runs[0], retry.clone())
        .await
        .unwrap()
    {
        Applied::Failed(why) => assert!(why.contains("only a failed run"), "{why}"),
        other => panic!("{backend:?}: {other:?}"),
    }

    store
        .advance_operation(&t, &op.id, Some(runs[1].as_str()), false)
        .await
        .unwrap();
    assert_eq!(
        store
            .operation(&t, &op.id)
            .await
            .unwrap()
            .unwrap()
            .after
            .as_deref(),
        Some(runs[1].as_str())
    );
    store
        .cancel_operation(&t, &later.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .apply(&t, &later.id, &runs[1], retry.clone())
            .await
            .unwrap(),
        Applied::Stopped,
        "{backend:?}: a cancelled operation acts on nothing"
    );
    assert!(matches!(
        store.cancel_operation(&t, &later.id).await,
        Err(StoreError::InvalidState(_))
    ));
    store
        .advance_operation(&t, &op.id, None, true)
        .await
        .unwrap();
    let done = store.operation(&t, &op.id).await.unwrap().unwrap();
    assert_eq!(done.status, "done", "{backend:?}");
    assert!(done.finished_at.is_some());

    // Another tenant reaches none of it.
    assert!(store.operation(&other, &op.id).await.unwrap().is_none());
    assert_eq!(
        store.apply(&other, &op.id, &runs[1], retry).await.unwrap(),
        Applied::Stopped,
        "{backend:?}"
    );
    assert_eq!(store.operations(&t, 10, None).await.unwrap().items.len(), 2);
}

/// An operation made when its count stopped at its call's budget knows
/// fewer runs than it acts on: its `total` grows to what it did.
async fn an_operation_whose_count_was_partial_counts_the_runs_it_acts_on(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let x = manual_automation(store, &t, "x").await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(start(store, &t, &x, "manual", None).await);
    }
    let op = store
        .create_operation(
            &t,
            NewOperation {
                action: OperationAction::Cancel,
                total: 1,
                ..retry_all()
            },
        )
        .await
        .unwrap();
    for run in &runs {
        assert!(
            matches!(
                store
                    .apply(&t, &op.id, run, RunAction::Cancel)
                    .await
                    .unwrap(),
                Applied::Done(_)
            ),
            "{backend:?}"
        );
    }
    let seen = store.operation(&t, &op.id).await.unwrap().unwrap();
    assert_eq!((seen.done, seen.total), (3, 3), "{backend:?}");
}

async fn a_bulk_retry_goes_after_live_runs_and_a_retry_by_hand_does_not(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let tenants = std::slice::from_ref(&t);
    let x = manual_automation(store, &t, "x").await;
    let failed = [
        start(store, &t, &x, "manual", None).await,
        start(store, &t, &x, "manual", None).await,
    ];
    for job in store
        .claim(tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .unwrap()
    {
        let mut done = finish(&job, RunStatus::Failed);
        done.steps = vec![step(&job.path, tok_store::StepStatus::Failed, json!({}))];
        done.error = Some("the step failed".into());
        store.record(&job, done).await.unwrap();
    }
    let op = store.create_operation(&t, retry_all()).await.unwrap();
    let retry = RunAction::Retry { version: None };
    store.apply(&t, &op.id, &failed[0], retry).await.unwrap();
    // A live run that comes after the bulk retry queued its run.
    let live = start(store, &t, &x, "manual", None).await;
    let first = store
        .claim(tenants, "node-1", 1, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(
        run_ids(&first),
        HashSet::from([live.clone()]),
        "{backend:?}: live first"
    );
    let next = store
        .claim(tenants, "node-1", 1, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(
        run_ids(&next),
        HashSet::from([failed[0].clone()]),
        "{backend:?}: then the retried run"
    );

    // Retried by hand, a run ranks as a live one: in the order it came.
    store.retry_run(&t, &failed[1]).await.unwrap();
    let later = start(store, &t, &x, "manual", None).await;
    let first = store
        .claim(tenants, "node-1", 1, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(
        run_ids(&first),
        HashSet::from([failed[1].clone()]),
        "{backend:?}: the run retried by hand, before the later live run {later}"
    );
}
