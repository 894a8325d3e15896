-- A tenant being deleted (docs/operations.md, "Offboarding a tenant"):
-- `deleting_since` is when the platform admin asked. From then on its keys
-- are revoked, its webhooks answer 404 and nothing of it starts; the
-- scheduler erases its rows in short batches until none is left, then its
-- row. NULL: a tenant in service, as every tenant was before.
ALTER TABLE tenants ADD COLUMN deleting_since BIGINT;

-- An audit row is written before the change it records (docs/security.md,
-- "Audit"): `pending` while the change is under way, `done` once it was
-- made, `unknown` when its process ended (or its answer failed) before it
-- could say. Rows written before this migration, and by a node of the
-- previous release, recorded changes already made: `done`.
ALTER TABLE audit ADD COLUMN outcome TEXT NOT NULL DEFAULT 'done';
-- The scheduler finds the rows left pending by a process that stopped.
CREATE INDEX audit_pending ON audit (at) WHERE outcome = 'pending';

-- The erasure finds a tenant's rows by `tenant_id` in every table: these
-- two had no index that starts with it.
CREATE INDEX operation_runs_tenant ON operation_runs (tenant_id);
CREATE INDEX automation_versions_tenant ON automation_versions (tenant_id);
