//! The SQLite store: one node, one file. SQLite has one writer, so every
//! write goes through a single writer connection (WAL mode,
//! `synchronous=FULL`: a committed row survives a power cut) and reads go
//! through a small pool of readers. With one writer there is never a
//! `database is locked` storm, and the claim needs no lock beyond it.
//!
//! The write-ahead log is kept in bounds (docs/operations.md, "The SQLite
//! write-ahead log"): a background checkpoint copies it into the database
//! every 100 ms without blocking anyone, but SQLite starts the log over
//! only when no reader still reads a part of it, which under steady load
//! is never, so on its own the file grows without end. Past
//! [`SqliteSettings::wal_limit`] the writer, in its turn at the gate,
//! checkpoints it whole and truncates it; [`Store::close`] does so at a
//! clean shutdown, so a stopped node leaves one file.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteAutoVacuum, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use crate::batch::Batcher;
use crate::children_sql::impl_children;
use crate::definitions::AUTOMATION_SELECT;
use crate::desk_sql::impl_desk;
use crate::dispatch_sql::impl_dispatch;
use crate::gate::{Lane, WriteGate, Writer};
use crate::inbox_sql::impl_inbox;
use crate::migrate;
use crate::queue_sql::impl_queue;
use crate::record_sql::impl_record;
use crate::runs_sql::impl_runs;
use crate::secrets::Resealing as _;
use crate::signals_sql::{ESCALATION_HOLD_MS, flow_lock, impl_signals, into_escalation};
use crate::watch_sql::impl_watch;

// The names the queries of every `*_sql.rs` file use, once for all of them.
use serde_json::Value;
use sqlx::Row as _;
use sqlx::types::Json;
use tok_core::ids::{AutomationId, EventId, JobId, RunId, SourceId, TenantId, new_id};

use crate::fragments::sqlite::*;
use crate::record::branches::native::{fork_and_join, merged_contexts};
use crate::record::contexts::native::{
    context_in, fold_changes, jobs_gone_outside_a_record, stored_of,
};
use crate::rows::{IDEMPOTENCY_WINDOW_MS, now_ms};
use crate::*;

pub struct SqliteStore {
    writer: SqlitePool,
    /// Who gets the one writer next: every write waits here.
    gate: WriteGate,
    reader: SqlitePool,
    events: Batcher<(TenantId, NewEvent), (EventId, Accepted)>,
    records: Batcher<(ClaimedJob, Record), bool>,
    /// Seal and open connection credentials (`secrets/`).
    keys: Keyring,
    /// The database file, for what the store reports.
    name: String,
    checkpointer: Checkpointer,
}

/// What a SQLite store is opened with beyond its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteSettings {
    /// The size of the write-ahead log file, in bytes, past which the
    /// writer checkpoints it whole and truncates it to nothing; also its
    /// `journal_size_limit`. [`DEFAULT_WAL_LIMIT`] unless
    /// `TOK_SQLITE_WAL_LIMIT` says otherwise.
    pub wal_limit: u64,
}

/// 64 MiB: a second or more of the heaviest ingest between truncations, so
/// the writer stops for one rarely (each stop waits for the reads in
/// progress and copies what the background checkpoint has not copied
/// yet), while the log stays a small part of any disk (docs/performance.md,
/// "The SQLite write-ahead log").
pub const DEFAULT_WAL_LIMIT: u64 = 64 * 1024 * 1024;

impl Default for SqliteSettings {
    fn default() -> Self {
        Self {
            wal_limit: DEFAULT_WAL_LIMIT,
        }
    }
}

/// How often the background checkpoint copies the WAL into the database.
/// Often, so each copy (and the database file's flush after it) is small:
/// with a copy every 500 ms, a webhook's run under load stalled for 25-45
/// ms in a third of the fairness runs, and in none at 100 ms
/// (docs/performance.md).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// How long the writer's checkpoint that truncates the WAL waits for the
/// reads in progress before it gives up (the writer is held meanwhile;
/// reads take milliseconds).
const TRUNCATE_WAIT: Duration = Duration::from_millis(250);

