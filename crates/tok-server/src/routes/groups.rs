//! Groups of people who take tickets: each member has a capacity (how many
//! open tickets suit them), which breaks ties when tickets go to the least
//! busy member. Members keep the order they were given in. Members are
//! added, changed and removed one by one or as a whole list (`PATCH
//! /api/groups/{id}`, what `tok apply` sends); a member with open tickets,
//! or whom an automation's approval step lists, is not removed, nor a group
//! an automation names.

use std::collections::HashSet;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::ids::TenantId;
use tok_core::uses::Kind;
use tok_core::walk::each_step;
use tok_store::{DeskChange, Group, HeldBy, Member, NewGroup};

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::in_use::{User, automations_using, automations_where, conflict, refuse_if_used};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

/// A member's capacity when the request gives none.
const DEFAULT_CAPACITY: i64 = 10;

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/groups", READ, list)
        .post("/api/groups", WRITE, create)
        .get("/api/groups/{id}", READ, show)
        .patch("/api/groups/{id}", WRITE, update)
        .delete("/api/groups/{id}", WRITE, delete)
        .post("/api/groups/{id}/members", WRITE, add_member)
        .patch("/api/groups/{id}/members/{member_id}", WRITE, update_member)
        .delete("/api/groups/{id}/members/{member_id}", WRITE, delete_member)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    list,
    create,
    show,
    update,
    delete,
    add_member,
    update_member,
    delete_member
))]
pub(crate) struct Api;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewGroupBody {
    name: String,
    #[serde(default)]
    members: Vec<NewMember>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMember {
    name: String,
    capacity: Option<i64>,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_body", message)
}

/// A member's capacity as given (`None`: the default), for the member
/// named `name`: a whole number of at least 1.
fn checked_capacity(name: &str, capacity: Option<i64>) -> ApiResult<i32> {
    let capacity = capacity.unwrap_or(DEFAULT_CAPACITY);
    i32::try_from(capacity)
        .ok()
        .filter(|c| *c >= 1)
        .ok_or_else(|| {
            invalid(format!(
                "capacity of `{name}` is {capacity}; it must be at least 1 \
                 (the number of open tickets that suit them; default {DEFAULT_CAPACITY})"
            ))
        })
}

/// A member's name as given: not blank (`at` says where it is).
fn checked_member_name(name: &str, at: &str) -> ApiResult<String> {
    match name.trim() {
        "" => Err(invalid(format!("`{at}` must not be empty"))),
        name => Ok(name.to_owned()),
    }
}

/// A group's members as given: names not blank and unique, capacities of
/// at least 1; as (name, capacity) in their order.
fn checked_members(members: Vec<NewMember>) -> ApiResult<Vec<(String, i32)>> {
    let mut seen = HashSet::new();
    let mut checked = Vec::with_capacity(members.len());
    for (i, member) in members.into_iter().enumerate() {
        let name = checked_member_name(&member.name, &format!("members[{i}].name"))?;
        if !seen.insert(name.clone()) {
            return Err(invalid(format!(
                "`{name}` is listed twice in `members`; names within a group must be unique"
            )));
        }
        let capacity = checked_capacity(&name, member.capacity)?;
        checked.push((name, capacity));
    }
    Ok(checked)
}

/// The 409 of a removal that members' open tickets hold back.
fn held_back(what: &str, held: &[HeldBy]) -> ApiError {
    let users: Vec<User> = held
        .iter()
        .map(|h| {
            User::tickets(
                h,
                "open, assigned to",
                "reassign or close those tickets first (PATCH /api/tickets/{id})",
            )
        })
        .collect();
    conflict(&format!("{what} cannot be removed, held by"), &users)
}

/// The automations whose approval steps list one of `members` by id
/// (`approvers.members`): an approval of theirs would ask nobody, or fewer.
async fn approvals_listing(
    state: &AppState,
    tenant: &TenantId,
    members: &[&Member],
) -> ApiResult<Vec<User>> {
    automations_where(state, tenant, |definition| {
        let mut found = None;
        each_step(&definition.steps, "steps", &mut |path, step| {
            let listed = step
                .config
                .pointer("/approvers/members")
                .and_then(Value::as_array);
            if found.is_some() || step.kind != "approval" {
                return;
            }
            found = listed
                .into_iter()
                .flatten()
                .enumerate()
                .find_map(|(i, id)| {
                    members
                        .iter()
                        .any(|m| id.as_str() == Some(&m.id))
                        .then(|| format!("{path}.config.approvers.members.{i}"))
                });
        });
        found
    })
    .await
}

#[utoipa::path(post, path = "/api/groups", tag = "groups", responses((status = 201, body = crate::openapi::schemas::Group)))]
async fn create(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<NewGroupBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = body.name.trim().to_owned();
    if name.is_empty() {
        return Err(invalid("`name` must not be empty"));
    }
    let members = checked_members(body.members)?;
    let group = state
        .engine
        .store()
        .create_group(&tenant, NewGroup { name, members })
        .await?;
    Ok((StatusCode::CREATED, Json(json!(group))))
}

/// The tenant's group by id (or name), or the 404.
async fn group(state: &AppState, tenant: &TenantId, id: &str) -> ApiResult<Group> {
    state
        .engine
        .store()
        .group(tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("group"))
}

/// A group with its members, by id (or name).
#[utoipa::path(get, path = "/api/groups/{id}", tag = "groups", responses((status = 200, body = crate::openapi::schemas::Group)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(json!(group(&state, &tenant, &id).await?)))
}

