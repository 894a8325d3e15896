//! tok's configuration: defaults, then `TOK_*` environment variables, then
//! `validate()`. Each option says what it does and why its default is what
//! it is.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};

// The engine's settings default to the engine's own defaults, written
// once in tok-engine (its `EngineConfig::default()` takes them from there).
pub use tok_engine::{
    DEFAULT_CONCURRENCY, DEFAULT_LEASE, DEFAULT_NODE_ID, DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_SIGNAL_LOOKBACK, DEFAULT_STEP_SAMPLE, HEARTBEATS_PER_LEASE,
};

/// Which parts of tok this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// HTTP only: webhooks and the API. Events wait in the inbox for a worker.
    Api,
    /// Dispatcher and worker pool, no HTTP.
    Worker,
    /// Everything in one process: the default, and what a laptop wants.
    Both,
}

impl Role {
    pub fn serves_http(self) -> bool {
        self != Role::Worker
    }

    pub fn runs_engine(self) -> bool {
        self != Role::Api
    }
}

/// A secret that never prints.
#[derive(Clone)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// `TOK_DATABASE_URL`: `sqlite://tok-data/tok.db` by default, so a first
    /// run needs nothing installed; `postgres://…` for production.
    pub database_url: String,
    /// `TOK_TENANT_DATABASES` (`tenant=postgres://…;other=postgres://…`)
    /// and/or the file `TOK_TENANT_DATABASES_FILE` (a JSON object of tenant
    /// to URL, or one `tenant=url` a line): named tenants (by id or name;
    /// `*` for every other) on PostgreSQL databases of their own beside
    /// `TOK_DATABASE_URL`, which then must be PostgreSQL too. Empty by
    /// default: every tenant in the one database (see `tok_store::routed`).
    /// With `TOK_TENANT_DATABASE_TIMEOUT` (a duration, 3 s by default):
    /// how long a call to a tenant database may take, its connection
    /// included, before that database counts as away; its tenants' calls
    /// then fail at once (503 `tenant_database_unavailable`) until it
    /// answers again, and the other tenants are not held up by it. Long
    /// enough for any of tok's statements, short enough to cost the others
    /// a few seconds once rather than a lease.
    pub tenant_databases: tok_store::TenantDatabases,
    /// `TOK_LISTEN`: `127.0.0.1:8080`; loopback by default so a laptop run is
    /// not exposed to the network.
    pub listen: SocketAddr,
    /// `TOK_PUBLIC_URL`: scheme and host shown in webhook URLs; defaults to
    /// `http://<TOK_LISTEN>`.
    pub public_url: String,
    /// `TOK_ADMIN_KEY`: the platform admin key. Without it one is generated
    /// on the first start and printed once.
    pub admin_key: Option<Secret>,
    /// `TOK_SECRET_KEY`: the keys connection credentials are sealed under
    /// at rest, each 32 random bytes in base64 (`openssl rand -base64
    /// 32`), comma-separated, the newest first: the newest seals, each
    /// opens what it sealed (`tok secrets rotate` moves everything to the
    /// newest). Unset: on SQLite a key generated into a file beside the
    /// database (`tok.db.key`, mode 0600); on PostgreSQL a connection with
    /// credentials is refused. Prints its keys' ids only.
    pub secret_keys: tok_store::Keyring,
    /// `TOK_METRICS_TOKEN`: a token a Prometheus scraper sends as
    /// `Authorization: Bearer <token>` to read `GET /metrics`, so that the
    /// scraper needs no admin key. None by default: `/metrics` then answers
    /// the admin key only (its figures name every tenant).
    pub metrics_token: Option<Secret>,
    /// `TOK_ROLE` (alias `APP_ROLE`): `api`, `worker` or `both` (default).
    pub role: Role,
    /// `TOK_CONCURRENCY`: worker slots, [`DEFAULT_CONCURRENCY`] by default.
    pub concurrency: usize,
    /// `TOK_NODE_ID`: names the node in logs and leases (claims are held
    /// under it and a random incarnation per process, so two processes given
    /// one id never touch each other's claims); defaults to the host name.
    pub node_id: String,
    /// `TOK_DB_MAX_CONNECTIONS`: PostgreSQL pool size. Small on purpose: no
    /// step holds a connection while it calls out.
    pub db_max_connections: u32,
    /// `TOK_LEASE_SECS`: how long a claim lives without a heartbeat (30 s,
    /// [`DEFAULT_LEASE`]); the heartbeat runs every third of it
    /// ([`HEARTBEATS_PER_LEASE`]).
    pub lease: Duration,
    /// `TOK_BACKPRESSURE_DEPTH`: events and due steps waiting past which
    /// webhooks of sources not marked critical get 429 (100,000: far above a
    /// healthy queue, well before the database suffers).
    pub backpressure_depth: i64,
    /// `TOK_SIGNAL_LOOKBACK`: how long a signal that resumed no wait stays
    /// buffered for a `wait_for_event` that starts on its key (a duration
    /// like `10m`, `90s`; 10 minutes by default: a signal that arrives while
    /// the step before the wait still runs or retries is not lost, and one
    /// meant for a wait long gone does not resume the next run's). `0s`
    /// buffers nothing.
    pub signal_lookback: Duration,
    /// `TOK_SHUTDOWN_GRACE`: how long a stopping node lets the steps in
    /// flight finish after SIGTERM or Ctrl-C (a duration like `30s`; 30 s
    /// by default, within Kubernetes' default termination grace period).
    /// The leases of steps still running then are released, so another
    /// node takes them over at once instead of after a lease.
    pub shutdown_grace: Duration,
    /// `TOK_RUN_TIMEOUT` (`24h`; off by default): the longest a run of an
    /// automation without its own `settings.runTimeout` may stay unfinished
    /// before the scheduler fails it with `run_timeout`.
    pub run_timeout: Option<Duration>,
    /// `TOK_SCHEDULER_TICK`: how often the scheduler looks for due polls
    /// and schedules (1 s: a cron with seconds fires on time).
    pub scheduler_tick: Duration,
    /// `TOK_SCHEDULER_LEASE`: how long the node running the scheduler
    /// holds it without renewing (15 s): the longest the schedules wait
    /// after that node dies before another node takes over.
    pub scheduler_lease: Duration,
    /// `TOK_QUEUE_SAMPLE_EVERY`: how often the node running the scheduler
    /// keeps a sample of every tenant's queue for the dashboard's charts
    /// (30 s: 120 points an hour, one statement for all tenants each time;
    /// samples are kept a day).
    pub queue_sample_every: Duration,
    /// `TOK_STEP_SAMPLE`: the share of successful steps stored with their
    /// whole input and output, 0 to 1 (0.01 by default: one in a hundred
    /// shows what a step's data look like at a hundredth of the volume;
    /// the others keep size, hash and the first 512 bytes).
    pub step_sample: f64,
    /// `TOK_LOG_FORMAT`: `text` (default; colours only on a terminal) or
    /// `json` (one JSON object per line, for a log collector).
    pub log_format: LogFormat,
    /// `TOK_OUTBOUND_ALLOW`: what tenants' calls (`http`, `mcp`, widgets,
    /// polls) may reach beyond public addresses: comma-separated CIDRs
    /// (`10.20.0.0/16`), addresses, `host:port` (`localhost:8080`), or
    /// `any` to turn the guard off on a laptop. Empty by default: a tenant
    /// must not reach the platform's own network (loopback, private,
    /// link-local and so cloud metadata, CGNAT; docs/security.md, "Calls
    /// tok makes for a tenant").
    pub outbound_allow: tok_engine::OutboundAllow,
    /// `TOK_REQUIRE_SIGNED_WEBHOOKS` (`true` or `false`): whether a tenant
    /// that did not choose (`settings.webhooks.requireSignature`) accepts
    /// signed webhooks only: no source without `verify`, and every unsigned
    /// webhook of an older source refused with 401. Off by default, so a
    /// laptop's `curl` reaches a webhook as it always did; a hosted
    /// platform whose tenants connect Stripe or GitHub turns it on.
    pub require_signed_webhooks: bool,
    /// `TOK_SQLITE_WAL_LIMIT`: on SQLite, the size the write-ahead log
    /// file may reach before the writer checkpoints it whole and truncates
    /// it (bytes, or with a unit: `64MiB`, `512KiB`, `1GiB`; at least
    /// 1 MiB). 64 MiB by default ([`tok_store::DEFAULT_WAL_LIMIT`]): a
    /// second or more of the heaviest ingest between two truncations,
    /// each of which holds the writer a moment, and a small part of any
    /// disk (docs/operations.md, "The SQLite write-ahead log").
    pub sqlite: tok_store::SqliteSettings,
}

