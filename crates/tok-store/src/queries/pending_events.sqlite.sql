-- The dispatch's fair selection of pending events (SQLite).
--   $1  the tenants (a JSON array)
--   $2  how many events in all
--   $3  how many events of each tenant
-- Each tenant's oldest events first, the tenants round robin (every
-- tenant's first event, then every tenant's second, and so on), so a
-- tenant with a backlog of thousands does not hold back another tenant's
-- event. (The one writer serializes dispatches: nothing to lock.)
SELECT * FROM (
    SELECT e.id, e.tenant_id, e.source_id, e.source_kind, e.payload, e.params, e.depth,
        e.cause_run_id, e.origin_automation_id, e.target_automation_id, e.event_type,
        e.subject_ticket_id, e.received_at, e.traceparent,
        row_number() OVER (PARTITION BY e.tenant_id ORDER BY e.received_at, e.id) AS rk
    FROM json_each($1) AS t
    JOIN event_inbox e ON e.id IN (
        SELECT k.id FROM event_inbox k
        WHERE k.status = 'pending' AND k.tenant_id = t.value
        ORDER BY k.received_at, k.id
        LIMIT $3)
)
ORDER BY rk, received_at, id
LIMIT $2
