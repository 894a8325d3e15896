-- Waits for signals (DESIGN §5a). A waiting run keeps its one job, parked
-- at the wait step with the reason it will be handed out again: the signal
-- that resumed it, or its timeout (`{"kind":"timedOut"}`, due at the wait's
-- due time). NULL for every other job.
ALTER TABLE jobs ADD COLUMN resume TEXT;

-- A run's waits are found by run when its job is recorded or cancelled.
CREATE INDEX waits_run ON waits (tenant_id, run_id);

-- Signals sent to a tenant's waits. A signal that resumed no wait stays
-- buffered until `expires_at` (the lookback window) for a wait that starts
-- meanwhile; `consumed_by_run` is the run that took it from the buffer.
-- `resumed` is the answer to the send, given again to a repeat of its
-- idempotency key.
CREATE TABLE signals (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    key              TEXT NOT NULL,
    payload          TEXT NOT NULL,
    idempotency_key  TEXT,
    received_at      INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    resumed          TEXT NOT NULL DEFAULT '[]',
    consumed_by_run  TEXT,
    consumed_at      INTEGER
);
CREATE UNIQUE INDEX signals_idempotency ON signals (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The oldest unconsumed signal of (tenant, key): what a starting wait takes.
CREATE INDEX signals_buffered ON signals (tenant_id, key, received_at, id)
    WHERE consumed_at IS NULL;
