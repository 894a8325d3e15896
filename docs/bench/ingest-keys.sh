#!/usr/bin/env bash
# What idempotency keys cost PostgreSQL's side of ingest, without tok around
# it: group commits of 16 webhook events, 8 clients, written five ways in
# one scratch database, alternating, ROUNDS rounds of SECS seconds each
# (docs/performance.md, "Idempotency keys apart").
#   unique     the inbox as it was before monthly partitions: one table, a
#              unique index on (tenant, source kind, source, key)
#   none       the partitioned inbox with no key check at all (a floor)
#   keys-flat  one unpartitioned inbox plus event_keys (partitioning apart)
#   keys       what tok writes: the partitioned inbox plus event_keys with
#              its primary key and its expiry index, two statements
#   keys-noexp the same without event_keys' expiry index
# usage: docs/bench/ingest-keys.sh [rounds] [secs]   env: PGHOST (127.0.0.1), PGUSER (postgres)
set -euo pipefail
ROUNDS=${1:-3}; SECS=${2:-6}
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres}
DB=tok_ingest_keys_$$
dir=$(mktemp -d)
trap 'psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $DB" >/dev/null; rm -rf "$dir"' EXIT
psql -X -q -d postgres -c "CREATE DATABASE $DB"
psql -X -q -d "$DB" <<'SQL'
CREATE TABLE inbox_flat (
    id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, source_id TEXT, source_kind TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, payload JSONB NOT NULL, params JSONB NOT NULL DEFAULT '{}',
    received_at BIGINT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', dispatched_at BIGINT,
    cause_run_id TEXT, depth INTEGER NOT NULL DEFAULT 0, origin_automation_id TEXT,
    target_automation_id TEXT);
CREATE INDEX ON inbox_flat (tenant_id, received_at, id) WHERE status = 'pending';
CREATE INDEX ON inbox_flat (tenant_id, received_at) WHERE status <> 'pending';
CREATE TABLE inbox_unique (LIKE inbox_flat INCLUDING ALL);
CREATE UNIQUE INDEX ON inbox_unique (tenant_id, source_kind, source_id, idempotency_key);
CREATE TABLE inbox (LIKE inbox_flat INCLUDING DEFAULTS) PARTITION BY RANGE (received_at);
CREATE TABLE inbox_month PARTITION OF inbox FOR VALUES FROM (0) TO (9000000000000);
ALTER TABLE inbox ADD PRIMARY KEY (id, received_at);
CREATE INDEX ON inbox (tenant_id, received_at, id) WHERE status = 'pending';
CREATE INDEX ON inbox (tenant_id, received_at) WHERE status <> 'pending';
CREATE TABLE keys (tenant_id TEXT NOT NULL, source_kind TEXT NOT NULL, source_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, event_id TEXT NOT NULL, received_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, source_kind, source_id, idempotency_key));
CREATE INDEX ON keys (tenant_id, received_at);
CREATE TABLE keys_noexp (LIKE keys INCLUDING DEFAULTS);
ALTER TABLE keys_noexp ADD PRIMARY KEY (tenant_id, source_kind, source_id, idempotency_key);
CREATE TABLE keys_flat (LIKE keys INCLUDING ALL);
SQL
PAYLOAD='{"order": {"id": 12345, "customer": {"email": "someone@example.com", "name": "Jana"}, "items": [{"sku": "A-1", "qty": 2, "price": 19.9}, {"sku": "B-7", "qty": 1, "price": 5.5}], "total": 45.3, "currency": "EUR"}}'
NOW="(extract(epoch from now()) * 1000)::bigint"
ROWS="SELECT md5('i' || :seed || '-' || g) AS id, 't' || (g % 4) AS t, md5('k' || :seed || '-' || g) AS k FROM generate_series(1, 16) g"
insert_events() { # table, ON CONFLICT clause
  echo "INSERT INTO $1 (id, tenant_id, source_id, source_kind, idempotency_key, payload, received_at)
SELECT id, t, 'src', 'webhook', k, '$PAYLOAD'::jsonb, $NOW FROM ($ROWS) r $2;"
}
with_keys() { # keys table, inbox table
  echo '\set seed random(1, 2000000000)'
  echo 'BEGIN;'
  echo "INSERT INTO $1 (tenant_id, source_kind, source_id, idempotency_key, event_id, received_at)
SELECT t, 'webhook', 'src', k, id, $NOW FROM ($ROWS) r ON CONFLICT DO NOTHING RETURNING event_id;"
  insert_events "$2" ""
  echo 'COMMIT;'
}
{ echo '\set seed random(1, 2000000000)'; insert_events inbox_unique "ON CONFLICT DO NOTHING"; } > "$dir/unique.sql"
{ echo '\set seed random(1, 2000000000)'; insert_events inbox ""; } > "$dir/none.sql"
with_keys keys_flat inbox_flat > "$dir/keys-flat.sql"
with_keys keys inbox > "$dir/keys.sql"
with_keys keys_noexp inbox > "$dir/keys-noexp.sql"
printf '%-6s' round; for v in unique none keys-flat keys keys-noexp; do printf '%12s' "$v"; done; echo '   (commits/s of 16 events)'
for r in $(seq 1 "$ROUNDS"); do
  printf '%-6s' "$r"
  for v in unique none keys-flat keys keys-noexp; do
    tps=$(pgbench -n -c 8 -T "$SECS" -f "$dir/$v.sql" "$DB" 2>/dev/null | awk '/^tps/ { printf "%.0f", $3 }')
    printf '%12s' "$tps"
  done
  echo
done
