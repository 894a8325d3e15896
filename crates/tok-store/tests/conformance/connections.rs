//! Connections' credentials at rest: what is written reads back equal and
//! the column holds none of it in plain text (read with plain SQL); a
//! sealed credential moved to another connection or tenant does not open;
//! `Reseal::All` moves every credential to the newest key, after which the
//! old key can go; plain credentials from before are sealed by the
//! migration at start, in batches; and without a key, SQLite makes its key
//! file while PostgreSQL refuses credentials (and takes connections without).
//! A change replaces what it names and keeps the rest, seals new
//! credentials under the newest key, and reaches no other tenant; a
//! deleted connection is gone with its slots. A change judged against the
//! base URL and credentials it read (a move of the base URL) writes
//! nothing once they changed meanwhile.

use tok_store::{
    Admission, ConnectionPatch, ExpectedConnection, Keyring, NewConnection, Reseal, SecretError,
};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_credential_reads_back_equal_and_is_stored_sealed,
    a_sealed_credential_moved_to_another_row_does_not_open,
    rotation_reseals_under_the_newest_key_so_the_old_one_can_go,
    plain_credentials_are_sealed_by_the_migration_in_batches,
    without_a_key_sqlite_makes_one_and_postgres_refuses_credentials,
    a_change_replaces_what_it_names_and_seals_new_credentials_under_the_newest_key,
    a_deleted_connection_is_gone_with_its_slots,
    credentials_whose_key_was_lost_are_replaced_by_a_change,
    a_change_judged_against_what_was_read_is_refused_once_that_changed,
);

const SECRET: &str = "sk_live_conformance_secret";

fn credentials() -> Value {
    json!({ "bearer": SECRET, "headers": { "X-Shop": "also-secret" } })
}

fn connection(name: &str, credentials: Value) -> NewConnection {
    NewConnection {
        name: name.into(),
        service: "http".into(),
        base_url: Some("https://api.shop.test".into()),
        credentials,
        rate: None,
        burst: 1,
        max_concurrency: None,
        breaker_threshold: 5,
        breaker_cooldown_ms: 30_000,
    }
}

/// The `credentials` column of connection `id`, as the database holds it.
async fn raw_credentials(db: &TestDb, id: &str) -> String {
    match db.backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            sqlx::query_scalar("SELECT credentials::text FROM connections WHERE id = $1")
                .bind(id)
                .fetch_one(&mut conn)
                .await
                .expect("read the column")
        }
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("connect");
            sqlx::query_scalar("SELECT credentials FROM connections WHERE id = $1")
                .bind(id)
                .fetch_one(&mut conn)
                .await
                .expect("read the column")
        }
    }
}

/// The `credentials` column of connection `id`, as JSON.
async fn raw_credentials_json(db: &TestDb, id: &str) -> Value {
    serde_json::from_str(&raw_credentials(db, id).await).unwrap()
}

/// The id of the key the column of connection `id` names.
async fn sealed_under(db: &TestDb, id: &str) -> Option<String> {
    let raw: Value = serde_json::from_str(&raw_credentials(db, id).await).unwrap();
    tok_store::secrets::sealed_under(&raw).map(str::to_owned)
}

/// How many credentials `seal_credentials` sealed, over every database.
fn total(done: &[tok_store::Resealed]) -> u64 {
    done.iter().map(|d| d.resealed).sum()
}

async fn a_credential_reads_back_equal_and_is_stored_sealed(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let created = store
        .create_connection(&t, connection("shop", credentials()))
        .await
        .expect("create");
    assert_eq!(created.credentials, credentials());
    assert!(created.has_credentials);
    let read = store.connection(&t, "shop").await.unwrap().expect("found");
    assert_eq!(read.credentials, credentials());
    let raw = raw_credentials(db, &created.id).await;
    assert!(!raw.contains(SECRET), "{raw}");
    assert!(!raw.contains("also-secret"), "{raw}");
    assert!(raw.contains("\"sealed\""), "{raw}");
    // A listing opens nothing, and says there are credentials.
    let page = store.connections(&t, 10, None).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].credentials, Value::Null);
    assert!(page.items[0].has_credentials);
    // Nothing of them prints.
    let printed = format!("{read:?} {:?}", connection("x", credentials()));
    assert!(!printed.contains(SECRET), "{printed}");
    // A connection without credentials stores none, sealed or not.
    let bare = store
        .create_connection(&t, connection("bare", json!({})))
        .await
        .unwrap();
    assert!(!bare.has_credentials);
    let raw: Value = serde_json::from_str(&raw_credentials(db, &bare.id).await).unwrap();
    assert_eq!(raw, json!({}));
}

