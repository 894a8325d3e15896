//! Ticket types: a name, the statuses a ticket of the type may have (the
//! first is a new ticket's), and its custom fields. Steps and people refer
//! to a type by name, so names are unique per tenant, and a name does not
//! change. A type's statuses and fields change (`PATCH`), but not so that
//! an open ticket's status is none of its type's; a type is deleted only
//! when no ticket is of it and no automation names it.

use std::collections::HashSet;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::uses::Kind;
use tok_store::{DeskChange, NewTicketType, TicketType, TicketTypePatch};

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::in_use::{User, automations_using, conflict, refuse_if_used};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/ticket-types", READ, list)
        .post("/api/ticket-types", WRITE, create)
        .get("/api/ticket-types/{id}", READ, show)
        .patch("/api/ticket-types/{id}", WRITE, update)
        .delete("/api/ticket-types/{id}", WRITE, delete)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, show, update, delete))]
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

/// The tenant's ticket type by id (or name), or the 404.
async fn ticket_type(
    state: &AppState,
    tenant: &tok_core::ids::TenantId,
    id: &str,
) -> ApiResult<TicketType> {
    state
        .engine
        .store()
        .ticket_type(tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("ticket type"))
}

/// A ticket type by id (or name).
#[utoipa::path(get, path = "/api/ticket-types/{id}", tag = "ticket-types", responses((status = 200, body = crate::openapi::schemas::TicketType)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(json!(ticket_type(&state, &tenant, &id).await?)))
}

/// A change to a ticket type: what is absent stays. Its name cannot
/// change; it is taken when it is the type's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypePatch {
    name: Option<String>,
    statuses: Option<Vec<String>>,
    fields: Option<Vec<Value>>,
}

/// Changes a ticket type's statuses (the first is a new ticket's) or its
/// fields. Leaving out a status that open tickets of the type are in is
/// refused (409 `in_use`, counting them per status).
#[utoipa::path(patch, path = "/api/ticket-types/{id}", tag = "ticket-types", responses((status = 200, body = crate::openapi::schemas::TicketType), (status = 409, description = "open tickets of the type are in a status left out (`in_use`, with `used_by` counting them)", body = crate::openapi::ErrorBody)))]
async fn update(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TypePatch>,
) -> ApiResult<Json<Value>> {
    let current = ticket_type(&state, &tenant, &id).await?;
    if let Some(name) = &body.name
        && name.trim() != current.name
    {
        return Err(invalid(format!(
            "`name` cannot change (tickets and steps name the type `{}`): create a type of \
             the new name",
            current.name
        ))
        .with("field", "name"));
    }
    let patch = TicketTypePatch {
        statuses: body.statuses.map(checked_statuses).transpose()?,
        fields: body.fields.map(checked_fields).transpose()?,
    };
    match state
        .engine
        .store()
        .update_ticket_type(&tenant, &current.id, patch)
        .await?
    {
        DeskChange::Done(changed) => Ok(Json(json!(changed))),
        DeskChange::NotFound => Err(ApiError::not_found("ticket type")),
        DeskChange::Held(held) => {
            let users: Vec<User> = held
                .iter()
                .map(|h| {
                    User::tickets(
                        h,
                        "open, in status",
                        "keep those statuses, or move those tickets to another status (or close \
                         them) first",
                    )
                })
                .collect();
            Err(conflict(
                &format!(
                    "ticket type `{}` cannot drop a status that is held by",
                    current.name
                ),
                &users,
            ))
        }
    }
}

/// Deletes a ticket type. Refused (409 `in_use`) while tickets are of it
/// (open or closed: they would have no type) or an automation names it.
#[utoipa::path(delete, path = "/api/ticket-types/{id}", tag = "ticket-types", responses((status = 204, description = "deleted"), (status = 409, description = "tickets are of the type, or an automation names it (`in_use`, with `used_by`)", body = crate::openapi::ErrorBody)))]
async fn delete(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let current = ticket_type(&state, &tenant, &id).await?;
    let what = format!("ticket type `{}`", current.name);
    let users = automations_using(
        &state,
        &tenant,
        Kind::TicketType,
        &current.id,
        &current.name,
    )
    .await?;
    refuse_if_used(&what, &users)?;
    match state
        .engine
        .store()
        .delete_ticket_type(&tenant, &current.id)
        .await?
    {
        DeskChange::Done(()) => Ok(StatusCode::NO_CONTENT),
        DeskChange::NotFound => Err(ApiError::not_found("ticket type")),
        DeskChange::Held(held) => {
            let users: Vec<User> = held
                .iter()
                .map(|h| {
                    User::tickets(
                        h,
                        "open or closed, of type",
                        "give those tickets another type first (PATCH /api/tickets/{id} \
                         {\"type\": …})",
                    )
                })
                .collect();
            Err(conflict(&format!("{what} is in use by"), &users))
        }
    }
}
