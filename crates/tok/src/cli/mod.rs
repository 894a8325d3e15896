//! The command-line client: `tok apply`, `tok runs` and `tok signal` talk
//! to a running server over its REST API, as any client does, with the
//! address in `TOK_URL` and the key in `TOK_API_KEY`. Each command prints
//! what a person wants to read; the server's own errors are shown with
//! their code and message.

mod apply;
mod client;
mod runs;
mod signal;

use clap::{Args, Subcommand};

pub use apply::ApplyOptions;
pub(crate) use apply::apply;
pub use client::Client;

/// Where the server is and who is asking.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// The server's address.
    #[arg(long, env = "TOK_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// A tenant's API key, or the platform admin key with `--tenant`.
    #[arg(long, env = "TOK_API_KEY", hide_env_values = true)]
    pub api_key: String,
    /// With the admin key: the tenant to act for (`X-Tok-Tenant`).
    #[arg(long, env = "TOK_TENANT")]
    pub tenant: Option<String>,
}

/// The client's commands, flattened into `tok`'s own.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply a file or a directory of sources, connections, groups, ticket
    /// types, widgets and automations: each is created, changed or left
    /// alone by its name; prints what changed.
    Apply {
        #[command(flatten)]
        options: apply::ApplyOptions,
        #[command(flatten)]
        target: Target,
    },
    /// The runs, newest first, as a table; `--follow` prints each change as
    /// it happens.
    Runs(runs::RunsOptions),
    /// Send a signal: resumes the runs waiting for KEY (`wait_for_event`).
    Signal {
        /// The key the waits wait for.
        key: String,
        /// The signal's payload, a JSON object.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// The ticket the signal is about (its id): it resumes only the
        /// waits about that ticket.
        #[arg(long)]
        subject: Option<String>,
        #[command(flatten)]
        target: Target,
    },
}

/// Runs one client command; what it prints goes to stdout, an error to the
/// caller (the binary prints it and exits non-zero).
pub async fn run(command: Command) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    match command {
        Command::Apply { options, target } => {
            apply::apply(&Client::new(&target)?, &options, &mut out).await
        }
        Command::Runs(options) => {
            runs::runs(&Client::new(&options.target)?, &options, &mut out).await
        }
        Command::Signal {
            key,
            payload,
            subject,
            target,
        } => {
            let client = Client::new(&target)?;
            signal::signal(&client, &key, subject.as_deref(), &payload, &mut out).await
        }
    }
}
