//! `tok bench`: the benchmark harness of docs/performance.md.
//!
//! For each figure the bench starts its own server child from this binary
//! (`tok bench-serve`: `tok serve` with the bench's step types registered)
//! on a fresh database (a SQLite file in a temp dir, or a new
//! PostgreSQL database with `--database-url`), sets up tenants, sources and
//! automations through the HTTP API with the admin key, drives the server
//! over real HTTP and waits for the runs through the API. With `--url` it
//! drives a running server instead, which must be a `tok bench-serve` for
//! the figures with `bench/noop` steps. CPU and memory of the children are read
//! from `/proc` while the loads run. At the end it prints one table, a row
//! per figure with its target, and writes the same figures and the run's
//! configuration to a JSON file.
//!
//! A benchmark, never a test: CI machines are noisy, and nothing here
//! asserts on speed.

mod api;
mod bulk;
mod db_cost;
mod fairness;
mod ingest;
mod io;
mod noop;
mod report;
mod server;
mod steps;
mod sys;
mod wal;
mod workers;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

pub use noop::{NOOP_STEP, Noop, SERVE_SUBCOMMAND, register};

use api::Api;
use report::{Figure, Progress, Target};
use server::{Backend, Child, ChildReport, ChildSpec, Database};

/// `tok bench`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOptions {
    /// Figures to measure, comma-separated (default: all). `memory` is the
    /// peak RSS across the loads that run; alone, it runs them all.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub only: Vec<FigureKind>,
    /// Multiplies every load's size: 1 is the full benchmark (several
    /// minutes), 0.05 a quick look (under a minute).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Where to write the figures and the configuration as JSON.
    #[arg(long, default_value = "tok-bench.json")]
    pub out: PathBuf,
    /// A PostgreSQL server (`postgres://user@host:5432/postgres`): the bench
    /// creates a fresh `tok_bench_<random>` database on it per figure and
    /// drops it afterwards. Without it: SQLite in a temp dir. With `--url`:
    /// the external server's own database, read only for its commit
    /// settings and connection counts.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Drive a running tok server at this address instead of starting one
    /// (`memory` and `workers` need the bench's own processes).
    #[arg(long, requires = "admin_key")]
    pub url: Option<String>,
    /// The platform admin key of the `--url` server.
    #[arg(long)]
    pub admin_key: Option<String>,
    /// Offered rate of the ingest latency load, requests/s (open loop).
    #[arg(long, default_value_t = 2000)]
    pub rate: u32,
    /// Concurrent senders of the loads that send as fast as they can.
    #[arg(long, default_value_t = 64)]
    pub senders: usize,
    /// The `tok` binary whose `bench-serve` the bench starts (default: this
    /// one): another build of tok, to measure it against this one.
    #[arg(long, conflicts_with = "url")]
    pub server_exe: Option<PathBuf>,
}

/// The figures, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FigureKind {
    Ingest,
    Steps,
    StepsQueued,
    Io,
    Fairness,
    Memory,
    Workers,
    /// PostgreSQL only: CPU, WAL and rows per event and per step, the
    /// inputs of `tok capacity`.
    DbCost,
    /// SQLite only: the write-ahead log's peak and idle size under
    /// sustained ingest and steps, and what a clean shutdown leaves.
    Wal,
    /// A tenant's live run latency during a bulk retry of its failed runs
    /// ÷ without one.
    Bulk,
}

impl FigureKind {
    const LOADS: [FigureKind; 9] = [
        FigureKind::Ingest,
        FigureKind::Steps,
        FigureKind::StepsQueued,
        FigureKind::Io,
        FigureKind::Fairness,
        FigureKind::Workers,
        FigureKind::DbCost,
        FigureKind::Wal,
        FigureKind::Bulk,
    ];

