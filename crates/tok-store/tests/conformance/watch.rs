//! The stuck-run watch's rows (`WatchStore`): jobs whose lease expired
//! three times (and not jobs released or recorded), unfinished runs by
//! automation and age, failing a run that timed out (its job goes, a
//! finished run is left alone), and platform incidents, one per cause
//! while open.

use serde_json::json;
use tok_store::{Cause, NewIncident, NewPlatformIncident, RunFailure, now_ms};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_timed_out_run_fails_and_its_job_goes,
    a_job_whose_lease_expired_three_times_is_found,
    platform_incidents_are_one_per_open_cause,
);

/// A failure with its incident (no event).
fn failure(error: &str) -> RunFailure {
    RunFailure {
        error: error.into(),
        incident: Some(NewIncident {
            source: format!("run-failed:{error}"),
            title: format!("failed: {error}"),
            impact: "none".into(),
            detail: json!({}),
            run_id: None,
            ticket_id: None,
        }),
        event: None,
        cause: Cause::default(),
    }
}

async fn a_timed_out_run_fails_and_its_job_goes(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let a = manual_automation(&*store, &t, "a").await;
    let b = manual_automation(&*store, &t, "b").await;
    let old = start(&*store, &t, &a, "manual", None).await;
    let done = start(&*store, &t, &a, "manual", None).await;
    start(&*store, &t, &b, "manual", None).await;
    store.cancel_run(&t, &done).await.unwrap();

    let later = now_ms() + 60_000;
    let unfinished = store.unfinished_runs(&t, &a, later, 10).await.unwrap();
    assert_eq!(
        unfinished.iter().map(|r| &r.id).collect::<Vec<_>>(),
        [&old],
        "a's unfinished runs only"
    );
    assert!(
        store
            .unfinished_runs(&t, &a, now_ms() - 60_000, 10)
            .await
            .unwrap()
            .is_empty(),
        "none created that long ago"
    );

    assert!(
        store
            .fail_run(&t, &old, failure("run_timeout: too long"), later)
            .await
            .unwrap()
    );
    let failed = store.run(&t, &old).await.unwrap().unwrap().run;
    assert_eq!(failed.status, "failed");
    assert_eq!(failed.error.as_deref(), Some("run_timeout: too long"));
    assert!(
        !store
            .fail_run(&t, &old, failure("again"), later)
            .await
            .unwrap(),
        "a failed run is not failed twice"
    );
    assert!(
        !store
            .fail_run(&t, &done, failure("no"), later)
            .await
            .unwrap()
    );
    let incidents = store.incidents(&t, None, 10, None).await.unwrap().items;
    assert_eq!(
        incidents
            .iter()
            .map(|i| i.title.as_str())
            .collect::<Vec<_>>(),
        ["failed: run_timeout: too long"],
        "one incident, of the run that failed"
    );
    let claimed = store
        .claim(std::slice::from_ref(&t), "n", 10, LONG_LEASE_MS)
        .await
        .unwrap();
    assert!(
        !run_ids(&claimed).contains(&old),
        "the timed-out run's job is gone"
    );
    assert_eq!(claimed.len(), 1, "b's run is still queued");
}

async fn platform_incidents_are_one_per_open_cause(db: &TestDb) {
    let store = db.store().await;
    let incident = |source: &str| NewPlatformIncident {
        reason: "wait_overdue",
        source: source.into(),
        tenant_id: None,
        run_id: None,
        title: "stuck".into(),
        detail: json!({ "n": 1 }),
    };
    let (first, new) = store
        .open_platform_incident(incident("wait_overdue:run_1"), 1_000)
        .await
        .unwrap();
    assert!(new);
    let (again, new) = store
        .open_platform_incident(incident("wait_overdue:run_1"), 2_000)
        .await
        .unwrap();
    assert_eq!((again.as_str(), new), (first.as_str(), false));
    store
        .open_platform_incident(incident("wait_overdue:run_2"), 2_000)
        .await
        .unwrap();
    let open = store
        .platform_incidents(Some("open"), 10, None)
        .await
        .unwrap()
        .items;
    assert_eq!(open.len(), 2);
    let one = open.iter().find(|i| i.id == first).unwrap();
    assert_eq!((one.occurrences, one.updated_at), (2, 2_000));
    assert_eq!(one.detail, json!({ "n": 1 }));

    assert!(
        store
            .resolve_platform_incident(&first, 3_000)
            .await
            .unwrap()
    );
    assert!(
        !store
            .resolve_platform_incident(&first, 3_000)
            .await
            .unwrap()
    );
    let (reopened, new) = store
        .open_platform_incident(incident("wait_overdue:run_1"), 4_000)
        .await
        .unwrap();
    assert!(new && reopened != first);
    assert_eq!(
        store
            .platform_incidents(None, 10, None)
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    assert_eq!(
        store
            .platform_incidents(Some("resolved"), 10, None)
            .await
            .unwrap()
            .items[0]
            .resolved_at,
        Some(3_000)
    );
}

async fn a_job_whose_lease_expired_three_times_is_found(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let a = manual_automation(&*store, &t, "a").await;
    let run = start(&*store, &t, &a, "manual", None).await;
    let tenants = std::slice::from_ref(&t);
    // Released by a restarting node: not an expiry.
    assert_eq!(
        store
            .claim(tenants, "n", 1, LONG_LEASE_MS)
            .await
            .unwrap()
            .len(),
        1
    );
    store.release_claims("n").await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            store
                .claim(tenants, "n", 1, SHORT_LEASE_MS)
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(
            store
                .leases_expired_repeatedly(&t, 10)
                .await
                .unwrap()
                .is_empty()
        );
        tokio::time::sleep(PAST_SHORT_LEASE).await;
    }
    // Claimed a fourth time: the third expiry is counted.
    assert_eq!(
        store
            .claim(tenants, "n", 1, LONG_LEASE_MS)
            .await
            .unwrap()
            .len(),
        1
    );
    let found = store.leases_expired_repeatedly(&t, 10).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((&found[0].run_id, found[0].lease_expiries), (&run, 3));
    let other = tenant(&*store, "other").await;
    assert!(
        store
            .leases_expired_repeatedly(&other, 10)
            .await
            .unwrap()
            .is_empty()
    );
}
