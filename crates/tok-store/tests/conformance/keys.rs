//! API keys on every backend alike: a key is found by its hash until it is
//! revoked, listed by its tenant only, never revoked as its tenant's last
//! admin key; a rotation of the platform admin key revokes every other,
//! never takes a key rotated out back, and two rotations at once leave one.

use tok_store::{AdminKeyState, KeyChange, KeyPatch, NewKey, Scope, hash_secret};

use super::*;

backend_tests!(
    run_on_fresh_db;
    keys_are_found_listed_and_revoked_per_tenant,
    rotating_the_admin_key_revokes_the_others_and_takes_none_back,
    rotations_at_once_leave_one_admin_key,
    a_keys_scopes_change_but_the_last_admin_keeps_admin,
);

async fn a_keys_scopes_change_but_the_last_admin_keeps_admin(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let first = store.keys(&a, 10, None).await.unwrap().items[0].clone();
    let to_read = || KeyPatch {
        scopes: Some(vec![Scope::Read]),
        ..KeyPatch::default()
    };
    assert_eq!(
        store.update_key(&a, &first.id, to_read()).await.unwrap(),
        KeyChange::LastAdmin,
        "{backend:?}"
    );
    assert_eq!(
        store.update_key(&b, &first.id, to_read()).await.unwrap(),
        KeyChange::NotFound,
        "another tenant's key"
    );
    let ci = store
        .create_key(&a, new_key("ci", &[Scope::Read], "s-ci"))
        .await
        .unwrap();
    let KeyChange::Done(renamed) = store
        .update_key(
            &a,
            &ci.id,
            KeyPatch {
                name: Some("deploys".into()),
                scopes: Some(vec![Scope::Admin]),
            },
        )
        .await
        .unwrap()
    else {
        panic!("{backend:?}: the change was refused");
    };
    assert_eq!(
        (renamed.name.as_str(), renamed.scopes.as_slice()),
        ("deploys", &[Scope::Admin][..])
    );
    let found = store
        .key_by_hash(&hash_secret("s-ci"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found, renamed, "the same secret, the new scopes");
    // Now the first may give up `admin`.
    let KeyChange::Done(read) = store.update_key(&a, &first.id, to_read()).await.unwrap() else {
        panic!("{backend:?}: another admin key exists");
    };
    assert_eq!(read.scopes, [Scope::Read]);
    // A revoked key changes no more.
    store.revoke_key(&a, &read.id).await.unwrap();
    assert_eq!(
        store.update_key(&a, &read.id, to_read()).await.unwrap(),
        KeyChange::NotFound
    );
}

fn new_key(name: &str, scopes: &[Scope], secret: &str) -> NewKey {
    NewKey {
        name: name.into(),
        scopes: scopes.to_vec(),
        expires_at: None,
        hash: hash_secret(secret),
    }
}

async fn keys_are_found_listed_and_revoked_per_tenant(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let made = store
        .create_key(&a, new_key("ci", &[Scope::Read, Scope::Signal], "s-ci"))
        .await
        .unwrap();
    let found = store
        .key_by_hash(&hash_secret("s-ci"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found, made, "{backend:?}");
    assert_eq!(found.scopes, [Scope::Read, Scope::Signal]);
    assert_eq!(found.tenant_id.as_ref(), Some(&a));

    let listed = store.keys(&a, 10, None).await.unwrap().items;
    let names: Vec<&str> = listed.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["first key", "ci"], "{backend:?}");
    assert_eq!(listed[0].scopes, [Scope::Admin]);
    assert_eq!(store.keys(&b, 10, None).await.unwrap().items.len(), 1);

    // Another tenant cannot revoke it; its own last admin key stays.
    assert_eq!(
        store.revoke_key(&b, &made.id).await.unwrap(),
        KeyChange::NotFound
    );
    assert_eq!(
        store.revoke_key(&a, &listed[0].id).await.unwrap(),
        KeyChange::LastAdmin,
        "{backend:?}"
    );
    let KeyChange::Done(revoked) = store.revoke_key(&a, &made.id).await.unwrap() else {
        panic!("{backend:?}: the key was not revoked");
    };
    assert!(revoked.revoked_at.is_some());
    assert!(
        store
            .key_by_hash(&hash_secret("s-ci"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(store.keys(&a, 10, None).await.unwrap().items.len(), 1);

    store.touch_key(&listed[0].id, 1_000).await.unwrap();
    let first = &store.keys(&a, 10, None).await.unwrap().items[0];
    assert_eq!(first.last_used_at, Some(1_000), "{backend:?}");
    // A late write of an older use does not move it back.
    store.touch_key(&listed[0].id, 500).await.unwrap();
    let first = &store.keys(&a, 10, None).await.unwrap().items[0];
    assert_eq!(first.last_used_at, Some(1_000), "{backend:?}");
}

async fn rotating_the_admin_key_revokes_the_others_and_takes_none_back(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    assert_eq!(
        store
            .admin_key_state(&hash_secret("generated"))
            .await
            .unwrap(),
        AdminKeyState::Unknown
    );
    store
        .add_admin_key(&hash_secret("generated"))
        .await
        .unwrap();
    assert!(store.has_admin_key().await.unwrap());
    assert_eq!(
        store
            .admin_key_state(&hash_secret("generated"))
            .await
            .unwrap(),
        AdminKeyState::Current
    );
    assert_eq!(
        store.rotate_admin_key(&hash_secret("one")).await.unwrap(),
        1,
        "{backend:?}"
    );
    assert!(
        store
            .key_by_hash(&hash_secret("generated"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        store
            .admin_key_state(&hash_secret("generated"))
            .await
            .unwrap(),
        AdminKeyState::RotatedOut { .. }
    ));
    let one = store
        .key_by_hash(&hash_secret("one"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.tenant_id, None);
    assert_eq!(
        store.rotate_admin_key(&hash_secret("one")).await.unwrap(),
        0,
        "the admin key again revokes nothing"
    );
    assert_eq!(
        store.rotate_admin_key(&hash_secret("two")).await.unwrap(),
        1
    );
    assert!(
        store
            .key_by_hash(&hash_secret("one"))
            .await
            .unwrap()
            .is_none()
    );

    // A key rotated out is never taken back: the current one stays.
    for old in ["one", "generated"] {
        let error = store
            .rotate_admin_key(&hash_secret(old))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("rotated out"), "{backend:?}: {error}");
        assert!(
            store
                .key_by_hash(&hash_secret(old))
                .await
                .unwrap()
                .is_none()
        );
    }
    assert_eq!(
        store.admin_key_state(&hash_secret("two")).await.unwrap(),
        AdminKeyState::Current
    );

    // A tenant's key is not taken over as the admin key.
    let a = tenant(store, "a").await;
    store
        .create_key(&a, new_key("ci", &[Scope::Read], "shared"))
        .await
        .unwrap();
    assert_eq!(
        store.admin_key_state(&hash_secret("shared")).await.unwrap(),
        AdminKeyState::Tenant
    );
    assert!(
        store
            .rotate_admin_key(&hash_secret("shared"))
            .await
            .is_err(),
        "{backend:?}"
    );
    assert!(
        store
            .key_by_hash(&hash_secret("two"))
            .await
            .unwrap()
            .is_some()
    );
}

/// Two processes rotating at once (two stores on one PostgreSQL database;
/// on SQLite, which one process serves, two callers of its store): one
/// admin key is left, whichever rotated last.
async fn rotations_at_once_leave_one_admin_key(db: &TestDb) {
    let a = db.store().await;
    let b = match db.backend {
        Backend::Postgres => db.store().await,
        Backend::Sqlite => a.clone(),
    };
    a.add_admin_key(&hash_secret("first")).await.unwrap();
    for round in 0..5 {
        let (ka, kb) = (format!("a{round}"), format!("b{round}"));
        let (ha, hb) = (hash_secret(&ka), hash_secret(&kb));
        let (ra, rb) = tokio::join!(a.rotate_admin_key(&ha), b.rotate_admin_key(&hb));
        ra.unwrap();
        rb.unwrap();
        let mut current = Vec::new();
        for key in [&ka, &kb] {
            if a.key_by_hash(&hash_secret(key)).await.unwrap().is_some() {
                current.push(key.clone());
            }
        }
        assert_eq!(current.len(), 1, "round {round}: {current:?}");
    }
}
