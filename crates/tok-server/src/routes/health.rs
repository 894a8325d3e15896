//! `/healthz` answers as soon as the server listens; `/readyz` once the
//! migrations ran and while the database answers, until a shutdown began.
//! On a worker node `/readyz` also needs the worker pool to claim work.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::AppState;
use crate::routes::{Public, Routes};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/healthz", Public, healthz)
        .get("/readyz", Public, readyz)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(healthz, readyz))]
pub(crate) struct Api;

#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, body = crate::openapi::schemas::Health)))]
async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

#[utoipa::path(get, path = "/readyz", tag = "health", responses((status = 200, body = crate::openapi::schemas::Health), (status = 503, description = "Starting, stopping, the database does not answer, or (a worker node) its claims fail", body = crate::openapi::schemas::Health)))]
async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    if state.is_stopping() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "stopping" })),
        );
    }
    if !state.is_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "starting" })),
        );
    }
    if state.ready_when_claiming
        && let Err(why) = state.engine.claims_work()
    {
        // The reason is logged, not answered: the probe is public, and a
        // claim's error may name the database.
        tracing::warn!(%why, "readiness check failed");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not claiming" })),
        );
    }
    match state.engine.store().ping().await {
        Ok(()) => (StatusCode::OK, Json(json!({ "status": "ready" }))),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "database unavailable" })),
            )
        }
    }
}