/// How long after a truncation a read held up the writer tries again: a
/// long read must not stall the writes every tick.
const TRUNCATE_RETRY: Duration = Duration::from_secs(2);

/// The writer's busy timeout: how long a write waits for a lock another
/// connection holds (a checkpoint's, another process's).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Keeps the WAL in bounds. Every [`CHECKPOINT_EVERY`], from a connection of
/// its own so that no commit waits for it, a PASSIVE checkpoint copies the
/// WAL into the database: it never blocks the writer or a reader, and what
/// it cannot copy yet (pages a reader still sees) it copies next time. The
/// file itself shrinks only when SQLite starts the log over, which it does
/// only when no reader still reads from it; so when the file is past the
/// limit, the writer truncates it in its turn ([`truncate_wal`]). Stops
/// with the store.
struct Checkpointer {
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    stop: Arc<tokio::sync::Notify>,
}

/// What the checkpointer needs of the store.
struct Keeper {
    conn: sqlx::SqliteConnection,
    writer: SqlitePool,
    gate: WriteGate,
    /// The WAL file (none in memory).
    wal: Option<std::path::PathBuf>,
    limit: u64,
    /// No truncation before this (after one a read held up).
    not_before: Option<tokio::time::Instant>,
}

impl Checkpointer {
    async fn start(
        options: &SqliteConnectOptions,
        writer: &SqlitePool,
        gate: &WriteGate,
        limit: u64,
    ) -> crate::Result<Self> {
        let conn = sqlx::ConnectOptions::connect(options).await?;
        let file = options.get_filename();
        let in_memory = file.as_os_str().is_empty() || file.as_os_str() == ":memory:";
        let mut keeper = Keeper {
            conn,
            writer: writer.clone(),
            gate: gate.clone(),
            wal: (!in_memory).then(|| {
                let mut wal = file.as_os_str().to_owned();
                wal.push("-wal");
                std::path::PathBuf::from(wal)
            }),
            limit,
            not_before: None,
        };
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopping.notified() => break,
                    _ = tokio::time::sleep(CHECKPOINT_EVERY) => {}
                }
                keeper.tick().await;
            }
            let _ = sqlx::Connection::close(keeper.conn).await;
        });
        Ok(Self {
            task: std::sync::Mutex::new(Some(task)),
            stop,
        })
    }

    /// Stops the background checkpoints and closes their connection.
    async fn stop(&self) {
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            self.stop.notify_one();
            let _ = task.await;
        }
    }
}

