//! `POST /api/runs/search` (docs/operations.md, "Finding runs by what they
//! carried"): the tenant's runs whose context holds what the rules of a
//! condition ask — an order id in the webhook's body (`_body.order.id`), a
//! step's output — with the runs listing's filters, newest first, in cursor
//! pages.
//!
//! The rules are evaluated by the same code as a `condition` step's
//! (`tok_core::condition`), over each run's context read a page at a time:
//! one call looks at no more than [`BUDGET`] runs and reads no more than
//! `tok_engine::operations::CALL_BYTES` of their contexts (a few megabytes
//! at a time), so it answers in bounded time and memory however large the
//! tenant and its runs; when it stops before the end, its
//! `next_cursor` goes on from the last run it looked at (a page may then
//! hold fewer than `limit` runs, or none, before the last). Narrowing with
//! `automation`, `status` and `since`/`until` makes each call look at
//! fewer runs (docs/performance.md has the figures).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::definition::Filter;
use tok_engine::operations::BulkFilter;

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, READ, Routes};

pub(crate) fn router() -> Routes {
    Routes::new().post("/api/runs/search", READ, search)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(search))]
pub(crate) struct Api;

/// The most runs one search call looks at.
pub(crate) const BUDGET: u32 = 10_000;

/// The most runs one answer holds.
const MAX_LIMIT: u32 = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchBody {
    #[serde(rename = "where")]
    where_: Option<Filter>,
    status: Option<String>,
    automation: Option<String>,
    trigger: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[utoipa::path(post, path = "/api/runs/search", tag = "runs", responses((status = 200, body = crate::openapi::schemas::RunPage)))]
async fn search(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<SearchBody>,
) -> ApiResult<Json<Value>> {
    let invalid = |field: &str, message: String| {
        ApiError::bad_request("invalid_body", message).with("field", field)
    };
    let Some(rules) = body.where_ else {
        return Err(invalid(
            "where",
            "a search needs `where`: {\"match\": \"all\", \"rules\": [{\"field\": \"_body.order\", \
             \"operator\": \"eq\", \"value\": \"A-1\"}]} (GET /api/runs lists without one)"
                .into(),
        ));
    };
    if rules.rules.is_empty() {
        return Err(invalid(
            "where",
            "`where.rules` is empty; give at least one rule".into(),
        ));
    }
    let limit = match body.limit {
        None => super::DEFAULT_LIMIT.min(MAX_LIMIT),
        Some(n @ 1..=MAX_LIMIT) => n,
        Some(n) => {
            return Err(invalid(
                "limit",
                format!("`limit` is {n}; a search answers 1 to {MAX_LIMIT} runs a call"),
            ));
        }
    };
    let filter = BulkFilter {
        status: body.status,
        automation: body.automation,
        trigger: body.trigger,
        since: body.since,
        until: body.until,
        where_: Some(rules),
    };
    let selection = filter.selection(None).map_err(|e| {
        let field = if e.starts_with("`filter.where") {
            "where"
        } else {
            "filter"
        };
        invalid(field, e.replace("`filter.", "`"))
    })?;
    let page = super::PageQuery {
        limit: None,
        cursor: body.cursor,
    };
    let after = page.after("search")?;
    let (runs, next) = tok_engine::operations::search(
        &**state.engine.store(),
        &tenant,
        &selection,
        after,
        limit as usize,
        BUDGET,
        &mut tok_engine::operations::Budget::call(),
    )
    .await?;
    let items: Vec<Value> = runs.iter().map(|r| json!(r)).collect();
    Ok(Json(super::page("search", items, next.as_deref())))
}
