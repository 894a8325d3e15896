//! tok's storage: the schema, migrations and queries for PostgreSQL and SQLite
//! behind one set of narrow traits.
//!
//! Every function that touches tenant data takes the tenant (or, for the
//! queue, the set of tenants the caller serves): no function can see rows of
//! all tenants by accident. The few platform-level reads (an API key, a
//! webhook token, the list of tenants) are how a caller learns the tenant.
//!
//! Both backends implement the same traits and pass the same conformance
//! suite (`tests/conformance/`, one module per part of the store, each test
//! generated per backend by [`backend_tests!`]). `connect` picks one from
//! the URL.
//!
//! Lock order on PostgreSQL: a transaction that locks a run's row and its
//! jobs' rows locks the run first. A cancel, a pause, a retry or a failed
//! run's end locks the run and then deletes or holds its jobs; a record
//! locks its batch's runs in id order before its fence locks the jobs; a
//! claim's take skips a job whose run another transaction holds, so it
//! never waits for a run while holding a job. The locks a claim or a
//! dispatch takes before it counts a capped tenant's leases (`caps/`)
//! are try-locks: nobody waits for them.

pub mod admin;
pub mod approvals;
pub mod audit;
mod batch;
mod caps;
mod children_sql;
pub mod connections;
pub mod definitions;
pub mod desk;
mod desk_sql;
pub mod dispatch;
mod dispatch_sql;
pub mod effects;
mod fault;
mod fragments;
mod gate;
mod inbox_sql;
pub mod key_file;
pub mod keys;
mod migrate;
pub mod model;
pub mod offboarding;
pub mod operations;
mod partitions;
mod postgres;
pub mod queue_samples;
mod queue_sql;
mod record;
mod record_sql;
pub mod relay;
pub mod retention;
pub mod rfc3339;
pub mod routed;
mod rows;
mod runs_sql;
pub mod schedule;
pub mod secrets;
pub mod signals;
mod signals_sql;
mod sql;
mod sqlite;
pub mod storable;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod watch;
mod watch_sql;
pub mod widgets;

use std::sync::Arc;

use async_trait::async_trait;
use tok_core::ids::{AutomationId, EventId, JobId, RunId, TenantId};

/// Describes the metrics the store records, so that each has its `# HELP`
/// line in `/metrics`.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "tok_database_errors_total",
        "Calls a database failed (refused, gone or past its timeout), by database"
    );
}

