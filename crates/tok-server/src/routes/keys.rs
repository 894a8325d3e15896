//! A tenant's API keys: made with a name and scopes (and an end, if
//! wanted), listed without their secrets, revoked at once on every
//! process. The secret is in the answer that makes the key, and nowhere
//! after: only its SHA-256 is kept. A tenant keeps at least one admin key
//! that has not expired, so that someone can still manage its keys.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::{ApiKey, NewKey, Revoked, Scope, hash_secret, random_token, rfc3339};

use crate::AppState;
use crate::audit::AuditNote;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{ADMIN, JsonBody, Path, Routes};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/keys", ADMIN, list)
        .post("/api/keys", ADMIN, create)
        .delete("/api/keys/{id}", ADMIN, revoke)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, revoke))]
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

/// Makes a key; the answer holds its secret (`key`), shown this once.
#[utoipa::path(post, path = "/api/keys", tag = "keys", responses((status = 201, body = crate::openapi::schemas::NewApiKey)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewKeyBody>,
) -> ApiResult<(StatusCode, AuditNote, Json<Value>)> {
    let name = body.name.trim().to_owned();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid(
            "name",
            format!("`name` must have 1 to {MAX_NAME_CHARS} characters: what the key is for"),
        ));
    }
    let known = || {
        Scope::ALL
            .iter()
            .map(|s| format!("`{}`", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if body.scopes.is_empty() {
        return Err(invalid(
            "scopes",
            format!("`scopes` must list at least one of {}", known()),
        ));
    }
    let mut scopes = Vec::with_capacity(body.scopes.len());
    for (i, text) in body.scopes.iter().enumerate() {
        let scope = Scope::parse(text).ok_or_else(|| {
            invalid(
                "scopes",
                format!("`scopes[{i}]` is `{text}`; a scope is one of {}", known()),
            )
        })?;
        scopes.push(scope);
    }
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
    let note = AuditNote(format!(
        "\u{201c}{}\u{201d} with {}",
        key.name,
        key.scopes
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut answer = view(&key);
    answer["key"] = json!(secret);
    Ok((StatusCode::CREATED, note, Json(answer)))
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
        Revoked::Done(key) => Ok((
            StatusCode::NO_CONTENT,
            AuditNote(format!("\u{201c}{}\u{201d}", key.name)),
            (),
        )),
        Revoked::NotFound => Err(ApiError::not_found("key")),
        Revoked::LastAdmin => Err(ApiError::new(
            StatusCode::CONFLICT,
            "last_admin_key",
            format!(
                "key `{id}` is the tenant's last admin key; make another key with the `admin` \
                 scope first, then revoke this one"
            ),
        )),
    }
}
