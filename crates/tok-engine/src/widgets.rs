//! Dashboard widgets' data (docs/dashboard.md): a widget's tile shows what one
//! HTTP request answers, and the answer is kept as the widget's cache for
//! its time to live. While the cache is fresh, opening the dashboard calls
//! no outside service; a refresh, or an expired cache, makes one call, as
//! an `http` step would make it (the connection's credentials, rate limit,
//! concurrency cap and circuit breaker), with no database connection held
//! while it is out: the widget is read in one statement, the answer saved
//! in another. When a refresh fails and an answer is cached, that answer is
//! served with the error beside it, so a tile keeps showing its last data.
//! An answer is kept only while the widget still asks what was called: a
//! change of its request or connection meanwhile (which drops the cache)
//! leaves it out.
//!
//! A widget's request is a read: `GET`, without a header that asks the
//! service for another method ([`check_read`]). Anyone with a `read` key
//! may refresh a widget, so a widget that wrote (a `DELETE` through a
//! connection's credentials) would let a read key write. A widget saved
//! before this rule is refused at its call.

use std::sync::Arc;

use serde_json::Value;
use tok_core::error::StepError;
use tok_core::ids::{JobId, TenantId};
use tok_store::{Store, StoreError, Widget, now_ms};

use crate::outbound::{self, OutboundAllow, origin};
use crate::steps::http::{self, Caller, Http};

/// The longest a widget's call may hold a connection's slot: the longest
/// `timeoutMs` an `http` request may have, and a margin.
const SLOT_LEASE_MS: i64 = 130_000;

