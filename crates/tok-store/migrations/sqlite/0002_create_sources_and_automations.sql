-- Webhook sources (one token each) and versioned automations.
CREATE TABLE sources (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    name        TEXT NOT NULL,
    token       TEXT NOT NULL UNIQUE,
    params      TEXT NOT NULL DEFAULT '[]',
    critical    INTEGER NOT NULL DEFAULT 0,
    rate_limit  INTEGER,
    secret      TEXT,
    created_at  INTEGER NOT NULL
);
CREATE INDEX sources_tenant ON sources (tenant_id, id);

-- trigger_kind / trigger_key mirror the current version's trigger so that the
-- dispatcher finds candidate automations with one indexed lookup.
CREATE TABLE automations (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL REFERENCES tenants (id),
    name             TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'active',
    current_version  INTEGER NOT NULL,
    trigger_kind     TEXT NOT NULL,
    trigger_key      TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX automations_trigger ON automations (tenant_id, trigger_kind, trigger_key);

CREATE TABLE automation_versions (
    automation_id  TEXT NOT NULL REFERENCES automations (id),
    tenant_id      TEXT NOT NULL,
    version        INTEGER NOT NULL,
    definition     TEXT NOT NULL,
    hash           TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (automation_id, version)
);
