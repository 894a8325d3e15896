//! Connections to outside services (`http`, `mcp`): credentials and limits
//! per tenant and service. Credentials are write-only: stored sealed under
//! `TOK_SECRET_KEY` (tok-store `secrets`), applied to calls, never returned.
//! On PostgreSQL without `TOK_SECRET_KEY`, credentials are a 400
//! `secret_key_missing`. A connection's base URL, credentials and limits
//! change (`PATCH`), its name and service do not; it is deleted once no
//! automation or widget names it. None of these routes opens the
//! credentials, so a connection whose key was lost is still shown, given
//! new credentials or deleted.
//!
//! Credentials keep to their origin (docs/security.md): a change that moves
//! a connection holding credentials to another origin (scheme, host, port)
//! must give the credentials again in the same request (or remove them),
//! unless the key has the `admin` scope; otherwise it is 409
//! `credentials_required` and nothing changes. A `write` key could
//! otherwise point a connection's base URL at a host it controls and
//! receive the credentials it may never read with the next call.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::uses::Kind;
use tok_engine::outbound::origin;
use tok_store::{Connection, ConnectionPatch, ExpectedConnection, NewConnection, Scope};

use crate::AppState;
use crate::auth::{Caller, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::routes::in_use::{
    User, automations_using, automations_where, refuse_if_any, refuse_if_used, widgets_using,
};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/connections", READ, list)
        .post("/api/connections", WRITE, create)
        .get("/api/connections/{id}", READ, show)
        .patch("/api/connections/{id}", WRITE, update)
        .delete("/api/connections/{id}", WRITE, delete)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, show, update, delete))]
pub(crate) struct Api;

const SERVICES: &[&str] = &["http", "mcp"];

/// A rate limit's burst when the create gives none: a second's calls.
fn default_burst(rate: Option<f64>) -> i32 {
    rate.map_or(1, |r| r.ceil() as i32)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewConnectionBody {
    name: String,
    service: String,
    base_url: Option<String>,
    #[serde(default)]
    credentials: Value,
    rate: Option<f64>,
    burst: Option<i32>,
    max_concurrency: Option<i32>,
    #[serde(default)]
    breaker: Breaker,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Breaker {
    threshold: Option<i32>,
    cooldown_ms: Option<i64>,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_body", message)
}

/// A connection as it is to be stored, credentials aside: what a create
/// and a change are both checked as, by [`checked`].
struct Settings<'a> {
    service: &'a str,
    base_url: Option<&'a str>,
    /// Whether it holds credentials (given now, or kept by a change).
    has_credentials: bool,
    rate: Option<f64>,
    burst: i32,
    max_concurrency: Option<i32>,
    breaker_threshold: i32,
    breaker_cooldown_ms: i64,
}

/// Whether a connection may be stored so.
fn checked(s: &Settings<'_>) -> ApiResult<()> {
    if !SERVICES.contains(&s.service) {
        return Err(invalid(format!(
            "`service` is `{}`; expected one of {}",
            s.service,
            SERVICES.join(", ")
        )));
    }
    if let Some(url) = s.base_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        return Err(invalid("`base_url` must start with http:// or https://"));
    }
    if s.service == "mcp" && s.base_url.is_none() {
        return Err(invalid(
            "an mcp connection needs `base_url`: the server's MCP endpoint",
        ));
    }
    // Credentials are sent only to the origin of the base URL (docs/security.md):
    // without one, nothing would bind them to a host.
    if s.base_url.is_none() && s.has_credentials {
        return Err(invalid(
            "a connection with `credentials` needs `base_url`: tok sends credentials only to \
             the origin (scheme, host, port) of the base URL",
        ));
    }
    if s.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(invalid("`rate` is calls per second and must be positive"));
    }
    if s.burst < 1 {
        return Err(invalid("`burst` must be at least 1"));
    }
    if s.max_concurrency.is_some_and(|m| m < 1) {
        return Err(invalid("`max_concurrency` must be at least 1"));
    }
    if s.breaker_threshold < 1 || s.breaker_cooldown_ms < 100 {
        return Err(invalid(
            "`breaker.threshold` must be at least 1 and `breaker.cooldown_ms` at least 100",
        ));
    }
    Ok(())
}

/// Credentials as given: an object (`{}` or `null` for none), whose
/// `headers` send no request elsewhere than the base URL's origin.
fn checked_credentials(credentials: Value) -> ApiResult<Value> {
    if let Some(Value::Object(headers)) = credentials.get("headers")
        && let Some((name, why)) = headers
            .keys()
            .find_map(|name| tok_engine::outbound::headers::unsent(name).map(|why| (name, why)))
    {
        return Err(invalid(why).with("field", format!("credentials.headers.{name}")));
    }
    match credentials {
        Value::Null => Ok(json!({})),
        Value::Object(_) => Ok(credentials),
        _ => Err(invalid(
            "`credentials` must be an object: {\"bearer\": …}, {\"basic\": {\"user\", \"password\"}} or {\"headers\": {…}}",
        )),
    }
}

