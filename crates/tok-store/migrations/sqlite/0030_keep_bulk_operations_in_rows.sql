-- A bulk operation (`POST /api/runs/bulk`): a retry or a cancel of every
-- run a filter takes, done by the server in pages. Its state is in rows,
-- so a restart goes on where it was: `after` is the last run of the
-- pages done, and `operation_runs` holds one row per run it acted on,
-- written in the transaction that acted, so that a page done again after
-- a crash acts on none of its runs twice.
CREATE TABLE operations (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    action       TEXT NOT NULL,
    version      TEXT NOT NULL,
    filter       TEXT NOT NULL,
    status       TEXT NOT NULL,
    total        BIGINT NOT NULL,
    done         BIGINT NOT NULL DEFAULT 0,
    failed       BIGINT NOT NULL DEFAULT 0,
    after        TEXT,
    actor        TEXT,
    created_at   BIGINT NOT NULL,
    finished_at  BIGINT
);
CREATE INDEX operations_tenant ON operations (tenant_id, id);
CREATE INDEX operations_running ON operations (tenant_id, created_at) WHERE status = 'running';
CREATE TABLE operation_runs (
    tenant_id     TEXT NOT NULL,
    operation_id  TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    ok            BOOLEAN NOT NULL,
    reason        TEXT,
    at            BIGINT NOT NULL,
    PRIMARY KEY (operation_id, run_id)
);
CREATE INDEX operation_runs_failed ON operation_runs (tenant_id, operation_id, run_id) WHERE NOT ok;
