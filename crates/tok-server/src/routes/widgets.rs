//! Dashboard widgets (docs/dashboard.md): `POST /api/widgets {name, connection,
//! request, ttlSec}` saves a tile's request (an `http` step's config, sent
//! through the connection); `GET /api/widgets/{id}/data` answers its data
//! from the cache while it is fresh, else from one call
//! (`?refresh=true` calls at once), as `{data, fetched_at, age_s, cached}`.
//! A widget's connection, request and time to live change (`PATCH`; a new
//! request or connection drops the cache), its name does not.
//!
//! A widget reads: its request is a `GET` (`400 invalid_body` at
//! `request.method` otherwise, see [`tok_engine::widgets::check_read`]),
//! since a `read` key may refresh it. A refresh is a call through the
//! widget's connection, so it is rate-limited per widget
//! ([`crate::quotas::WIDGET_REFRESHES`]): one more is 429 `rate_limited`
//! with `Retry-After`, and reads of the cache are never limited.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::ids::TenantId;
use tok_engine::widgets::check_request;
use tok_engine::{WidgetData, WidgetError};
use tok_store::{NewWidget, Widget, WidgetPatch, now_ms};

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .post("/api/widgets", WRITE, create)
        .get("/api/widgets", READ, list)
        .get("/api/widgets/{id}", READ, show)
        .patch("/api/widgets/{id}", WRITE, update)
        .delete("/api/widgets/{id}", WRITE, delete)
        .get("/api/widgets/{id}/data", READ, data)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(create, list, show, update, delete, data))]
pub(crate) struct Api;

/// Longest a cache may be kept: a week. A tile older than that shows
/// nothing a person would act on.
const MAX_TTL_SEC: i64 = 7 * 24 * 3600;

const MAX_NAME_CHARS: usize = 200;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewWidgetBody {
    name: String,
    connection: Option<String>,
    request: Value,
    #[serde(rename = "ttlSec", alias = "ttl_sec")]
    ttl_sec: i64,
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_body", message).with("field", field)
}

/// A time in the API's format (RFC 3339, UTC, milliseconds).
fn time(ms: i64) -> Value {
    json!(tok_store::rfc3339::format(ms))
}

fn view(w: &Widget) -> Value {
    json!({
        "id": w.id,
        "name": w.name,
        "connection": w.connection,
        "request": w.request,
        "ttl_sec": w.ttl_ms / 1000,
        "fetched_at": w.fetched_at.map(time),
        "created_at": time(w.created_at),
    })
}

/// A widget's connection, request and time to live as they are to be
/// stored: what a create and a change are both checked as. Answers the
/// connection as kept (trimmed; none for a blank one).
async fn checked(
    state: &AppState,
    tenant: &TenantId,
    connection: Option<&str>,
    request: &Value,
    ttl_sec: i64,
) -> ApiResult<Option<String>> {
    if !(1..=MAX_TTL_SEC).contains(&ttl_sec) {
        return Err(invalid(
            "ttlSec",
            format!(
                "`ttlSec` is {ttl_sec}; it must be between 1 and {MAX_TTL_SEC} (a week): how many \
                 seconds an answer is served from the cache"
            ),
        ));
    }
    let connection = match connection.map(str::trim) {
        None | Some("") => None,
        Some(name) => {
            if state
                .engine
                .store()
                .connection(tenant, name)
                .await?
                .is_none()
            {
                return Err(invalid(
                    "connection",
                    format!(
                        "`{name}` is not a connection of this tenant; create it with POST \
                         /api/connections"
                    ),
                ));
            }
            Some(name.to_owned())
        }
    };
    tok_engine::widgets::check_read(request).map_err(|(field, m)| invalid(&field, m))?;
    check_request(request, connection.as_deref()).map_err(|m| invalid("request", m))?;
    tok_engine::outbound::origin::check_widget(
        tenant,
        connection.as_deref(),
        request,
        &**state.engine.store(),
    )
    .await?
    .map_err(|m| invalid("request.url", m))?;
    crate::routes::storable_json("`request`", request)?;
    Ok(connection)
}

#[utoipa::path(post, path = "/api/widgets", tag = "widgets", responses((status = 201, body = crate::openapi::schemas::Widget)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewWidgetBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = body.name.trim().to_owned();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid(
            "name",
            format!("`name` must be 1 to {MAX_NAME_CHARS} characters"),
        ));
    }
    let connection = checked(
        &state,
        &tenant,
        body.connection.as_deref(),
        &body.request,
        body.ttl_sec,
    )
    .await?;
    let widget = state
        .engine
        .store()
        .create_widget(
            &tenant,
            NewWidget {
                name,
                connection,
                request: body.request,
                ttl_ms: body.ttl_sec * 1000,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(view(&widget))))
}

/// A change to a widget: what is absent stays; `connection` may be `null`
/// (the request's absolute URL is called directly). Its name cannot
/// change; it is taken when it is the widget's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WidgetPatchBody {
    name: Option<String>,
    #[serde(default, deserialize_with = "super::present")]
    connection: Option<Option<String>>,
    request: Option<Value>,
    #[serde(rename = "ttlSec", alias = "ttl_sec")]
    ttl_sec: Option<i64>,
}

