-- Runs started by a run (`run_workflow`, trigger type `parent`) are found
-- by their parent: the run detail lists them, the listing filters by it.
CREATE INDEX runs_parent ON runs (tenant_id, parent_run_id) WHERE parent_run_id IS NOT NULL;
