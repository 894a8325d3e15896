//! Tickets: the listing (filters, cursor pages), one ticket with its trace,
//! and changes by a person. A person's change is an event like any other:
//! it is written with its trace lines and a `ticket.created` /
//! `ticket.updated` event in one transaction, and automations react to it.
//!
//! A change is checked against the tenant's data first (the type exists, the
//! status is one of the type's, the assignee is a member of one of the
//! tenant's groups), then written only if the ticket is still as it was
//! read: a change that crossed another one answers 409 instead of undoing it.
//!
//! `DELETE /api/tickets/{id}` deletes a ticket with its trace (and the
//! signals still buffered about it), in one transaction. A ticket a run in
//! flight is about (its subject, or a wait for a signal about it), or an
//! event not yet dispatched, is in use: 409 `in_use` naming the runs, and
//! nothing is deleted. Finished runs keep their record, which names the
//! ticket by its id.

use std::collections::HashSet;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tok_core::ids::{TenantId, new_id};
use tok_engine::stream::Kind;
use tok_store::{
    Cause, Member, StoreError, Ticket, TicketDeletion, TicketFilter, TicketType, TicketWrite,
    rfc3339,
};

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::in_use::{User, conflict};
use crate::routes::{JsonBody, PageQuery, Path, READ, Routes, WRITE};

/// Who a person's change is by, in the ticket's trace.
const BY_PERSON: &str = "by a person (API)";

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/tickets", READ, list)
        .post("/api/tickets", WRITE, create)
        .get("/api/tickets/{id}", READ, show)
        .patch("/api/tickets/{id}", WRITE, update)
        .delete("/api/tickets/{id}", WRITE, delete)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, show, update, delete))]
pub(crate) struct Api;

/// A ticket as clients see it: the type and the assignee by name.
fn view(t: &Ticket) -> Value {
    json!({
        "id": t.id,
        "external_id": t.external_id,
        "type": t.type_name,
        "status": t.status,
        "closed": t.closed,
        "tags": t.tags,
        "fields": t.fields,
        "title": t.title,
        "assignee": t.assignee_id.as_ref().map(|id| json!({ "id": id, "name": t.assignee_name })),
        "created_at": rfc3339::format(t.created_at),
        "updated_at": rfc3339::format(t.updated_at),
    })
}