impl Keeper {
    async fn tick(&mut self) {
        if let Err(e) =
            sqlx::Executor::execute(&mut self.conn, "PRAGMA wal_checkpoint(PASSIVE)").await
        {
            tracing::warn!(error = %e, "WAL checkpoint failed; retrying");
            return;
        }
        let size = self
            .wal
            .as_ref()
            .and_then(|wal| std::fs::metadata(wal).ok())
            .map_or(0, |m| m.len());
        let now = tokio::time::Instant::now();
        if size <= self.limit || self.not_before.is_some_and(|t| now < t) {
            return;
        }
        let writer = Writer::gated(&self.writer, &self.gate, Lane::Bulk).await;
        let started = std::time::Instant::now();
        let truncated = truncate_wal(&writer, TRUNCATE_WAIT).await;
        drop(writer);
        let ms = started.elapsed().as_millis() as u64;
        self.not_before = None;
        match truncated {
            Ok(true) => tracing::debug!(bytes = size, ms, "WAL past its limit: truncated"),
            Ok(false) => {
                self.not_before = Some(now + TRUNCATE_RETRY);
                tracing::info!(
                    bytes = size,
                    ms,
                    "WAL past its limit, but a read held it up; trying again in 2 s"
                );
            }
            Err(e) => {
                self.not_before = Some(now + TRUNCATE_RETRY);
                tracing::warn!(error = %e, bytes = size, "WAL truncation failed; trying again in 2 s");
            }
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

/// Copies the whole WAL into the database and truncates it to nothing, on
/// the writer (whose turn the caller holds, so no write is in progress),
/// waiting up to `wait` for the reads in progress; `false` when a read
/// still held it then. The database file is synced before the log is cut,
/// so this loses nothing a commit acknowledged.
async fn truncate_wal(writer: &SqlitePool, wait: Duration) -> crate::Result<bool> {
    let mut conn = writer.acquire().await?;
    sqlx::query(&format!("PRAGMA busy_timeout = {}", wait.as_millis()))
        .execute(&mut *conn)
        .await?;
    let done: crate::Result<(i64, i64, i64)> = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(&mut *conn)
        .await
        .map_err(Into::into);
    sqlx::query(&format!(
        "PRAGMA busy_timeout = {}",
        BUSY_TIMEOUT.as_millis()
    ))
    .execute(&mut *conn)
    .await?;
    // (busy, frames in the log, frames copied): busy 1 = not finished.
    Ok(done?.0 == 0)
}

impl SqliteStore {
    /// Opens (creating if missing, with its folder) the database a
    /// `sqlite://path` URL names, its credentials sealed under the key
    /// file beside it ([`key_file`](crate::key_file), made if missing).
    pub async fn open(url: &str) -> crate::Result<Self> {
        Self::open_with_keys(url, &Keyring::default()).await
    }

    /// [`SqliteStore::open`] with the keys of `TOK_SECRET_KEY`: they seal,
    /// and a key file beside the database, if one is there from a start
    /// without them, still opens what it sealed (until `tok secrets rotate`
    /// seals it under the newest key). Empty `keys`: the key file's.
    pub async fn open_with_keys(url: &str, keys: &Keyring) -> crate::Result<Self> {
        Self::open_with(url, keys, SqliteSettings::default()).await
    }

    /// [`SqliteStore::open_with_keys`] with `settings`.
    pub async fn open_with(
        url: &str,
        keys: &Keyring,
        settings: SqliteSettings,
    ) -> crate::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        if let Some(dir) = options.get_filename().parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(sqlx::Error::Io)?;
        }
        let keys = Self::keys_for(options.get_filename(), keys)?;
        let name = options.get_filename().display().to_string();
        // A file connection does not go stale: no ping before each use. The
        // writer never checkpoints inside a commit (copying the WAL back
        // into the database there would stall every write waiting behind
        // it); a connection of its own does, in the background, and the
        // writer truncates the log in a turn of its own when it is past
        // the limit (`Checkpointer`). Whenever SQLite starts the log over,
        // `journal_size_limit` cuts the file back to the limit.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(
                options
                    .clone()
                    .pragma("wal_autocheckpoint", "0")
                    .pragma("journal_size_limit", settings.wal_limit.to_string())
                    // A new file gives the pages freed by expiry back to
                    // the file system (`reclaim_space`). A file made before
                    // keeps `NONE` until a `VACUUM` (docs/operations.md):
                    // it reuses its free pages, so it stops growing, but
                    // does not shrink.
                    .auto_vacuum(SqliteAutoVacuum::Incremental),
            )
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone().read_only(true))
            .await?;
        let gate = WriteGate::default();
        let checkpointer =
            Checkpointer::start(&options, &writer, &gate, settings.wal_limit).await?;
        // The batchers take the writer's turn at the gate before they take
        // their batch (`batch.rs`), and write holding it.
        let events_pool = writer.clone();
        let events = Batcher::spawn(
            Arc::new(move |items, _lane, turn| {
                let pool = events_pool.clone();
                Box::pin(async move {
                    crate::fault::after_commit(
                        crate::fault::Site::Inbox,
                        accept_batch(&Writer::holding(&pool, turn), items).await,
                    )
                })
            }),
            1,
            |(tenant, _)| tenant,
            Some(gate.clone()),
        );
        let records_pool = writer.clone();
        let records = Batcher::spawn(
            Arc::new(move |items, _lane, turn| {
                let pool = records_pool.clone();
                Box::pin(async move {
                    crate::fault::after_commit(
                        crate::fault::Site::Record,
                        record_batch(&Writer::holding(&pool, turn), items).await,
                    )
                })
            }),
            1,
            |(job, _)| &job.tenant_id,
            Some(gate.clone()),
        );
        Ok(Self {
            writer,
            gate,
            reader,
            events,
            records,
            keys,
            name,
            checkpointer,
        })
    }

    /// The keys of the database at `file`: `configured`, then its key
    /// file's if it has one; the key file's alone (made if missing) when
    /// nothing is configured. An in-memory database keeps a key in memory.
    fn keys_for(file: &std::path::Path, configured: &Keyring) -> crate::Result<Keyring> {
        let in_memory = file.as_os_str().is_empty() || file.as_os_str() == ":memory:";
        if in_memory {
            return Ok(if configured.is_empty() {
                Keyring::generate().0
            } else {
                configured.clone()
            });
        }
        let path = crate::key_file::path_for(file);
        let keys = if configured.is_empty() {
            crate::key_file::load_or_create(&path)
        } else if path.exists() {
            crate::key_file::load_or_create(&path).map(|file| configured.then(&file))
        } else {
            Ok(configured.clone())
        };
        keys.map_err(|e| {
            StoreError::Database(sqlx::Error::Io(std::io::Error::new(
                e.kind(),
                format!("the key file {}: {e}", path.display()),
            )))
        })
    }

    /// The writer, in the bulk lane: the urgent one is for the group
    /// commits and dispatches of tenants that do not crowd the queue (see
    /// `batch.rs`, and [`writer_in`](Self::writer_in)).
    pub(crate) async fn writer(&self) -> Writer<'_, sqlx::Sqlite> {
        self.writer_in(Lane::Bulk).await
    }

    pub(crate) async fn writer_in(&self, lane: Lane) -> Writer<'_, sqlx::Sqlite> {
        Writer::gated(&self.writer, &self.gate, lane).await
    }

    pub(crate) fn reader(&self) -> &SqlitePool {
        &self.reader
    }

    /// Moves this store's clock (`db_now!`) and the process's
    /// ([`crate::now_ms`]) forward by `by_ms`, together: `tok test`'s
    /// virtual clock. For a store of its own, never one that serves.
    pub async fn advance_clock(&self, by_ms: i64) -> crate::Result<()> {
        let by_ms = by_ms.max(0);
        let writer = self.writer().await;
        sqlx::query("UPDATE clock_offset SET offset_ms = offset_ms + $1")
            .bind(by_ms)
            .execute(&*writer)
            .await?;
        crate::advance_clock(by_ms);
        Ok(())
    }

    /// What is left for the engine to do for `tenant` (`tok test` asks,
    /// to know when moving the clock is all that is left).
    pub async fn work_left(&self, tenant: &TenantId) -> crate::Result<WorkLeft> {
        let row = sqlx::query(concat!(
            "SELECT
                (SELECT COUNT(*) FROM event_inbox WHERE tenant_id = $1 AND status = 'pending')
                    AS events,
                (SELECT COUNT(*) FROM jobs WHERE tenant_id = $1 AND locked_by IS NOT NULL)
                    AS leased,
                (SELECT MIN(run_after) FROM jobs
                  WHERE tenant_id = $1 AND locked_by IS NULL AND held = 0 AND run_after < $2)
                    AS next_due,
                ",
            db_now!(),
            " AS now"
        ))
        .bind(tenant.as_str())
        .bind(crate::signals::NEVER_DUE_MS)
        .fetch_one(self.reader())
        .await?;
        Ok(WorkLeft {
            busy: row.get::<i64, _>("events") > 0 || row.get::<i64, _>("leased") > 0,
            next_due_ms: row.get("next_due"),
            now_ms: row.get("now"),
        })
    }
}

