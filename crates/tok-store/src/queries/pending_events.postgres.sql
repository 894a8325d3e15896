-- The dispatch's fair selection of pending events (PostgreSQL).
--   $1  the tenants (text[])
--   $2  how many events in all
--   $3  how many events of each tenant
-- Each tenant's oldest events first, the tenants round robin (every
-- tenant's first event, then every tenant's second, and so on), so a
-- tenant with a backlog of thousands does not hold back another tenant's
-- event. The rows are locked, skipping those another dispatch holds.
SELECT * FROM (
    SELECT e.*, row_number() OVER (PARTITION BY e.tenant_id ORDER BY e.received_at, e.id) AS rk
    FROM unnest($1::text[]) AS t(id)
    CROSS JOIN LATERAL (
        SELECT id, tenant_id, source_id, source_kind, payload, params, depth, cause_run_id,
            origin_automation_id, target_automation_id, event_type, subject_ticket_id,
            received_at, traceparent
        FROM event_inbox
        WHERE status = 'pending' AND tenant_id = t.id
        ORDER BY received_at, id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) e
) c
ORDER BY rk, received_at, id
LIMIT $2