pub use admin::AdminStore;
pub use approvals::{Approval, ApprovalStore, Approver, Decided, Decision, NewApproval};
pub use audit::{
    AUDIT_PENDING_GRACE_MS, Actor, ActorKind, AuditEnd, AuditFilter, AuditOutcome, AuditRow,
    AuditStore, NewAudit, PLATFORM_AUDIT_DAYS, Target,
};
pub use connections::{
    Admission, CallOutcome, Connection, ConnectionPatch, ConnectionStore, ExpectedConnection,
    NewConnection,
};
pub use definitions::{DefinitionStore, SourceLookup};
pub use desk::*;
pub use dispatch::{Claims, DispatchTx};
pub use effects::EffectStore;
pub use gate::Lane;
pub use keys::{
    AdminKeyState, ApiKey, KeyChange, KeyPatch, KeyStore, MAX_KEYS_PER_TENANT, NewKey, Scope,
};
pub use model::*;
pub use offboarding::{ERASED, ErasedTable, Finished, OffboardingStore, RowsLeft};
pub use operations::{
    Applied, NewOperation, Operation, OperationAction, OperationLoop, OperationStore, RunAction,
};
pub use postgres::PgStore;
pub use queue_samples::{QUEUE_SAMPLES_KEPT, QueueSample, QueueSampleStore, QueueSampling};
pub use relay::{Heard, StreamRelay};
pub use retention::{Expiring, MovedRows, PartitionProblem, RetentionStore};
pub use routed::{RoutedStore, TENANT_DATABASE_RETRY, TenantDatabases};
pub use rows::{IDEMPOTENCY_WINDOW, advance_clock, now, now_ms};
pub use schedule::{DueTrigger, ScheduleStore, SchedulerWake, StaleSchedule};
pub use secrets::{Keyring, Reseal, Resealed, SecretError};
pub use signals::{NewSignal, SignalSent, SignalStore};
pub use sqlite::{DEFAULT_WAL_LIMIT, SqliteSettings, SqliteStore, WorkLeft};
pub use watch::{
    ExpiringJob, NewPlatformIncident, OverdueWait, PlatformIncident, RunFailure, SingletonKey,
    UnfinishedRun, UnstartedRun, WatchStore,
};
pub use widgets::{NewWidget, Widget, WidgetPatch, WidgetStore};

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration {name} failed: {source}")]
    Migration {
        name: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("unsupported database URL `{0}`: expected sqlite://… or postgres://…")]
    UnsupportedUrl(String),
    /// The claim token no longer matches: another worker took the job over
    /// after this one's lease expired. The result must be discarded.
    #[error("lease on job {0} was lost; the result is discarded")]
    LeaseLost(JobId),
    #[error("{0} not found")]
    NotFound(&'static str),
    /// A column of a row the store read could not be decoded as what the
    /// store expects there (a value written by hand, or by another
    /// version): the read fails with where, never a panic.
    #[error("column `{column}` of table `{table}` cannot be read: {cause}")]
    Decode {
        table: &'static str,
        column: &'static str,
        cause: String,
    },
    /// A name or key that is unique where it lives (a connection's or a
    /// widget's name, a ticket's external id, an idempotency key) is held
    /// by another row: nothing was written. The message names it.
    #[error("{0}")]
    Taken(String),
    /// The row changed since the caller read it (another writer came
    /// first): nothing was written; reading it again and sending the
    /// change again may pass.
    #[error("{0}")]
    Changed(String),
    /// What the change is about is not in a state that allows it (a run
    /// that is not paused, a tenant being deleted, a limit reached):
    /// nothing was written. The message says what it is in and what would
    /// allow it.
    #[error("{0}")]
    InvalidState(String),
    /// A rule the store keeps between its own rows, or between the store
    /// and its callers, was found broken (a bug, or rows written by hand):
    /// nothing of the call was kept.
    #[error("the store found a broken rule: {0}")]
    Invariant(String),
    /// The database could not take the write; nothing was written.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The tenant's own database does not answer now (named here as the
    /// logs name it, `TOK_TENANT_DATABASES`' entry; never its URL): nothing
    /// was read or written there. Its calls fail at once while it stays
    /// away; tok tries it again every
    /// [`TENANT_DATABASE_RETRY`](routed::TENANT_DATABASE_RETRY) and carries
    /// on once it answers.
    #[error("the tenant's database ({0}) does not answer; try again shortly")]
    TenantDatabaseUnavailable(String),
    /// This one input cannot be stored (its text has U+0000, or the
    /// database refused its row as invalid data): nothing of it was written,
    /// the writes that shared its transaction are unaffected, and sending it
    /// again fails the same way. The message says what is wrong.
    #[error("{0}")]
    Refused(String),
    /// A connection's credentials could not be sealed or opened: no key,
    /// or not the key they were sealed under (see [`SecretError`]).
    #[error(transparent)]
    Secret(#[from] SecretError),
}

impl StoreError {
    /// Whether this is [`StoreError::TenantDatabaseUnavailable`]: a pass
    /// over many tenants skips the tenant it names and goes on.
    pub fn is_tenant_database_away(&self) -> bool {
        matches!(self, StoreError::TenantDatabaseUnavailable(_))
    }

    /// Whether the database could not be reached or could not take the
    /// work now, whatever the data (a lost connection, a timeout, a
    /// database shutting down, a busy SQLite file, …): trying the same
    /// again later may pass.
    pub fn is_outage(&self) -> bool {
        storable::outage(self)
    }

    /// Whether the call clashed with what is stored ([`StoreError::Taken`],
    /// [`StoreError::Changed`], [`StoreError::InvalidState`]): the caller's
    /// to resolve, answered as a conflict.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            StoreError::Taken(_) | StoreError::Changed(_) | StoreError::InvalidState(_)
        )
    }

    /// Whether the data written was refused: by tok before writing it
    /// ([`StoreError::Refused`]), by the database as invalid (a value too
    /// big for its index, a violated constraint), or by the driver that
    /// could not encode it. Writing the same fails the same way.
    pub fn is_refused_data(&self) -> bool {
        matches!(
            self,
            StoreError::Refused(_) | StoreError::Database(sqlx::Error::Encode(_))
        ) || storable::refused_row(self)
    }
}