async fn a_sealed_credential_moved_to_another_row_does_not_open(db: &TestDb) {
    let store = db.store().await;
    let a = tenant(&*store, "acme").await;
    let b = tenant(&*store, "globex").await;
    let sealed = store
        .create_connection(&a, connection("shop", credentials()))
        .await
        .unwrap();
    let sibling = store
        .create_connection(&a, connection("other", json!({})))
        .await
        .unwrap();
    let foreign = store
        .create_connection(&b, connection("shop", json!({})))
        .await
        .unwrap();
    let copied = raw_sql(
        db,
        &format!(
            "UPDATE connections SET credentials = \
             (SELECT credentials FROM connections WHERE id = '{}') WHERE id IN ('{}', '{}')",
            sealed.id, sibling.id, foreign.id
        ),
    )
    .await;
    assert_eq!(copied, 2);
    for (tenant, name) in [(&a, "other"), (&b, "shop")] {
        let error = store.connection(tenant, name).await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Secret(SecretError::Broken { owner, .. })
                if *owner == format!("the credentials of connection `{name}`")),
            "{error}"
        );
        assert!(!error.to_string().contains(SECRET), "{error}");
    }
    // The original still opens.
    let read = store.connection(&a, "shop").await.unwrap().unwrap();
    assert_eq!(read.credentials, credentials());
}

async fn rotation_reseals_under_the_newest_key_so_the_old_one_can_go(db: &TestDb) {
    let (old, _) = Keyring::generate();
    let (new, _) = Keyring::generate();
    let (old_id, new_id) = (old.ids()[0].to_owned(), new.ids()[0].to_owned());
    let store = db.store_with_keys(&old).await;
    let t = tenant(&*store, "acme").await;
    let shop = store
        .create_connection(&t, connection("shop", credentials()))
        .await
        .unwrap();
    store
        .create_connection(&t, connection("bare", json!({})))
        .await
        .unwrap();
    assert_eq!(sealed_under(db, &shop.id).await, Some(old_id.clone()));
    drop(store);

    // The new key first, the old one after it: the old seal still opens.
    let both = db.store_with_keys(&new.then(&old)).await;
    let read = both.connection(&t, "shop").await.unwrap().unwrap();
    assert_eq!(read.credentials, credentials());
    let done = both.seal_credentials(Reseal::All).await.expect("rotate");
    assert_eq!(total(&done), 1, "{done:?}");
    assert!(
        done.iter().all(|d| d.key.as_deref() == Some(&*new_id)),
        "{done:?}"
    );
    assert_eq!(sealed_under(db, &shop.id).await, Some(new_id.clone()));
    let raw = raw_credentials(db, &shop.id).await;
    assert!(!raw.contains(SECRET), "{raw}");
    let again = both
        .seal_credentials(Reseal::All)
        .await
        .expect("rotate again");
    assert_eq!(total(&again), 0, "{again:?}");
    drop(both);

    // The old key can go.
    let newest = db.store_with_keys(&new).await;
    let read = newest.connection(&t, "shop").await.unwrap().unwrap();
    assert_eq!(read.credentials, credentials());
    drop(newest);

    // With the old key alone, the error names the key it lacks.
    let stale = db.store_with_keys(&old).await;
    let error = stale.connection(&t, "shop").await.unwrap_err().to_string();
    assert!(error.contains(&new_id), "{error}");
    assert!(error.contains("TOK_SECRET_KEY"), "{error}");
    assert!(error.contains("`shop`"), "{error}");
}

