//! Reads the dashboard needs beside the resources' own: who a key is
//! (`GET /api/dashboard/session`) and the tenant's queue right now
//! (`GET /api/dashboard/queue`). The runs listing is `runs.rs`'s.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use tok_store::KeyOwner;

use crate::AppState;
use crate::auth::{Caller, Tenant};
use crate::error::ApiResult;
use crate::routes::Routes;

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/dashboard/session", session)
        .get("/api/dashboard/queue", queue)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(session, queue))]
pub(crate) struct Api;

/// What kind of key signed in, and the tenant of a tenant's key.
#[utoipa::path(get, path = "/api/dashboard/session", tag = "dashboard", responses((status = 200, body = crate::openapi::schemas::Session)))]
async fn session(State(state): State<AppState>, Caller(owner): Caller) -> ApiResult<Json<Value>> {
    Ok(Json(match owner {
        KeyOwner::Platform => json!({ "kind": "admin", "tenant": null }),
        KeyOwner::Tenant(id) => {
            let tenant = state.engine.store().tenant(&id).await?;
            json!({
                "kind": "tenant",
                "tenant": { "id": id, "name": tenant.map(|t| t.name) },
            })
        }
    }))
}

/// The tenant's jobs by state, the age of its oldest ready job and its
/// events not yet dispatched.
#[utoipa::path(get, path = "/api/dashboard/queue", tag = "dashboard", responses((status = 200, body = crate::openapi::schemas::QueueHealth)))]
async fn queue(State(state): State<AppState>, Tenant(tenant, _): Tenant) -> ApiResult<Json<Value>> {
    let stats = state.engine.store().queue_stats(&[tenant]).await?;
    Ok(Json(json!({
        "ready": stats.ready,
        "scheduled": stats.scheduled,
        "running": stats.running,
        "pending_events": stats.pending_events,
        "oldest_ready_s": stats.oldest_ready_ms.map(|ms| ms as f64 / 1000.0),
        "sampled_at": jiff::Timestamp::now().to_string(),
    })))
}
