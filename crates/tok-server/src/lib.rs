//! tok's HTTP surface: webhooks, the REST API and health checks.
//!
//! Handlers are thin: they parse, call the store or the engine, and map the
//! result. `app(state)` builds the whole router, so tests drive it with
//! `oneshot` and `tok serve` binds it to a port.

mod audit;
mod auth;
mod body_schema;
mod dashboard;
mod error;
mod intake;
mod key_watch;
mod nul;
pub mod openapi;
mod quotas;
mod routes;
mod senders;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{Method, StatusCode, Uri};
use tok_engine::Engine;

pub use audit::{Audit, EXEMPT, NAMED, VERBS};
pub use error::{ApiError, ApiResult};
use routes::Routes;
pub use routes::{Access, Route};

/// Describes every metric an API or worker node records (the engine's and
/// the store's too), so that each family of `/metrics` has its `# HELP`
/// line. Call it once the recorder is installed.
pub fn describe_metrics() {
    tok_engine::describe_metrics();
    intake::describe();
    audit::describe();
}

/// Largest webhook body accepted; larger bodies get 413.
pub const MAX_WEBHOOK_BYTES: usize = 256 * 1024;

/// Queue depth (pending events plus due jobs) past which webhooks of
/// non-critical sources get 429, unless configured otherwise.
pub const DEFAULT_BACKPRESSURE_DEPTH: i64 = 100_000;

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    /// Scheme and host shown in webhook URLs (`TOK_PUBLIC_URL`).
    pub public_url: Arc<str>,
    ready: Arc<AtomicBool>,
    /// A shutdown began: `/readyz` answers 503 so a load balancer sends
    /// no more requests, while the steps in flight finish.
    stopping: Arc<AtomicBool>,
    pub(crate) token_limits: Arc<intake::TokenLimits>,
    pub(crate) sources: Arc<intake::SourceCache>,
    pub(crate) backpressure: Arc<intake::Backpressure>,
    pub(crate) ingest_metrics: Arc<intake::IngestMetrics>,
    /// Widgets' data through their cache (`GET /api/widgets/{id}/data`).
    pub(crate) widgets: Arc<tok_engine::Widgets>,
    pub(crate) metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The SHA-256 of `TOK_METRICS_TOKEN`, which `GET /metrics` answers
    /// besides the platform admin key (never the token itself).
    pub(crate) metrics_token: Option<Arc<str>>,
    /// Signal rates and live streams, per tenant and key ([`quotas`]).
    pub(crate) quotas: Arc<quotas::Quotas>,
    /// When this process last noted each key's use ([`auth::KeyUses`]).
    pub(crate) key_uses: Arc<auth::KeyUses>,
    /// The keys of open live streams, checked until they stop working
    /// ([`key_watch`]).
    pub(crate) key_watch: Arc<key_watch::KeyWatch>,
    /// `/readyz` also asks whether the engine claims work: a worker
    /// node's readiness ([`AppState::ready_when_claiming`]).
    pub(crate) ready_when_claiming: bool,
    /// Whether a tenant that did not choose requires its webhooks signed
    /// (`TOK_REQUIRE_SIGNED_WEBHOOKS`, [`AppState::require_signed_webhooks`]).
    pub(crate) require_signed_webhooks: bool,
}

impl AppState {
    pub fn new(engine: Engine, public_url: &str) -> Self {
        Self {
            widgets: Arc::new(tok_engine::Widgets::new(
                engine.store().clone(),
                &engine.config().outbound,
            )),
            engine,
            public_url: public_url.trim_end_matches('/').into(),
            ready: Arc::default(),
            stopping: Arc::default(),
            token_limits: Arc::default(),
            sources: Arc::default(),
            backpressure: Arc::new(intake::Backpressure::new(DEFAULT_BACKPRESSURE_DEPTH)),
            ingest_metrics: Arc::default(),
            metrics: None,
            metrics_token: None,
            quotas: Arc::default(),
            key_uses: Arc::default(),
            key_watch: Arc::default(),
            ready_when_claiming: false,
            require_signed_webhooks: false,
        }
    }

    /// Makes signed webhooks the platform's default: a tenant whose
    /// `settings.webhooks.requireSignature` is unset then cannot create a
    /// source without `verify`, and its older unsigned sources' webhooks
    /// are refused (`TOK_REQUIRE_SIGNED_WEBHOOKS`).
    pub fn require_signed_webhooks(mut self, required: bool) -> Self {
        self.require_signed_webhooks = required;
        self
    }

    /// `/readyz` answers 200 only while this process's worker pool claims
    /// work ([`Engine::claims_work`]) and the database answers: what an
    /// orchestrator should know of a worker node, which serves no API.
    pub fn ready_when_claiming(mut self) -> Self {
        self.ready_when_claiming = true;
        self
    }