/// What [`SqliteStore::work_left`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkLeft {
    /// An event not dispatched yet, or a job a worker holds.
    pub busy: bool,
    /// When the soonest job no worker holds is due (none: every job left
    /// waits for something with no deadline, a signal or an approval).
    pub next_due_ms: Option<i64>,
    /// The store's clock as the query read it.
    pub now_ms: i64,
}

/// A run whose status and ticket stay is updated by a statement that does
/// not name them: SQLite rewrites the entries of every index on a column the
/// `SET` list names, changed or not (see `record_sql.rs`).
const UPDATE_STAYING_RUNS_APART: bool = true;

/// A record's change of its run's context travels in its step row's batch
/// JSON, as the row's other JSON does (`step_change!`).
const CHANGES_APART: bool = false;

/// SQLite has no arrays: a list is bound as a JSON array and read with `json_each`.
fn list<T: serde::Serialize, I: IntoIterator<Item = T>>(items: I) -> String {
    serde_json::to_string(&items.into_iter().collect::<Vec<T>>()).unwrap_or_else(|_| "[]".into())
}

/// The tenant's quotas, read in the caller's transaction: for the
/// dispatch's and the record's queries ([`crate::admin::tenant_limits_in`]).
async fn tenant_limits_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    tenant: &TenantId,
) -> Result<tok_core::quotas::TenantLimits> {
    crate::admin::tenant_limits_in::<crate::sql::sqlite::Sqlite>(tx, tenant).await
}

