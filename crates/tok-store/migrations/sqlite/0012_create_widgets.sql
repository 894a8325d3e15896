-- Dashboard widgets: one HTTP request to an outside service per tile, and
-- its last answer kept as the tile's cache for `ttl_ms`.
CREATE TABLE widgets (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    name        TEXT NOT NULL,
    -- A connection's name or id (its credentials and limits); NULL calls
    -- the request's absolute URL directly.
    connection  TEXT,
    -- An `http` step's config.
    request     TEXT NOT NULL,
    ttl_ms      INTEGER NOT NULL,
    -- The last answer's body and when it was fetched; NULL before the first.
    data        TEXT,
    fetched_at  INTEGER,
    created_at  INTEGER NOT NULL,
    UNIQUE (tenant_id, name)
);
