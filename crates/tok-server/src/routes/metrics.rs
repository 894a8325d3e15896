//! `GET /metrics`: Prometheus text. Queue depth and the age of the oldest
//! ready job (busy versus stuck), steps per tenant (the noisy neighbour) and
//! by outcome, runs by outcome, inbox lag, connector calls and latency.
//!
//! The figures name every tenant, so they answer only the platform: the
//! admin key or `TOK_METRICS_TOKEN`, as `Authorization: Bearer …`; any
//! other caller, a tenant's key included, gets 401.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use tok_store::hash_secret;

use crate::AppState;
use crate::auth::bearer_of;
use crate::error::ApiError;
use crate::routes::{OwnSecret, Routes};

pub(crate) fn router() -> Routes {
    Routes::new().get("/metrics", OwnSecret, render)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(render))]
pub(crate) struct Api;

#[utoipa::path(get, path = "/metrics", tag = "metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain"), (status = 401, description = "neither the platform admin key nor `TOK_METRICS_TOKEN` (`unauthorized`)", body = crate::openapi::ErrorBody)))]
async fn render(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(refused) = scraper(&state, &headers).await {
        return refused.into_response();
    }
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "metrics_disabled",
            "this server was started without a metrics recorder",
        )
        .into_response(),
    }
}

/// Whether the caller holds the metrics token or the platform admin key.
async fn scraper(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let refused = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "`/metrics` answers only the platform admin key or TOK_METRICS_TOKEN, \
             sent as `Authorization: Bearer <token>`",
        )
    };
    let hash = hash_secret(bearer_of(headers).ok_or_else(refused)?);
    if state.metrics_token.as_deref() == Some(hash.as_str()) {
        return Ok(());
    }
    let secret = bearer_of(headers).unwrap_or_default();
    match crate::auth::valid_key(state, secret).await {
        Ok(Some(key)) if key.tenant_id.is_none() => Ok(()),
        _ => Err(refused()),
    }
}