async fn plain_credentials_are_sealed_by_the_migration_in_batches(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    // More than one page of the migration's batches (100).
    let mut ids = Vec::new();
    for i in 0..130 {
        let c = store
            .create_connection(&t, connection(&format!("c{i:03}"), json!({})))
            .await
            .unwrap();
        ids.push(c.id);
    }
    // As a database from before credentials were sealed holds them.
    let plain = match db.backend {
        Backend::Postgres => {
            "UPDATE connections SET credentials = ('{\"bearer\":\"sk_plain_' || name || '\"}')::jsonb"
        }
        Backend::Sqlite => {
            "UPDATE connections SET credentials = '{\"bearer\":\"sk_plain_' || name || '\"}'"
        }
    };
    assert_eq!(raw_sql(db, plain).await, 130);
    assert!(raw_credentials(db, &ids[7]).await.contains("sk_plain_c007"));
    drop(store);

    let started = db.store().await;
    for id in [&ids[0], &ids[99], &ids[100], &ids[129]] {
        let raw = raw_credentials(db, id).await;
        assert!(!raw.contains("sk_plain"), "{id}: {raw}");
        assert!(sealed_under(db, id).await.is_some(), "{id}: {raw}");
    }
    let read = started.connection(&t, "c129").await.unwrap().unwrap();
    assert_eq!(read.credentials, json!({ "bearer": "sk_plain_c129" }));

    // Once sealed, a start seals nothing again.
    let before = raw_credentials(db, &ids[5]).await;
    started.migrate().await.expect("migrate again");
    let done = started.seal_credentials(Reseal::Plain).await.unwrap();
    assert_eq!(total(&done), 0, "{done:?}");
    assert_eq!(raw_credentials(db, &ids[5]).await, before);
}

async fn without_a_key_sqlite_makes_one_and_postgres_refuses_credentials(db: &TestDb) {
    let store = db.store_with_keys(&Keyring::default()).await;
    let t = tenant(&*store, "acme").await;
    store
        .create_connection(&t, connection("bare", json!({})))
        .await
        .expect("a connection without credentials needs no key");
    let created = store
        .create_connection(&t, connection("shop", credentials()))
        .await;
    match db.backend {
        Backend::Sqlite => {
            let created = created.expect("SQLite seals under its key file");
            let file = db.url.trim_start_matches("sqlite://").to_owned() + ".key";
            assert!(std::path::Path::new(&file).exists(), "{file}");
            assert!(sealed_under(db, &created.id).await.is_some());
            drop(store);
            // The next start reads the same file.
            let again = db.store_with_keys(&Keyring::default()).await;
            let read = again.connection(&t, "shop").await.unwrap().unwrap();
            assert_eq!(read.credentials, credentials());
        }
        Backend::Postgres => {
            let error = created.unwrap_err();
            assert!(
                matches!(error, StoreError::Secret(SecretError::NoKey)),
                "{error}"
            );
            assert!(error.to_string().contains("TOK_SECRET_KEY"), "{error}");
            assert!(store.connection(&t, "shop").await.unwrap().is_none());
            // Rotation without a key says so.
            let error = store.seal_credentials(Reseal::All).await.unwrap_err();
            assert!(error.to_string().contains("TOK_SECRET_KEY"), "{error}");
        }
    }
}

