//! Migrations (`Store::migrate`): migrating again, from another store too,
//! keeps the data; on PostgreSQL, processes migrating a fresh database at
//! once all succeed.

use super::*;

backend_tests!(
    run_on_fresh_db;
    migrating_again_is_harmless_and_keeps_the_data,
);

async fn migrating_again_is_harmless_and_keeps_the_data(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    let run = start(&*store, &t, &aut, "manual", None).await;

    store
        .migrate()
        .await
        .expect("second migrate on the same store");
    let other = tok_store::connect(&db.url, 2).await.expect("connect");
    other.migrate().await.expect("migrate from a second store");

    assert_eq!(
        other.tenant(&t).await.unwrap().map(|x| x.name),
        Some("acme".into())
    );
    assert!(other.run(&t, &run).await.unwrap().is_some(), "{backend:?}");
    let jobs = other
        .claim(std::slice::from_ref(&t), "n", 10, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(run_ids(&jobs), HashSet::from([run]), "{backend:?}");
    drop((store, other));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_on_a_fresh_postgres_database_all_succeed() {
    // PostgreSQL only: it is the backend many processes share, and the one
    // whose migrations are serialized between processes.
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    for round in 0..3 {
        let db = TestDb::create(Backend::Postgres).await;
        let mut stores = Vec::new();
        for _ in 0..4 {
            stores.push(Arc::new(
                PgStore::connect(&db.url, 2).await.expect("connect"),
            ));
        }
        let tasks: Vec<_> = stores
            .iter()
            .map(|s| {
                let s = Arc::clone(s);
                tokio::spawn(async move { s.migrate().await })
            })
            .collect();
        for task in tasks {
            task.await
                .expect("migrate task")
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let store = &*stores[0];
        let t = tenant(store, "acme").await;
        let aut = manual_automation(store, &t, "a").await;
        start(store, &t, &aut, "manual", None).await;
        let jobs = stores[3]
            .claim(&[t], "n", 10, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(jobs.len(), 1, "round {round}");
        drop(stores);
        db.cleanup().await;
    }
}
