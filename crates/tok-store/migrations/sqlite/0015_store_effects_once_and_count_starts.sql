-- Effects once (DESIGN §5a): a custom step's `call.once(name, …)` stores
-- the effect's result under the step's idempotency key and the name, so a
-- retried attempt gets it back instead of running the effect again. Rows
-- expire with their run's step data (`run_id`, `created_at`).
CREATE TABLE step_effects (
    tenant_id        TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    name             TEXT NOT NULL,
    run_id           TEXT NOT NULL,
    result           TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key, name)
);
CREATE INDEX step_effects_expiry ON step_effects (tenant_id, created_at);
-- Start limits (`settings.limits.startsPerMinute`): the starts of an
-- automation in the last minute are counted by its runs' creation times.
CREATE INDEX runs_starts ON runs (tenant_id, automation_id, created_at);