/// The event inbox and the dispatcher's transaction.
#[async_trait]
pub trait InboxStore: Send + Sync {
    /// Writes one inbox row, or finds the row this idempotency key already
    /// wrote within the last 24 hours. Returns once the row is committed.
    async fn accept_event(&self, tenant: &TenantId, event: NewEvent)
    -> Result<(EventId, Accepted)>;

    /// Opens the dispatcher's transaction for the pending events of
    /// `tenants` ([`DispatchTx`]). `lane` is where it waits for a store
    /// with one writer (SQLite): [`Lane::Urgent`] for the events of tenants
    /// that do not crowd the queue, which then wait for no queued claim or
    /// dispatch.
    async fn begin_dispatch(&self, tenants: &[TenantId], lane: Lane)
    -> Result<Box<dyn DispatchTx>>;

    /// Starts one run directly (a manual start): writes its event, the run
    /// and its first job in one transaction. A repeated idempotency key
    /// returns the run the first call created.
    async fn start_run(&self, tenant: &TenantId, event: NewEvent, run: NewRun) -> Result<RunId>;

    /// [`InboxStore::start_run`] under the automation's
    /// `settings.limits.startsPerMinute`: when the starts of the last
    /// minute reached it, nothing is written and the answer says when a
    /// start frees up. A repeated idempotency key still answers its run.
    async fn start_run_limited(
        &self,
        tenant: &TenantId,
        event: NewEvent,
        run: NewRun,
        starts_per_minute: Option<u32>,
    ) -> Result<Started>;

    /// The run of `automation` its start's idempotency key `key` started,
    /// if there is one.
    async fn run_by_idempotency_key(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
        key: &str,
    ) -> Result<Option<RunId>>;

    /// One event of the tenant, if the inbox still keeps it.
    async fn event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<StoredEvent>>;

    /// Sets the tenant's pending event `id` aside: its status becomes
    /// `failed`, with `error`, and no dispatch takes it again (a replay
    /// does). The dispatcher does so with an event whose runs it cannot
    /// plan or write for a reason of the event's own, so that the events
    /// dispatched with it go on. False when it was no longer pending.
    async fn set_aside(&self, tenant: &TenantId, id: &EventId, error: &str) -> Result<bool>;

    /// Writes a replay of the tenant's event `id` ([`ReplayMode`]): a new
    /// pending event with its source, body, params and loop depth, that the
    /// dispatcher then takes like any other (its filters, start controls
    /// and loop protection apply). `None` when the inbox does not keep the
    /// event. Replays of one event are decided one after the other.
    async fn replay_event(
        &self,
        tenant: &TenantId,
        id: &EventId,
        mode: ReplayMode,
    ) -> Result<Option<Replayed>>;

    /// A page of the events a filtered replay takes, oldest first, after
    /// the event id `after`.
    async fn events(
        &self,
        tenant: &TenantId,
        filter: &EventFilter,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<StoredEvent>>;

    /// How many events a filtered replay takes.
    async fn count_events(&self, tenant: &TenantId, filter: &EventFilter) -> Result<i64>;
}

/// What [`InboxStore::start_run_limited`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    Run(RunId),
    /// Over the limit: a start frees up in this many milliseconds.
    Limited {
        retry_after_ms: i64,
    },
}

