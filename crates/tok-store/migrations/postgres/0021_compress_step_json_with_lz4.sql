-- The JSON written at every step is compressed with lz4 instead of pglz,
-- PostgreSQL's default, where the server was built with lz4 (every
-- PGDG and Debian build is): the run's context, rewritten whole at each
-- step's record, the step rows' input, output and log, and the inbox's
-- payloads. A context of a few kilobytes and more is compressed at each
-- rewrite, and pglz was a large part of a scenario-B step's cost
-- (`docs/performance.md`, "Step JSON compressed with lz4"). Values already
-- stored keep their compression until they are written again; the
-- partitions there are now are set one by one, and those created later
-- take the setting from their table. On a server
-- without lz4 the columns stay with pglz, and the migration says so.
DO $$
DECLARE
    target record;
BEGIN
    -- The setting of a partitioned table is not passed to the partitions
    -- it already has: each is set too.
    FOR target IN
        WITH columns (tables, alter_columns) AS (VALUES
            ('runs'::regclass, 'ALTER COLUMN context SET COMPRESSION lz4'),
            ('run_steps'::regclass, 'ALTER COLUMN input SET COMPRESSION lz4,
                ALTER COLUMN output SET COMPRESSION lz4,
                ALTER COLUMN log SET COMPRESSION lz4'),
            ('event_inbox'::regclass, 'ALTER COLUMN payload SET COMPRESSION lz4'))
        SELECT tables AS relation, alter_columns FROM columns
        UNION ALL
        SELECT inhrelid::regclass, alter_columns
        FROM columns JOIN pg_inherits ON inhparent = tables
    LOOP
        EXECUTE format('ALTER TABLE %s %s', target.relation, target.alter_columns);
    END LOOP;
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'this PostgreSQL server has no lz4 compression (%); step JSON stays compressed with pglz', SQLERRM;
END
$$;
