//! Approvals (docs/workflows.md, "`approval`"): `GET /api/approvals` lists
//! the tenant's approvals (`?status=pending`, the default, or `all`); `GET
//! /api/approvals/{id}` shows one; `POST /api/approvals/{id} {decision,
//! member, comment}` decides one for a member who is one of its approvers
//! (403 `not_an_approver` otherwise; 409 `already_decided` for a second
//! decision, or once its run no longer waits for it), resuming its run. A
//! decision's `comment` is at most 4 KiB (400 naming `comment` beyond).

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::{Decided, Decision};

use crate::AppState;
use crate::audit::AuditNote;
use crate::auth::{KeyActor, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/approvals", READ, list)
        .get("/api/approvals/{id}", READ, show)
        .post("/api/approvals/{id}", WRITE, decide)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, show, decide))]
pub(crate) struct Api;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[utoipa::path(get, path = "/api/approvals", tag = "approvals", responses((status = 200, body = crate::openapi::schemas::ApprovalPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let pending_only = match query.status.as_deref() {
        None | Some("pending") => true,
        Some("all") => false,
        Some(other) => {
            return Err(ApiError::bad_request(
                "bad_status",
                format!("status is {other:?}; it must be `pending` or `all`"),
            ));
        }
    };
    let page = crate::routes::PageQuery {
        limit: query.limit,
        cursor: query.cursor,
    };
    let approvals = state
        .engine
        .store()
        .approvals(
            &tenant,
            pending_only,
            page.limit()?,
            page.after("approvals")?.as_deref(),
        )
        .await?;
    let items = approvals.items.iter().map(|a| json!(a)).collect();
    Ok(Json(crate::routes::page(
        "approvals",
        items,
        approvals.next_cursor.as_deref(),
    )))
}

#[utoipa::path(get, path = "/api/approvals/{id}", tag = "approvals", responses((status = 200, body = crate::openapi::schemas::Approval)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let approval = state.engine.store().approval(&tenant, &id).await?;
    approval
        .map(|a| Json(json!(a)))
        .ok_or_else(|| ApiError::not_found("approval"))
}

/// Longest comment of a decision, in bytes of UTF-8: it is stored with the
/// approval and handed to the run as the wait's output.
const MAX_COMMENT_BYTES: usize = 4 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    decision: String,
    member: String,
    comment: Option<String>,
}

#[utoipa::path(post, path = "/api/approvals/{id}", tag = "approvals", responses((status = 200, body = crate::openapi::schemas::Approval)))]
async fn decide(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    KeyActor(actor): KeyActor,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<DecisionBody>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    if body.decision != "approve" && body.decision != "reject" {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!(
                "`decision` is {:?}; it must be \"approve\" or \"reject\"",
                body.decision
            ),
        )
        .with("field", "decision"));
    }
    if let Some(comment) = &body.comment {
        if comment.len() > MAX_COMMENT_BYTES {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!(
                    "`comment` is {} bytes; at most {MAX_COMMENT_BYTES} (4 KiB): a decision's \
                     comment says why, the rest belongs in a ticket",
                    comment.len()
                ),
            )
            .with("field", "comment")
            .with("limit", MAX_COMMENT_BYTES));
        }
        crate::routes::storable_json("`comment`", &Value::String(comment.clone()))?;
    }
    let decision = Decision {
        decision: body.decision,
        member: body.member.clone(),
        comment: body.comment,
        actor,
    };
    let store = state.engine.store();
    match store.decide_approval(&tenant, &id, decision).await? {
        Decided::Done(approval) => {
            state.engine.job_ready();
            let note = AuditNote(format!(
                "{} (step {} of run {})",
                approval.status, approval.step_id, approval.run_id
            ));
            Ok((note, Json(json!(approval))))
        }
        Decided::NotFound => Err(ApiError::not_found("approval")),
        Decided::NotAnApprover(approval) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_an_approver",
            format!(
                "member {:?} is not one of the approvers of approval {}",
                body.member, approval.id
            ),
        )
        .with("approvers", json!(approval.approvers))),
        Decided::AlreadyDecided(approval) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_decided",
            match approval.status.as_str() {
                "closed" => format!(
                    "approval {} is closed: its run no longer waits for a decision",
                    approval.id
                ),
                status => format!("approval {} was already {status}", approval.id),
            },
        )
        .with("approval", json!(approval))),
    }
}
