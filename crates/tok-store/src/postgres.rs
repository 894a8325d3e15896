//! The PostgreSQL store: many worker processes on many machines share one
//! database. Claims lock candidate rows with `FOR UPDATE SKIP LOCKED` and are
//! serialized by a transaction-level advisory lock, so that fairness between
//! tenants and one-running-job-per-queue-key hold across processes without a
//! coordinator. Leases and due times use the database clock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::batch::Batcher;
use crate::children_sql::impl_children;
use crate::definitions::AUTOMATION_SELECT;
use crate::desk_sql::impl_desk;
use crate::dispatch_sql::impl_dispatch;
use crate::gate::Writer;
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

use crate::fragments::postgres::*;
use crate::record::branches::native::{fork_and_join, merged_contexts};
use crate::record::contexts::native::{
    context_in, fold_changes, jobs_gone_outside_a_record, stored_of,
};
use crate::rows::{IDEMPOTENCY_WINDOW_MS, now_ms};
use crate::*;

/// Advisory lock key: each migration's transaction and the partition upkeep
/// take it until they end (any process, any machine), and so does the
/// resealing of stored secrets (`secrets/reseal.rs`).
pub(crate) const MIGRATION_LOCK: i64 = 0x746f_6b01;
/// The advisory lock a rotation of the platform admin key takes, so that
/// two rotations at once leave one admin key.
pub(crate) const ADMIN_KEY_LOCK: i64 = 0x746f_6b02;

/// Group-commit transactions of one kind in flight at once: one is written
/// while the one before waits for its commit.
const WRITERS: usize = 2;

/// The channel a dispatch notifies when it made jobs ready: the
/// `notify_work` fragment names it too.
const WORK_CHANNEL: &str = "tok_work";

pub struct PgStore {
    pool: PgPool,
    events: Batcher<(TenantId, NewEvent), (EventId, Accepted)>,
    records: Batcher<(ClaimedJob, Record), bool>,
    /// Seal and open connection credentials (`secrets/`); none unless
    /// [`PgStore::with_keys`] gave them.
    keys: Keyring,
    /// The database's URL without its password, for what the store reports.
    name: String,
}

/// How long the server lets a transaction of the store sit idle: none of
/// tok's waits for anything but the database inside one.
pub(crate) const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

impl PgStore {
    /// The options of every connection of the store. A transaction left
    /// idle (its process stopped, SIGSTOP or a hung host) is cut off after
    /// `IDLE_IN_TRANSACTION` (10 s) by the server, so the locks it holds (the
    /// claim's among them) do not stop every other process for ever.
    pub fn connect_options(url: &str) -> crate::Result<PgConnectOptions> {
        let options: PgConnectOptions = url.parse()?;
        let idle = format!("{}ms", IDLE_IN_TRANSACTION.as_millis());
        Ok(options.options([("idle_in_transaction_session_timeout", idle.as_str())]))
    }

    /// Connects a pool of at most `max_connections`. Steps never hold a
    /// connection while they call out, so a handful serves many slots.
    pub async fn connect(url: &str, max_connections: u32) -> crate::Result<Self> {
        let options = Self::connect_options(url)?;
        let pool = Self::pool_options(max_connections, Duration::from_secs(10))
            .connect_with(options)
            .await?;
        Ok(Self::on_pool(pool, url))
    }

    /// A store whose pool connects at its first use, each connection
    /// waited for at most `acquire_timeout`: a tenant database that does
    /// not answer does not hold up a start (see `routed`).
    pub fn connect_lazy(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> crate::Result<Self> {
        let options = Self::connect_options(url)?;
        let pool = Self::pool_options(max_connections, acquire_timeout).connect_lazy_with(options);
        Ok(Self::on_pool(pool, url))
    }

    fn pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
        // A connection in steady use is not pinged before each use (a round
        // trip per transaction); one idle for a while is, so a server
        // restart is noticed before a statement fails on it.
        PgPoolOptions::new()
            .max_connections(max_connections.max(2))
            .acquire_timeout(acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > Duration::from_secs(5) {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
    }

    /// The store on `pool`, its batchers started.
    fn on_pool(pool: PgPool, url: &str) -> Self {
        let (events_pool, records_pool) = (pool.clone(), pool.clone());
        let events = Batcher::spawn(
            Arc::new(move |items, _lane, _turn| {
                let pool = events_pool.clone();
                Box::pin(async move {
                    crate::fault::after_commit(
                        crate::fault::Site::Inbox,
                        accept_batch(&pool, items).await,
                    )
                })
            }),
            WRITERS,
            |(tenant, _)| tenant,
            None,
        );
        let records = Batcher::spawn(
            Arc::new(move |items, _lane, _turn| {
                let pool = records_pool.clone();
                Box::pin(async move {
                    crate::fault::after_commit(
                        crate::fault::Site::Record,
                        record_batch(&pool, items).await,
                    )
                })
            }),
            WRITERS,
            |(job, _)| &job.tenant_id,
            None,
        );
        Self {
            pool,
            events,
            records,
            keys: Keyring::default(),
            name: crate::routed::redact(url),
        }
    }

    /// The store with `keys` (`TOK_SECRET_KEY`) to seal and open connection
    /// credentials. Without keys, a connection with credentials is refused
    /// ([`SecretError::NoKey`]).
    pub fn with_keys(mut self, keys: Keyring) -> Self {
        self.keys = keys;
        self
    }

    /// The pool, for tests and tools that need to look underneath.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// PostgreSQL takes many writers: no gate.
    pub(crate) async fn writer(&self) -> Writer<'_, sqlx::Postgres> {
        Writer::ungated(&self.pool)
    }

    /// No gate, so no lanes: an urgent transaction runs beside the others.
    pub(crate) async fn writer_in(&self, _lane: crate::Lane) -> Writer<'_, sqlx::Postgres> {
        self.writer().await
    }