/// A widget's data as a tile shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct WidgetData {
    /// The answer's body (JSON when the service answered JSON, else text).
    pub data: Value,
    /// When it was fetched (ms since the epoch).
    pub fetched_at: i64,
    /// Served from the cache: no call left tok for this answer.
    pub cached: bool,
    /// Why a refresh failed, when the cached answer is served in its place.
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum WidgetError {
    #[error("widget not found")]
    NotFound,
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The call failed and there is no cached answer to serve instead;
    /// `retry_after_ms` when the connection's limits held the call back.
    #[error("{message}")]
    Fetch {
        message: String,
        retry_after_ms: Option<u64>,
    },
    /// The request itself is not allowed: the outbound guard refused its
    /// address (`code` is `outbound_refused`), its URL left the
    /// connection's origin (`origin_mismatch`), or it is not a read
    /// (`widget_not_a_read`, a widget saved before widgets were reads). No
    /// cached answer is served in its place: the request is the tenant's
    /// to fix.
    #[error("{message}")]
    Refused { code: &'static str, message: String },
}

/// Fetches widgets' data through a cache; one per process.
pub struct Widgets {
    store: Arc<dyn Store>,
    http: Http,
}

impl Widgets {
    /// Widgets' calls go through the outbound guard with `allow`'s
    /// exceptions (the engine's `EngineConfig::outbound`).
    pub fn new(store: Arc<dyn Store>, allow: &OutboundAllow) -> Self {
        Widgets {
            http: Http::new(store.clone(), allow),
            store,
        }
    }

    /// The tenant's widget `id`'s data: the cached answer while it is fresh
    /// (younger than the widget's time to live) and `refresh` is false,
    /// else one call's answer, which becomes the cache.
    pub async fn data(
        &self,
        tenant: &TenantId,
        id: &str,
        refresh: bool,
    ) -> Result<WidgetData, WidgetError> {
        let widget = self
            .store
            .widget(tenant, id)
            .await?
            .ok_or(WidgetError::NotFound)?;
        let cached = match (&widget.data, widget.fetched_at) {
            (Some(data), Some(at)) => Some((data.clone(), at)),
            _ => None,
        };
        if !refresh
            && let Some((data, at)) = &cached
            && now_ms() - at < widget.ttl_ms
        {
            return Ok(WidgetData {
                data: data.clone(),
                fetched_at: *at,
                cached: true,
                error: None,
            });
        }
        if let Err((_, message)) = check_read(&widget.request) {
            return Err(WidgetError::Refused {
                code: NOT_A_READ,
                message: format!("{NOT_A_READ}: {message}"),
            });
        }
        let fetched = self.fetch(tenant, &widget).await;
        if let Err(e) = &fetched {
            for code in [outbound::REFUSED, origin::MISMATCH] {
                if e.message().starts_with(&format!("{code}:")) {
                    return Err(WidgetError::Refused {
                        code,
                        message: e.message().to_owned(),
                    });
                }
            }
        }
        match fetched {
            Ok(data) => {
                let fetched_at = now_ms();
                // A change of the widget's request or connection while the
                // call was out dropped the cache: this answer is to the
                // request before it, and is not kept.
                let now = self.store.widget(tenant, &widget.id).await?;
                if now.is_some_and(|w| {
                    w.request == widget.request && w.connection == widget.connection
                }) {
                    self.store
                        .save_widget_data(tenant, &widget.id, &data, fetched_at)
                        .await?;
                }
                Ok(WidgetData {
                    data,
                    fetched_at,
                    cached: false,
                    error: None,
                })
            }
            Err(e) => match cached {
                Some((data, fetched_at)) => Ok(WidgetData {
                    data,
                    fetched_at,
                    cached: true,
                    error: Some(e.message().to_owned()),
                }),
                None => Err(WidgetError::Fetch {
                    message: e.message().to_owned(),
                    retry_after_ms: match e {
                        StepError::Deferred { after, .. } | StepError::RetryAfter { after, .. } => {
                            Some(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
                        }
                        _ => None,
                    },
                }),
            },
        }
    }

    /// One call as the widget's request says, through its connection.
    async fn fetch(&self, tenant: &TenantId, widget: &Widget) -> Result<Value, StepError> {
        let config = request_config(&widget.request, widget.connection.as_deref());
        // The connection's in-flight slots are keyed by job; a widget's call
        // holds one under a negative id, which no job has.
        let slot = JobId(-(rand::random::<i64>() & i64::MAX) - 1);
        let mut answer = self
            .http
            .call(tenant, &config, slot, SLOT_LEASE_MS, Caller::default())
            .await?;
        Ok(answer.remove("body").unwrap_or(Value::Null))
    }
}

/// The code of a widget's call refused because its request is not a read.
pub const NOT_A_READ: &str = "widget_not_a_read";

/// Whether a widget's request is a read: its method `GET` (or none), and
/// no header asking for another method. Otherwise the field at fault
/// (`request.method`, `request.headers.<name>`) and why.
pub fn check_read(request: &Value) -> Result<(), (String, String)> {
    if let Some(method) = request.get("method")
        && !method
            .as_str()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("GET"))
    {
        let shown = method.as_str().map_or(method.to_string(), str::to_owned);
        return Err((
            "request.method".into(),
            format!(
                "a widget's request is a read: its `method` is GET (or left out), not `{shown}`; \
                 anyone with a `read` key may refresh a widget, so it never writes. Call a \
                 service that changes something from an automation"
            ),
        ));
    }
    if let Some(Value::Object(headers)) = request.get("headers")
        && let Some(name) = headers
            .keys()
            .find(|name| crate::outbound::headers::overrides_method(name))
    {
        return Err((
            format!("request.headers.{name}"),
            format!(
                "a widget's request is a read: it sends no `{name}`, which asks the service to \
                 take a GET for another method"
            ),
        ));
    }
    Ok(())
}

/// Checks a widget's request (an `http` step's config) before it is saved.
/// It is sent as written: there is no run whose context a template could
/// read.
pub fn check_request(request: &Value, connection: Option<&str>) -> Result<(), String> {
    if !request.is_object() {
        return Err("`request` must be an object: an `http` step's config".into());
    }
    if request.get("connection").is_some() {
        return Err("name the connection in the widget's `connection`, not in `request`".into());
    }
    if request.to_string().contains("{{") {
        return Err(
            "a widget's request is sent as written: `{{…}}` templates need a run's context".into(),
        );
    }
    http::check(&request_config(request, connection))
}

fn request_config(request: &Value, connection: Option<&str>) -> Value {
    let mut config = request.clone();
    if let (Some(name), Value::Object(map)) = (connection, &mut config) {
        map.insert("connection".into(), Value::String(name.to_owned()));
    }
    config
}
