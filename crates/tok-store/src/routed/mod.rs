//! `db_for(tenant)`: named tenants on their own PostgreSQL database beside
//! the shared one (`docs/operations.md`, "Tenants on databases of their
//! own").
//!
//! [`RoutedStore`] implements [`Store`] over a shared database and any
//! number of tenant databases, all PostgreSQL, all migrated alike. Which
//! tenant lives where is configuration ([`TenantDatabases`]:
//! `TOK_TENANT_DATABASES`, `TOK_TENANT_DATABASES_FILE`).
//!
//! # What lives where, and why
//!
//! - **The shared database** holds the platform: the tenant registry
//!   (`tenants`: names, settings, retention), the API keys (a key names its
//!   tenant before anything else is known), the audit log (who did what
//!   with which key, every tenant's, see [`crate::audit`]), the platform
//!   incidents, the scheduler's wake lease and the stream relay's channel
//!   (one per cluster, not per tenant). It also holds every tenant not
//!   named in the configuration, with all its rows.
//! - **A tenant's database** holds everything of that tenant's work: its
//!   sources, automations and versions, inbox, runs, steps, jobs, waits,
//!   signals, schedules, desk (ticket types, groups, tickets, trace,
//!   incidents), connections, approvals, widgets and stored effects. Its
//!   `tenants` row is a copy kept from the shared one (the tables reference
//!   it); the shared row is the one read and written.
//!
//! So every call that names a tenant runs on that tenant's database
//! (`db_for`), and the work of one step (claim, record transaction,
//! dispatch) never leaves it. The calls over many tenants (claims,
//! heartbeats, dispatch, queue stats, the scheduler's reads, partitions)
//! go through one helper, [`RoutedStore::gather`]: each database is asked
//! its part at once, in parallel, each within its timeout; the answers
//! are put together, and a database that failed is skipped and logged,
//! not returned for all (an error only when every database asked failed).
//! Nothing joins two tenants and no transaction spans two databases. A
//! dispatch over tenants of several databases opens one transaction on
//! each and commits each: each database's events, runs and jobs commit
//! together or not at all; should one commit fail, that database's events
//! stay pending for the next dispatch, as after any failed dispatch.
//!
//! # One tenant database down hurts only its tenants
//!
//! Tenant databases are connected lazily, so a start does not wait for
//! them: the shared database is migrated at the start (its failure stops
//! it); a tenant database that does not answer is skipped, logged, and
//! migrated (and listened to for work) once it answers (see
//! [`database`]). While a tenant database is away, the calls routed to it
//! fail at once with [`StoreError::TenantDatabaseUnavailable`] (the API's
//! 503 `tenant_database_unavailable`), the calls over many skip it, and
//! readiness ([`Store::ping`]) asks the shared database only. A heartbeat
//! renews each database's leases in parallel, each within a third of the
//! lease at most, so a database that hangs delays the next round of the
//! others' renewals by that third at most, well within their lease.
//!
//! Claims are fair between databases: each claim gives each database that
//! answers a share of `limit` (the larger shares in turn), and what one
//! could not fill goes to those that filled theirs. Workers listen for
//! work on every database. Job ids are numbered by each database; the
//! router starts each tenant database's job numbers in a range of its own
//! (picked at random, 2^40 ids wide), so that the jobs one worker holds
//! from two databases never share an id.
//!
//! A webhook token is looked up in every database at once; the shared
//! one's answer is taken first, and a source found in a database its
//! tenant is not routed to (rows left behind by a move) is not taken. A
//! token found nowhere while a database is away answers that the database
//! is away, not that there is no such webhook.
//!
//! Moving a tenant is [`copy_tenant`] (the rows, one transaction on the
//! target) between stopping its processes and switching the configuration;
//! `docs/operations.md` has the procedure.

mod config;
pub(crate) mod database;
mod moving;
mod offboarding;
mod split_dispatch;
mod wake;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::{BoxFuture, join_all};
use serde_json::Value;
use sqlx::Row as _;
use sqlx::types::Json;
use tok_core::ids::{AutomationId, EventId, JobId, RunId, TenantId};
use tok_core::retention::Retention;

pub(crate) use config::redact;
pub use config::{DEFAULT_TENANT_DATABASE_TIMEOUT, TenantDatabases};
pub use database::TENANT_DATABASE_RETRY;
pub use moving::{Copied, copy_tenant, forget_tenant};

use crate::dispatch::DispatchTx;
use crate::*;
use database::Database;
use split_dispatch::{Part, SplitDispatch};

/// The store over the shared database and the tenant databases.
pub struct RoutedStore {
    /// `dbs[0]` is the shared database.
    dbs: Vec<Arc<Database>>,
    /// Configured tenant (id or name) → index in `dbs`.
    keys: HashMap<String, usize>,
    /// The database of `*`, if any.
    every: Option<usize>,
    /// Tenants resolved so far → index in `dbs`.
    routes: RwLock<HashMap<TenantId, usize>>,
    /// Tenants whose `tenants` row this process copied to their database.
    mirrored: RwLock<HashSet<TenantId>>,
    /// Which database a claim gives the larger share first.
    turn: AtomicUsize,
    /// The engine's work listener, once it asked for one: a tenant
    /// database that comes back is listened to with it.
    wake: Arc<Mutex<Option<Wake>>>,
    /// The tasks that try tenant databases away again, started once.
    watching: Once,
}

