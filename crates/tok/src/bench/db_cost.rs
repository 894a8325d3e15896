//! `db-cost` (PostgreSQL only): what one event and one step cost the
//! database, the inputs of the capacity model (`docs/capacity.md`,
//! `tok capacity`).
//!
//! Shapes, each on a fresh database and server: `ingest` (webhooks to a
//! source without automations: the inbox row, its key and the dispatch that
//! marks it), `steps-queued` (webhooks each starting a run of ten
//! `bench/noop` steps, each step its own record), scenario B's steps
//! (`steps-b`, `steps-b-peak`: outputs of 1-3 kB), and runs whose context
//! grows by 2 kB a step, of 10 steps (`steps-short`) and of 200
//! (`steps-long`): a step of the long run must cost what one of the short
//! run does. After a warm-up, over the measured load only, the bench reads:
//!
//! - **CPU** of the PostgreSQL processes of that database (its backends
//!   and autovacuum workers, by process title, sampled every 100 ms; the
//!   bench's own connection left out), and of all `postgres` processes
//!   (which includes other databases' work and the shared WAL writer and
//!   checkpointer), and of the tok server;
//! - **WAL**: with `pg_walinspect`, the records between the two
//!   `pg_current_wal_lsn()` readings that touch a block of this database,
//!   plus the commit records of their transactions (so other databases on
//!   the same server are not counted), their full-page images apart; and
//!   `pg_wal_lsn_diff` of the whole server for comparison. A temporary
//!   replication slot keeps the interval's WAL until it is read;
//! - **rows**: `pg_stat_user_tables`' `n_tup_ins`, `n_tup_upd`
//!   (`n_tup_hot_upd` of them in place) and `n_tup_del` deltas by table
//!   (partitions counted in their table), read after the server stopped, so
//!   every backend has flushed its counts; and `pg_stat_database`'s
//!   commits;
//! - **statements**: `pg_stat_statements`' calls in this database where the
//!   server preloads it, else the server's own count of what it ran
//!   (`TOK_COUNT_STATEMENTS`, [`crate::statements`]), which costs the
//!   server a little CPU of its own;
//! - **bytes kept**: after `VACUUM ANALYZE`, each table's
//!   `pg_total_relation_size` over its live rows.
//!
//! Divided by the events (and the steps) of the measured load, they go in
//! the JSON's `details`, which `tok capacity --costs` reads.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use sqlx::Row as _;

use super::api::{self, Api, Tenant};
use super::report::{Figure, Target};
use super::server::{ChildSpec, pg_connect};
use super::steps::{self, Kind, STEPS_PER_RUN};
use super::sys::{CpuMeter, DatabaseCpu};
use super::{BackendKind, Bench, Server};

const NAME: &str = "db-cost";

/// Longest wait for a load to be done.
const TIME_LIMIT: Duration = Duration::from_secs(900);

/// What the claim was when these figures were measured.
pub(crate) const CLAIM: &str = "claims share no lock: candidates read without locks, a try-lock \
     per queue key, and the take locks only the rows it leases (FOR UPDATE SKIP LOCKED)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Ingest,
    StepsQueued,
    /// Scenario B's steps: `bench/noop` steps whose outputs are 1 to 3 kB
    /// of JSON (2 kB on average), kept in the run's context and stored
    /// truncated in `run_steps`.
    StepsB,
    /// The same steps at scenario B's peak, 400 steps/s (40 webhooks/s,
    /// open loop): the cost per step where the node works, with the
    /// smaller batches of a lighter load.
    StepsBPeak,
    /// Runs of [`SHORT_RUN`] `bench/noop` steps in a `loop`, each answering
    /// 2 kB under a key of its own (the context grows by 2 kB a step):
    /// what a step of a short run costs, beside [`Shape::StepsLong`].
    StepsShort,
    /// The same runs with [`LONG_RUN`] steps: a step of a long run, whose
    /// context reaches 400 kB, must cost what a step of a short one does.
    StepsLong,
}

/// Steps of [`Shape::StepsShort`]'s and [`Shape::StepsLong`]'s runs, and
/// the bytes each answers.
pub(crate) const SHORT_RUN: usize = 10;
pub(crate) const LONG_RUN: usize = 200;
pub(crate) const RUN_OUTPUT_BYTES: u64 = 2_000;

