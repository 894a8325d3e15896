-- Idempotency keys move to a table of their own, `event_keys`, as on
-- PostgreSQL (where the event inbox is kept in monthly partitions and a
-- unique index over it could not span a month's boundary): one row per
-- (tenant, source, key) naming the event that holds it and when. A key
-- taken more than the idempotency window ago may be taken again, and the
-- expiry deletes rows older than the window.
CREATE TABLE event_keys (
    tenant_id        TEXT NOT NULL,
    source_kind      TEXT NOT NULL,
    source_id        TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    received_at      INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, source_kind, source_id, idempotency_key)
);
CREATE INDEX event_keys_expiry ON event_keys (tenant_id, received_at);

-- The keys still in their window (a day) come over.
INSERT INTO event_keys (tenant_id, source_kind, source_id, idempotency_key, event_id, received_at)
SELECT tenant_id, source_kind, source_id, idempotency_key, id, received_at
FROM event_inbox
WHERE source_id IS NOT NULL
  AND received_at >= CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) - 86400000;

DROP INDEX event_inbox_idempotency;
