//! Ticket types: a name, the statuses a ticket of the type may have (the
//! first is a new ticket's), and its custom fields. Steps and people refer
//! to a type by name, so names are unique per tenant.

use std::collections::HashSet;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::NewTicketType;

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/ticket-types", READ, list)
        .post("/api/ticket-types", WRITE, create)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create))]
pub(crate) struct Api;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewType {
    name: String,
    statuses: Vec<String>,
    #[serde(default)]
    fields: Vec<Value>,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_body", message)
}

/// Statuses: at least one, none blank, no two alike.
fn checked_statuses(statuses: Vec<String>) -> ApiResult<Vec<String>> {
    if statuses.is_empty() {
        return Err(invalid(
            "`statuses` must list at least one status; the first is a new ticket's",
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(statuses.len());
    for status in statuses {
        let status = status.trim().to_owned();
        if status.is_empty() {
            return Err(invalid("`statuses` must not contain an empty status"));
        }
        if !seen.insert(status.clone()) {
            return Err(invalid(format!(
                "status `{status}` is listed twice in `statuses`; each status must be unique"
            )));
        }
        out.push(status);
    }
    Ok(out)
}

/// Custom fields: objects with a unique, non-empty `name` (and whatever
/// else describes them, such as `type`).
fn checked_fields(fields: Vec<Value>) -> ApiResult<Value> {
    let mut seen = HashSet::new();
    for (i, field) in fields.iter().enumerate() {
        let name = field
            .get("name")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                invalid(format!(
                    "`fields[{i}]` must be an object with a non-empty `name`, e.g. {{\"name\":\"due\",\"type\":\"date\"}}"
                ))
            })?;
        if !seen.insert(name.to_owned()) {
            return Err(invalid(format!(
                "field `{name}` is listed twice in `fields`; each field must be unique"
            )));
        }
    }
    Ok(Value::Array(fields))
}

#[utoipa::path(post, path = "/api/ticket-types", tag = "ticket-types", responses((status = 201, body = crate::openapi::schemas::TicketType)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewType>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = body.name.trim().to_owned();
    if name.is_empty() {
        return Err(invalid("`name` must not be empty"));
    }
    let new = NewTicketType {
        name,
        statuses: checked_statuses(body.statuses)?,
        fields: checked_fields(body.fields)?,
    };
    let created = state
        .engine
        .store()
        .create_ticket_type(&tenant, new)
        .await?;
    Ok((StatusCode::CREATED, Json(json!(created))))
}

#[utoipa::path(get, path = "/api/ticket-types", tag = "ticket-types", responses((status = 200, body = crate::openapi::schemas::TicketTypePage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("ticket_types", query)?;
    let found = state
        .engine
        .store()
        .ticket_types_page(&tenant, asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, |t| json!(t)))
}
