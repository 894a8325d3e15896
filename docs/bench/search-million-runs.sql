-- The rows and statements behind docs/performance.md, "Searching runs by
-- their body": run on a scratch database migrated with tok's PostgreSQL
-- migrations (psql -f each of crates/tok-store/migrations/postgres/*.sql in order).

-- A million runs of the tenant searched (ten_a), and a million of another.
INSERT INTO runs (id, tenant_id, automation_id, version, event_id, trigger_type, status, depth,
                  context, actions, created_at, body)
SELECT 'run_' || lpad(i::text, 10, '0'), CASE WHEN i % 2 = 0 THEN 'ten_a' ELSE 'ten_b' END,
       'aut_' || (i % 20), 1, 'evt_' || i, 'webhook',
       CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'completed' END, 0,
       jsonb_build_object('_body', b, 'st_ship', jsonb_build_object('ok', true, 'carrier', 'dpd')),
       3, 1764547200000 + i, b
FROM generate_series(1, 2000000) AS i,
     LATERAL (SELECT jsonb_build_object('order', jsonb_build_object('id', 'A-' || i, 'total', i % 500,
                'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (i % 1000), 'qty', 1))),
              'customer', jsonb_build_object('email', 'c' || (i % 50000) || '@example.com'),
              'shop', CASE WHEN i % 3 = 0 THEN 'cz' ELSE 'sk' END) AS b) AS x;
ANALYZE runs;

-- The runs listing as the store sends it with `body_contains` (RunFilter).
PREPARE search(text,text,text,text,text,bigint,text,bigint,text,bigint,bigint,jsonb) AS
SELECT id, automation_id, version, event_id, status, trigger_type, depth,
            actions, subject_ticket_id, parent_run_id, created_at, started_at, finished_at, error,
            priority FROM runs
                     WHERE tenant_id = $1
                       AND (CAST($2 AS TEXT) IS NULL OR status = $2)
                       AND (CAST($3 AS TEXT) IS NULL OR automation_id = $3)
                       AND (CAST($4 AS TEXT) IS NULL OR trigger_type = $4)
                       AND (CAST($5 AS TEXT) IS NULL OR id < $5)
                       AND (CAST($7 AS TEXT) IS NULL OR parent_run_id = $7)
                       AND ($8 = 0 OR status IN ('queued', 'running', 'waiting'))
                       AND (CAST($9 AS TEXT) IS NULL OR event_id = $9)
                       AND (CAST($10 AS BIGINT) IS NULL OR created_at >= $10)
                       AND (CAST($11 AS BIGINT) IS NULL OR created_at < $11)
                       AND body @> CAST($12 AS JSONB)
                     ORDER BY id DESC
                     LIMIT $6;
\timing on
EXPLAIN (ANALYZE, BUFFERS) EXECUTE search('ten_a', NULL, NULL, NULL, NULL, 101, NULL, 0, NULL, NULL, NULL, '{"order":{"id":"A-1234566"}}');
EXPLAIN (ANALYZE, BUFFERS) EXECUTE search('ten_a', 'failed', NULL, NULL, NULL, 101, NULL, 0, NULL, NULL, NULL, '{"customer":{"email":"c1230@example.com"}}');
EXPLAIN (ANALYZE, BUFFERS) EXECUTE search('ten_a', NULL, NULL, NULL, NULL, 101, NULL, 0, NULL, NULL, NULL, '{"shop":"cz"}');
EXPLAIN (ANALYZE, BUFFERS) EXECUTE search('ten_a', NULL, NULL, NULL, NULL, 101, NULL, 0, NULL, NULL, NULL, '{"order":{"id":"A-1234566"}}');
EXPLAIN (ANALYZE, BUFFERS) EXECUTE search('ten_a', 'failed', NULL, NULL, NULL, 101, NULL, 0, NULL, NULL, NULL, '{"customer":{"email":"c1230@example.com"}}');
EXPLAIN (ANALYZE, BUFFERS) EXECUTE search('ten_a', NULL, NULL, NULL, NULL, 101, NULL, 0, NULL, NULL, NULL, '{"shop":"cz"}');
-- Without the index.
SET enable_bitmapscan = off;
EXPLAIN (ANALYZE) SELECT id FROM runs WHERE tenant_id = 'ten_a' AND body @> '{"order":{"id":"A-1234566"}}' ORDER BY id DESC LIMIT 101;
