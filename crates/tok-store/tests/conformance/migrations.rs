//! Migrations (`Store::migrate`): migrating again, from another store too,
//! keeps the data; on PostgreSQL, processes migrating a fresh database at
//! once all succeed, and the JSON written at every step is compressed with
//! lz4 where the server has it.

use super::*;

backend_tests!(
    run_on_fresh_db;
    migrating_again_is_harmless_and_keeps_the_data,
    a_runs_context_and_its_steps_json_are_stored_with_lz4,
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
    let other = tok_store::connect(&db.url, 2, &db.keys)
        .await
        .expect("connect");
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

/// PostgreSQL: a run's context of some kilobytes and its step's output,
/// written by a record, are stored compressed with lz4 (migration 0021),
/// in whichever partition the step row went to. On a server built without
/// lz4 the migration leaves them with pglz, and says so, rather than fail.
async fn a_runs_context_and_its_steps_json_are_stored_with_lz4(db: &TestDb) {
    if db.backend != Backend::Postgres {
        return;
    }
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let (run, job) = claimed_run(&*store, &t).await;
    // About 16 kB of JSON that compresses (a service's answer, repeated).
    let answer: Vec<Value> = (0..200)
        .map(|i| json!({ "item": i, "status": "shipped", "note": "delivered to the address" }))
        .collect();
    let mut record = finish(&job, RunStatus::Completed);
    record.context = json!({ "steps": { "fetch": { "items": answer } } }).into();
    record.steps = vec![step(
        &job.path,
        tok_store::StepStatus::Completed,
        json!({ "items": answer }),
    )];
    store.record(&job, record).await.expect("record");

    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let lz4 = sqlx::query("CREATE TEMPORARY TABLE lz4_probe (c TEXT COMPRESSION lz4)")
        .execute(&mut conn)
        .await
        .is_ok();
    let expected = if lz4 { "lz4" } else { "pglz" };
    for (what, sql) in [
        (
            "the run's context",
            "SELECT pg_column_compression(context) FROM runs WHERE id = $1",
        ),
        (
            "the step's output",
            "SELECT pg_column_compression(output) FROM run_steps WHERE run_id = $1",
        ),
    ] {
        let compression: Option<String> = sqlx::query_scalar(sql)
            .bind(run.as_str())
            .fetch_one(&mut conn)
            .await
            .expect(what);
        assert_eq!(compression.as_deref(), Some(expected), "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_on_a_fresh_postgres_database_all_succeed() {
    // PostgreSQL only: it is the backend many processes share, and the one
    // whose migrations are serialized between processes.
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    for round in 0..3 {
        let db = TestDb::create_empty(Backend::Postgres).await;
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

/// PostgreSQL's migration that partitions the event inbox, applied to a
/// database whose inbox is still one table with rows (as every database
/// made before it): every row comes over into a partition of its month
/// (none into the default partition), and a key taken within the window
/// still deduplicates its retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_is_partitioned_with_its_rows_and_keys_kept_postgres() {
    run_on_fresh_db(Backend::Postgres, async |db: &TestDb| {
        let store = db.store().await;
        let t = tenant(&*store, "acme").await;
        let eshop = source(&*store, &t, "eshop").await;
        let now = tok_store::now_ms();
        let forty_days_ago = now - 40 * 24 * 60 * 60 * 1000;
        // The inbox as it was before the migration (and before the later
        // ones that change it: 28 adds `traceparent`).
        let old_shape = format!(
            "DELETE FROM tok_migrations WHERE version IN (19, 28);
             DROP TABLE event_keys;
             DROP TABLE event_inbox;
             CREATE TABLE event_inbox (
                 id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, source_id TEXT,
                 source_kind TEXT NOT NULL, idempotency_key TEXT NOT NULL,
                 payload JSONB NOT NULL, params JSONB NOT NULL DEFAULT '{{}}',
                 received_at BIGINT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
                 dispatched_at BIGINT, cause_run_id TEXT, depth INTEGER NOT NULL DEFAULT 0,
                 origin_automation_id TEXT, target_automation_id TEXT,
                 event_type TEXT, subject_ticket_id TEXT);
             CREATE UNIQUE INDEX event_inbox_idempotency
                 ON event_inbox (tenant_id, source_kind, source_id, idempotency_key);
             CREATE INDEX event_inbox_pending ON event_inbox (tenant_id, received_at, id)
                 WHERE status = 'pending';
             CREATE INDEX event_inbox_expiry ON event_inbox (tenant_id, received_at)
                 WHERE status <> 'pending';
             INSERT INTO event_inbox (id, tenant_id, source_id, source_kind, idempotency_key,
                 payload, received_at, status, dispatched_at) VALUES
                 ('evt_old', '{t}', '{eshop}', 'webhook', 'k-old', '{{}}', {forty_days_ago},
                  'dispatched', {forty_days_ago}),
                 ('evt_recent', '{t}', '{eshop}', 'webhook', 'k-recent', '{{}}', {now},
                  'pending', NULL),
                 ('evt_internal', '{t}', NULL, 'event', 'evt_internal', '{{}}', {now},
                  'pending', NULL);"
        );
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(&old_shape).execute(&mut conn).await.unwrap();

        store
            .migrate()
            .await
            .expect("the migration runs on the old table");

        let number = async |conn: &mut sqlx::PgConnection, sql: &str| -> i64 {
            sqlx::query_scalar(sql).fetch_one(conn).await.unwrap()
        };
        assert_eq!(
            number(&mut conn, "SELECT COUNT(*) FROM event_inbox").await,
            3
        );
        assert_eq!(
            number(&mut conn, "SELECT COUNT(*) FROM event_inbox_default").await,
            0,
            "every row is in a partition of its month"
        );
        let month = |ms: i64| {
            let at = jiff::Timestamp::from_millisecond(ms)
                .unwrap()
                .to_zoned(jiff::tz::TimeZone::UTC);
            format!("event_inbox_{:04}_{:02}", at.year(), at.month())
        };
        let in_old_month: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {} WHERE id = 'evt_old'",
            month(forty_days_ago)
        ))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(in_old_month, 1);
        assert_eq!(
            number(&mut conn, "SELECT COUNT(*) FROM event_keys").await,
            1,
            "only the key within the window comes over"
        );
        conn.close().await.unwrap();

        let (again, accepted) = store
            .accept_event(&t, webhook_event(&eshop, "k-recent"))
            .await
            .unwrap();
        assert_eq!((again.as_str(), accepted.duplicate), ("evt_recent", true));
        let (new, accepted) = store
            .accept_event(&t, webhook_event(&eshop, "k-old"))
            .await
            .unwrap();
        assert!(!accepted.duplicate && new.as_str() != "evt_old");
    })
    .await;
}
