//! Bulk operations on runs (docs/operations.md, "Retrying and cancelling
//! many runs"): `POST /api/runs/bulk` retries or cancels every run a filter
//! takes — after a fix, on the automation's current version if asked — in
//! the server, in pages, through the tenant's fair share
//! (`tok_engine::operations`); `GET /api/operations/{id}` says how far it
//! is and which runs it could not act on, `POST
//! /api/operations/{id}/cancel` stops it.
//!
//! A dry run answers the count and the first page of the runs it would
//! touch, and writes nothing. A filter with `where` reads the runs'
//! contexts, at most `tok_engine::operations::CALL_BYTES` of them a call:
//! past it a dry run's count is partial, with a cursor to go on counting,
//! and an operation starts with the runs counted so far as its `total`,
//! which grows as it acts on more. An operation acts on each run once however
//! often its pages are done again (a restart), and a second operation with
//! the same filter finds the runs the first retried no longer failed.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_engine::operations::{Budget, BulkFilter, MAX_RUNS};
use tok_store::{NewOperation, Operation, OperationAction};

use crate::AppState;
use crate::audit::AuditNote;
use crate::auth::{KeyActor, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .post("/api/runs/bulk", WRITE, bulk)
        .get("/api/operations", READ, list)
        .get("/api/operations/{id}", READ, show)
        .post("/api/operations/{id}/cancel", WRITE, cancel)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(bulk, list, show, cancel))]
pub(crate) struct Api;

/// The runs a dry run shows.
const DRY_RUN_PAGE: usize = 50;

/// The failed runs an operation's detail lists.
const FAILURES_SHOWN: u32 = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    #[serde(default)]
    filter: Value,
    action: Option<String>,
    version: Option<String>,
    #[serde(default)]
    dry_run: bool,
    /// A dry run's `next_cursor`: the count goes on from there.
    cursor: Option<String>,
}

fn invalid(field: &str, message: String) -> ApiError {
    ApiError::bad_request("invalid_body", message).with("field", field)
}

#[utoipa::path(post, path = "/api/runs/bulk", tag = "runs", responses(
    (status = 200, description = "A dry run: how many runs the filter takes and the first of them", body = crate::openapi::schemas::BulkDryRun),
    (status = 202, description = "The operation was made; `GET /api/operations/{operation_id}` follows it", body = crate::openapi::schemas::BulkStarted),
))]
async fn bulk(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    KeyActor(actor): KeyActor,
    JsonBody(body): JsonBody<BulkBody>,
) -> ApiResult<(StatusCode, AuditNote, Json<Value>)> {
    let action = match body.action.as_deref() {
        Some(a) => OperationAction::parse(a).ok_or_else(|| {
            invalid(
                "action",
                format!("`action` is `{a}`; it must be `retry` or `cancel`"),
            )
        })?,
        None => {
            return Err(invalid(
                "action",
                "a bulk operation needs `action`: `retry` or `cancel`".into(),
            ));
        }
    };
    let version = match (action, body.version.as_deref()) {
        (_, None) => "original",
        (OperationAction::Retry, Some(v @ ("original" | "current"))) => v,
        (OperationAction::Cancel, Some(_)) => {
            return Err(invalid(
                "version",
                "`version` is for a retry (`original` or `current`); a cancel takes none".into(),
            ));
        }
        (_, Some(v)) => {
            return Err(invalid(
                "version",
                format!("`version` is `{v}`; it must be `original` or `current`"),
            ));
        }
    };
    let filter = match &body.filter {
        Value::Null => BulkFilter::default(),
        value => BulkFilter::parse(value).map_err(|e| invalid("filter", e))?,
    };
    let selection = filter.selection(None).map_err(|e| invalid("filter", e))?;
    let store = state.engine.store();
    let (counted, after) = match &body.cursor {
        Some(_) if !body.dry_run => {
            return Err(invalid(
                "cursor",
                "`cursor` goes on with a dry run's count; an operation counts from the start"
                    .into(),
            ));
        }
        Some(cursor) => counted_so_far(cursor)?,
        None => (0, None),
    };
    let Some(count) = tok_engine::operations::count(
        &**store,
        &tenant,
        &selection,
        DRY_RUN_PAGE,
        after,
        counted,
        &mut Budget::call(),
    )
    .await?
    else {
        return Err(invalid(
            "filter",
            format!(
                "the filter takes more than {MAX_RUNS} runs; narrow it (`since`, `until`, `automation`, `status`)"
            ),
        ));
    };
    let total = counted + count.total;
    let complete = count.after.is_none();
    if body.dry_run {
        let note = AuditNote(format!("dry run: {total} runs would be {}", past(action)));
        let next = count
            .after
            .map(|run| super::cursor("bulk", &format!("{total}:{run}")));
        let answer = json!({
            "dry_run": true,
            "count": total,
            "complete": complete,
            "next_cursor": next,
            "runs": count.first,
        });
        return Ok((StatusCode::OK, note, Json(answer)));
    }
    let operation = store
        .create_operation(
            &tenant,
            NewOperation {
                action,
                version: version.to_owned(),
                filter: serde_json::to_value(&filter).unwrap_or_default(),
                total,
                actor: Some(actor),
            },
        )
        .await?;
    state.engine.operation_started();
    let note = AuditNote(format!(
        "operation {}: {} {total} runs",
        operation.id,
        action.as_str()
    ));
    let answer = json!({
        "operation_id": operation.id,
        "total": total,
        "total_complete": complete,
        "status": operation.status,
    });
    Ok((StatusCode::ACCEPTED, note, Json(answer)))
}

