//! Runs: the dashboard listing (filters, cursor pages), one run with its
//! steps and their log lines, and run control (retry from the failed step,
//! cancel, pause, resume). Whether a run's state allows a control is the
//! store's decision, taken under the run's row lock; its refusal is a 409
//! that says which states would.

use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::ids::{RunId, TenantId};
use tok_engine::stream::Kind;
use tok_store::{RunFilter, RunStatus};

use crate::AppState;
use crate::audit::AuditNote;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/dashboard/runs", READ, list)
        .get("/api/runs", READ, list)
        .get("/api/runs/{id}", READ, show)
        .post("/api/runs/{id}/retry", WRITE, retry)
        .post("/api/runs/{id}/cancel", WRITE, cancel)
        .post("/api/runs/{id}/pause", WRITE, pause)
        .post("/api/runs/{id}/resume", WRITE, resume)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, show, retry, cancel, pause, resume))]
pub(crate) struct Api;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    automation: Option<String>,
    trigger: Option<String>,
    /// Only the runs this run started (`run_workflow`).
    parent: Option<String>,
    /// Only the runs held by this kind of thing (`blocked_by.kind`).
    blocked_by: Option<String>,
    /// Only the runs this event started.
    event: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

use tok_engine::operations::TRIGGERS;

#[utoipa::path(get, path = "/api/runs", tag = "runs", responses((status = 200, body = crate::openapi::schemas::RunPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    if let Some(status) = &query.status
        && RunStatus::parse(status).is_none()
    {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("status `{status}` is not one of {}", RunStatus::names()),
        ));
    }
    if let Some(trigger) = &query.trigger
        && !TRIGGERS.contains(&trigger.as_str())
    {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("trigger `{trigger}` is not one of {}", TRIGGERS.join(", ")),
        ));
    }
    let page = super::PageQuery {
        limit: query.limit,
        cursor: query.cursor,
    };
    if let Some(kind) = &query.blocked_by
        && !tok_core::blocked::KINDS.contains(&kind.as_str())
    {
        return Err(ApiError::bad_request(
            "bad_query",
            format!(
                "blocked_by `{kind}` is not one of {}",
                tok_core::blocked::KINDS.join(", ")
            ),
        ));
    }
    let filter = RunFilter {
        status: query.status,
        automation_id: query.automation,
        trigger_type: query.trigger,
        parent_run_id: query.parent,
        unfinished: query.blocked_by.is_some(),
        event_id: query.event,
        ..RunFilter::default()
    };
    let limit = page.limit()?;
    let store = state.engine.store();
    let mut cursor = page.after("runs")?;
    let Some(kind) = query.blocked_by else {
        let runs = store
            .runs(&tenant, &filter, limit, cursor.as_deref())
            .await?;
        let mut items = Vec::with_capacity(runs.items.len());
        for run in &runs.items {
            items.push(
                with_progress(&state, &tenant, &run.automation_id, run.version, json!(run)).await,
            );
        }
        return Ok(Json(super::page(
            "runs",
            items,
            runs.next_cursor.as_deref(),
        )));
    };
    // What holds a run is read from its rows, not a column: the unfinished
    // runs are read a page at a time and kept when they are held by
    // `kind`, for at most BLOCKED_SCAN_PAGES pages. A page may then hold
    // fewer than `limit` runs while `next_cursor` goes on.
    let mut items = Vec::new();
    'scan: for _ in 0..BLOCKED_SCAN_PAGES {
        let runs = store
            .runs(&tenant, &filter, limit, cursor.as_deref())
            .await?;
        for run in runs.items {
            if run.blocked_by.as_ref().is_some_and(|b| b.kind == kind) {
                let id = run.id.to_string();
                let shown = json!(run);
                items.push(
                    with_progress(&state, &tenant, &run.automation_id, run.version, shown).await,
                );
                if items.len() == limit as usize {
                    // The next page goes on after the last run shown.
                    cursor = Some(id);
                    break 'scan;
                }
            }
        }
        cursor = runs.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    Ok(Json(super::page("runs", items, cursor.as_deref())))
}

