//! A tenant's concurrency cap (`settings.limits.concurrency`): claims by
//! any number of holders never lease more of its jobs at once than its
//! cap; each end of a lease (a record, an expiry, a release, a cancel)
//! gives a slot back; a dispatch hands its node no more first steps than
//! the cap leaves; a tenant without a cap, and any other tenant, claims as
//! before.

use super::*;
use tok_store::{TenantLimits, TenantPatch};

backend_tests!(
    run_on_fresh_db;
    claims_by_two_holders_lease_no_more_than_the_cap,
    a_record_gives_a_slot_back,
    an_expired_lease_gives_a_slot_back,
    a_release_and_a_cancel_give_slots_back,
    a_tenant_without_a_cap_and_another_tenant_are_unaffected,
    a_dispatch_hands_its_node_no_more_than_the_cap_leaves,
    a_cap_removed_lets_the_backlog_be_claimed,
);

async fn set_cap(store: &dyn Store, tenant: &TenantId, cap: Option<u32>) {
    let patch = TenantPatch {
        limits: Some(TenantLimits {
            concurrency: cap,
            ..TenantLimits::default()
        }),
        ..TenantPatch::default()
    };
    let changed = store
        .update_tenant(tenant, patch)
        .await
        .expect("update tenant")
        .expect("the tenant");
    assert_eq!(changed.limits.concurrency, cap);
}

/// A tenant capped at `cap` with `jobs` ready jobs (one run each).
async fn capped(store: &dyn Store, name: &str, cap: Option<u32>, jobs: usize) -> TenantId {
    let t = tenant(store, name).await;
    set_cap(store, &t, cap).await;
    let aut = manual_automation(store, &t, "a").await;
    for _ in 0..jobs {
        start(store, &t, &aut, "manual", None).await;
    }
    t
}

async fn claim(store: &dyn Store, tenants: &[TenantId], node: &str, lease: i64) -> Vec<ClaimedJob> {
    store.claim(tenants, node, 10, lease).await.expect("claim")
}

