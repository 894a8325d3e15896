-- The queue's health over time, per tenant, for the dashboard's charts of
-- the last hour: one row per tenant per sample, written by the node that
-- holds the scheduler's wake (every TOK_QUEUE_SAMPLE_EVERY) in one
-- statement for every tenant. Rows older than a day are deleted by the
-- expiry.
CREATE TABLE queue_samples (
    tenant_id        TEXT NOT NULL REFERENCES tenants (id),
    at               BIGINT NOT NULL,
    ready            BIGINT NOT NULL,
    scheduled        BIGINT NOT NULL,
    running          BIGINT NOT NULL,
    pending_events   BIGINT NOT NULL,
    -- NULL: no job was ready.
    oldest_ready_ms  BIGINT,
    -- Step attempts recorded in the `window_ms` before `at` (since the
    -- tenant's sample before).
    steps_completed  BIGINT NOT NULL,
    steps_failed     BIGINT NOT NULL,
    window_ms        BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, at)
);
