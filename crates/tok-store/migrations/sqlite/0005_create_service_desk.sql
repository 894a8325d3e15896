-- The service-desk domain: ticket types, groups and their members, tickets
-- with their trace, incidents; and what the queue needs to serve it.

CREATE TABLE ticket_types (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    name        TEXT NOT NULL,
    statuses    TEXT NOT NULL,
    fields      TEXT NOT NULL DEFAULT '[]',
    created_at  INTEGER NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE groups (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE members (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    group_id    TEXT NOT NULL REFERENCES groups (id),
    name        TEXT NOT NULL,
    capacity    INTEGER NOT NULL,
    position    INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX members_group ON members (tenant_id, group_id, position);

-- A ticket has a status (one of its type's), a closed flag and free tags.
CREATE TABLE tickets (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL REFERENCES tenants (id),
    external_id  TEXT NOT NULL,
    type_id      TEXT,
    title        TEXT,
    status       TEXT,
    closed       INTEGER NOT NULL DEFAULT 0,
    tags         TEXT NOT NULL DEFAULT '[]',
    fields       TEXT NOT NULL DEFAULT '{}',
    assignee_id  TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    UNIQUE (tenant_id, external_id)
);
CREATE INDEX tickets_tenant_id ON tickets (tenant_id, id);
CREATE INDEX tickets_open_by_assignee ON tickets (tenant_id, assignee_id) WHERE closed = 0;

-- What happened to a ticket, by whom. (PostgreSQL partitions it by month.)
CREATE TABLE ticket_trace (
    id             INTEGER PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    ticket_id      TEXT NOT NULL,
    at             INTEGER NOT NULL,
    kind           TEXT NOT NULL,
    message        TEXT NOT NULL,
    run_id         TEXT,
    automation_id  TEXT
);
CREATE INDEX ticket_trace_ticket ON ticket_trace (tenant_id, ticket_id, id);

-- Two levels: title and impact for the tenant, detail for the platform
-- admin. One open incident per cause (source).
CREATE TABLE incidents (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL REFERENCES tenants (id),
    source       TEXT NOT NULL,
    title        TEXT NOT NULL,
    impact       TEXT NOT NULL,
    detail       TEXT NOT NULL DEFAULT '{}',
    status       TEXT NOT NULL DEFAULT 'open',
    run_id       TEXT,
    ticket_id    TEXT,
    occurrences  INTEGER NOT NULL DEFAULT 1,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    resolved_at  INTEGER
);
CREATE UNIQUE INDEX incidents_open_cause ON incidents (tenant_id, source) WHERE status = 'open';
CREATE INDEX incidents_tenant_id ON incidents (tenant_id, id);

-- Internal events name their type (`ticket.updated`, a custom `emit`), and
-- ticket events their ticket, for the dispatcher's loop protection.
ALTER TABLE event_inbox ADD COLUMN event_type TEXT;
ALTER TABLE event_inbox ADD COLUMN subject_ticket_id TEXT;

-- The ticket a run acts on, for the per-ticket run cap and the runs of a ticket.
ALTER TABLE runs ADD COLUMN subject_ticket_id TEXT;
CREATE INDEX runs_subject ON runs (tenant_id, subject_ticket_id, automation_id, created_at)
    WHERE subject_ticket_id IS NOT NULL;

-- A paused run keeps its job, held back from claims.
ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