/// What a dry run's cursor says: the runs counted before, and the run the
/// count goes on after.
fn counted_so_far(cursor: &str) -> Result<(i64, Option<String>), ApiError> {
    let page = super::PageQuery {
        limit: None,
        cursor: Some(cursor.to_owned()),
    };
    let key = page.after("bulk")?.unwrap_or_default();
    match key.split_once(':') {
        Some((counted, run)) if !run.is_empty() => match counted.parse::<i64>() {
            Ok(counted) if counted >= 0 => Ok((counted, Some(run.to_owned()))),
            _ => Err(bad_cursor(cursor)),
        },
        _ => Err(bad_cursor(cursor)),
    }
}

fn bad_cursor(cursor: &str) -> ApiError {
    ApiError::bad_request(
        "bad_cursor",
        format!("cursor `{cursor}` is not a cursor this API gave out; pass a dry run's `next_cursor` as it is"),
    )
    .with("field", "cursor")
}

fn past(action: OperationAction) -> &'static str {
    match action {
        OperationAction::Retry => "retried",
        OperationAction::Cancel => "cancelled",
    }
}

fn view(operation: &Operation) -> Value {
    json!(operation)
}

#[utoipa::path(get, path = "/api/operations", tag = "operations", responses((status = 200, body = crate::openapi::schemas::OperationPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("operations", query)?;
    let found = state
        .engine
        .store()
        .operations(&tenant, asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, view))
}

#[utoipa::path(get, path = "/api/operations/{id}", tag = "operations", responses((status = 200, body = crate::openapi::schemas::OperationDetail)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let store = state.engine.store();
    let operation = store
        .operation(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("operation"))?;
    let failures = store
        .operation_failures(&tenant, &id, FAILURES_SHOWN)
        .await?;
    let mut answer = view(&operation);
    answer["failures"] = failures
        .into_iter()
        .map(|(run_id, reason)| json!({ "run_id": run_id, "reason": reason }))
        .collect();
    Ok(Json(answer))
}

#[utoipa::path(post, path = "/api/operations/{id}/cancel", tag = "operations", responses((status = 200, body = crate::openapi::schemas::Operation)))]
async fn cancel(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    let operation = state
        .engine
        .store()
        .cancel_operation(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("operation"))?;
    let note = AuditNote(format!(
        "stopped after {} of {} runs",
        operation.done + operation.failed,
        operation.total
    ));
    Ok((note, Json(view(&operation))))
}
