//! The one answer of a delete (or a change) that would break what uses a
//! resource: 409 `in_use`, naming each user and where it refers to the
//! resource, so the caller knows what to change first: a resource in use
//! says so instead of breaking what uses it (README.md, "Changing and
//! deleting, and setup kept in git"). A user is an automation, a widget, or
//! tickets (counted) that hold a part of the resource.

use axum::http::StatusCode;
use serde_json::{Value, json};
use tok_core::definition::Automation;
use tok_core::ids::TenantId;
use tok_core::uses::{Kind, refers_to};
use tok_store::{AutomationStatus, HeldBy, Widget};

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
    /// For tickets: how many, and how they hold the part named `name`
    /// (`open, assigned to`).
    pub(crate) tickets: Option<(i64, &'static str)>,
    /// What the caller does about this user before trying again.
    pub(crate) fix: &'static str,
}

impl User {
    /// An automation whose field at `path` names the resource.
    pub(crate) fn automation(id: String, name: String, path: String) -> User {
        User {
            kind: "automation",
            id,
            name,
            path: Some(path),
            tickets: None,
            fix: "change or delete those automations first",
        }
    }

    /// A widget whose field at `path` names the resource.
    pub(crate) fn widget(widget: &Widget, path: &str) -> User {
        User {
            kind: "widget",
            id: widget.id.clone(),
            name: widget.name.clone(),
            path: Some(path.to_owned()),
            tickets: None,
            fix: "change or delete those widgets first",
        }
    }

    /// Tickets the store found holding a part of the resource: `how` they
    /// hold it (`open, assigned to`), and what to do about them.
    pub(crate) fn tickets(held: &HeldBy, how: &'static str, fix: &'static str) -> User {
        User {
            kind: "tickets",
            id: held.id.clone(),
            name: held.name.clone(),
            path: None,
            tickets: Some((held.tickets, how)),
            fix,
        }
    }

    /// A run that has not ended and is about the resource (a ticket).
    pub(crate) fn run(id: &str) -> User {
        User {
            kind: "run",
            id: id.to_owned(),
            name: id.to_owned(),
            path: None,
            tickets: None,
            fix: "wait for those runs to end, or cancel them, first",
        }
    }

    /// Events about the resource (a ticket) not dispatched yet.
    pub(crate) fn pending_events(count: i64) -> User {
        User {
            kind: "events",
            id: "pending".to_owned(),
            name: format!("{count} not dispatched yet"),
            path: None,
            tickets: None,
            fix: "try again once the events about it are dispatched (a moment)",
        }
    }

    fn view(&self) -> Value {
        let mut view =
            json!({ "kind": self.kind, "id": self.id, "name": self.name, "path": self.path });
        if let Some((count, _)) = self.tickets {
            view["count"] = json!(count);
        }
        view
    }

    fn describe(&self) -> String {
        match (&self.path, self.tickets) {
            (_, Some((count, how))) => {
                let tickets = if count == 1 { "ticket" } else { "tickets" };
                format!("{count} {tickets} ({how} `{}`)", self.name)
            }
            (Some(path), None) => format!("{} `{}` at {path}", self.kind, self.name),
            (None, None) => format!("{} `{}`", self.kind, self.name),
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
    automations_where(state, tenant, |definition| {
        refers_to(definition, kind, id, name).map(|found| found.path)
    })
    .await
}

/// The tenant's automations for which `found` answers a path: the field
/// where each uses what is looked for.
pub(crate) async fn automations_where(
    state: &AppState,
    tenant: &TenantId,
    found: impl Fn(&Automation) -> Option<String>,
) -> ApiResult<Vec<User>> {
    let automations = state.engine.store().automations(tenant).await?;
    Ok(automations
        .iter()
        .filter(|row| row.status != AutomationStatus::Archived)
        .filter_map(|row| {
            let definition: Automation = serde_json::from_value(row.definition.clone()).ok()?;
            let path = found(&definition)?;
            Some(User::automation(row.id.to_string(), row.name.clone(), path))
        })
        .collect())
}

/// The tenant's widgets that call through the connection whose id is `id`
/// and whose name is `name` (a widget names it by either).
pub(crate) async fn widgets_using(
    state: &AppState,
    tenant: &TenantId,
    id: &str,
    name: &str,
) -> ApiResult<Vec<User>> {
    let widgets = state
        .engine
        .store()
        .widgets_through(tenant, id, name)
        .await?;
    Ok(widgets
        .iter()
        .map(|widget| User::widget(widget, "connection"))
        .collect())
}

/// `Ok` when nothing uses the resource; else the 409 that names every user.
/// `what` names the resource as a person would (``connection `shop` ``).
pub(crate) fn refuse_if_used(what: &str, users: &[User]) -> ApiResult<()> {
    refuse_if_any(&format!("{what} is in use by"), users)
}

/// `Ok` without users; else the 409 of [`conflict`].
pub(crate) fn refuse_if_any(refused: &str, users: &[User]) -> ApiResult<()> {
    match users.is_empty() {
        true => Ok(()),
        false => Err(conflict(refused, users)),
    }
}

/// The 409 `in_use` that says `refused` (what is refused, up to the list
/// of users: ``connection `shop` is in use by``), names every user and
/// what to do about each kind.
pub(crate) fn conflict(refused: &str, users: &[User]) -> ApiError {
    let named: Vec<String> = users.iter().take(10).map(User::describe).collect();
    let more = match users.len() {
        n if n > 10 => format!(" and {} more", n - 10),
        _ => String::new(),
    };
    let mut fixes: Vec<&str> = Vec::new();
    for user in users {
        if !fixes.contains(&user.fix) {
            fixes.push(user.fix);
        }
    }
    ApiError::new(
        StatusCode::CONFLICT,
        "in_use",
        format!("{refused} {}{more}; {}", named.join(", "), fixes.join("; ")),
    )
    .with(
        "used_by",
        users.iter().map(User::view).collect::<Vec<Value>>(),
    )
}