/// Webhooks per second of [`Shape::StepsBPeak`].
pub(crate) const PEAK_EVENTS_PER_SEC: f64 = 40.0;

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Ingest => "ingest",
            Shape::StepsQueued => "steps-queued",
            Shape::StepsB => "steps-b",
            Shape::StepsBPeak => "steps-b-peak",
            Shape::StepsShort => "steps-short",
            Shape::StepsLong => "steps-long",
        }
    }

    /// The step rows one event's run writes (a `loop` step and its
    /// iterations' steps for the short and long runs).
    fn steps_per_event(self) -> usize {
        match self {
            Shape::Ingest => 0,
            Shape::StepsQueued | Shape::StepsB | Shape::StepsBPeak => STEPS_PER_RUN,
            Shape::StepsShort => SHORT_RUN + 1,
            Shape::StepsLong => LONG_RUN + 1,
        }
    }
}

/// Where the statements a step costs are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Statements {
    /// PostgreSQL's `pg_stat_statements` (preloaded by the server).
    PgStatStatements,
    /// The server's own count (`TOK_COUNT_STATEMENTS`, `/metrics`).
    Counted,
}

impl Statements {
    fn name(self) -> &'static str {
        match self {
            Statements::PgStatStatements => "pg_stat_statements",
            Statements::Counted => "counted by the server (TOK_COUNT_STATEMENTS)",
        }
    }

    /// `pg_stat_statements` where the server preloads it, else the server's count.
    async fn of(conn: &mut sqlx::PgConnection) -> Statements {
        let preloaded: Option<String> =
            sqlx::query_scalar("SELECT current_setting('shared_preload_libraries')")
                .fetch_one(&mut *conn)
                .await
                .ok();
        match preloaded.is_some_and(|p| p.contains("pg_stat_statements")) {
            true => Statements::PgStatStatements,
            false => Statements::Counted,
        }
    }
}

/// The statements run so far: of this database's, in `pg_stat_statements`
/// (the bench's own readings left out), or the server's count.
async fn statements_so_far(
    conn: &mut sqlx::PgConnection,
    api: &Api,
    source: Statements,
) -> anyhow::Result<i64> {
    match source {
        Statements::PgStatStatements => Ok(sqlx::query_scalar(
            "SELECT COALESCE(SUM(calls), 0)::BIGINT FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal_lsn%'
                AND query NOT LIKE 'SELECT (SELECT COUNT(*) FROM event_inbox)%'",
        )
        .fetch_one(conn)
        .await
        .context("reading pg_stat_statements")?),
        Statements::Counted => {
            let text = api
                .http
                .get(format!("{}/metrics", api.base))
                .bearer_auth(&api.admin_key)
                .send()
                .await?
                .error_for_status()?
                .text()
                .await?;
            Ok(text
                .lines()
                .find_map(|line| line.strip_prefix("tok_db_statements_total "))
                .and_then(|n| n.trim().parse::<f64>().ok())
                .unwrap_or(0.0) as i64)
        }
    }
}

pub(crate) async fn run(bench: &Bench) -> anyhow::Result<Vec<Figure>> {
    if bench.backend() != BackendKind::Postgres || bench.own_backend().is_none() {
        return Ok(vec![Figure::missing(
            NAME,
            "µs/step",
            "PostgreSQL only, on the bench's own server: run with --database-url postgres://…",
        )]);
    }
    let statements = {
        let url = bench.options().database_url.clone().unwrap_or_default();
        let mut conn = pg_connect(&url).await?;
        let source = Statements::of(&mut conn).await;
        let _ = sqlx::Connection::close(conn).await;
        source
    };
    let mut shapes = serde_json::Map::new();
    for shape in [
        Shape::Ingest,
        Shape::StepsQueued,
        Shape::StepsB,
        Shape::StepsBPeak,
        Shape::StepsShort,
        Shape::StepsLong,
    ] {
        let label = format!("{NAME} {}", shape.name());
        let spec = ChildSpec {
            count_statements: statements == Statements::Counted,
            ..ChildSpec::both()
        };
        let mut server = bench.server_of(&label, spec).await?;
        let measured = measure(bench, &mut server, shape, statements, &label).await;
        bench.release(&label, server).await;
        shapes.insert(shape.name().to_owned(), measured?);
    }
    let details = json!({
        "claim": CLAIM,
        "statements": statements.name(),
        "tok_version": env!("CARGO_PKG_VERSION"),
        "date": jiff::Timestamp::now().to_string(),
        "scale": bench.options().scale,
        "shapes": shapes,
    });
    Ok(figures(details))
}

