//! Webhook sources: a name, a contract (params with the dot paths where the
//! sender puts them), optionally a JSON Schema for the whole body and the
//! sender whose signature it checks (`verify: {preset, secret}`), and a
//! token that makes the URL. A source is changed with `PATCH`, its token
//! and signing secret rotate (what they replace stays valid for the
//! overlap asked, none by default), and it is deleted once no automation's
//! trigger names it. A tenant that requires signed webhooks
//! (`settings.webhooks.requireSignature`, else `TOK_REQUIRE_SIGNED_WEBHOOKS`)
//! creates no source without `verify`.

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
use crate::senders::Preset;

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
    /// A Standard Webhooks secret: `verify: {preset: "standard", secret}`
    /// as it was written before senders had names.
    secret: Option<String>,
    verify: Option<VerifyBody>,
    /// A JSON Schema (draft 2020-12) every body must meet.
    schema: Option<Value>,
}

/// `verify`: the sender whose signature the source checks, and the secret
/// the sender signs with.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyBody {
    preset: String,
    secret: String,
}

impl VerifyBody {
    /// The preset and the secret, checked.
    fn checked(self) -> ApiResult<(Preset, String)> {
        let preset = Preset::parse(&self.preset).ok_or_else(|| {
            let names: Vec<&str> = Preset::ALL.iter().map(|p| p.as_str()).collect();
            invalid(format!(
                "`verify.preset` is `{}`; expected one of {}",
                self.preset.chars().take(40).collect::<String>(),
                names.join(", ")
            ))
            .with("field", "verify.preset")
        })?;
        checked_secret(preset, &self.secret, "verify.secret")?;
        Ok((preset, self.secret))
    }
}

fn view(state: &AppState, source: &Source) -> Value {
    let preset = source
        .secret
        .as_ref()
        .map(|_| source.verify_preset.as_deref().unwrap_or("standard"));
    json!({
        "id": source.id,
        "name": source.name,
        "token": source.token,
        "url": state.webhook_url(&source.token),
        "params": source.params,
        "schema": source.schema,
        "critical": source.critical,
        "rate_limit": source.rate_limit,
        "signed": source.secret.is_some(),
        // The sender whose signature is checked; never its secret.
        "verify": preset.map(|preset| json!({ "preset": preset })),
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

/// A sender's signing secret as `preset` hands it out (`field` names it in
/// the request).
fn checked_secret(preset: Preset, secret: &str, field: &str) -> ApiResult<()> {
    preset
        .check_secret(secret)
        .map_err(|why| invalid(format!("`{field}` {why}")).with("field", field))
}

/// The schema, compiled and weighed to be sure it may be kept, on a
/// blocking thread (it may take tens of milliseconds), not on the threads
/// that serve requests.
async fn checked_schema(schema: Option<&Value>) -> ApiResult<()> {
    if let Some(schema) = schema {
        crate::routes::storable_json("`schema`", schema)?;
        let schema = schema.clone();
        let compiled =
            tokio::task::spawn_blocking(move || crate::body_schema::compile(&schema).map(drop));
        match compiled.await {
            Ok(checked) => checked?,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    Ok(())
}

/// Whether the tenant requires its webhooks signed: its own setting, else
/// the platform's default.
async fn requires_signature(state: &AppState, tenant: &tok_core::ids::TenantId) -> ApiResult<bool> {
    let tenant = state.engine.store().tenant(tenant).await?;
    Ok(tenant.map_or(state.require_signed_webhooks, |t| {
        t.webhooks.requires_signature(state.require_signed_webhooks)
    }))
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
    let verify = match (body.verify, body.secret) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "give `verify: {preset, secret}` or the older `secret` (a Standard Webhooks secret), not both",
            )
            .with("field", "secret"));
        }
        (Some(verify), None) => Some(verify.checked()?),
        (None, Some(secret)) => {
            checked_secret(Preset::Standard, &secret, "secret")?;
            Some((Preset::Standard, secret))
        }
        (None, None) => None,
    };
    checked_schema(body.schema.as_ref()).await?;
    checked_rate_limit(body.rate_limit)?;
    if verify.is_none() && requires_signature(&state, &tenant).await? {
        return Err(ApiError::bad_request(
            "signature_required",
            "this tenant accepts signed webhooks only: give the source `verify: {\"preset\": \"standard\" | \"stripe\" | \"github\" | \"shopify\" | \"slack\", \"secret\": \"…\"}`",
        )
        .with("field", "verify"));
    }
    let (verify_preset, secret) = match verify {
        Some((preset, secret)) => (Some(preset.as_str().to_owned()), Some(secret)),
        None => (None, None),
    };
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
                secret,
                verify_preset,
                schema: body.schema,
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
/// `verify` gives a source that checks no signature a sender; a signed
/// source's secret rotates instead, and its sender stays.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SourcePatchBody {
    name: Option<String>,
    params: Option<Vec<Param>>,
    critical: Option<bool>,
    /// `null` removes the limit.
    #[serde(default, deserialize_with = "super::present")]
    rate_limit: Option<Option<i32>>,
    /// `null` removes the schema.
    #[serde(default, deserialize_with = "super::present")]
    schema: Option<Option<Value>>,
    verify: Option<VerifyBody>,
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
    checked_schema(body.schema.as_ref().and_then(Option::as_ref)).await?;
    let id = SourceId::from(id);
    let verify = match body.verify {
        Some(verify) => {
            let (preset, secret) = verify.checked()?;
            let current = state
                .engine
                .store()
                .source(&tenant, &id)
                .await?
                .ok_or_else(|| ApiError::not_found("source"))?;
            if current.secret.is_some() {
                return Err(invalid(
                    "the source already checks a sender's signature; its secret rotates with POST /api/sources/{id}/rotate {\"secret\", \"overlap\"}, and another sender needs a source of its own",
                )
                .with("field", "verify"));
            }
            Some((preset.as_str().to_owned(), secret))
        }
        None => None,
    };
    let patch = SourcePatch {
        name,
        params: body
            .params
            .map(|p| serde_json::to_value(p).unwrap_or(Value::Array(Vec::new()))),
        critical: body.critical,
        rate_limit: body.rate_limit,
        schema: body.schema,
        verify,
    };
    let source = state
        .engine
        .store()
        .update_source(&tenant, &id, patch)
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
    crate::routes::JsonBytes(body): crate::routes::JsonBytes,
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
    let rotate_token = body.token.unwrap_or(true);
    if !rotate_token && body.secret.is_none() {
        return Err(invalid(
            "nothing to rotate: `token` is false and no new `secret` is given",
        ));
    }
    let id = SourceId::from(id);
    let store = state.engine.store();
    if let Some(secret) = &body.secret {
        let source = store
            .source(&tenant, &id)
            .await?
            .ok_or_else(|| ApiError::not_found("source"))?;
        if source.secret.is_none() {
            return Err(invalid(
                "the source is not signed (it checks no sender's signature), so it has no \
                 secret to rotate; give it one with PATCH /api/sources/{id} {\"verify\": {\"preset\", \"secret\"}}",
            ));
        }
        // The new secret is the same sender's: checked as that sender's.
        let preset = source
            .verify_preset
            .as_deref()
            .and_then(Preset::parse)
            .unwrap_or(Preset::Standard);
        checked_secret(preset, secret, "secret")?;
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
