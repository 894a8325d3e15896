//! Webhook sources: a name, a contract (params with the dot paths where the
//! sender puts them) and a token that makes the URL.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::contract::{self, Param};
use tok_core::ids::SourceId;
use tok_store::{NewSource, Source, random_token};

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/sources", READ, list)
        .post("/api/sources", WRITE, create)
        .get("/api/sources/{id}", READ, show)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, show))]
pub(crate) struct Api;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSourceBody {
    name: String,
    #[serde(default)]
    params: Vec<Param>,
    #[serde(default)]
    critical: bool,
    rate_limit: Option<i32>,
    secret: Option<String>,
}

fn view(state: &AppState, source: &Source) -> Value {
    json!({
        "id": source.id,
        "name": source.name,
        "token": source.token,
        "url": state.webhook_url(&source.token),
        "params": source.params,
        "critical": source.critical,
        "rate_limit": source.rate_limit,
        "signed": source.secret.is_some(),
        "created_at": tok_store::rfc3339::format(source.created_at),
    })
}

#[utoipa::path(post, path = "/api/sources", tag = "sources", responses((status = 201, body = crate::openapi::schemas::Source)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewSourceBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    if body.name.trim().is_empty() {
        return Err(ApiError::bad_request(
            "invalid_body",
            "`name` must not be empty",
        ));
    }
    contract::validate_params(&body.params)
        .map_err(|message| ApiError::bad_request("invalid_params", message))?;
    if let Some(secret) = &body.secret {
        use base64::Engine as _;
        let key_len = match secret.strip_prefix("whsec_") {
            Some(encoded) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|_| {
                    ApiError::bad_request(
                        "invalid_body",
                        "`secret` starts with whsec_ but the rest is not base64",
                    )
                })?
                .len(),
            None => secret.len(),
        };
        if key_len < 16 {
            return Err(ApiError::bad_request(
                "invalid_body",
                "`secret` must hold at least 16 bytes (Standard Webhooks: whsec_<base64>)",
            ));
        }
    }
    if body.rate_limit.is_some_and(|r| r <= 0) {
        return Err(ApiError::bad_request(
            "invalid_body",
            "`rate_limit` is requests per second and must be positive",
        ));
    }
    let source = state
        .engine
        .store()
        .create_source(
            &tenant,
            NewSource {
                name: body.name.trim().to_owned(),
                token: random_token(),
                params: serde_json::to_value(&body.params).unwrap_or(Value::Array(Vec::new())),
                critical: body.critical,
                rate_limit: body.rate_limit,
                secret: body.secret,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(view(&state, &source))))
}

#[utoipa::path(get, path = "/api/sources", tag = "sources", responses((status = 200, body = crate::openapi::schemas::SourcePage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("sources", query)?;
    let found = state
        .engine
        .store()
        .sources_page(&tenant, asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, |s| view(&state, s)))
}

#[utoipa::path(get, path = "/api/sources/{id}", tag = "sources", responses((status = 200, body = crate::openapi::schemas::Source)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let source = state
        .engine
        .store()
        .source(&tenant, &SourceId::from(id))
        .await?
        .ok_or_else(|| ApiError::not_found("source"))?;
    Ok(Json(view(&state, &source)))
}
