//! The `tok` binary's library half: configuration and the `serve`,
//! `migrate`, `secrets`, `admin-key`, `bench`, `capacity` and `test` commands, and the API client behind `apply`,
//! `runs` and `signal`, callable from tests.

pub mod admin_key;
pub mod bench;
pub mod capacity;
pub mod cli;
pub mod config;
pub mod demo;
pub mod file_lock;
pub mod logs;
mod platform_audit;
pub mod secrets;
pub mod statements;
pub mod test_run;
pub mod traces;

use std::sync::Arc;

use anyhow::Context as _;
use tok_engine::{Engine, EngineConfig, Registry};
use tok_server::AppState;
use tok_store::{AdminKeyState, AuditEnd, AuditOutcome, Store, Target, hash_secret, random_token};

use crate::config::Config;

/// Connects to the database and applies pending migrations.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let store = tok_store::connect_routed(
        &config.database_url,
        &config.tenant_databases,
        config.db_max_connections,
        &config.secret_keys,
        config.sqlite,
    )
    .await
    .with_context(|| {
        format!(
            "could not open the database at {}",
            redact(&config.database_url)
        )
    })?;
    store.migrate().await.context("migrations failed")?;
    Ok(store)
}

/// `tok tenant move`: migrates both databases, copies the tenant's rows
/// from `from` to `to` ([`tok_store::routed::copy_tenant`]) and says what
/// it copied, table by table. Its audit row is the shared database's
/// (`shared`, `TOK_DATABASE_URL`): in the copy's transaction when `to` is
/// the shared database, else written ahead there; without `shared`, in
/// the copy's transaction on `to`.
pub async fn move_tenant(
    tenant: &str,
    from: &str,
    to: &str,
    shared: Option<&str>,
) -> anyhow::Result<String> {
    let tenant = tok_core::ids::TenantId::from(tenant.to_owned());
    let (source, target) = (pg(from).await?, pg(to).await?);
    let row = platform_audit::row(
        "tok tenant move",
        "tenant.moved",
        tok_store::Target {
            kind: "tenant".into(),
            id: Some(tenant.to_string()),
        },
        format!("copied from {} to {}", redact(from), redact(to)),
    );
    let copy = |row| tok_store::routed::copy_tenant(source.pool(), target.pool(), &tenant, row);
    let (copied, logged) = match shared.filter(|s| *s != to) {
        Some(shared) => {
            let log = pg(shared).await?;
            let copied = platform_audit::ahead(&log, row, copy(None), |copied| {
                let rows: u64 = copied.iter().map(|(_, n)| n).sum();
                format!("copied {rows} rows from {} to {}", redact(from), redact(to))
            })
            .await?;
            (copied, None)
        }
        None if shared.is_some() => (copy(Some(row)).await, None),
        None => (copy(Some(row)).await, Some(to)),
    };
    let copied = copied.with_context(|| format!("tenant {tenant} was not copied"))?;
    let mut out = format!(
        "copied tenant {tenant} from {} to {}:\n",
        redact(from),
        redact(to)
    );
    for (table, rows) in copied.iter().filter(|(_, rows)| *rows > 0) {
        out.push_str(&format!("  {table}: {rows}\n"));
    }
    out.push_str(&unlogged(logged));
    out.push_str(
        "next: route it to the new database (TOK_TENANT_DATABASES), start tok, and once it runs \
         there `tok tenant forget` it on the old one\n",
    );
    Ok(out)
}