/// A change to a group: its members, as the whole list. Its name cannot
/// change; it is taken when it is the group's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupPatchBody {
    name: Option<String>,
    members: Option<Vec<NewMember>>,
}

/// Replaces the group's members by name (what `tok apply` sends): a new
/// name is added, a known one keeps its id and takes the capacity given
/// (the default when none), and one left out is removed, which open
/// tickets assigned to them refuse (409).
#[utoipa::path(patch, path = "/api/groups/{id}", tag = "groups", responses((status = 200, body = crate::openapi::schemas::Group), (status = 409, description = "a member left out holds open tickets (`in_use`, with `used_by` counting them)", body = crate::openapi::ErrorBody)))]
async fn update(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<GroupPatchBody>,
) -> ApiResult<Json<Value>> {
    let current = group(&state, &tenant, &id).await?;
    if let Some(name) = &body.name
        && name.trim() != current.name
    {
        return Err(invalid(format!(
            "`name` cannot change (steps and approvals name the group `{}`): create a group \
             of the new name and point them at it",
            current.name
        ))
        .with("field", "name"));
    }
    let Some(members) = body.members else {
        return Ok(Json(json!(current)));
    };
    let members = checked_members(members)?;
    let leaving: Vec<&Member> = current
        .members
        .iter()
        .filter(|m| !members.iter().any(|(name, _)| *name == m.name))
        .collect();
    let users = approvals_listing(&state, &tenant, &leaving).await?;
    refuse_if_used(
        &format!("a member left out of group `{}`", current.name),
        &users,
    )?;
    match state
        .engine
        .store()
        .set_members(&tenant, &current.id, members)
        .await?
    {
        DeskChange::Done(group) => Ok(Json(json!(group))),
        DeskChange::NotFound => Err(ApiError::not_found("group")),
        DeskChange::Held(held) => Err(held_back(
            &format!("a member of group `{}`", current.name),
            &held,
        )),
    }
}

/// Deletes a group and its members. Refused (409 `in_use`) while an
/// automation names it or its members hold open tickets.
#[utoipa::path(delete, path = "/api/groups/{id}", tag = "groups", responses((status = 204, description = "deleted"), (status = 409, description = "an automation names the group, or its members hold open tickets (`in_use`, with `used_by`)", body = crate::openapi::ErrorBody)))]
async fn delete(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let current = group(&state, &tenant, &id).await?;
    let what = format!("group `{}`", current.name);
    let mut users =
        automations_using(&state, &tenant, Kind::Group, &current.id, &current.name).await?;
    let members: Vec<&Member> = current.members.iter().collect();
    users.extend(approvals_listing(&state, &tenant, &members).await?);
    refuse_if_used(&what, &users)?;
    match state
        .engine
        .store()
        .delete_group(&tenant, &current.id)
        .await?
    {
        DeskChange::Done(()) => Ok(StatusCode::NO_CONTENT),
        DeskChange::NotFound => Err(ApiError::not_found("group")),
        DeskChange::Held(held) => Err(held_back(&what, &held)),
    }
}

