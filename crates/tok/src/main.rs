//! `tok`: load the configuration, start what the command asks for.

use clap::{Parser, Subcommand};
use tok::ServeOptions;
use tok::config::{Config, LogFormat};
use tok_engine::{Registry, ScriptStep};
use tok_script::{PoolConfig, ScriptPool};

#[derive(Parser)]
#[command(
    name = "tok",
    version,
    about = "A durable, multi-tenant automation runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API and the workers (by TOK_ROLE); SQLite at ./tok-data/tok.db by default.
    Serve {
        /// Seed a demo tenant with a service desk (groups, ticket types,
        /// two webhook sources, three automations) unless a tenant named
        /// "Demo" exists; print its API key and webhook URLs.
        #[arg(long)]
        demo: bool,
    },
    /// Apply pending database migrations and exit.
    Migrate,
    /// Measure ingest, steps, io, fairness, memory, workers, db-cost and wal on a server
    /// of its own (or `--url`); prints a table and writes a JSON file.
    Bench(tok::bench::BenchOptions),
    /// The capacity model (docs/capacity.md): scenario B on one PostgreSQL
    /// node and a multiple of it on a fleet, from the measured costs.
    Capacity(tok::capacity::CapacityOptions),
    /// `serve` with the bench's step types registered too: the server `tok
    /// bench` starts, or one for `tok bench --url` (docs/performance.md).
    #[command(name = tok::bench::SERVE_SUBCOMMAND, hide = true)]
    BenchServe,
    /// Move a tenant between PostgreSQL databases (docs/operations.md,
    /// "Moving a tenant to its own database").
    Tenant {
        #[command(subcommand)]
        action: TenantAction,
    },
    /// Connection credentials at rest (docs/security.md, "Credentials at rest").
    Secrets {
        #[command(subcommand)]
        action: SecretsAction,
    },
    /// The platform admin key (docs/security.md, "The admin key").
    AdminKey {
        #[command(subcommand)]
        action: AdminKeyAction,
    },
    /// Run an automation once on the real engine with a virtual clock (a
    /// `wait` of days passes at once) and connector calls answered from a
    /// recording; prints each step; exits 0 when the run completed, 1
    /// otherwise (docs/workflows.md, "Testing an automation").
    Test(tok::test_run::TestOptions),
    #[command(flatten)]
    Client(tok::cli::Command),
    /// A worker's script sandbox: runs the JavaScript requests it reads on
    /// stdin. Started by the worker's script pool, not by hand.
    #[command(name = tok_script::SANDBOX_SUBCOMMAND, hide = true)]
    ScriptSandbox,
}

#[derive(Subcommand)]
enum TenantAction {
    /// Copy every row of TENANT from --from to --to (both migrated first),
    /// in one transaction on --to; --from keeps its rows. Refused while a
    /// step of the tenant is in flight or when --to holds rows of it.
    Move {
        /// The tenant's id.
        tenant: String,
        /// The database the tenant lives on now.
        #[arg(long)]
        from: String,
        /// The database it moves to.
        #[arg(long)]
        to: String,
    },
    /// Delete every row of TENANT from --database, but its registry row and
    /// API keys: what a move left behind, once the configuration routes the
    /// tenant elsewhere.
    Forget {
        tenant: String,
        #[arg(long)]
        database: String,
    },
}

#[derive(Subcommand)]
enum SecretsAction {
    /// Seal every credential not under the newest key of TOK_SECRET_KEY
    /// (its first) under it, in every database; prints how many per
    /// database. Then the older keys can be dropped. Idempotent.
    Rotate,
}

