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
    /// Creates a database of its own. On PostgreSQL it is a copy of a
    /// template database that holds every migration of this build
    /// ([`migrated_template`]): copying one takes a fraction of applying
    /// them all, which every PostgreSQL test would otherwise do. SQLite's
    /// file starts empty. [`TestDb::store`] migrates either way (a copy
    /// has nothing left to apply), so a test sees the same database.
    pub async fn create(backend: Backend) -> TestDb {
        TestDb::create_from(backend, true).await
    }

    /// Creates a database with nothing migrated, for tests of the
    /// migrations themselves.
    pub async fn create_empty(backend: Backend) -> TestDb {
        TestDb::create_from(backend, false).await
    }

    async fn create_from(backend: Backend, migrated: bool) -> TestDb {
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
                let create = if migrated {
                    let template = migrated_template(&mut conn, &admin).await;
                    format!("CREATE DATABASE {name} TEMPLATE {template}")
                } else {
                    format!("CREATE DATABASE {name}")
                };
                sqlx::Executor::execute(&mut conn, create.as_str())
                    .await
                    .expect("create test database");
                // A test's commits need not wait for the disk: the server
                // does not crash under a test (the fault suite, which kills
                // PostgreSQL, runs a cluster of its own), and what a test
                // sees is the same either way.
                execute(
                    &mut conn,
                    &format!("ALTER DATABASE {name} SET synchronous_commit = off"),
                )
                .await;
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

/// The name of a PostgreSQL database that holds every migration of this
/// build and nothing else, made on first use by whichever test process
/// comes first: its name carries a hash of the migrations' SQL, so a
/// build with other migrations (a later commit, another branch on the
/// same server) makes and uses its own. It is made under an advisory lock,
/// so that concurrent test processes make it once, and marked complete by
/// a comment once migrated, so that one a killed process left half-made is
/// made again. Tests that need a database
/// with nothing migrated use [`TestDb::create_empty`].
async fn migrated_template(conn: &mut sqlx::PgConnection, admin: &str) -> String {
    static TEMPLATE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    let name = TEMPLATE
        .get_or_init(|| async {
            use sha2::Digest;
            let mut hash = sha2::Sha256::new();
            for m in crate::migrate::POSTGRES {
                hash.update(m.version.to_le_bytes());
                hash.update(m.sql.as_bytes());
            }
            format!("tok_template_{}", &hex::encode(hash.finalize())[..16])
        })
        .await
        .clone();
    // One lock for every test process on the server; released when this
    // connection's session ends or below.
    const LOCK: i64 = 0x746f_6b5f_7465_6d70;
    const COMPLETE: &str = "tok test template: every migration applied";
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(LOCK)
        .execute(&mut *conn)
        .await
        .expect("lock the test template");
    // A template whose making was cut short (its process killed) has no
    // comment saying it is complete: it is made again.
    let state: Option<Option<String>> = sqlx::query_scalar(
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1",
    )
    .bind(&name)
    .fetch_optional(&mut *conn)
    .await
    .expect("look for the test template");
    if state.as_ref().and_then(|s| s.as_deref()) != Some(COMPLETE) {
        if state.is_some() {
            execute(conn, &format!("DROP DATABASE {name} WITH (FORCE)")).await;
        }
        execute(conn, &format!("CREATE DATABASE {name}")).await;
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(admin);
        let store = crate::PgStore::connect(&format!("{base}/{name}"), 2)
            .await
            .expect("connect to the test template");
        Store::migrate(&store)
            .await
            .expect("migrate the test template");
        store.pool().close().await;
        execute(conn, &format!("COMMENT ON DATABASE {name} IS '{COMPLETE}'")).await;
    }
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LOCK)
        .execute(&mut *conn)
        .await
        .expect("unlock the test template");
    name
}

async fn execute(conn: &mut sqlx::PgConnection, sql: &str) {
    sqlx::Executor::execute(conn, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
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