    fn name(self) -> &'static str {
        match self {
            FigureKind::Ingest => "ingest",
            FigureKind::Steps => "steps",
            FigureKind::StepsQueued => "steps-queued",
            FigureKind::Io => "io",
            FigureKind::Fairness => "fairness",
            FigureKind::Memory => "memory",
            FigureKind::Workers => "workers",
            FigureKind::DbCost => "db-cost",
            FigureKind::Wal => "wal",
            FigureKind::Bulk => "bulk",
        }
    }
}

/// Where the figures run.
enum Mode {
    /// Children of this process, on fresh databases.
    Own {
        backend: Backend,
        exe: PathBuf,
        /// The bench's temp dir (SQLite files), removed at the end.
        tmp: PathBuf,
    },
    /// A server someone else started.
    External { base: String },
}

/// One bench run: options, the HTTP client and what the children reported.
pub(crate) struct Bench {
    options: BenchOptions,
    mode: Mode,
    pub(crate) http: reqwest::Client,
    pub(crate) progress: Progress,
    /// Makes every webhook body of this run unique (the server de-duplicates
    /// identical bodies for 24 hours).
    pub(crate) nonce: String,
    admin_key: String,
    /// Children that ran, by figure, for the memory figure.
    children: Mutex<Vec<(String, ChildReport)>>,
    /// The commit settings, read from the first database.
    commit: Mutex<Option<String>>,
}

/// The server one figure runs against.
pub(crate) struct Server {
    pub(crate) api: Api,
    child: Option<Child>,
    database: Option<Database>,
    /// A PostgreSQL database the bench may read (connection counts).
    postgres_url: Option<String>,
}

impl Server {
    /// The server process ids, for CPU accounting (none when external).
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.child.iter().map(|c| c.pid).collect()
    }

    /// Fails when the server died under load.
    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        match &mut self.child {
            Some(child) => child.check_alive(),
            None => Ok(()),
        }
    }

    pub(crate) fn postgres_url(&self) -> Option<&str> {
        self.postgres_url.as_deref()
    }

    /// Stops the server process and keeps its database, to read what it
    /// wrote once every backend has flushed its counts.
    pub(crate) fn stop_child(&mut self, bench: &Bench, figure: &str) {
        if let Some(child) = self.child.take() {
            bench.keep_report(figure, child.stop());
        }
    }

    pub(crate) fn is_external(&self) -> bool {
        self.child.is_none()
    }
}

/// Which backend the figures measure, for targets that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendKind {
    Sqlite,
    Postgres,
    Unknown,
}

impl Bench {
    /// A load's size: `full` at scale 1, never under `least`.
    pub(crate) fn scaled(&self, full: usize, least: usize) -> usize {
        ((full as f64 * self.options.scale).round() as usize).max(least)
    }

    pub(crate) fn options(&self) -> &BenchOptions {
        &self.options
    }

    pub(crate) fn backend(&self) -> BackendKind {
        let postgres_url = match &self.mode {
            Mode::Own {
                backend: Backend::Sqlite { .. },
                ..
            } => return BackendKind::Sqlite,
            Mode::Own {
                backend: Backend::Postgres { .. },
                ..
            } => return BackendKind::Postgres,
            Mode::External { .. } => self.options.database_url.as_deref(),
        };
        match postgres_url {
            Some(url) if url.starts_with("postgres") => BackendKind::Postgres,
            Some(_) => BackendKind::Sqlite,
            None => BackendKind::Unknown,
        }
    }

    /// A fresh server for a figure (own mode), or the external one.
    pub(crate) async fn server(
        &self,
        figure: &str,
        concurrency: Option<usize>,
    ) -> anyhow::Result<Server> {
        let spec = ChildSpec {
            concurrency,
            ..ChildSpec::both()
        };
        self.server_of(figure, spec).await
    }

