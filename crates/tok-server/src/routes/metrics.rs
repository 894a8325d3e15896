//! `GET /metrics`: Prometheus text. Queue depth and the age of the oldest
//! ready job (busy versus stuck), steps per tenant (the noisy neighbour) and
//! by outcome, runs by outcome, inbox lag, connector calls and latency.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::error::ApiError;
use crate::routes::Routes;

pub(crate) fn router() -> Routes {
    Routes::new().get("/metrics", render)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(render))]
pub(crate) struct Api;

#[utoipa::path(get, path = "/metrics", tag = "metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
async fn render(State(state): State<AppState>) -> Response {
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