/// `tok tenant forget`: deletes what a move left of the tenant in
/// `database`. Its audit row goes as [`move_tenant`]'s does.
pub async fn forget_tenant(
    tenant: &str,
    database: &str,
    shared: Option<&str>,
) -> anyhow::Result<String> {
    let tenant = tok_core::ids::TenantId::from(tenant.to_owned());
    let db = pg(database).await?;
    let row = platform_audit::row(
        "tok tenant forget",
        "tenant.forgotten",
        tok_store::Target {
            kind: "tenant".into(),
            id: Some(tenant.to_string()),
        },
        format!("rows a move left deleted from {}", redact(database)),
    );
    let forget = |row| tok_store::routed::forget_tenant(db.pool(), &tenant, row);
    let (deleted, logged) = match shared.filter(|s| *s != database) {
        Some(shared) => {
            let log = pg(shared).await?;
            let deleted = platform_audit::ahead(&log, row, forget(None), |deleted| {
                let rows: u64 = deleted.iter().map(|(_, n)| n).sum();
                format!("deleted {rows} rows a move left in {}", redact(database))
            })
            .await?;
            (deleted, None)
        }
        None if shared.is_some() => (forget(Some(row)).await, None),
        None => (forget(Some(row)).await, Some(database)),
    };
    let deleted = deleted?;
    let rows: u64 = deleted.iter().map(|(_, n)| n).sum();
    Ok(format!(
        "deleted {rows} rows of tenant {tenant} from {}\n{}",
        redact(database),
        unlogged(logged)
    ))
}

/// What a tenant command says when its audit row went to the database it
/// changed rather than the shared one (no `TOK_DATABASE_URL`).
fn unlogged(database: Option<&str>) -> String {
    match database {
        Some(database) => format!(
            "the audit row of this change is in {}'s own log: set TOK_DATABASE_URL to the shared \
             database to write it where GET /api/audit reads\n",
            redact(database)
        ),
        None => String::new(),
    }
}

/// A migrated PostgreSQL store at `url`.
async fn pg(url: &str) -> anyhow::Result<tok_store::PgStore> {
    if !url.starts_with("postgres") {
        anyhow::bail!("`{}` is not a postgres://… URL", redact(url));
    }
    let store = tok_store::PgStore::connect(url, 2)
        .await
        .with_context(|| format!("could not open the database at {}", redact(url)))?;
    tok_store::Store::migrate(&store)
        .await
        .with_context(|| format!("migrations failed on {}", redact(url)))?;
    Ok(store)
}

/// Hides a password in a database URL before it is printed.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Makes sure a platform admin key exists; prints a generated one once.
/// A start never rotates the admin key (`tok admin-key rotate` does, see
/// [`admin_key`]): with `TOK_ADMIN_KEY`, the first start makes it the
/// admin key, and a later start with another value (one rotated out, as a
/// node of a fleet restarted with an old configuration has) changes
/// nothing and says so at error level, so that no node brings an old key
/// back or revokes a newer one. Each change is a row of the platform's own
/// audit log (actor `platform`), written ahead of it.
async fn ensure_admin_key(store: &dyn Store, config: &Config) -> anyhow::Result<()> {
    let Some(key) = &config.admin_key else {
        if !store.has_admin_key().await? {
            let key = format!("tok_admin_{}", random_token());
            let hash = hash_secret(&key);
            audited_admin_key(
                store,
                &hash,
                "key.created",
                "tok serve",
                store.add_admin_key(&hash),
                |_| "generated at the first start without TOK_ADMIN_KEY".to_owned(),
            )
            .await?;
            println!("Generated the platform admin key (shown once, store it now): {key}");
        }
        return Ok(());
    };
    let hash = hash_secret(&key.0);
    let state = store.admin_key_state(&hash).await?;
    if state == AdminKeyState::Current {
        return Ok(());
    }
    if !store.has_admin_key().await? {
        audited_admin_key(
            store,
            &hash,
            "key.created",
            "tok serve",
            store.rotate_admin_key(&hash),
            |_| "TOK_ADMIN_KEY set at the first start".to_owned(),
        )
        .await
        .context("TOK_ADMIN_KEY cannot be the platform admin key; set it to a new secret")?;
        return Ok(());
    }
    let why = match state {
        AdminKeyState::RotatedOut { at } => format!(
            "it is an admin key rotated out at {}",
            tok_store::rfc3339::format(at)
        ),
        AdminKeyState::Tenant => "it is a tenant's key".to_owned(),
        _ => "it is not the platform admin key".to_owned(),
    };
    tracing::error!(
        "TOK_ADMIN_KEY is not the platform admin key ({why}): this node started without \
         changing the admin key, which stays the one in use. A start never rotates it, so that \
         a node with an old TOK_ADMIN_KEY cannot bring that key back; set TOK_ADMIN_KEY to the \
         current admin key on this node, or make this value the admin key with \
         `tok admin-key rotate --from-env` (docs/security.md, \"The admin key\")"
    );
    Ok(())
}

