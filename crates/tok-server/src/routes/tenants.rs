//! `POST /api/tenants` (admin): creates a tenant and its first API key,
//! which is shown once and stored only as a hash. `GET /api/tenants`
//! (admin): every tenant, for the admin to pick one to act for.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::{hash_secret, random_token};

use crate::AppState;
use crate::auth::Admin;
use crate::error::{ApiError, ApiResult};
use crate::routes::JsonBody;

pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/api/tenants", get(list).post(create))
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create))]
pub(crate) struct Api;

#[derive(Deserialize)]
struct NewTenant {
    name: String,
}

#[utoipa::path(post, path = "/api/tenants", tag = "tenants", responses((status = 201)))]
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

#[utoipa::path(get, path = "/api/tenants", tag = "tenants", responses((status = 200)))]
async fn list(State(state): State<AppState>, _admin: Admin) -> ApiResult<Json<Value>> {
    let store = state.engine.store();
    let mut items = Vec::new();
    for id in store.tenant_ids().await? {
        if let Some(tenant) = store.tenant(&id).await? {
            items.push(json!({ "id": tenant.id, "name": tenant.name }));
        }
    }
    Ok(Json(json!({ "items": items, "next_cursor": null })))
}