/// Tells the live stream a person's change of a ticket committed.
fn published(state: &AppState, tenant: &TenantId, ticket: &Ticket) {
    let data = json!({ "ticket_id": ticket.id, "run_id": null });
    state
        .engine
        .stream()
        .publish(tenant, Kind::TicketUpdated, data);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    closed: Option<String>,
    #[serde(rename = "type")]
    type_name: Option<String>,
    assignee: Option<String>,
    tag: Option<String>,
    external_id: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[utoipa::path(get, path = "/api/tickets", tag = "tickets", responses((status = 200, body = crate::openapi::schemas::TicketPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let closed = match query.closed.as_deref() {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            return Err(ApiError::bad_request(
                "bad_query",
                format!("closed is `{other}`; it must be `true` or `false`"),
            ));
        }
    };
    let page = PageQuery {
        limit: query.limit,
        cursor: query.cursor,
    };
    let filter = TicketFilter {
        status: query.status,
        closed,
        type_name: query.type_name,
        assignee_id: query.assignee,
        tag: query.tag,
        external_id: query.external_id,
    };
    let tickets = state
        .engine
        .store()
        .tickets(
            &tenant,
            &filter,
            page.limit()?,
            page.after("tickets")?.as_deref(),
        )
        .await?;
    let items: Vec<Value> = tickets.items.iter().map(view).collect();
    Ok(Json(crate::routes::page(
        "tickets",
        items,
        tickets.next_cursor.as_deref(),
    )))
}

#[utoipa::path(get, path = "/api/tickets/{id}", tag = "tickets", responses((status = 200, body = crate::openapi::schemas::TicketDetail)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let store = state.engine.store();
    let ticket = store
        .ticket(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("ticket"))?;
    let trace = store.ticket_trace(&tenant, &id).await?;
    let mut body = view(&ticket);
    body["trace"] = json!(trace);
    Ok(Json(body))
}

/// Deletes a ticket and its trace; refused while runs in flight or
/// events not yet dispatched are about it.
#[utoipa::path(delete, path = "/api/tickets/{id}", tag = "tickets", responses((status = 204, description = "deleted, with its trace"), (status = 409, description = "runs that have not ended are about the ticket, or events about it are not dispatched yet (`in_use`, with `used_by` naming them)", body = crate::openapi::ErrorBody)))]
async fn delete(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    match state.engine.store().delete_ticket(&tenant, &id).await? {
        TicketDeletion::Deleted => {}
        TicketDeletion::NotFound => return Err(ApiError::not_found("ticket")),
        TicketDeletion::InUse { runs, events } => {
            let mut users: Vec<User> = runs.iter().map(|r| User::run(r.as_str())).collect();
            if events > 0 {
                users.push(User::pending_events(events));
            }
            return Err(conflict(&format!("ticket `{id}` is in use by"), &users));
        }
    }
    let data = json!({ "ticket_id": id, "run_id": null, "deleted": true });
    state
        .engine
        .stream()
        .publish(&tenant, Kind::TicketUpdated, data);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTicketBody {
    external_id: String,
    #[serde(rename = "type")]
    type_name: Option<String>,
    title: Option<String>,
    status: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    fields: Map<String, Value>,
}

#[utoipa::path(post, path = "/api/tickets", tag = "tickets", responses((status = 201, body = crate::openapi::schemas::Ticket)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewTicketBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let types = state.engine.store().ticket_types(&tenant).await?;
    let write = new_ticket(body, &types)?;
    let ticket = write.ticket.clone();
    match state
        .engine
        .store()
        .write_ticket(&tenant, write, None, &person())
        .await
    {
        Ok(_) => {}
        Err(StoreError::Taken(message)) => {
            return Err(
                ApiError::new(StatusCode::CONFLICT, "duplicate_external_id", message)
                    .with("external_id", ticket.external_id),
            );
        }
        Err(e) => return Err(e.into()),
    }
    state.engine.event_accepted(&tenant);
    published(&state, &tenant, &ticket);
    Ok((StatusCode::CREATED, Json(view(&ticket))))
}

/// The write that creates a ticket, checked against the tenant's types:
/// the type must exist, the status must be one of its statuses (default:
/// its first). `changes` names what the new ticket has.
fn new_ticket(body: NewTicketBody, types: &[TicketType]) -> ApiResult<TicketWrite> {
    let external_id = body.external_id.trim().to_owned();
    if external_id.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_body",
            "`external_id` must not be empty: it is the id the ticket is known by elsewhere",
        ));
    }
    let ticket_type = body
        .type_name
        .as_deref()
        .map(|name| find_type(types, name))
        .transpose()?;
    let status = match (body.status, ticket_type) {
        (Some(status), ty) => Some(checked_status(ty, status)?),
        (None, Some(ty)) => ty.statuses.first().cloned(),
        (None, None) => None,
    };
    let now = tok_store::now_ms();
    let ticket = Ticket {
        id: new_id("tkt"),
        external_id,
        type_id: ticket_type.map(|t| t.id.clone()),
        type_name: ticket_type.map(|t| t.name.clone()),
        title: body
            .title
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty()),
        status,
        closed: false,
        tags: checked_tags(body.tags)?,
        fields: body.fields,
        assignee_id: None,
        assignee_name: None,
        created_at: now,
        updated_at: now,
    };
    let t = &ticket;
    let changes = [
        ("type", t.type_id.is_some()),
        ("status", t.status.is_some()),
        ("tags", !t.tags.is_empty()),
        ("fields", !t.fields.is_empty()),
        ("title", t.title.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(name, _)| name.to_owned())
    .collect();
    Ok(TicketWrite {
        ticket,
        created: true,
        changes,
        trace: vec![format!("Created {BY_PERSON}")],
    })
}

/// A PATCH body: what is absent stays as it is. `fields` are merged into
/// the ticket's (a `null` value removes the field); `tags` replace the
/// ticket's tags; `assignee_id` and `title` may be `null` to clear them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TicketPatch {
    status: Option<String>,
    closed: Option<bool>,
    tags: Option<Vec<String>>,
    fields: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "super::present")]
    assignee_id: Option<Option<String>>,
    #[serde(rename = "type")]
    type_name: Option<String>,
    #[serde(default, deserialize_with = "super::present")]
    title: Option<Option<String>>,
}