async fn a_change_replaces_what_it_names_and_seals_new_credentials_under_the_newest_key(
    db: &TestDb,
) {
    let backend = db.backend;
    let (old, _) = Keyring::generate();
    let (new, _) = Keyring::generate();
    let new_id = new.ids()[0].to_owned();
    let store = db.store_with_keys(&old).await;
    let t = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let limited = NewConnection {
        rate: Some(5.0),
        burst: 5,
        max_concurrency: Some(2),
        ..connection("shop", credentials())
    };
    let shop = store.create_connection(&t, limited).await.unwrap();
    drop(store);

    let store = db.store_with_keys(&new.then(&old)).await;
    let rotated = json!({ "bearer": "sk_live_rotated" });
    let patch = ConnectionPatch {
        base_url: Some(Some("https://api2.shop.test".into())),
        credentials: Some(rotated.clone()),
        rate: Some(None),
        burst: Some(3),
        ..ConnectionPatch::default()
    };
    let printed = format!("{patch:?}");
    assert!(!printed.contains("sk_live_rotated"), "{printed}");
    let changed = store
        .update_connection(&t, &shop.id, patch)
        .await
        .unwrap()
        .expect("the connection");
    assert_eq!(changed.credentials, Value::Null, "{backend:?}: not opened");
    assert!(changed.has_credentials);
    assert_eq!(
        (changed.base_url.as_deref(), changed.rate, changed.burst),
        (Some("https://api2.shop.test"), None, 3),
        "{backend:?}"
    );
    assert_eq!(
        (
            changed.max_concurrency,
            changed.breaker_threshold,
            changed.name.as_str(),
            changed.service.as_str()
        ),
        (Some(2), 5, "shop", "http"),
        "{backend:?}: what the change does not name stays"
    );
    assert_eq!(sealed_under(db, &shop.id).await, Some(new_id));
    let raw = raw_credentials(db, &shop.id).await;
    assert!(!raw.contains("sk_live_rotated"), "{raw}");
    let read = store.connection(&t, "shop").await.unwrap().unwrap();
    assert_eq!(read.credentials, rotated, "{backend:?}");

    // Limits: the cap removed, the breaker changed; credentials removed.
    let patch = ConnectionPatch {
        max_concurrency: Some(None),
        breaker_threshold: Some(9),
        breaker_cooldown_ms: Some(1_000),
        credentials: Some(json!({})),
        ..ConnectionPatch::default()
    };
    let changed = store
        .update_connection(&t, &shop.id, patch)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            changed.max_concurrency,
            changed.breaker_threshold,
            changed.breaker_cooldown_ms
        ),
        (None, 9, 1_000)
    );
    assert!(!changed.has_credentials, "{backend:?}");
    assert_eq!(raw_credentials_json(db, &shop.id).await, json!({}));
    assert_eq!(
        changed.base_url.as_deref(),
        Some("https://api2.shop.test"),
        "kept"
    );

    // Another tenant's id changes nothing.
    let theirs = ConnectionPatch {
        base_url: Some(None),
        ..ConnectionPatch::default()
    };
    assert!(
        store
            .update_connection(&other, &shop.id, theirs)
            .await
            .unwrap()
            .is_none(),
        "{backend:?}"
    );
    let read = store.connection(&t, &shop.id).await.unwrap().unwrap();
    assert_eq!(read.base_url.as_deref(), Some("https://api2.shop.test"));
    drop(store);

    // Without a key, PostgreSQL refuses new credentials and writes nothing.
    if backend == Backend::Postgres {
        let keyless = db.store_with_keys(&Keyring::default()).await;
        let patch = ConnectionPatch {
            credentials: Some(credentials()),
            burst: Some(7),
            ..ConnectionPatch::default()
        };
        let error = keyless
            .update_connection(&t, &shop.id, patch)
            .await
            .unwrap_err();
        assert!(
            matches!(error, StoreError::Secret(SecretError::NoKey)),
            "{error}"
        );
        let read = keyless.connection(&t, &shop.id).await.unwrap().unwrap();
        assert_eq!((read.burst, read.has_credentials), (3, false));
    }
}

