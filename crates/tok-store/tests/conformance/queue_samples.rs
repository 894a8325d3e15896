//! Queue samples: one statement writes a sample for every tenant (its jobs
//! by state, its pending events, the age of its oldest ready job and the
//! step attempts recorded since its sample before), a tenant reads only its
//! own, and the expiry deletes a tenant's old samples only.

use tok_store::{QueueSample, StepStatus};

use super::*;

backend_tests!(
    run_on_fresh_db;
    one_statement_samples_every_tenants_queue_and_the_steps_since_its_sample_before,
    the_expiry_deletes_a_tenants_old_samples_only,
);

/// Ends a claimed job's run with one step of `status`.
fn end_with(job: &ClaimedJob, step_status: StepStatus, status: RunStatus) -> Record {
    Record {
        steps: vec![step(&job.path, step_status, json!({}))],
        ..finish(job, status)
    }
}

async fn samples(store: &dyn Store, tenant: &TenantId, since: i64) -> Vec<QueueSample> {
    store
        .queue_samples(tenant, since, 100)
        .await
        .expect("samples")
}

async fn one_statement_samples_every_tenants_queue_and_the_steps_since_its_sample_before(
    db: &TestDb,
) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let globex = tenant(&*store, "globex").await;
    let idle = tenant(&*store, "idle").await;
    let all = [acme.clone(), globex.clone(), idle.clone()];

    // Acme: three runs; two are claimed, one completes and one fails.
    let aut = manual_automation(&*store, &acme, "a").await;
    for _ in 0..3 {
        start(&*store, &acme, &aut, "manual", None).await;
    }
    let jobs = store
        .claim(std::slice::from_ref(&acme), "n", 2, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 2);
    store
        .record(
            &jobs[0],
            end_with(&jobs[0], StepStatus::Completed, RunStatus::Completed),
        )
        .await
        .unwrap();
    store
        .record(
            &jobs[1],
            end_with(&jobs[1], StepStatus::Failed, RunStatus::Failed),
        )
        .await
        .unwrap();
    // Globex: a ready run and an event not dispatched yet.
    let aut = manual_automation(&*store, &globex, "g").await;
    start(&*store, &globex, &aut, "manual", None).await;
    let src = source(&*store, &globex, "shop").await;
    store
        .accept_event(&globex, webhook_event(&src, "o-1"))
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(5)).await;
    let first = tok_store::now_ms();
    let written = store.sample_queue(&all, first, 60_000).await.unwrap();
    assert_eq!(written, 3, "{backend:?}: one row per tenant");
    let again = store.sample_queue(&all, first, 60_000).await.unwrap();
    assert_eq!(
        again, 0,
        "{backend:?}: a tenant's sample at a time is kept once"
    );

    let a = samples(&*store, &acme, 0).await;
    assert_eq!(a.len(), 1, "{backend:?}");
    let a0 = &a[0];
    assert_eq!(
        (a0.at, a0.ready, a0.scheduled, a0.running, a0.pending_events),
        (first, 1, 0, 0, 0),
        "{backend:?}: {a0:?}"
    );
    assert!(
        a0.oldest_ready_ms.is_some_and(|ms| ms >= 0),
        "{backend:?}: {a0:?}"
    );
    assert_eq!(
        (a0.steps_completed, a0.steps_failed, a0.window_ms),
        (1, 1, 60_000),
        "{backend:?}: with no sample before, the window given"
    );
    let g = samples(&*store, &globex, 0).await;
    assert_eq!(
        g.iter()
            .map(|s| (s.ready, s.pending_events, s.steps_completed))
            .collect::<Vec<_>>(),
        [(1, 1, 0)],
        "{backend:?}"
    );
    let i = samples(&*store, &idle, 0).await;
    assert_eq!(
        i,
        [QueueSample {
            at: first,
            ready: 0,
            scheduled: 0,
            running: 0,
            pending_events: 0,
            oldest_ready_ms: None,
            steps_completed: 0,
            steps_failed: 0,
            window_ms: 60_000,
        }],
        "{backend:?}"
    );

    // Acme's last run completes: the next sample counts only that step,
    // over the time since the first sample.
    let jobs = store
        .claim(std::slice::from_ref(&acme), "n", 5, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    store
        .record(
            &jobs[0],
            end_with(&jobs[0], StepStatus::Completed, RunStatus::Completed),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = tok_store::now_ms();
    assert_eq!(store.sample_queue(&all, second, 60_000).await.unwrap(), 3);
    let a = samples(&*store, &acme, 0).await;
    let counted: Vec<_> = a
        .iter()
        .map(|s| {
            (
                s.at,
                s.ready,
                s.oldest_ready_ms,
                s.steps_completed,
                s.steps_failed,
                s.window_ms,
            )
        })
        .collect();
    assert_eq!(
        counted,
        [
            (first, 1, a[0].oldest_ready_ms, 1, 1, 60_000),
            (second, 0, None, 1, 0, second - first)
        ],
        "{backend:?}: oldest first"
    );
    assert_eq!(
        samples(&*store, &acme, first + 1).await.len(),
        1,
        "{backend:?}: from `since` on"
    );
    let newest = store.queue_samples(&acme, 0, 1).await.unwrap();
    assert_eq!(
        newest.iter().map(|s| s.at).collect::<Vec<_>>(),
        [second],
        "{backend:?}: the newest within the limit"
    );

    // A sample of one tenant writes nothing of the others'.
    let third = second + 1;
    assert_eq!(
        store
            .sample_queue(std::slice::from_ref(&idle), third, 60_000)
            .await
            .unwrap(),
        1
    );
    assert_eq!(samples(&*store, &acme, third).await, [], "{backend:?}");
    assert_eq!(samples(&*store, &idle, third).await.len(), 1, "{backend:?}");
    assert_eq!(
        store.sample_queue(&[], third + 1, 60_000).await.unwrap(),
        0,
        "{backend:?}: no tenants, no rows"
    );
}

async fn the_expiry_deletes_a_tenants_old_samples_only(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let globex = tenant(&*store, "globex").await;
    let both = [acme.clone(), globex.clone()];
    let now = tok_store::now_ms();
    let day = 24 * 3600 * 1000;
    let times = [now - 2 * day, now - day - 1, now - 3600 * 1000, now];
    for at in times {
        assert_eq!(store.sample_queue(&both, at, 30_000).await.unwrap(), 2);
    }
    // A sample before that is older than the window does not widen it.
    let acme_samples = samples(&*store, &acme, 0).await;
    assert_eq!(
        acme_samples.iter().map(|s| s.window_ms).collect::<Vec<_>>(),
        [30_000; 4],
        "{backend:?}"
    );

    assert_eq!(
        store
            .expire_queue_samples(&acme, now - day, 1)
            .await
            .unwrap(),
        1,
        "{backend:?}: at most the limit"
    );
    assert_eq!(
        store
            .expire_queue_samples(&acme, now - day, 1000)
            .await
            .unwrap(),
        1,
        "{backend:?}"
    );
    assert_eq!(
        store
            .expire_queue_samples(&acme, now - day, 1000)
            .await
            .unwrap(),
        0,
        "{backend:?}"
    );
    let left = |s: Vec<QueueSample>| s.iter().map(|s| s.at).collect::<Vec<_>>();
    assert_eq!(
        left(samples(&*store, &acme, 0).await),
        &times[2..],
        "{backend:?}"
    );
    assert_eq!(
        left(samples(&*store, &globex, 0).await),
        times,
        "{backend:?}: another tenant's samples stay"
    );
}
