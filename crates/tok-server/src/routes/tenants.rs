//! `POST /api/tenants` (admin): creates a tenant and its first API key,
//! which is shown once and stored only as a hash. `GET /api/tenants`
//! (admin): every tenant, for the admin to pick one to act for.
//! `PATCH /api/tenants/{id}` (admin): changes a tenant's settings
//! (`suspended`: the built-in step authorizer denies a suspended tenant's
//! steps with side effects).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::ids::TenantId;
use tok_store::{TenantPatch, hash_secret, random_token};

use crate::AppState;
use crate::auth::Admin;
use crate::error::{ApiError, ApiResult};
use crate::routes::JsonBody;

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/tenants", get(list).post(create))
        .route("/api/tenants/{id}", axum::routing::patch(update))
}

#[derive(Deserialize)]
struct NewTenant {
    name: String,
}

async fn create(
    State(state): State<AppState>,
    _admin: Admin,
    JsonBody(body): JsonBody<NewTenant>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = body.name.trim();
    if name.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_body",
            "`name` must not be empty",
        ));
    }
    let api_key = format!("tok_{}", random_token());
    let tenant = state
        .engine
        .store()
        .create_tenant(name, &hash_secret(&api_key))
        .await?;
    state.engine.refresh_tenants().await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": tenant.id, "name": tenant.name, "api_key": api_key })),
    ))
}

async fn list(State(state): State<AppState>, _admin: Admin) -> ApiResult<Json<Value>> {
    let store = state.engine.store();
    let mut items = Vec::new();
    for id in store.tenant_ids().await? {
        if let Some(tenant) = store.tenant(&id).await? {
            items.push(shown(&tenant));
        }
    }
    Ok(Json(json!({ "items": items, "next_cursor": null })))
}

/// A tenant as the admin sees it.
fn shown(tenant: &tok_store::Tenant) -> Value {
    json!({ "id": tenant.id, "name": tenant.name, "suspended": tenant.suspended })
}

/// The settings `PATCH /api/tenants/{id}` may change; a field left out
/// stays as it is, a field not listed here is refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Changes {
    suspended: Option<bool>,
}

async fn update(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Changes>,
) -> ApiResult<Json<Value>> {
    let patch = TenantPatch {
        suspended: body.suspended,
    };
    let tenant = state
        .engine
        .store()
        .update_tenant(&TenantId::from(id), patch)
        .await?
        .ok_or_else(|| ApiError::not_found("tenant"))?;
    Ok(Json(shown(&tenant)))
}
