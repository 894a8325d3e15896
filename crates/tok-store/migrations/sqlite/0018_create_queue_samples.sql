-- The queue's health over time, per tenant, for the dashboard's charts of
-- the last hour: one row per tenant per sample, written by the node that
-- holds the scheduler's wake (every TOK_QUEUE_SAMPLE_EVERY) in one
-- statement for every tenant. Rows older than a day are deleted by the
-- expiry.
CREATE TABLE queue_samples (
    tenant_id        TEXT NOT NULL REFERENCES tenants (id),
    at               INTEGER NOT NULL,
    ready            INTEGER NOT NULL,
    scheduled        INTEGER NOT NULL,
    running          INTEGER NOT NULL,
    pending_events   INTEGER NOT NULL,
    -- NULL: no job was ready.
    oldest_ready_ms  INTEGER,
    -- Step attempts recorded in the `window_ms` before `at` (since the
    -- tenant's sample before).
    steps_completed  INTEGER NOT NULL,
    steps_failed     INTEGER NOT NULL,
    window_ms        INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, at)
);
