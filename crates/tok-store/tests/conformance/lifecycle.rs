//! Sources and automations change and go on every backend alike: a patch
//! sets what it names only; a rotation keeps the token and secret it
//! replaces for the overlap and no longer; a deleted source's token opens
//! nothing; an archived automation leaves the listing, matches no event,
//! keeps its versions and cannot be resumed.

use tok_store::{AutomationStatus, SourcePatch, SourceRotation, now_ms};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_source_changes_rotates_and_goes_per_tenant,
    a_sources_sender_and_schema_are_kept_and_changed,
    an_archived_automation_is_listed_nowhere_and_matches_nothing,
);

async fn a_source_changes_rotates_and_goes_per_tenant(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let id = source(store, &a, "eshop").await;
    let first = store.source(&a, &id).await.unwrap().unwrap();

    // Another tenant reaches nothing.
    let patch = SourcePatch {
        name: Some("taken".into()),
        ..SourcePatch::default()
    };
    assert!(
        store
            .update_source(&b, &id, patch.clone())
            .await
            .unwrap()
            .is_none()
    );
    assert!(!store.delete_source(&b, &id).await.unwrap());

    let changed = store
        .update_source(
            &a,
            &id,
            SourcePatch {
                rate_limit: Some(Some(7)),
                ..SourcePatch::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (changed.name.as_str(), changed.rate_limit, changed.critical),
        ("eshop", Some(7), false),
        "{backend:?}: only what the patch names changes"
    );
    let cleared = store
        .update_source(
            &a,
            &id,
            SourcePatch {
                rate_limit: Some(None),
                ..patch
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((cleared.name.as_str(), cleared.rate_limit), ("taken", None));

    // A rotation with an overlap: both tokens open the source until it ends.
    let until = now_ms() + 60_000;
    let rotated = store
        .rotate_source(
            &a,
            &id,
            SourceRotation {
                token: Some("tok-new".into()),
                secret: None,
                until,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rotated.token, "tok-new");
    assert_eq!(rotated.previous_token_until, Some(until), "{backend:?}");
    assert_eq!(rotated.previous_secret_until, None, "no secret to keep");
    for token in [first.token.as_str(), "tok-new"] {
        let found = store.source_by_token(token).await.unwrap();
        assert_eq!(found.map(|s| s.id), Some(id.clone()), "{backend:?} {token}");
    }
    // One that has ended: the token before opens nothing.
    store
        .rotate_source(
            &a,
            &id,
            SourceRotation {
                token: Some("tok-newer".into()),
                secret: None,
                until: now_ms() - 1,
            },
        )
        .await
        .unwrap()
        .unwrap();
    for token in [first.token.as_str(), "tok-new"] {
        assert!(
            store.source_by_token(token).await.unwrap().is_none(),
            "{backend:?}"
        );
    }

    // A deleted source opens nothing.
    assert!(store.delete_source(&a, &id).await.unwrap());
    assert!(store.source_by_token("tok-newer").await.unwrap().is_none());
    assert!(store.source(&a, &id).await.unwrap().is_none());
}

/// The sender a source checks and the schema it carries are read back as
/// written, a patch sets or clears the schema alone, and a source without
/// a sender gets one (with its secret) once.
async fn a_sources_sender_and_schema_are_kept_and_changed(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let schema = json!({ "type": "object", "required": ["id"] });
    let signed = store
        .create_source(
            &a,
            NewSource {
                name: "stripe".into(),
                token: tok_store::random_token(),
                params: json!([]),
                critical: false,
                rate_limit: None,
                secret: Some("whsec_stripe_signing_secret".into()),
                verify_preset: Some("stripe".into()),
                schema: Some(schema.clone()),
            },
        )
        .await
        .unwrap();
    let read = store.source(&a, &signed.id).await.unwrap().unwrap();
    assert_eq!(read.verify_preset.as_deref(), Some("stripe"), "{backend:?}");
    assert_eq!(read.schema.as_ref(), Some(&schema), "{backend:?}");
    let by_token = store.source_by_token(&read.token).await.unwrap().unwrap();
    assert_eq!(by_token.schema.as_ref(), Some(&schema), "{backend:?}");

    // Another tenant changes nothing; the schema goes, the rest stays.
    let clear = SourcePatch {
        schema: Some(None),
        ..SourcePatch::default()
    };
    assert!(
        store
            .update_source(&b, &signed.id, clear.clone())
            .await
            .unwrap()
            .is_none()
    );
    let cleared = store
        .update_source(&a, &signed.id, clear)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cleared.schema, None, "{backend:?}");
    assert_eq!(cleared.verify_preset.as_deref(), Some("stripe"));
    assert_eq!(
        cleared.secret.as_deref(),
        Some("whsec_stripe_signing_secret")
    );

    // An unsigned source is given a sender and its secret.
    let plain = source(store, &a, "plain").await;
    let before = store.source(&a, &plain).await.unwrap().unwrap();
    assert_eq!((before.verify_preset, before.secret), (None, None));
    let given = store
        .update_source(
            &a,
            &plain,
            SourcePatch {
                verify: Some(("github".into(), "a-github-webhook-secret".into())),
                ..SourcePatch::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        given.verify_preset.as_deref(),
        Some("github"),
        "{backend:?}"
    );
    assert_eq!(given.secret.as_deref(), Some("a-github-webhook-secret"));
    assert_eq!(given.schema, None);
}

async fn an_archived_automation_is_listed_nowhere_and_matches_nothing(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let src = source(store, &a, "eshop").await;
    let kept = webhook_automation(store, &a, "kept", &src).await;
    let gone = webhook_automation(store, &a, "gone", &src).await;
    assert!(
        store
            .set_automation_status(&a, &gone, AutomationStatus::Archived)
            .await
            .unwrap()
    );
    // Archived stays archived.
    assert!(
        !store
            .set_automation_status(&a, &gone, AutomationStatus::Active)
            .await
            .unwrap(),
        "{backend:?}"
    );
    let listed = store.automations_page(&a, 10, None).await.unwrap().items;
    let ids: Vec<&AutomationId> = listed.iter().map(|r| &r.id).collect();
    assert_eq!(ids, [&kept], "{backend:?}");
    let row = store.automation(&a, &gone).await.unwrap().unwrap();
    assert_eq!(row.status, AutomationStatus::Archived);
    assert!(
        store
            .automation_version(&a, &gone, 1)
            .await
            .unwrap()
            .is_some()
    );

    let (_, accepted) = store
        .accept_event(&a, webhook_event(&src, "k1"))
        .await
        .unwrap();
    assert!(!accepted.duplicate);
    let mut tx = store
        .begin_dispatch(std::slice::from_ref(&a), Lane::Urgent)
        .await
        .unwrap();
    let pending = tx.pending_events(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    let candidates = tx.candidates(&pending[0]).await.unwrap();
    let matched: Vec<&AutomationId> = candidates.iter().map(|c| &c.automation_id).collect();
    assert_eq!(
        matched,
        [&kept],
        "{backend:?}: the archived one matches nothing"
    );
}
