-- Runs, their step records and the job queue.
CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    automation_id    TEXT NOT NULL,
    version          INTEGER NOT NULL,
    event_id         TEXT NOT NULL,
    trigger_type     TEXT NOT NULL,
    status           TEXT NOT NULL,
    depth            INTEGER NOT NULL DEFAULT 0,
    queue_key        TEXT,
    context          TEXT NOT NULL,
    actions          INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    error            TEXT,
    parent_run_id    TEXT,
    idempotency_key  TEXT,
    UNIQUE (event_id, automation_id)
);
CREATE INDEX runs_tenant_id ON runs (tenant_id, id);
CREATE INDEX runs_tenant_status ON runs (tenant_id, status, id);
CREATE INDEX runs_tenant_automation ON runs (tenant_id, automation_id, id);
CREATE UNIQUE INDEX runs_idempotency ON runs (tenant_id, automation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- One row per executed attempt of a step. (PostgreSQL partitions this table
-- by month; SQLite keeps one table and expires rows with DELETE.)
CREATE TABLE run_steps (
    id           INTEGER PRIMARY KEY,
    run_id       TEXT NOT NULL,
    tenant_id    TEXT NOT NULL,
    path         TEXT NOT NULL,
    step_id      TEXT NOT NULL,
    type         TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    status       TEXT NOT NULL,
    input        TEXT,
    output       TEXT,
    error        TEXT,
    log          TEXT NOT NULL DEFAULT '[]',
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER NOT NULL,
    created_at   INTEGER NOT NULL
);
CREATE INDEX run_steps_run ON run_steps (tenant_id, run_id, id);

-- The queue. tenant_id, queue_key and priority exist from the first
-- migration: adding them later to the busiest table is what hurts.
CREATE TABLE jobs (
    id            INTEGER PRIMARY KEY,
    run_id        TEXT NOT NULL,
    tenant_id     TEXT NOT NULL,
    path          TEXT NOT NULL,
    run_after     INTEGER NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    queue_key     TEXT,
    priority      INTEGER NOT NULL DEFAULT 0,
    locked_by     TEXT,
    locked_until  INTEGER,
    claim_token   TEXT,
    created_at    INTEGER NOT NULL
);
CREATE INDEX jobs_ready ON jobs (tenant_id, priority DESC, run_after, id);
CREATE INDEX jobs_queue_key ON jobs (tenant_id, queue_key) WHERE queue_key IS NOT NULL;
CREATE INDEX jobs_locked_by ON jobs (locked_by) WHERE locked_by IS NOT NULL;
CREATE UNIQUE INDEX jobs_run ON jobs (run_id);

-- Waits for signals and timers (wait_for_event); created now so that the
-- queue's tables are complete from the first release.
CREATE TABLE waits (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    path        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    key         TEXT,
    match       TEXT,
    due_at      INTEGER
);
CREATE INDEX waits_key ON waits (tenant_id, key);
