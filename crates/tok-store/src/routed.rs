//! `db_for(tenant)`: named tenants on their own PostgreSQL database beside
//! the shared one (DESIGN §2 rule 5, seed 004 "a door to a separate
//! database").
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
//!   incidents, the
//!   scheduler's wake lease and the stream relay's channel (one per
//!   cluster, not per tenant). It also holds every tenant not named in the
//!   configuration, with all its rows.
//! - **A tenant's database** holds everything of that tenant's work: its
//!   sources, automations and versions, inbox, runs, steps, jobs, waits,
//!   signals, schedules, desk (ticket types, groups, tickets, trace,
//!   incidents), connections, approvals, widgets and stored effects. Its
//!   `tenants` row is a copy kept from the shared one (the tables reference
//!   it); the shared row is the one read and written.
//!
//! So every call that names a tenant runs on that tenant's database
//! ([`RoutedStore::db_for`]), and the work of one step (claim, record
//! transaction, dispatch) never leaves it. The calls over many tenants
//! (claims, dispatch, queue stats, the scheduler's reads) are split by
//! database, each part asked of its database with its own tenants, and the
//! answers put together: nothing joins two tenants and no transaction spans
//! two databases. A dispatch over tenants of several databases opens one
//! transaction on each and commits them one after the other: each
//! database's events, runs and jobs commit together or not at all; should
//! one commit fail, that database's events stay pending for the next
//! dispatch, as after any failed dispatch.
//!
//! Claims are fair between databases: each claim starts at the next
//! database in turn and gives each its share of what is left of `limit`;
//! what a database could not fill goes to the others. Workers listen for
//! work on every database. Job ids are numbered by each database; the
//! router starts each tenant database's job numbers in a range of its own
//! (picked at random, 2^40 ids wide), so that the jobs one worker holds
//! from two databases never share an id.
//!
//! A webhook token is looked up in every database in turn (the shared
//! first); a source found in a database its tenant is not routed to (rows
//! left behind by a move) is not taken.
//!
//! Moving a tenant is [`copy_tenant`] (the rows, one transaction on the
//! target) between stopping its processes and switching the configuration;
//! `docs/operations.md` has the procedure.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde_json::Value;
use sqlx::Row as _;
use sqlx::postgres::PgPool;
use sqlx::types::Json;
use tok_core::ids::{AutomationId, EventId, JobId, RunId, TenantId};
use tok_core::retention::Retention;

use crate::dispatch::{Claims, DispatchTx};
use crate::*;

/// Which tenants live on which database: entries `tenant=url`, where
/// `tenant` is a tenant's id or name, or `*` for every tenant no other
/// entry names (new ones included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantDatabases {
    entries: Vec<(String, String)>,
}

impl TenantDatabases {
    /// Parses `tenant=url` entries separated by `;` or new lines (blank
    /// ones and lines starting with `#` are skipped); `origin` names where
    /// the text came from in errors (`TOK_TENANT_DATABASES`, a file).
    pub fn parse(text: &str, origin: &str) -> std::result::Result<Self, String> {
        let mut out = Self::default();
        for (n, raw) in text.split([';', '\n']).enumerate() {
            let entry = raw.trim();
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let Some((key, url)) = entry.split_once('=') else {
                return Err(format!(
                    "{origin}: entry {} `{}` has no `=`; expected `tenant=postgres://…` \
                     (a tenant's id or name, or `*`)",
                    n + 1,
                    redact(entry)
                ));
            };
            out.add(
                key.trim(),
                url.trim(),
                &format!("{origin}: entry {}", n + 1),
            )?;
        }
        Ok(out)
    }

    /// Parses a file: a JSON object `{"tenant": "postgres://…", …}` when it
    /// starts with `{`, else the lines of [`TenantDatabases::parse`].
    pub fn parse_file(text: &str, path: &str) -> std::result::Result<Self, String> {
        if !text.trim_start().starts_with('{') {
            return Self::parse(text, path);
        }
        let value: serde_json::Map<String, Value> = serde_json::from_str(text)
            .map_err(|e| format!("{path}: not a JSON object of tenant to database URL ({e})"))?;
        let mut out = Self::default();
        for (key, url) in value {
            let Some(url) = url.as_str() else {
                return Err(format!(
                    "{path}: the value of `{key}` is {url}; expected a string postgres://…"
                ));
            };
            out.add(key.trim(), url.trim(), &format!("{path}: `{key}`"))?;
        }
        Ok(out)
    }

    /// Adds the entries of `other` (one configuration from two places).
    pub fn merge(&mut self, other: TenantDatabases) -> std::result::Result<(), String> {
        for (key, url) in other.entries {
            self.add(&key, &url, "both TOK_TENANT_DATABASES and the file")?;
        }
        Ok(())
    }

    fn add(&mut self, key: &str, url: &str, at: &str) -> std::result::Result<(), String> {
        if key.is_empty() {
            return Err(format!(
                "{at}: the tenant before `=` is empty; expected a tenant's id or name, or `*`"
            ));
        }
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(format!(
                "{at}: the database of `{key}` is `{}`; expected a postgres://… URL",
                redact(url)
            ));
        }
        if self.entries.iter().any(|(k, _)| k == key) {
            return Err(format!("{at}: `{key}` is named twice"));
        }
        self.entries.push((key.to_owned(), url.to_owned()));
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, `(tenant, url)`, in the order given.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }
}