async fn claims_by_two_holders_lease_no_more_than_the_cap(db: &TestDb) {
    let backend = db.backend;
    let store: Arc<dyn Store> = db.store().await;
    let t = capped(&*store, "acme", Some(2), 10).await;
    // Two holders claim at once, again and again, with room for 10 each.
    let holders: Vec<_> = (0..2)
        .map(|i| {
            let store = Arc::clone(&store);
            let tenants = vec![t.clone()];
            tokio::spawn(async move {
                let mut claimed = Vec::new();
                for _ in 0..5 {
                    claimed.extend(
                        store
                            .claim(&tenants, &format!("node-{i}"), 10, LONG_LEASE_MS)
                            .await
                            .expect("claim"),
                    );
                }
                claimed
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for holder in holders {
        claimed.extend(holder.await.expect("holder task"));
    }
    assert_eq!(
        claimed.len(),
        2,
        "{backend:?}: two holders leased {} jobs of a tenant capped at 2",
        claimed.len()
    );
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!((stats.ready, stats.running), (8, 2), "{backend:?}");
}

async fn a_record_gives_a_slot_back(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = capped(store, "acme", Some(2), 10).await;
    let tenants = [t.clone()];
    let held = claim(store, &tenants, "node-1", LONG_LEASE_MS).await;
    assert_eq!(held.len(), 2, "{backend:?}");
    assert!(
        claim(store, &tenants, "node-2", LONG_LEASE_MS)
            .await
            .is_empty()
    );

    store
        .record(&held[0], finish(&held[0], RunStatus::Completed))
        .await
        .expect("record");
    let next = claim(store, &tenants, "node-2", LONG_LEASE_MS).await;
    assert_eq!(next.len(), 1, "{backend:?}: the recorded job's slot");
    assert!(
        claim(store, &tenants, "node-1", LONG_LEASE_MS)
            .await
            .is_empty(),
        "{backend:?}: the cap is full again"
    );
}

async fn an_expired_lease_gives_a_slot_back(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = capped(store, "acme", Some(2), 10).await;
    let tenants = [t.clone()];
    // One job under a short lease (a worker that will die), one under a long.
    let dying = store
        .claim(&tenants, "node-1", 1, SHORT_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(dying.len(), 1, "{backend:?}");
    let living = claim(store, &tenants, "node-2", LONG_LEASE_MS).await;
    assert_eq!(living.len(), 1, "{backend:?}: one slot was left");
    assert!(
        claim(store, &tenants, "node-3", LONG_LEASE_MS)
            .await
            .is_empty()
    );

    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let after = claim(store, &tenants, "node-3", LONG_LEASE_MS).await;
    assert_eq!(after.len(), 1, "{backend:?}: the expired lease's slot");
    assert!(
        claim(store, &tenants, "node-3", LONG_LEASE_MS)
            .await
            .is_empty(),
        "{backend:?}"
    );
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(stats.running, 2, "{backend:?}");
}

async fn a_release_and_a_cancel_give_slots_back(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = capped(store, "acme", Some(2), 10).await;
    let tenants = [t.clone()];
    let held = claim(store, &tenants, "node-1", LONG_LEASE_MS).await;
    assert_eq!(held.len(), 2, "{backend:?}");

    // node-1 restarts: both its leases are released.
    assert_eq!(store.release_claims("node-1").await.expect("release"), 2);
    let again = claim(store, &tenants, "node-2", LONG_LEASE_MS).await;
    assert_eq!(again.len(), 2, "{backend:?}: the released slots");
    assert!(
        claim(store, &tenants, "node-3", LONG_LEASE_MS)
            .await
            .is_empty()
    );

    // A run cancelled while its step runs gives its slot back.
    store
        .cancel_run(&t, &again[0].run_id)
        .await
        .expect("cancel");
    let next = claim(store, &tenants, "node-3", LONG_LEASE_MS).await;
    assert_eq!(next.len(), 1, "{backend:?}: the cancelled run's slot");
    assert_ne!(next[0].run_id, again[0].run_id, "{backend:?}");
}

async fn a_tenant_without_a_cap_and_another_tenant_are_unaffected(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let full = capped(store, "capped", Some(2), 10).await;
    let free = capped(store, "free", None, 10).await;
    let other = capped(store, "other", Some(20), 10).await;
    let held = claim(store, std::slice::from_ref(&full), "node-1", LONG_LEASE_MS).await;
    assert_eq!(held.len(), 2, "{backend:?}");

    // One claim over all three: the capped tenant at its cap takes nothing,
    // the others share the batch.
    let tenants = [full.clone(), free.clone(), other.clone()];
    let mut claimed: Vec<ClaimedJob> = Vec::new();
    loop {
        let more = claim(store, &tenants, "node-2", LONG_LEASE_MS).await;
        if more.is_empty() {
            break;
        }
        claimed.extend(more);
    }
    let count = |t: &TenantId| claimed.iter().filter(|j| &j.tenant_id == t).count();
    assert_eq!(
        (count(&full), count(&free), count(&other)),
        (0, 10, 10),
        "{backend:?}: only the tenant at its cap waits"
    );
}

async fn a_dispatch_hands_its_node_no_more_than_the_cap_leaves(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    set_cap(store, &t, Some(2)).await;
    let src = source(store, &t, "eshop").await;
    webhook_automation(store, &t, "orders", &src).await;
    for n in 0..5 {
        store
            .accept_event(&t, webhook_event(&src, &format!("order-{n}")))
            .await
            .expect("accept");
    }
    // One job already leased: the dispatch may hand one more.
    let aut = manual_automation(store, &t, "a").await;
    start(store, &t, &aut, "manual", None).await;
    let held = claim(store, std::slice::from_ref(&t), "node-0", LONG_LEASE_MS).await;
    assert_eq!(held.len(), 1, "{backend:?}");

    let mut take = |_: &TenantId| true;
    let (taken, handed) = dispatch_claiming(
        store,
        std::slice::from_ref(&t),
        10,
        &one_run_per_candidate,
        Some(("node-1", &mut take)),
    )
    .await
    .expect("dispatch");
    assert_eq!(taken, 5, "{backend:?}");
    assert_eq!(handed.len(), 1, "{backend:?}: the cap left room for one");
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!(
        (stats.ready, stats.running),
        (4, 2),
        "{backend:?}: the runs not handed wait, ready"
    );
    assert!(
        claim(store, std::slice::from_ref(&t), "node-2", LONG_LEASE_MS)
            .await
            .is_empty(),
        "{backend:?}"
    );
}

async fn a_cap_removed_lets_the_backlog_be_claimed(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = capped(store, "acme", Some(1), 5).await;
    let tenants = [t.clone()];
    assert_eq!(
        claim(store, &tenants, "node-1", LONG_LEASE_MS).await.len(),
        1
    );
    assert!(
        claim(store, &tenants, "node-1", LONG_LEASE_MS)
            .await
            .is_empty()
    );
    set_cap(store, &t, None).await;
    assert_eq!(
        claim(store, &tenants, "node-1", LONG_LEASE_MS).await.len(),
        4,
        "{backend:?}"
    );
}
