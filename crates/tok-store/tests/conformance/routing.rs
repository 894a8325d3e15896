//! The routed store with tenants on two databases at once (the
//! `postgres_routed` variant of every other test puts them all on one):
//! "Far" on a database of its own, "Near" on the shared one. One dispatch,
//! one claim, one heartbeat and one queue reading span both; each tenant's
//! rows are in its database alone; claims share `limit` between the
//! databases, and a database with more work takes what the other leaves.
//! PostgreSQL only (tenant databases are PostgreSQL).

use tok_core::ids::JobId;
use tok_store::TenantDatabases;
use tok_store::testing::catch_unwind;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dispatch_and_one_claim_span_two_databases_and_each_keeps_its_rows() {
    on_two_databases(async |store, shared, far_db| {
        let near = tenant(store, "Near").await;
        let far = tenant(store, "Far").await;
        let mut tokens = Vec::new();
        for t in [&near, &far] {
            let src = source(store, t, "orders").await;
            tokens.push(store.source(t, &src).await.unwrap().unwrap().token);
            webhook_automation(store, t, "On order", &src).await;
            for i in 0..3 {
                store
                    .accept_event(t, webhook_event(&src, &format!("o{i}")))
                    .await
                    .unwrap();
            }
        }
        // A webhook token names its tenant, whichever database it is on.
        for (token, t) in tokens.iter().zip([&near, &far]) {
            let found = store.source_by_token(token).await.unwrap().unwrap();
            assert_eq!(&found.tenant_id, t);
        }

        let both = [near.clone(), far.clone()];
        let stats = store.queue_stats(&both).await.unwrap();
        assert_eq!(stats.pending_events, 6);
        let taken = dispatch(store, &both, 10, &one_run_per_candidate)
            .await
            .unwrap();
        assert_eq!(taken, 6);
        for (db, t, n) in [
            (shared, &near, 3),
            (shared, &far, 0),
            (far_db, &far, 3),
            (far_db, &near, 0),
        ] {
            assert_eq!(count(db, "runs", t).await, n, "runs of {t} in {}", db.url);
            assert_eq!(count(db, "jobs", t).await, n, "jobs of {t} in {}", db.url);
        }

        // `limit` is shared between the databases, and job ids never clash.
        let first = store
            .claim(&both, "node-1", 4, LONG_LEASE_MS)
            .await
            .unwrap();
        let per =
            |jobs: &[ClaimedJob], t: &TenantId| jobs.iter().filter(|j| &j.tenant_id == t).count();
        assert_eq!((per(&first, &near), per(&first, &far)), (2, 2));
        let second = store
            .claim(&both, "node-1", 4, LONG_LEASE_MS)
            .await
            .unwrap();
        assert_eq!((per(&second, &near), per(&second, &far)), (1, 1));
        let jobs: Vec<ClaimedJob> = first.into_iter().chain(second).collect();
        let ids: HashSet<JobId> = jobs.iter().map(|j| j.id).collect();
        assert_eq!(ids.len(), 6, "job ids clash across the databases");
        let claims: Vec<(JobId, String)> =
            jobs.iter().map(|j| (j.id, j.claim_token.clone())).collect();
        assert_eq!(
            store
                .heartbeat("node-1", &claims, LONG_LEASE_MS)
                .await
                .unwrap()
                .into_iter()
                .collect::<HashSet<JobId>>(),
            ids,
            "every database extends its own"
        );
        assert_eq!(store.queue_stats(&both).await.unwrap().running, 6);
        for job in &jobs {
            store
                .record(job, finish(job, RunStatus::Completed))
                .await
                .unwrap();
        }
        for t in [&near, &far] {
            let runs = all_runs(store, t).await;
            assert_eq!(runs.len(), 3);
            assert!(runs.iter().all(|r| r.status == "completed"), "{runs:?}");
        }
        let stats = store.queue_stats(&both).await.unwrap();
        assert_eq!(
            (stats.ready, stats.running, stats.pending_events),
            (0, 0, 0)
        );

        // What one database cannot fill goes to the other.
        let automation = manual_automation(store, &far, "By hand").await;
        for _ in 0..5 {
            start(store, &far, &automation, "manual", None).await;
        }
        let claimed = store
            .claim(&both, "node-1", 4, LONG_LEASE_MS)
            .await
            .unwrap();
        assert_eq!(per(&claimed, &far), 4);
        // The registry and the keys stay shared.
        assert_eq!(count(far_db, "api_keys", &far).await, 0);
        assert_eq!(count(shared, "api_keys", &far).await, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_routed_by_its_name_is_not_renamed_off_its_database() {
    on_two_databases(async |store, _shared, _far_db| {
        let far = tenant(store, "Far").await;
        let near = tenant(store, "Near").await;
        let renamed = |name: &str| tok_store::TenantPatch {
            name: Some(name.into()),
            ..Default::default()
        };
        let refused = store.update_tenant(&far, renamed("Farther")).await;
        assert!(
            matches!(refused, Err(StoreError::InvalidState(ref m)) if m.contains("routes tenant")),
            "{refused:?}"
        );
        assert_eq!(store.tenant(&far).await.unwrap().unwrap().name, "Far");
        // Nor may another tenant take the name that would move it there.
        let refused = store.update_tenant(&near, renamed("Far")).await;
        assert!(
            matches!(refused, Err(StoreError::InvalidState(_))),
            "{refused:?}"
        );
        // A name that keeps it where it is is fine.
        let kept = store.update_tenant(&near, renamed("Nearer")).await.unwrap();
        assert_eq!(kept.unwrap().name, "Nearer");
    })
    .await;
}

/// Runs `test` on a routed store over two fresh databases: `Far` on the
/// second, every other tenant on the first (shared); both dropped after.
async fn on_two_databases(test: impl AsyncFnOnce(&dyn Store, &TestDb, &TestDb)) {
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let shared = TestDb::create(Backend::Postgres).await;
    let far = TestDb::create(Backend::Postgres).await;
    let routes = TenantDatabases::parse(&format!("Far={}", far.url), "test").unwrap();
    let store =
        tok_store::connect_routed(&shared.url, &routes, 10, &shared.keys, Default::default())
            .await
            .unwrap();
    store.migrate().await.unwrap();
    let outcome = catch_unwind(test(&*store, &shared, &far)).await;
    drop(store);
    shared.cleanup().await;
    far.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Rows of `tenant` in `table` of the database `db`.
async fn count(db: &TestDb, table: &str, tenant: &TenantId) -> i64 {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let sql = format!("SELECT COUNT(*) FROM {table} WHERE tenant_id = $1");
    let n: i64 = sqlx::query_scalar(&sql)
        .bind(tenant.as_str())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    n
}
