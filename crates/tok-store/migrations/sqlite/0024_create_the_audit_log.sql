-- The audit log (DESIGN §15): one row per change a key or the platform
-- made, never a secret. A tenant's rows name it; the platform's own rows
-- have no tenant. `seq` is the order rows were written in (listings are
-- keyed by it: ids made in one millisecond do not sort by time).
CREATE TABLE audit (
    seq          INTEGER PRIMARY KEY,
    id           TEXT NOT NULL,
    tenant_id    TEXT,
    at           INTEGER NOT NULL,
    actor_kind   TEXT NOT NULL,
    actor_id     TEXT,
    actor_name   TEXT,
    action       TEXT NOT NULL,
    target_kind  TEXT NOT NULL,
    target_id    TEXT,
    summary      TEXT
);
-- A tenant's listing, newest first.
CREATE INDEX audit_tenant ON audit (tenant_id, seq);
-- Expiry by tenant and age.
CREATE INDEX audit_expiry ON audit (tenant_id, at);