#[derive(Subcommand)]
enum AdminKeyAction {
    /// Make a new key the platform's only admin key, revoking the one
    /// before on every process at once; prints the new key once. A start
    /// of `tok serve` never rotates the admin key.
    Rotate {
        /// Make TOK_ADMIN_KEY (as this command sees it) the admin key
        /// instead of generating one.
        #[arg(long)]
        from_env: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::ScriptSandbox = cli.command {
        // Before any runtime, logger or configuration: a sandbox needs none,
        // and its stdout belongs to the pool.
        tok_script::sandbox_main();
    }
    run(cli)
}

/// The step types a server runs: the built-ins and scripts.
fn registry() -> anyhow::Result<Registry> {
    let mut registry = Registry::with_builtins();
    // Children start on the first script, so an API-only node has none.
    let scripts = ScriptPool::new(PoolConfig::current_exe()?)?;
    registry.register("script", ScriptStep::new(scripts));
    Ok(registry)
}

/// Structured logs (`RUST_LOG` filters, `info` by default): plain text with
/// colours only when stdout is a terminal, or one JSON object per line with
/// `TOK_LOG_FORMAT=json`. Each line carries the spans it was logged in (the
/// run and the step). With `OTEL_EXPORTER_OTLP_ENDPOINT`, tok's spans are
/// also exported ([`tok::traces`]).
fn init_logs(format: LogFormat, default: &str) -> anyhow::Result<tok::traces::Traces> {
    use std::io::IsTerminal as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let logs = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
        // Every field escaped: no tenant's string forges a line or steers
        // a terminal (`tok::logs`).
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .fmt_fields(tok::logs::EscapedFields)
            .with_ansi(std::io::stdout().is_terminal())
            .boxed(),
    };
    // The exporter's blocking HTTP client is built off the runtime's threads.
    let (traces, provider) = std::thread::scope(|scope| {
        scope
            .spawn(tok::traces::from_env::<tracing_subscriber::Registry>)
            .join()
            .map_err(|_| anyhow::anyhow!("the OTLP exporter's setup panicked"))
    })??;
    tracing_subscriber::registry()
        .with(traces)
        .with(tok::statements::layer())
        .with(logs.with_filter(filter))
        .init();
    Ok(provider)
}

#[tokio::main]
async fn run(cli: Cli) -> anyhow::Result<()> {
    // A test prints its run; the engine's own lines would drown it.
    let default_logs = match cli.command {
        Command::Test(_) => "warn,sqlx=warn",
        _ => "info,sqlx=warn",
    };
    let traces = init_logs(LogFormat::from_env()?, default_logs)?;
    if let Command::Test(options) = &cli.command {
        // A store and a server of its own: no configuration.
        let completed = tok::test_run::run(options, registry()?, &mut std::io::stdout()).await?;
        if !completed {
            std::process::exit(1);
        }
        return Ok(());
    }
    if let Command::Client(command) = cli.command {
        // A client needs only TOK_URL and TOK_API_KEY, not the server's configuration.
        return tok::cli::run(command).await;
    }
    if let Command::Capacity(options) = cli.command {
        // Arithmetic: no configuration, no database.
        return tok::capacity::run(options);
    }
    if let Command::Tenant { action } = cli.command {
        // Names its databases itself: no server configuration needed but
        // the shared database, where its audit row goes, if it is given.
        let shared = std::env::var("TOK_DATABASE_URL")
            .ok()
            .filter(|url| url.starts_with("postgres"));
        let report = match action {
            TenantAction::Move { tenant, from, to } => {
                tok::move_tenant(&tenant, &from, &to, shared.as_deref()).await?
            }
            TenantAction::Forget { tenant, database } => {
                tok::forget_tenant(&tenant, &database, shared.as_deref()).await?
            }
        };
        print!("{report}");
        return Ok(());
    }
    let config = Config::from_env()?;
    match cli.command {
        Command::Serve { demo } => {
            let served = tok::serve(config, registry()?, ServeOptions { demo }).await;
            // What is still batched goes out before the process ends.
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
            served
        }
        Command::BenchServe => {
            let mut registry = registry()?;
            tok::bench::register(&mut registry);
            tok::serve(config, registry, ServeOptions::default()).await
        }
        Command::Migrate => {
            let store = tok::open_store(&config).await?;
            let unreachable = store.unreachable_databases();
            if !unreachable.is_empty() {
                anyhow::bail!(
                    "migrations applied, but not to the tenant database(s) of {} (they do not \
                     answer; see the warnings above): run tok migrate again once they do",
                    unreachable.join("; ")
                );
            }
            println!("migrations applied");
            Ok(())
        }
        Command::Secrets {
            action: SecretsAction::Rotate,
        } => {
            print!("{}", tok::secrets::rotate(&config).await?);
            Ok(())
        }
        Command::AdminKey {
            action: AdminKeyAction::Rotate { from_env },
        } => {
            print!("{}", tok::admin_key::rotate(&config, from_env).await?);
            Ok(())
        }
        Command::Bench(options) => tok::bench::run(options).await,
        Command::ScriptSandbox => unreachable!("the sandbox starts before the runtime"),
        Command::Client(_) => unreachable!("client commands return above"),
        Command::Capacity(_) => unreachable!("capacity returns above"),
        Command::Test(_) => unreachable!("test returns above"),
        Command::Tenant { .. } => unreachable!("tenant commands return above"),
    }
}