/// Reading runs.
#[async_trait]
pub trait RunStore: Send + Sync {
    async fn runs(
        &self,
        tenant: &TenantId,
        filter: &RunFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<RunSummary>>;
    async fn run(&self, tenant: &TenantId, id: &RunId) -> Result<Option<RunDetail>>;
    /// Stops an unfinished run: its job and waits go, its step in flight
    /// (if any) has its result discarded.
    async fn cancel_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary>;
    /// Holds a run: no new step starts; the one in flight finishes.
    async fn pause_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary>;
    async fn resume_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary>;
    /// Continues a failed run from the step that failed, with its context
    /// as it was: the steps before it do not run again.
    async fn retry_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary>;

    /// The contexts of these runs of the tenant (those it has), for a
    /// filter over what the runs carry (`where`).
    async fn run_contexts(
        &self,
        tenant: &TenantId,
        ids: &[RunId],
    ) -> Result<Vec<(RunId, serde_json::Value)>>;

    /// How many bytes [`RunStore::run_contexts`] reads for each of these
    /// runs of the tenant (those it has): its context as last written
    /// whole, as JSON text, and the changes recorded since. A caller reads
    /// contexts in batches bounded by these.
    async fn run_context_sizes(
        &self,
        tenant: &TenantId,
        ids: &[RunId],
    ) -> Result<Vec<(RunId, i64)>>;
}

/// The job queue: claim, heartbeat, record.
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Leases up to `limit` ready jobs of `tenants` to `node` for `lease_ms`
    /// (database clock): fair between tenants (round robin by each tenant's
    /// own order of priority, then due time), at most one leased job per
    /// queue key, and per queue key first come first served: a job waits
    /// while an older job of its key is due or running (one that sleeps in a
    /// `wait` or a retry back-off does not block it). Held jobs (paused
    /// runs) are skipped. A tenant with `settings.limits.concurrency` never
    /// has more of its jobs leased at once (counted across every process
    /// sharing the database) than its cap: its jobs wait while its leases
    /// fill it. Marks their runs `running`.
    async fn claim(
        &self,
        tenants: &[TenantId],
        node: &str,
        limit: u32,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedJob>> {
        self.claim_except(tenants, node, limit, lease_ms, &[]).await
    }

    /// [`QueueStore::claim`], passing over the jobs in `running`: those the
    /// caller still runs itself, whose leases may have expired while its
    /// heartbeats failed (the database away for longer than a lease).
    /// Another process may take them over; the caller must not, or one
    /// process would run one job twice at once.
    async fn claim_except(
        &self,
        tenants: &[TenantId],
        node: &str,
        limit: u32,
        lease_ms: i64,
        running: &[JobId],
    ) -> Result<Vec<ClaimedJob>>;

    /// Extends the leases `node` still holds on `claims`, each a job and the
    /// claim token it was leased under: a job leased again since (to this
    /// process or another) under another token keeps its new lease as it
    /// is. Returns how many leases it extended.
    async fn heartbeat(
        &self,
        node: &str,
        claims: &[(JobId, String)],
        lease_ms: i64,
    ) -> Result<Vec<JobId>>;

    /// Writes a claim's outcome: the step records, the run's new state and the
    /// next job, all or nothing. Fails with [`StoreError::LeaseLost`] (and
    /// writes nothing) when the claim token no longer matches.
    async fn record(&self, job: &ClaimedJob, record: Record) -> Result<()>;

    /// [`QueueStore::record`] for a record whose next job is
    /// [`NextJob::Continue`]: returns whether the job stays leased to the
    /// caller under the new token (false when the run was paused meanwhile:
    /// then the job was released and held back like any paused run's).
    async fn record_and_continue(&self, job: &ClaimedJob, record: Record) -> Result<bool>;

    /// Releases the leases no live process holds but `holder`
    /// (`node:incarnation`): on PostgreSQL those held under `holder`; on
    /// SQLite, which one process serves, every lease. Called at a start
    /// and after the shutdown grace.
    async fn release_claims(&self, node: &str) -> Result<u64>;

    async fn queue_stats(&self, tenants: &[TenantId]) -> Result<QueueStats>;

    /// How many of `tenants`' runs each kind of hold holds now, by the
    /// kinds a row says alone (`tok_core::blocked`): a wait's (`approval`,
    /// `signal`, `runs`), a held job's limit (`throttle`, `debounce`,
    /// `batch`, `breaker`, `connection_concurrency`, `connection_rate`)
    /// and a job due later with nothing else (`timer`). The kinds that
    /// depend on other runs (`queue_key`, `tenant_concurrency`) are not
    /// counted here. Kinds with none are left out.
    async fn held_counts(&self, tenants: &[TenantId]) -> Result<Vec<(String, i64)>>;
}

/// Everything a tok process needs from its database.
#[async_trait]
pub trait Store:
    AdminStore
    + KeyStore
    + DefinitionStore
    + SourceLookup
    + InboxStore
    + RunStore
    + QueueStore
    + QueueSampleStore
    + QueueSampling
    + DeskStore
    + RecordStore
    + ConnectionStore
    + SignalStore
    + ScheduleStore
    + SchedulerWake
    + WatchStore
    + WidgetStore
    + RetentionStore
    + ApprovalStore
    + EffectStore
    + AuditStore
    + OperationStore
    + OperationLoop
    + OffboardingStore
{
    fn backend(&self) -> Backend;
    /// Applies pending migrations (serialized between processes on
    /// PostgreSQL), then seals the credentials still stored plain under
    /// the newest key ([`Reseal::Plain`]); without a key it leaves them,
    /// and warns.
    async fn migrate(&self) -> Result<()>;
    /// Seals the credentials `which` names under the newest key, in every
    /// database of the store, tenant by tenant in short batches; says how
    /// many per database. Idempotent: what is sealed under the newest key
    /// stays. [`Reseal::All`] without a key is [`SecretError::NoKey`].
    async fn seal_credentials(&self, which: Reseal) -> Result<Vec<Resealed>>;
    /// Creates what must exist ahead of time (monthly partitions).
    async fn maintain(&self) -> Result<()>;
    /// Answers when the database does (with tenants on databases of their
    /// own, the shared one: see [`RoutedStore`]).
    async fn ping(&self) -> Result<()>;
    /// Ends the store's use at a clean shutdown, once nothing else will use
    /// it. SQLite checkpoints its write-ahead log whole, truncates it and
    /// closes its connections, so a stopped node leaves one database file;
    /// PostgreSQL has nothing to do.
    async fn close(&self) -> Result<()> {
        Ok(())
    }
    /// The databases this process could not reach to migrate, or that do
    /// not answer now, as the logs name them: tenant databases of a
    /// [`RoutedStore`], which migrates each once it answers. None on one
    /// database.
    fn unreachable_databases(&self) -> Vec<String> {
        Vec::new()
    }
    /// Calls `wake` whenever another process made jobs ready (PostgreSQL's
    /// LISTEN/NOTIFY), so idle workers claim at once instead of at their
    /// next poll, until `wake` returns false. SQLite serves one process:
    /// nothing to listen to.
    async fn listen_for_work(&self, wake: Wake) -> Result<()> {
        let _ = wake;
        Ok(())
    }
    /// The relay that sends this process's committed stream events to the
    /// other processes (see [`relay`]); `None` where one process serves
    /// everything (SQLite).
    async fn stream_relay(&self) -> Result<Option<Box<dyn StreamRelay>>> {
        Ok(None)
    }
    /// Calls `heard` with what every process sends through its relay.
    async fn listen_stream(&self, heard: Heard) -> Result<()> {
        let _ = heard;
        Ok(())
    }
}

/// What [`Store::listen_for_work`] calls; false ends the listening.
pub type Wake = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

/// Opens the store a URL names: `sqlite://path` (created if missing) or
/// `postgres://…`. `max_connections` bounds the PostgreSQL pool. `keys`
/// seal and open connection credentials (`TOK_SECRET_KEY`); when empty,
/// SQLite uses the key file beside its database (made on first use,
/// [`key_file`]) and PostgreSQL refuses credentials.
pub async fn connect(url: &str, max_connections: u32, keys: &Keyring) -> Result<Arc<dyn Store>> {
    connect_with(url, max_connections, keys, SqliteSettings::default()).await
}

/// [`connect`], a SQLite store opened with `sqlite`.
pub async fn connect_with(
    url: &str,
    max_connections: u32,
    keys: &Keyring,
    sqlite: SqliteSettings,
) -> Result<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open_with(url, keys, sqlite).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(
            PgStore::connect(url, max_connections)
                .await?
                .with_keys(keys.clone()),
        ))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_owned()))
    }
}

/// [`connect_with`], or with tenants on databases of their own
/// ([`RoutedStore`]) when `tenants` names any: then every URL must be
/// PostgreSQL.
pub async fn connect_routed(
    url: &str,
    tenants: &TenantDatabases,
    max_connections: u32,
    keys: &Keyring,
    sqlite: SqliteSettings,
) -> Result<Arc<dyn Store>> {
    if tenants.is_empty() {
        return connect_with(url, max_connections, keys, sqlite).await;
    }
    if !(url.starts_with("postgres:") || url.starts_with("postgresql:")) {
        return Err(StoreError::UnsupportedUrl(format!(
            "{url}` (tenants on databases of their own need a PostgreSQL shared database, postgres://…)"
        )));
    }
    Ok(Arc::new(
        RoutedStore::connect(url, tenants, max_connections, keys).await?,
    ))
}

/// SHA-256 of a secret, hex-encoded: how API keys are stored and looked up.
pub fn hash_secret(secret: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A new random token (webhook tokens, API keys, claim tokens): 32 hex chars.
pub fn random_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
