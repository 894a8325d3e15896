-- The event inbox is kept in monthly partitions like run_steps and
-- ticket_trace (DESIGN §10): expired months go by DROP TABLE. PostgreSQL
-- wants the partition key in every unique index of a partitioned table,
-- and the idempotency key must stay unique across a month's boundary: an
-- event received at 23:59 on the last day of a month and its retry at
-- 00:01 are one event. The keys move to a table of their own,
-- `event_keys`, one row per (tenant, source, key) naming the event that
-- holds it and when; a key taken more than the idempotency window ago may
-- be taken again (the row then names the new event), and the expiry
-- deletes rows older than the window.
CREATE TABLE event_keys (
    tenant_id        TEXT NOT NULL,
    source_kind      TEXT NOT NULL,
    source_id        TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    received_at      BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, source_kind, source_id, idempotency_key)
);
CREATE INDEX event_keys_expiry ON event_keys (tenant_id, received_at);

-- The keys still in their window (a day) come over; older ones no longer
-- deduplicate anything. Events of no source never had a key that counted.
INSERT INTO event_keys (tenant_id, source_kind, source_id, idempotency_key, event_id, received_at)
SELECT tenant_id, source_kind, source_id, idempotency_key, id, received_at
FROM event_inbox
WHERE source_id IS NOT NULL
  AND received_at >= (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT - 86400000;

-- The table itself: a partitioned table with the same columns, a
-- partition for every month the existing rows are of (so none lands in
-- the default partition), the rows copied over in this one transaction,
-- and the old table dropped. The server creates the partitions of this
-- month and the next two after the migrations.
ALTER TABLE event_inbox RENAME TO event_inbox_unpartitioned;
CREATE TABLE event_inbox (LIKE event_inbox_unpartitioned INCLUDING DEFAULTS INCLUDING STORAGE)
    PARTITION BY RANGE (received_at);
CREATE TABLE event_inbox_default PARTITION OF event_inbox DEFAULT;
DO $$
DECLARE
    month DATE;
BEGIN
    FOR month IN
        SELECT DISTINCT date_trunc('month', to_timestamp(received_at / 1000.0) AT TIME ZONE 'UTC')::DATE
        FROM event_inbox_unpartitioned
    LOOP
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF event_inbox FOR VALUES FROM (%s) TO (%s)',
            'event_inbox_' || to_char(month, 'YYYY_MM'),
            (EXTRACT(EPOCH FROM month::TIMESTAMP AT TIME ZONE 'UTC') * 1000)::BIGINT,
            (EXTRACT(EPOCH FROM (month + INTERVAL '1 month')::TIMESTAMP AT TIME ZONE 'UTC') * 1000)::BIGINT
        );
    END LOOP;
END
$$;
INSERT INTO event_inbox SELECT * FROM event_inbox_unpartitioned;
DROP TABLE event_inbox_unpartitioned;
ALTER TABLE event_inbox ADD PRIMARY KEY (id, received_at);
CREATE INDEX event_inbox_pending ON event_inbox (tenant_id, received_at, id) WHERE status = 'pending';
CREATE INDEX event_inbox_expiry ON event_inbox (tenant_id, received_at) WHERE status <> 'pending';
