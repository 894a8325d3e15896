//! Tenant scoping across the traits: whatever a tenant reads or changes by
//! id or by listing, it never sees or touches another tenant's rows.

use super::*;
use tok_store::TenantPatch;

backend_tests!(
    run_on_fresh_db;
    a_tenant_never_sees_another_tenants_rows,
    suspending_a_tenant_changes_that_tenant_only_and_keeps_its_settings,
    a_tenant_is_renamed_unless_it_is_being_deleted,
);

async fn a_tenant_is_renamed_unless_it_is_being_deleted(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let suspended = TenantPatch {
        suspended: Some(true),
        ..TenantPatch::default()
    };
    store.update_tenant(&a, suspended).await.unwrap();
    let renamed = TenantPatch {
        name: Some("Acme Ltd".into()),
        ..TenantPatch::default()
    };
    let changed = store.update_tenant(&a, renamed).await.unwrap().unwrap();
    assert_eq!(changed.name, "Acme Ltd", "{backend:?}");
    assert!(changed.suspended, "{backend:?}: the settings stay");
    assert_eq!(store.tenant(&a).await.unwrap().unwrap().name, "Acme Ltd");
    assert_eq!(store.tenant(&b).await.unwrap().unwrap().name, "b");
    // A tenant being deleted keeps what it was.
    store.begin_tenant_deletion(&b).await.unwrap();
    let refused = store
        .update_tenant(
            &b,
            TenantPatch {
                name: Some("back".into()),
                ..TenantPatch::default()
            },
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidState(ref m)) if m.contains("being deleted")),
        "{backend:?}: {refused:?}"
    );
    assert_eq!(store.tenant(&b).await.unwrap().unwrap().name, "b");
}

async fn suspending_a_tenant_changes_that_tenant_only_and_keeps_its_settings(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    assert!(!store.tenant(&a).await.unwrap().unwrap().suspended);
    let patch = TenantPatch {
        suspended: Some(true),
        ..TenantPatch::default()
    };
    let changed = store.update_tenant(&a, patch).await.unwrap().unwrap();
    assert!(changed.suspended, "{backend:?}");
    assert!(store.tenant(&a).await.unwrap().unwrap().suspended);
    assert!(
        !store.tenant(&b).await.unwrap().unwrap().suspended,
        "{backend:?}"
    );
    // A patch that leaves `suspended` out keeps it.
    let kept = store
        .update_tenant(&a, TenantPatch::default())
        .await
        .unwrap();
    assert!(kept.unwrap().suspended, "{backend:?}");
    let resumed = TenantPatch {
        suspended: Some(false),
        ..TenantPatch::default()
    };
    let resumed = store.update_tenant(&a, resumed).await.unwrap().unwrap();
    assert!(!resumed.suspended, "{backend:?}");
    // `settings.webhooks` is kept beside the others, and read back.
    let signed = TenantPatch {
        webhooks: Some(tok_store::WebhookSettings {
            require_signature: Some(true),
        }),
        ..TenantPatch::default()
    };
    let signed = store.update_tenant(&a, signed).await.unwrap().unwrap();
    assert_eq!(signed.webhooks.require_signature, Some(true), "{backend:?}");
    assert!(!signed.suspended);
    let read = store.tenant(&a).await.unwrap().unwrap();
    assert!(read.webhooks.requires_signature(false), "{backend:?}");
    let other = store.tenant(&b).await.unwrap().unwrap();
    assert_eq!(other.webhooks.require_signature, None, "{backend:?}");
    let missing = TenantId::from("ten_missing");
    assert!(
        store
            .update_tenant(&missing, TenantPatch::default())
            .await
            .unwrap()
            .is_none()
    );
}

