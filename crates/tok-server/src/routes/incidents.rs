//! Incidents: what went wrong, at two levels. A tenant's keys see the
//! `title` and `impact` written for them, never the `detail` (automation,
//! run, failed step, full message, steps, input) nor the run or the dedupe
//! source; the platform admin acting for the tenant (`X-Tok-Tenant`) sees
//! those too. Resolving an incident lets the same cause open a new one.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::ids::TenantId;
use tok_store::{Incident, rfc3339};

use crate::AppState;
use crate::auth::{KeyKind, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::routes::{PageQuery, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new().get("/api/incidents", READ, list).post(
        "/api/incidents/{id}/resolve",
        WRITE,
        resolve,
    )
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, resolve))]
pub(crate) struct Api;

/// An incident as `key` may see it.
fn view(incident: &Incident, key: KeyKind) -> Value {
    let mut body = json!({
        "id": incident.id,
        "title": incident.title,
        "impact": incident.impact,
        "status": incident.status,
        "occurrences": incident.occurrences,
        "ticket_id": incident.ticket_id,
        "created_at": rfc3339::format(incident.created_at),
        "updated_at": rfc3339::format(incident.updated_at),
        "resolved_at": rfc3339::format_opt(incident.resolved_at),
    });
    if key == KeyKind::Platform {
        body["detail"] = incident.detail.clone();
        body["source"] = json!(incident.source);
        body["run_id"] = json!(incident.run_id);
    }
    body
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[utoipa::path(get, path = "/api/incidents", tag = "incidents", responses((status = 200, body = crate::openapi::schemas::IncidentPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, key): Tenant,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    if let Some(status) = query.status.as_deref()
        && !matches!(status, "open" | "resolved")
    {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("status `{status}` is not one of open, resolved"),
        ));
    }
    let page = PageQuery {
        limit: query.limit,
        cursor: query.cursor,
    };
    let incidents = state
        .engine
        .store()
        .incidents(
            &tenant,
            query.status.as_deref(),
            page.limit()?,
            page.after("incidents")?.as_deref(),
        )
        .await?;
    let items: Vec<Value> = incidents.items.iter().map(|i| view(i, key)).collect();
    Ok(Json(crate::routes::page(
        "incidents",
        items,
        incidents.next_cursor.as_deref(),
    )))
}

#[utoipa::path(post, path = "/api/incidents/{id}/resolve", tag = "incidents", responses((status = 200, body = crate::openapi::schemas::Incident)))]
async fn resolve(
    State(state): State<AppState>,
    Tenant(tenant, key): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let incident = find(&state, &tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("incident"))?;
    let resolved =
        incident.status == "open" && state.engine.store().resolve_incident(&tenant, &id).await?;
    if !resolved {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_resolved",
            format!("incident {id} is already resolved"),
        ));
    }
    let incident = find(&state, &tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("incident"))?;
    Ok(Json(view(&incident, key)))
}

async fn find(state: &AppState, tenant: &TenantId, id: &str) -> ApiResult<Option<Incident>> {
    Ok(state.engine.store().incident(tenant, id).await?)
}
