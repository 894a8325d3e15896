//! One database of a [`RoutedStore`](super::RoutedStore): its pool, and
//! what the store knows of whether it answers.
//!
//! Every call to a database goes through [`Database::call`] (a call of one
//! tenant) or [`Database::ask`] (one database's part of a call over many).
//! A tenant database that does not answer — refused, gone, or silent past
//! its timeout (`TOK_TENANT_DATABASE_TIMEOUT`) — is marked away, once,
//! with a warning naming it: from then on the calls routed to it fail at
//! once with [`StoreError::TenantDatabaseUnavailable`] instead of each
//! waiting out a timeout, and a task of its own ([`watch`]) tries it again
//! every [`TENANT_DATABASE_RETRY`]. Once it answers it is migrated (if it
//! never was), listened to for work (if this process listens) and used
//! again. Every call a database failed is counted in
//! `tok_database_errors_total{database}`.
//!
//! The shared database is the platform's: it is never marked away (its
//! calls fail as they come, readiness follows it), and its calls of one
//! tenant wait as long as its pool lets them, as on one database.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{PgStore, Result, Store, StoreError, Wake};

/// How often a tenant database away is tried again; also what its
/// tenants' 503 answers say to wait (`Retry-After`).
pub const TENANT_DATABASE_RETRY: Duration = Duration::from_secs(2);

/// How long the migration of a tenant database may take before it is
/// given up, to be tried again.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Job ids of a tenant database start in a range of their own this wide.
const JOB_ID_RANGE: i64 = 1 << 40;

pub(crate) struct Database {
    pub(crate) store: PgStore,
    /// How logs and the metric name it: `shared`, or the entries routed to
    /// it (`acme`, `ten_01a2,*`). Never a password.
    pub(super) name: String,
    /// Its URL without the password, for logs.
    url: String,
    shared: bool,
    /// How long a call may take (see the module doc).
    timeout: Duration,
    /// False while a tenant database is away: its calls fail at once.
    up: AtomicBool,
    /// Whether this process migrated it.
    migrated: AtomicBool,
    /// Whether this process listens to it for work.
    listening: AtomicBool,
}

impl Database {
    pub(super) fn shared(store: PgStore, url: &str, timeout: Duration) -> Self {
        Self::new(store, "shared".into(), url, true, timeout)
    }

    pub(super) fn tenant(store: PgStore, name: String, url: &str, timeout: Duration) -> Self {
        Self::new(store, name, url, false, timeout)
    }

    fn new(store: PgStore, name: String, url: &str, shared: bool, timeout: Duration) -> Self {
        Self {
            store,
            name,
            url: super::redact(url),
            shared,
            timeout,
            up: AtomicBool::new(true),
            migrated: AtomicBool::new(false),
            listening: AtomicBool::new(false),
        }
    }

    pub(super) fn is_shared(&self) -> bool {
        self.shared
    }

    /// Whether calls go to it now.
    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// A call of one tenant routed here: it fails at once while this
    /// tenant database is away, and marks it away when it does not answer
    /// within its timeout. The shared database's calls are not bounded.
    pub(crate) async fn call<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let bound = (!self.shared).then_some(self.timeout);
        self.within(bound, call).await
    }

    /// This database's part of a call over several: bounded by its
    /// timeout, the shared database's too, so that one that hangs does not
    /// hold up the others' answers.
    pub(super) async fn ask<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        self.within(Some(self.timeout), call).await
    }

    /// [`Database::ask`] within `bound` at most.
    pub(super) async fn ask_within<T>(
        &self,
        bound: Duration,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.within(Some(bound.min(self.timeout)), call).await
    }

    async fn within<T>(
        &self,
        bound: Option<Duration>,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if !self.is_up() {
            self.count();
            return Err(self.away());
        }
        let answer = match bound {
            None => call.await,
            Some(bound) => match tokio::time::timeout(bound, call).await {
                Ok(answer) => answer,
                Err(_) => {
                    let why = format!("no answer within {} ms", bound.as_millis());
                    self.failed(&why);
                    return Err(if self.shared {
                        StoreError::Unavailable(format!("the shared database: {why}"))
                    } else {
                        self.away()
                    });
                }
            },
        };
        match answer {
            Err(e) if unreachable(&e) => {
                self.failed(&e);
                Err(if self.shared { e } else { self.away() })
            }
            answer => answer,
        }
    }

    /// What a call routed here while it is away answers.
    pub(super) fn away(&self) -> StoreError {
        StoreError::TenantDatabaseUnavailable(self.name.clone())
    }

    fn count(&self) {
        metrics::counter!("tok_database_errors_total", "database" => self.name.clone())
            .increment(1);
    }

    /// Counts a failed call; a tenant database is marked away (said once).
    fn failed(&self, why: &dyn Display) {
        self.count();
        if !self.shared && self.up.swap(false, Ordering::SeqCst) {
            tracing::warn!(
                database = %self.name,
                url = %self.url,
                error = %why,
                retry_every_s = TENANT_DATABASE_RETRY.as_secs(),
                "a tenant database does not answer: its tenants' calls fail at once \
                 (503 tenant_database_unavailable) until it answers again; the other \
                 tenants go on"
            );
        }
    }

    /// Logs a failure of this database's part of a call over several (the
    /// call goes on with the others). One already said to be away is not
    /// repeated.
    pub(super) fn skipped(&self, what: &str, error: &StoreError) {
        if matches!(error, StoreError::TenantDatabaseUnavailable(_)) {
            tracing::debug!(database = %self.name, what, "skipped: the database is away");
        } else {
            tracing::warn!(database = %self.name, what, error = %error, "one database failed; the others' answers are kept");
        }
    }

    /// Migrates it and, for a tenant database, starts its job ids in a
    /// range of their own (see the module doc of [`super`]).
    pub(super) async fn migrate(&self) -> Result<()> {
        self.store.migrate().await?;
        if !self.shared {
            separate_job_ids(&self.store).await?;
        }
        self.migrated.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// [`Database::migrate`] for a tenant database at a start: one that does
    /// not answer is marked away, to be migrated when it does ([`watch`]),
    /// and the start goes on; any other failure stops it.
    pub(super) async fn migrate_or_wait(&self) -> Result<()> {
        match tokio::time::timeout(MIGRATION_TIMEOUT, self.migrate()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if unreachable(&e) => {
                self.failed(&e);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                self.failed(&"the migration did not finish within 60 s");
                Ok(())
            }
        }
    }

    /// Listens to it for work, unless this process does already; a
    /// database that fails to is marked away, and listened to when it
    /// answers again.
    pub(super) async fn listen(&self, wake: Wake) {
        if !self.migrated.load(Ordering::SeqCst) || self.listening.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.ask(self.store.listen_for_work(wake)).await {
            self.listening.store(false, Ordering::SeqCst);
            self.failed(&e);
        }
    }

    /// Tries a database that is away once: when it answers, migrates it
    /// if this process never did, marks it up, and listens to it if
    /// `wake` says this process listens.
    async fn recover(&self, wake: &Mutex<Option<Wake>>) {
        let answered = tokio::time::timeout(self.timeout, self.store.ping()).await;
        if !matches!(answered, Ok(Ok(()))) {
            return;
        }
        if !self.migrated.load(Ordering::SeqCst) {
            match tokio::time::timeout(MIGRATION_TIMEOUT, self.migrate()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(database = %self.name, error = %e, "a tenant database answers again but could not be migrated; trying again");
                    return;
                }
                Err(_) => return,
            }
        }
        self.up.store(true, Ordering::SeqCst);
        tracing::info!(database = %self.name, url = %self.url, "a tenant database answers again: its tenants' calls go to it");
        let wake = wake.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(wake) = wake {
            self.listen(wake).await;
        }
    }

    /// The databases this process could not reach, by name.
    pub(super) fn unreachable_name(&self) -> Option<&str> {
        (!self.is_up() || !self.migrated.load(Ordering::SeqCst)).then_some(self.name.as_str())
    }
}

