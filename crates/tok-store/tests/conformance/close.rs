//! Closing a store at a clean shutdown (`Store::close`) loses nothing: a
//! store opened on the same database afterwards reads every row written
//! before it, runs included. On SQLite the write-ahead log has been copied
//! into the database and is empty or gone, so the database is one file.

use super::*;

backend_tests!(
    run_on_fresh_db;
    closing_loses_nothing_and_leaves_sqlite_one_file,
);

async fn closing_loses_nothing_and_leaves_sqlite_one_file(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    let run = start(&*store, &t, &aut, "manual", None).await;
    store.close().await.expect("a clean close");
    if db.backend == Backend::Sqlite {
        let wal = format!("{}-wal", db.url.trim_start_matches("sqlite://"));
        let left = std::fs::metadata(&wal).ok().map(|m| m.len());
        assert!(
            left.is_none_or(|bytes| bytes == 0),
            "the WAL holds {left:?} bytes after the store closed"
        );
    }
    drop(store);
    let reopened = db.store().await;
    assert_eq!(
        reopened.tenant(&t).await.unwrap().map(|x| x.name),
        Some("acme".into())
    );
    assert!(reopened.run(&t, &run).await.unwrap().is_some());
}