async fn a_deleted_connection_is_gone_with_its_slots(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let capped = NewConnection {
        max_concurrency: Some(1),
        ..connection("shop", credentials())
    };
    let shop = store.create_connection(&t, capped).await.unwrap();
    let admitted = store
        .admit(&t, &shop.id, tok_core::ids::JobId(1), LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(admitted, Admission::Go);

    assert!(
        !store.delete_connection(&other, &shop.id).await.unwrap(),
        "{backend:?}: another tenant's"
    );
    assert!(store.connection(&t, "shop").await.unwrap().is_some());
    assert!(store.delete_connection(&t, &shop.id).await.unwrap());
    assert!(store.connection(&t, "shop").await.unwrap().is_none());
    assert!(
        !store.delete_connection(&t, &shop.id).await.unwrap(),
        "gone"
    );
    let slots = raw_sql(
        db,
        &format!(
            "DELETE FROM connection_slots WHERE connection_id = '{}'",
            shop.id
        ),
    )
    .await;
    assert_eq!(slots, 0, "{backend:?}: its slots went with it");

    // The name is free again, and the new one's cap starts empty.
    let again = NewConnection {
        max_concurrency: Some(1),
        ..connection("shop", json!({}))
    };
    let again = store.create_connection(&t, again).await.unwrap();
    let admitted = store
        .admit(&t, &again.id, tok_core::ids::JobId(2), LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(admitted, Admission::Go, "{backend:?}");
}

async fn credentials_whose_key_was_lost_are_replaced_by_a_change(db: &TestDb) {
    let backend = db.backend;
    let (lost, _) = Keyring::generate();
    let (kept, _) = Keyring::generate();
    let store = db.store_with_keys(&lost).await;
    let t = tenant(&*store, "acme").await;
    let shop = store
        .create_connection(&t, connection("shop", credentials()))
        .await
        .unwrap();
    drop(store);

    let store = db.store_with_keys(&kept).await;
    let error = store.connection(&t, "shop").await.unwrap_err();
    assert!(
        matches!(error, StoreError::Secret(SecretError::UnknownKey { .. })),
        "{backend:?}: {error}"
    );
    let unopened = store
        .connection_unopened(&t, "shop")
        .await
        .unwrap()
        .expect("found without opening");
    assert_eq!(
        (
            unopened.id.as_str(),
            unopened.credentials.clone(),
            unopened.has_credentials
        ),
        (shop.id.as_str(), Value::Null, true),
        "{backend:?}"
    );
    let other = tenant(&*store, "other").await;
    assert!(
        store
            .connection_unopened(&other, &shop.id)
            .await
            .unwrap()
            .is_none()
    );

    let fresh = json!({ "bearer": "sk_live_fresh" });
    let patch = ConnectionPatch {
        credentials: Some(fresh.clone()),
        ..ConnectionPatch::default()
    };
    store.update_connection(&t, &shop.id, patch).await.unwrap();
    let read = store.connection(&t, "shop").await.unwrap().unwrap();
    assert_eq!(read.credentials, fresh, "{backend:?}");
}

async fn a_change_judged_against_what_was_read_is_refused_once_that_changed(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let shop = store
        .create_connection(&t, connection("shop", json!({})))
        .await
        .unwrap();
    // Judged while the connection held no credentials...
    let judged = ExpectedConnection {
        base_url: Some("https://api.shop.test".into()),
        has_credentials: false,
    };
    // ...which were given meanwhile.
    store
        .update_connection(
            &t,
            &shop.id,
            ConnectionPatch {
                credentials: Some(credentials()),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    let moved = store
        .update_connection(
            &t,
            &shop.id,
            ConnectionPatch {
                base_url: Some(Some("https://elsewhere.test".into())),
                expect: Some(judged),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(&moved, Err(StoreError::Changed(m)) if m.contains("changed")),
        "{moved:?}"
    );
    let held = store.connection(&t, "shop").await.unwrap().unwrap();
    assert_eq!(held.base_url.as_deref(), Some("https://api.shop.test"));
    assert_eq!(held.credentials, credentials());

    // Judged against what it holds now, the change applies.
    let now = ExpectedConnection {
        base_url: Some("https://api.shop.test".into()),
        has_credentials: true,
    };
    let moved = store
        .update_connection(
            &t,
            &shop.id,
            ConnectionPatch {
                base_url: Some(Some("https://elsewhere.test".into())),
                credentials: Some(json!({})),
                expect: Some(now),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(moved.base_url.as_deref(), Some("https://elsewhere.test"));
    assert!(!moved.has_credentials);
    // Another tenant's connection of that id is not found, expected or not.
    let other = tenant(&*store, "globex").await;
    let theirs = store
        .update_connection(
            &other,
            &shop.id,
            ConnectionPatch {
                base_url: Some(Some("https://x.test".into())),
                expect: Some(ExpectedConnection {
                    base_url: Some("https://elsewhere.test".into()),
                    has_credentials: false,
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(theirs.is_none());
}
