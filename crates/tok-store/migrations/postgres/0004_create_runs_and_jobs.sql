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
    context          JSONB NOT NULL,
    actions          INTEGER NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT,
    error            TEXT,
    parent_run_id    TEXT,
    idempotency_key  TEXT,
    UNIQUE (event_id, automation_id)
);
CREATE INDEX runs_tenant_id ON runs (tenant_id, id DESC);
CREATE INDEX runs_tenant_status ON runs (tenant_id, status, id DESC);
CREATE INDEX runs_tenant_automation ON runs (tenant_id, automation_id, id DESC);
CREATE UNIQUE INDEX runs_idempotency ON runs (tenant_id, automation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- One row per executed attempt of a step. Partitioned by month from the
-- start: it is the largest table, and expiry is DROP TABLE of a partition.
-- The server creates partitions ahead; the default partition catches a clock
-- that ran past them.
CREATE TABLE run_steps (
    id           BIGINT GENERATED ALWAYS AS IDENTITY,
    run_id       TEXT NOT NULL,
    tenant_id    TEXT NOT NULL,
    path         TEXT NOT NULL,
    step_id      TEXT NOT NULL,
    type         TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    status       TEXT NOT NULL,
    input        JSONB,
    output       JSONB,
    error        TEXT,
    log          JSONB NOT NULL DEFAULT '[]',
    started_at   BIGINT NOT NULL,
    finished_at  BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE run_steps_default PARTITION OF run_steps DEFAULT;
CREATE INDEX run_steps_run ON run_steps (tenant_id, run_id, id);

-- The queue. tenant_id, queue_key and priority exist from the first
-- migration: adding them later to the busiest table is what hurts.
CREATE TABLE jobs (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id        TEXT NOT NULL,
    tenant_id     TEXT NOT NULL,
    path          TEXT NOT NULL,
    run_after     BIGINT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    queue_key     TEXT,
    priority      INTEGER NOT NULL DEFAULT 0,
    locked_by     TEXT,
    locked_until  BIGINT,
    claim_token   TEXT,
    created_at    BIGINT NOT NULL
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
    match       JSONB,
    due_at      BIGINT
);
CREATE INDEX waits_key ON waits (tenant_id, key);
