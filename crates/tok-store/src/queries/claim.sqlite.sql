-- The claim's fair selection of claimable jobs (SQLite).
--   $1  the tenants (a JSON array)
--   $2  how many jobs of each tenant
--   $3  how many jobs in all
-- Each row carries its tenant's concurrency cap (`cap`, NULL: none), read
-- from the tenant's `settings.limits.concurrency` as `tenant_cap!` in
-- `fragments.rs` reads it (a value that is no number is no cap).
-- Each tenant's jobs in its own order (priority, then due time), cut to
-- a prefix of the tenants' round robin (every tenant's first job, then
-- every tenant's second, and so on; the earlier due first within a
-- round): the claim's order and picks are `tok_core::fairness::pick`'s. A job is claimable when it is due, not leased, not
-- held (a paused run), and no other job of its queue key is leased or
-- older and due. (The one writer serializes claims: nothing to lock.)
SELECT c.id, c.tenant_id, c.queue_key, CAST(c.priority AS BIGINT) AS priority, c.run_after,
    CASE WHEN json_type(tn.settings, '$.limits.concurrency') IN ('integer', 'real')
    THEN MIN(MAX(CAST(json_extract(tn.settings, '$.limits.concurrency') AS INTEGER), 0), 1000000)
    END AS cap
FROM (SELECT id, tenant_id, queue_key, rk, priority, run_after FROM (
    SELECT j.id, j.tenant_id, j.queue_key, j.priority, j.run_after,
        row_number() OVER (PARTITION BY j.tenant_id
                           ORDER BY j.priority DESC, j.run_after, j.id) AS rk
    FROM json_each($1) AS t
    JOIN jobs j ON j.id IN (
        SELECT k.id FROM jobs k
        WHERE k.tenant_id = t.value
          AND k.run_after <= (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + (SELECT offset_ms FROM clock_offset))
          AND (k.locked_until IS NULL
               OR k.locked_until < (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + (SELECT offset_ms FROM clock_offset)))
          AND NOT k.held
          AND (k.queue_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM jobs q
                WHERE q.tenant_id = k.tenant_id AND q.queue_key = k.queue_key
                  AND q.id <> k.id
                  AND (q.locked_until >= (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + (SELECT offset_ms FROM clock_offset))
                       OR (q.id < k.id AND NOT q.held
                           AND q.run_after <= (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + (SELECT offset_ms FROM clock_offset))))))
        ORDER BY k.priority DESC, k.run_after, k.id
        LIMIT $2)
)
ORDER BY rk, run_after, id
LIMIT $3) c
LEFT JOIN tenants tn ON tn.id = c.tenant_id
