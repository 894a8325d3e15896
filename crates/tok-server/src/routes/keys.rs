//! A tenant's API keys: made with a name and scopes (and an end, if
//! wanted), listed without their secrets, renamed or given other scopes,
//! revoked at once on every process. The secret is in the answer that makes the key, and nowhere
//! after: only its SHA-256 is kept. A tenant keeps at least one admin key
//! that has not expired, so that someone can still manage its keys.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::{ApiKey, KeyChange, KeyPatch, NewKey, Scope, hash_secret, random_token, rfc3339};

use crate::AppState;
use crate::audit::AuditNote;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{ADMIN, JsonBody, Path, Routes};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/keys", ADMIN, list)
        .post("/api/keys", ADMIN, create)
        .patch("/api/keys/{id}", ADMIN, update)
        .delete("/api/keys/{id}", ADMIN, revoke)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, update, revoke))]
pub(crate) struct Api;

/// The longest name a key may have.
const MAX_NAME_CHARS: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKeyBody {
    name: String,
    scopes: Vec<String>,
    /// RFC 3339; the key answers 401 `key_expired` from then on.
    expires_at: Option<String>,
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_body", message).with("field", field)
}

/// A key as listed: never its secret.
pub(crate) fn view(key: &ApiKey) -> Value {
    let now = tok_store::now_ms();
    json!({
        "id": key.id,
        "name": key.name,
        "scopes": key.scopes,
        "created_at": rfc3339::format(key.created_at),
        "expires_at": rfc3339::format_opt(key.expires_at),
        "expired": key.expired(now),
        "last_used_at": rfc3339::format_opt(key.last_used_at),
    })
}

fn checked_name(name: &str) -> ApiResult<String> {
    let name = name.trim().to_owned();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid(
            "name",
            format!("`name` must have 1 to {MAX_NAME_CHARS} characters: what the key is for"),
        ));
    }
    Ok(name)
}

fn checked_scopes(texts: &[String]) -> ApiResult<Vec<Scope>> {
    let known = || {
        Scope::ALL
            .iter()
            .map(|s| format!("`{}`", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if texts.is_empty() {
        return Err(invalid(
            "scopes",
            format!("`scopes` must list at least one of {}", known()),
        ));
    }
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            Scope::parse(text).ok_or_else(|| {
                invalid(
                    "scopes",
                    format!("`scopes[{i}]` is `{text}`; a scope is one of {}", known()),
                )
            })
        })
        .collect()
}

/// The 409 of a change that would leave the tenant without an admin key.
fn last_admin(id: &str, doing: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "last_admin_key",
        format!(
            "key `{id}` is the tenant's last admin key; make another key with the `admin` \
             scope first, then {doing}"
        ),
    )
}

/// The audit row's words for a key made or changed: its name and scopes.
fn note(key: &ApiKey) -> AuditNote {
    let scopes: Vec<&str> = key.scopes.iter().map(|s| s.as_str()).collect();
    AuditNote(format!(
        "\u{201c}{}\u{201d} with {}",
        key.name,
        scopes.join(", ")
    ))
}

/// Makes a key; the answer holds its secret (`key`), shown this once.
#[utoipa::path(post, path = "/api/keys", tag = "keys", responses((status = 201, body = crate::openapi::schemas::NewApiKey)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewKeyBody>,
) -> ApiResult<(StatusCode, AuditNote, Json<Value>)> {
    let name = checked_name(&body.name)?;
    let scopes = checked_scopes(&body.scopes)?;
    let expires_at = match body.expires_at.as_deref() {
        None => None,
        Some(text) => {
            let at = rfc3339::parse(text)
                .map_err(|e| invalid("expires_at", format!("`expires_at`: {e}")))?;
            if at <= tok_store::now_ms() {
                return Err(invalid(
                    "expires_at",
                    format!("`expires_at` {text} has passed; give a time to come"),
                ));
            }
            Some(at)
        }
    };
    let secret = format!("tok_{}", random_token());
    let key = state
        .engine
        .store()
        .create_key(
            &tenant,
            NewKey {
                name,
                scopes,
                expires_at,
                hash: hash_secret(&secret),
            },
        )
        .await?;
    let mut answer = view(&key);
    answer["key"] = json!(secret);
    Ok((StatusCode::CREATED, note(&key), Json(answer)))
}

/// The tenant's keys that are not revoked, oldest first.
#[utoipa::path(get, path = "/api/keys", tag = "keys", responses((status = 200, body = crate::openapi::schemas::ApiKeyPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("keys", query)?;
    let found = state
        .engine
        .store()
        .keys(&tenant, asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, view))
}

/// Revokes a key: from now on it answers 401 on every process. The
/// tenant's last admin key that has not expired stays (409).
#[utoipa::path(delete, path = "/api/keys/{id}", tag = "keys", responses((status = 204, description = "revoked")))]
async fn revoke(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, AuditNote, ())> {
    match state.engine.store().revoke_key(&tenant, &id).await? {
        KeyChange::Done(key) => Ok((
            StatusCode::NO_CONTENT,
            AuditNote(format!("\u{201c}{}\u{201d}", key.name)),
            (),
        )),
        KeyChange::NotFound => Err(ApiError::not_found("key")),
        KeyChange::LastAdmin => Err(last_admin(&id, "revoke this one")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyPatchBody {
    name: Option<String>,
    scopes: Option<Vec<String>>,
}

/// Renames a key or gives it other scopes, at once on every process (keys
/// are read on every request). Its secret stays; the tenant's last admin
/// key keeps `admin` (409).
#[utoipa::path(patch, path = "/api/keys/{id}", tag = "keys", responses((status = 200, body = crate::openapi::schemas::ApiKey), (status = 409, description = "it would take `admin` from the tenant's last admin key (`last_admin_key`)", body = crate::openapi::ErrorBody)))]
async fn update(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<KeyPatchBody>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    let patch = KeyPatch {
        name: body.name.as_deref().map(checked_name).transpose()?,
        scopes: body.scopes.as_deref().map(checked_scopes).transpose()?,
    };
    match state.engine.store().update_key(&tenant, &id, patch).await? {
        KeyChange::Done(key) => Ok((note(&key), Json(view(&key)))),
        KeyChange::NotFound => Err(ApiError::not_found("key")),
        KeyChange::LastAdmin => Err(last_admin(&id, "take `admin` from this one")),
    }
}
