-- Connections to outside services: credentials and limits per tenant and
-- service (the quota belongs to the tenant's account at the service).
CREATE TABLE connections (
    id                   TEXT PRIMARY KEY,
    tenant_id            TEXT NOT NULL REFERENCES tenants (id),
    name                 TEXT NOT NULL,
    service              TEXT NOT NULL,
    base_url             TEXT,
    -- Write-only: never returned by the API, never logged.
    credentials          TEXT NOT NULL DEFAULT '{}',
    -- Token bucket: `rate` tokens per second up to `burst`; NULL = no limit.
    rate                 REAL,
    burst                INTEGER NOT NULL DEFAULT 1,
    tokens               REAL NOT NULL DEFAULT 0,
    refilled_at          INTEGER NOT NULL DEFAULT 0,
    max_concurrency      INTEGER,
    -- Circuit breaker: opens after `breaker_threshold` retryable failures in
    -- a row, lets one probe through after `breaker_cooldown_ms`.
    breaker_threshold    INTEGER NOT NULL DEFAULT 5,
    breaker_cooldown_ms  INTEGER NOT NULL DEFAULT 30000,
    breaker_state        TEXT NOT NULL DEFAULT 'closed',
    failures             INTEGER NOT NULL DEFAULT 0,
    opened_at            INTEGER,
    created_at           INTEGER NOT NULL,
    UNIQUE (tenant_id, name)
);

-- Calls in flight per connection, one row per step holding a slot. A slot
-- expires with its job's lease (and is extended by the same heartbeat), so a
-- crashed worker cannot hold a slot for ever.
CREATE TABLE connection_slots (
    connection_id  TEXT NOT NULL,
    tenant_id      TEXT NOT NULL,
    job_id         INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    PRIMARY KEY (connection_id, job_id)
);
CREATE INDEX connection_slots_job ON connection_slots (job_id);
