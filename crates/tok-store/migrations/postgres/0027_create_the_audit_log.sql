-- The audit log (DESIGN §15): one row per change a key or the platform
-- made, never a secret. A tenant's rows name it; the platform's own rows
-- have no tenant. `seq` is the order rows were written in (listings are
-- keyed by it: ids made in one millisecond do not sort by time). Monthly
-- partitions like the other append-only tables (DESIGN §10): expired
-- months go by DROP TABLE. The server creates the partitions of this
-- month and the next two after the migrations.
CREATE TABLE audit (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY,
    id           TEXT NOT NULL,
    tenant_id    TEXT,
    at           BIGINT NOT NULL,
    actor_kind   TEXT NOT NULL,
    actor_id     TEXT,
    actor_name   TEXT,
    action       TEXT NOT NULL,
    target_kind  TEXT NOT NULL,
    target_id    TEXT,
    summary      TEXT,
    PRIMARY KEY (seq, at)
) PARTITION BY RANGE (at);
CREATE TABLE audit_default PARTITION OF audit DEFAULT;
-- A tenant's listing, newest first; the platform admin's reads the
-- primary key backwards.
CREATE INDEX audit_tenant ON audit (tenant_id, seq);
-- Expiry by tenant and age.
CREATE INDEX audit_expiry ON audit (tenant_id, at);