    pub(crate) fn reader(&self) -> &PgPool {
        &self.pool
    }
}

/// A run whose status and ticket stay is updated by the same statement as
/// the others: PostgreSQL compares the values, and one statement is one
/// round trip less (see `record_sql.rs`).
const UPDATE_STAYING_RUNS_APART: bool = false;

/// A record's change of its run's context goes to its step row as JSON
/// text of its own (a `TEXT[]` beside the batch, cast to `json`), never
/// through `jsonb`: it is written once and read back as it was, and a
/// claim that reads a run's changes would otherwise convert each of them
/// from `jsonb` to text again (`record/contexts.rs`).
const CHANGES_APART: bool = true;

/// How a list is bound: as an array (`any_of!`).
fn list<T, I: IntoIterator<Item = T>>(items: I) -> Vec<T> {
    items.into_iter().collect()
}

/// The tenant's quotas, read in the caller's transaction: for the
/// dispatch's and the record's queries ([`crate::admin::tenant_limits_in`]).
async fn tenant_limits_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant: &TenantId,
) -> Result<tok_core::quotas::TenantLimits> {
    crate::admin::tenant_limits_in::<crate::sql::postgres::Postgres>(tx, tenant).await
}

impl_inbox! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_dispatch! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_record! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_runs! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_queue! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_desk! {
    store = PgStore,
    db = sqlx::Postgres,
    conn = sqlx::PgConnection,
}

impl_signals! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_children! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_watch! {
    store = PgStore,
    db = sqlx::Postgres,
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    async fn listen_for_work(&self, wake: crate::Wake) -> Result<()> {
        let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool).await?;
        listener.listen(WORK_CHANNEL).await?;
        tokio::spawn(async move {
            loop {
                // `recv` reconnects by itself after a lost connection; a
                // notification missed meanwhile is covered by the poll.
                match listener.recv().await {
                    Ok(_) => {
                        if !wake() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "listening for work failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Ok(())
    }

    async fn stream_relay(&self) -> Result<Option<Box<dyn StreamRelay>>> {
        Ok(Some(Box::new(crate::relay::PgRelay::new(&self.pool))))
    }

    async fn listen_stream(&self, heard: Heard) -> Result<()> {
        crate::relay::listen(&self.pool, heard).await
    }

    async fn migrate(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        migrate::apply::<sqlx::Postgres>(
            &mut conn,
            migrate::POSTGRES,
            Some(("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)),
        )
        .await?;
        drop(conn);
        self.maintain().await?;
        let sealed = self.reseal(Reseal::Plain).await?;
        if sealed.left_plain > 0 {
            tracing::warn!(
                database = %sealed.database,
                rows = sealed.left_plain,
                "connection credentials or webhook signing secrets are stored in plain text: set \
                 TOK_SECRET_KEY and start again to encrypt them (docs/security.md)"
            );
        }
        Ok(())
    }

    async fn seal_credentials(&self, which: Reseal) -> Result<Vec<Resealed>> {
        Ok(vec![self.reseal(which).await?])
    }

    async fn maintain(&self) -> Result<()> {
        // This month and the next two get their own partitions of the
        // tables partitioned by month, each on its own (see `partitions.rs`);
        // one that cannot be created leaves its rows in the default
        // partition and is reported by the scheduler's retention pass.
        for problem in self.create_partitions(now_ms(), 2, &[]).await? {
            tracing::warn!(
                partition = %problem.partition,
                error = %problem.error,
                "a monthly partition could not be created; its rows go to the default partition"
            );
        }
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

impl crate::sql::SqlStore for PgStore {
    type Driver = crate::sql::postgres::Postgres;

    fn reader(&self) -> &PgPool {
        PgStore::reader(self)
    }

    async fn writer(&self) -> Writer<'_, sqlx::Postgres> {
        PgStore::writer(self).await
    }

    fn keys(&self) -> &Keyring {
        &self.keys
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl crate::sql::Route for PgStore {
    type Store = PgStore;

    async fn db_for(&self, _tenant: &TenantId) -> crate::Result<crate::sql::Reach<'_, PgStore>> {
        Ok(crate::sql::Reach::direct(self))
    }
}