#[utoipa::path(patch, path = "/api/tickets/{id}", tag = "tickets", responses((status = 200, body = crate::openapi::schemas::Ticket)))]
async fn update(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBody(patch): JsonBody<TicketPatch>,
) -> ApiResult<Json<Value>> {
    let store = state.engine.store();
    let current = store
        .ticket(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("ticket"))?;
    let types = store.ticket_types(&tenant).await?;
    let assignee = match &patch.assignee_id {
        Some(Some(member_id)) => Some(Some(find_member(&state, &tenant, member_id).await?)),
        Some(None) => Some(None),
        None => None,
    };
    let Some(write) = changed(&current, patch, &types, assignee)? else {
        return Ok(Json(view(&current)));
    };
    let ticket = write.ticket.clone();
    match store
        .write_ticket(&tenant, write, Some(current.updated_at), &person())
        .await
    {
        Ok(_) => {}
        Err(e) if e.is_conflict() => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!(
                    "ticket {id} changed meanwhile (an automation or someone else changed it \
                     after it was read); read it again and send your change again"
                ),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    state.engine.event_accepted(&tenant);
    published(&state, &tenant, &ticket);
    Ok(Json(view(&ticket)))
}

/// The write a PATCH makes, or `None` when it changes nothing. Each change
/// gets a trace line in words and its field name in `changes`.
fn changed(
    current: &Ticket,
    patch: TicketPatch,
    types: &[TicketType],
    assignee: Option<Option<Member>>,
) -> ApiResult<Option<TicketWrite>> {
    let mut ticket = current.clone();
    let mut changes: Vec<&str> = Vec::new();
    let mut trace = Vec::new();

    let new_type = patch
        .type_name
        .as_deref()
        .map(|name| find_type(types, name))
        .transpose()?
        .filter(|t| current.type_id.as_deref() != Some(t.id.as_str()));
    if let Some(t) = new_type {
        ticket.type_id = Some(t.id.clone());
        ticket.type_name = Some(t.name.clone());
        changes.push("type");
        trace.push(format!("Type set to {} {BY_PERSON}", t.name));
    }
    let ticket_type = new_type.or_else(|| {
        let id = current.type_id.as_deref()?;
        types.iter().find(|t| t.id == id)
    });
    // A new type keeps the status when it has it, else starts at its first.
    let (status, defaulted) = match (patch.status, new_type) {
        (Some(status), _) => (Some(checked_status(ticket_type, status)?), false),
        (None, Some(t))
            if !current
                .status
                .as_ref()
                .is_some_and(|s| t.statuses.contains(s)) =>
        {
            (t.statuses.first().cloned(), true)
        }
        (None, _) => (None, false),
    };
    if let Some(status) = status
        && current.status.as_ref() != Some(&status)
    {
        trace.push(match new_type {
            Some(t) if defaulted => {
                format!(
                    "Status set to {status} (the first of type {}) {BY_PERSON}",
                    t.name
                )
            }
            _ => format!("Status set to {status} {BY_PERSON}"),
        });
        ticket.status = Some(status);
        changes.push("status");
    }

    if let Some(closed) = patch.closed
        && closed != current.closed
    {
        ticket.closed = closed;
        changes.push("closed");
        trace.push(if closed {
            format!("Closed {BY_PERSON}")
        } else {
            format!("Reopened {BY_PERSON}")
        });
    }

    if let Some(tags) = patch.tags {
        let tags = checked_tags(tags)?;
        let added: Vec<&str> = tags
            .iter()
            .filter(|t| !current.tags.contains(t))
            .map(String::as_str)
            .collect();
        let removed: Vec<&str> = current
            .tags
            .iter()
            .filter(|t| !tags.contains(t))
            .map(String::as_str)
            .collect();
        if !added.is_empty() {
            trace.push(format!("Tags added: {} {BY_PERSON}", added.join(", ")));
        }
        if !removed.is_empty() {
            trace.push(format!("Tags removed: {} {BY_PERSON}", removed.join(", ")));
        }
        if !added.is_empty() || !removed.is_empty() {
            ticket.tags = tags;
            changes.push("tags");
        }
    }

    if let Some(fields) = patch.fields {
        let mut any = false;
        for (name, value) in fields {
            if value.is_null() {
                if ticket.fields.remove(&name).is_some() {
                    trace.push(format!("Field {name} cleared {BY_PERSON}"));
                    any = true;
                }
            } else if ticket.fields.get(&name) != Some(&value) {
                trace.push(format!("Field {name} set to {} {BY_PERSON}", shown(&value)));
                ticket.fields.insert(name, value);
                any = true;
            }
        }
        if any {
            changes.push("fields");
        }
    }

    if let Some(member) = assignee
        && current.assignee_id.as_deref() != member.as_ref().map(|m| m.id.as_str())
    {
        trace.push(match &member {
            Some(m) => format!("Assigned to {} {BY_PERSON}", m.name),
            None => format!("Unassigned {BY_PERSON}"),
        });
        ticket.assignee_id = member.as_ref().map(|m| m.id.clone());
        ticket.assignee_name = member.map(|m| m.name);
        changes.push("assignee");
    }

    if let Some(title) = patch.title {
        let title = title.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
        if title != current.title {
            trace.push(match &title {
                Some(t) => format!("Title set to \u{201c}{t}\u{201d} {BY_PERSON}"),
                None => format!("Title cleared {BY_PERSON}"),
            });
            ticket.title = title;
            changes.push("title");
        }
    }

    if changes.is_empty() {
        return Ok(None);
    }
    // Strictly later than the version read, so that the next writer's
    // optimistic check sees this write even within the same millisecond.
    ticket.updated_at = tok_store::now_ms().max(current.updated_at + 1);
    Ok(Some(TicketWrite {
        ticket,
        created: false,
        changes: changes.into_iter().map(str::to_owned).collect(),
        trace,
    }))
}

/// A person acting through the API: no run, no automation, depth 0.
fn person() -> Cause {
    Cause {
        run_id: None,
        automation_id: None,
        depth: 0,
        actor: "api".into(),
    }
}

/// A type of the tenant by name (or id); a 400 naming it and the types
/// that exist otherwise.
fn find_type<'a>(types: &'a [TicketType], name: &str) -> ApiResult<&'a TicketType> {
    let name = name.trim();
    types
        .iter()
        .find(|t| t.name == name || t.id == name)
        .ok_or_else(|| {
            let known: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
            let hint = if known.is_empty() {
                "there are no ticket types yet".to_owned()
            } else {
                format!("the ticket types are: {}", known.join(", "))
            };
            ApiError::bad_request(
                "unknown_type",
                format!(
                    "ticket type `{name}` does not exist; {hint} (create one with POST /api/ticket-types)"
                ),
            )
            .with("type", name)
            .with("allowed", known)
        })
}