/// Hides a password in a URL shown in an error.
pub(crate) fn redact(text: &str) -> String {
    match (text.find("://"), text.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &text[..scheme], &text[at..])
        }
        _ => text.to_owned(),
    }
}

/// The store over the shared database and the tenant databases.
pub struct RoutedStore {
    /// `dbs[0]` is the shared database.
    dbs: Vec<Arc<PgStore>>,
    /// Configured tenant (id or name) → index in `dbs`.
    keys: HashMap<String, usize>,
    /// The database of `*`, if any.
    every: Option<usize>,
    /// Tenants resolved so far → index in `dbs`.
    routes: RwLock<HashMap<TenantId, usize>>,
    /// Which database a claim asks first.
    turn: AtomicUsize,
}

/// Job ids of a tenant database start in a range of their own this wide.
const JOB_ID_RANGE: i64 = 1 << 40;

impl RoutedStore {
    /// Connects the shared database and every database `tenants` names
    /// (one pool each, of at most `max_connections`; entries naming the
    /// same URL share it, one naming the shared URL means the shared one).
    /// Every database seals and opens credentials with `secret_keys`.
    pub async fn connect(
        shared_url: &str,
        tenants: &TenantDatabases,
        max_connections: u32,
        secret_keys: &Keyring,
    ) -> Result<Self> {
        let mut urls = vec![shared_url.to_owned()];
        let mut dbs = vec![Arc::new(
            PgStore::connect(shared_url, max_connections)
                .await?
                .with_keys(secret_keys.clone()),
        )];
        let mut keys = HashMap::new();
        let mut every = None;
        for (key, url) in tenants.entries() {
            let index = match urls.iter().position(|u| u == url) {
                Some(i) => i,
                None => {
                    dbs.push(Arc::new(
                        PgStore::connect(url, max_connections)
                            .await?
                            .with_keys(secret_keys.clone()),
                    ));
                    urls.push(url.clone());
                    dbs.len() - 1
                }
            };
            if key == "*" {
                every = Some(index);
            } else {
                keys.insert(key.clone(), index);
            }
        }
        Ok(Self {
            dbs,
            keys,
            every,
            routes: RwLock::new(HashMap::new()),
            turn: AtomicUsize::new(0),
        })
    }

    /// How many databases: the shared one and the tenants'.
    pub fn databases(&self) -> usize {
        self.dbs.len()
    }

    /// The shared database.
    pub fn shared(&self) -> &PgStore {
        &self.dbs[0]
    }

    /// The index (0: the shared one) of the database of `tenant`: the
    /// entry naming its id, else its name, else `*`, else the shared one.
    /// A tenant the shared database does not know is answered there
    /// (as not found).
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
        let index = self
            .keys
            .get(found.id.as_str())
            .or_else(|| self.keys.get(&found.name))
            .copied()
            .or(self.every)
            .unwrap_or(0);
        if index != 0 {
            self.mirror_tenant(index, tenant).await?;
        }
        self.routes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tenant.clone(), index);
        Ok(index)
    }

    /// The database of `tenant` ([`RoutedStore::db_index`]).
    pub async fn db_for(&self, tenant: &TenantId) -> Result<&PgStore> {
        Ok(&self.dbs[self.db_index(tenant).await?])
    }

    fn read_routes(&self) -> std::sync::RwLockReadGuard<'_, HashMap<TenantId, usize>> {
        self.routes.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies the shared `tenants` row of `tenant` to database `index`.
    async fn mirror_tenant(&self, index: usize, tenant: &TenantId) -> Result<()> {
        copy_tenant_row(self.shared().pool(), self.dbs[index].pool(), tenant).await
    }

    /// Writes the tenant's shared row again to its database, if it has
    /// one. The shared row is the one read (the copy is there for the
    /// tables that reference it), so a copy that failed is only logged; a
    /// tenant not yet resolved is copied again at its first call.
    async fn refresh_mirror(&self, tenant: &TenantId) {
        let refreshed = match self.db_index(tenant).await {
            Ok(0) => Ok(()),
            Ok(index) => self.mirror_tenant(index, tenant).await,
            Err(e) => Err(e),
        };
        if let Err(e) = refreshed {
            tracing::warn!(%tenant, error = %e, "the tenant's row could not be copied to its database");
        }
    }

    /// `tenants` by database, in the order of the databases, each
    /// database's tenants in the order given; databases with none left out.
    async fn split(&self, tenants: &[TenantId]) -> Result<Vec<(usize, Vec<TenantId>)>> {
        let mut parts: Vec<(usize, Vec<TenantId>)> = Vec::new();
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

    /// Starts the job ids of each tenant database in a range of its own,
    /// once (see the module doc).
    async fn separate_job_ids(&self) -> Result<()> {
        for db in &self.dbs[1..] {
            let slot = 1
                + (uuid::Uuid::new_v4().as_u128() % ((i64::MAX / JOB_ID_RANGE) as u128 - 2)) as i64;
            sqlx::query(
                "SELECT setval(pg_get_serial_sequence('jobs', 'id'), $1, false)
                 WHERE (SELECT COALESCE(MAX(id), 0) FROM jobs) < $2
                   AND (SELECT last_value FROM jobs_id_seq) < $2",
            )
            .bind(slot * JOB_ID_RANGE)
            .bind(JOB_ID_RANGE)
            .execute(db.pool())
            .await?;
        }
        Ok(())
    }
}

