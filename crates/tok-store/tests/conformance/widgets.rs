//! Widgets: a widget is kept with its request and time to live, its cached
//! answer replaces the one before only when it was fetched later, a name is
//! one widget per tenant, a change of its request or connection drops its
//! cache (one of its time to live keeps it), a deleted widget is gone, and
//! a tenant never reads, changes nor deletes another tenant's widgets; the
//! widgets that call through a connection are found by its id or its name.

use tok_store::{NewWidget, WidgetPatch};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_widget_keeps_its_request_and_its_latest_answer,
    a_name_is_one_widget_per_tenant_and_tenants_never_share_widgets,
    a_new_request_or_connection_drops_the_cache_and_a_deleted_widget_is_gone,
    the_widgets_through_a_connection_are_found_by_its_id_or_its_name,
);

fn new_widget(name: &str) -> NewWidget {
    NewWidget {
        name: name.into(),
        connection: Some("stats".into()),
        request: json!({ "url": "/orders/open", "headers": { "accept": "application/json" } }),
        ttl_ms: 60_000,
    }
}

async fn a_widget_keeps_its_request_and_its_latest_answer(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let created = store
        .create_widget(&acme, new_widget("Open orders"))
        .await
        .unwrap();
    assert_eq!(created.name, "Open orders", "{backend:?}");
    assert_eq!(created.connection.as_deref(), Some("stats"));
    assert_eq!(created.request["headers"]["accept"], "application/json");
    assert_eq!(created.ttl_ms, 60_000);
    assert_eq!(
        (created.data.clone(), created.fetched_at),
        (None, None),
        "{backend:?}: not fetched yet"
    );

    let id = created.id.clone();
    assert!(
        store
            .save_widget_data(&acme, &id, &json!({ "open": 3 }), 2_000)
            .await
            .unwrap()
    );
    let read = store.widget(&acme, &id).await.unwrap().unwrap();
    assert_eq!(read.data, Some(json!({ "open": 3 })), "{backend:?}");
    assert_eq!(read.fetched_at, Some(2_000));

    // A fetch that began earlier and ended later does not replace the newer answer.
    assert!(
        !store
            .save_widget_data(&acme, &id, &json!({ "open": 1 }), 1_000)
            .await
            .unwrap(),
        "{backend:?}"
    );
    assert!(
        store
            .save_widget_data(&acme, &id, &json!("text answer"), 3_000)
            .await
            .unwrap()
    );
    let read = store.widget(&acme, &id).await.unwrap().unwrap();
    assert_eq!(
        (read.data, read.fetched_at),
        (Some(json!("text answer")), Some(3_000)),
        "{backend:?}"
    );

    store
        .create_widget(&acme, new_widget("Backlog"))
        .await
        .unwrap();
    let names: Vec<String> = store
        .widgets(&acme, 50, None)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| w.name)
        .collect();
    assert_eq!(names, ["Backlog", "Open orders"], "{backend:?}: by name");
}

async fn a_name_is_one_widget_per_tenant_and_tenants_never_share_widgets(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let widget = store
        .create_widget(&acme, new_widget("Open orders"))
        .await
        .unwrap();
    let again = store.create_widget(&acme, new_widget("Open orders")).await;
    assert!(
        matches!(again, Err(StoreError::Taken(_))),
        "{backend:?}: {again:?}"
    );
    // Another tenant's widget may have the same name.
    let theirs = store
        .create_widget(&other, new_widget("Open orders"))
        .await
        .unwrap();
    assert_ne!(theirs.id, widget.id);

    assert!(
        store.widget(&other, &widget.id).await.unwrap().is_none(),
        "{backend:?}"
    );
    assert!(
        !store
            .save_widget_data(&other, &widget.id, &json!({ "stolen": true }), 5_000)
            .await
            .unwrap(),
        "{backend:?}: a tenant cannot write another's cache"
    );
    assert_eq!(
        store.widget(&acme, &widget.id).await.unwrap().unwrap().data,
        None
    );
    let ids: Vec<String> = store
        .widgets(&other, 50, None)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(ids, [theirs.id], "{backend:?}");
}

