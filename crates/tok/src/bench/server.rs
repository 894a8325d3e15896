//! The servers a bench drives: fresh databases (a SQLite file in a temp dir,
//! or a new `tok_bench_<random>` database on a PostgreSQL server, dropped
//! afterwards) and `tok bench-serve` children (`tok serve` with the bench's
//! step types registered) started from this very binary, with
//! the admin key, role, node id and concurrency each figure asks for. Each
//! child's resident memory is sampled while it runs.

use std::collections::VecDeque;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sqlx::{ConnectOptions as _, Connection as _};

use super::{noop, sys};

/// Where the bench keeps its databases.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// A new SQLite file under this directory per figure.
    Sqlite { dir: PathBuf },
    /// A new database per figure on the server of this URL (its database
    /// part is only where the bench connects to create the others).
    Postgres { admin_url: String },
}

impl Backend {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite { .. } => "sqlite",
            Backend::Postgres { .. } => "postgres",
        }
    }
}

/// A database made for one figure; [`Database::remove`] deletes it.
pub(crate) struct Database {
    pub(crate) url: String,
    sqlite_dir: Option<PathBuf>,
    postgres: Option<(String, String)>,
}

/// A PostgreSQL connection of the bench's own, which does not log its slow
/// statements (a `DROP DATABASE` may take a second; that is no news).
pub(crate) async fn pg_connect(url: &str) -> Result<sqlx::PgConnection, sqlx::Error> {
    url.parse::<sqlx::postgres::PgConnectOptions>()?
        .disable_statement_logging()
        .connect()
        .await
}

/// `postgres://u@h:5432/db?x=y` → (`postgres://u@h:5432`, `?x=y`).
fn split_database(url: &str) -> (&str, &str) {
    let (without_query, query) = match url.find('?') {
        Some(q) => url.split_at(q),
        None => (url, ""),
    };
    let authority_start = without_query.find("://").map_or(0, |i| i + 3);
    match without_query[authority_start..].find('/') {
        Some(slash) => (&without_query[..authority_start + slash], query),
        None => (without_query, query),
    }
}

impl Database {
    pub(crate) async fn create(backend: &Backend) -> anyhow::Result<Database> {
        let unique = tok_store::random_token();
        match backend {
            Backend::Sqlite { dir } => {
                let dir = dir.join(format!("db-{}", &unique[..12]));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("could not create {}", dir.display()))?;
                Ok(Database {
                    url: format!("sqlite://{}", dir.join("tok.db").display()),
                    sqlite_dir: Some(dir),
                    postgres: None,
                })
            }
            Backend::Postgres { admin_url } => {
                let name = format!("tok_bench_{}", &unique[..16]);
                let mut conn = pg_connect(admin_url)
                    .await
                    .context("could not connect to the PostgreSQL server of --database-url")?;
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .with_context(|| {
                        format!("could not create database {name}; may this user CREATE DATABASE?")
                    })?;
                let _ = conn.close().await;
                let (base, query) = split_database(admin_url);
                Ok(Database {
                    url: format!("{base}/{name}{query}"),
                    sqlite_dir: None,
                    postgres: Some((admin_url.clone(), name)),
                })
            }
        }
    }

    pub(crate) fn is_postgres(&self) -> bool {
        self.postgres.is_some()
    }

    /// Deletes the database; complains on stderr rather than failing the
    /// figures that were measured on it.
    pub(crate) async fn remove(self) {
        if let Some(dir) = &self.sqlite_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some((admin_url, name)) = &self.postgres {
            let dropped = async {
                let mut conn = pg_connect(admin_url).await?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await?;
                conn.close().await
            }
            .await;
            if let Err(e) = dropped {
                eprintln!("could not drop the bench database {name}: {e}; drop it by hand");
            }
        }
    }
}

/// How a child is started.
#[derive(Debug, Clone)]
pub(crate) struct ChildSpec {
    /// `TOK_ROLE`: `both`, `api` or `worker`.
    pub(crate) role: &'static str,
    pub(crate) node_id: String,
    /// `TOK_CONCURRENCY`; `None` keeps the bench's own environment (or
    /// tok's default).
    pub(crate) concurrency: Option<usize>,
    /// `TOK_COUNT_STATEMENTS=1`: the server counts the statements it runs
    /// (`tok_db_statements_total`, `db-cost` without `pg_stat_statements`).
    pub(crate) count_statements: bool,
}

impl ChildSpec {
    pub(crate) fn both() -> Self {
        Self {
            role: "both",
            node_id: "bench".into(),
            concurrency: None,
            count_statements: false,
        }
    }
}

