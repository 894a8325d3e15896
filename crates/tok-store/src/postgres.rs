//! The PostgreSQL store: many worker processes on many machines share one
//! database. Claims lock candidate rows with `FOR UPDATE SKIP LOCKED` and are
//! serialized by a transaction-level advisory lock, so that fairness between
//! tenants and one-running-job-per-queue-key hold across processes without a
//! coordinator. Leases and due times use the database clock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::admin_sql::impl_admin;
use crate::batch::Batcher;
use crate::connections_sql::impl_connections;
use crate::definitions_sql::impl_definitions;
use crate::desk_sql::impl_desk;
use crate::dispatch_sql::impl_dispatch;
use crate::gate::Writer;
use crate::inbox_sql::impl_inbox;
use crate::migrate;
use crate::queue_sql::impl_queue;
use crate::record_sql::impl_record;
use crate::runs_sql::impl_runs;
use crate::signals_sql::impl_signals;

// The names the queries of every `*_sql.rs` file use, once for all of them.
use serde_json::Value;
use sqlx::Row as _;
use sqlx::types::Json;
use tok_core::ids::{AutomationId, EventId, JobId, RunId, SourceId, TenantId, new_id};

use crate::rows::{IDEMPOTENCY_WINDOW_MS, now_ms};
use crate::*;

/// Advisory lock key held while migrations run (any process, any machine).
const MIGRATION_LOCK: i64 = 0x746f_6b01;

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
    /// The last dispatch took only other tenants' events (see `dispatch_handing_off`).
    others_went_first: std::sync::atomic::AtomicBool,
}

impl PgStore {
    /// Connects a pool of at most `max_connections`. Steps never hold a
    /// connection while they call out, so a handful serves many slots.
    pub async fn connect(url: &str, max_connections: u32) -> crate::Result<Self> {
        let options: PgConnectOptions = url.parse()?;
        // A connection in steady use is not pinged before each use (a round
        // trip per transaction); one idle for a while is, so a server
        // restart is noticed before a statement fails on it.
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(2))
            .acquire_timeout(Duration::from_secs(10))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > Duration::from_secs(5) {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        let (events_pool, records_pool) = (pool.clone(), pool.clone());
        let events = Batcher::spawn(
            Arc::new(move |items, _lane, _turn| {
                let pool = events_pool.clone();
                Box::pin(async move { accept_batch(&pool, items).await })
            }),
            WRITERS,
            |(tenant, _)| tenant,
            None,
        );
        let records = Batcher::spawn(
            Arc::new(move |items, _lane, _turn| {
                let pool = records_pool.clone();
                Box::pin(async move { record_batch(&pool, items).await })
            }),
            WRITERS,
            |(job, _)| &job.tenant_id,
            None,
        );
        Ok(Self {
            pool,
            events,
            records,
            others_went_first: Default::default(),
        })
    }

    /// The pool, for tests and tools that need to look underneath.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// PostgreSQL takes many writers: no gate.
    async fn writer(&self) -> Writer<'_, sqlx::Postgres> {
        Writer::ungated(&self.pool)
    }

    /// No gate, so no lanes: an urgent transaction runs beside the others.
    async fn writer_in(&self, _lane: crate::Lane) -> Writer<'_, sqlx::Postgres> {
        self.writer().await
    }

    fn reader(&self) -> &PgPool {
        &self.pool
    }
}

fn list<T, I: IntoIterator<Item = T>>(items: I) -> Vec<T> {
    items.into_iter().collect()
}

impl_admin! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_definitions! {
    store = PgStore,
    db = sqlx::Postgres,
}

impl_inbox! {
    store = PgStore,
    db = sqlx::Postgres,
    rows_1 = "jsonb_array_elements($1) WITH ORDINALITY AS x(value, key)",
    notify_work = "SELECT pg_notify('tok_work', '')",
}

