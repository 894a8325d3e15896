//! The SQL fragments in which PostgreSQL and SQLite differ, each named for
//! what it means and defined once per backend (`postgres` and `sqlite`
//! below). The queries of the `*_sql.rs` files splice them in with
//! `concat!`; a fragment that names a bound parameter takes its position
//! (`any_of!(2)` reads the list bound at `$2`). What each one means:
//!
//! - `db_now!()`: the database clock, in Unix milliseconds. Leases and due
//!   times use it, so that processes on machines whose clocks differ agree.
//! - `any_of!(n)`: "is one of the list bound at `$n`" (lists are bound as
//!   the backend's `list` makes them: an array, or a JSON array on SQLite).
//! - `text_bytes!(column)`: the bytes of a JSON column's value as text.
//! - `unindexed_any_of!(n)` and `unindexed!()`: the same test, and the
//!   plain comparison's left side, as an expression no index serves: for
//!   the tenant filter of a statement that finds its rows by primary key.
//! - `seek_keys!(table, n)`: a condition naming the keys of `table`'s rows
//!   an update matches (bound at `$n`), where the backend plans better with it.
//! - `batch_rows!(n)`: the rows of a batch statement bound at `$n` as one
//!   JSON array of objects (`rows.rs`), as `x` with the row in `x.value`
//!   and its position in `x.key`. The statement reads a row's fields by
//!   name, in the same words on both backends: `x.value ->> 'run_id'` (a
//!   value as text or number), `x.value -> 'context'` (as JSON).
//!   `batch_keys!(n)`: the same for a batch of keys (a few fields a row)
//!   that a statement joins to tables by key, read as they come, so that
//!   the planner drives the join from them (a fence, a heartbeat, waits
//!   to take).
//! - `lock_rows!()`: locks the rows a `SELECT` reads until the transaction
//!   ends; `lock_rows_of!(a, b)` only those of the tables aliased `a`, `b`;
//!   `lock_rows_skip_locked!()` locks them but skips rows another
//!   transaction holds (`lock_rows_skip_locked!(a, b)`: of the tables `a`,
//!   `b`; a row is skipped when any of its tables' rows is held).
//! - `lock_names!(n)`: a statement that takes the locks named by the list
//!   bound at `$n` until the transaction ends, in one order; empty where
//!   nothing needs locking.
//! - `lock_group!(n)`: a statement that serializes assignments to the
//!   group bound at `$n` until the transaction ends.
//! - `claim_prelude!()`: the statements a claim's transaction begins with;
//!   `plan_prelude!()`: those the dispatch's and the records' transactions
//!   begin with (empty: none).
//! - `leases_of_node!()`: the jobs whose leases a process (`$1`, its
//!   `node:incarnation`) releases at its start and end.
//! - `tenant_cap!()`: a tenant's `settings.limits.concurrency` read from
//!   its row aliased `tn`, as a whole number (`NULL`: no cap; a value
//!   that is no number, written by hand, is no cap either, so that it
//!   cannot stop every claim).
//! - `notify_work!()`: a statement telling other processes that jobs are
//!   ready (empty: nobody to tell).
//! - `step_change!()`: a step row's change of its run's context in the
//!   step rows' insert (`record/contexts.rs`): from the text array bound at
//!   `$3`, or from the row's batch JSON.
//!
//! Two queries differ as a whole, and each backend's is a file of its own
//! in `queries/`: `CLAIM_CANDIDATES` (`queries/claim.*.sql`), the claim's
//! fair selection of claimable jobs (read without locking them), and
//! `CLAIM_KEYS`, the claim's locks of the queue keys it takes (empty: the
//! backend needs none), and `CLAIM_TENANTS`, the locks of the capped
//! tenants whose leases a claim or a dispatch counts (likewise); and
//! `PENDING_EVENTS`
//! (`queries/pending_events.*.sql`), the dispatch's fair selection of
//! pending events; each file says what it binds.
//!
//! Besides these each backend has `list` (how a list is bound) and
//! `CHANGES_APART` (whether the step rows' changes of the context are bound
//! apart from the batch, for `step_change!`) and
//! `UPDATE_STAYING_RUNS_APART` (whether a run whose status and ticket stay
//! is updated by a statement that does not name them).

