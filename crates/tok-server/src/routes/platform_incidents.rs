//! Platform incidents (admin only): the stuck runs the scheduler found
//! (`run_timeout`, `wait_overdue`, `queue_stalled`), newest first.
//! `GET /api/platform/incidents?status=open|resolved`, and
//! `POST /api/platform/incidents/{id}/resolve`.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::Admin;
use crate::error::{ApiError, ApiResult};
use crate::routes::{Path, Platform, Routes};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/platform/incidents", Platform, list)
        .post("/api/platform/incidents/{id}/resolve", Platform, resolve)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, resolve))]
pub(crate) struct Api;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[utoipa::path(get, path = "/api/platform/incidents", tag = "platform-incidents", responses((status = 200, body = crate::openapi::schemas::PlatformIncidentPage)))]
async fn list(
    State(state): State<AppState>,
    _admin: Admin,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    if let Some(status) = query.status.as_deref()
        && !matches!(status, "open" | "resolved")
    {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("`status` is `{status}`; expected open or resolved"),
        ));
    }
    let page = crate::routes::PageQuery {
        limit: query.limit,
        cursor: query.cursor,
    };
    let found = state
        .engine
        .store()
        .platform_incidents(
            query.status.as_deref(),
            page.limit()?,
            page.after("platform_incidents")?.as_deref(),
        )
        .await?;
    let items = found.items.iter().map(|i| json!(i)).collect();
    Ok(Json(crate::routes::page(
        "platform_incidents",
        items,
        found.next_cursor.as_deref(),
    )))
}

#[utoipa::path(post, path = "/api/platform/incidents/{id}/resolve", tag = "platform-incidents", responses((status = 200, body = crate::openapi::schemas::PlatformIncidentResolved)))]
async fn resolve(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    if !state
        .engine
        .store()
        .resolve_platform_incident(&id, tok_store::now_ms())
        .await?
    {
        return Err(ApiError::not_found("open platform incident"));
    }
    Ok(Json(json!({ "id": id, "status": "resolved" })))
}
