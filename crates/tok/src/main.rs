//! `tok`: load the configuration, start what the command asks for.

use clap::{Parser, Subcommand};
use tok::config::Config;
use tok_engine::Registry;

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
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn")),
        )
        .init();
    let cli = Cli::parse();
    let config = Config::from_env()?;
    match cli.command {
        Command::Serve => tok::serve(config, Registry::with_builtins()).await,
        Command::Migrate => {
            tok::open_store(&config).await?;
            println!("migrations applied");
            Ok(())
        }
    }
}