/// Each database's part of a call over several: its index and what it is
/// asked with.
type Parts<A> = Vec<(usize, A)>;

impl RoutedStore {
    /// Connects the shared database, and opens a lazy pool on every
    /// database `tenants` names (one pool each, of at most
    /// `max_connections`; entries naming the same URL share it, one naming
    /// the shared URL means the shared one): a tenant database is first
    /// reached when it is migrated or asked. Every database seals and opens
    /// credentials with `secret_keys`.
    pub async fn connect(
        shared_url: &str,
        tenants: &TenantDatabases,
        max_connections: u32,
        secret_keys: &Keyring,
    ) -> Result<Self> {
        let shared = PgStore::connect(shared_url, max_connections)
            .await?
            .with_keys(secret_keys.clone());
        let mut urls = vec![shared_url.to_owned()];
        let mut names: Vec<Vec<&str>> = vec![Vec::new()];
        let mut keys = HashMap::new();
        let mut every = None;
        for (key, url) in tenants.entries() {
            let index = match urls.iter().position(|u| u == url) {
                Some(i) => i,
                None => {
                    urls.push(url.clone());
                    names.push(Vec::new());
                    urls.len() - 1
                }
            };
            names[index].push(key);
            if key == "*" {
                every = Some(index);
            } else {
                keys.insert(key.clone(), index);
            }
        }
        let timeout = tenants.timeout();
        let mut dbs = vec![Arc::new(Database::shared(shared, shared_url, timeout))];
        for (url, names) in urls.iter().zip(&names).skip(1) {
            let store = PgStore::connect_lazy(url, max_connections, timeout)?
                .with_keys(secret_keys.clone());
            dbs.push(Arc::new(Database::tenant(
                store,
                names.join(","),
                url,
                timeout,
            )));
        }
        Ok(Self {
            dbs,
            keys,
            every,
            routes: RwLock::new(HashMap::new()),
            mirrored: RwLock::new(HashSet::new()),
            turn: AtomicUsize::new(0),
            wake: Arc::default(),
            watching: Once::new(),
        })
    }

    /// How many databases: the shared one and the tenants'.
    pub fn databases(&self) -> usize {
        self.dbs.len()
    }

    /// The shared database.
    pub fn shared(&self) -> &PgStore {
        &self.dbs[0].store
    }