/// How many pages of unfinished runs one `?blocked_by=` page reads at most.
const BLOCKED_SCAN_PAGES: usize = 10;

#[utoipa::path(get, path = "/api/runs/{id}", tag = "runs", responses((status = 200, body = crate::openapi::schemas::RunDetail)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let run = state
        .engine
        .store()
        .run(&tenant, &RunId::from(id))
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    let (automation, version) = (run.run.automation_id.clone(), run.run.version);
    Ok(Json(
        with_progress(&state, &tenant, &automation, version, json!(run)).await,
    ))
}

/// A run as shown, with its `progress` (`{done, total?}`,
/// [`tok_core::progress`]): the total is read off the run's version of its
/// automation; a version that cannot be read gives none.
async fn with_progress(
    state: &AppState,
    tenant: &TenantId,
    automation: &tok_core::ids::AutomationId,
    version: i32,
    mut run: Value,
) -> Value {
    let actions = run["actions"].as_i64().unwrap_or(0) as i32;
    let progress = match state.engine.definition(tenant, automation, version).await {
        Ok(definition) => tok_core::progress::of(&definition.steps, actions),
        Err(_) => tok_core::progress::Progress {
            done: actions.max(0) as u32,
            total: None,
        },
    };
    run["progress"] = json!(progress);
    run
}

/// A change of a run's state asked for through the API.
#[derive(Clone, Copy)]
enum Control {
    /// Continue a failed run from its failed step.
    Retry,
    Cancel,
    Pause,
    Resume,
}

async fn control(
    state: &AppState,
    tenant: &TenantId,
    id: String,
    control: Control,
) -> ApiResult<(AuditNote, Json<Value>)> {
    let store = state.engine.store();
    let id = RunId::from(id);
    let run = match control {
        Control::Retry => store.retry_run(tenant, &id).await?,
        Control::Cancel => store.cancel_run(tenant, &id).await?,
        Control::Pause => store.pause_run(tenant, &id).await?,
        Control::Resume => store.resume_run(tenant, &id).await?,
    };
    if matches!(control, Control::Retry | Control::Resume) {
        state.engine.job_ready();
    }
    // A run the cancel ended exports its spans here; one that compensates
    // first does when its compensation ends it.
    if matches!(control, Control::Cancel) && run.status == "cancelled" {
        tok_engine::traces::run_ended(store.clone(), tenant.clone(), id.clone());
    }
    let data =
        json!({ "run_id": run.id, "automation_id": run.automation_id, "status": run.status });
    state
        .engine
        .stream()
        .publish(tenant, Kind::RunUpdated, data);
    let note = AuditNote(format!(
        "a run of automation {}, now {}",
        run.automation_id, run.status
    ));
    let shown = json!(run);
    let shown = with_progress(state, tenant, &run.automation_id, run.version, shown).await;
    Ok((note, Json(shown)))
}

#[utoipa::path(post, path = "/api/runs/{id}/retry", tag = "runs", responses((status = 200, body = crate::openapi::schemas::RunSummary)))]
async fn retry(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    control(&state, &tenant, id, Control::Retry).await
}

#[utoipa::path(post, path = "/api/runs/{id}/cancel", tag = "runs", responses((status = 200, body = crate::openapi::schemas::RunSummary)))]
async fn cancel(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    control(&state, &tenant, id, Control::Cancel).await
}

#[utoipa::path(post, path = "/api/runs/{id}/pause", tag = "runs", responses((status = 200, body = crate::openapi::schemas::RunSummary)))]
async fn pause(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    control(&state, &tenant, id, Control::Pause).await
}

#[utoipa::path(post, path = "/api/runs/{id}/resume", tag = "runs", responses((status = 200, body = crate::openapi::schemas::RunSummary)))]
async fn resume(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    control(&state, &tenant, id, Control::Resume).await
}
