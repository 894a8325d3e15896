//! Widgets: a widget is kept with its request and time to live, its cached
//! answer replaces the one before only when it was fetched later, a name is
//! one widget per tenant, and a tenant never reads nor writes another
//! tenant's widgets.

use tok_store::NewWidget;

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_widget_keeps_its_request_and_its_latest_answer,
    a_name_is_one_widget_per_tenant_and_tenants_never_share_widgets,
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
        matches!(again, Err(StoreError::Conflict(_))),
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
