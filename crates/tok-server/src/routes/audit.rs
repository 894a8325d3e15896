//! `GET /api/audit`: the audit log (docs/security.md, "Audit"), who
//! changed what with which key, and whether the change was made
//! (`outcome`), newest first, with the filters `actor` (a key's id),
//! `action` (`automation.saved`), `target` (an id) and `since` (RFC 3339).
//! The rows are written by the audit layer (`crate::audit`).
//!
//! It needs the `admin` scope: the log lists every key's doings by the
//! key's id and name, which is what managing the tenant's keys is about,
//! not what a key that only reads the tenant's work should see. The
//! platform admin key without `X-Tok-Tenant` sees every tenant's rows and
//! the platform's own; with it, that tenant's.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::{AuditFilter, AuditRow, rfc3339};

use crate::AppState;
use crate::auth::{Caller, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::routes::{ADMIN, PageQuery, Routes};

pub(crate) fn router() -> Routes {
    Routes::new().get("/api/audit", ADMIN, list)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list))]
pub(crate) struct Api;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// The id of the key that made the changes.
    actor: Option<String>,
    /// `resource.verb`, as the rows say it.
    action: Option<String>,
    /// The id of what was changed.
    target: Option<String>,
    /// RFC 3339: rows at or after it.
    since: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

/// The listing's name in its cursors.
const LISTING: &str = "audit";

fn bad(param: &str, message: String) -> ApiError {
    ApiError::bad_request("bad_query", message).with("param", param)
}

/// A row as listed.
fn view(row: &AuditRow) -> Value {
    json!({
        "id": row.id,
        "at": rfc3339::format(row.at),
        "tenant_id": row.tenant_id,
        "actor": row.actor,
        "action": row.action,
        "target": row.target,
        "summary": row.summary,
        "outcome": row.outcome,
    })
}

/// Whose rows a request lists.
enum Whose {
    Tenant(tok_core::ids::TenantId),
    /// The platform admin key without `X-Tok-Tenant`.
    Everyone,
}

impl FromRequestParts<AppState> for Whose {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(key) = Caller::from_request_parts(parts, state).await?;
        if key.tenant_id.is_none() && !parts.headers.contains_key("x-tok-tenant") {
            return Ok(Whose::Everyone);
        }
        let Tenant(tenant, _) = Tenant::from_request_parts(parts, state).await?;
        Ok(Whose::Tenant(tenant))
    }
}

/// The audit log: the tenant's rows (every tenant's and the platform's
/// for the platform admin key without `X-Tok-Tenant`), newest first. A
/// filter that is empty, or a `since` that is not RFC 3339, is a 400
/// naming it.
#[utoipa::path(
    get,
    path = "/api/audit",
    tag = "audit",
    params(
        ("actor" = Option<String>, Query, description = "Only the changes of the key with this id"),
        ("action" = Option<String>, Query, description = "Only this action, e.g. `automation.saved`"),
        ("target" = Option<String>, Query, description = "Only the changes to what has this id"),
        ("since" = Option<String>, Query, description = "Only the changes at or after this time (RFC 3339)"),
        ("limit" = Option<u32>, Query, description = "Rows per page: 1 to 500, 50 by default"),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the page before"),
    ),
    responses((status = 200, body = crate::openapi::schemas::AuditPage))
)]
async fn list(
    State(state): State<AppState>,
    whose: Whose,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    for (param, value) in [
        ("actor", &query.actor),
        ("action", &query.action),
        ("target", &query.target),
        ("since", &query.since),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(bad(
                param,
                format!("`{param}` is empty; leave it out to list every row"),
            ));
        }
    }
    let since = match query.since.as_deref() {
        None => None,
        Some(text) => Some(rfc3339::parse(text).map_err(|e| {
            bad(
                "since",
                format!("`since` is `{text}`: {e}; expected an RFC 3339 time such as 2026-12-01T00:00:00Z"),
            )
        })?),
    };
    let page = PageQuery {
        limit: query.limit,
        cursor: query.cursor,
    };
    let limit = page.limit()?;
    let after = match page.after(LISTING)? {
        None => None,
        Some(key) => Some(key.parse::<i64>().map_err(|_| {
            ApiError::bad_request(
                "bad_cursor",
                format!(
                    "cursor `{}` is not a cursor this API gave out; pass the `next_cursor` of \
                     the page before as it is, or no cursor for the first page",
                    page.cursor.as_deref().unwrap_or_default()
                ),
            )
            .with("param", "cursor")
        })?),
    };
    let filter = AuditFilter {
        actor: query.actor,
        action: query.action,
        target: query.target,
        since,
    };
    let store = state.engine.store();
    let found = match whose {
        Whose::Tenant(tenant) => store.audit(&tenant, &filter, limit, after).await?,
        Whose::Everyone => store.audit_everywhere(&filter, limit, after).await?,
    };
    let items = found.items.iter().map(view).collect();
    Ok(Json(super::page(
        LISTING,
        items,
        found.next_cursor.as_deref(),
    )))
}