/// The table's rows; the first carries every number in its details.
fn figures(details: Value) -> Vec<Figure> {
    let queued = &details["shapes"]["steps-queued"];
    let ingest = &details["shapes"]["ingest"];
    let step = |key: &str| queued["per_step"][key].as_f64();
    let event = |key: &str| ingest["per_event"][key].as_f64();
    let round = |v: f64| (v * 10.0).round() / 10.0;
    let wal_note = |shape: &Value| {
        format!(
            "WAL of this database (pg_walinspect; {} of the server's WAL in the interval); \
             full-page images {:.0} %",
            shape["wal"]["share_of_server"]
                .as_f64()
                .map(|s| format!("{:.0} %", s * 100.0))
                .unwrap_or_else(|| "?".into()),
            shape["wal"]["fpi_share"].as_f64().unwrap_or(0.0) * 100.0
        )
    };
    let mut out = Vec::new();
    let cpu = Figure::new(NAME, round(step("pg_cpu_us").unwrap_or(0.0)), "µs/step")
        .target(Target::AtMost(150.0))
        .notes(format!(
            "PostgreSQL CPU per steps-queued step, this database's processes ({} µs counting \
             every postgres process; tok server {} µs); {} steps, {} transactions/step; {}",
            step("pg_cpu_us_all").map(round).unwrap_or(0.0),
            step("server_cpu_us").map(round).unwrap_or(0.0),
            queued["steps"],
            step("commits").map(round).unwrap_or(0.0),
            CLAIM
        ))
        .details(details.clone());
    out.push(cpu);
    out.push(
        Figure::new(
            "db-cost-wal",
            step("wal_bytes").unwrap_or(0.0).round(),
            "B/step",
        )
        .notes(wal_note(queued)),
    );
    // The rows of a step of a run that goes on, apart from its run's own
    // (the event, its key, the run, its job): those a step adds to a run.
    let table = |name: &str, what: &str| {
        queued["tables"][name][what].as_f64().unwrap_or(0.0)
            / queued["steps"].as_f64().unwrap_or(1.0)
    };
    let chain =
        table("run_steps", "inserted") + table("runs", "updated") + table("jobs", "updated");
    out.push(
        Figure::new(
            "db-cost-rows",
            round(step("rows_written").unwrap_or(0.0)),
            "rows/step",
        )
        .notes(format!(
            "per steps-queued step: {} inserted, {} updated ({} in place), {} deleted; of them \
             {} step rows, {} runs and {} jobs updated ({} rows a step adds to its run: the \
             rest is each run's event, key, run and job, written once a run)",
            step("rows_inserted").map(round).unwrap_or(0.0),
            step("rows_updated").map(round).unwrap_or(0.0),
            step("rows_hot_updated").map(round).unwrap_or(0.0),
            step("rows_deleted").map(round).unwrap_or(0.0),
            round(table("run_steps", "inserted")),
            round(table("runs", "updated")),
            round(table("jobs", "updated")),
            round(chain),
        )),
    );
    out.push(
        Figure::new(
            "db-cost-statements",
            (step("statements").unwrap_or(0.0) * 100.0).round() / 100.0,
            "statements/step",
        )
        .notes(format!(
            "per steps-queued step, {}; {} commits/step",
            details["statements"].as_str().unwrap_or("?"),
            step("commits")
                .map(|c| (c * 1000.0).round() / 1000.0)
                .unwrap_or(0.0),
        )),
    );
    out.push(
        Figure::new(
            "db-cost-ingest",
            round(event("pg_cpu_us").unwrap_or(0.0)),
            "µs/event",
        )
        .notes(format!(
            "PostgreSQL CPU per webhook without automations; {} B of WAL, {} rows written, \
                 {} transactions per event; {}",
            event("wal_bytes").unwrap_or(0.0).round(),
            event("rows_written").map(round).unwrap_or(0.0),
            event("commits").map(round).unwrap_or(0.0),
            wal_note(ingest)
        )),
    );
    for name in ["steps-b", "steps-b-peak"] {
        let shape = &details["shapes"][name];
        let per = |key: &str| shape["per_step"][key].as_f64().unwrap_or(0.0);
        let kept = |table: &str| shape["kept"][table]["kept_bytes_per_row"].as_f64();
        out.push(
            Figure::new(&format!("db-cost-{name}"), round(per("pg_cpu_us")), "µs/step")
                .notes(format!(
                    "scenario B's steps (outputs of 1-3 kB){}: {:.0} steps/s; WAL {:.0} B/step; {} rows written/step; kept (live row + indexes): run_steps {} B/row, runs {} B/row (its context included); {}",
                    if name == "steps-b-peak" { " at 400 steps/s offered" } else { ", as fast as they go" },
                    shape["steps_per_sec"].as_f64().unwrap_or(0.0),
                    per("wal_bytes"),
                    round(per("rows_written")),
                    kept("run_steps").map(|b| format!("{b:.0}")).unwrap_or_else(|| "?".into()),
                    kept("runs").map(|b| format!("{b:.0}")).unwrap_or_else(|| "?".into()),
                    wal_note(shape),
                )),
        );
    }
    let (short, long) = (
        &details["shapes"]["steps-short"],
        &details["shapes"]["steps-long"],
    );
    let of = |shape: &Value, key: &str| shape["per_step"][key].as_f64().unwrap_or(0.0);
    let ratio = |key: &str| match of(short, key) {
        0.0 => 0.0,
        base => (of(long, key) / base * 100.0).round() / 100.0,
    };
    out.push(
        Figure::new("db-cost-long-runs", ratio("wal_bytes"), "× WAL/step")
            .target(Target::AtMost(1.3))
            .notes(format!(
                "a step of a {LONG_RUN}-step run against one of a {SHORT_RUN}-step run, each \
                 answering {RUN_OUTPUT_BYTES} B kept in the context: WAL {:.0} against {:.0} \
                 B/step, PostgreSQL CPU {:.0} against {:.0} µs/step ({}×), {:.1} against {:.1} \
                 rows/step",
                of(long, "wal_bytes"),
                of(short, "wal_bytes"),
                of(long, "pg_cpu_us"),
                of(short, "pg_cpu_us"),
                ratio("pg_cpu_us"),
                of(long, "rows_written"),
                of(short, "rows_written"),
            )),
    );
    out
}

