-- Tenants and the API keys that act for them. A key with tenant_id NULL is a
-- platform admin key. Keys are stored as SHA-256 hashes only.
-- Times everywhere are unix milliseconds (INTEGER) so both backends read them
-- with the same code.
CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    settings    TEXT NOT NULL DEFAULT '{}',
    created_at  INTEGER NOT NULL
);

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT REFERENCES tenants (id),
    hash        TEXT NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);
