//! Who is calling and what they may do: `Authorization: Bearer <key>`,
//! looked up by its SHA-256 on every request (no cache, so a revoked key
//! is refused by every process at once).
//!
//! [`authorize`] runs before every handler. It reads the route's
//! [`Access`] from the router's own table, refuses a caller without it
//! (401 for no key, an unknown, revoked or expired one; 403 `admin_only`
//! or `scope_missing` naming the scope), and hands the key to the
//! extractors below. A tenant key acts for its tenant only. The platform
//! admin key manages tenants and may act for one with `X-Tok-Tenant: <id>`,
//! with every scope, but not for one being deleted (410 `tenant_deleted`;
//! that tenant's own keys were revoked when its deletion was asked).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tok_core::ids::TenantId;
use tok_store::{ApiKey, KeyOwner, Scope, hash_secret};

use crate::AppState;
use crate::error::ApiError;
use crate::routes::{Access, Route};

/// A caller with a valid key that the route's access admits.
#[derive(Clone)]
pub(crate) struct Caller(pub(crate) ApiKey);

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

/// The bearer key of a request's headers. The scheme is case-insensitive
/// (RFC 9110 §11.1): `bearer` is `Bearer`.
pub(crate) fn bearer_of(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim())
        .filter(|key| !key.is_empty())
}

/// The route table by method and path, for [`authorize`].
#[derive(Clone)]
pub(crate) struct Authorizer {
    state: AppState,
    access: Arc<HashMap<(Method, &'static str), Access>>,
}

impl Authorizer {
    pub(crate) fn new(state: AppState, table: &[Route]) -> Self {
        let access = table
            .iter()
            .map(|r| ((r.method.clone(), r.path), r.access))
            .collect();
        Self {
            state,
            access: Arc::new(access),
        }
    }

    /// The access of a matched route; HEAD is GET's. A route missing from
    /// the table cannot be served (every route is added with its access),
    /// but would get the strictest.
    fn access(&self, method: &Method, path: &str) -> Access {
        let method = if method == Method::HEAD {
            Method::GET
        } else {
            method.clone()
        };
        self.access
            .get(&(method, path))
            .copied()
            .unwrap_or(Access::Platform)
    }
}

/// Checks the caller against the route's [`Access`] before the handler
/// runs; the key goes on to the handler's extractors as a [`Caller`].
pub(crate) async fn authorize(
    State(auth): State<Authorizer>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(path) = request.extensions().get::<MatchedPath>().cloned() else {
        return next.run(request).await;
    };
    let access = auth.access(request.method(), path.as_str());
    if matches!(access, Access::Public | Access::OwnSecret) {
        return next.run(request).await;
    }
    match admit(&auth.state, request.headers(), access).await {
        Ok(key) => {
            request.extensions_mut().insert(Caller(key));
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

async fn admit(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    access: Access,
) -> Result<ApiKey, ApiError> {
    let secret = bearer_of(headers).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send your API key as `Authorization: Bearer <key>`",
        )
    })?;
    let key = valid_key(state, secret).await?.ok_or_else(not_valid)?;
    match access {
        Access::Platform if key.tenant_id.is_some() => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin_only",
            "this needs the platform admin key",
        )),
        Access::Tenant(scope) if !key.grants(scope) => Err(scope_missing(&key, scope)),
        _ => Ok(key),
    }
}

fn not_valid() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "the API key is not valid",
    )
}

fn scope_missing(key: &ApiKey, scope: Scope) -> ApiError {
    let held: Vec<&str> = key.scopes.iter().map(|s| s.as_str()).collect();
    ApiError::new(
        StatusCode::FORBIDDEN,
        "scope_missing",
        format!(
            "this needs a key with the `{}` scope; key `{}` has {}",
            scope.as_str(),
            key.name,
            if held.is_empty() {
                "none".to_owned()
            } else {
                held.iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
    )
    .with("scope", scope.as_str())
}

/// The key with this secret unless it is revoked; an expired key is a 401
/// that says so. Its use is noted (at most once a minute per process).
pub(crate) async fn valid_key(state: &AppState, secret: &str) -> Result<Option<ApiKey>, ApiError> {
    let Some(key) = state
        .engine
        .store()
        .key_by_hash(&hash_secret(secret))
        .await?
    else {
        return Ok(None);
    };
    let now = tok_store::now_ms();
    if key.expired(now) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "key_expired",
            format!(
                "the API key `{}` expired at {}; make a new one",
                key.name,
                tok_store::rfc3339::format(key.expires_at.unwrap_or(now))
            ),
        ));
    }
    if state.key_uses.due(&key.id) {
        let store = state.engine.store().clone();
        let id = key.id.clone();
        tokio::spawn(async move {
            if let Err(e) = store.touch_key(&id, now).await {
                tracing::debug!(key = %id, error = %e, "could not note a key's last use");
            }
        });
    }
    Ok(Some(key))
}

/// When this process last wrote each key's `last_used_at`: a key in use
/// costs one write a minute, not one per request.
#[derive(Default)]
pub(crate) struct KeyUses(Mutex<HashMap<String, Instant>>);

/// How often a key's `last_used_at` is written while it is in use.
const KEY_USE_EVERY: Duration = Duration::from_secs(60);

impl KeyUses {
    /// Whether the key's use is due to be written; if so, it is noted as
    /// written now.
    fn due(&self, id: &str) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if seen.get(id).is_some_and(|at| now - *at < KEY_USE_EVERY) {
            return false;
        }
        if seen.len() > 100_000 {
            seen.clear();
        }
        seen.insert(id.to_owned(), now);
        true
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &AppState) -> Result<Self, ApiError> {
        // Put there by `authorize`, for every route that is not public.
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send your API key as `Authorization: Bearer <key>`",
            )
        })
    }
}

impl FromRequestParts<AppState> for KeyActor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(key) = Caller::from_request_parts(parts, state).await?;
        Ok(KeyActor(serde_json::json!({ "kind": "key", "id": key.id })))
    }
}

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(key) = Caller::from_request_parts(parts, state).await?;
        match key.owner() {
            KeyOwner::Tenant(id) => Ok(Tenant(id, KeyKind::Tenant)),
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
                match state.engine.store().tenant(&id).await? {
                    None => return Err(ApiError::not_found("tenant")),
                    Some(tenant) if tenant.deleting() => {
                        return Err(crate::routes::tenants::being_deleted(&id));
                    }
                    Some(_) => {}
                }
                Ok(Tenant(id, KeyKind::Platform))
            }
        }
    }
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(key) = Caller::from_request_parts(parts, state).await?;
        match key.owner() {
            KeyOwner::Platform => Ok(Admin),
            KeyOwner::Tenant(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "admin_only",
                "this needs the platform admin key",
            )),
        }
    }
}
