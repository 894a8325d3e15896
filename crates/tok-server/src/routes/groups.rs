//! Groups of people who take tickets: each member has a capacity (how many
//! open tickets suit them), which breaks ties when tickets go to the least
//! busy member. Members keep the order they were given in.

use std::collections::HashSet;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::NewGroup;

use crate::AppState;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, READ, Routes, WRITE};

/// A member's capacity when the request gives none.
const DEFAULT_CAPACITY: i64 = 10;

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/groups", READ, list)
        .post("/api/groups", WRITE, create)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create))]
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
    let mut seen = HashSet::new();
    let mut members = Vec::with_capacity(body.members.len());
    for (i, member) in body.members.into_iter().enumerate() {
        let member_name = member.name.trim().to_owned();
        if member_name.is_empty() {
            return Err(invalid(format!("`members[{i}].name` must not be empty")));
        }
        if !seen.insert(member_name.clone()) {
            return Err(invalid(format!(
                "`{member_name}` is listed twice in `members`; names within a group must be unique"
            )));
        }
        let capacity = member.capacity.unwrap_or(DEFAULT_CAPACITY);
        let capacity = i32::try_from(capacity)
            .ok()
            .filter(|c| *c >= 1)
            .ok_or_else(|| {
                invalid(format!(
                    "capacity of `{member_name}` is {capacity}; it must be at least 1 \
                     (the number of open tickets that suit them; default {DEFAULT_CAPACITY})"
                ))
            })?;
        members.push((member_name, capacity));
    }
    let group = state
        .engine
        .store()
        .create_group(&tenant, NewGroup { name, members })
        .await?;
    Ok((StatusCode::CREATED, Json(json!(group))))
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
