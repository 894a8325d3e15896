//! Connections to outside services (`http`, `mcp`): credentials and limits
//! per tenant and service. Credentials are write-only: stored sealed under
//! `TOK_SECRET_KEY` (tok-store `secrets`), applied to calls, never returned.
//! On PostgreSQL without `TOK_SECRET_KEY`, credentials are a 400
//! `secret_key_missing`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::{Connection, NewConnection};

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/connections", READ, list)
        .post("/api/connections", WRITE, create)
        .get("/api/connections/{id}", READ, show)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, show))]
pub(crate) struct Api;

const SERVICES: &[&str] = &["http", "mcp"];

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
    if !SERVICES.contains(&body.service.as_str()) {
        return Err(invalid(format!(
            "`service` is `{}`; expected one of {}",
            body.service,
            SERVICES.join(", ")
        )));
    }
    if let Some(url) = &body.base_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        return Err(invalid("`base_url` must start with http:// or https://"));
    }
    if body.service == "mcp" && body.base_url.is_none() {
        return Err(invalid(
            "an mcp connection needs `base_url`: the server's MCP endpoint",
        ));
    }
    if !(body.credentials.is_null() || body.credentials.is_object()) {
        return Err(invalid(
            "`credentials` must be an object: {\"bearer\": …}, {\"basic\": {\"user\", \"password\"}} or {\"headers\": {…}}",
        ));
    }
    // Credentials are sent only to the origin of the base URL (DESIGN §15):
    // without one, nothing would bind them to a host.
    if body.base_url.is_none() && body.credentials.as_object().is_some_and(|m| !m.is_empty()) {
        return Err(invalid(
            "a connection with `credentials` needs `base_url`: tok sends credentials only to \
             the origin (scheme, host, port) of the base URL",
        ));
    }
    if body.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(invalid("`rate` is calls per second and must be positive"));
    }
    let burst = body
        .burst
        .unwrap_or_else(|| body.rate.map_or(1, |r| r.ceil() as i32))
        .max(0);
    if burst < 1 {
        return Err(invalid("`burst` must be at least 1"));
    }
    if body.max_concurrency.is_some_and(|m| m < 1) {
        return Err(invalid("`max_concurrency` must be at least 1"));
    }
    let threshold = body.breaker.threshold.unwrap_or(5);
    let cooldown_ms = body.breaker.cooldown_ms.unwrap_or(30_000);
    if threshold < 1 || cooldown_ms < 100 {
        return Err(invalid(
            "`breaker.threshold` must be at least 1 and `breaker.cooldown_ms` at least 100",
        ));
    }
    let credentials = if body.credentials.is_null() {
        json!({})
    } else {
        body.credentials
    };
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
                breaker_threshold: threshold,
                breaker_cooldown_ms: cooldown_ms,
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
        .connection(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("connection"))?;
    Ok(Json(view(&connection)))
}
