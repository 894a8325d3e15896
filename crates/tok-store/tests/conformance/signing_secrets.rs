//! Webhook signing secrets at rest: a source's `secret` (and the one
//! before a rotation, `previous_secret`) is stored sealed, as connection
//! credentials are, and reads back plain for the signature's check; a
//! rotation of `TOK_SECRET_KEY` (`Reseal::All`) seals them anew under the
//! newest key; a secret stored plain by an older tok is sealed at the next
//! start, and one start that stopped halfway is finished by the next; a
//! secret whose key is gone keeps the source signed and refuses to verify;
//! a sealed secret copied to another source does not open.

use tok_core::ids::SourceId;
use tok_store::secrets::text_sealed_under;
use tok_store::{Keyring, Reseal, SecretError, SourceRotation};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_signing_secret_is_stored_sealed_and_reads_back_plain,
    rotation_seals_signing_secrets_under_the_newest_key,
    plain_signing_secrets_are_sealed_at_start_and_a_halfway_pass_resumes,
    a_signing_secret_whose_key_is_gone_verifies_nothing,
    without_a_key_sqlite_makes_one_and_postgres_refuses_signed_sources,
);

const SECRET: &str = "whsec_conformance_signing_secret";
const NEXT: &str = "whsec_conformance_next_secret";

async fn signed_source(store: &dyn Store, tenant: &TenantId, name: &str) -> (SourceId, String) {
    let token = tok_store::random_token();
    let new = NewSource {
        name: name.into(),
        token: token.clone(),
        params: json!([]),
        critical: false,
        rate_limit: None,
        secret: Some(SECRET.into()),
        verify_preset: Some("standard".into()),
        schema: None,
    };
    let source = store.create_source(tenant, new).await.expect("create");
    assert_eq!(source.secret.as_deref(), Some(SECRET));
    (source.id, token)
}

/// A source's `secret` and `previous_secret` columns as the database holds
/// them.
async fn raw_secrets(db: &TestDb, id: &SourceId) -> (Option<String>, Option<String>) {
    let sql = "SELECT secret, previous_secret FROM sources WHERE id = $1";
    match db.backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            sqlx::query_as(sql)
                .bind(id.as_str())
                .fetch_one(&mut conn)
                .await
                .expect("read the columns")
        }
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("connect");
            sqlx::query_as(sql)
                .bind(id.as_str())
                .fetch_one(&mut conn)
                .await
                .expect("read the columns")
        }
    }
}

fn sealed_under(raw: &Option<String>) -> Option<String> {
    raw.as_deref().and_then(text_sealed_under)
}