    /// Serves `GET /metrics` from this Prometheus recorder.
    pub fn with_metrics(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// Lets `GET /metrics` answer a scraper holding `token`
    /// (`TOK_METRICS_TOKEN`) besides the platform admin key. Only its hash
    /// is kept.
    pub fn with_metrics_token(mut self, token: &str) -> Self {
        self.metrics_token = Some(tok_store::hash_secret(token).into());
        self
    }

    /// Sets the queue depth past which non-critical sources get 429.
    pub fn with_backpressure_depth(mut self, threshold: i64) -> Self {
        self.backpressure = Arc::new(intake::Backpressure::new(threshold));
        self
    }

    /// Records the queue depth the backpressure decision reads (the
    /// monitor started by [`AppState::watch_queue`] calls it every second).
    pub fn record_queue_depth(&self, depth: i64) {
        self.backpressure.record(depth);
    }

    /// Samples the queue depth every second for the backpressure decision,
    /// until the returned task is aborted.
    pub fn watch_queue(&self) -> tokio::task::JoinHandle<()> {
        let state = self.clone();
        tokio::spawn(async move {
            loop {
                let tenants = state.engine.store().tenant_ids().await;
                let stats = match tenants {
                    Ok(tenants) => state.engine.store().queue_stats(&tenants).await,
                    Err(e) => Err(e),
                };
                match stats {
                    Ok(s) => {
                        state.record_queue_depth(s.pending_events + s.ready);
                        tok_engine::scheduler::sample::record_queue_gauges(&s);
                    }
                    Err(e) => tracing::warn!(error = %e, "could not sample the queue depth"),
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        })
    }

    /// Marks the server ready (`/readyz` answers 200 while the database does).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Marks the server stopping: `/readyz` answers 503 from now on.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub(crate) fn webhook_url(&self, token: &str) -> String {
        format!("{}/webhook/{token}", self.public_url)
    }
}

/// Every route of the application, each router's in turn.
fn routes() -> Routes {
    Routes::new()
        .merge(routes::health::router())
        .merge(routes::webhook::router())
        .merge(routes::tenants::router())
        .merge(routes::sources::router())
        .merge(routes::automations::router())
        .merge(routes::runs::router())
        .merge(routes::events::router())
        .merge(routes::operations::router())
        .merge(routes::search::router())
        .merge(routes::signals::router())
        .merge(routes::widgets::router())
        .merge(routes::approvals::router())
        .merge(routes::ticket_types::router())
        .merge(routes::groups::router())
        .merge(routes::tickets::router())
        .merge(routes::incidents::router())
        .merge(routes::platform_incidents::router())
        .merge(routes::connections::router())
        .merge(routes::keys::router())
        .merge(routes::audit::router())
        .merge(routes::metrics::router())
        .merge(routes::stream::router())
        .merge(routes::dashboard::router())
        .merge(openapi::router())
        .merge(dashboard::router())
}

/// What a worker node serves: the probes and `/metrics`, nothing else.
fn probe_routes() -> Routes {
    Routes::new()
        .merge(routes::health::router())
        .merge(routes::metrics::router())
}

/// What [`app`] serves: every method and path of its router, from the
/// table the router is built from.
pub fn route_table() -> Vec<Route> {
    routes().into_parts().1
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    let (router, table) = routes().into_parts();
    let authorizer = auth::Authorizer::new(state.clone(), &table);
    let auditor = audit::Auditor::new(state.clone(), &table);
    // The authorizer runs first (the outer layer): the audit layer inside
    // it knows the caller, and writes a change's row after the handler.
    router
        .route_layer(axum::middleware::from_fn_with_state(auditor, audit::record))
        .route_layer(axum::middleware::from_fn_with_state(
            authorizer,
            auth::authorize,
        ))
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(axum::middleware::from_fn(nul::refuse_in_query))
        .with_state(state)
}

/// A worker node's HTTP application: `/healthz`, `/readyz` (with
/// [`AppState::ready_when_claiming`]) and `/metrics`, each behind the same
/// authorizer as in [`app`]; every other path answers 404.
pub fn probes(state: AppState) -> Router {
    let (router, table) = probe_routes().into_parts();
    let authorizer = auth::Authorizer::new(state.clone(), &table);
    router
        .route_layer(axum::middleware::from_fn_with_state(
            authorizer,
            auth::authorize,
        ))
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(axum::middleware::from_fn(nul::refuse_in_query))
        .with_state(state)
}

/// Errors are JSON everywhere, also for a path that does not exist…
async fn no_route(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("nothing is served at `{}`; check the URL", uri.path()),
    )
}

/// …and for a method the path does not take (axum adds the `Allow` header).
async fn no_method(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "`{}` does not take {method}; the `Allow` header lists the methods it takes",
            uri.path()
        ),
    )
}
