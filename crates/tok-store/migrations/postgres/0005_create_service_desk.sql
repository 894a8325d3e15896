-- The service-desk domain: ticket types, groups and their members, tickets
-- with their trace, incidents; and what the queue needs to serve it.

CREATE TABLE ticket_types (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    name        TEXT NOT NULL,
    statuses    JSONB NOT NULL,
    fields      JSONB NOT NULL DEFAULT '[]',
    created_at  BIGINT NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE groups (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE members (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    group_id    TEXT NOT NULL REFERENCES groups (id),
    name        TEXT NOT NULL,
    capacity    INTEGER NOT NULL,
    position    INTEGER NOT NULL,
    created_at  BIGINT NOT NULL
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
    closed       BOOLEAN NOT NULL DEFAULT FALSE,
    tags         JSONB NOT NULL DEFAULT '[]',
    fields       JSONB NOT NULL DEFAULT '{}',
    assignee_id  TEXT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    UNIQUE (tenant_id, external_id)
);
CREATE INDEX tickets_tenant_id ON tickets (tenant_id, id DESC);
CREATE INDEX tickets_open_by_assignee ON tickets (tenant_id, assignee_id) WHERE NOT closed;

-- What happened to a ticket, by whom. Partitioned by month like run_steps.
CREATE TABLE ticket_trace (
    id             BIGINT GENERATED ALWAYS AS IDENTITY,
    tenant_id      TEXT NOT NULL,
    ticket_id      TEXT NOT NULL,
    at             BIGINT NOT NULL,
    kind           TEXT NOT NULL,
    message        TEXT NOT NULL,
    run_id         TEXT,
    automation_id  TEXT,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE TABLE ticket_trace_default PARTITION OF ticket_trace DEFAULT;
CREATE INDEX ticket_trace_ticket ON ticket_trace (tenant_id, ticket_id, id);

-- Two levels: title and impact for the tenant, detail for the platform
-- admin. One open incident per cause (source).
CREATE TABLE incidents (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL REFERENCES tenants (id),
    source       TEXT NOT NULL,
    title        TEXT NOT NULL,
    impact       TEXT NOT NULL,
    detail       JSONB NOT NULL DEFAULT '{}',
    status       TEXT NOT NULL DEFAULT 'open',
    run_id       TEXT,
    ticket_id    TEXT,
    occurrences  INTEGER NOT NULL DEFAULT 1,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    resolved_at  BIGINT
);
CREATE UNIQUE INDEX incidents_open_cause ON incidents (tenant_id, source) WHERE status = 'open';
CREATE INDEX incidents_tenant_id ON incidents (tenant_id, id DESC);

-- Internal events name their type (`ticket.updated`, a custom `emit`), and
-- ticket events their ticket, for the dispatcher's loop protection.
ALTER TABLE event_inbox ADD COLUMN event_type TEXT;
ALTER TABLE event_inbox ADD COLUMN subject_ticket_id TEXT;

-- The ticket a run acts on, for the per-ticket run cap and the runs of a ticket.
ALTER TABLE runs ADD COLUMN subject_ticket_id TEXT;
CREATE INDEX runs_subject ON runs (tenant_id, subject_ticket_id, automation_id, created_at)
    WHERE subject_ticket_id IS NOT NULL;

-- A paused run keeps its job, held back from claims.
ALTER TABLE jobs ADD COLUMN held BOOLEAN NOT NULL DEFAULT FALSE;