fn holds_credentials(credentials: &Value) -> bool {
    credentials.as_object().is_some_and(|m| !m.is_empty())
}

/// What a client sees of a connection: everything but the credentials.
fn view(c: &Connection) -> Value {
    json!({
        "id": c.id,
        "name": c.name,
        "service": c.service,
        "base_url": c.base_url,
        "has_credentials": c.has_credentials,
        "rate": c.rate,
        "burst": c.burst,
        "max_concurrency": c.max_concurrency,
        "breaker": {
            "threshold": c.breaker_threshold,
            "cooldown_ms": c.breaker_cooldown_ms,
            "state": c.breaker_state,
            "failures": c.failures,
        },
        "created_at": tok_store::rfc3339::format(c.created_at),
    })
}

#[utoipa::path(post, path = "/api/connections", tag = "connections", responses((status = 201, body = crate::openapi::schemas::Connection)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewConnectionBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = body.name.trim().to_owned();
    if name.is_empty() {
        return Err(invalid("`name` must not be empty"));
    }
    let credentials = checked_credentials(body.credentials)?;
    let burst = body.burst.unwrap_or_else(|| default_burst(body.rate));
    let breaker_threshold = body.breaker.threshold.unwrap_or(5);
    let breaker_cooldown_ms = body.breaker.cooldown_ms.unwrap_or(30_000);
    checked(&Settings {
        service: &body.service,
        base_url: body.base_url.as_deref(),
        has_credentials: holds_credentials(&credentials),
        rate: body.rate,
        burst,
        max_concurrency: body.max_concurrency,
        breaker_threshold,
        breaker_cooldown_ms,
    })?;
    let connection = state
        .engine
        .store()
        .create_connection(
            &tenant,
            NewConnection {
                name,
                service: body.service,
                base_url: body.base_url,
                credentials,
                rate: body.rate,
                burst,
                max_concurrency: body.max_concurrency,
                breaker_threshold,
                breaker_cooldown_ms,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(view(&connection))))
}

#[utoipa::path(get, path = "/api/connections", tag = "connections", responses((status = 200, body = crate::openapi::schemas::ConnectionPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("connections", query)?;
    let found = state
        .engine
        .store()
        .connections(&tenant, asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, view))
}

#[utoipa::path(get, path = "/api/connections/{id}", tag = "connections", responses((status = 200, body = crate::openapi::schemas::Connection)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let connection = state
        .engine
        .store()
        .connection_unopened(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("connection"))?;
    Ok(Json(view(&connection)))
}

/// A change to a connection: what is absent stays. `rate` and
/// `max_concurrency` may be `null` to remove the limit, `credentials`
/// `null` or `{}` to remove them. `name` and `service` cannot change; they
/// are taken when they are what the connection has.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectionPatchBody {
    name: Option<String>,
    service: Option<String>,
    #[serde(default, deserialize_with = "super::present")]
    base_url: Option<Option<String>>,
    #[serde(default, deserialize_with = "super::present")]
    credentials: Option<Value>,
    #[serde(default, deserialize_with = "super::present")]
    rate: Option<Option<f64>>,
    burst: Option<i32>,
    #[serde(default, deserialize_with = "super::present")]
    max_concurrency: Option<Option<i32>>,
    breaker: Option<Breaker>,
}