/// A `loop` of `steps` `bench/noop` steps, each answering
/// [`RUN_OUTPUT_BYTES`] under a key of its own.
fn growing_run(steps: usize) -> Vec<Value> {
    vec![json!({
        "id": "each", "type": "loop",
        "config": { "items": (0..steps).collect::<Vec<_>>() },
        "do": [{
            "id": "s", "type": super::NOOP_STEP,
            "config": { "outputBytes": RUN_OUTPUT_BYTES, "outputKey": "k{{index}}" }
        }]
    })]
}

/// Output sizes of scenario B's ten steps: 1 to 3 kB, 2 kB on average.
pub(crate) const SCENARIO_B_OUTPUT_BYTES: [u64; STEPS_PER_RUN] =
    [1000, 1222, 1444, 1667, 1889, 2111, 2333, 2556, 2778, 3000];

/// Ten `bench/noop` steps answering [`SCENARIO_B_OUTPUT_BYTES`].
fn scenario_b_steps() -> Vec<Value> {
    SCENARIO_B_OUTPUT_BYTES
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            json!({
                "id": format!("s{}", i + 1), "type": super::NOOP_STEP,
                "config": { "outputBytes": bytes }
            })
        })
        .collect()
}

/// The database part of a PostgreSQL URL.
fn database_name(url: &str) -> Option<&str> {
    let path = url.split('?').next()?;
    let after_scheme = path.split_once("://").map_or(path, |(_, rest)| rest);
    let (_, name) = after_scheme.split_once('/')?;
    (!name.is_empty()).then_some(name)
}