async fn a_signing_secret_is_stored_sealed_and_reads_back_plain(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let key = db_key(db, &*store).await;
    let (id, token) = signed_source(&*store, &t, "eshop").await;
    let (secret, previous) = raw_secrets(db, &id).await;
    let raw = secret.clone().unwrap();
    assert!(!raw.contains(SECRET), "{raw}");
    assert_eq!(sealed_under(&secret), key, "{raw}");
    assert_eq!(previous, None);

    // Every read a caller makes gets it plain; the check takes it from there.
    let by_token = store.source_by_token(&token).await.unwrap().unwrap();
    assert_eq!(by_token.secret.as_deref(), Some(SECRET));
    assert_eq!(by_token.secrets(tok_store::now_ms()).unwrap(), [SECRET]);
    let printed = format!("{by_token:?}");
    assert!(
        !printed.contains(SECRET) && !printed.contains(&token),
        "{printed}"
    );
    let read = store.source(&t, &id).await.unwrap().unwrap();
    assert_eq!(read.secret.as_deref(), Some(SECRET));
    assert_eq!(
        store.sources(&t).await.unwrap()[0].secret.as_deref(),
        Some(SECRET)
    );

    // A rotation with an overlap keeps the one before, sealed too, and
    // both verify during it.
    let until = tok_store::now_ms() + 3_600_000;
    let rotated = store
        .rotate_source(
            &t,
            &id,
            SourceRotation {
                token: None,
                secret: Some(NEXT.into()),
                until,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        rotated.secrets(tok_store::now_ms()).unwrap(),
        [NEXT, SECRET]
    );
    let (secret, previous) = raw_secrets(db, &id).await;
    for raw in [&secret, &previous] {
        let text = raw.clone().unwrap();
        assert!(!text.contains(SECRET) && !text.contains(NEXT), "{text}");
        assert_eq!(sealed_under(raw), key, "{text}");
    }
    let read = store.source_by_token(&token).await.unwrap().unwrap();
    assert_eq!(read.secrets(tok_store::now_ms()).unwrap(), [NEXT, SECRET]);

    // Signing an unsigned source later seals its secret too.
    let plain = source(&*store, &t, "plain").await;
    let signed = store
        .update_source(
            &t,
            &plain,
            tok_store::SourcePatch {
                verify: Some(("github".into(), SECRET.into())),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(signed.secret.as_deref(), Some(SECRET));
    let (secret, _) = raw_secrets(db, &plain).await;
    assert!(!secret.clone().unwrap().contains(SECRET));
    assert_eq!(sealed_under(&secret), key);

    // A sealed secret copied to another source does not open there.
    let copied = raw_sql(
        db,
        &format!(
            "UPDATE sources SET secret = (SELECT secret FROM sources WHERE id = '{}') \
             WHERE id = '{}'",
            id, plain
        ),
    )
    .await;
    assert_eq!(copied, 1);
    let moved = store.source(&t, &plain).await.unwrap().unwrap();
    assert!(moved.secret.is_some(), "it still reads as signed");
    let error = moved.secrets(tok_store::now_ms()).unwrap_err();
    assert!(matches!(error, SecretError::Broken { .. }), "{error}");
    assert!(!error.to_string().contains(NEXT), "{error}");
}

/// The id of the key this database's store seals under.
async fn db_key(db: &TestDb, _store: &dyn Store) -> Option<String> {
    match db.backend {
        Backend::Postgres => Some(db.keys.ids()[0].to_owned()),
        // SQLite seals under its key file's key: known by what it sealed.
        Backend::Sqlite => {
            let file = db.url.trim_start_matches("sqlite://").to_owned() + ".key";
            let text = std::fs::read_to_string(&file).expect("the key file");
            Some(Keyring::parse(text.trim(), &file).unwrap().ids()[0].to_owned())
        }
    }
}

async fn rotation_seals_signing_secrets_under_the_newest_key(db: &TestDb) {
    let (old, _) = Keyring::generate();
    let (new, _) = Keyring::generate();
    let (old_id, new_id) = (old.ids()[0].to_owned(), new.ids()[0].to_owned());
    let store = db.store_with_keys(&old).await;
    let t = tenant(&*store, "acme").await;
    let (id, token) = signed_source(&*store, &t, "eshop").await;
    source(&*store, &t, "unsigned").await;
    store
        .rotate_source(
            &t,
            &id,
            SourceRotation {
                token: None,
                secret: Some(NEXT.into()),
                until: tok_store::now_ms() + 3_600_000,
            },
        )
        .await
        .unwrap();
    let (secret, previous) = raw_secrets(db, &id).await;
    assert_eq!(sealed_under(&secret), Some(old_id.clone()));
    assert_eq!(sealed_under(&previous), Some(old_id.clone()));
    drop(store);

    let both = db.store_with_keys(&new.then(&old)).await;
    let done = both.seal_credentials(Reseal::All).await.expect("rotate");
    let sealed: u64 = done.iter().map(|d| d.signing_secrets).sum();
    assert_eq!(sealed, 1, "one source, both of its secrets: {done:?}");
    let (secret, previous) = raw_secrets(db, &id).await;
    assert_eq!(sealed_under(&secret), Some(new_id.clone()));
    assert_eq!(sealed_under(&previous), Some(new_id.clone()));
    let again = both.seal_credentials(Reseal::All).await.unwrap();
    assert_eq!(again.iter().map(|d| d.signing_secrets).sum::<u64>(), 0);
    drop(both);

    // The old key can go: the secrets still verify.
    let newest = db.store_with_keys(&new).await;
    let read = newest.source_by_token(&token).await.unwrap().unwrap();
    assert_eq!(read.secrets(tok_store::now_ms()).unwrap(), [NEXT, SECRET]);
}

async fn plain_signing_secrets_are_sealed_at_start_and_a_halfway_pass_resumes(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let mut ids = Vec::new();
    // More than one page of the start's batches (100).
    for i in 0..105 {
        ids.push(source(&*store, &t, &format!("s{i:03}")).await);
    }
    let (sealed_id, _) = signed_source(&*store, &t, "sealed").await;
    let (sealed_before, _) = raw_secrets(db, &sealed_id).await;
    // As an older tok stored them: plain, the current one and the one
    // before a rotation.
    let plain = "UPDATE sources SET secret = 'whsec_plain_' || name, \
                 previous_secret = 'whsec_before_' || name, previous_secret_until = 1 \
                 WHERE name <> 'sealed'";
    assert_eq!(raw_sql(db, plain).await, 105);
    assert_eq!(
        raw_secrets(db, &ids[7]).await.0.as_deref(),
        Some("whsec_plain_s007")
    );
    drop(store);

    let started = db.store().await;
    for id in [&ids[0], &ids[99], &ids[100], &ids[104]] {
        let (secret, previous) = raw_secrets(db, id).await;
        for raw in [&secret, &previous] {
            let text = raw.clone().unwrap();
            assert!(!text.contains("whsec_"), "{id}: {text}");
            assert!(sealed_under(raw).is_some(), "{id}: {text}");
        }
    }
    let read = started.source(&t, &ids[104]).await.unwrap().unwrap();
    assert_eq!(read.secret.as_deref(), Some("whsec_plain_s104"));
    assert_eq!(read.previous_secret.as_deref(), Some("whsec_before_s104"));
    // What was sealed already stays as it was.
    assert_eq!(raw_secrets(db, &sealed_id).await.0, sealed_before);

    // A pass that stopped halfway (some rows sealed, some plain again) is
    // finished by the next start, which seals only what is left.
    let halfway = format!(
        "UPDATE sources SET secret = 'whsec_left_' || name WHERE id IN ('{}', '{}')",
        ids[3], ids[101]
    );
    assert_eq!(raw_sql(db, &halfway).await, 2);
    let untouched = raw_secrets(db, &ids[50]).await;
    started.migrate().await.expect("start again");
    assert_eq!(raw_secrets(db, &ids[50]).await, untouched);
    for (id, name) in [(&ids[3], "s003"), (&ids[101], "s101")] {
        let (secret, _) = raw_secrets(db, id).await;
        assert!(sealed_under(&secret).is_some(), "{secret:?}");
        let read = started.source(&t, id).await.unwrap().unwrap();
        assert_eq!(read.secret, Some(format!("whsec_left_{name}")));
    }
    let done = started.seal_credentials(Reseal::Plain).await.unwrap();
    assert_eq!(done.iter().map(|d| d.signing_secrets).sum::<u64>(), 0);
}

async fn a_signing_secret_whose_key_is_gone_verifies_nothing(db: &TestDb) {
    let (lost, _) = Keyring::generate();
    let (kept, _) = Keyring::generate();
    let store = db.store_with_keys(&lost).await;
    let t = tenant(&*store, "acme").await;
    let (id, token) = signed_source(&*store, &t, "eshop").await;
    drop(store);

    let store = db.store_with_keys(&kept).await;
    let read = store.source_by_token(&token).await.unwrap().unwrap();
    assert_eq!(read.id, id);
    // Still signed: never taken for a source that checks nothing.
    assert!(read.secret.is_some());
    assert_ne!(read.secret.as_deref(), Some(SECRET));
    let error = read.secrets(tok_store::now_ms()).unwrap_err();
    assert!(
        matches!(&error, SecretError::UnknownKey { key, .. } if key == lost.ids()[0]),
        "{error}"
    );
    assert!(error.to_string().contains("source `eshop`"), "{error}");
    // A listing still answers.
    assert_eq!(store.sources(&t).await.unwrap().len(), 1);
}

async fn without_a_key_sqlite_makes_one_and_postgres_refuses_signed_sources(db: &TestDb) {
    let store = db.store_with_keys(&Keyring::default()).await;
    let t = tenant(&*store, "acme").await;
    source(&*store, &t, "unsigned").await;
    let new = NewSource {
        name: "eshop".into(),
        token: tok_store::random_token(),
        params: json!([]),
        critical: false,
        rate_limit: None,
        secret: Some(SECRET.into()),
        verify_preset: None,
        schema: None,
    };
    let created = store.create_source(&t, new).await;
    match db.backend {
        Backend::Sqlite => {
            let created = created.expect("SQLite seals under its key file");
            let (secret, _) = raw_secrets(db, &created.id).await;
            assert!(sealed_under(&secret).is_some(), "{secret:?}");
        }
        Backend::Postgres => {
            let error = created.unwrap_err();
            assert!(
                matches!(error, StoreError::Secret(SecretError::NoKey)),
                "{error}"
            );
            assert!(error.to_string().contains("TOK_SECRET_KEY"), "{error}");
            assert_eq!(store.sources(&t).await.unwrap().len(), 1, "nothing stored");
        }
    }
}
