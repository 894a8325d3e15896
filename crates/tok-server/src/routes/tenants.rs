//! `POST /api/tenants` (admin): creates a tenant and its first API key,
//! which is shown once and stored only as a hash. `GET /api/tenants`
//! (admin): every tenant, for the admin to pick one to act for.
//! `PATCH /api/tenants/{id}` (admin): changes a tenant; each field of the
//! body is optional and changes only what it names (`suspended`: the
//! built-in step authorizer denies a suspended tenant's steps with side
//! effects; `settings.retention`: how long the tenant's data is kept,
//! DESIGN §10; `settings.limits`: its quotas, DESIGN §15, such as
//! `concurrency`, its steps in flight across every process; see
//! [`tok_core::quotas`]; `settings.webhooks.requireSignature`: no source
//! without a sender's signature and no unsigned webhook, DESIGN §15
//! "Senders").

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tok_core::ids::TenantId;
use tok_core::retention::Retention;
use tok_store::{TenantPatch, hash_secret, random_token};

use crate::AppState;
use crate::audit::AuditNote;
use crate::auth::Admin;
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, Path, Platform, Routes};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/tenants", Platform, list)
        .post("/api/tenants", Platform, create)
        .patch("/api/tenants/{id}", Platform, update)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, update))]
pub(crate) struct Api;

#[derive(Deserialize)]
struct NewTenant {
    name: String,
}

#[utoipa::path(post, path = "/api/tenants", tag = "tenants", responses((status = 201, body = crate::openapi::schemas::TenantCreated)))]
async fn create(
    State(state): State<AppState>,
    _admin: Admin,
    JsonBody(body): JsonBody<NewTenant>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = body.name.trim();
    if name.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_body",
            "`name` must not be empty",
        ));
    }
    let api_key = format!("tok_{}", random_token());
    let tenant = state
        .engine
        .store()
        .create_tenant(name, &hash_secret(&api_key))
        .await?;
    state.engine.refresh_tenants().await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": tenant.id, "name": tenant.name, "api_key": api_key })),
    ))
}

#[utoipa::path(get, path = "/api/tenants", tag = "tenants", responses((status = 200, body = crate::openapi::schemas::TenantPage)))]
async fn list(
    State(state): State<AppState>,
    _admin: Admin,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("tenants", query)?;
    let found = state
        .engine
        .store()
        .tenants(asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, shown))
}

/// A tenant as the admin sees it.
fn shown(tenant: &tok_store::Tenant) -> Value {
    json!({
        "id": tenant.id,
        "name": tenant.name,
        "suspended": tenant.suspended,
        "created_at": tok_store::rfc3339::format(tenant.created_at),
    })
}

/// What `PATCH /api/tenants/{id}` may change; every field is optional, a
/// field not listed here is refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantChange {
    suspended: Option<bool>,
    #[serde(default)]
    settings: Option<SettingsChange>,
}

/// `settings`: each setting named is changed, the others stay.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsChange {
    /// Some of `stepDataDays`, `runsDays`, `traceDays`, `inboxDays`, `auditDays`: the
    /// ones given replace the tenant's, the others stay.
    #[serde(default)]
    retention: Option<Map<String, Value>>,
    /// Some of `signalsPerSecond`, `streams`, `startsPerMinute`,
    /// `concurrency` ([`tok_core::quotas::TenantLimits`]): the ones
    /// given replace the tenant's (`null`: back to the default), the
    /// others stay.
    #[serde(default)]
    limits: Option<Map<String, Value>>,
    /// `requireSignature` ([`tok_store::WebhookSettings`]): `true` or
    /// `false` decide for the tenant, `null` leaves it to the platform's
    /// `TOK_REQUIRE_SIGNED_WEBHOOKS`.
    #[serde(default)]
    webhooks: Option<Map<String, Value>>,
}

