-- The scheduler (DESIGN §6). One node at a time runs the wake: it holds
-- the one row of `scheduler_lease` (`holder` the node, `incarnation` its
-- process start, renewed each tick until `expires_at`); another node takes
-- the row over once it expired.
CREATE TABLE scheduler_lease (
    name         TEXT PRIMARY KEY,
    holder       TEXT NOT NULL,
    incarnation  TEXT NOT NULL,
    taken_at     INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
);

-- When each poll or schedule automation is due next. `spec` is its trigger
-- as last saved (a changed trigger starts over, an edit of the steps does
-- not); `version` the automation version it was read from. Firing moves
-- `next_run_at` only from the value read, in the run's transaction, so a
-- tick is fired once however many schedulers race for it; `last_run_id`
-- is the last run fired, which a poll waits for.
CREATE TABLE trigger_schedules (
    tenant_id      TEXT NOT NULL,
    automation_id  TEXT NOT NULL,
    version        INTEGER NOT NULL,
    spec           TEXT NOT NULL,
    next_run_at    INTEGER,
    last_run_at    INTEGER,
    last_run_id    TEXT,
    PRIMARY KEY (tenant_id, automation_id)
);
CREATE INDEX trigger_schedules_due ON trigger_schedules (tenant_id, next_run_at);

-- Stuck runs the scheduler found (DESIGN §10), for the platform admin
-- only: `reason` is the code (`run_timeout`, `wait_overdue`,
-- `queue_stalled`, `lease_expired_repeatedly`), `source` the cause, one open incident per cause.
CREATE TABLE platform_incidents (
    id           TEXT PRIMARY KEY,
    reason       TEXT NOT NULL,
    source       TEXT NOT NULL,
    tenant_id    TEXT,
    run_id       TEXT,
    title        TEXT NOT NULL,
    detail       TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'open',
    occurrences  INTEGER NOT NULL DEFAULT 1,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    resolved_at  INTEGER
);
CREATE UNIQUE INDEX platform_incidents_open_cause ON platform_incidents (source) WHERE status = 'open';
CREATE INDEX platform_incidents_id ON platform_incidents (id DESC);

-- How often a job's lease expired before it was claimed again (a worker
-- died or hung mid-step): at 3 the watch raises `lease_expired_repeatedly`.
-- The index holds only those jobs.
ALTER TABLE jobs ADD COLUMN lease_expiries INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_lease_expired_repeatedly ON jobs (tenant_id, run_id) WHERE lease_expiries >= 3;
