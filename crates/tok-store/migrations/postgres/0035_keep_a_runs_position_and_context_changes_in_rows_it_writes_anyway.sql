-- A step of a run that goes on under its lease writes two rows, its step
-- row and its run's row, and neither holds the whole context again:
--
-- * The job's row stays as it was claimed. The run's row says where the
--   run is (`cursor_path`) and which of its jobs is there (`cursor_job`);
--   `cursor_base` is the job's `attempts` before that step's first
--   attempt, so a claim after a lost lease counts the step's attempts from
--   there. A record that releases the job writes the job's row again and
--   clears the cursor.
-- * A record stores what it changed of the run's context (the top-level
--   entries it set and removed) in its last step row (`context_delta`).
--   `runs.context` holds the context up to the step row `context_upto`;
--   the changes of the step rows after it, folded in order over it, give
--   the context now. `tail_since` is when the first of those was written
--   (NULL: none), `tail_bytes` their size; `context_bytes` is the size of
--   `runs.context` when it was last written whole. A run's context is
--   written whole when the run ends and when its changes outgrow it.
ALTER TABLE runs ADD COLUMN cursor_job BIGINT;
ALTER TABLE runs ADD COLUMN cursor_path TEXT;
ALTER TABLE runs ADD COLUMN cursor_base INTEGER;
ALTER TABLE runs ADD COLUMN context_upto BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN tail_since BIGINT;
ALTER TABLE runs ADD COLUMN tail_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN context_bytes BIGINT NOT NULL DEFAULT 0;
-- `json`, not `jsonb`: a change is written once and read back as it was,
-- never looked into by the database, so it is kept as its text.
ALTER TABLE run_steps ADD COLUMN context_delta JSON;

-- Compressed like the step rows' other JSON (migration 0021), where the
-- server has lz4; the partitions there are now one by one.
DO $$
DECLARE
    target record;
BEGIN
    FOR target IN
        SELECT 'run_steps'::regclass AS relation
        UNION ALL
        SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'run_steps'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN context_delta SET COMPRESSION lz4',
                       target.relation);
    END LOOP;
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'this PostgreSQL server has no lz4 compression (%); context changes stay compressed with pglz', SQLERRM;
END
$$;
