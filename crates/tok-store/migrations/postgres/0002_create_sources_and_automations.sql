-- Webhook sources (one token each) and versioned automations.
CREATE TABLE sources (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    name        TEXT NOT NULL,
    token       TEXT NOT NULL UNIQUE,
    params      JSONB NOT NULL DEFAULT '[]',
    critical    BOOLEAN NOT NULL DEFAULT FALSE,
    rate_limit  INTEGER,
    secret      TEXT,
    created_at  BIGINT NOT NULL
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
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX automations_trigger ON automations (tenant_id, trigger_kind, trigger_key);

CREATE TABLE automation_versions (
    automation_id  TEXT NOT NULL REFERENCES automations (id),
    tenant_id      TEXT NOT NULL,
    version        INTEGER NOT NULL,
    definition     JSONB NOT NULL,
    hash           TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (automation_id, version)
);