/// How log lines are written (`TOK_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Reads a duration variable (`30s`, `2m`, `500ms`), or `default`.
fn duration_var(name: &str, default: Duration) -> anyhow::Result<Duration> {
    match var(name) {
        Some(v) => tok_core::duration::parse_duration(v.trim())
            .with_context(|| format!("{name} must be a duration like 30s, 2m or 500ms")),
        None => Ok(default),
    }
}

impl LogFormat {
    /// `TOK_LOG_FORMAT`, read before the rest of the configuration: the
    /// logger starts first.
    pub fn from_env() -> anyhow::Result<Self> {
        match var("TOK_LOG_FORMAT").as_deref() {
            None | Some("text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(other) => bail!("TOK_LOG_FORMAT is `{other}`; expected text or json"),
        }
    }
}

/// The smallest `TOK_SQLITE_WAL_LIMIT`: below it the writer would stop to
/// truncate the log many times a second under load.
const MIN_WAL_LIMIT: u64 = 1024 * 1024;

/// A size in bytes: a whole number, with an optional unit (`B`, `KiB`,
/// `MiB`, `GiB`; `K`, `M`, `G` and `KB`, `MB`, `GB` mean the same).
fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(scale)
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| var("HOSTNAME"))
        .unwrap_or_else(|| DEFAULT_NODE_ID.into())
}

