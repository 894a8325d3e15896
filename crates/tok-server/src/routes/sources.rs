//! Webhook sources: a name, a contract (params with the dot paths where the
//! sender puts them) and a token that makes the URL. A source is changed
//! with `PATCH`, its token and signing secret rotate (what they replace
//! stays valid for the overlap asked, none by default), and it is deleted
//! once no automation's trigger names it.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::contract::{self, Param};
use tok_core::ids::SourceId;
use tok_core::uses::Kind;
use tok_store::{NewSource, Source, SourcePatch, SourceRotation, random_token};

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::in_use::{automations_using, refuse_if_used};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/sources", READ, list)
        .post("/api/sources", WRITE, create)
        .get("/api/sources/{id}", READ, show)
        .patch("/api/sources/{id}", WRITE, update)
        .delete("/api/sources/{id}", WRITE, delete)
        .post("/api/sources/{id}/rotate", WRITE, rotate)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, show, update, delete, rotate))]
pub(crate) struct Api;

/// The longest overlap a rotation keeps the replaced token or secret for.
const MAX_OVERLAP: Duration = Duration::from_secs(7 * 24 * 3600);

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
        // Until when the token and the secret before the last rotation
        // still work (null: none does).
        "previous_token_expires_at": live(source.previous_token_until),
        "previous_secret_expires_at": live(source.previous_secret_until),
        "created_at": tok_store::rfc3339::format(source.created_at),
    })
}

/// An overlap's end while it lasts; null once it is over.
fn live(until: Option<i64>) -> Value {
    json!(tok_store::rfc3339::format_opt(
        until.filter(|&u| u > tok_store::now_ms())
    ))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_body", message)
}

fn checked_name(name: &str) -> ApiResult<String> {
    match name.trim() {
        "" => Err(invalid("`name` must not be empty")),
        name => Ok(name.to_owned()),
    }
}

fn checked_rate_limit(rate_limit: Option<i32>) -> ApiResult<()> {
    if rate_limit.is_some_and(|r| r <= 0) {
        return Err(invalid(
            "`rate_limit` is requests per second and must be positive",
        ));
    }
    Ok(())
}

/// A Standard Webhooks signing secret: `whsec_<base64>` or a plain string,
/// of at least 16 bytes either way.
fn checked_secret(secret: &str) -> ApiResult<()> {
    use base64::Engine as _;
    let key_len = match secret.strip_prefix("whsec_") {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| invalid("`secret` starts with whsec_ but the rest is not base64"))?
            .len(),
        None => secret.len(),
    };
    if key_len < 16 {
        return Err(invalid(
            "`secret` must hold at least 16 bytes (Standard Webhooks: whsec_<base64>)",
        ));
    }
    Ok(())
}

