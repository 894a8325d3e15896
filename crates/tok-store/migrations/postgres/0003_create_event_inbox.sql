-- Every accepted event, webhook or internal, is one row here before anything
-- else happens. A duplicate (same source, same idempotency key within 24 h)
-- finds the existing row; an older row's key is retired so the window is 24 h.
CREATE TABLE event_inbox (
    id                    TEXT PRIMARY KEY,
    tenant_id             TEXT NOT NULL,
    source_id             TEXT,
    source_kind           TEXT NOT NULL,
    idempotency_key       TEXT NOT NULL,
    payload               JSONB NOT NULL,
    params                JSONB NOT NULL DEFAULT '{}',
    received_at           BIGINT NOT NULL,
    status                TEXT NOT NULL DEFAULT 'pending',
    dispatched_at         BIGINT,
    cause_run_id          TEXT,
    depth                 INTEGER NOT NULL DEFAULT 0,
    origin_automation_id  TEXT,
    target_automation_id  TEXT
);
CREATE UNIQUE INDEX event_inbox_idempotency ON event_inbox (tenant_id, source_kind, source_id, idempotency_key);
CREATE INDEX event_inbox_pending ON event_inbox (tenant_id, received_at) WHERE status = 'pending';