async fn a_tenant_never_sees_another_tenants_rows(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let src_a = source(store, &a, "eshop").await;
    let src_b = source(store, &b, "eshop").await;
    let aut_a = manual_automation(store, &a, "orders").await;
    let aut_b = manual_automation(store, &b, "orders").await;
    let mut runs_a = HashSet::new();
    let mut runs_b = HashSet::new();
    for _ in 0..3 {
        runs_a.insert(start(store, &a, &aut_a, "manual", None).await);
        runs_b.insert(start(store, &b, &aut_b, "manual", None).await);
    }
    let run_b = runs_b.iter().next().unwrap().clone();

    // Reads by id.
    assert!(
        store.run(&a, &run_b).await.unwrap().is_none(),
        "{backend:?}: run"
    );
    assert!(
        store.run(&b, &run_b).await.unwrap().is_some(),
        "{backend:?}: run"
    );
    assert!(
        store.automation(&a, &aut_b).await.unwrap().is_none(),
        "{backend:?}: automation"
    );
    assert!(
        store
            .automation_version(&a, &aut_b, 1)
            .await
            .unwrap()
            .is_none(),
        "{backend:?}"
    );
    assert!(
        store.source(&a, &src_b).await.unwrap().is_none(),
        "{backend:?}: source"
    );
    assert!(
        store.source(&a, &src_a).await.unwrap().is_some(),
        "{backend:?}: source"
    );

    // Listings.
    let listed: HashSet<RunId> = all_runs(store, &a)
        .await
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, runs_a, "{backend:?}: runs");
    let filter = RunFilter {
        automation_id: Some(aut_b.to_string()),
        ..RunFilter::default()
    };
    let page = store.runs(&a, &filter, 50, None).await.unwrap();
    assert!(
        page.items.is_empty(),
        "{backend:?}: runs filtered by b's automation"
    );
    let automations: Vec<_> = store
        .automations(&a)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(automations, vec![aut_a.clone()], "{backend:?}: automations");
    let sources: Vec<_> = store
        .sources(&a)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(sources, vec![src_a.clone()], "{backend:?}: sources");

    // Writes aimed at the other tenant's rows do nothing.
    let paused = store
        .set_automation_status(&a, &aut_b, tok_store::AutomationStatus::Paused)
        .await
        .unwrap();
    assert!(!paused, "{backend:?}: a paused b's automation");
    let saved = store
        .save_version(&a, &aut_b, version("stolen", "manual", None))
        .await;
    assert!(
        matches!(saved, Err(StoreError::NotFound(_))),
        "{backend:?}: {saved:?}"
    );
    let b_aut = store
        .automation(&b, &aut_b)
        .await
        .unwrap()
        .expect("b's automation");
    assert_eq!(
        (b_aut.version, b_aut.name.as_str()),
        (1, "orders"),
        "{backend:?}"
    );
    assert_eq!(
        b_aut.status,
        tok_store::AutomationStatus::Active,
        "{backend:?}"
    );

    // The queue: a claim for a serves a's jobs only, however large the batch.
    let jobs = store
        .claim(std::slice::from_ref(&a), "node-1", 100, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(run_ids(&jobs), runs_a, "{backend:?}: claim");
    assert!(jobs.iter().all(|j| j.tenant_id == a), "{backend:?}");
    let more = store
        .claim(std::slice::from_ref(&a), "node-1", 100, LONG_LEASE_MS)
        .await
        .unwrap();
    assert!(more.is_empty(), "{backend:?}: {more:?}");
    let b_stats = store.queue_stats(std::slice::from_ref(&b)).await.unwrap();
    assert_eq!(
        (b_stats.ready, b_stats.running),
        (3, 0),
        "{backend:?}: b's jobs untouched"
    );
    for run in all_runs(store, &b).await {
        assert_eq!(
            run.status, "queued",
            "{backend:?}: a claim for a touched b's run"
        );
    }
    let jobs_b = store
        .claim(std::slice::from_ref(&b), "node-1", 100, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(run_ids(&jobs_b), runs_b, "{backend:?}");
}