#[utoipa::path(post, path = "/api/sources", tag = "sources", responses((status = 201, body = crate::openapi::schemas::Source)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewSourceBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = checked_name(&body.name)?;
    contract::validate_params(&body.params)
        .map_err(|message| ApiError::bad_request("invalid_params", message))?;
    if let Some(secret) = &body.secret {
        checked_secret(secret)?;
    }
    checked_rate_limit(body.rate_limit)?;
    let source = state
        .engine
        .store()
        .create_source(
            &tenant,
            NewSource {
                name,
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

/// A change to a source: any of its fields but the token and the secret,
/// which rotate (`POST /api/sources/{id}/rotate`). An absent field stays.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SourcePatchBody {
    name: Option<String>,
    params: Option<Vec<Param>>,
    critical: Option<bool>,
    /// `null` removes the limit.
    #[serde(default, deserialize_with = "super::present")]
    rate_limit: Option<Option<i32>>,
}

#[utoipa::path(patch, path = "/api/sources/{id}", tag = "sources", responses((status = 200, body = crate::openapi::schemas::Source)))]
async fn update(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<SourcePatchBody>,
) -> ApiResult<Json<Value>> {
    let name = body.name.as_deref().map(checked_name).transpose()?;
    if let Some(params) = &body.params {
        contract::validate_params(params)
            .map_err(|message| ApiError::bad_request("invalid_params", message))?;
    }
    checked_rate_limit(body.rate_limit.flatten())?;
    let patch = SourcePatch {
        name,
        params: body
            .params
            .map(|p| serde_json::to_value(p).unwrap_or(Value::Array(Vec::new()))),
        critical: body.critical,
        rate_limit: body.rate_limit,
    };
    let source = state
        .engine
        .store()
        .update_source(&tenant, &SourceId::from(id), patch)
        .await?
        .ok_or_else(|| ApiError::not_found("source"))?;
    state.sources.forget(&source.id);
    Ok(Json(view(&state, &source)))
}

#[utoipa::path(delete, path = "/api/sources/{id}", tag = "sources", responses((status = 204, description = "deleted: its URLs answer 404"), (status = 409, description = "an automation's trigger names the source (`in_use`, with `used_by`)", body = crate::openapi::ErrorBody)))]
async fn delete(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = SourceId::from(id);
    let store = state.engine.store();
    let source = store
        .source(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("source"))?;
    let users = automations_using(&state, &tenant, Kind::Source, id.as_str(), &source.name).await?;
    refuse_if_used(&format!("source `{}`", source.name), &users)?;
    if !store.delete_source(&tenant, &id).await? {
        return Err(ApiError::not_found("source"));
    }
    state.sources.forget(&id);
    Ok(StatusCode::NO_CONTENT)
}

/// What a rotation replaces, and for how long the replaced one still works.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RotateBody {
    /// How long the token (and secret) before stay valid: `30m`, `24h`, at
    /// most `7d`. None by default: the old URL answers 404 at once.
    overlap: Option<String>,
    /// Whether the token (and so the URL) rotates; true by default.
    token: Option<bool>,
    /// The new signing secret, when the sender's secret rotates: during the
    /// overlap a webhook signed with either is accepted.
    secret: Option<String>,
}

#[utoipa::path(post, path = "/api/sources/{id}/rotate", tag = "sources", responses((status = 200, body = crate::openapi::schemas::Source)))]
async fn rotate(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    let body: RotateBody = if body.is_empty() {
        RotateBody::default()
    } else {
        JsonBody::<RotateBody>::parse(&body)?.0
    };
    let overlap = match body.overlap.as_deref() {
        None => Duration::ZERO,
        Some(text) => tok_core::duration::parse_duration(text)
            .map_err(|e| invalid(format!("`overlap`: {e}")))?,
    };
    if overlap > MAX_OVERLAP {
        return Err(invalid(format!(
            "`overlap` is {}; at most 7d is kept",
            body.overlap.as_deref().unwrap_or_default()
        )));
    }
    if let Some(secret) = &body.secret {
        checked_secret(secret)?;
    }
    let rotate_token = body.token.unwrap_or(true);
    if !rotate_token && body.secret.is_none() {
        return Err(invalid(
            "nothing to rotate: `token` is false and no new `secret` is given",
        ));
    }
    let id = SourceId::from(id);
    let store = state.engine.store();
    if body.secret.is_some() {
        let source = store
            .source(&tenant, &id)
            .await?
            .ok_or_else(|| ApiError::not_found("source"))?;
        if source.secret.is_none() {
            return Err(invalid(
                "the source is not signed, so it has no secret to rotate; a source's \
                 signing is chosen when it is created",
            ));
        }
    }
    let rotation = SourceRotation {
        token: rotate_token.then(random_token),
        secret: body.secret,
        until: tok_store::now_ms() + overlap.as_millis() as i64,
    };
    let source = store
        .rotate_source(&tenant, &id, rotation)
        .await?
        .ok_or_else(|| ApiError::not_found("source"))?;
    state.sources.forget(&source.id);
    Ok(Json(view(&state, &source)))
}
