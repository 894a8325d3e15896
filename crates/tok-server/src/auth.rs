//! Who is calling: `Authorization: Bearer <key>`, looked up by its SHA-256.
//! A tenant key acts for its tenant only. The platform admin key manages
//! tenants and may act for one with `X-Tok-Tenant: <id>`.

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use tok_core::ids::TenantId;
use tok_store::{KeyOwner, hash_secret};

use crate::AppState;
use crate::error::ApiError;

/// A caller with a valid key.
pub(crate) struct Caller(pub(crate) KeyOwner);

/// The tenant a request acts for, and with which kind of key: the platform
/// admin acting for a tenant (`X-Tok-Tenant`) may see more than the
/// tenant's own keys do (an incident's detail).
pub(crate) struct Tenant(pub(crate) TenantId, pub(crate) KeyKind);

/// Which kind of key a request acting for a tenant was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    /// One of the tenant's own keys.
    Tenant,
    /// The platform admin key, acting for the tenant with `X-Tok-Tenant`.
    Platform,
}

/// A caller holding the platform admin key.
pub(crate) struct Admin;

/// The key a request was made with, as a run's or a decision's `actor`:
/// `{"kind": "key", "id": "key_…"}` (the key's id, never the key).
pub(crate) struct KeyActor(pub(crate) serde_json::Value);

/// The bearer key of a request. The scheme is case-insensitive (RFC 9110
/// §11.1): `bearer` is `Bearer`.
fn bearer(parts: &Parts) -> Option<&str> {
    bearer_of(&parts.headers)
}

/// [`bearer`] of a request's headers.
pub(crate) fn bearer_of(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim())
        .filter(|key| !key.is_empty())
}

impl FromRequestParts<AppState> for KeyActor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let hash = hash_secret(bearer(parts).unwrap_or_default());
        match state.engine.store().key_id(&hash).await? {
            Some(id) => Ok(KeyActor(serde_json::json!({ "kind": "key", "id": id }))),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the API key is not valid",
            )),
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = bearer(parts).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send your API key as `Authorization: Bearer <key>`",
            )
        })?;
        let owner = state.engine.store().key_owner(&hash_secret(key)).await?;
        owner.map(Caller).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the API key is not valid",
            )
        })
    }
}

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(owner) = Caller::from_request_parts(parts, state).await?;
        match &owner {
            KeyOwner::Tenant(id) => Ok(Tenant(id.clone(), KeyKind::Tenant)),
            KeyOwner::Platform => {
                let id = parts
                    .headers
                    .get("x-tok-tenant")
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "tenant_required",
                            "the admin key acts for a tenant only with the header `X-Tok-Tenant: <tenant id>`",
                        )
                    })?;
                let id = TenantId::from(id.trim());
                if state.engine.store().tenant(&id).await?.is_none() {
                    return Err(ApiError::not_found("tenant"));
                }
                Ok(Tenant(id, KeyKind::Platform))
            }
        }
    }
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match Caller::from_request_parts(parts, state).await? {
            Caller(KeyOwner::Platform) => Ok(Admin),
            Caller(KeyOwner::Tenant(_)) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "admin_only",
                "this needs the platform admin key",
            )),
        }
    }
}