/// Changes a widget's connection, request or time to live, checked as a
/// create is. A new request or connection drops the cached answer: the
/// tile's next read calls the service.
#[utoipa::path(patch, path = "/api/widgets/{id}", tag = "widgets", responses((status = 200, body = crate::openapi::schemas::Widget)))]
async fn update(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<WidgetPatchBody>,
) -> ApiResult<Json<Value>> {
    let store = state.engine.store();
    let current = store
        .widget(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("widget"))?;
    if let Some(name) = &body.name
        && name.trim() != current.name
    {
        return Err(invalid(
            "name",
            format!(
                "`name` cannot change (widget `{}`): create a widget of the new name and delete \
                 this one",
                current.name
            ),
        ));
    }
    let connection = match body.connection {
        Some(given) => given,
        None => current.connection.clone(),
    };
    let request = body.request.unwrap_or_else(|| current.request.clone());
    let ttl_sec = body.ttl_sec.unwrap_or(current.ttl_ms / 1000);
    let connection = checked(&state, &tenant, connection.as_deref(), &request, ttl_sec).await?;
    let widget = store
        .update_widget(
            &tenant,
            &current.id,
            WidgetPatch {
                connection: Some(connection),
                request: Some(request),
                ttl_ms: Some(ttl_sec * 1000),
            },
        )
        .await?
        .ok_or_else(|| ApiError::not_found("widget"))?;
    Ok(Json(view(&widget)))
}

/// Deletes a widget and its cached answer.
#[utoipa::path(delete, path = "/api/widgets/{id}", tag = "widgets", responses((status = 204, description = "deleted")))]
async fn delete(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    match state.engine.store().delete_widget(&tenant, &id).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(ApiError::not_found("widget")),
    }
}

#[utoipa::path(get, path = "/api/widgets", tag = "widgets", responses((status = 200, body = crate::openapi::schemas::WidgetPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("widgets", query)?;
    let found = state
        .engine
        .store()
        .widgets(&tenant, asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, view))
}

#[utoipa::path(get, path = "/api/widgets/{id}", tag = "widgets", responses((status = 200, body = crate::openapi::schemas::Widget)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let widget = state
        .engine
        .store()
        .widget(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("widget"))?;
    Ok(Json(view(&widget)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DataQuery {
    #[serde(default)]
    refresh: bool,
}

/// A widget's data: its cached answer while it is fresh, else one call's.
/// `?refresh=true` calls at once, at most once every 10 seconds per widget
/// after a burst of 3 (429 `rate_limited` with `Retry-After` past it).
#[utoipa::path(get, path = "/api/widgets/{id}/data", tag = "widgets", responses((status = 200, body = crate::openapi::schemas::WidgetData), (status = 429, description = "refreshed too often (`rate_limited`; `Retry-After` says when it may be refreshed again)", body = crate::openapi::ErrorBody)))]
async fn data(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    query: Result<Query<DataQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| {
        ApiError::bad_request("bad_query", e.body_text()).with("expected", "refresh=true|false")
    })?;
    if query.refresh {
        if state.engine.store().widget(&tenant, &id).await?.is_none() {
            return Err(ApiError::not_found("widget"));
        }
        if let Err(wait) = state
            .quotas
            .take_refresh(&tenant, &id, std::time::Instant::now())
        {
            let (rate, burst) = crate::quotas::WIDGET_REFRESHES;
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "widget `{id}` was refreshed {burst} times in a row, the most allowed: it \
                     may be refreshed once every {} seconds (its cached answer is served \
                     without `refresh`)",
                    (1.0 / rate).round()
                ),
            )
            .with("retry_after_ms", (wait.as_millis() as u64).max(1)));
        }
    }
    let data = state
        .widgets
        .data(&tenant, &id, query.refresh)
        .await
        .map_err(|e| match e {
            WidgetError::NotFound => ApiError::not_found("widget"),
            WidgetError::Store(e) => e.into(),
            WidgetError::Fetch {
                message,
                retry_after_ms: Some(ms),
            } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "widget_unavailable",
                message,
            )
            .with("retry_after_ms", ms),
            WidgetError::Refused { code, message } => ApiError::bad_request(code, message),
            WidgetError::Fetch { message, .. } => {
                ApiError::new(StatusCode::BAD_GATEWAY, "widget_fetch_failed", message)
            }
        })?;
    Ok(Json(answer(&data)))
}

fn answer(d: &WidgetData) -> Value {
    let age_ms = (now_ms() - d.fetched_at).max(0);
    let mut answer = json!({
        "data": d.data,
        "fetched_at": time(d.fetched_at),
        "age_s": age_ms / 1000,
        "cached": d.cached,
    });
    if let Some(error) = &d.error {
        answer["error"] = json!(error);
    }
    answer
}
