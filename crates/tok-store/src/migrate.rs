//! Migrations: one SQL file per change, named by what it does, applied in
//! order and recorded in `tok_migrations`. Written by hand rather than with
//! `sqlx::migrate!` to keep sqlx's macro crates out of the build and to take
//! PostgreSQL's advisory lock in each migration's transaction, so that
//! several processes starting at once apply each migration exactly once.
//! [`apply`] is the one runner both backends call with their list.

pub(crate) struct Migration {
    pub(crate) version: i64,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// The migrations of one folder of `migrations/`, each file's SQL built
/// into the binary. A macro because `include_str!` takes a literal path
/// only; it generates no SQL of its own.
macro_rules! migrations {
    ($dir:literal: $($version:literal $name:literal),* $(,)?) => {
        &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../migrations/", $dir, "/", $name, ".sql")),
        }),*]
    };
}

pub(crate) const POSTGRES: &[Migration] = migrations!("postgres":
    1 "0001_create_tenants_and_keys",
    2 "0002_create_sources_and_automations",
    3 "0003_create_event_inbox",
    4 "0004_create_runs_and_jobs",
    5 "0005_create_service_desk",
    6 "0006_create_connections",
    7 "0007_index_pending_events_in_dispatch_order",
    8 "0008_leave_room_for_job_updates_in_place",
    9 "0009_leave_room_for_run_updates_in_place",
    10 "0010_create_signals_and_resumes",
    11 "0011_create_the_schedulers_tables",
    12 "0012_child_runs_and_parallel_branches",
    13 "0013_create_approvals",
    14 "0014_create_widgets",
    15 "0015_index_rows_by_age_for_expiry",
    17 "0017_store_effects_once_and_count_starts",
    19 "0019_partition_the_event_inbox_by_month",
    20 "0020_create_queue_samples",
    21 "0021_compress_step_json_with_lz4",
    22 "0022_index_leased_jobs_by_tenant",
    23 "0023_index_signals_by_age_for_expiry",
    24 "0024_give_api_keys_names_scopes_and_ends",
    25 "0025_let_sources_rotate_and_automations_archive",
    27 "0027_create_the_audit_log",
    28 "0028_keep_the_traceparent_of_events",
    29 "0029_give_runs_a_priority",
    30 "0030_record_who_sent_a_signal",
    31 "0031_keep_flow_keys_and_start_deadlines",
    32 "0032_remember_what_an_event_replays",
    33 "0033_keep_bulk_operations_in_rows",
    34 "0034_index_what_started_a_run",
    35 "0035_keep_a_runs_position_and_context_changes_in_rows_it_writes_anyway",
    36 "0036_let_sources_name_their_sender_and_schema",
    37 "0037_match_signals_and_waits_by_subject",
    39 "0039_let_tenants_be_deleted_and_audit_rows_be_written_ahead",
    41 "0041_set_aside_events_that_cannot_be_dispatched",
);

pub(crate) const SQLITE: &[Migration] = migrations!("sqlite":
    1 "0001_create_tenants_and_keys",
    2 "0002_create_sources_and_automations",
    3 "0003_create_event_inbox",
    4 "0004_create_runs_and_jobs",
    5 "0005_create_service_desk",
    6 "0006_create_connections",
    7 "0007_index_pending_events_in_dispatch_order",
    8 "0008_create_signals_and_resumes",
    9 "0009_create_the_schedulers_tables",
    10 "0010_child_runs_and_parallel_branches",
    11 "0011_create_approvals",
    12 "0012_create_widgets",
    13 "0013_index_rows_by_age_for_expiry",
    15 "0015_store_effects_once_and_count_starts",
    17 "0017_keep_idempotency_keys_apart",
    18 "0018_create_queue_samples",
    19 "0019_index_leased_jobs_by_tenant",
    20 "0020_index_signals_by_age_for_expiry",
    21 "0021_give_api_keys_names_scopes_and_ends",
    22 "0022_let_sources_rotate_and_automations_archive",
    24 "0024_create_the_audit_log",
    25 "0025_keep_the_traceparent_of_events",
    26 "0026_give_runs_a_priority",
    27 "0027_record_who_sent_a_signal",
    28 "0028_keep_flow_keys_and_start_deadlines",
    29 "0029_remember_what_an_event_replays",
    30 "0030_keep_bulk_operations_in_rows",
    31 "0031_index_what_started_a_run",
    32 "0032_keep_a_clock_offset",
    33 "0033_keep_a_runs_position_and_context_changes_in_rows_it_writes_anyway",
    34 "0034_let_sources_name_their_sender_and_schema",
    35 "0035_match_signals_and_waits_by_subject",
    37 "0037_let_tenants_be_deleted_and_audit_rows_be_written_ahead",
    39 "0039_set_aside_events_that_cannot_be_dispatched",
);

pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS tok_migrations (
    version BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at BIGINT NOT NULL
)";

/// Applies the migrations of `list` that `conn`'s database has not applied
/// yet, in order, each in a transaction of its own with its row in
/// `tok_migrations`: a crash between two leaves the first applied and
/// recorded, and the next start goes on from the second.
///
/// `lock` is the backend's lock, where it needs one: a statement that takes
/// a lock until the transaction ends, and the key it binds as `$1`. Each
/// transaction takes it first and only then reads what is applied, so that
/// processes starting at once apply each migration exactly once. (A
/// transaction lock, PostgreSQL's `pg_advisory_xact_lock`, ends with its
/// transaction whatever happens; a session lock taken and released by
/// separate statements can stay behind on a pooler's connection in
/// transaction mode.) SQLite's one writer needs none.
pub(crate) async fn apply<DB>(
    conn: &mut DB::Connection,
    list: &[Migration],
    lock: Option<(&str, i64)>,
) -> crate::Result<()>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    loop {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        if let Some((sql, key)) = lock {
            sqlx::query(sql).bind(key).execute(&mut *tx).await?;
        }
        sqlx::Executor::execute(&mut *tx, CREATE_TABLE).await?;
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM tok_migrations")
            .fetch_all(&mut *tx)
            .await?;
        let Some(m) = list.iter().find(|m| !applied.contains(&m.version)) else {
            tx.commit().await?;
            return Ok(());
        };
        sqlx::Executor::execute(&mut *tx, m.sql)
            .await
            .map_err(|source| crate::StoreError::Migration {
                name: m.name,
                source,
            })?;
        sqlx::query("INSERT INTO tok_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
            .bind(m.version)
            .bind(m.name)
            .bind(crate::now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::info!(migration = m.name, "applied");
    }
}