pub(crate) mod postgres {
    pub(crate) const CLAIM_CANDIDATES: &str = include_str!("queries/claim.postgres.sql");
    /// Of the queue keys bound at `$1` (`tenant:key`), those whose claim
    /// lock this transaction got: a try-lock each (class 9), so two claims
    /// never wait on each other, and one that misses a key leaves its job.
    pub(crate) const CLAIM_KEYS: &str = "SELECT k FROM unnest($1::text[]) AS k \
         WHERE pg_try_advisory_xact_lock(9, hashtext(k))";
    /// Of the tenants bound at `$1` (each with a concurrency cap), those
    /// whose cap lock this transaction got: a try-lock each (class 10), so
    /// a claim never waits for another, and one that misses a tenant takes
    /// none of its jobs. Held to the commit, the lock makes the count of a
    /// tenant's leases, a statement after it, see every lease committed by
    /// the claim or dispatch that held it before.
    pub(crate) const CLAIM_TENANTS: &str = "SELECT t FROM unnest($1::text[]) AS t \
         WHERE pg_try_advisory_xact_lock(10, hashtext(t))";
    pub(crate) const PENDING_EVENTS: &str = include_str!("queries/pending_events.postgres.sql");
    /// The runs listing's test that `body` contains `doc`
    /// (`RunFilter::body_contains`), its parameters from `$first` on, and
    /// the text each binds: one containment, which the GIN index answers.
    pub(crate) fn body_contains(doc: &serde_json::Value, first: usize) -> (String, Vec<String>) {
        (
            format!("AND body @> CAST(${first} AS JSONB)"),
            vec![doc.to_string()],
        )
    }

    macro_rules! db_now {
        () => {
            "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT"
        };
    }

    macro_rules! any_of {
        ($n:literal) => {
            concat!("= ANY($", $n, ")")
        };
    }

    macro_rules! text_bytes {
        ($column:literal) => {
            concat!("octet_length(CAST(", $column, " AS TEXT))")
        };
    }

    // The tenant filter of a statement that finds its rows by primary key:
    // an expression no index serves, so the planner never reads a tenant's
    // rows through a tenant-leading index (its statistics lag a table that
    // grew fast, and such a plan reads the tenant's whole backlog).
    macro_rules! unindexed_any_of {
        ($n:literal) => {
            concat!("|| '' = ANY($", $n, ")")
        };
    }

    macro_rules! unindexed {
        () => {
            "|| ''"
        };
    }

    // A record's updates name their rows' keys, for the same reason.
    macro_rules! seek_keys {
        ($table:ident, $n:literal) => {
            concat!("AND ", stringify!($table), ".id = ANY($", $n, ")")
        };
    }

    macro_rules! batch_rows {
        ($n:literal) => {
            concat!(
                "jsonb_array_elements($",
                $n,
                ") WITH ORDINALITY AS x(value, key)"
            )
        };
    }

    macro_rules! batch_keys {
        ($n:literal) => {
            batch_rows!($n)
        };
    }

    macro_rules! lock_rows {
        () => {
            "FOR UPDATE"
        };
    }

    macro_rules! lock_rows_of {
        ($($alias:ident),+) => {
            concat!("FOR UPDATE OF ", stringify!($($alias),+))
        };
    }

    macro_rules! lock_rows_skip_locked {
        () => {
            "FOR UPDATE SKIP LOCKED"
        };
        ($($alias:ident),+) => {
            concat!("FOR UPDATE OF ", stringify!($($alias),+), " SKIP LOCKED")
        };
    }

    // Signal keys' locks: transaction advisory locks of the two-key form
    // under a class of their own (8; groups use 7, claims' queue keys 9,
    // capped tenants' leases 10, and
    // the one-key locks of migrations are another key space), taken in the order of
    // their hashes. Two names that share a hash share a lock, which only
    // serializes them.
    macro_rules! lock_names {
        (1) => {
            "SELECT pg_advisory_xact_lock(8, h)
        FROM (SELECT DISTINCT hashtext(n) AS h FROM unnest($1::text[]) AS n ORDER BY h) locks"
        };
    }

    macro_rules! lock_group {
        (1) => {
            "SELECT pg_advisory_xact_lock(7, hashtext($1))"
        };
    }

