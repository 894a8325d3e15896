-- One row per key of an automation's start control (`flow.debounce`,
-- `throttle`, `batch`, `singleton`): the run its last start made, when
-- that run's window opened, how many events it holds, and when the key's
-- next throttled start is due. The dispatch reads a key's row under a lock
-- on its name and decides from it; nothing of a window is kept in memory.
CREATE TABLE flow_keys (
    tenant_id     TEXT NOT NULL,
    automation_id TEXT NOT NULL,
    control       TEXT NOT NULL,
    key           TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    opened_at     INTEGER NOT NULL,
    count         INTEGER NOT NULL,
    next_at       INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, automation_id, control, key)
);
CREATE INDEX flow_keys_by_age ON flow_keys (tenant_id, updated_at);
-- The singleton keys with runs queued on them (`count`), which the
-- scheduler looks at every tick for one whose run has ended.
CREATE INDEX flow_keys_queued ON flow_keys (tenant_id)
    WHERE control = 'singleton' AND count > 0;

-- `flow.startTimeout`: when a run no worker has begun by then expires.
-- Only queued runs with one are in the index the scheduler reads.
ALTER TABLE runs ADD COLUMN start_by INTEGER;
CREATE INDEX runs_to_start_by ON runs (start_by)
    WHERE start_by IS NOT NULL AND status = 'queued';

-- `flow.cancelOn`: for each run of an automation with one, the value its
-- first context has at each entry's `match` path, and the entry's `where`.
-- An event of `source` whose value at `path` is `value` (and whose context
-- `filter` holds for) cancels the run.
CREATE TABLE run_cancels (
    tenant_id  TEXT NOT NULL,
    source     TEXT NOT NULL,
    path       TEXT NOT NULL,
    value      TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    filter     TEXT,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, source, path, value, run_id)
);
CREATE INDEX run_cancels_by_age ON run_cancels (tenant_id, created_at);