#[utoipa::path(patch, path = "/api/tenants/{id}", tag = "tenants", responses((status = 200, body = crate::openapi::schemas::TenantChanged)))]
async fn update(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TenantChange>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    let store = state.engine.store();
    let id = TenantId::from(id);
    let Some(tenant) = store.tenant(&id).await? else {
        return Err(ApiError::not_found("tenant"));
    };
    // Every change is checked before any is written.
    let (retention_change, limits_change, webhooks_change) = match body.settings {
        Some(settings) => (settings.retention, settings.limits, settings.webhooks),
        None => (None, None, None),
    };
    let mut retention = store.retention(&id).await?.unwrap_or_default();
    if let Some(change) = retention_change.clone() {
        retention = changed_retention(retention, change)?;
    }
    let mut limits = tenant.limits.clone();
    if let Some(change) = &limits_change {
        limits.apply(change).map_err(|e| {
            ApiError::bad_request("invalid_settings", e.message).with("field", e.field)
        })?;
    }
    let webhooks = match &webhooks_change {
        Some(change) => Some(changed_webhooks(tenant.webhooks, change)?),
        None => None,
    };
    // The audit row names what changed: the fields, not their values.
    let mut changed = Vec::new();
    if let Some(suspended) = body.suspended {
        changed.push(format!("suspended: {suspended}"));
    }
    for (what, change) in [
        ("retention", &retention_change),
        ("limits", &limits_change),
        ("webhooks", &webhooks_change),
    ] {
        if let Some(change) = change {
            let names: Vec<&str> = change.keys().map(String::as_str).collect();
            changed.push(format!("{what}: {}", names.join(", ")));
        }
    }
    let note = AuditNote(match changed.is_empty() {
        true => "nothing changed".to_owned(),
        false => changed.join("; "),
    });
    let patch = TenantPatch {
        suspended: body.suspended,
        limits: limits_change.is_some().then(|| limits.clone()),
        webhooks,
    };
    let tenant = if patch == TenantPatch::default() {
        tenant
    } else {
        store
            .update_tenant(&id, patch)
            .await?
            .ok_or_else(|| ApiError::not_found("tenant"))?
    };
    if retention_change.is_some() && !store.set_retention(&id, &retention).await? {
        return Err(ApiError::not_found("tenant"));
    }
    state.engine.tenant_changed(&id);
    state.quotas.tenant_changed(&id);
    // Its webhooks read the setting afresh (other processes within the
    // sources' cache time).
    state.sources.forget_tenant(&id);
    let mut shown = shown(&tenant);
    shown["settings"] = json!({
        "retention": retention,
        "limits": tenant.limits.in_force(),
        "webhooks": {
            "requireSignature": tenant.webhooks.require_signature,
            "inForce": tenant.webhooks.requires_signature(state.require_signed_webhooks),
        },
    });
    Ok((note, Json(shown)))
}

/// `current` with the fields of `change` (`settings.webhooks`), checked.
fn changed_webhooks(
    current: tok_store::WebhookSettings,
    change: &Map<String, Value>,
) -> ApiResult<tok_store::WebhookSettings> {
    let mut merged = match serde_json::to_value(current) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    for (key, value) in change {
        if value.is_null() {
            merged.remove(key);
        } else {
            merged.insert(key.clone(), value.clone());
        }
    }
    serde_json::from_value(Value::Object(merged)).map_err(|e| {
        ApiError::bad_request(
            "invalid_settings",
            format!("settings.webhooks: {e}; expected requireSignature: true, false or null"),
        )
        .with("field", "settings.webhooks")
    })
}

/// `current` with the fields of `change`, checked.
fn changed_retention(current: Retention, change: Map<String, Value>) -> ApiResult<Retention> {
    let invalid = |message: String| {
        ApiError::bad_request("invalid_settings", message).with("field", "settings.retention")
    };
    let mut merged = match serde_json::to_value(current) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    merged.extend(change);
    let retention: Retention = serde_json::from_value(Value::Object(merged)).map_err(|e| {
        invalid(format!(
            "settings.retention: {e}; expected whole days in stepDataDays, runsDays, traceDays, inboxDays, auditDays"
        ))
    })?;
    retention
        .validate()
        .map_err(|e| invalid(format!("settings.{e}")))?;
    Ok(retention)
}