impl_dispatch! {
    store = PgStore,
    db = sqlx::Postgres,
    now = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT",
    ids_in_2 = "= ANY($2)",
    plan_prelude = "SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off",
    dispatch_select = "SELECT * FROM (
            SELECT e.*, row_number() OVER (PARTITION BY e.tenant_id ORDER BY e.received_at, e.id) AS rk
            FROM unnest($1::text[]) AS t(id)
            CROSS JOIN LATERAL (
                SELECT id, tenant_id, source_id, source_kind, payload, params, depth, cause_run_id,
                origin_automation_id, target_automation_id, event_type, subject_ticket_id,
                received_at
                FROM event_inbox
                WHERE status = 'pending' AND tenant_id = t.id
                ORDER BY received_at, id
                LIMIT $3
                FOR UPDATE SKIP LOCKED
            ) e
        ) c
        ORDER BY rk, received_at, id
        LIMIT $2",
    rows_1 = "jsonb_array_elements($1) WITH ORDINALITY AS x(value, key)",
    notify_work = "SELECT pg_notify('tok_work', '')",
    // The tenant filter of a statement that finds its rows by primary key:
    // an expression no index serves, so the planner never reads a tenant's
    // rows through a tenant-leading index (its statistics lag a table that
    // grew fast, and such a plan reads the tenant's whole backlog).
    by_key_tenants_in_1 = "|| '' = ANY($1)",
    list = list,
}

impl_record! {
    store = PgStore,
    db = sqlx::Postgres,
    now = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT",
    ids_in_2 = "= ANY($2)",
    plan_prelude = "SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off",
    rows_1 = "jsonb_array_elements($1) WITH ORDINALITY AS x(value, key)",
    lock_jobs_runs = "FOR UPDATE OF j, r",
    // The tenant filter of a statement that finds its rows by primary key:
    // an expression no index serves, so the planner never reads a tenant's
    // rows through a tenant-leading index (its statistics lag a table that
    // grew fast, and such a plan reads the tenant's whole backlog).
    by_key_tenants_in_1 = "|| '' = ANY($1)",
    by_key_tenant = "|| ''",
    // A record's updates name their rows' keys, for the same reason.
    key_hint_jobs_2 = "AND jobs.id = ANY($2)",
    key_hint_runs_2 = "AND runs.id = ANY($2)",
    update_staying_runs_apart = false,
    list = list,
}

impl_runs! {
    store = PgStore,
    db = sqlx::Postgres,
    now = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT",
    lock_row = "FOR UPDATE",
}