/// A status checked against the ticket's type; a 400 listing the type's
/// statuses otherwise.
fn checked_status(ticket_type: Option<&TicketType>, status: String) -> ApiResult<String> {
    let status = status.trim().to_owned();
    let Some(t) = ticket_type else {
        return Err(ApiError::bad_request(
            "invalid_status",
            format!("status `{status}` cannot be set: a ticket without a type has no statuses; give it a `type` too"),
        )
        .with("status", status));
    };
    if t.statuses.contains(&status) {
        return Ok(status);
    }
    Err(ApiError::bad_request(
        "invalid_status",
        format!(
            "status `{status}` is not one of type `{}`'s statuses: {}",
            t.name,
            t.statuses.join(", ")
        ),
    )
    .with("status", status)
    .with("allowed", t.statuses.clone()))
}

/// Tags without blanks and without repeats, in the order given.
fn checked_tags(tags: Vec<String>) -> ApiResult<Vec<String>> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(tags.len());
    for tag in tags {
        let tag = tag.trim().to_owned();
        if tag.is_empty() {
            return Err(ApiError::bad_request(
                "invalid_body",
                "`tags` must not contain an empty tag",
            ));
        }
        if seen.insert(tag.clone()) {
            out.push(tag);
        }
    }
    Ok(out)
}

/// A member of one of the tenant's groups; a 400 otherwise.
async fn find_member(state: &AppState, tenant: &TenantId, id: &str) -> ApiResult<Member> {
    let groups = state.engine.store().groups(tenant).await?;
    groups
        .into_iter()
        .flat_map(|g| g.members)
        .find(|m| m.id == id)
        .ok_or_else(|| {
            ApiError::bad_request(
                "unknown_assignee",
                format!(
                    "`{id}` is not a member of any of your groups; GET /api/groups lists the members and their ids"
                ),
            )
            .with("assignee_id", id)
        })
}

/// A field's value for a trace line: text as it is, anything else as JSON,
/// cut short when long.
fn shown(value: &Value) -> String {
    const MAX: usize = 120;
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() > MAX {
        let cut: String = text.chars().take(MAX).collect();
        format!("{cut}…")
    } else {
        text
    }
}
