//! Automations: create (version 1), save a new version, pause, resume,
//! delete, list, show, and start a run by hand. Definitions are validated at
//! save; every problem comes back at once, each with the place it concerns.
//!
//! A delete archives: the automation starts no run from then on and leaves
//! every listing, while its runs in flight finish on their own version and
//! its versions stay readable for them. Another automation that starts it
//! (`run_workflow`) keeps it from being deleted (409 `in_use`).

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::definition::{Automation, Trigger};
use tok_core::ids::{AutomationId, SourceId, TenantId};
use tok_core::uses::Kind;
use tok_core::validate::ValidationError;
use tok_engine::definitions::prepare;
use tok_engine::outbound::origin;
use tok_store::{AutomationRow, AutomationStatus, NewVersion, rfc3339};

use crate::AppState;
use crate::audit::AuditNote;
use crate::auth::{KeyActor, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::routes::in_use::{automations_using, refuse_if_used};
use crate::routes::{JsonBody, JsonBytes, Path, READ, Routes, SIGNAL, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/automations", READ, list)
        .post("/api/automations", WRITE, create)
        .get("/api/automations/{id}", READ, show)
        .put("/api/automations/{id}", WRITE, update)
        .delete("/api/automations/{id}", WRITE, delete)
        .post("/api/automations/{id}/pause", WRITE, pause)
        .post("/api/automations/{id}/resume", WRITE, resume)
        .post("/api/automations/{id}/runs", SIGNAL, start_run)
        .get("/api/automations/{id}/versions/{version}", READ, version)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, show, update, delete, pause, resume, start_run, version))]
pub(crate) struct Api;

