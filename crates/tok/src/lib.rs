//! The `tok` binary's library half: configuration and the `serve`,
//! `migrate`, `secrets`, `bench`, `capacity` and `test` commands, and the API client behind `apply`,
//! `runs` and `signal`, callable from tests.

pub mod bench;
pub mod capacity;
pub mod cli;
pub mod config;
pub mod demo;
pub mod file_lock;
pub mod logs;
pub mod secrets;
pub mod statements;
pub mod test_run;
pub mod traces;

use std::sync::Arc;

use anyhow::Context as _;
use tok_engine::{Engine, EngineConfig, Registry};
use tok_server::AppState;
use tok_store::{Actor, ActorKind, NewAudit, Store, Target, hash_secret, random_token};

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
/// it copied, table by table.
pub async fn move_tenant(tenant: &str, from: &str, to: &str) -> anyhow::Result<String> {
    let tenant = tok_core::ids::TenantId::from(tenant.to_owned());
    let (source, target) = (pg(from).await?, pg(to).await?);
    let copied = tok_store::routed::copy_tenant(source.pool(), target.pool(), &tenant)
        .await
        .with_context(|| format!("tenant {tenant} was not copied"))?;
    let mut out = format!(
        "copied tenant {tenant} from {} to {}:\n",
        redact(from),
        redact(to)
    );
    for (table, rows) in copied.iter().filter(|(_, rows)| *rows > 0) {
        out.push_str(&format!("  {table}: {rows}\n"));
    }
    out.push_str(
        "next: route it to the new database (TOK_TENANT_DATABASES), start tok, and once it runs \
         there `tok tenant forget` it on the old one\n",
    );
    Ok(out)
}

/// `tok tenant forget`: deletes what a move left of the tenant in `database`.
pub async fn forget_tenant(tenant: &str, database: &str) -> anyhow::Result<String> {
    let tenant = tok_core::ids::TenantId::from(tenant.to_owned());
    let db = pg(database).await?;
    let deleted = tok_store::routed::forget_tenant(db.pool(), &tenant).await?;
    let rows: u64 = deleted.iter().map(|(_, n)| n).sum();
    Ok(format!(
        "deleted {rows} rows of tenant {tenant} from {}\n",
        redact(database)
    ))
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
/// With `TOK_ADMIN_KEY`, that key is the only one: a start with a new
/// value revokes the one before it and the generated one. Each change is
/// a row of the platform's own audit log (actor `platform`), written
/// after it committed.
async fn ensure_admin_key(store: &dyn Store, config: &Config) -> anyhow::Result<()> {
    if let Some(key) = &config.admin_key {
        let hash = hash_secret(&key.0);
        let known = store.key_by_hash(&hash).await?.is_some();
        let revoked = store.set_admin_key(&hash).await?;
        if revoked > 0 {
            tracing::info!(
                revoked,
                "TOK_ADMIN_KEY is new: the admin keys before it are revoked"
            );
            let summary = format!(
                "TOK_ADMIN_KEY changed at start: {revoked} platform admin key(s) before it revoked"
            );
            audit_admin_key(store, &hash, "key.rotated", summary).await?;
        } else if !known {
            let summary = "TOK_ADMIN_KEY set at start".to_owned();
            audit_admin_key(store, &hash, "key.created", summary).await?;
        }
    } else if !store.has_admin_key().await? {
        let key = format!("tok_admin_{}", random_token());
        let hash = hash_secret(&key);
        store.add_admin_key(&hash).await?;
        println!("Generated the platform admin key (shown once, store it now): {key}");
        let summary = "generated at the first start without TOK_ADMIN_KEY".to_owned();
        audit_admin_key(store, &hash, "key.created", summary).await?;
    }
    Ok(())
}

/// The platform's audit row of a change to its admin key (the key by its
/// id, never its secret).
async fn audit_admin_key(
    store: &dyn Store,
    hash: &str,
    action: &str,
    summary: String,
) -> anyhow::Result<()> {
    let id = store.key_by_hash(hash).await?.map(|k| k.id);
    store
        .write_audit(NewAudit {
            tenant_id: None,
            actor: Actor {
                kind: ActorKind::Platform,
                id: None,
                name: Some("tok serve".into()),
            },
            action: action.into(),
            target: Target {
                kind: "key".into(),
                id,
            },
            summary: Some(summary),
        })
        .await?;
    Ok(())
}

/// What `tok serve` was asked for beyond the configuration.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// `--demo`: seed the demo tenant of DESIGN §11 unless it exists.
    pub demo: bool,
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
        Ok(handle) => Some(handle),
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
            heartbeat: config.lease / 3,
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