/// A member to add to a group.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMemberBody {
    name: String,
    capacity: Option<i64>,
}

/// Adds a member after the group's others.
#[utoipa::path(post, path = "/api/groups/{id}/members", tag = "groups", responses((status = 201, body = crate::openapi::schemas::Member)))]
async fn add_member(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<NewMemberBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let current = group(&state, &tenant, &id).await?;
    let name = checked_member_name(&body.name, "name")?;
    let capacity = checked_capacity(&name, body.capacity)?;
    let member = state
        .engine
        .store()
        .add_member(&tenant, &current.id, &name, capacity)
        .await?
        .ok_or_else(|| ApiError::not_found("group"))?;
    Ok((StatusCode::CREATED, Json(json!(member))))
}

/// A change to a member: its capacity.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberPatchBody {
    capacity: i64,
}

/// Sets a member's capacity.
#[utoipa::path(patch, path = "/api/groups/{id}/members/{member_id}", tag = "groups", responses((status = 200, body = crate::openapi::schemas::Member)))]
async fn update_member(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path((id, member_id)): Path<(String, String)>,
    JsonBody(body): JsonBody<MemberPatchBody>,
) -> ApiResult<Json<Value>> {
    let current = group(&state, &tenant, &id).await?;
    let member = current
        .members
        .iter()
        .find(|m| m.id == member_id)
        .ok_or_else(|| ApiError::not_found("member"))?;
    let capacity = checked_capacity(&member.name, Some(body.capacity))?;
    let member = state
        .engine
        .store()
        .update_member(&tenant, &current.id, &member.id, capacity)
        .await?
        .ok_or_else(|| ApiError::not_found("member"))?;
    Ok(Json(json!(member)))
}

/// Removes a member from the group. Refused (409 `in_use`, counting them)
/// while open tickets are assigned to them: reassign those first. The
/// closed tickets they had are unassigned, and their trace says so.
#[utoipa::path(delete, path = "/api/groups/{id}/members/{member_id}", tag = "groups", responses((status = 204, description = "removed"), (status = 409, description = "open tickets are assigned to the member (`in_use`, with `used_by` counting them)", body = crate::openapi::ErrorBody)))]
async fn delete_member(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path((id, member_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let current = group(&state, &tenant, &id).await?;
    let member = current
        .members
        .iter()
        .find(|m| m.id == member_id)
        .ok_or_else(|| ApiError::not_found("member"))?;
    let users = approvals_listing(&state, &tenant, &[member]).await?;
    refuse_if_used(
        &format!("member `{}` of group `{}`", member.name, current.name),
        &users,
    )?;
    match state
        .engine
        .store()
        .delete_member(&tenant, &current.id, &member.id)
        .await?
    {
        DeskChange::Done(()) => Ok(StatusCode::NO_CONTENT),
        DeskChange::NotFound => Err(ApiError::not_found("member")),
        DeskChange::Held(held) => Err(held_back(
            &format!("member `{}` of group `{}`", member.name, current.name),
            &held,
        )),
    }
}

#[utoipa::path(get, path = "/api/groups", tag = "groups", responses((status = 200, body = crate::openapi::schemas::GroupPage)))]
async fn list(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: super::ListingQuery,
) -> ApiResult<Json<Value>> {
    let asked = super::Asked::of("groups", query)?;
    let found = state
        .engine
        .store()
        .groups_page(&tenant, asked.limit, asked.after())
        .await?;
    Ok(asked.answer(found, |g| json!(g)))
}
