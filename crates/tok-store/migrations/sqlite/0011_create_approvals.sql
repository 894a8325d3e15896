-- Approvals (DESIGN §5a): opened by an `approval` step in its record
-- transaction, decided once through the API. `status` is `pending` until
-- the decision (`approved` or `rejected`, by `decided_by`); a pending one
-- whose run no longer waits on its key (`approval:<id>`) shows as closed.
CREATE TABLE approvals (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    step_id     TEXT NOT NULL,
    path        TEXT NOT NULL,
    prompt      TEXT NOT NULL,
    approvers   TEXT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'pending',
    decided_by  TEXT,
    comment     TEXT,
    actor       TEXT,
    created_at  INTEGER NOT NULL,
    decided_at  INTEGER
);
CREATE INDEX approvals_tenant ON approvals (tenant_id, status, id);