/// Makes a change to the platform admin key with its audit row written
/// ahead ([`platform_audit::ahead`]'s way): nothing is changed when the row
/// cannot be written; it ends `done`, naming the key by its id (never its
/// secret), or `unknown` when the change failed.
pub(crate) async fn audited_admin_key<T>(
    store: &dyn Store,
    hash: &str,
    action: &str,
    command: &str,
    change: impl std::future::Future<Output = tok_store::Result<T>>,
    summary: impl FnOnce(&T) -> String,
) -> anyhow::Result<T> {
    let target = Target {
        kind: "key".into(),
        id: store.key_by_hash(hash).await?.map(|k| k.id),
    };
    let row = platform_audit::row(command, action, target, String::new());
    let pending = store.begin_audit(row).await.map_err(|e| {
        anyhow::anyhow!(
            "the admin key was not changed: its audit row could not be written first: {e}"
        )
    })?;
    let done = change.await;
    let end = AuditEnd {
        outcome: match done {
            Ok(_) => AuditOutcome::Done,
            Err(_) => AuditOutcome::Unknown,
        },
        tenant_id: None,
        target_id: match store.key_by_hash(hash).await {
            Ok(Some(key)) => Some(key.id),
            _ => pending.target.id.clone(),
        },
        summary: done.as_ref().ok().map(summary),
    };
    if let Err(e) = store.end_audit(&pending, end).await {
        tracing::error!(action = %pending.action, error = %e, "the admin key's audit row stays pending: the scheduler will say its outcome is unknown");
    }
    Ok(done?)
}

/// What `tok serve` was asked for beyond the configuration.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// `--demo`: seed the demo tenant (README.md, "A service desk in five
    /// minutes") unless it exists.
    pub demo: bool,
}

/// Describes every metric a node of tok records, so that each family of
/// `/metrics` has its `# HELP` line; `serve` calls it once the recorder is
/// installed.
pub fn describe_metrics() {
    tok_server::describe_metrics();
    statements::describe();
}