    // The queue's transactions (claims, dispatches, record batches) find
    // their rows by key, or read each tenant's oldest rows through an index
    // in their order, a few at a time. Their tables grow from empty to tens
    // of thousands of rows between two runs of autovacuum's analyze, and
    // with the statistics of a near-empty table the planner reads a whole
    // table (a sequential scan, 60 ms at 50,000 inbox rows) or a tenant's
    // whole backlog (a bitmap scan and a sort) for a handful of rows. Both
    // are off in these transactions. Their statements are also planned once
    // per connection (a generic plan, kept until the tables' statistics
    // change): they run thousands of times a second with the same shape,
    // and with a plan made at every execution planning cost more than
    // running (the claim's candidates 290 µs to plan, 110 to run, in
    // `pg_stat_statements` under `steps-queued`). Claims are also serialized by a
    // transaction advisory lock per queue key (`CLAIM_KEYS`), never one
    // for all claims. A claim that waits on a row lock gives up after 5 s
    // and the pool tries again, and a stopped holder's idle transaction is
    // cut off by the server (`PgStore::connect_options`).
    macro_rules! claim_prelude {
        () => {
            "SET LOCAL lock_timeout = '5s';
        SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off;
        SET LOCAL plan_cache_mode = force_generic_plan"
        };
    }

    macro_rules! plan_prelude {
        () => {
            "SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off;
        SET LOCAL plan_cache_mode = force_generic_plan"
        };
    }

    macro_rules! leases_of_node {
        () => {
            "locked_by = $1"
        };
    }