/// Counters read at one moment.
#[derive(Debug, Default, Clone)]
struct Counters {
    /// By table (a partitioned table's partitions summed): inserted,
    /// updated, updated in place (HOT), deleted.
    tables: BTreeMap<String, [i64; 4]>,
    commits: i64,
    rollbacks: i64,
    /// Commits of every other database of the server: work that is in the
    /// server-wide figures but not this database's.
    other_commits: i64,
}

async fn counters(conn: &mut sqlx::PgConnection) -> anyhow::Result<Counters> {
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await?;
    let mut out = Counters::default();
    let rows = sqlx::query(
        "SELECT COALESCE(pg_partition_root(relid), relid)::regclass::text AS name,
                SUM(n_tup_ins)::BIGINT, SUM(n_tup_upd)::BIGINT,
                SUM(n_tup_hot_upd)::BIGINT, SUM(n_tup_del)::BIGINT
           FROM pg_stat_user_tables GROUP BY 1",
    )
    .fetch_all(&mut *conn)
    .await?;
    for row in rows {
        out.tables.insert(
            row.try_get(0)?,
            [
                row.try_get(1)?,
                row.try_get(2)?,
                row.try_get(3)?,
                row.try_get(4)?,
            ],
        );
    }
    let row = sqlx::query(
        "SELECT SUM(xact_commit) FILTER (WHERE datname = current_database())::BIGINT,
                SUM(xact_rollback) FILTER (WHERE datname = current_database())::BIGINT,
                SUM(xact_commit) FILTER (WHERE datname <> current_database())::BIGINT
           FROM pg_stat_database WHERE datname IS NOT NULL",
    )
    .fetch_one(&mut *conn)
    .await?;
    out.commits = row.try_get::<Option<i64>, _>(0)?.unwrap_or(0);
    out.rollbacks = row.try_get::<Option<i64>, _>(1)?.unwrap_or(0);
    out.other_commits = row.try_get::<Option<i64>, _>(2)?.unwrap_or(0);
    Ok(out)
}

async fn current_lsn(conn: &mut sqlx::PgConnection) -> anyhow::Result<String> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(conn)
        .await?)
}

/// This database's WAL between two positions: (records, bytes, of which
/// full-page images, commit records, the server's bytes in all).
async fn database_wal(
    conn: &mut sqlx::PgConnection,
    from: &str,
    to: &str,
) -> anyhow::Result<[i64; 5]> {
    let row = sqlx::query(
        "WITH r AS (
             SELECT xid, resource_manager, record_length, fpi_length, block_ref
               FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)),
         ours AS (
             SELECT * FROM r WHERE block_ref LIKE '%/' ||
                 (SELECT oid FROM pg_database WHERE datname = current_database()) || '/%'),
         tx AS (SELECT DISTINCT xid FROM ours WHERE xid <> '0'::xid),
         commits AS (
             SELECT * FROM r WHERE resource_manager = 'Transaction'
                AND COALESCE(block_ref, '') = '' AND xid IN (SELECT xid FROM tx))
         SELECT (SELECT COUNT(*) FROM ours) + (SELECT COUNT(*) FROM commits),
                (SELECT COALESCE(SUM(record_length), 0)::BIGINT FROM ours)
                    + (SELECT COALESCE(SUM(record_length), 0)::BIGINT FROM commits),
                (SELECT COALESCE(SUM(fpi_length), 0)::BIGINT FROM ours),
                (SELECT COUNT(*) FROM commits),
                pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::BIGINT",
    )
    .bind(from)
    .bind(to)
    .fetch_one(conn)
    .await
    .context("reading the WAL with pg_walinspect")?;
    Ok([
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
        row.try_get(4)?,
    ])
}

/// What each table keeps, after `VACUUM ANALYZE`: bytes on disk (heap,
/// TOAST, indexes, and the free space updates left), of them the indexes,
/// live rows, and the mean size of a live row as stored (compressed values
/// included, `pg_column_size`).
#[derive(Debug, Clone, Copy)]
struct Kept {
    bytes: i64,
    index_bytes: i64,
    rows: i64,
    row_bytes: f64,
}

/// The tables whose rows the capacity model keeps.
const KEPT_TABLES: [&str; 5] = ["runs", "run_steps", "event_inbox", "event_keys", "jobs"];