/// Runs tok until SIGINT or SIGTERM: HTTP and/or the engine, by role, with
/// the step types of `registry` (and the connectors' steps). `tok serve`
/// passes the built-in steps and scripts; `tok bench-serve` those and the
/// bench's.
pub async fn serve(
    config: Config,
    registry: Registry,
    options: ServeOptions,
) -> anyhow::Result<()> {
    let _serving = file_lock::lock_sqlite(&config.database_url)?;
    // Installed before anything records: every node counts what it does
    // (a worker its steps and connector calls, an API node its webhooks)
    // and serves it on its own `/metrics`.
    let metrics = match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
        Ok(handle) => {
            describe_metrics();
            Some(handle)
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics are off: no recorder could be installed");
            None
        }
    };
    let store = open_store(&config).await?;
    let mut registry = registry;
    registry.add_connectors(store.clone(), &config.outbound_allow);
    ensure_admin_key(&*store, &config).await?;
    if options.demo {
        seed_demo(&*store, &registry, &config).await?;
    }
    let engine = Engine::new(
        store,
        registry,
        EngineConfig {
            node_id: config.node_id.clone(),
            concurrency: config.concurrency,
            lease: config.lease,
            heartbeat: config.lease / tok_engine::HEARTBEATS_PER_LEASE,
            signal_lookback: config.signal_lookback,
            shutdown_grace: config.shutdown_grace,
            step_sample: config.step_sample,
            outbound: config.outbound_allow.clone(),
            scheduler: tok_engine::scheduler::SchedulerConfig {
                tick: config.scheduler_tick,
                lease: config.scheduler_lease,
                queue_sample_every: config.queue_sample_every,
                run_timeout: config.run_timeout,
                ..Default::default()
            },
            ..EngineConfig::default()
        },
    );
    // Every process sends what it commits to the live stream; the ones that
    // serve the API follow what every process sent (PostgreSQL; on SQLite
    // the stream stays in this process).
    let _relay: Vec<AbortOnDrop> = engine
        .stream()
        .relay(engine.store(), config.role.serves_http())
        .await?
        .into_iter()
        .map(AbortOnDrop)
        .collect();
    let running = if config.role.runs_engine() {
        Some(engine.start(true).await?)
    } else {
        engine.refresh_tenants().await?;
        None
    };
    tracing::info!(role = ?config.role, node = %config.node_id, concurrency = config.concurrency, "tok started");
    if config.outbound_allow.is_any() {
        tracing::warn!(
            "TOK_OUTBOUND_ALLOW=any: the outbound guard is off; tenants' calls may reach any \
             address, this platform's own network included"
        );
    } else if config.outbound_allow != tok_engine::OutboundAllow::default() {
        tracing::info!(allow = %config.outbound_allow, "outbound guard exceptions (TOK_OUTBOUND_ALLOW)");
    }
    let mut state = AppState::new(engine.clone(), &config.public_url)
        .with_backpressure_depth(config.backpressure_depth)
        .require_signed_webhooks(config.require_signed_webhooks);
    if let Some(token) = &config.metrics_token {
        state = state.with_metrics_token(&token.0);
    }
    if let Some(handle) = metrics {
        state = state.with_metrics(handle);
    }
    // A worker node serves the probes and `/metrics` only, and is ready
    // while it claims work; the others serve the whole API.
    let (app, _queue_watch) = if config.role.serves_http() {
        let watch = AbortOnDrop(state.watch_queue());
        (tok_server::app(state.clone()), Some(watch))
    } else {
        state = state.ready_when_claiming();
        (tok_server::probes(state.clone()), None)
    };
    state.set_ready();
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("could not listen on {}", config.listen))?;
    if config.role.serves_http() {
        println!(
            "tok listening on http://{} ({})",
            listener.local_addr()?,
            config.public_url
        );
    } else {
        println!(
            "tok listening on http://{} (a worker: /healthz, /readyz and /metrics only)",
            listener.local_addr()?
        );
    }
    // HTTP keeps serving while the engine stops, so `/readyz` can answer
    // 503 to the load balancer and the API stays up for the steps in
    // flight; it stops once they are done.
    let stream = engine.stream().clone();
    let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = http_stopped.await;
    });
    let mut server = tokio::spawn(async move { server.await });
    tokio::select! {
        _ = shutdown_signal() => {}
        ended = &mut server => {
            ended??;
            return Ok(());
        }
    }
    state.set_stopping();
    if let Some(running) = running {
        running.shutdown().await;
    }
    // Open streams end, or the server would wait for them.
    stream.close();
    let _ = http_stop.send(());
    server.await??;
    // Nothing uses the store any more: SQLite leaves one file, its
    // write-ahead log checkpointed and gone.
    drop((_queue_watch, _relay));
    if let Err(e) = engine.store().close().await {
        tracing::warn!(error = %e, "the database was not closed cleanly; it recovers at the next start");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Seeds the demo tenant before the engine reads the list of tenants, and
/// prints its key and webhook URLs when this start created it.
async fn seed_demo(store: &dyn Store, registry: &Registry, config: &Config) -> anyhow::Result<()> {
    match demo::seed(store, registry, &config.public_url).await? {
        demo::Seeded::Created(demo) => println!("{demo}"),
        demo::Seeded::Existing { tenant, added } if added.is_empty() => tracing::info!(
            %tenant,
            "demo tenant already seeded; its API key and webhook URLs were printed then \
             (GET /api/sources with the admin key and `X-Tok-Tenant` shows the URLs again)"
        ),
        demo::Seeded::Existing { tenant, added } => tracing::warn!(
            %tenant,
            added = %added.join(", "),
            "demo tenant was seeded only partly before; added what it lacked"
        ),
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
}

/// Aborts a background task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