impl_queue! {
    store = PgStore,
    db = sqlx::Postgres,
    now = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT",
    tenants_in_1 = "= ANY($1)",
    ids_in_2 = "= ANY($2)",
    ids_in_4 = "= ANY($4)",
    // The queue's transactions (claims, dispatches, record batches) find
    // their rows by key, or read each tenant's oldest rows through an index
    // in their order, a few at a time. Their tables grow from empty to tens
    // of thousands of rows between two runs of autovacuum's analyze, and
    // with the statistics of a near-empty table the planner reads a whole
    // table (a sequential scan, 60 ms at 50,000 inbox rows) or a tenant's
    // whole backlog (a bitmap scan and a sort) for a handful of rows. Both
    // are off in these transactions.
    claim_prelude = "SELECT pg_advisory_xact_lock(1953459970);
        SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off",
    claim_candidates = "SELECT id, tenant_id, queue_key FROM (
            SELECT j.id, j.tenant_id, j.queue_key, j.priority, j.run_after,
                row_number() OVER (PARTITION BY j.tenant_id
                                   ORDER BY j.priority DESC, j.run_after, j.id) AS rk
            FROM unnest($1::text[]) AS t(id)
            CROSS JOIN LATERAL (
                SELECT k.id, k.tenant_id, k.queue_key, k.priority, k.run_after
                FROM jobs k
                WHERE k.tenant_id = t.id
                  AND k.run_after <= (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT
                  AND (k.locked_until IS NULL
                       OR k.locked_until < (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT)
                  AND NOT k.held
                  AND (k.queue_key IS NULL OR NOT EXISTS (
                        SELECT 1 FROM jobs q
                        WHERE q.tenant_id = k.tenant_id AND q.queue_key = k.queue_key
                          AND q.id <> k.id
                          AND (q.locked_until >= (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT
                               OR (q.id < k.id AND NOT q.held
                                   AND q.run_after <= (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT))))
                ORDER BY k.priority DESC, k.run_after, k.id
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            ) j
        ) c
        ORDER BY rk, priority DESC, run_after, id
        LIMIT $3",
    release_where = "locked_by = $1",
    // The tenant filter of a statement that finds its rows by primary key:
    // an expression no index serves, so the planner never reads a tenant's
    // rows through a tenant-leading index (its statistics lag a table that
    // grew fast, and such a plan reads the tenant's whole backlog).
    by_key_tenants_in_1 = "|| '' = ANY($1)",
    skip_locked = "FOR UPDATE SKIP LOCKED",
    list = list,
}

impl_desk! {
    store = PgStore,
    db = sqlx::Postgres,
    conn = sqlx::PgConnection,
    group_lock = "SELECT pg_advisory_xact_lock(7, hashtext($1))",
    lock_row = "FOR UPDATE",
}

impl_connections! {
    store = PgStore,
    db = sqlx::Postgres,
    now = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT",
    lock_row = "FOR UPDATE",
}

impl_signals! {
    store = PgStore,
    db = sqlx::Postgres,
    now = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT",
    in_1 = "= ANY($1)",
    in_2 = "= ANY($2)",
    // Signal keys' locks: transaction advisory locks of the two-key form
    // under a class of their own (8; groups use 7, and the one-key locks of
    // claims and migrations are another key space), taken in the order of
    // their hashes. Two names that share a hash share a lock, which only
    // serializes them.
    lock_names_1 = "SELECT pg_advisory_xact_lock(8, h)
        FROM (SELECT DISTINCT hashtext(n) AS h FROM unnest($1::text[]) AS n ORDER BY h) locks",
    lock_jobs = "FOR UPDATE OF j",
    notify_work = "SELECT pg_notify('tok_work', '')",
    list = list,
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

    async fn migrate(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await?;
        let applied = apply_migrations(&mut conn).await;
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await?;
        applied?;
        drop(conn);
        self.maintain().await
    }

    async fn maintain(&self) -> Result<()> {
        // `CREATE TABLE IF NOT EXISTS` is not safe against itself: two
        // processes starting at once both pass the check and one fails on
        // the catalog's unique index. The migration lock serializes them.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        // This month and the next two get their own partitions of the
        // tables partitioned by month.
        sqlx::Executor::execute(
            &mut *tx,
            "DO $$
             DECLARE m timestamp; t text;
             BEGIN
               FOREACH t IN ARRAY ARRAY['run_steps', 'ticket_trace'] LOOP
                 FOR i IN 0..2 LOOP
                   m := date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i);
                   EXECUTE format(
                     'CREATE TABLE IF NOT EXISTS %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)',
                     t || '_' || to_char(m, 'YYYY_MM'),
                     t,
                     (EXTRACT(EPOCH FROM m) * 1000)::bigint,
                     (EXTRACT(EPOCH FROM m + interval '1 month') * 1000)::bigint);
                 END LOOP;
               END LOOP;
             END $$",
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

async fn apply_migrations(conn: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::Executor::execute(&mut *conn, migrate::CREATE_TABLE).await?;
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM tok_migrations")
        .fetch_all(&mut *conn)
        .await?;
    let pending: Vec<&migrate::Migration> = migrate::POSTGRES
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .collect();
    for m in pending {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::Executor::execute(&mut *tx, m.sql)
            .await
            .map_err(|source| StoreError::Migration {
                name: m.name,
                source,
            })?;
        sqlx::query("INSERT INTO tok_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
            .bind(m.version)
            .bind(m.name)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::info!(migration = m.name, "applied");
    }
    Ok(())
}