async fn table_sizes(conn: &mut sqlx::PgConnection) -> anyhow::Result<BTreeMap<String, Kept>> {
    sqlx::raw_sql("VACUUM ANALYZE").execute(&mut *conn).await?;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await?;
    let rows = sqlx::query(
        "SELECT COALESCE(pg_partition_root(s.relid), s.relid)::regclass::text,
                SUM(pg_total_relation_size(s.relid))::BIGINT,
                SUM(pg_indexes_size(s.relid))::BIGINT, SUM(s.n_live_tup)::BIGINT
           FROM pg_stat_user_tables s GROUP BY 1",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut out = BTreeMap::new();
    for row in rows {
        let name: String = row.try_get(0)?;
        let row_bytes = if KEPT_TABLES.contains(&name.as_str()) {
            sqlx::query_scalar::<_, Option<f64>>(&format!(
                "SELECT AVG(pg_column_size(t.*))::FLOAT8 FROM {name} t"
            ))
            .fetch_one(&mut *conn)
            .await?
            .unwrap_or(0.0)
        } else {
            0.0
        };
        out.insert(
            name,
            Kept {
                bytes: row.try_get(1)?,
                index_bytes: row.try_get(2)?,
                rows: row.try_get(3)?,
                row_bytes,
            },
        );
    }
    Ok(out)
}

/// Waits until the shape's work is done: every accepted event dispatched,
/// and for `steps-queued` every run finished. Polls the database directly
/// (not the API, whose listings would cost the database too).
async fn wait_done(
    bench: &Bench,
    conn: &mut sqlx::PgConnection,
    shape: Shape,
    events: i64,
    label: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let (received, pending, finished): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM event_inbox),
                    (SELECT COUNT(*) FROM event_inbox WHERE status = 'pending'),
                    (SELECT COUNT(*) FROM runs WHERE status IN ('completed', 'failed', 'cancelled'))",
        )
        .fetch_one(&mut *conn)
        .await?;
        let done =
            received >= events && pending == 0 && (shape == Shape::Ingest || finished >= events);
        if done {
            return Ok(());
        }
        if started.elapsed() > TIME_LIMIT {
            bail!(
                "not done after {} s: {received} events received, {pending} pending, {finished} runs finished",
                TIME_LIMIT.as_secs()
            );
        }
        bench.progress.update(
            label,
            &format!("{received} events in, {pending} pending, {finished} runs finished"),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends as fast as the senders go, or at `rate` webhooks/s (open loop).
async fn send(
    bench: &Bench,
    url: &str,
    nonce: &str,
    count: usize,
    rate: Option<f64>,
    label: &str,
) -> anyhow::Result<usize> {
    let progress = (&bench.progress, label);
    let sent = match rate {
        None => {
            api::send_closed_loop(
                &bench.http,
                url,
                nonce,
                count,
                bench.options().senders,
                false,
                progress,
            )
            .await
        }
        Some(rate) => {
            api::send_open_loop(&bench.http, url, nonce, count, rate, false, progress).await
        }
    };
    if sent.accepted != count {
        bail!(
            "{} of {count} webhooks accepted: {}",
            sent.accepted,
            sent.error_text()
        );
    }
    Ok(sent.accepted)
}

async fn measure(
    bench: &Bench,
    server: &mut Server,
    shape: Shape,
    statements: Statements,
    label: &str,
) -> anyhow::Result<Value> {
    let url = server
        .postgres_url()
        .context("db-cost needs the bench's own PostgreSQL database")?
        .to_owned();
    let database = database_name(&url)
        .context("no database name in the URL")?
        .to_owned();
    let api: Api = server.api.clone();
    let mut conn = pg_connect(&url).await?;
    let own_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await?;
    let walinspect = sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .execute(&mut conn)
        .await
        .map(|_| ())
        .map_err(|e| format!("{e}"));
    if statements == Statements::PgStatStatements {
        sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut conn)
            .await
            .context("pg_stat_statements is preloaded, but its extension cannot be created")?;
    }
    if let Err(e) = &walinspect {
        bench.progress.line(
            label,
            &format!("no pg_walinspect ({e}): the WAL figure is the whole server's"),
        );
    }
    // Keeps the interval's WAL until it is read; dropped with the session.
    let slot: String = format!("tok_bench_{}", bench.nonce)
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let _ = sqlx::query("SELECT pg_create_physical_replication_slot($1, true, true)")
        .bind(&slot)
        .execute(&mut conn)
        .await;

    let tenant: Tenant = api
        .tenant(&format!("bench {label} {}", bench.nonce))
        .await?;
    let source = api.source(&tenant, shape.name()).await?;
    match shape {
        Shape::Ingest => {}
        Shape::StepsQueued => {
            steps::automation(&api, &tenant, &source, Kind::Queued).await?;
        }
        Shape::StepsB | Shape::StepsBPeak => {
            api.automation(&tenant, shape.name(), &source, scenario_b_steps())
                .await
                .with_context(super::noop::not_registered)?;
        }
        Shape::StepsShort | Shape::StepsLong => {
            let steps = shape.steps_per_event() - 1;
            api.automation(&tenant, shape.name(), &source, growing_run(steps))
                .await
                .with_context(super::noop::not_registered)?;
        }
    }
    let (warm, count) = match shape {
        Shape::Ingest => (500, bench.scaled(20_000, 500)),
        Shape::StepsQueued => (100, bench.scaled(2_000, 50)),
        Shape::StepsB => (50, bench.scaled(1_000, 30)),
        // The same steps in all, in runs of 10 and of 200.
        Shape::StepsShort => (50, bench.scaled(1_000, 40)),
        Shape::StepsLong => (3, bench.scaled(50, 2)),
        // 30 s at scale 1, never under 10 s.
        Shape::StepsBPeak => (
            50,
            bench.scaled(
                30 * PEAK_EVENTS_PER_SEC as usize,
                10 * PEAK_EVENTS_PER_SEC as usize,
            ),
        ),
    };
    bench.progress.line(
        label,
        &format!("warm-up of {warm} webhooks, then {count} measured"),
    );
    send(
        bench,
        &source.url,
        &format!("{}-warm", bench.nonce),
        warm,
        None,
        label,
    )
    .await?;
    wait_done(bench, &mut conn, shape, warm as i64, label).await?;
    // Backends flush their row counts at most once a second.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let before = counters(&mut conn).await?;
    let statements_before = statements_so_far(&mut conn, &api, statements).await?;
    let from = current_lsn(&mut conn).await?;
    let db_cpu = DatabaseCpu::start(&database, u32::try_from(own_pid).ok());
    let all_cpu = CpuMeter::start(&server.pids());
    let started = Instant::now();
    let rate = (shape == Shape::StepsBPeak).then_some(PEAK_EVENTS_PER_SEC);
    send(
        bench,
        &source.url,
        &format!("{}-load", bench.nonce),
        count,
        rate,
        label,
    )
    .await?;
    wait_done(bench, &mut conn, shape, (warm + count) as i64, label).await?;
    let seconds = started.elapsed().as_secs_f64();
    let to = current_lsn(&mut conn).await?;
    let statements_run = statements_so_far(&mut conn, &api, statements).await? - statements_before;
    let all = all_cpu.finish();
    let (db_cpu_seconds, db_seconds, processes) = db_cpu.finish();
    server.check_alive()?;
    // Stopped, its backends exit and flush what they counted.
    server.stop_child(bench, label);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = counters(&mut conn).await?;
    let wal = match &walinspect {
        Ok(()) => Some(database_wal(&mut conn, &from, &to).await?),
        Err(_) => None,
    };
    let server_wal: i64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::BIGINT")
            .bind(&from)
            .bind(&to)
            .fetch_one(&mut conn)
            .await?;
    let sizes = table_sizes(&mut conn).await?;
    let _ = sqlx::Connection::close(conn).await;

    let events = count as f64;
    let steps = (count * shape.steps_per_event()) as f64;
    let mut tables = serde_json::Map::new();
    let mut totals = [0i64; 4];
    for (name, now) in &after.tables {
        let then = before.tables.get(name).copied().unwrap_or_default();
        let delta: Vec<i64> = now.iter().zip(then).map(|(a, b)| a - b).collect();
        if delta.iter().all(|d| *d == 0) {
            continue;
        }
        for (t, d) in totals.iter_mut().zip(&delta) {
            *t += d;
        }
        tables.insert(
            name.clone(),
            json!({ "inserted": delta[0], "updated": delta[1], "hot_updated": delta[2], "deleted": delta[3] }),
        );
    }
    let kept: serde_json::Map<String, Value> = sizes
        .iter()
        .filter(|(_, k)| k.bytes > 0 && k.rows > 0)
        .map(|(name, k)| {
            let rows = k.rows as f64;
            (
                name.clone(),
                json!({
                    "bytes": k.bytes,
                    "index_bytes": k.index_bytes,
                    "live_rows": k.rows,
                    "bytes_per_row": k.bytes as f64 / rows,
                    "row_bytes": k.row_bytes,
                    // What a row holds once the free space that updates
                    // leave is used again: the row as stored and its
                    // index entries.
                    "kept_bytes_per_row": k.row_bytes + k.index_bytes as f64 / rows,
                }),
            )
        })
        .collect();
    let pg_cpu_all = all.as_ref().map(|c| c.postgres * seconds);
    let server_cpu = all.as_ref().and_then(|c| c.server).map(|c| c * seconds);
    let (wal_bytes, wal_fpi, wal_records, wal_commits) = match wal {
        Some([records, bytes, fpi, commits, _]) => (bytes as f64, fpi as f64, records, commits),
        None => (server_wal as f64, 0.0, 0, 0),
    };
    let commits = (after.commits - before.commits) as f64;
    let per = |n: f64| {
        json!({
            "pg_cpu_us": db_cpu_seconds * 1e6 / n,
            "pg_cpu_us_all": pg_cpu_all.map(|s| s * 1e6 / n),
            "server_cpu_us": server_cpu.map(|s| s * 1e6 / n),
            "wal_bytes": wal_bytes / n,
            "wal_fpi_bytes": wal_fpi / n,
            "wal_records": wal_records as f64 / n,
            "rows_inserted": totals[0] as f64 / n,
            "rows_updated": totals[1] as f64 / n,
            "rows_hot_updated": totals[2] as f64 / n,
            "rows_deleted": totals[3] as f64 / n,
            "rows_written": (totals[0] + totals[1] + totals[3]) as f64 / n,
            "commits": commits / n,
            "statements": statements_run as f64 / n,
        })
    };
    let mut out = json!({
        "events": count,
        "steps": steps as u64,
        "steps_per_event": shape.steps_per_event(),
        "seconds": seconds,
        "events_per_sec": events / seconds,
        "steps_per_sec": steps / seconds,
        "offered_events_per_sec": rate,
        "output_bytes": match shape {
            Shape::StepsB | Shape::StepsBPeak => json!(SCENARIO_B_OUTPUT_BYTES),
            Shape::StepsShort | Shape::StepsLong => json!(RUN_OUTPUT_BYTES),
            Shape::Ingest | Shape::StepsQueued => Value::Null,
        },
        "per_event": per(events),
        "cpu": {
            "database_processes_seconds": db_cpu_seconds,
            "database_processes_seen": processes,
            "database_interval_seconds": db_seconds,
            "machine": all,
        },
        "wal": {
            "database_bytes": wal_bytes,
            "fpi_bytes": wal_fpi,
            "fpi_share": if wal_bytes > 0.0 { wal_fpi / wal_bytes } else { 0.0 },
            "records": wal_records,
            "commit_records": wal_commits,
            "server_bytes": server_wal,
            "share_of_server": (server_wal > 0 && walinspect.is_ok()).then(|| wal_bytes / server_wal as f64),
            "walinspect": walinspect.err(),
        },
        "commits": commits,
        "rollbacks": after.rollbacks - before.rollbacks,
        "other_databases_commits": after.other_commits - before.other_commits,
        "tables": tables,
        "kept": kept,
    });
    if steps > 0.0 {
        out["per_step"] = per(steps);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::database_name;

    #[test]
    fn the_database_of_a_url() {
        assert_eq!(
            database_name("postgres://u@h:5432/tok_bench_ab?sslmode=disable"),
            Some("tok_bench_ab")
        );
        assert_eq!(database_name("postgres://u@h:5432"), None);
    }
}