    /// [`Bench::server`] of a `both` child as `spec` says.
    pub(crate) async fn server_of(&self, figure: &str, spec: ChildSpec) -> anyhow::Result<Server> {
        match &self.mode {
            Mode::External { base } => {
                if let Some(url) = &self.options.database_url {
                    self.note_commit_settings(url).await;
                }
                Ok(Server {
                    api: self.api(base),
                    child: None,
                    database: None,
                    postgres_url: self
                        .options
                        .database_url
                        .clone()
                        .filter(|u| u.starts_with("postgres")),
                })
            }
            Mode::Own { backend, exe, .. } => {
                let database = Database::create(backend).await?;
                self.progress.update(figure, "starting tok serve");
                let child =
                    match Child::start(exe, &database.url, &self.admin_key, spec, &self.http).await
                    {
                        Ok(child) => child,
                        Err(e) => {
                            database.remove().await;
                            return Err(e);
                        }
                    };
                // After the start: the server creates and migrates the database.
                self.note_commit_settings(&database.url).await;
                let base = child.base.clone().context("a `both` child serves HTTP")?;
                // The pid lets a profiler attach (`perf record -g -p <pid>`).
                self.progress
                    .line(figure, &format!("tok serve pid {} at {base}", child.pid));
                Ok(Server {
                    api: self.api(&base),
                    postgres_url: database.is_postgres().then(|| database.url.clone()),
                    child: Some(child),
                    database: Some(database),
                })
            }
        }
    }

    /// Stops the figure's server, keeps what it used, drops its database.
    pub(crate) async fn release(&self, figure: &str, server: Server) {
        if let Some(child) = server.child {
            self.keep_report(figure, child.stop());
        }
        if let Some(database) = server.database {
            database.remove().await;
        }
    }

    pub(crate) fn keep_report(&self, figure: &str, report: ChildReport) {
        if report.problems > 0 {
            self.progress.line(
                figure,
                &format!(
                    "the server ({}) logged {} warnings or errors, the first: {}",
                    report.role,
                    report.problems,
                    report.first_problem.as_deref().unwrap_or("")
                ),
            );
        }
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((figure.to_owned(), report));
    }

    /// The API of a server at `base`, as the platform admin.
    pub(crate) fn api(&self, base: &str) -> Api {
        Api {
            http: self.http.clone(),
            base: base.trim_end_matches('/').to_owned(),
            admin_key: self.admin_key.clone(),
        }
    }

    async fn note_commit_settings(&self, database_url: &str) {
        if self
            .commit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return;
        }
        let settings = server::commit_settings(database_url).await;
        *self.commit.lock().unwrap_or_else(|e| e.into_inner()) = Some(settings);
    }

    /// Where the bench makes its databases; `None` with `--url`.
    pub(crate) fn own_backend(&self) -> Option<&Backend> {
        match &self.mode {
            Mode::Own { backend, .. } => Some(backend),
            Mode::External { .. } => None,
        }
    }

    /// Starts a child of the given role on `database`, for the figures that
    /// need several processes (`workers`).
    pub(crate) async fn start_child(
        &self,
        database: &Database,
        spec: ChildSpec,
    ) -> anyhow::Result<Child> {
        let Mode::Own { exe, .. } = &self.mode else {
            bail!("only the bench's own servers can be started");
        };
        let child = Child::start(exe, &database.url, &self.admin_key, spec, &self.http).await?;
        self.note_commit_settings(&database.url).await;
        Ok(child)
    }
}