    /// The index (0: the shared one) of the database of `tenant`: the
    /// entry naming its id, else its name, else `*`, else the shared one.
    /// A tenant the shared database does not know is answered there
    /// (as not found). Asks the shared database only.
    pub async fn db_index(&self, tenant: &TenantId) -> Result<usize> {
        if let Some(&i) = self.read_routes().get(tenant) {
            return Ok(i);
        }
        if self.keys.is_empty() && self.every.is_none() {
            return Ok(0);
        }
        let Some(found) = AdminStore::tenant(self.shared(), tenant).await? else {
            return Ok(0);
        };
        let index = self.index_of(found.id.as_str(), &found.name);
        self.routes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tenant.clone(), index);
        Ok(index)
    }

    /// The index of the database the configuration puts the tenant of
    /// this id and name on.
    fn index_of(&self, id: &str, name: &str) -> usize {
        self.keys
            .get(id)
            .or_else(|| self.keys.get(name))
            .copied()
            .or(self.every)
            .unwrap_or(0)
    }

    /// The database of `tenant`, its `tenants` row copied there once per
    /// process (fails at once while that database is away).
    async fn db_for(&self, tenant: &TenantId) -> Result<&Database> {
        let db = &*self.dbs[self.db_index(tenant).await?];
        let mirrored = || {
            self.mirrored
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains(tenant)
        };
        if !db.is_shared() && !mirrored() {
            let row = tenant_row(self.shared(), tenant).await?;
            if let Some(row) = row {
                db.call(put_tenant_row(&db.store, row)).await?;
            }
            self.mirrored
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(tenant.clone());
        }
        Ok(db)
    }

    fn read_routes(&self) -> std::sync::RwLockReadGuard<'_, HashMap<TenantId, usize>> {
        self.routes.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the tenant's shared row again to its database, if it has
    /// one. The shared row is the one read (the copy is there for the
    /// tables that reference it), so a copy that failed is only logged,
    /// and made again at the tenant's next call.
    async fn refresh_mirror(&self, tenant: &TenantId) {
        self.mirrored
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tenant);
        if let Err(e) = self.db_for(tenant).await {
            tracing::warn!(%tenant, error = %e, "the tenant's row could not be copied to its database; copied at its next call");
        }
    }

    /// `tenants` by database, in the order of the databases, each
    /// database's tenants in the order given; databases with none left out.
    async fn split(&self, tenants: &[TenantId]) -> Result<Parts<Vec<TenantId>>> {
        let mut parts: Parts<Vec<TenantId>> = Vec::new();
        for tenant in tenants {
            let index = self.db_index(tenant).await?;
            match parts.iter_mut().find(|(i, _)| *i == index) {
                Some((_, part)) => part.push(tenant.clone()),
                None => parts.push((index, vec![tenant.clone()])),
            }
        }
        parts.sort_by_key(|(i, _)| *i);
        Ok(parts)
    }

    /// Every database, asked with nothing of its own.
    fn every_database(&self) -> Parts<()> {
        (0..self.dbs.len()).map(|i| (i, ())).collect()
    }

    /// Asks each database of `parts` its part at once (`ask(database,
    /// part)`), each within its timeout, or `bound` when shorter: every
    /// answer, in the order of `parts`.
    async fn each<'a, A, T, Fut>(
        &'a self,
        parts: Parts<A>,
        bound: Option<Duration>,
        ask: impl Fn(&'a PgStore, A) -> Fut,
    ) -> Vec<(usize, Result<T>)>
    where
        Fut: Future<Output = Result<T>>,
    {
        join_all(parts.into_iter().map(|(i, part)| {
            let db = &*self.dbs[i];
            let asked = ask(&db.store, part);
            async move {
                let answer = match bound {
                    Some(bound) => db.ask_within(bound, asked).await,
                    None => db.ask(asked).await,
                };
                (i, answer)
            }
        }))
        .await
    }

    /// The one way a call over many databases is asked: [`Self::each`],
    /// keeping what answered. A database that failed is skipped and logged
    /// (counted in `tok_database_errors_total`); the call fails only when
    /// every database asked did, with the first error.
    async fn gather<'a, A, T, Fut>(
        &'a self,
        what: &str,
        parts: Parts<A>,
        ask: impl Fn(&'a PgStore, A) -> Fut,
    ) -> Result<Vec<(usize, T)>>
    where
        Fut: Future<Output = Result<T>>,
    {
        self.kept(what, self.each(parts, None, ask).await)
    }

    /// The answers of [`Self::each`] that succeeded (see [`Self::gather`]).
    fn kept<T>(&self, what: &str, answers: Vec<(usize, Result<T>)>) -> Result<Vec<(usize, T)>> {
        let mut kept = Vec::with_capacity(answers.len());
        let mut failed = None;
        for (i, answer) in answers {
            match answer {
                Ok(value) => kept.push((i, value)),
                Err(e) => {
                    self.dbs[i].skipped(what, &e);
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if kept.is_empty() => Err(e),
            _ => Ok(kept),
        }
    }

    /// The answers of [`Self::each`], the first error if any failed: for
    /// what must be done on every database or reported (resealing).
    fn all_of<T>(answers: Vec<(usize, Result<T>)>) -> Result<Vec<T>> {
        answers.into_iter().map(|(_, answer)| answer).collect()
    }

    /// [`Self::gather`] over the databases of `tenants`, each asked with
    /// its own.
    async fn by_database<'a, T, Fut>(
        &'a self,
        what: &str,
        tenants: &[TenantId],
        ask: impl Fn(&'a PgStore, Vec<TenantId>) -> Fut,
    ) -> Result<Vec<T>>
    where
        Fut: Future<Output = Result<T>>,
    {
        let parts = self.split(tenants).await?;
        let answers = self.gather(what, parts, ask).await?;
        Ok(answers.into_iter().map(|(_, answer)| answer).collect())
    }

    /// The names of the tenant databases this process could not reach
    /// (not migrated, or away now).
    pub fn unreachable(&self) -> Vec<String> {
        self.dbs[1..]
            .iter()
            .filter_map(|db| db.unreachable_name())
            .map(str::to_owned)
            .collect()
    }
}

/// `limit` shared out between `n` databases: as even as it goes, the
/// larger shares first.
fn shares(limit: u32, n: usize) -> Vec<u32> {
    let n32 = n.max(1) as u32;
    (0..n as u32)
        .map(|k| limit / n32 + u32::from(k < limit % n32))
        .collect()
}

/// What one database's part of a claim is: its share of `limit` for its
/// tenants; answers the jobs, with the share and the tenants.
fn claim_share<'a>(
    node: &'a str,
    lease_ms: i64,
    running: &'a [JobId],
) -> impl Fn(&'a PgStore, (Vec<TenantId>, u32)) -> BoxFuture<'a, Result<Claimed>> + Copy {
    move |db, (tenants, share)| {
        Box::pin(async move {
            let jobs = db
                .claim_except(&tenants, node, share, lease_ms, running)
                .await?;
            Ok((jobs, share, tenants))
        })
    }
}

/// A database's part of a claim: the jobs, its share, its tenants.
type Claimed = (Vec<ClaimedJob>, u32, Vec<TenantId>);

/// A tenant's shared registry row, as its database keeps a copy of it.
struct TenantRow {
    id: String,
    name: String,
    settings: Json<Value>,
    created_at: i64,
}

/// The `tenants` row of `tenant` in `db`, if any.
async fn tenant_row(db: &PgStore, tenant: &TenantId) -> Result<Option<TenantRow>> {
    let row = sqlx::query("SELECT id, name, settings, created_at FROM tenants WHERE id = $1")
        .bind(tenant.as_str())
        .fetch_optional(db.pool())
        .await?;
    Ok(row.map(|row| TenantRow {
        id: row.get("id"),
        name: row.get("name"),
        settings: row.get("settings"),
        created_at: row.get("created_at"),
    }))
}

/// Upserts `row` into the `tenants` of `db`.
async fn put_tenant_row(db: &PgStore, row: TenantRow) -> Result<()> {
    sqlx::query(
        "INSERT INTO tenants (id, name, settings, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, settings = EXCLUDED.settings",
    )
    .bind(row.id)
    .bind(row.name)
    .bind(row.settings)
    .bind(row.created_at)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Generates an impl of `$trait` whose functions each take the tenant
/// first and run on that tenant's database, and adds the functions given
/// after `also` as they are.
macro_rules! by_tenant {
    (
        impl $trait:ident {
            $( fn $name:ident(&self, $tenant:ident: &TenantId $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty; )*
        }
        $( also { $($also:tt)* } )?
    ) => {
        #[async_trait]
        impl $trait for RoutedStore {
            $(
                async fn $name(&self, $tenant: &TenantId $(, $arg: $ty)*) -> $ret {
                    let db = self.db_for($tenant).await?;
                    db.call(<PgStore as $trait>::$name(&db.store, $tenant $(, $arg)*)).await
                }
            )*
            $( $($also)* )?
        }
    };
}

#[async_trait]
impl AdminStore for RoutedStore {
    async fn create_tenant(&self, name: &str, key_hash: &str) -> Result<Tenant> {
        let tenant = self.shared().create_tenant(name, key_hash).await?;
        // Created: its database learns of it now, or at its first call.
        self.refresh_mirror(&tenant.id).await;
        Ok(tenant)
    }
    async fn tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        self.shared().tenant(id).await
    }
    async fn update_tenant(&self, id: &TenantId, patch: TenantPatch) -> Result<Option<Tenant>> {
        // A new name must not move the tenant to another database: its
        // rows would be left behind on the one it is on.
        if let Some(name) = &patch.name
            && self.shared().tenant(id).await?.is_some()
        {
            let (now, then) = (self.db_index(id).await?, self.index_of(id.as_str(), name));
            if now != then {
                return Err(StoreError::InvalidState(format!(
                    "TOK_TENANT_DATABASES routes tenant {id} by name: renamed `{name}`, it would \
                     be looked for on another database than the one its rows are on; route it \
                     by its id first (`{id}=<url>`), then rename it"
                )));
            }
        }
        let updated = self.shared().update_tenant(id, patch).await?;
        if updated.is_some() {
            self.refresh_mirror(id).await;
        }
        Ok(updated)
    }
    async fn tenants(&self, limit: u32, after: Option<&str>) -> Result<Page<Tenant>> {
        self.shared().tenants(limit, after).await
    }
    async fn tenant_ids(&self) -> Result<Vec<TenantId>> {
        self.shared().tenant_ids().await
    }
}

/// Keys live in the shared database: a key's hash is what names its tenant.
#[async_trait]
impl KeyStore for RoutedStore {
    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>> {
        self.shared().key_by_hash(hash).await
    }
    async fn create_key(&self, tenant: &TenantId, key: NewKey) -> Result<ApiKey> {
        self.shared().create_key(tenant, key).await
    }
    async fn keys(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<ApiKey>> {
        self.shared().keys(tenant, limit, after).await
    }
    async fn revoke_key(&self, tenant: &TenantId, id: &str) -> Result<KeyChange> {
        self.shared().revoke_key(tenant, id).await
    }

    async fn update_key(&self, tenant: &TenantId, id: &str, patch: KeyPatch) -> Result<KeyChange> {
        self.shared().update_key(tenant, id, patch).await
    }
    async fn touch_key(&self, id: &str, at: i64) -> Result<()> {
        self.shared().touch_key(id, at).await
    }
    async fn has_admin_key(&self) -> Result<bool> {
        self.shared().has_admin_key().await
    }
    async fn add_admin_key(&self, hash: &str) -> Result<()> {
        self.shared().add_admin_key(hash).await
    }
    async fn admin_key_state(&self, hash: &str) -> Result<AdminKeyState> {
        self.shared().admin_key_state(hash).await
    }
    async fn rotate_admin_key(&self, hash: &str) -> Result<u64> {
        self.shared().rotate_admin_key(hash).await
    }
}

/// A webhook token is looked up in every database at once (see the
/// module doc).
#[async_trait]
impl SourceLookup for RoutedStore {
    async fn source_by_token(&self, token: &str) -> Result<Option<Source>> {
        let found = self
            .each(self.every_database(), None, |db, ()| {
                db.source_by_token(token)
            })
            .await;
        let mut failed = None;
        for (index, answer) in found {
            match answer {
                Ok(Some(source)) if self.db_index(&source.tenant_id).await? == index => {
                    return Ok(Some(source));
                }
                Ok(_) => {}
                Err(e) => {
                    self.dbs[index].skipped("webhook token", &e);
                    failed.get_or_insert(e);
                }
            }
        }
        // Found nowhere, but a database did not answer: it may be its.
        failed.map_or(Ok(None), Err)
    }
}

by_tenant! {
    impl InboxStore {
        fn accept_event(&self, tenant: &TenantId, event: NewEvent) -> Result<(EventId, Accepted)>;
        fn start_run(&self, tenant: &TenantId, event: NewEvent, run: NewRun) -> Result<RunId>;
        fn start_run_limited(&self, tenant: &TenantId, event: NewEvent, run: NewRun, starts_per_minute: Option<u32>) -> Result<Started>;
        fn run_by_idempotency_key(&self, tenant: &TenantId, automation: &AutomationId, key: &str) -> Result<Option<RunId>>;
        fn event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<StoredEvent>>;
        fn set_aside(&self, tenant: &TenantId, id: &EventId, error: &str) -> Result<bool>;
        fn replay_event(&self, tenant: &TenantId, id: &EventId, mode: ReplayMode) -> Result<Option<Replayed>>;
        fn events(&self, tenant: &TenantId, filter: &EventFilter, limit: u32, after: Option<&str>) -> Result<Page<StoredEvent>>;
        fn count_events(&self, tenant: &TenantId, filter: &EventFilter) -> Result<i64>;
    }
    also {
        async fn begin_dispatch(
            &self,
            tenants: &[TenantId],
            lane: Lane,
        ) -> Result<Box<dyn DispatchTx>> {
            let parts = self.split(tenants).await?;
            if parts.iter().all(|(i, _)| *i == 0) {
                let tenants = parts.into_iter().next().map(|(_, t)| t).unwrap_or_default();
                return self.shared().begin_dispatch(&tenants, lane).await;
            }
            let began = self
                .gather("dispatch", parts, |db, tenants| async move {
                    let tx = db.begin_dispatch(&tenants, lane).await?;
                    Ok((tx, tenants))
                })
                .await?;
            let parts = began
                .into_iter()
                .map(|(i, (tx, tenants))| {
                    let db = self.dbs[i].clone();
                    (Part { db, tx }, tenants)
                })
                .collect();
            Ok(Box::new(SplitDispatch::new(parts)))
        }
    }
}

by_tenant! {
    impl RunStore {
        fn runs(&self, tenant: &TenantId, filter: &RunFilter, limit: u32, cursor: Option<&str>) -> Result<Page<RunSummary>>;
        fn run(&self, tenant: &TenantId, id: &RunId) -> Result<Option<RunDetail>>;
        fn cancel_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary>;
        fn pause_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary>;
        fn resume_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary>;
        fn retry_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary>;
        fn run_contexts(&self, tenant: &TenantId, ids: &[RunId]) -> Result<Vec<(RunId, Value)>>;
        fn run_context_sizes(&self, tenant: &TenantId, ids: &[RunId]) -> Result<Vec<(RunId, i64)>>;
    }
}

#[async_trait]
impl QueueStore for RoutedStore {
    async fn claim_except(
        &self,
        tenants: &[TenantId],
        node: &str,
        limit: u32,
        lease_ms: i64,
        running: &[JobId],
    ) -> Result<Vec<ClaimedJob>> {
        let mut parts = self.split(tenants).await?;
        // A database away takes no share (unless all are: then the claim
        // says why it has nothing).
        if parts.iter().any(|(i, _)| self.dbs[*i].is_up()) {
            parts.retain(|(i, _)| self.dbs[*i].is_up());
        }
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        // The larger shares go to each database in turn.
        let first = self.turn.fetch_add(1, Ordering::Relaxed) % parts.len();
        parts.rotate_left(first);
        let claim = claim_share(node, lease_ms, running);
        let asked = |parts: Parts<Vec<TenantId>>, limit: u32| -> Parts<(Vec<TenantId>, u32)> {
            let shares = shares(limit, parts.len());
            parts
                .into_iter()
                .zip(shares)
                .filter(|(_, share)| *share > 0)
                .map(|((i, tenants), share)| (i, (tenants, share)))
                .collect()
        };
        // Every database at once, each its share; then what some left goes
        // to those that filled theirs. The jobs claimed from the databases
        // that answered are kept whatever the others did: giving them up
        // would leave them leased to nobody.
        let mut claimed = Vec::new();
        let mut full = Vec::new();
        for (i, (jobs, share, tenants)) in self.gather("claim", asked(parts, limit), claim).await? {
            if jobs.len() as u32 == share {
                full.push((i, tenants));
            }
            claimed.extend(jobs);
        }
        let left = limit.saturating_sub(claimed.len() as u32);
        if left > 0 && !full.is_empty() {
            let more = self.each(asked(full, left), None, claim).await;
            for (_, (jobs, _, _)) in self.kept("claim", more).unwrap_or_default() {
                claimed.extend(jobs);
            }
        }
        Ok(claimed)
    }

    async fn heartbeat(
        &self,
        node: &str,
        claims: &[(JobId, String)],
        lease_ms: i64,
    ) -> Result<Vec<JobId>> {
        // Every database at once, each within a third of the lease: one
        // that hangs delays the others' next renewal by that much at most.
        let bound = Duration::from_millis((lease_ms / 3).max(1) as u64);
        let renewed = self
            .each(self.every_database(), Some(bound), |db, ()| {
                db.heartbeat(node, claims, lease_ms)
            })
            .await;
        Ok(self
            .kept("heartbeat", renewed)?
            .into_iter()
            .flat_map(|(_, ids)| ids)
            .collect())
    }

    async fn record(&self, job: &ClaimedJob, record: Record) -> Result<()> {
        let db = self.db_for(&job.tenant_id).await?;
        db.call(db.store.record(job, record)).await
    }

    async fn record_and_continue(&self, job: &ClaimedJob, record: Record) -> Result<bool> {
        let db = self.db_for(&job.tenant_id).await?;
        db.call(db.store.record_and_continue(job, record)).await
    }

    async fn release_claims(&self, node: &str) -> Result<u64> {
        let released = self
            .gather("release claims", self.every_database(), |db, ()| {
                db.release_claims(node)
            })
            .await?;
        Ok(released.into_iter().map(|(_, n)| n).sum())
    }

    async fn held_counts(&self, tenants: &[TenantId]) -> Result<Vec<(String, i64)>> {
        let parts = self
            .by_database("held runs", tenants, |db, tenants| async move {
                db.held_counts(&tenants).await
            })
            .await?;
        let mut total: std::collections::BTreeMap<String, i64> = Default::default();
        for (kind, n) in parts.into_iter().flatten() {
            *total.entry(kind).or_default() += n;
        }
        Ok(total.into_iter().collect())
    }

    async fn queue_stats(&self, tenants: &[TenantId]) -> Result<QueueStats> {
        let mut total = QueueStats::default();
        let parts = self
            .by_database("queue stats", tenants, |db, tenants| async move {
                db.queue_stats(&tenants).await
            })
            .await?;
        for stats in parts {
            total.ready += stats.ready;
            total.scheduled += stats.scheduled;
            total.running += stats.running;
            total.pending_events += stats.pending_events;
            total.oldest_ready_ms = match (total.oldest_ready_ms, stats.oldest_ready_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(total)
    }
}

by_tenant! {
    impl DeskStore {
        fn create_ticket_type(&self, tenant: &TenantId, new: NewTicketType) -> Result<TicketType>;
        fn ticket_types(&self, tenant: &TenantId) -> Result<Vec<TicketType>>;
        fn ticket_types_page(&self, tenant: &TenantId, limit: u32, after: Option<&str>) -> Result<Page<TicketType>>;
        fn ticket_type(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<TicketType>>;
        fn update_ticket_type(&self, tenant: &TenantId, id: &str, patch: TicketTypePatch) -> Result<DeskChange<TicketType>>;
        fn delete_ticket_type(&self, tenant: &TenantId, id: &str) -> Result<DeskChange<()>>;
        fn create_group(&self, tenant: &TenantId, new: NewGroup) -> Result<Group>;
        fn group(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<Group>>;
        fn add_member(&self, tenant: &TenantId, group_id: &str, name: &str, capacity: i32) -> Result<Option<Member>>;
        fn update_member(&self, tenant: &TenantId, group_id: &str, member_id: &str, capacity: i32) -> Result<Option<Member>>;
        fn delete_member(&self, tenant: &TenantId, group_id: &str, member_id: &str) -> Result<DeskChange<()>>;
        fn set_members(&self, tenant: &TenantId, group_id: &str, members: Vec<(String, i32)>) -> Result<DeskChange<Group>>;
        fn delete_group(&self, tenant: &TenantId, id: &str) -> Result<DeskChange<()>>;
        fn groups(&self, tenant: &TenantId) -> Result<Vec<Group>>;
        fn groups_page(&self, tenant: &TenantId, limit: u32, after: Option<&str>) -> Result<Page<Group>>;
        fn tickets(&self, tenant: &TenantId, filter: &TicketFilter, limit: u32, cursor: Option<&str>) -> Result<Page<Ticket>>;
        fn ticket(&self, tenant: &TenantId, id: &str) -> Result<Option<Ticket>>;
        fn ticket_trace(&self, tenant: &TenantId, id: &str) -> Result<Vec<TraceLine>>;
        fn delete_ticket(&self, tenant: &TenantId, id: &str) -> Result<TicketDeletion>;
        fn write_ticket(&self, tenant: &TenantId, write: TicketWrite, expected_updated_at: Option<i64>, cause: &Cause) -> Result<Written>;
        fn incidents(&self, tenant: &TenantId, status: Option<&str>, limit: u32, cursor: Option<&str>) -> Result<Page<Incident>>;
        fn incident(&self, tenant: &TenantId, id: &str) -> Result<Option<Incident>>;
        fn resolve_incident(&self, tenant: &TenantId, id: &str) -> Result<bool>;
    }
}

#[async_trait]
impl RecordStore for RoutedStore {
    async fn begin_record(&self, job: &ClaimedJob) -> Result<Box<dyn RecordTx>> {
        let db = self.db_for(&job.tenant_id).await?;
        db.call(db.store.begin_record(job)).await
    }
}

by_tenant! {
    impl SignalStore {
        fn send_signal(&self, tenant: &TenantId, signal: NewSignal) -> Result<SignalSent>;
    }
}

by_tenant! {
    impl WatchStore {
        fn overdue_waits(&self, tenant: &TenantId, due_before: i64, now: i64, limit: u32) -> Result<Vec<OverdueWait>>;
        fn leases_expired_repeatedly(&self, tenant: &TenantId, limit: u32) -> Result<Vec<ExpiringJob>>;
        fn unfinished_runs(&self, tenant: &TenantId, automation: &AutomationId, created_before: i64, limit: u32) -> Result<Vec<UnfinishedRun>>;
        fn fail_run(&self, tenant: &TenantId, run: &RunId, failure: RunFailure, now: i64) -> Result<bool>;
        fn expire_run(&self, tenant: &TenantId, run: &RunId, error: &str, now: i64) -> Result<bool>;
    }
    also {
        async fn singletons_to_release(
            &self,
            tenants: &[TenantId],
            limit: u32,
        ) -> Result<Vec<SingletonKey>> {
            let parts = self
                .by_database("queued singleton runs", tenants, |db, tenants| async move {
                    db.singletons_to_release(&tenants, limit).await
                })
                .await?;
            let mut keys: Vec<SingletonKey> = parts.into_iter().flatten().collect();
            keys.truncate(limit as usize);
            Ok(keys)
        }

        async fn release_singleton(&self, key: &SingletonKey) -> Result<Option<RunId>> {
            let db = self.db_for(&key.tenant_id).await?;
            db.call(<PgStore as WatchStore>::release_singleton(&db.store, key)).await
        }

        async fn unstarted_past(
            &self,
            tenants: &[TenantId],
            now: i64,
            limit: u32,
        ) -> Result<Vec<UnstartedRun>> {
            let parts = self
                .by_database("unstarted runs", tenants, |db, tenants| async move {
                    db.unstarted_past(&tenants, now, limit).await
                })
                .await?;
            let mut runs: Vec<UnstartedRun> = parts.into_iter().flatten().collect();
            runs.sort_by_key(|r| r.start_by);
            runs.truncate(limit as usize);
            Ok(runs)
        }

        async fn open_platform_incident(
            &self,
            incident: NewPlatformIncident,
            now: i64,
        ) -> Result<(String, bool)> {
            self.shared().open_platform_incident(incident, now).await
        }

        async fn platform_incidents(
            &self,
            status: Option<&str>,
            limit: u32,
            before: Option<&str>,
        ) -> Result<Page<PlatformIncident>> {
            self.shared().platform_incidents(status, limit, before).await
        }

        async fn resolve_platform_incident(&self, id: &str, now: i64) -> Result<bool> {
            self.shared().resolve_platform_incident(id, now).await
        }
    }
}

/// The audit log lives in the shared database, beside the keys it names.
#[async_trait]
impl AuditStore for RoutedStore {
    async fn write_audit(&self, row: NewAudit) -> Result<AuditRow> {
        self.shared().write_audit(row).await
    }
    async fn begin_audit(&self, row: NewAudit) -> Result<AuditRow> {
        self.shared().begin_audit(row).await
    }
    async fn end_audit(&self, row: &AuditRow, end: AuditEnd) -> Result<()> {
        self.shared().end_audit(row, end).await
    }
    async fn drop_audit(&self, row: &AuditRow) -> Result<()> {
        self.shared().drop_audit(row).await
    }
    async fn resolve_pending_audit(&self, before_ms: i64, limit: u32) -> Result<u64> {
        self.shared().resolve_pending_audit(before_ms, limit).await
    }
    async fn audit(
        &self,
        tenant: &TenantId,
        filter: &AuditFilter,
        limit: u32,
        after: Option<i64>,
    ) -> Result<Page<AuditRow>> {
        self.shared().audit(tenant, filter, limit, after).await
    }
    async fn audit_everywhere(
        &self,
        filter: &AuditFilter,
        limit: u32,
        after: Option<i64>,
    ) -> Result<Page<AuditRow>> {
        self.shared().audit_everywhere(filter, limit, after).await
    }
    async fn expire_platform_audit(&self, before_ms: i64, limit: u32) -> Result<u64> {
        self.shared().expire_platform_audit(before_ms, limit).await
    }
}

by_tenant! {
    impl RetentionStore {
        fn expire_keys(&self, tenant: &TenantId, before_ms: i64, limit: u32) -> Result<u64>;
        fn expire_signals(&self, tenant: &TenantId, now_ms: i64, limit: u32) -> Result<u64>;
        fn keep_contexts_whole(&self, tenant: &TenantId, before_ms: i64, limit: u32) -> Result<u64>;
    }
    also {
        // A tenant's rows are on its database, but for its audit log, which
        // is the shared one's (see the module doc).
        async fn expire(
            &self,
            tenant: &TenantId,
            what: Expiring,
            before_ms: i64,
            limit: u32,
        ) -> Result<u64> {
            if what == Expiring::Audit {
                return self.shared().expire(tenant, what, before_ms, limit).await;
            }
            let db = self.db_for(tenant).await?;
            db.call(db.store.expire(tenant, what, before_ms, limit)).await
        }

        // The registry's settings are the shared ones (see the module doc).
        async fn retention(&self, tenant: &TenantId) -> Result<Option<Retention>> {
            self.shared().retention(tenant).await
        }

        async fn set_retention(&self, tenant: &TenantId, retention: &Retention) -> Result<bool> {
            let set = self.shared().set_retention(tenant, retention).await?;
            if set {
                self.refresh_mirror(tenant).await;
            }
            Ok(set)
        }

        // Every database has its own partitions; each is given every
        // tenant's cutoff (a partition keeps what any of its rows needs).
        async fn drop_expired_partitions(
            &self,
            what: Expiring,
            cutoffs: &[(TenantId, i64)],
        ) -> Result<Vec<String>> {
            let dropped = self
                .gather("partitions", self.every_database(), |db, ()| {
                    db.drop_expired_partitions(what, cutoffs)
                })
                .await?;
            Ok(dropped.into_iter().flat_map(|(_, d)| d).collect())
        }

        async fn create_partitions(
            &self,
            now_ms: i64,
            ahead: u32,
            skip: &[String],
        ) -> Result<Vec<PartitionProblem>> {
            let problems = self
                .gather("partitions", self.every_database(), |db, ()| {
                    db.create_partitions(now_ms, ahead, skip)
                })
                .await?;
            Ok(problems.into_iter().flat_map(|(_, p)| p).collect())
        }

        async fn move_default_rows(
            &self,
            max_rows: u64,
            skip: &[String],
        ) -> Result<(Vec<MovedRows>, Vec<PartitionProblem>)> {
            let (mut moved, mut problems) = (Vec::new(), Vec::new());
            let parts = self
                .gather("partitions", self.every_database(), |db, ()| {
                    db.move_default_rows(max_rows, skip)
                })
                .await?;
            for (_, (m, p)) in parts {
                moved.extend(m);
                problems.extend(p);
            }
            Ok((moved, problems))
        }
    }
}

/// Every trait written once for all stores (`crate::sql::Route`) reaches a
/// tenant's database through the router's one step.
impl crate::sql::Route for RoutedStore {
    type Store = PgStore;

    async fn db_for(&self, tenant: &TenantId) -> Result<crate::sql::Reach<'_, PgStore>> {
        Ok(crate::sql::Reach::routed(
            RoutedStore::db_for(self, tenant).await?,
        ))
    }
}

#[async_trait]
impl Store for RoutedStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    /// The shared database as on one database (its failure stops the
    /// start); the tenant databases at once, each one that does not answer
    /// left to be migrated when it does (see [`database`]).
    async fn migrate(&self) -> Result<()> {
        self.dbs[0].migrate().await?;
        for migrated in join_all(self.dbs[1..].iter().map(|db| db.migrate_or_wait())).await {
            migrated?;
        }
        self.watching.call_once(|| {
            for db in &self.dbs[1..] {
                database::watch(db, self.wake.clone());
            }
        });
        Ok(())
    }

    async fn seal_credentials(&self, which: Reseal) -> Result<Vec<Resealed>> {
        let sealed = self
            .each(self.every_database(), None, |db, ()| {
                db.seal_credentials(which)
            })
            .await;
        Ok(Self::all_of(sealed)?.into_iter().flatten().collect())
    }

    async fn maintain(&self) -> Result<()> {
        self.gather("maintenance", self.every_database(), |db, ()| db.maintain())
            .await?;
        Ok(())
    }

    /// Readiness follows the shared database only: a tenant database away
    /// is its tenants' trouble, not the node's.
    async fn ping(&self) -> Result<()> {
        self.shared().ping().await
    }

    /// The shared database as on one database; each tenant database once
    /// it was migrated and while it answers, else when it comes back.
    async fn listen_for_work(&self, wake: Wake) -> Result<()> {
        *self.wake.lock().unwrap_or_else(|e| e.into_inner()) = Some(wake.clone());
        self.shared().listen_for_work(wake.clone()).await?;
        join_all(
            self.dbs[1..]
                .iter()
                .filter(|db| db.is_up())
                .map(|db| db.listen(wake.clone())),
        )
        .await;
        Ok(())
    }

    fn unreachable_databases(&self) -> Vec<String> {
        self.unreachable()
    }

    async fn stream_relay(&self) -> Result<Option<Box<dyn StreamRelay>>> {
        self.shared().stream_relay().await
    }

    async fn listen_stream(&self, heard: Heard) -> Result<()> {
        self.shared().listen_stream(heard).await
    }
}