async fn a_new_request_or_connection_drops_the_cache_and_a_deleted_widget_is_gone(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let id = store
        .create_widget(&acme, new_widget("Open orders"))
        .await
        .unwrap()
        .id;
    let cache = async || {
        assert!(
            store
                .save_widget_data(&acme, &id, &json!({ "open": 3 }), 2_000)
                .await
                .unwrap()
        );
    };
    cache().await;

    // A new time to live, and the same request given again: the cache stays.
    let same = WidgetPatch {
        connection: Some(Some("stats".into())),
        request: Some(new_widget("x").request),
        ttl_ms: Some(5_000),
    };
    let kept = store
        .update_widget(&acme, &id, same)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.ttl_ms, 5_000, "{backend:?}");
    assert_eq!(
        (kept.data, kept.fetched_at),
        (Some(json!({ "open": 3 })), Some(2_000)),
        "{backend:?}: nothing the answer depends on changed"
    );

    // Another request: the answer was to the old one.
    let request = WidgetPatch {
        request: Some(json!({ "url": "/orders/late" })),
        ..WidgetPatch::default()
    };
    let changed = store
        .update_widget(&acme, &id, request)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(changed.request, json!({ "url": "/orders/late" }));
    assert_eq!(changed.connection.as_deref(), Some("stats"), "kept");
    assert_eq!(changed.ttl_ms, 5_000, "kept");
    assert_eq!(
        (changed.data, changed.fetched_at),
        (None, None),
        "{backend:?}"
    );

    // Another connection (here none) drops it too.
    cache().await;
    let direct = WidgetPatch {
        connection: Some(None),
        ..WidgetPatch::default()
    };
    let changed = store
        .update_widget(&acme, &id, direct)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(changed.connection, None);
    assert_eq!(changed.data, None, "{backend:?}");
    assert_eq!(store.widget(&acme, &id).await.unwrap().unwrap(), changed);

    // Another tenant changes and deletes nothing.
    let theirs = WidgetPatch {
        ttl_ms: Some(1_000),
        ..WidgetPatch::default()
    };
    assert!(
        store
            .update_widget(&other, &id, theirs)
            .await
            .unwrap()
            .is_none(),
        "{backend:?}"
    );
    assert!(!store.delete_widget(&other, &id).await.unwrap());
    assert_eq!(
        store.widget(&acme, &id).await.unwrap().unwrap().ttl_ms,
        5_000
    );

    assert!(
        store.delete_widget(&acme, &id).await.unwrap(),
        "{backend:?}"
    );
    assert!(store.widget(&acme, &id).await.unwrap().is_none());
    assert!(!store.delete_widget(&acme, &id).await.unwrap(), "gone");
    assert!(
        store
            .update_widget(&acme, &id, WidgetPatch::default())
            .await
            .unwrap()
            .is_none()
    );
    // Its name is free again.
    store
        .create_widget(&acme, new_widget("Open orders"))
        .await
        .unwrap();
}

async fn the_widgets_through_a_connection_are_found_by_its_id_or_its_name(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let globex = tenant(&*store, "globex").await;
    let by_name = |name: &str, connection: Option<&str>| NewWidget {
        connection: connection.map(str::to_owned),
        ..new_widget(name)
    };
    for (name, connection) in [
        ("Refunds", Some("con_stats")),
        ("Open orders", Some("stats")),
        ("Weather", None),
        ("Invoices", Some("billing")),
    ] {
        store
            .create_widget(&acme, by_name(name, connection))
            .await
            .unwrap();
    }
    store
        .create_widget(&globex, by_name("Theirs", Some("stats")))
        .await
        .unwrap();

    let through = store
        .widgets_through(&acme, "con_stats", "stats")
        .await
        .unwrap();
    let names: Vec<&str> = through.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(
        names,
        ["Open orders", "Refunds"],
        "{backend:?}: by id and by name, by name, only the tenant's own"
    );
    assert!(
        store
            .widgets_through(&acme, "con_none", "none")
            .await
            .unwrap()
            .is_empty(),
        "{backend:?}"
    );
}