/// Runs `tok bench`: the selected figures, the table on stdout, the JSON
/// file. Fails (after printing what it has) when a figure could not run.
pub async fn run(options: BenchOptions) -> anyhow::Result<()> {
    // reqwest is built with rustls and no default crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !(options.scale > 0.0 && options.scale.is_finite()) {
        bail!("--scale must be a positive number, like 1 or 0.05");
    }
    if options.rate == 0 || options.senders == 0 {
        bail!("--rate and --senders must be at least 1");
    }
    let http = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .context("could not build the HTTP client")?;
    let (mode, admin_key) = match &options.url {
        Some(url) => (
            Mode::External {
                base: url.trim_end_matches('/').to_owned(),
            },
            options.admin_key.clone().unwrap_or_default(),
        ),
        None => {
            let tmp = std::env::temp_dir().join(format!("tok-bench-{}", std::process::id()));
            std::fs::create_dir_all(&tmp)
                .with_context(|| format!("could not create {}", tmp.display()))?;
            let backend = match &options.database_url {
                Some(url) if url.starts_with("postgres") => Backend::Postgres {
                    admin_url: url.clone(),
                },
                Some(url) => bail!(
                    "--database-url must be postgres://… (got {}); without it the bench uses SQLite",
                    url.split("://").next().unwrap_or("")
                ),
                None => Backend::Sqlite { dir: tmp.clone() },
            };
            let exe = match &options.server_exe {
                Some(exe) => exe.clone(),
                None => std::env::current_exe().context("where is this tok binary?")?,
            };
            let key = format!("tok_bench_admin_{}", tok_store::random_token());
            (Mode::Own { backend, exe, tmp }, key)
        }
    };
    let bench = Bench {
        options,
        mode,
        http,
        progress: Progress::new(),
        nonce: tok_store::random_token()[..12].to_owned(),
        admin_key,
        children: Mutex::default(),
        commit: Mutex::default(),
    };
    let result = run_figures(&bench).await;
    if let Mode::Own { tmp, .. } = &bench.mode {
        let _ = std::fs::remove_dir_all(tmp);
    }
    result
}

async fn run_figures(bench: &Bench) -> anyhow::Result<()> {
    let only = &bench.options.only;
    let selected: Vec<FigureKind> = if only.is_empty() || only == &[FigureKind::Memory] {
        FigureKind::LOADS
            .into_iter()
            .chain([FigureKind::Memory])
            .collect()
    } else {
        only.clone()
    };
    let configuration = configuration(bench);
    bench.progress.line(
        "bench",
        &format!(
            "scale {}, backend {}, {} cores, build {}",
            bench.options.scale,
            configuration["backend"].as_str().unwrap_or("?"),
            configuration["cores"],
            configuration["build"].as_str().unwrap_or("?"),
        ),
    );
    let mut figures = Vec::new();
    let mut failed = Vec::new();
    for kind in FigureKind::LOADS {
        if !selected.contains(&kind) {
            continue;
        }
        let name = kind.name();
        bench.progress.line(name, "starting");
        if let Some(busy) = sys::background_load(Duration::from_millis(500)).await
            && busy > 0.25
        {
            bench.progress.line(
                name,
                &format!(
                    "warning: the machine is busy before the load ({busy:.2} cores): \
                     figures will be lower than on a quiet machine (see `other` in the notes)"
                ),
            );
        }
        let started = std::time::Instant::now();
        let measured = match kind {
            FigureKind::Ingest => ingest::run(bench).await,
            FigureKind::Steps => steps::run(bench, steps::Kind::Internal).await,
            FigureKind::StepsQueued => steps::run(bench, steps::Kind::Queued).await,
            FigureKind::Io => io::run(bench).await,
            FigureKind::Fairness => fairness::run(bench).await,
            FigureKind::Workers => workers::run(bench).await,
            FigureKind::DbCost => db_cost::run(bench).await,
            FigureKind::Wal => wal::run(bench).await,
            FigureKind::Bulk => bulk::run(bench).await,
            FigureKind::Memory => unreachable!("memory is not a load"),
        };
        match measured {
            Ok(done) => {
                for figure in &done {
                    bench.progress.line(
                        name,
                        &format!(
                            "{} = {} {} ({:.0} s)",
                            figure.name,
                            figure
                                .value
                                .map(report::number)
                                .or(figure.shown.clone())
                                .unwrap_or_else(|| "n/a".into()),
                            figure.unit,
                            started.elapsed().as_secs_f64()
                        ),
                    );
                }
                figures.extend(done);
            }
            Err(e) => {
                bench.progress.line(name, &format!("failed: {e:#}"));
                failed.push(name);
                figures.push(Figure::missing(name, "", format!("failed: {e:#}")));
            }
        }
    }
    if selected.contains(&FigureKind::Memory) {
        figures.push(memory(bench));
    }
    let mut configuration = configuration;
    configuration["commit"] = json!(
        bench
            .commit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "unknown (external server; pass --database-url to read it)".into())
    );
    println!("{}", report::table(&figures));
    let document = json!({
        "configuration": configuration,
        "figures": figures.iter().map(Figure::to_json).collect::<Vec<_>>(),
    });
    let out = &bench.options.out;
    std::fs::write(out, serde_json::to_string_pretty(&document)? + "\n")
        .with_context(|| format!("could not write {}", out.display()))?;
    eprintln!("figures written to {}", out.display());
    if !failed.is_empty() {
        bail!("these figures could not be measured: {}", failed.join(", "));
    }
    Ok(())
}

