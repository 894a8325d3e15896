//! Scenario B's storage per step row, measured (`docs/operations.md`,
//! "Storage at scenario B"): runs of the scenario's shape — 10 steps, an
//! input of about 0.4 kB and an output of 1 to 3 kB of JSON each — are
//! written to `run_steps` on each backend twice, once stored whole and once
//! as the engine stores them (successful steps truncated, one in a hundred
//! kept whole), and the table's size on disk is divided by its rows:
//! `pg_total_relation_size` of every partition (heap, TOAST and indexes)
//! on PostgreSQL, the file's page count on SQLite.
//!
//! A measurement, not a test: it asserts nothing about the sizes and is
//! `#[ignore]`d. Run it with
//! `cargo test --workspace --test storage -- --ignored --nocapture`
//! (`TOK_STORAGE_RUNS`, default 2000, sets the runs per case).

use rand::Rng as _;
use rand::SeedableRng as _;
use serde_json::{Value, json};
use sqlx::types::Json;
use tok_core::retention::{keeps_everything, truncated};
use tok_core::run::StepStatus;
use tok_store::testing::{TestDb, run_on_fresh_db};
use tok_store::{Backend, Store, now_ms};

const WORDS: [&str; 16] = [
    "order", "customer", "shipped", "invoice", "Prague", "pending", "status", "item", "quantity",
    "price", "delivery", "address", "ticket", "reply", "agent", "note",
];

/// JSON text of about `bytes` bytes: a service's answer of items with an
/// id, a random reference (as little compressible as a real one), a few
/// words and an amount.
fn body(rng: &mut rand::rngs::StdRng, bytes: usize) -> Value {
    let mut items = Vec::new();
    let mut size = 40;
    while size < bytes {
        let text: Vec<&str> = (0..rng.random_range(3..9))
            .map(|_| WORDS[rng.random_range(0..WORDS.len())])
            .collect();
        let item = json!({
            "id": rng.random_range(100_000..999_999),
            "ref": format!("{:016x}", rng.random::<u64>()),
            "text": text.join(" "),
            "amount": rng.random_range(0.0..10_000.0_f64),
        });
        size += item.to_string().len() + 1;
        items.push(item);
    }
    json!({ "status": 200, "body": { "items": items } })
}

/// Bytes `run_steps` takes on disk, and `PRAGMA page_count` × page size on
/// SQLite (the whole file: the difference between two readings is the
/// rows written between them).
async fn bytes_on_disk(db: &TestDb) -> i64 {
    match db.backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            sqlx::raw_sql("VACUUM ANALYZE run_steps")
                .execute(&pool)
                .await
                .unwrap();
            let bytes: Option<i64> = sqlx::query_scalar(
                "SELECT SUM(pg_total_relation_size(inhrelid))::BIGINT FROM pg_inherits
                  WHERE inhparent = 'run_steps'::regclass",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            pool.close().await;
            bytes.unwrap_or(0)
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
                .fetch_one(&pool)
                .await
                .unwrap();
            let size: i64 = sqlx::query_scalar("PRAGMA page_size")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            pages * size
        }
    }
}

/// Writes `runs` runs of 10 steps as the engine stores them (`truncate`)
/// or whole; returns the bytes per step row and the mean stored JSON.
async fn measure(db: &TestDb, runs: usize, truncate: bool) -> (f64, f64) {
    let store: std::sync::Arc<dyn Store> = db.store().await;
    let key = tok_store::hash_secret(&tok_store::random_token());
    let tenant = store.create_tenant("storage", &key).await.unwrap().id;
    let before = bytes_on_disk(db).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut stored_json = 0usize;
    let now = now_ms();
    macro_rules! write {
        ($pool:expr) => {{
            for r in 0..runs {
                let run = format!("run_{r:08}");
                let mut tx = $pool.begin().await.unwrap();
                for s in 0..10 {
                    let input = body(&mut rng, 400);
                    let size = rng.random_range(1000..=3000);
                    let output = body(&mut rng, size);
                    let keep = !truncate || rng.random_bool(0.01);
                    let (input, output) = if keeps_everything(StepStatus::Completed, keep) {
                        (input, output)
                    } else {
                        (truncated(&input), truncated(&output))
                    };
                    stored_json += input.to_string().len() + output.to_string().len();
                    sqlx::query(
                        "INSERT INTO run_steps (run_id, tenant_id, path, step_id, type, attempt,
                            status, input, output, error, log, started_at, finished_at,
                            created_at)
                         VALUES ($1, $2, $3, $4, 'http/request', 1, 'completed', $5, $6, NULL,
                            $7, $8, $9, $10)",
                    )
                    .bind(&run)
                    .bind(tenant.as_str())
                    .bind(format!("{s}"))
                    .bind(format!("st_step_{s}"))
                    .bind(Json(&input))
                    .bind(Json(&output))
                    .bind(Json(json!([])))
                    .bind(now + s)
                    .bind(now + s + 120)
                    .bind(now + s + 120)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                }
                tx.commit().await.unwrap();
            }
        }};
    }
    match db.backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            write!(pool);
            pool.close().await;
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            write!(pool);
            pool.close().await;
        }
    }
    drop(store);
    let after = bytes_on_disk(db).await;
    let rows = (runs * 10) as f64;
    ((after - before) as f64 / rows, stored_json as f64 / rows)
}

async fn scenario_b(db: &TestDb) {
    let runs: usize = std::env::var("TOK_STORAGE_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let whole = TestDb::create(db.backend).await;
    let (whole_bytes, whole_json) = measure(&whole, runs, false).await;
    whole.cleanup().await;
    let (truncated_bytes, truncated_json) = measure(db, runs, true).await;
    let per_day = |bytes: f64| bytes * 4.5e6 / 1e9;
    for (case, bytes, json) in [
        ("stored whole", whole_bytes, whole_json),
        ("truncated, 1 % whole", truncated_bytes, truncated_json),
    ] {
        println!(
            "{:?}: {case}: {runs} runs x 10 steps: {bytes:.0} bytes per step row on disk \
             ({json:.0} bytes of input and output JSON); scenario B: {:.1} GB a day, \
             {:.0} GB for 30 days",
            db.backend,
            per_day(bytes),
            per_day(bytes) * 30.0,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn scenario_b_storage_per_step_row_sqlite() {
    run_on_fresh_db(Backend::Sqlite, scenario_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn scenario_b_storage_per_step_row_postgres() {
    run_on_fresh_db(Backend::Postgres, scenario_b).await;
}