/// Upserts the `tenants` row of `tenant` from `from` into `to`.
async fn copy_tenant_row(from: &PgPool, to: &PgPool, tenant: &TenantId) -> Result<()> {
    let row = sqlx::query("SELECT id, name, settings, created_at FROM tenants WHERE id = $1")
        .bind(tenant.as_str())
        .fetch_optional(from)
        .await?;
    let Some(row) = row else {
        return Ok(());
    };
    sqlx::query(
        "INSERT INTO tenants (id, name, settings, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, settings = EXCLUDED.settings",
    )
    .bind(row.get::<String, _>("id"))
    .bind(row.get::<String, _>("name"))
    .bind(row.get::<Json<Value>, _>("settings"))
    .bind(row.get::<i64, _>("created_at"))
    .execute(to)
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
                    <PgStore as $trait>::$name(db, $tenant $(, $arg)*).await
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
    async fn set_admin_key(&self, hash: &str) -> Result<u64> {
        self.shared().set_admin_key(hash).await
    }
}

by_tenant! {
    impl DefinitionStore {
        fn create_source(&self, tenant: &TenantId, source: NewSource) -> Result<Source>;
        fn source(&self, tenant: &TenantId, id: &SourceId) -> Result<Option<Source>>;
        fn sources(&self, tenant: &TenantId) -> Result<Vec<Source>>;
        fn sources_page(&self, tenant: &TenantId, limit: u32, after: Option<&str>) -> Result<Page<Source>>;
        fn create_automation(&self, tenant: &TenantId, def: NewVersion) -> Result<AutomationRow>;
        fn save_version(&self, tenant: &TenantId, id: &AutomationId, def: NewVersion) -> Result<AutomationRow>;
        fn set_automation_status(&self, tenant: &TenantId, id: &AutomationId, status: AutomationStatus) -> Result<bool>;
        fn automation(&self, tenant: &TenantId, id: &AutomationId) -> Result<Option<AutomationRow>>;
        fn automations(&self, tenant: &TenantId) -> Result<Vec<AutomationRow>>;
        fn automations_page(&self, tenant: &TenantId, limit: u32, after: Option<&str>) -> Result<Page<AutomationRow>>;
        fn automation_version(&self, tenant: &TenantId, id: &AutomationId, version: i32) -> Result<Option<SavedVersion>>;
        fn update_source(&self, tenant: &TenantId, id: &SourceId, patch: SourcePatch) -> Result<Option<Source>>;
        fn rotate_source(&self, tenant: &TenantId, id: &SourceId, rotation: SourceRotation) -> Result<Option<Source>>;
        fn delete_source(&self, tenant: &TenantId, id: &SourceId) -> Result<bool>;
    }
    also {
        async fn source_by_token(&self, token: &str) -> Result<Option<Source>> {
            for (index, db) in self.dbs.iter().enumerate() {
                if let Some(source) = db.source_by_token(token).await?
                    && self.db_index(&source.tenant_id).await? == index
                {
                    return Ok(Some(source));
                }
            }
            Ok(None)
        }
    }
}

