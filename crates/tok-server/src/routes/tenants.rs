//! `POST /api/tenants` (admin): creates a tenant and its first API key,
//! which is shown once and stored only as a hash. `GET /api/tenants`
//! (admin): every tenant, for the admin to pick one to act for;
//! `GET /api/tenants/{id}`: one, and while it is being deleted what is left
//! of it. `PATCH /api/tenants/{id}` (admin): changes a tenant; each field
//! of the body is optional and changes only what it names (`name`, checked
//! as at its creation; `suspended`: the built-in step authorizer denies a
//! suspended tenant's steps with side effects; `settings.retention`: how
//! long the tenant's data is kept, docs/operations.md; `settings.limits`:
//! its quotas, docs/security.md, such as `concurrency`, its steps in
//! flight across every process; see [`tok_core::quotas`];
//! `settings.webhooks.requireSignature`: no source without a sender's
//! signature and no unsigned webhook, docs/security.md "Senders").
//!
//! `DELETE /api/tenants/{id}` (admin): offboarding (docs/operations.md,
//! "Offboarding a tenant"). It answers 202 once the tenant is marked as
//! being deleted and its keys revoked (one transaction): from then on its
//! keys answer 401, its webhooks 404, the admin acting for it 410
//! `tenant_deleted`, and nothing of it starts. The scheduler erases its
//! rows in batches; `GET /api/tenants/{id}` shows `status: "deleting"` and
//! the rows left, then 404 once none is. Asked again, it answers the same.

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
        .get("/api/tenants/{id}", Platform, show)
        .patch("/api/tenants/{id}", Platform, update)
        .delete("/api/tenants/{id}", Platform, delete)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, show, update, delete))]
pub(crate) struct Api;

#[derive(Deserialize)]
struct NewTenant {
    name: String,
}

/// The longest tenant name, in characters.
const MAX_NAME_CHARS: usize = 200;

/// A tenant's name as given at its creation or a rename: trimmed, not
/// empty, at most [`MAX_NAME_CHARS`] characters, no control characters.
fn checked_name(name: &str) -> ApiResult<&str> {
    let name = name.trim();
    let invalid =
        |message: String| ApiError::bad_request("invalid_body", message).with("field", "name");
    if name.is_empty() {
        return Err(invalid("`name` must not be empty".into()));
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid(format!(
            "`name` is longer than {MAX_NAME_CHARS} characters"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid(
            "`name` must not hold control characters (line breaks, tabs, U+0000…)".into(),
        ));
    }
    Ok(name)
}

/// What the admin gets for a tenant that is being deleted, but from the
/// routes that follow or repeat its deletion.
pub(crate) fn being_deleted(id: &TenantId) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "tenant_deleted",
        format!(
            "tenant {id} is being deleted: nothing of it can be read or changed; \
             GET /api/tenants/{id} shows what is left of it"
        ),
    )
}

#[utoipa::path(post, path = "/api/tenants", tag = "tenants", responses((status = 201, body = crate::openapi::schemas::TenantCreated)))]
async fn create(
    State(state): State<AppState>,
    _admin: Admin,
    JsonBody(body): JsonBody<NewTenant>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = checked_name(&body.name)?;
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
        "status": if tenant.deleting() { "deleting" } else { "active" },
        "created_at": tok_store::rfc3339::format(tenant.created_at),
    })
}

/// Rows of a table counted at most, for what is left of a tenant being
/// deleted: a count of this many means at least as many.
const COUNTED_UP_TO: u32 = 10_000;

/// A tenant being deleted as the admin sees it: when it was asked, and the
/// rows each table still holds.
async fn shown_deleting(state: &AppState, tenant: &tok_store::Tenant) -> ApiResult<Value> {
    let mut shown = shown(tenant);
    let left = state
        .engine
        .store()
        .tenant_rows_left(&tenant.id, COUNTED_UP_TO)
        .await?;
    let remaining: Map<String, Value> = left
        .iter()
        .map(|l| (l.table.to_owned(), json!(l.rows)))
        .collect();
    shown["deletion"] = json!({
        "requested_at": tenant.deleting_since.map(tok_store::rfc3339::format),
        "remaining": remaining,
        "counted_up_to": COUNTED_UP_TO,
    });
    Ok(shown)
}

/// One tenant; while it is being deleted, with what is left of it
/// (`deletion.remaining`: rows per table, each counted up to
/// `deletion.counted_up_to`). 404 once it is gone.
#[utoipa::path(get, path = "/api/tenants/{id}", tag = "tenants", responses((status = 200, body = crate::openapi::schemas::TenantShown)))]
async fn show(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let id = TenantId::from(id);
    let Some(tenant) = state.engine.store().tenant(&id).await? else {
        return Err(ApiError::not_found("tenant"));
    };
    Ok(Json(match tenant.deleting() {
        true => shown_deleting(&state, &tenant).await?,
        false => shown(&tenant),
    }))
}

/// Deletes a tenant and every row of it, on its own database too: 202 at
/// once, the rows erased by the scheduler in batches (follow it with
/// `GET /api/tenants/{id}`, 404 once done). Its keys stop working at once.
#[utoipa::path(delete, path = "/api/tenants/{id}", tag = "tenants", responses((status = 202, body = crate::openapi::schemas::TenantShown)))]
async fn delete(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> ApiResult<(
    StatusCode,
    [(axum::http::HeaderName, String); 1],
    AuditNote,
    Json<Value>,
)> {
    let id = TenantId::from(id);
    let Some(tenant) = state.engine.store().begin_tenant_deletion(&id).await? else {
        return Err(ApiError::not_found("tenant"));
    };
    // This process stops at once; the others at their next look at the
    // tenant list (a few seconds; its keys fail at once everywhere).
    state.engine.refresh_tenants().await?;
    state.engine.tenant_changed(&id);
    state.quotas.tenant_changed(&id);
    state.sources.forget_tenant(&id);
    let location = format!("/api/tenants/{id}");
    let note = AuditNote("every row of the tenant to be erased".into());
    Ok((
        StatusCode::ACCEPTED,
        [(axum::http::header::LOCATION, location)],
        note,
        Json(shown_deleting(&state, &tenant).await?),
    ))
}

/// What `PATCH /api/tenants/{id}` may change; every field is optional, a
/// field not listed here is refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantChange {
    name: Option<String>,
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
    if tenant.deleting() {
        return Err(being_deleted(&id));
    }
    // Every change is checked before any is written.
    let name = body.name.as_deref().map(checked_name).transpose()?;
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
    if name.is_some() {
        changed.push("name".to_owned());
    }
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
        name: name.map(str::to_owned),
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