fn invalid(errors: &[ValidationError]) -> ApiError {
    let summary = errors
        .iter()
        .map(|e| {
            if e.path.is_empty() {
                e.message.clone()
            } else {
                format!("{}: {}", e.path, e.message)
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    let details: Vec<Value> = errors
        .iter()
        .map(|e| json!({ "path": e.path, "message": e.message }))
        .collect();
    ApiError::bad_request(
        "invalid_definition",
        format!("the automation is not valid: {summary}"),
    )
    .with("errors", details)
}

/// Parses, validates, and checks what needs the tenant's data (the source of
/// a webhook trigger must be one of the tenant's; a step naming a connection
/// calls only its base URL's origin).
async fn checked(
    state: &AppState,
    tenant: &TenantId,
    raw: &[u8],
    id: Option<&AutomationId>,
) -> ApiResult<NewVersion> {
    let (automation, version): (Automation, NewVersion) =
        prepare(raw, state.engine.registry()).map_err(|e| invalid(&e))?;
    let gated_children = gated_children(state, tenant, &automation, id).await?;
    if !gated_children.is_empty() {
        return Err(invalid(&gated_children));
    }
    let off_origin = origin::check_definition(tenant, &automation, &**state.engine.store()).await?;
    if !off_origin.is_empty() {
        return Err(invalid(&off_origin));
    }
    if let Trigger::Webhook { source, .. } = &automation.trigger
        && state
            .engine
            .store()
            .source(tenant, &SourceId::from(source.as_str()))
            .await?
            .is_none()
    {
        return Err(invalid(&[ValidationError {
            path: "trigger.source".into(),
            message: format!(
                "`{source}` is not a source of this tenant; create it with POST /api/sources"
            ),
        }]));
    }
    Ok(version)
}

/// A child run is never gated by a start control (its parent's step waits
/// for that very run): a `run_workflow` step may not name an automation
/// with one, and an automation started that way may not get one. (A child
/// named by a template is refused by its step.)
async fn gated_children(
    state: &AppState,
    tenant: &TenantId,
    automation: &Automation,
    id: Option<&AutomationId>,
) -> ApiResult<Vec<ValidationError>> {
    let mut errors = Vec::new();
    let children: Vec<_> = tok_core::uses::references(automation)
        .into_iter()
        .filter(|r| r.kind == tok_core::uses::Kind::Automation)
        .collect();
    if !children.is_empty() {
        let rows = state.engine.store().automations(tenant).await?;
        for child in children {
            let row = rows.iter().find(|row| {
                row.status != tok_store::AutomationStatus::Archived
                    && (row.id.as_str() == child.name || row.name == child.name)
                    && Some(&row.id) != id
            });
            let Some(row) = row else { continue };
            let Ok(definition) = serde_json::from_value::<Automation>(row.definition.clone())
            else {
                continue;
            };
            if let Some(control) = definition.flow.control() {
                let step = child.path.trim_end_matches(".config.automation");
                errors.push(ValidationError {
                    path: child.path.clone(),
                    message: tok_engine::child_refused(step, &row.name, control.name()),
                });
            }
        }
    }
    if let Some(control) = automation.flow.control() {
        let id = id.map(|id| id.to_string()).unwrap_or_default();
        let parents = automations_using(
            state,
            tenant,
            tok_core::uses::Kind::Automation,
            &id,
            &automation.name,
        )
        .await?;
        for parent in parents {
            errors.push(ValidationError {
                path: format!("flow.{}", control.name()),
                message: format!(
                    "automation \u{201c}{}\u{201d} starts this one as a child run ({}), and a \
                     child run is its parent's step, never held, skipped or joined by a start \
                     control: change that step to emit an event this automation triggers on, \
                     or leave flow.{} out",
                    parent.name,
                    parent.path.as_deref().unwrap_or_default(),
                    control.name()
                ),
            });
        }
    }
    Ok(errors)
}

/// Tells the scheduler when a just-saved poll or schedule automation is
/// due, so `next_run_at` shows it at once (the wake would find it within a
/// tick anyway).
async fn scheduled(state: &AppState, row: &AutomationRow) -> ApiResult<()> {
    tok_engine::scheduler::sync_automation(&**state.engine.store(), row, tok_store::now_ms())
        .await?;
    Ok(())
}

fn view(row: &AutomationRow) -> Value {
    json!({
        "id": row.id,
        "name": row.name,
        "status": row.status,
        "version": row.version,
        "hash": row.hash,
        "definition": row.definition,
        "created_at": rfc3339::format(row.created_at),
        "updated_at": rfc3339::format(row.updated_at),
        // When a poll or schedule trigger is due next; null for other
        // triggers.
        "next_run_at": rfc3339::format_opt(row.next_run_at),
    })
}

#[utoipa::path(post, path = "/api/automations", tag = "automations", responses((status = 201, body = crate::openapi::schemas::AutomationSaved)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBytes(body): JsonBytes,
) -> ApiResult<(StatusCode, AuditNote, Json<Value>)> {
    let version = checked(&state, &tenant, &body, None).await?;
    let row = state
        .engine
        .store()
        .create_automation(&tenant, version)
        .await?;
    scheduled(&state, &row).await?;
    Ok((
        StatusCode::CREATED,
        saved_note(&row),
        Json(json!({ "id": row.id, "version": row.version })),
    ))
}

/// The audit row's words for a saved version.
fn saved_note(row: &AutomationRow) -> AuditNote {
    AuditNote(format!(
        "\u{201c}{}\u{201d}, version {}",
        row.name, row.version
    ))
}

#[utoipa::path(put, path = "/api/automations/{id}", tag = "automations", responses((status = 200, body = crate::openapi::schemas::AutomationSaved)))]
async fn update(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBytes(body): JsonBytes,
) -> ApiResult<(AuditNote, Json<Value>)> {
    let id = AutomationId::from(id);
    live(&state, &tenant, &id).await?;
    let version = checked(&state, &tenant, &body, Some(&id)).await?;
    let row = state
        .engine
        .store()
        .save_version(&tenant, &id, version)
        .await?;
    scheduled(&state, &row).await?;
    Ok((
        saved_note(&row),
        Json(json!({ "id": row.id, "version": row.version })),
    ))
}

#[utoipa::path(get, path = "/api/automations", tag = "automations", responses((status = 200, body = crate::openapi::schemas::AutomationPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("automations", query)?;
    let found = state
        .engine
        .store()
        .automations_page(&tenant, asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, view))
}

#[utoipa::path(get, path = "/api/automations/{id}", tag = "automations", responses((status = 200, body = crate::openapi::schemas::Automation)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let row = state
        .engine
        .store()
        .automation(&tenant, &AutomationId::from(id))
        .await?
        .ok_or_else(|| ApiError::not_found("automation"))?;
    Ok(Json(view(&row)))
}

/// One saved version's definition (the versions are 1 to the current one).
#[utoipa::path(get, path = "/api/automations/{id}/versions/{version}", tag = "automations", responses((status = 200, body = crate::openapi::schemas::AutomationVersion)))]
async fn version(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path((id, version)): Path<(String, i32)>,
) -> ApiResult<Json<Value>> {
    let id = AutomationId::from(id);
    let saved = state
        .engine
        .store()
        .automation_version(&tenant, &id, version)
        .await?
        .ok_or_else(|| ApiError::not_found("automation version"))?;
    Ok(Json(json!({
        "id": id,
        "version": version,
        "hash": saved.hash,
        "definition": saved.definition,
    })))
}