/// Changes a connection's base URL, credentials or limits; the next call
/// of every step and widget through it uses them (the engine reads the
/// connection at each call). A new base URL of another origin is refused
/// (409 `in_use`) while automations or widgets call literal URLs of the
/// old one through it: those calls would fail with `origin_mismatch`. It
/// is refused too (409 `credentials_required`) when the connection holds
/// credentials that the change does not give again (or remove), unless
/// the key has the `admin` scope.
#[utoipa::path(patch, path = "/api/connections/{id}", tag = "connections", responses((status = 200, body = crate::openapi::schemas::Connection), (status = 409, description = "a new base URL of another origin than literal URLs that automations or widgets call through the connection (`in_use`, with `used_by`), or than the credentials it holds are bound to, without giving them again or the `admin` scope (`credentials_required`)", body = crate::openapi::ErrorBody)))]
async fn update(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Caller(key): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ConnectionPatchBody>,
) -> ApiResult<Json<Value>> {
    let store = state.engine.store();
    let current = store
        .connection_unopened(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("connection"))?;
    if let Some(name) = &body.name
        && name.trim() != current.name
    {
        return Err(invalid(format!(
            "`name` cannot change (automations and widgets name the connection `{}`): \
             create a connection of the new name and point them at it",
            current.name
        ))
        .with("field", "name"));
    }
    if let Some(service) = &body.service
        && *service != current.service
    {
        return Err(invalid(format!(
            "`service` cannot change (connection `{}` is `{}`): create a connection for the \
             other service",
            current.name, current.service
        ))
        .with("field", "service"));
    }
    let credentials = body.credentials.map(checked_credentials).transpose()?;
    let breaker = body.breaker.unwrap_or_default();
    // A change of the base URL is judged against the connection as read
    // here; the store writes it only if that still holds.
    let expect = body.base_url.as_ref().map(|_| ExpectedConnection {
        base_url: current.base_url.clone(),
        has_credentials: current.has_credentials,
    });
    let patch = ConnectionPatch {
        base_url: body.base_url,
        credentials,
        rate: body.rate,
        burst: body.burst,
        max_concurrency: body.max_concurrency,
        breaker_threshold: breaker.threshold,
        breaker_cooldown_ms: breaker.cooldown_ms,
        expect,
    };
    let base_url = match &patch.base_url {
        Some(url) => url.clone(),
        None => current.base_url.clone(),
    };
    let has_credentials = match &patch.credentials {
        Some(credentials) => holds_credentials(credentials),
        None => current.has_credentials,
    };
    checked(&Settings {
        service: &current.service,
        base_url: base_url.as_deref(),
        has_credentials,
        rate: patch.rate.unwrap_or(current.rate),
        burst: patch.burst.unwrap_or(current.burst),
        max_concurrency: patch.max_concurrency.unwrap_or(current.max_concurrency),
        breaker_threshold: patch.breaker_threshold.unwrap_or(current.breaker_threshold),
        breaker_cooldown_ms: patch
            .breaker_cooldown_ms
            .unwrap_or(current.breaker_cooldown_ms),
    })?;
    if current.has_credentials
        && patch.credentials.is_none()
        && !key.grants(Scope::Admin)
        && let Some((from, to)) = origin::moved(current.base_url.as_deref(), base_url.as_deref())
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "credentials_required",
            format!(
                "connection `{}` holds credentials, which tok sends only to {from}, the origin of \
                 its base_url; moving it to {to} needs them again: send `credentials` in the same \
                 request (or `null` to remove them), or make the change with a key that has the \
                 `admin` scope",
                current.name
            ),
        )
        .with("field", "credentials")
        .with("from", from)
        .with("to", to));
    }
    if base_url != current.base_url {
        let changed = Connection {
            base_url: base_url.clone(),
            has_credentials,
            ..current.clone()
        };
        refuse_if_left_behind(&state, &tenant, &changed).await?;
    }
    let updated = store
        .update_connection(&tenant, &current.id, patch)
        .await?
        .ok_or_else(|| ApiError::not_found("connection"))?;
    Ok(Json(view(&updated)))
}

/// The 409 when `changed` (a connection with a new base URL) would leave
/// behind the literal URLs of automations' `http` steps or widgets that
/// call through it.
async fn refuse_if_left_behind(
    state: &AppState,
    tenant: &tok_core::ids::TenantId,
    changed: &Connection,
) -> ApiResult<()> {
    let mut users = automations_where(state, tenant, |definition| {
        origin::mismatches(definition, changed).into_iter().next()
    })
    .await?;
    let through = state
        .engine
        .store()
        .widgets_through(tenant, changed.id.as_str(), &changed.name)
        .await?;
    users.extend(
        through
            .iter()
            .filter(|widget| {
                let url = widget.request.get("url").and_then(Value::as_str);
                origin::check_literal(changed, url.unwrap_or_default()).is_err()
            })
            .map(|widget| User::widget(widget, "request.url")),
    );
    let base_url = changed.base_url.as_deref().unwrap_or_default();
    refuse_if_any(
        &format!(
            "connection `{}` cannot move to `{base_url}`, another origin than the literal URLs \
             called through it by",
            changed.name
        ),
        &users,
    )
}

/// Deletes a connection. Refused (409 `in_use`) while an automation's step
/// or a widget names it.
#[utoipa::path(delete, path = "/api/connections/{id}", tag = "connections", responses((status = 204, description = "deleted"), (status = 409, description = "an automation or a widget names the connection (`in_use`, with `used_by`)", body = crate::openapi::ErrorBody)))]
async fn delete(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let store = state.engine.store();
    let connection = store
        .connection_unopened(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("connection"))?;
    let mut users = automations_using(
        &state,
        &tenant,
        Kind::Connection,
        &connection.id,
        &connection.name,
    )
    .await?;
    users.extend(widgets_using(&state, &tenant, &connection.id, &connection.name).await?);
    refuse_if_used(&format!("connection `{}`", connection.name), &users)?;
    if !store.delete_connection(&tenant, &connection.id).await? {
        return Err(ApiError::not_found("connection"));
    }
    Ok(StatusCode::NO_CONTENT)
}