/// What a child's output said: the last lines, for an error message, and
/// how many were warnings or errors.
#[derive(Default)]
struct Log {
    tail: Mutex<VecDeque<String>>,
    problems: AtomicUsize,
    first_problem: Mutex<Option<String>>,
    started: AtomicBool,
}

impl Log {
    /// Reads a child's output until it closes.
    fn read(&self, output: impl std::io::Read) {
        for line in std::io::BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if line.contains("tok started") {
                self.started.store(true, Ordering::SeqCst);
            }
            if line.contains("WARN") || line.contains("ERROR") || line.contains("panicked") {
                self.problems.fetch_add(1, Ordering::SeqCst);
                let mut first = self.first_problem.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(|| line.clone());
            }
            let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
            if tail.len() == 20 {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    }
}

/// A running `tok serve` child. Dropping it kills it.
pub(crate) struct Child {
    pub(crate) spec: ChildSpec,
    pub(crate) pid: u32,
    /// `http://127.0.0.1:<port>` for the roles that serve HTTP.
    pub(crate) base: Option<String>,
    process: std::process::Child,
    log: Arc<Log>,
    peak_rss_kb: Arc<AtomicU64>,
    sampler: tokio::task::JoinHandle<()>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Child {
    /// Starts `tok bench-serve` on `database_url` and returns once it answers
    /// `/readyz` (HTTP roles) or has logged its start (workers).
    pub(crate) async fn start(
        exe: &Path,
        database_url: &str,
        admin_key: &str,
        spec: ChildSpec,
        http: &reqwest::Client,
    ) -> anyhow::Result<Child> {
        let port = free_port()?;
        let mut command = Command::new(exe);
        command
            .arg(noop::SERVE_SUBCOMMAND)
            .env("TOK_DATABASE_URL", database_url)
            .env("TOK_LISTEN", format!("127.0.0.1:{port}"))
            .env_remove("TOK_PUBLIC_URL")
            .env("TOK_ADMIN_KEY", admin_key)
            .env("TOK_ROLE", spec.role)
            .env_remove("APP_ROLE")
            .env("TOK_NODE_ID", &spec.node_id)
            .env("RUST_LOG", "warn,tok=info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Without a figure's own setting the bench's environment passes on,
        // so `TOK_CONCURRENCY=16 tok bench` measures that setting.
        if let Some(n) = spec.concurrency {
            command.env("TOK_CONCURRENCY", n.to_string());
        }
        if spec.count_statements {
            command.env("TOK_COUNT_STATEMENTS", "1");
        }
        // The `io` figure's stub listens on loopback, which the outbound
        // guard refuses unless told otherwise (docs/security.md, "Calls tok
        // makes for a tenant").
        if std::env::var_os("TOK_OUTBOUND_ALLOW").is_none() {
            command.env("TOK_OUTBOUND_ALLOW", "127.0.0.1/32");
        }
        let mut process = command
            .spawn()
            .with_context(|| format!("could not start {} serve", exe.display()))?;
        let pid = process.id();
        let log = Arc::new(Log::default());
        // The logger writes to stdout; panics and early errors to stderr.
        if let Some(stdout) = process.stdout.take() {
            let log = log.clone();
            std::thread::spawn(move || log.read(stdout));
        }
        if let Some(stderr) = process.stderr.take() {
            let log = log.clone();
            std::thread::spawn(move || log.read(stderr));
        }
        let peak_rss_kb = Arc::new(AtomicU64::new(0));
        let sampler = {
            let peak = peak_rss_kb.clone();
            tokio::spawn(async move {
                while let Some(kb) = sys::rss_kb(pid) {
                    peak.fetch_max(kb, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let serves_http = spec.role != "worker";
        let mut child = Child {
            spec,
            pid,
            base: serves_http.then(|| format!("http://127.0.0.1:{port}")),
            process,
            log,
            peak_rss_kb,
            sampler,
        };
        child.wait_started(http).await?;
        Ok(child)
    }

    async fn wait_started(&mut self, http: &reqwest::Client) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.process.try_wait()? {
                bail!(
                    "tok serve ({}) exited with {status} at start:\n{}",
                    self.spec.role,
                    self.tail()
                );
            }
            let ready = match &self.base {
                Some(base) => http
                    .get(format!("{base}/readyz"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success()),
                None => self.log.started.load(Ordering::SeqCst),
            };
            if ready {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "tok serve ({}) was not ready within 60 s:\n{}",
            self.spec.role,
            self.tail()
        )
    }

    fn tail(&self) -> String {
        let tail = self.log.tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Fails when the child died under load (with what it last logged).
    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.process.try_wait()? {
            bail!(
                "tok serve ({}) died with {status}:\n{}",
                self.spec.role,
                self.tail()
            );
        }
        Ok(())
    }

    /// Stops the child and says what it used.
    pub(crate) fn stop(mut self) -> ChildReport {
        let _ = self.process.kill();
        let _ = self.process.wait();
        self.report()
    }

    /// Stops the child as a process manager does, with SIGTERM, and waits
    /// up to `limit` for it to exit (then kills it): its exit status (`None`:
    /// killed) and what it used.
    pub(crate) fn terminate(
        mut self,
        limit: Duration,
    ) -> (Option<std::process::ExitStatus>, ChildReport) {
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        let deadline = Instant::now() + limit;
        let mut exit = None;
        while sent && Instant::now() < deadline {
            if let Ok(Some(status)) = self.process.try_wait() {
                exit = Some(status);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if exit.is_none() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
        (exit, self.report())
    }

    fn report(&mut self) -> ChildReport {
        let sampled = self.peak_rss_kb.load(Ordering::Relaxed);
        let peak_kb = sys::peak_rss_kb(self.pid).unwrap_or(0).max(sampled);
        self.sampler.abort();
        ChildReport {
            role: self.spec.role,
            node_id: self.spec.node_id.clone(),
            peak_rss_mb: (peak_kb > 0).then(|| peak_kb as f64 / 1024.0),
            problems: self.log.problems.load(Ordering::SeqCst),
            first_problem: self
                .log
                .first_problem
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// What a stopped child used and logged.
#[derive(Debug, Clone)]
pub(crate) struct ChildReport {
    pub(crate) role: &'static str,
    pub(crate) node_id: String,
    pub(crate) peak_rss_mb: Option<f64>,
    /// Lines logged at WARN or ERROR.
    pub(crate) problems: usize,
    pub(crate) first_problem: Option<String>,
}

/// The commit settings a figure was measured with.
pub(crate) async fn commit_settings(database_url: &str) -> String {
    if database_url.starts_with("postgres") {
        let shown = async {
            let mut conn = pg_connect(database_url).await?;
            let row: (String,) = sqlx::query_as("SHOW synchronous_commit")
                .fetch_one(&mut conn)
                .await?;
            let _ = conn.close().await;
            Ok::<_, sqlx::Error>(row.0)
        }
        .await;
        match shown {
            Ok(v) => format!("synchronous_commit={v}"),
            Err(e) => format!("synchronous_commit unknown ({e})"),
        }
    } else {
        let journal = async {
            let mut conn = sqlx::SqliteConnection::connect(database_url).await?;
            let row: (String,) = sqlx::query_as("PRAGMA journal_mode")
                .fetch_one(&mut conn)
                .await?;
            let _ = conn.close().await;
            Ok::<_, sqlx::Error>(row.0)
        }
        .await;
        let journal = journal.unwrap_or_else(|e| format!("unknown ({e})"));
        format!("journal_mode={journal}, synchronous=FULL (set by tok-store on every connection)")
    }
}

/// Polls how many connections the server holds on its PostgreSQL database
/// (this poller's own excluded), every 50 ms, keeping the peaks.
pub(crate) struct ConnectionPoller {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<(i64, i64)>>,
}

impl ConnectionPoller {
    pub(crate) async fn start(database_url: &str) -> anyhow::Result<Self> {
        let mut conn = pg_connect(database_url).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            let (mut open, mut busy) = (0i64, 0i64);
            while !stopping.load(Ordering::SeqCst) {
                let row: (i64, i64) = sqlx::query_as(
                    "SELECT count(*), count(*) FILTER (WHERE state <> 'idle')
                       FROM pg_stat_activity
                      WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .fetch_one(&mut conn)
                .await?;
                open = open.max(row.0);
                busy = busy.max(row.1);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = conn.close().await;
            Ok((open, busy))
        });
        Ok(Self { stop, task })
    }

    /// The peaks: (connections open, connections not idle).
    pub(crate) async fn finish(self) -> anyhow::Result<(i64, i64)> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}

#[cfg(test)]
mod tests {
    use super::split_database;

    #[test]
    fn database_part_of_a_url_is_split_off() {
        assert_eq!(
            split_database("postgres://u:p@h:5432/test?sslmode=disable"),
            ("postgres://u:p@h:5432", "?sslmode=disable")
        );
        assert_eq!(
            split_database("postgres://postgres@127.0.0.1"),
            ("postgres://postgres@127.0.0.1", "")
        );
    }
}