/// What the figures were measured with.
fn configuration(bench: &Bench) -> Value {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let concurrency = std::env::var("TOK_CONCURRENCY")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (backend, server, data_dir) = match &bench.mode {
        Mode::Own { backend, tmp, .. } => {
            let data_dir = match backend {
                Backend::Sqlite { dir } => Some(dir.clone()),
                Backend::Postgres { .. } => None,
            };
            (
                backend.name().to_owned(),
                "started by the bench: one `tok serve` per figure on a fresh database".to_owned(),
                data_dir.or_else(|| Some(tmp.clone())),
            )
        }
        Mode::External { base } => (
            match bench.backend() {
                BackendKind::Postgres => "postgres (external)",
                BackendKind::Sqlite => "sqlite (external)",
                BackendKind::Unknown => "unknown (external)",
            }
            .to_owned(),
            format!("external: {base}"),
            None,
        ),
    };
    let disk = data_dir.as_deref().map(|dir| {
        json!({
            "file_system": sys::file_system(dir),
            "fsync_median_ms": sys::fsync_median(dir).map(report::ms),
        })
    });
    json!({
        "tok_version": env!("CARGO_PKG_VERSION"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "date": jiff::Timestamp::now().to_string(),
        "backend": backend,
        "server": server,
        "cores": cores,
        "TOK_CONCURRENCY": match &concurrency {
            Some(v) => json!(v),
            None => json!(format!(
                "{} (default)",
                crate::config::DEFAULT_CONCURRENCY
            )),
        },
        "TOK_CONCURRENCY_io": io::CONCURRENCY,
        "TOK_DB_MAX_CONNECTIONS": std::env::var("TOK_DB_MAX_CONNECTIONS").unwrap_or_else(|_| "10 (default)".into()),
        "disk": disk,
        "scale": bench.options.scale,
        "senders": bench.options.senders,
        "ingest_offered_rate": bench.options.rate,
    })
}

/// Peak RSS of the server children across the loads that ran.
fn memory(bench: &Bench) -> Figure {
    let children = bench.children.lock().unwrap_or_else(|e| e.into_inner());
    let peaks: Vec<(String, f64)> = children
        .iter()
        .filter_map(|(figure, child)| {
            let label = if child.role == "both" {
                figure.clone()
            } else {
                format!("{figure} {}", child.node_id)
            };
            Some((label, child.peak_rss_mb?))
        })
        .collect();
    let Some(peak) = peaks.iter().map(|(_, mb)| *mb).reduce(f64::max) else {
        return Figure::missing(
            "memory",
            "MB",
            "not measured: needs the bench's own server on Linux (not --url)",
        );
    };
    let by_figure: Vec<String> = peaks
        .iter()
        .map(|(label, mb)| format!("{label} {mb:.0}"))
        .collect();
    Figure::new("memory", (peak * 10.0).round() / 10.0, "MB")
        .target(Target::AtMost(150.0))
        .notes(format!(
            "peak RSS (VmHWM) of the server, one process per load: {}",
            by_figure.join(", ")
        ))
        .details(json!(
            peaks
                .iter()
                .map(|(l, mb)| json!({ "load": l, "peak_rss_mb": mb }))
                .collect::<Vec<_>>()
        ))
}