impl_inbox! {
    store = SqliteStore,
    db = sqlx::Sqlite,
}

impl_dispatch! {
    store = SqliteStore,
    db = sqlx::Sqlite,
}

impl_record! {
    store = SqliteStore,
    db = sqlx::Sqlite,
}

impl_runs! {
    store = SqliteStore,
    db = sqlx::Sqlite,
}

impl_queue! {
    store = SqliteStore,
    db = sqlx::Sqlite,
}

impl_desk! {
    store = SqliteStore,
    db = sqlx::Sqlite,
    conn = sqlx::SqliteConnection,
}

impl_signals! {
    store = SqliteStore,
    db = sqlx::Sqlite,
}

impl_children! {
    store = SqliteStore,
    db = sqlx::Sqlite,
}

impl_watch! {
    store = SqliteStore,
    db = sqlx::Sqlite,
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn migrate(&self) -> Result<()> {
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        migrate::apply::<sqlx::Sqlite>(&mut conn, migrate::SQLITE, None).await?;
        drop((conn, writer));
        self.reseal(Reseal::Plain).await.map(|_| ())
    }

    async fn seal_credentials(&self, which: Reseal) -> Result<Vec<Resealed>> {
        Ok(vec![self.reseal(which).await?])
    }

    async fn maintain(&self) -> Result<()> {
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        self.checkpointer.stop().await;
        let writer = self.writer().await;
        // The readers first: a read in progress would keep the log.
        self.reader.close().await;
        let truncated = truncate_wal(&writer, BUSY_TIMEOUT).await;
        writer.close().await;
        match truncated? {
            true => Ok(()),
            false => Err(StoreError::Unavailable(
                "the WAL could not be checkpointed at shutdown: a connection still read from it"
                    .into(),
            )),
        }
    }
}

impl crate::sql::SqlStore for SqliteStore {
    type Driver = crate::sql::sqlite::Sqlite;

    fn reader(&self) -> &SqlitePool {
        SqliteStore::reader(self)
    }

    fn keys(&self) -> &Keyring {
        &self.keys
    }

    async fn writer(&self) -> Writer<'_, sqlx::Sqlite> {
        SqliteStore::writer(self).await
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl crate::sql::Route for SqliteStore {
    type Store = SqliteStore;

    async fn db_for(
        &self,
        _tenant: &TenantId,
    ) -> crate::Result<crate::sql::Reach<'_, SqliteStore>> {
        Ok(crate::sql::Reach::direct(self))
    }
}

#[cfg(test)]
mod tests {
    /// A commit answered is on disk: the writer syncs every commit
    /// (`synchronous=FULL`, in WAL mode), which the SIGKILL tests rely on.
    #[tokio::test]
    async fn the_writer_syncs_every_commit_to_disk() {
        let dir = std::env::temp_dir().join(format!("tok-sync-{}", crate::random_token()));
        let url = format!("sqlite://{}/tok.db", dir.display());
        let store = super::SqliteStore::open(&url).await.unwrap();
        let (journal,): (String,) = sqlx::query_as("PRAGMA journal_mode")
            .fetch_one(&store.writer)
            .await
            .unwrap();
        let (synchronous,): (i64,) = sqlx::query_as("PRAGMA synchronous")
            .fetch_one(&store.writer)
            .await
            .unwrap();
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(journal, "wal");
        assert_eq!(synchronous, 2, "synchronous=FULL (2), not NORMAL (1)");
    }
}
