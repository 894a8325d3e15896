-- A step of a run that goes on under its lease writes two rows, its step
-- row and its run's row, and neither holds the whole context again (the
-- PostgreSQL migration of the same name says how): the run's row carries
-- the position of the job that continues (`cursor_*`), and each record's
-- change of the context is kept in its last step row (`context_delta`),
-- folded over `runs.context` (the context up to step row `context_upto`)
-- when the run is read.
ALTER TABLE runs ADD COLUMN cursor_job INTEGER;
ALTER TABLE runs ADD COLUMN cursor_path TEXT;
ALTER TABLE runs ADD COLUMN cursor_base INTEGER;
ALTER TABLE runs ADD COLUMN context_upto INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN tail_since INTEGER;
ALTER TABLE runs ADD COLUMN tail_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN context_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE run_steps ADD COLUMN context_delta TEXT;
