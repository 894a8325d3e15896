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
CREATE INDEX flow_keys_by_age ON flow_keys (updated_at);

-- `flow.startTimeout`: when a run no worker has begun by then expires.
-- Only queued runs with one are in the index the scheduler reads.
ALTER TABLE runs ADD COLUMN start_by INTEGER;
CREATE INDEX runs_to_start_by ON runs (start_by)
    WHERE start_by IS NOT NULL AND status = 'queued';