    macro_rules! tenant_cap {
        () => {
            "CASE WHEN jsonb_typeof(tn.settings #> '{limits,concurrency}') = 'number'
             THEN LEAST(GREATEST((tn.settings #>> '{limits,concurrency}')::numeric, 0), 1000000)::BIGINT
             END"
        };
    }

    // A step row's change of its run's context, from the text array bound
    // at `$3` beside the batch (`CHANGES_APART`).
    macro_rules! step_change {
        () => {
            "CAST((CAST($3 AS TEXT[]))[x.key] AS JSON)"
        };
    }

    // The channel is `WORK_CHANNEL` in `postgres.rs`.
    macro_rules! notify_work {
        () => {
            "SELECT pg_notify('tok_work', '')"
        };
    }

    pub(crate) use {
        any_of, batch_keys, batch_rows, claim_prelude, db_now, leases_of_node, lock_group,
        lock_names, lock_rows, lock_rows_of, lock_rows_skip_locked, notify_work, plan_prelude,
        seek_keys, step_change, tenant_cap, text_bytes, unindexed, unindexed_any_of,
    };
}

pub(crate) mod sqlite {
    pub(crate) const CLAIM_CANDIDATES: &str = include_str!("queries/claim.sqlite.sql");
    /// The one writer serializes claims: no queue key needs a lock.
    pub(crate) const CLAIM_KEYS: &str = "";
    /// Nor does a tenant's count of leases.
    pub(crate) const CLAIM_TENANTS: &str = "";
    pub(crate) const PENDING_EVENTS: &str = include_str!("queries/pending_events.sqlite.sql");
    /// The runs listing's test that `body` contains `doc`, as PostgreSQL's
    /// `@>` means it for the documents `Condition::containment` makes
    /// (objects down to strings and booleans): a test of each leaf's type
    /// and value (SQLite has no containment, nor an index for one).
    pub(crate) fn body_contains(doc: &serde_json::Value, first: usize) -> (String, Vec<String>) {
        let mut leaves = Vec::new();
        leaves_of(doc, "$".to_owned(), &mut leaves);
        let mut sql = String::new();
        let mut binds = Vec::new();
        for (path, value) in leaves {
            let n = first + binds.len();
            match value {
                serde_json::Value::String(s) => {
                    sql.push_str(&format!(
                        "AND json_type(body, ${n}) = 'text' AND json_extract(body, ${n}) = ${} ",
                        n + 1
                    ));
                    binds.push(path);
                    binds.push(s.clone());
                }
                serde_json::Value::Bool(b) => {
                    sql.push_str(&format!("AND json_type(body, ${n}) = '{b}' "));
                    binds.push(path);
                }
                // Not made by `Condition::containment`: no run matches.
                _ => sql.push_str("AND 0 "),
            }
        }
        (sql, binds)
    }

    fn leaves_of<'a>(
        value: &'a serde_json::Value,
        path: String,
        out: &mut Vec<(String, &'a serde_json::Value)>,
    ) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    // `Condition::containment`'s keys hold no quote.
                    leaves_of(v, format!("{path}.\"{key}\""), out);
                }
            }
            leaf => out.push((path, leaf)),
        }
    }

    // SQLite's clock plus the offset `tok test` moves forward
    // (`SqliteStore::advance_clock`); zero on every other store. The
    // subquery is not correlated, so SQLite reads it once per statement.
    macro_rules! db_now {
        () => {
            "(CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) \
             + (SELECT offset_ms FROM clock_offset))"
        };
    }

    // SQLite has no arrays: a list is bound as a JSON array.
    macro_rules! any_of {
        ($n:literal) => {
            concat!("IN (SELECT value FROM json_each($", $n, "))")
        };
    }

    macro_rules! text_bytes {
        ($column:literal) => {
            concat!("length(CAST(", $column, " AS BLOB))")
        };
    }

    macro_rules! unindexed_any_of {
        ($n:literal) => {
            any_of!($n)
        };
    }

    macro_rules! unindexed {
        () => {
            ""
        };
    }

    // SQLite plans a record's updates from the batch's rows; a key list
    // would make it scan the batch once per row. (The key list stays bound.)
    macro_rules! seek_keys {
        ($table:ident, $n:literal) => {
            concat!("AND $", $n, " IS NOT NULL")
        };
    }

    // Each row is turned into SQLite's binary JSON (`jsonb`) once, in a
    // subquery that `OFFSET 0` keeps from being flattened into the
    // statement: read straight from `json_each`, a row is rendered as text
    // and parsed again for each field the statement reads, which made a
    // batch insert of step rows by name half again as slow as by position
    // (docs/performance.md, "Batched rows read by name").
    macro_rules! batch_rows {
        ($n:literal) => {
            concat!(
                "(SELECT key, jsonb(value) AS value FROM json_each($",
                $n,
                ") LIMIT -1 OFFSET 0) AS x"
            )
        };
    }

    // Keys read straight from `json_each`: behind the subquery of
    // `batch_rows!` the planner no longer sees `json_each`'s few rows, and
    // a fence joined to `jobs` and `runs` would read the runs of each
    // row's tenant before finding its job.
    macro_rules! batch_keys {
        ($n:literal) => {
            concat!("json_each($", $n, ") AS x")
        };
    }

    // The one writer serializes every write: there is nothing to lock, and
    // no lock to skip.
    macro_rules! lock_rows {
        () => {
            ""
        };
    }

    macro_rules! lock_rows_of {
        ($($alias:ident),+) => {
            ""
        };
    }

    macro_rules! lock_rows_skip_locked {
        () => {
            ""
        };
        ($($alias:ident),+) => {
            ""
        };
    }

    macro_rules! lock_names {
        (1) => {
            ""
        };
    }

    macro_rules! lock_group {
        (1) => {
            "SELECT $1"
        };
    }

    macro_rules! claim_prelude {
        () => {
            "SELECT 1"
        };
    }

    macro_rules! plan_prelude {
        () => {
            ""
        };
    }

    // One process serves the file (`tok serve` refuses to start on a file
    // another process serves): at its start, every lease is a dead
    // process's, and at its end every lease is its own (`$1` is bound, and
    // unused).
    macro_rules! leases_of_node {
        () => {
            "locked_by IS NOT NULL OR $1 IS NULL"
        };
    }

    macro_rules! notify_work {
        () => {
            ""
        };
    }

    // A step row's change of its run's context, in the row's batch JSON.
    macro_rules! step_change {
        () => {
            "NULLIF(x.value -> 'change', 'null')"
        };
    }

    macro_rules! tenant_cap {
        () => {
            "CASE WHEN json_type(tn.settings, '$.limits.concurrency') IN ('integer', 'real')
             THEN MIN(MAX(CAST(json_extract(tn.settings, '$.limits.concurrency') AS INTEGER), 0), 1000000)
             END"
        };
    }

    pub(crate) use {
        any_of, batch_keys, batch_rows, claim_prelude, db_now, leases_of_node, lock_group,
        lock_names, lock_rows, lock_rows_of, lock_rows_skip_locked, notify_work, plan_prelude,
        seek_keys, step_change, tenant_cap, text_bytes, unindexed, unindexed_any_of,
    };
}
