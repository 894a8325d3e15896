//! The SQLite write-ahead log of a real `tok serve` stays in bounds: after
//! a burst of webhooks that writes several times `TOK_SQLITE_WAL_LIMIT`
//! through the log, the `-wal` file is back under the limit once the node
//! is idle; after a few writes more and a clean shutdown (SIGTERM) it is
//! empty or gone, so the database is one file again. The figures under sustained load are
//! `tok bench --only wal` (docs/performance.md).

mod support;

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::Duration;

use serde_json::json;
use sqlx::sqlite::SqliteConnectOptions;
use tok_store::Backend;
use tok_store::testing::TestDb;

use support::{ADMIN_KEY, Api, Server, free_port};

/// The limit the test's node runs with: 1 MiB, the smallest allowed.
const LIMIT: u64 = 1024 * 1024;

fn size(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// The database file of a `sqlite://` URL, and its `-wal` beside it.
fn files(url: &str) -> (PathBuf, PathBuf) {
    let db = PathBuf::from(url.trim_start_matches("sqlite://"));
    let mut wal = db.clone().into_os_string();
    wal.push("-wal");
    (db, PathBuf::from(wal))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_returns_under_its_limit_once_idle_and_is_gone_after_a_clean_shutdown() {
    let db = TestDb::create(Backend::Sqlite).await;
    let (db_file, wal_file) = files(&db.url);
    let port = free_port();
    let api = Api::new(port);
    let mut server = Server::start(
        &db.url,
        port,
        &[],
        &[("TOK_SQLITE_WAL_LIMIT", "1MiB"), ("TOK_CONCURRENCY", "8")],
    );
    api.wait_ready().await;
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Busy" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let source = api
        .post("/api/sources", &key, json!({ "name": "shop" }))
        .await;
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": "Note",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "steps": [
                { "id": "st_note", "type": "set", "config": { "values": { "seen": "{{_body.n}}" } } },
                { "id": "st_log", "type": "flow/log", "config": { "message": "order {{_body.n}}" } }
            ]
        }),
    )
    .await;
    let db_before = size(&db_file).unwrap_or(0);

    // A burst: 300 webhooks of 4 KB, 16 at a time, each an inbox row and
    // a run of two steps.
    let url = source["url"].as_str().unwrap().to_owned();
    let padding = "x".repeat(4096);
    for first in (0..300).step_by(16) {
        let mut batch = tokio::task::JoinSet::new();
        for n in first..(first + 16).min(300) {
            let request = api
                .http
                .post(&url)
                .json(&json!({ "n": n, "padding": padding }));
            batch.spawn(async move { request.send().await.map(|r| r.status().as_u16()) });
        }
        while let Some(sent) = batch.join_next().await {
            assert_eq!(sent.unwrap().ok(), Some(202));
        }
    }

    // Idle: every run done, and the log back under the limit.
    let mut wal = u64::MAX;
    for _ in 0..300 {
        let runs = api.get("/api/runs?status=completed&limit=500", &key).await;
        let done = runs["items"].as_array().map_or(0, Vec::len);
        wal = size(&wal_file).unwrap_or(0);
        if done >= 300 && wal <= LIMIT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        wal <= LIMIT,
        "the idle node's WAL is {wal} bytes, over its limit of {LIMIT}"
    );
    let written = size(&db_file).unwrap_or(0).saturating_sub(db_before);
    assert!(
        written > 2 * LIMIT,
        "the burst wrote {written} bytes into the database through the log: more than twice \
         the limit, or the test shows nothing"
    );

    // Another process has the database open (an operator's `sqlite3`, a
    // backup tool), so tok's connections are not the last to close: only
    // tok's own checkpoint at shutdown empties the log, not SQLite's
    // clean-up at the last close.
    let options = SqliteConnectOptions::from_str(&db.url)
        .unwrap()
        .read_only(true);
    let mut other = sqlx::ConnectOptions::connect(&options).await.unwrap();
    let (pages,): (i64,) = sqlx::query_as("PRAGMA page_count")
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(pages > 0);

    // A few writes more, under the limit: the log holds them at the stop.
    for n in 300..310 {
        let sent = api
            .http
            .post(&url)
            .json(&json!({ "n": n }))
            .send()
            .await
            .unwrap();
        assert_eq!(sent.status().as_u16(), 202);
    }
    let wal = size(&wal_file).unwrap_or(0);
    assert!(wal > 0, "the last writes are in the log before the stop");

    server.terminate();
    let status = server
        .wait_exit(Duration::from_secs(30))
        .expect("tok serve exits after SIGTERM");
    assert!(status.success(), "{status}");
    let left = size(&wal_file);
    assert!(
        left.is_none_or(|bytes| bytes == 0),
        "a clean shutdown left a WAL of {left:?} bytes"
    );
    sqlx::Connection::close(other).await.unwrap();
    db.cleanup().await;
}