async fn set_status(
    state: &AppState,
    tenant: &TenantId,
    id: String,
    status: AutomationStatus,
) -> ApiResult<Json<Value>> {
    let id = AutomationId::from(id);
    live(state, tenant, &id).await?;
    if !state
        .engine
        .store()
        .set_automation_status(tenant, &id, status)
        .await?
    {
        return Err(ApiError::not_found("automation"));
    }
    Ok(Json(json!({ "id": id, "status": status })))
}

/// The automation, unless it is missing (404) or deleted (409: it can no
/// longer change).
async fn live(state: &AppState, tenant: &TenantId, id: &AutomationId) -> ApiResult<AutomationRow> {
    let row = state
        .engine
        .store()
        .automation(tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("automation"))?;
    if row.status == AutomationStatus::Archived {
        return Err(tok_engine::EngineError::AutomationArchived(id.clone()).into());
    }
    Ok(row)
}

#[utoipa::path(delete, path = "/api/automations/{id}", tag = "automations", responses((status = 204, description = "archived: no new runs, runs in flight finish, its versions kept"), (status = 409, description = "another automation starts it (`in_use`, with `used_by`), or it was deleted before (`automation_archived`)", body = crate::openapi::ErrorBody)))]
async fn delete(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = AutomationId::from(id);
    let row = live(&state, &tenant, &id).await?;
    let users: Vec<_> =
        automations_using(&state, &tenant, Kind::Automation, id.as_str(), &row.name)
            .await?
            .into_iter()
            .filter(|user| user.id != id.as_str())
            .collect();
    refuse_if_used(&format!("automation `{}`", row.name), &users)?;
    let store = state.engine.store();
    store
        .set_automation_status(&tenant, &id, AutomationStatus::Archived)
        .await?;
    // The scheduler would find it gone within a tick; a poll or cron
    // trigger of a deleted automation stops now.
    store.remove_schedule(&tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/automations/{id}/pause", tag = "automations", responses((status = 200, body = crate::openapi::schemas::AutomationStatus)))]
async fn pause(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    set_status(&state, &tenant, id, AutomationStatus::Paused).await
}

#[utoipa::path(post, path = "/api/automations/{id}/resume", tag = "automations", responses((status = 200, body = crate::openapi::schemas::AutomationStatus)))]
async fn resume(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    set_status(&state, &tenant, id, AutomationStatus::Active).await
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StartBody {
    #[serde(default)]
    input: Value,
    idempotency_key: Option<String>,
}

#[utoipa::path(post, path = "/api/automations/{id}/runs", tag = "automations", responses((status = 201, body = crate::openapi::schemas::RunStarted), (status = 413, description = "a body over 256 KiB, the bound of a webhook's body (`payload_too_large`)", body = crate::openapi::ErrorBody), (status = 429, description = "over the automation's `settings.limits.startsPerMinute` (`start_rate_exceeded`; `Retry-After` says when a start frees up)", body = crate::openapi::ErrorBody)))]
async fn start_run(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    KeyActor(actor): KeyActor,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBytes(body): JsonBytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    // A start's input becomes its run's `_body`, as a webhook's body does,
    // and is bounded the same.
    if body.len() > crate::MAX_WEBHOOK_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the body is larger than {} bytes, the bound of a manual start's input as of \
                 a webhook's body",
                crate::MAX_WEBHOOK_BYTES
            ),
        )
        .with("limit", crate::MAX_WEBHOOK_BYTES));
    }
    let body: StartBody = if body.is_empty() {
        StartBody::default()
    } else {
        let JsonBody(b) = JsonBody::<StartBody>::parse(&body)?;
        b
    };
    if !(body.input.is_object() || body.input.is_null()) {
        return Err(ApiError::bad_request(
            "invalid_body",
            "`input` must be a JSON object",
        ));
    }
    crate::routes::storable_json("`input`", &body.input)?;
    // A blank key is no key: it must not tie unrelated starts to one run.
    let header = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let key = [body.idempotency_key.as_deref(), header]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|k| !k.is_empty())
        .map(str::to_owned);
    let input = if body.input.is_null() {
        json!({})
    } else {
        body.input
    };
    let traceparent = super::traceparent(&headers);
    let run_id = state
        .engine
        .start_run_as(
            &tenant,
            &AutomationId::from(id),
            input,
            key,
            actor,
            traceparent,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "run_id": run_id }))))
}