impl Config {
    /// Reads the environment over the defaults and validates the result.
    pub fn from_env() -> anyhow::Result<Self> {
        let listen: SocketAddr = var("TOK_LISTEN")
            .unwrap_or_else(|| "127.0.0.1:8080".into())
            .parse()
            .context("TOK_LISTEN must be an address like 127.0.0.1:8080")?;
        let role = match var("TOK_ROLE").or_else(|| var("APP_ROLE")).as_deref() {
            None | Some("both") => Role::Both,
            Some("api") => Role::Api,
            Some("worker") => Role::Worker,
            Some(other) => bail!("TOK_ROLE is `{other}`; expected api, worker or both"),
        };
        let concurrency = match var("TOK_CONCURRENCY") {
            Some(v) => v
                .parse()
                .context("TOK_CONCURRENCY must be a positive whole number")?,
            None => DEFAULT_CONCURRENCY,
        };
        let db_max_connections = match var("TOK_DB_MAX_CONNECTIONS") {
            Some(v) => v
                .parse()
                .context("TOK_DB_MAX_CONNECTIONS must be a positive whole number")?,
            None => 10,
        };
        let lease_secs: u64 = match var("TOK_LEASE_SECS") {
            Some(v) => v
                .parse()
                .context("TOK_LEASE_SECS must be a whole number of seconds")?,
            None => DEFAULT_LEASE.as_secs(),
        };
        let backpressure_depth = match var("TOK_BACKPRESSURE_DEPTH") {
            Some(v) => v
                .parse()
                .context("TOK_BACKPRESSURE_DEPTH must be a whole number")?,
            None => tok_server::DEFAULT_BACKPRESSURE_DEPTH,
        };
        let signal_lookback = match var("TOK_SIGNAL_LOOKBACK") {
            Some(v) => tok_core::duration::parse_duration(v.trim())
                .context("TOK_SIGNAL_LOOKBACK must be a duration like 10m or 90s")?,
            None => DEFAULT_SIGNAL_LOOKBACK,
        };
        let scheduler = tok_engine::scheduler::SchedulerConfig::default();
        let config = Self {
            database_url: var("TOK_DATABASE_URL")
                .unwrap_or_else(|| "sqlite://tok-data/tok.db".into()),
            tenant_databases: tenant_databases()?,
            public_url: var("TOK_PUBLIC_URL").unwrap_or_else(|| format!("http://{listen}")),
            listen,
            admin_key: var("TOK_ADMIN_KEY").map(Secret),
            secret_keys: match var("TOK_SECRET_KEY") {
                Some(text) => tok_store::Keyring::parse(&text, "TOK_SECRET_KEY")
                    .map_err(anyhow::Error::msg)?,
                None => tok_store::Keyring::default(),
            },
            metrics_token: var("TOK_METRICS_TOKEN").map(|t| Secret(t.trim().to_owned())),
            role,
            concurrency,
            node_id: var("TOK_NODE_ID").unwrap_or_else(host_name),
            db_max_connections,
            lease: Duration::from_secs(lease_secs),
            backpressure_depth,
            signal_lookback,
            shutdown_grace: duration_var("TOK_SHUTDOWN_GRACE", DEFAULT_SHUTDOWN_GRACE)?,
            run_timeout: match var("TOK_RUN_TIMEOUT").as_deref().map(str::trim) {
                None | Some("off") => None,
                Some(v) => Some(
                    tok_core::duration::parse_duration(v)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .with_context(|| {
                            format!("TOK_RUN_TIMEOUT must be a duration like 24h or 30m, or off; it is `{v}`")
                        })?,
                ),
            },
            scheduler_tick: duration_var("TOK_SCHEDULER_TICK", scheduler.tick)?,
            scheduler_lease: duration_var("TOK_SCHEDULER_LEASE", scheduler.lease)?,
            queue_sample_every: duration_var(
                "TOK_QUEUE_SAMPLE_EVERY",
                scheduler.queue_sample_every,
            )?,
            step_sample: match var("TOK_STEP_SAMPLE") {
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .with_context(|| {
                        format!(
                            "TOK_STEP_SAMPLE must be a share from 0 to 1, like 0.01; it is `{v}`"
                        )
                    })?,
                None => DEFAULT_STEP_SAMPLE,
            },
            log_format: LogFormat::from_env()?,
            outbound_allow: match var("TOK_OUTBOUND_ALLOW") {
                Some(text) => {
                    tok_engine::OutboundAllow::parse(&text).map_err(anyhow::Error::msg)?
                }
                None => tok_engine::OutboundAllow::default(),
            },
            require_signed_webhooks: match var("TOK_REQUIRE_SIGNED_WEBHOOKS").as_deref().map(str::trim) {
                None | Some("false" | "0") => false,
                Some("true" | "1") => true,
                Some(other) => bail!(
                    "TOK_REQUIRE_SIGNED_WEBHOOKS must be true or false; it is `{other}`"
                ),
            },
            sqlite: tok_store::SqliteSettings {
                wal_limit: match var("TOK_SQLITE_WAL_LIMIT") {
                    Some(v) => parse_bytes(&v).with_context(|| {
                        format!("TOK_SQLITE_WAL_LIMIT must be a size like 64MiB or 512KiB; it is `{v}`")
                    })?,
                    None => tok_store::DEFAULT_WAL_LIMIT,
                },
            },
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(token) = &self.metrics_token
            && token.0.len() < 16
        {
            bail!("TOK_METRICS_TOKEN must be at least 16 characters (a random token, not a word)");
        }
        if self.concurrency == 0 {
            bail!("TOK_CONCURRENCY must be at least 1");
        }
        if self.db_max_connections < 2 {
            bail!("TOK_DB_MAX_CONNECTIONS must be at least 2");
        }
        if self.scheduler_tick.is_zero() || self.scheduler_lease <= self.scheduler_tick {
            bail!(
                "TOK_SCHEDULER_LEASE must be longer than TOK_SCHEDULER_TICK (it is renewed each tick)"
            );
        }
        if self.queue_sample_every < Duration::from_millis(100) {
            bail!("TOK_QUEUE_SAMPLE_EVERY must be at least 100ms");
        }
        if self.sqlite.wal_limit < MIN_WAL_LIMIT {
            bail!(
                "TOK_SQLITE_WAL_LIMIT must be at least 1MiB; it is {} bytes",
                self.sqlite.wal_limit
            );
        }
        if self.lease < Duration::from_secs(3) {
            bail!("TOK_LEASE_SECS must be at least 3");
        }
        if !(self.public_url.starts_with("http://") || self.public_url.starts_with("https://")) {
            bail!("TOK_PUBLIC_URL must start with http:// or https://");
        }
        if !(self.database_url.starts_with("sqlite:") || self.database_url.starts_with("postgres"))
        {
            bail!("TOK_DATABASE_URL must be sqlite://… or postgres://…");
        }
        if !self.tenant_databases.is_empty() && !self.database_url.starts_with("postgres") {
            bail!(
                "TOK_TENANT_DATABASES puts tenants on PostgreSQL databases of their own: \
                 TOK_DATABASE_URL must then be postgres://… too"
            );
        }
        Ok(())
    }
}

/// `TOK_TENANT_DATABASES` and `TOK_TENANT_DATABASES_FILE`, together.
fn tenant_databases() -> anyhow::Result<tok_store::TenantDatabases> {
    let mut databases = match var("TOK_TENANT_DATABASES") {
        Some(text) => tok_store::TenantDatabases::parse(&text, "TOK_TENANT_DATABASES")
            .map_err(anyhow::Error::msg)?,
        None => tok_store::TenantDatabases::default(),
    };
    if let Some(path) = var("TOK_TENANT_DATABASES_FILE") {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("TOK_TENANT_DATABASES_FILE: cannot read {path}"))?;
        let file =
            tok_store::TenantDatabases::parse_file(&text, &path).map_err(anyhow::Error::msg)?;
        databases.merge(file).map_err(anyhow::Error::msg)?;
    }
    let timeout = duration_var(
        "TOK_TENANT_DATABASE_TIMEOUT",
        tok_store::routed::DEFAULT_TENANT_DATABASE_TIMEOUT,
    )?;
    if timeout < Duration::from_millis(100) {
        bail!("TOK_TENANT_DATABASE_TIMEOUT must be at least 100ms");
    }
    Ok(databases.with_timeout(timeout))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn a_size_is_read_with_or_without_its_unit() {
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
        assert_eq!(parse_bytes("64MiB"), Some(64 << 20));
        assert_eq!(parse_bytes(" 512 KiB "), Some(512 << 10));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes("64 mb"), Some(64 << 20));
        for bad in [
            "",
            "MiB",
            "64 MB extra",
            "-1",
            "1.5GiB",
            "99999999999999999999",
        ] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }
}
