//! Fresh databases for tests: a new SQLite file, or a new PostgreSQL
//! database on the server named by `TOK_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`, the project's CI server).
//! PostgreSQL tests fail loudly when the server is missing, unless
//! `TOK_TEST_SKIP_POSTGRES=1` says to skip them, which they print.

use std::sync::Arc;

use sqlx::Connection;

use crate::{Backend, Store};

/// The server PostgreSQL tests create their databases on.
pub fn postgres_admin_url() -> String {
    std::env::var("TOK_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Whether PostgreSQL tests were explicitly switched off.
pub fn skip_postgres() -> bool {
    std::env::var("TOK_TEST_SKIP_POSTGRES").is_ok_and(|v| v == "1")
}

/// A database of its own for one test. Dropping it removes a SQLite
/// file's folder; PostgreSQL databases are dropped by [`TestDb::cleanup`].
pub struct TestDb {
    pub backend: Backend,
    /// The URL `tok` would be given (`TOK_DATABASE_URL`).
    pub url: String,
    dir: Option<std::path::PathBuf>,
    pg_name: Option<String>,
}

impl TestDb {
    /// Creates an empty database (nothing migrated).
    pub async fn create(backend: Backend) -> TestDb {
        let unique = format!("{}_{}", std::process::id(), crate::random_token());
        match backend {
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("tok-test-{unique}"));
                std::fs::create_dir_all(&dir).expect("temp dir");
                let url = format!("sqlite://{}", dir.join("tok.db").display());
                TestDb {
                    backend,
                    url,
                    dir: Some(dir),
                    pg_name: None,
                }
            }
            Backend::Postgres => {
                let admin = postgres_admin_url();
                let name = format!(
                    "tok_test_{}",
                    &unique.replace('-', "_")[..unique.len().min(40)]
                );
                let mut conn = sqlx::PgConnection::connect(&admin)
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "PostgreSQL tests need a server at {admin} ({e}); start it, point \
                         TOK_TEST_POSTGRES_URL elsewhere, or set TOK_TEST_SKIP_POSTGRES=1"
                        )
                    });
                sqlx::Executor::execute(&mut conn, format!("CREATE DATABASE {name}").as_str())
                    .await
                    .expect("create test database");
                let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
                let url = format!("{base}/{name}");
                TestDb {
                    backend,
                    url,
                    dir: None,
                    pg_name: Some(name),
                }
            }
        }
    }

    /// Opens the store on this database and migrates it.
    pub async fn store(&self) -> Arc<dyn Store> {
        let store = crate::connect(&self.url, 10)
            .await
            .expect("connect to test database");
        store.migrate().await.expect("migrate test database");
        store
    }

    /// Drops a PostgreSQL database (after every pool on it has closed).
    pub async fn cleanup(mut self) {
        if let Some(name) = self.pg_name.take()
            && let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await
        {
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            let _ = sqlx::Executor::execute(&mut conn, sql.as_str()).await;
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The backends a test should run on: both, or SQLite alone when
/// PostgreSQL tests were switched off (and says so).
pub fn backends() -> Vec<Backend> {
    if skip_postgres() {
        eprintln!("TOK_TEST_SKIP_POSTGRES=1: PostgreSQL is NOT tested in this run");
        vec![Backend::Sqlite]
    } else {
        vec![Backend::Sqlite, Backend::Postgres]
    }
}