by_tenant! {
    impl InboxStore {
        fn accept_event(&self, tenant: &TenantId, event: NewEvent) -> Result<(EventId, Accepted)>;
        fn start_run(&self, tenant: &TenantId, event: NewEvent, run: NewRun) -> Result<RunId>;
        fn start_run_limited(&self, tenant: &TenantId, event: NewEvent, run: NewRun, starts_per_minute: Option<u32>) -> Result<Started>;
    }
    also {
        async fn begin_dispatch(
            &self,
            tenants: &[TenantId],
            lane: Lane,
        ) -> Result<Box<dyn DispatchTx>> {
            let parts = self.split(tenants).await?;
            if parts.len() <= 1 {
                let (index, tenants) = parts.into_iter().next().unwrap_or((0, Vec::new()));
                return self.dbs[index].begin_dispatch(&tenants, lane).await;
            }
            let mut split = SplitDispatch::default();
            for (index, tenants) in parts {
                let tx = self.dbs[index].begin_dispatch(&tenants, lane).await?;
                for tenant in tenants {
                    split.by_tenant.insert(tenant, split.txs.len());
                }
                split.txs.push(tx);
            }
            Ok(Box::new(split))
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
        if parts.len() <= 1 {
            let (index, tenants) = parts.pop().unwrap_or((0, Vec::new()));
            return self.dbs[index]
                .claim_except(&tenants, node, limit, lease_ms, running)
                .await;
        }
        // Each database in turn asks first; each gets its share of what is
        // left, and what one leaves goes to those after it, then to those
        // that filled theirs.
        let first = self.turn.fetch_add(1, Ordering::Relaxed) % parts.len();
        parts.rotate_left(first);
        let mut claimed = Vec::new();
        let mut failed = None;
        let mut full = Vec::new();
        for pass in 0..2 {
            let asked: Vec<usize> = if pass == 0 {
                (0..parts.len()).collect()
            } else {
                std::mem::take(&mut full)
            };
            for (n, &p) in asked.iter().enumerate() {
                let left = limit.saturating_sub(claimed.len() as u32);
                if left == 0 {
                    break;
                }
                let share = left.div_ceil((asked.len() - n) as u32);
                let (index, tenants) = &parts[p];
                match self.dbs[*index]
                    .claim_except(tenants, node, share, lease_ms, running)
                    .await
                {
                    Ok(jobs) => {
                        if jobs.len() as u32 == share && pass == 0 {
                            full.push(p);
                        }
                        claimed.extend(jobs);
                    }
                    // The jobs claimed from the other databases are kept:
                    // giving them up would leave them leased to nobody.
                    Err(e) => {
                        tracing::warn!(database = index, error = %e, "claim failed on one database");
                        failed = Some(e);
                    }
                }
            }
        }
        match failed {
            Some(e) if claimed.is_empty() => Err(e),
            _ => Ok(claimed),
        }
    }

    async fn heartbeat(
        &self,
        node: &str,
        claims: &[(JobId, String)],
        lease_ms: i64,
    ) -> Result<u64> {
        // Every database is asked, one away or not: the leases held on the
        // others must not lapse for it.
        let mut extended = 0;
        let mut failed = None;
        for db in &self.dbs {
            match db.heartbeat(node, claims, lease_ms).await {
                Ok(n) => extended += n,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(extended), Err)
    }

    async fn record(&self, job: &ClaimedJob, record: Record) -> Result<()> {
        self.db_for(&job.tenant_id).await?.record(job, record).await
    }

    async fn record_and_continue(&self, job: &ClaimedJob, record: Record) -> Result<bool> {
        self.db_for(&job.tenant_id)
            .await?
            .record_and_continue(job, record)
            .await
    }

    async fn release_claims(&self, node: &str) -> Result<u64> {
        let mut released = 0;
        let mut failed = None;
        for db in &self.dbs {
            match db.release_claims(node).await {
                Ok(n) => released += n,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(released), Err)
    }

    async fn queue_stats(&self, tenants: &[TenantId]) -> Result<QueueStats> {
        let mut total = QueueStats::default();
        for (index, tenants) in self.split(tenants).await? {
            let stats = self.dbs[index].queue_stats(&tenants).await?;
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
        fn write_ticket(&self, tenant: &TenantId, write: TicketWrite, expected_updated_at: Option<i64>, cause: &Cause) -> Result<Written>;
        fn incidents(&self, tenant: &TenantId, status: Option<&str>, limit: u32, cursor: Option<&str>) -> Result<Page<Incident>>;
        fn incident(&self, tenant: &TenantId, id: &str) -> Result<Option<Incident>>;
        fn resolve_incident(&self, tenant: &TenantId, id: &str) -> Result<bool>;
    }
}

#[async_trait]
impl RecordStore for RoutedStore {
    async fn begin_record(&self, job: &ClaimedJob) -> Result<Box<dyn RecordTx>> {
        self.db_for(&job.tenant_id).await?.begin_record(job).await
    }
}

by_tenant! {
    impl ConnectionStore {
        fn create_connection(&self, tenant: &TenantId, new: NewConnection) -> Result<Connection>;
        fn connections(&self, tenant: &TenantId, limit: u32, after: Option<&str>) -> Result<Page<Connection>>;
        fn connection(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<Connection>>;
        fn connection_unopened(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<Connection>>;
        fn update_connection(&self, tenant: &TenantId, id: &str, patch: ConnectionPatch) -> Result<Option<Connection>>;
        fn delete_connection(&self, tenant: &TenantId, id: &str) -> Result<bool>;
        fn admit(&self, tenant: &TenantId, connection_id: &str, job: JobId, lease_ms: i64) -> Result<Admission>;
        fn release(&self, tenant: &TenantId, connection_id: &str, job: JobId, outcome: CallOutcome) -> Result<()>;
    }
}

by_tenant! {
    impl SignalStore {
        fn send_signal(&self, tenant: &TenantId, signal: NewSignal) -> Result<SignalSent>;
    }
}

by_tenant! {
    impl ScheduleStore {
        fn set_schedule(&self, tenant: &TenantId, automation: &AutomationId, version: i32, spec: &str, next_run_at: Option<i64>, keep_due: bool) -> Result<()>;
        fn remove_schedule(&self, tenant: &TenantId, automation: &AutomationId) -> Result<()>;
        fn advance(&self, tenant: &TenantId, automation: &AutomationId, from: i64, next: Option<i64>, run: Option<&RunId>, now: i64) -> Result<bool>;
        fn next_run_at(&self, tenant: &TenantId, automation: &AutomationId) -> Result<Option<i64>>;
    }
    also {
        async fn hold_wake(
            &self,
            holder: &str,
            incarnation: &str,
            now: i64,
            lease_ms: i64,
        ) -> Result<bool> {
            self.shared().hold_wake(holder, incarnation, now, lease_ms).await
        }

        async fn release_wake(&self, incarnation: &str) -> Result<()> {
            self.shared().release_wake(incarnation).await
        }

        async fn stale_schedules(
            &self,
            tenants: &[TenantId],
        ) -> Result<(Vec<StaleSchedule>, Vec<(TenantId, AutomationId)>)> {
            let (mut stale, mut gone) = (Vec::new(), Vec::new());
            for (index, tenants) in self.split(tenants).await? {
                let (s, g) = self.dbs[index].stale_schedules(&tenants).await?;
                stale.extend(s);
                gone.extend(g);
            }
            Ok((stale, gone))
        }

        async fn due(&self, tenants: &[TenantId], now: i64, limit: u32) -> Result<Vec<DueTrigger>> {
            let mut due = Vec::new();
            for (index, tenants) in self.split(tenants).await? {
                due.extend(self.dbs[index].due(&tenants, now, limit).await?);
            }
            due.sort_by_key(|d| d.due_at);
            due.truncate(limit as usize);
            Ok(due)
        }
    }
}

by_tenant! {
    impl WatchStore {
        fn overdue_waits(&self, tenant: &TenantId, due_before: i64, now: i64, limit: u32) -> Result<Vec<OverdueWait>>;
        fn leases_expired_repeatedly(&self, tenant: &TenantId, limit: u32) -> Result<Vec<ExpiringJob>>;
        fn unfinished_runs(&self, tenant: &TenantId, automation: &AutomationId, created_before: i64, limit: u32) -> Result<Vec<UnfinishedRun>>;
        fn fail_run(&self, tenant: &TenantId, run: &RunId, failure: RunFailure, now: i64) -> Result<bool>;
    }
    also {
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

by_tenant! {
    impl WidgetStore {
        fn create_widget(&self, tenant: &TenantId, new: NewWidget) -> Result<Widget>;
        fn widgets(&self, tenant: &TenantId, limit: u32, after: Option<&str>) -> Result<Page<Widget>>;
        fn widget(&self, tenant: &TenantId, id: &str) -> Result<Option<Widget>>;
        fn update_widget(&self, tenant: &TenantId, id: &str, patch: WidgetPatch) -> Result<Option<Widget>>;
        fn delete_widget(&self, tenant: &TenantId, id: &str) -> Result<bool>;
        fn save_widget_data(&self, tenant: &TenantId, id: &str, data: &Value, fetched_at: i64) -> Result<bool>;
    }
}

/// The audit log lives in the shared database, beside the keys it names.
#[async_trait]
impl AuditStore for RoutedStore {
    async fn write_audit(&self, row: NewAudit) -> Result<AuditRow> {
        self.shared().write_audit(row).await
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
            let db = match what {
                Expiring::Audit => self.shared(),
                _ => self.db_for(tenant).await?,
            };
            db.expire(tenant, what, before_ms, limit).await
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
            let mut dropped = Vec::new();
            for db in &self.dbs {
                dropped.extend(db.drop_expired_partitions(what, cutoffs).await?);
            }
            Ok(dropped)
        }

        async fn create_partitions(
            &self,
            now_ms: i64,
            ahead: u32,
            skip: &[String],
        ) -> Result<Vec<PartitionProblem>> {
            let mut problems = Vec::new();
            for db in &self.dbs {
                problems.extend(db.create_partitions(now_ms, ahead, skip).await?);
            }
            Ok(problems)
        }

        async fn move_default_rows(
            &self,
            max_rows: u64,
            skip: &[String],
        ) -> Result<(Vec<MovedRows>, Vec<PartitionProblem>)> {
            let (mut moved, mut problems) = (Vec::new(), Vec::new());
            for db in &self.dbs {
                let (m, p) = db.move_default_rows(max_rows, skip).await?;
                moved.extend(m);
                problems.extend(p);
            }
            Ok((moved, problems))
        }
    }
}

by_tenant! {
    impl ApprovalStore {
        fn approvals(&self, tenant: &TenantId, pending_only: bool, limit: u32, before: Option<&str>) -> Result<Page<Approval>>;
        fn approval(&self, tenant: &TenantId, id: &str) -> Result<Option<Approval>>;
        fn decide_approval(&self, tenant: &TenantId, id: &str, decision: Decision) -> Result<Decided>;
    }
}

by_tenant! {
    impl QueueSampleStore {
        fn queue_samples(&self, tenant: &TenantId, since: i64, limit: u32) -> Result<Vec<QueueSample>>;
        fn expire_queue_samples(&self, tenant: &TenantId, before: i64, limit: u32) -> Result<u64>;
    }
    also {
        // Each database samples its own tenants, in one statement each.
        async fn sample_queue(&self, tenants: &[TenantId], at: i64, window_ms: i64) -> Result<u64> {
            let mut written = 0;
            for (index, tenants) in self.split(tenants).await? {
                written += self.dbs[index].sample_queue(&tenants, at, window_ms).await?;
            }
            Ok(written)
        }
    }
}

by_tenant! {
    impl EffectStore {
        fn effect_result(&self, tenant: &TenantId, idempotency_key: &str, name: &str) -> Result<Option<Value>>;
        fn store_effect_result(&self, tenant: &TenantId, run: &RunId, idempotency_key: &str, name: &str, result: &Value) -> Result<Value>;
    }
}

#[async_trait]
impl Store for RoutedStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    async fn migrate(&self) -> Result<()> {
        for db in &self.dbs {
            db.migrate().await?;
        }
        self.separate_job_ids().await
    }

    async fn seal_credentials(&self, which: Reseal) -> Result<Vec<Resealed>> {
        let mut done = Vec::new();
        for db in &self.dbs {
            done.extend(db.seal_credentials(which).await?);
        }
        Ok(done)
    }

    async fn maintain(&self) -> Result<()> {
        for db in &self.dbs {
            db.maintain().await?;
        }
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        for db in &self.dbs {
            db.ping().await?;
        }
        Ok(())
    }

    async fn listen_for_work(&self, wake: Wake) -> Result<()> {
        for db in &self.dbs {
            db.listen_for_work(wake.clone()).await?;
        }
        Ok(())
    }

    async fn stream_relay(&self) -> Result<Option<Box<dyn StreamRelay>>> {
        self.shared().stream_relay().await
    }

    async fn listen_stream(&self, heard: Heard) -> Result<()> {
        self.shared().listen_stream(heard).await
    }
}

/// A dispatch over tenants of several databases: one transaction on each
/// (see the module doc).
#[derive(Default)]
struct SplitDispatch {
    txs: Vec<Box<dyn DispatchTx>>,
    /// Tenant → index in `txs`.
    by_tenant: HashMap<TenantId, usize>,
    /// Event selected by `pending_events` → index in `txs`.
    by_event: HashMap<EventId, usize>,
}

impl SplitDispatch {
    fn tx(&mut self, tenant: &TenantId) -> Result<&mut Box<dyn DispatchTx>> {
        match self.by_tenant.get(tenant) {
            Some(&i) => Ok(&mut self.txs[i]),
            None => Err(StoreError::NotFound("tenant of this dispatch")),
        }
    }
}

#[async_trait]
impl DispatchTx for SplitDispatch {
    async fn pending_events(&mut self, limit: u32) -> Result<Vec<PendingEvent>> {
        // Each database's events come fair between its tenants; put
        // together, every tenant's first event comes before any tenant's
        // second, whatever its database.
        let mut all = Vec::new();
        for (i, tx) in self.txs.iter_mut().enumerate() {
            let mut rank: HashMap<TenantId, usize> = HashMap::new();
            for event in tx.pending_events(limit).await? {
                let r = rank.entry(event.tenant_id.clone()).or_default();
                all.push((*r, event.received_at, i, event));
                *r += 1;
            }
        }
        all.sort_by_key(|(rank, received_at, i, _)| (*rank, *received_at, *i));
        all.truncate(limit as usize);
        Ok(all
            .into_iter()
            .map(|(_, _, i, event)| {
                self.by_event.insert(event.id.clone(), i);
                event
            })
            .collect())
    }

    async fn candidates(&mut self, event: &PendingEvent) -> Result<Vec<Candidate>> {
        self.tx(&event.tenant_id)?.candidates(event).await
    }

    async fn runs_on_ticket(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        ticket: &str,
        since: i64,
    ) -> Result<i64> {
        self.tx(tenant)?
            .runs_on_ticket(tenant, automation, ticket, since)
            .await
    }

    async fn tenant_limits(&mut self, tenant: &TenantId) -> Result<tok_core::quotas::TenantLimits> {
        self.tx(tenant)?.tenant_limits(tenant).await
    }

    async fn recent_starts(
        &mut self,
        tenant: &TenantId,
        automation: &AutomationId,
        since: i64,
        limit: u32,
    ) -> Result<Vec<i64>> {
        self.tx(tenant)?
            .recent_starts(tenant, automation, since, limit)
            .await
    }

    async fn trace(
        &mut self,
        tenant: &TenantId,
        ticket_id: &str,
        kind: &str,
        message: &str,
        cause: &Cause,
    ) -> Result<()> {
        self.tx(tenant)?
            .trace(tenant, ticket_id, kind, message, cause)
            .await
    }

    async fn insert_runs(
        &mut self,
        runs: &[(TenantId, EventId, NewRun)],
        claims: Option<Claims<'_>>,
    ) -> Result<Vec<ClaimedJob>> {
        let mut parts: Vec<Vec<(TenantId, EventId, NewRun)>> = vec![Vec::new(); self.txs.len()];
        for run in runs {
            let i = *self
                .by_tenant
                .get(&run.0)
                .ok_or(StoreError::NotFound("tenant of this dispatch"))?;
            parts[i].push(run.clone());
        }
        let mut claimed = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            if part.is_empty() {
                continue;
            }
            let claims = claims.as_ref().map(|c| Claims {
                node: c.node,
                lease_ms: c.lease_ms,
                runs: c.runs,
            });
            claimed.extend(self.txs[i].insert_runs(part, claims).await?);
        }
        // In the order of `runs`, as one database answers.
        let order: HashMap<&RunId, usize> = runs
            .iter()
            .enumerate()
            .map(|(n, (_, _, run))| (&run.id, n))
            .collect();
        claimed.sort_by_key(|job| order.get(&job.run_id).copied().unwrap_or(usize::MAX));
        Ok(claimed)
    }

    async fn mark_dispatched(&mut self, events: &[EventId]) -> Result<()> {
        let mut parts: Vec<Vec<EventId>> = vec![Vec::new(); self.txs.len()];
        for event in events {
            let i = *self
                .by_event
                .get(event)
                .ok_or(StoreError::NotFound("event of this dispatch"))?;
            parts[i].push(event.clone());
        }
        for (i, part) in parts.iter().enumerate() {
            if !part.is_empty() {
                self.txs[i].mark_dispatched(part).await?;
            }
        }
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        let mut failed = None;
        for tx in self.txs {
            if let Err(e) = tx.commit().await {
                tracing::warn!(error = %e, "a dispatch commit failed on one database");
                failed.get_or_insert(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// What [`copy_tenant`] copied: rows per table.
pub type Copied = Vec<(String, u64)>;

/// Tables of tenant data not copied: the registry, the keys and the audit
/// log stay in the shared database, the platform's incidents are the platform's, and
/// `connection_slots` are the slots of calls in flight (none when the
/// tenant's processes are stopped; a slot left by a crash frees itself).
const NOT_COPIED: &[&str] = &[
    "tenants",
    "api_keys",
    "audit",
    "platform_incidents",
    "connection_slots",
];

/// Copies every row of `tenant` from the database `from` to the database
/// `to` (both migrated), in one transaction on `to`, and returns how many
/// rows of each table. Refuses, copying nothing, when a job of the tenant
/// is leased (a step in flight: stop its processes first) or when `to`
/// already holds rows of the tenant. The rows stay in `from` until
/// [`forget_tenant`] deletes them, after the switch. Identity columns
/// (`jobs.id`, `run_steps.id`, `ticket_trace.id`) are numbered anew by `to`,
/// in the old order.
pub async fn copy_tenant(from: &PgPool, to: &PgPool, tenant: &TenantId) -> Result<Copied> {
    let exists = sqlx::query("SELECT 1 FROM tenants WHERE id = $1")
        .bind(tenant.as_str())
        .fetch_optional(from)
        .await?;
    if exists.is_none() {
        return Err(StoreError::NotFound("tenant in the database to copy from"));
    }
    let leased: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM jobs WHERE tenant_id = $1
         AND locked_until >= (extract(epoch from clock_timestamp()) * 1000)::bigint",
    )
    .bind(tenant.as_str())
    .fetch_one(from)
    .await?;
    if leased > 0 {
        return Err(StoreError::Conflict(format!(
            "{leased} job(s) of tenant {tenant} are leased (steps in flight); stop the tenant's \
             processes and wait for their leases to end before copying"
        )));
    }
    let tables = tenant_tables(from).await?;
    let mut source = from.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *source)
        .await?;
    let mut target = to.begin().await?;
    for table in &tables {
        let sql = format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE tenant_id = $1)");
        let held: bool = sqlx::query_scalar(&sql)
            .bind(tenant.as_str())
            .fetch_one(&mut *target)
            .await?;
        if held {
            return Err(StoreError::Conflict(format!(
                "the target database already holds rows of tenant {tenant} in {table}; \
                 nothing was copied"
            )));
        }
    }
    let row = sqlx::query("SELECT id, name, settings, created_at FROM tenants WHERE id = $1")
        .bind(tenant.as_str())
        .fetch_one(&mut *source)
        .await?;
    sqlx::query(
        "INSERT INTO tenants (id, name, settings, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, settings = EXCLUDED.settings",
    )
    .bind(row.get::<String, _>("id"))
    .bind(row.get::<String, _>("name"))
    .bind(row.get::<Json<Value>, _>("settings"))
    .bind(row.get::<i64, _>("created_at"))
    .execute(&mut *target)
    .await?;
    let mut copied = Vec::new();
    for table in &tables {
        let columns: Vec<(String, bool)> = sqlx::query_as(
            "SELECT column_name::text, is_identity = 'YES' FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
        )
        .bind(table)
        .fetch_all(&mut *target)
        .await?;
        let identity = columns.iter().find(|(_, id)| *id).map(|(c, _)| c.clone());
        let kept: Vec<&str> = columns
            .iter()
            .filter(|(_, id)| !id)
            .map(|(c, _)| c.as_str())
            .collect();
        let list = kept
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let order = identity.map_or("tableoid, ctid".to_owned(), |c| format!("\"{c}\""));
        let mut total = 0u64;
        let mut offset = 0i64;
        loop {
            let read = format!(
                "SELECT COALESCE(jsonb_agg(to_jsonb(t)), '[]'::jsonb) FROM
                 (SELECT * FROM {table} WHERE tenant_id = $1 ORDER BY {order} LIMIT $2 OFFSET $3) t"
            );
            let Json(batch): Json<Value> = sqlx::query_scalar(&read)
                .bind(tenant.as_str())
                .bind(COPY_BATCH)
                .bind(offset)
                .fetch_one(&mut *source)
                .await?;
            let n = batch.as_array().map_or(0, Vec::len) as i64;
            if n == 0 {
                break;
            }
            let write = format!(
                "INSERT INTO {table} ({list})
                 SELECT {list} FROM jsonb_array_elements($1) WITH ORDINALITY e(v, n),
                      jsonb_populate_record(NULL::{table}, e.v)
                 ORDER BY e.n"
            );
            total += sqlx::query(&write)
                .bind(Json(batch))
                .execute(&mut *target)
                .await?
                .rows_affected();
            offset += n;
            if n < COPY_BATCH {
                break;
            }
        }
        copied.push((table.clone(), total));
    }
    target.commit().await?;
    source.rollback().await?;
    Ok(copied)
}

/// Rows read at once by [`copy_tenant`].
const COPY_BATCH: i64 = 2_000;

/// Deletes every row of `tenant` from `db` but its `tenants` row, its
/// API keys and its audit log (the shared database keeps those): what a move leaves behind
/// in the database it left, after the switch. One transaction.
pub async fn forget_tenant(db: &PgPool, tenant: &TenantId) -> Result<Copied> {
    let mut tables = tenant_tables(db).await?;
    tables.reverse();
    let mut tx = db.begin().await?;
    let mut deleted = Vec::new();
    for table in tables
        .iter()
        .map(String::as_str)
        .chain(["connection_slots"])
    {
        let sql = format!("DELETE FROM {table} WHERE tenant_id = $1");
        let n = sqlx::query(&sql)
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        deleted.push((table.to_owned(), n));
    }
    tx.commit().await?;
    Ok(deleted)
}

/// The tables with a `tenant_id` column but those of [`NOT_COPIED`],
/// partitions left out (their parent stands for them), each after the
/// tables it references.
async fn tenant_tables(db: &PgPool) -> Result<Vec<String>> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
         ORDER BY c.relname",
    )
    .fetch_all(db)
    .await?;
    let tables: Vec<String> = tables
        .into_iter()
        .filter(|t| !NOT_COPIED.contains(&t.as_str()))
        .collect();
    let edges: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.conrelid::regclass::text, c.confrelid::regclass::text FROM pg_constraint c
         WHERE c.contype = 'f' AND c.connamespace = current_schema()::regnamespace",
    )
    .fetch_all(db)
    .await?;
    let mut ordered: Vec<String> = Vec::new();
    let mut left: HashSet<String> = tables.iter().cloned().collect();
    while !left.is_empty() {
        let ready: Vec<String> = tables
            .iter()
            .filter(|t| left.contains(*t))
            .filter(|t| {
                !edges
                    .iter()
                    .any(|(from, to)| from == *t && to != *t && left.contains(to))
            })
            .cloned()
            .collect();
        if ready.is_empty() {
            return Err(StoreError::Conflict(
                "the tenant tables reference each other in a cycle".into(),
            ));
        }
        for t in ready {
            left.remove(&t);
            ordered.push(t);
        }
    }
    Ok(ordered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_by_tenant_with_clear_errors() {
        let parsed = TenantDatabases::parse(
            " acme = postgres://u:p@db1/acme ; ten_1=postgresql://db2/x?sslmode=require\n# a comment\n*=postgres://db3/rest;",
            "TOK_TENANT_DATABASES",
        )
        .unwrap();
        assert_eq!(
            parsed.entries(),
            [
                ("acme".to_owned(), "postgres://u:p@db1/acme".to_owned()),
                (
                    "ten_1".to_owned(),
                    "postgresql://db2/x?sslmode=require".to_owned()
                ),
                ("*".to_owned(), "postgres://db3/rest".to_owned()),
            ]
        );
        let err = |text: &str| TenantDatabases::parse(text, "TOK_TENANT_DATABASES").unwrap_err();
        assert_eq!(
            err("acme=postgres://db/a;beta"),
            "TOK_TENANT_DATABASES: entry 2 `beta` has no `=`; expected `tenant=postgres://…` \
             (a tenant's id or name, or `*`)"
        );
        assert_eq!(
            err("acme=sqlite://x.db"),
            "TOK_TENANT_DATABASES: entry 1: the database of `acme` is `sqlite://x.db`; \
             expected a postgres://… URL"
        );
        assert_eq!(
            err("=postgres://db/a"),
            "TOK_TENANT_DATABASES: entry 1: the tenant before `=` is empty; expected a \
             tenant's id or name, or `*`"
        );
        assert_eq!(
            err("a=postgres://db/a;a=postgres://db/b"),
            "TOK_TENANT_DATABASES: entry 2: `a` is named twice"
        );
        // A password never shows in an error.
        assert!(!err("a=mysql://u:secret@db/a").contains("secret"));
    }

    #[test]
    fn a_file_is_json_or_lines_and_merges_with_the_variable() {
        let file = TenantDatabases::parse_file(
            r#"{ "acme": "postgres://db1/acme" }"#,
            "/etc/tok/tenants.json",
        )
        .unwrap();
        assert_eq!(file.entries().len(), 1);
        assert_eq!(
            TenantDatabases::parse_file(r#"{ "acme": 3 }"#, "t.json").unwrap_err(),
            "t.json: the value of `acme` is 3; expected a string postgres://…"
        );
        assert!(
            TenantDatabases::parse_file("{ nope", "t.json")
                .unwrap_err()
                .starts_with("t.json: not a JSON object of tenant to database URL")
        );
        let lines = TenantDatabases::parse_file("beta=postgres://db2/b\n", "t.conf").unwrap();
        let mut all = lines;
        all.merge(file.clone()).unwrap();
        assert_eq!(all.entries().len(), 2);
        let mut twice = file.clone();
        assert_eq!(
            twice.merge(file).unwrap_err(),
            "both TOK_TENANT_DATABASES and the file: `acme` is named twice"
        );
    }
}
