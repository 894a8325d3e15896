//! Fresh databases for tests: a new SQLite file, or a new PostgreSQL
//! database on the server named by `TOK_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`, the project's CI server).
//! PostgreSQL tests fail loudly when the server is missing, unless
//! `TOK_TEST_SKIP_POSTGRES=1` says to skip them, which they print.
//!
//! [`backend_tests!`](crate::backend_tests) generates one test per backend
//! from each test function, so that a failure names its backend; each suite
//! plugs in its own runner, which sets up what its tests take (a database
//! here, [`run_on_fresh_db`]; a whole app in the API suite) and cleans up
//! even when the test panics ([`catch_unwind`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

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
    /// The keys [`TestDb::store`] seals credentials with: on PostgreSQL a
    /// random key of this database (`TOK_SECRET_KEY`); on SQLite none, so
    /// the store makes its key file beside the database, as `tok` does.
    pub keys: crate::Keyring,
    dir: Option<std::path::PathBuf>,
    pg_name: Option<String>,
    /// For a routed store ([`TestDb::create_routed`]): the shared
    /// database; `url` is then the database every tenant lives on.
    shared: Option<Box<TestDb>>,
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
                    keys: crate::Keyring::default(),
                    dir: Some(dir),
                    pg_name: None,
                    shared: None,
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
                    keys: crate::Keyring::generate().0,
                    dir: None,
                    pg_name: Some(name),
                    shared: None,
                }
            }
        }
    }

    /// Two empty PostgreSQL databases: a shared one and one that the
    /// configuration `*=<url>` puts every tenant on ([`crate::RoutedStore`]).
    /// `url` is the tenants' database (where their rows are); the shared
    /// one is [`TestDb::shared_url`].
    pub async fn create_routed() -> TestDb {
        let shared = TestDb::create(Backend::Postgres).await;
        let mut tenants = TestDb::create(Backend::Postgres).await;
        tenants.shared = Some(Box::new(shared));
        tenants
    }

    /// The shared database of a routed test database.
    pub fn shared_url(&self) -> Option<&str> {
        self.shared.as_ref().map(|s| s.url.as_str())
    }

    /// Opens the store on this database and migrates it.
    pub async fn store(&self) -> Arc<dyn Store> {
        self.store_with_keys(&self.keys).await
    }

    /// [`TestDb::store`] sealing credentials with `keys` (`TOK_SECRET_KEY`).
    pub async fn store_with_keys(&self, keys: &crate::Keyring) -> Arc<dyn Store> {
        let store = match &self.shared {
            None => crate::connect(&self.url, 10, keys).await,
            Some(shared) => {
                let tenants = crate::TenantDatabases::parse(&format!("*={}", self.url), "test")
                    .expect("routing of the test");
                crate::connect_routed(&shared.url, &tenants, 10, keys, Default::default()).await
            }
        }
        .expect("connect to test database");
        store.migrate().await.expect("migrate test database");
        store
    }

    /// Drops a PostgreSQL database (after every pool on it has closed).
    pub async fn cleanup(mut self) {
        if let Some(shared) = self.shared.take() {
            Box::pin(shared.cleanup()).await;
        }
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

/// Generates one test per backend for each named test function of the
/// calling module: `name::sqlite` and `name::postgres`, so that a failure
/// says which backend failed. `runner` is called as
/// `runner(backend, name).await`: it sets up what a test takes from the
/// backend, runs the test, and cleans up after it (see [`run_on_fresh_db`]).
/// Names are resolved in the calling module.
///
/// ```ignore
/// tok_store::backend_tests!(tok_store::testing::run_on_fresh_db; claims_are_fair, leases_expire);
///
/// async fn claims_are_fair(db: &TestDb) { /* … */ }
/// ```
#[macro_export]
macro_rules! backend_tests {
    ($runner:path; $($name:ident),* $(,)?) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $runner($crate::Backend::Sqlite, super::$name).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $runner($crate::Backend::Postgres, super::$name).await;
            }
        }
    )*};
}

/// Runs one test on a fresh, empty database of `backend` and drops the
/// database afterwards, also when the test panicked (the panic then goes
/// on). A PostgreSQL test is skipped, saying so, when
/// `TOK_TEST_SKIP_POSTGRES=1`.
pub async fn run_on_fresh_db(backend: Backend, test: impl AsyncFnOnce(&TestDb)) {
    if !backends().contains(&backend) {
        return;
    }
    let db = TestDb::create(backend).await;
    let outcome = catch_unwind(test(&db)).await;
    db.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// [`run_on_fresh_db`] on a routed pair of PostgreSQL databases
/// ([`TestDb::create_routed`]): the same test with every tenant on a
/// database beside the shared one. Skipped with PostgreSQL.
pub async fn run_routed(test: impl AsyncFnOnce(&TestDb)) {
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let db = TestDb::create_routed().await;
    let outcome = catch_unwind(test(&db)).await;
    db.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Awaits `future`, turning a panic while it is polled into an `Err`, so
/// that a test's runner can clean up before letting the panic go on.
pub async fn catch_unwind<F: Future>(future: F) -> std::thread::Result<F::Output> {
    CatchUnwind(Box::pin(future)).await
}

struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
