//! Migrations: one SQL file per change, named by what it does, applied in
//! order and recorded in `tok_migrations`. Written by hand rather than with
//! `sqlx::migrate!` to keep sqlx's macro crates out of the build and to take
//! PostgreSQL's advisory lock around the whole set, so that several
//! processes starting at once apply each migration exactly once.

pub(crate) struct Migration {
    pub(crate) version: i64,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

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
);

pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS tok_migrations (
    version BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at BIGINT NOT NULL
)";