/// Tries `db` again every [`TENANT_DATABASE_RETRY`] while it is away,
/// until the store it belongs to is dropped. `wake` is the store's work
/// listener, once the engine gave it one.
pub(super) fn watch(db: &Arc<Database>, wake: Arc<Mutex<Option<Wake>>>) {
    let db = Arc::downgrade(db);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(TENANT_DATABASE_RETRY).await;
            let Some(db) = db.upgrade() else {
                return;
            };
            if !db.is_up() {
                db.recover(&wake).await;
            }
        }
    });
}

/// Whether `error` says the database did not answer (as opposed to
/// answering with a refusal of the statement).
fn unreachable(error: &StoreError) -> bool {
    match error {
        StoreError::Database(e) | StoreError::Migration { source: e, .. } => unreachable_sql(e),
        // A batch's failure as each of its callers gets it (the inbox's
        // group writes): the database did not answer.
        StoreError::Unavailable(_) => true,
        _ => false,
    }
}

fn unreachable_sql(error: &sqlx::Error) -> bool {
    use sqlx::Error;
    match error {
        Error::Io(_)
        | Error::Tls(_)
        | Error::PoolTimedOut
        | Error::PoolClosed
        | Error::WorkerCrashed
        | Error::Protocol(_) => true,
        // Connection exceptions, the server shutting down or starting,
        // refused credentials, a database that does not exist (yet), no
        // connection slot left.
        Error::Database(e) => e.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("57P")
                || code.starts_with("28")
                || code == "3D000"
                || code == "53300"
        }),
        _ => false,
    }
}

/// Starts the job ids of a tenant database in a range of its own, once.
async fn separate_job_ids(db: &PgStore) -> Result<()> {
    let slot =
        1 + (uuid::Uuid::new_v4().as_u128() % ((i64::MAX / JOB_ID_RANGE) as u128 - 2)) as i64;
    sqlx::query(
        "SELECT setval(pg_get_serial_sequence('jobs', 'id'), $1, false)
         WHERE (SELECT COALESCE(MAX(id), 0) FROM jobs) < $2
           AND (SELECT last_value FROM jobs_id_seq) < $2",
    )
    .bind(slot * JOB_ID_RANGE)
    .bind(JOB_ID_RANGE)
    .execute(db.pool())
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_or_a_missing_database_is_unreachable_a_bad_row_is_not() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(unreachable(&StoreError::Database(io)));
        assert!(unreachable(&StoreError::Database(
            sqlx::Error::PoolTimedOut
        )));
        assert!(!unreachable(&StoreError::Database(
            sqlx::Error::RowNotFound
        )));
        assert!(!unreachable(&StoreError::Taken("taken".into())));
        // A group write's failure, as each of its callers gets it.
        assert!(unreachable(&StoreError::Unavailable("the batch".into())));
        assert!(!unreachable(&StoreError::Refused("U+0000".into())));
    }
}
