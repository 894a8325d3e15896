-- Runs started by a run (`run_workflow`, trigger type `parent`) are found
-- by their parent: the run detail lists them, the listing filters by it.
CREATE INDEX runs_parent ON runs (tenant_id, parent_run_id) WHERE parent_run_id IS NOT NULL;

-- A run has a job per parallel branch while its branches run (and the
-- job parked at the parallel step): jobs are no longer unique per run.
DROP INDEX jobs_run;
CREATE INDEX jobs_run ON jobs (run_id);
