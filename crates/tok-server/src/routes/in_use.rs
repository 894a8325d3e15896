//! The one answer of a delete (or a change) that would break what uses a
//! resource: 409 `in_use`, naming each user and where it refers to the
//! resource, so the caller knows what to change first (DESIGN §15: "a
//! resource in use says so instead of breaking them").

use axum::http::StatusCode;
use serde_json::{Value, json};
use tok_core::definition::Automation;
use tok_core::ids::TenantId;
use tok_core::uses::{Kind, refers_to};
use tok_store::AutomationStatus;

use crate::AppState;
use crate::error::{ApiError, ApiResult};

/// Something that uses a resource: an automation (with the path of the
/// field that names the resource), a widget, tickets.
#[derive(Debug, Clone)]
pub(crate) struct User {
    /// `automation`, `widget`, `tickets`, …
    pub(crate) kind: &'static str,
    pub(crate) id: String,
    pub(crate) name: String,
    /// Where the user names the resource (`steps.2.config.connection`).
    pub(crate) path: Option<String>,
}

impl User {
    fn view(&self) -> Value {
        json!({ "kind": self.kind, "id": self.id, "name": self.name, "path": self.path })
    }

    fn describe(&self) -> String {
        match &self.path {
            Some(path) => format!("{} `{}` at {path}", self.kind, self.name),
            None => format!("{} `{}`", self.kind, self.name),
        }
    }
}

/// The tenant's automations that refer to the resource of `kind` by its id
/// or its name (archived automations are gone and start nothing: they do
/// not count).
pub(crate) async fn automations_using(
    state: &AppState,
    tenant: &TenantId,
    kind: Kind,
    id: &str,
    name: &str,
) -> ApiResult<Vec<User>> {
    let automations = state.engine.store().automations(tenant).await?;
    Ok(automations
        .iter()
        .filter(|row| row.status != AutomationStatus::Archived)
        .filter_map(|row| {
            let definition: Automation = serde_json::from_value(row.definition.clone()).ok()?;
            let found = refers_to(&definition, kind, id, name)?;
            Some(User {
                kind: "automation",
                id: row.id.to_string(),
                name: row.name.clone(),
                path: Some(found.path),
            })
        })
        .collect())
}

/// `Ok` when nothing uses the resource; else the 409 that names every user.
/// `what` names the resource as a person would (``connection `shop` ``).
pub(crate) fn refuse_if_used(what: &str, users: &[User]) -> ApiResult<()> {
    if users.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = users.iter().take(10).map(User::describe).collect();
    let more = match users.len() {
        n if n > 10 => format!(" and {} more", n - 10),
        _ => String::new(),
    };
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "in_use",
        format!(
            "{what} is in use by {}{more}; change or delete those first",
            named.join(", ")
        ),
    )
    .with(
        "used_by",
        users.iter().map(User::view).collect::<Vec<Value>>(),
    ))
}
