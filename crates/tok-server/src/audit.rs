//! The audit log's writer (docs/security.md, "Audit"): every change a key
//! or the platform admin makes through the API is a row of `audit`,
//! written by one layer around every route, so that no handler can forget
//! it.
//!
//! What a route writes is read from the router's own table
//! ([`Route::audit`]): a GET (or HEAD) changes nothing; a route of
//! [`EXEMPT`] is machine traffic too frequent to log, for the reason it
//! gives; every other route writes one row, ahead of its change (below). Its
//! action, `resource.verb`, is derived from the method and the path:
//!
//! | route | action |
//! | --- | --- |
//! | `POST /api/automations` | `automation.created` |
//! | `PUT /api/automations/{id}` | `automation.saved` |
//! | `PATCH /api/connections/{id}` | `connection.updated` |
//! | `DELETE /api/keys/{id}` | `key.deleted`, but [`NAMED`] says `key.revoked` |
//! | `POST /api/runs/{id}/retry` | `run.retried` (a verb of [`VERBS`]) |
//! | `POST /api/groups/{id}/members` | `member.created` |
//! | `PATCH /api/groups/{id}/members/{member}` | `member.updated` |
//!
//! The target is the action's resource, by the answer's `id` (a created
//! resource's, or the changed one's: a path may name a resource by its
//! name, `/api/groups/warehouse`), else by the path's last parameter (a
//! delete answers 204 with no body).
//!
//! A route whose action this cannot derive (`POST /api/approvals/{id}`,
//! two literal segments in a row, a verb not in [`VERBS`]) is named in
//! [`NAMED`] or exempted in [`EXEMPT`]; until then it is [`Audit::Unnamed`],
//! which the API test `audit::every_change_is_audited_or_exempt` refuses
//! (served anyway, it is still audited, as `"<METHOD> <path>"`). A route
//! added through `Routes` is thereby audited without its author doing
//! anything, or at most naming its action.
//!
//! The row: the actor is the caller's key (`{kind: "key", id, name}`; the
//! platform admin key is `{kind: "platform", …}`), never its secret; the
//! tenant is the one the request acted for (`X-Tok-Tenant` for the
//! admin), or for the admin's own routes the tenant changed
//! (`tenant.created`, `tenant.updated`), or none (the platform's own
//! rows, `tenant.deleted` among them: it must outlive the tenant's rows,
//! which the deletion erases). The summary is what the handler attached
//! to its answer ([`AuditNote`]), else a created resource's `name`; the
//! layer never copies a body or a header into a row, so a secret in
//! either (a new key, a tenant's first key, credentials, a signing
//! secret) cannot reach the log.
//!
//! **When: written ahead.** A crash must not lose the row of a change that
//! happened, and the change is made by the handler, in transactions the
//! layer does not see (on a tenant's own database, even, while the log is
//! the shared database's). So the row is written *before* the handler
//! runs, `pending`, and ended after it: `done` after a 2xx (with what the
//! answer made known: a created resource's id, its name); removed after a
//! 4xx, a refusal, which changes nothing; `unknown` after anything else,
//! an error that may have come after the change committed. A process that
//! stops (or a client that goes away) while the handler runs leaves the
//! row `pending`, and the scheduler says `unknown` of it once it is older
//! than [`tok_store::AUDIT_PENDING_GRACE_MS`]: the log may hold a change
//! that did not happen, marked as such, but never misses one that did.
//! A row that cannot be written ahead refuses the change (503
//! `audit_unavailable`); one that cannot be ended is logged at `error`
//! and counted (`tok_audit_write_failures_total`), and the caller still
//! gets the answer of the change it made. The other design, the row in
//! the change's own transaction, would need every store call that changes
//! anything to carry it, and cannot hold for a tenant on a database of
//! its own.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use serde_json::Value;
use tok_core::ids::TenantId;
use tok_store::{Actor, ActorKind, AuditEnd, AuditOutcome, NewAudit, Target};

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::{Access, Route};

/// Changes that are not audited, each with its reason: machine traffic
/// whose volume would drown the log, and which leaves its own record
/// (events, runs, signals).
pub const EXEMPT: &[(&str, &str, &str)] = &[
    (
        "POST",
        "/webhook/{token}",
        "a sender's event, not a change: the inbox keeps every one",
    ),
    (
        "POST",
        "/api/signals",
        "machine traffic: each signal is kept with the runs it resumed",
    ),
    (
        "POST",
        "/api/runs/search",
        "a read whose rules travel in the body: it changes nothing",
    ),
    (
        "POST",
        "/api/automations/{id}/runs",
        "starting a run is the automation's use, not a change to it: the run itself is the record, with its actor",
    ),
];

/// Changes whose action cannot be derived from their method and path, or
/// reads better named.
pub const NAMED: &[(&str, &str, &str)] = &[
    ("POST", "/api/approvals/{id}", "approval.decided"),
    ("DELETE", "/api/keys/{id}", "key.revoked"),
    ("POST", "/api/events/replay", "event.replayed"),
    ("POST", "/api/runs/bulk", "operation.created"),
    (
        "POST",
        "/api/platform/incidents/{id}/resolve",
        "platform_incident.resolved",
    ),
];

/// The verbs a route may end in (`POST …/{id}/<verb>`) and their past
/// tense for the action.
pub const VERBS: &[(&str, &str)] = &[
    ("pause", "paused"),
    ("resume", "resumed"),
    ("retry", "retried"),
    ("cancel", "cancelled"),
    ("rotate", "rotated"),
    ("revoke", "revoked"),
    ("resolve", "resolved"),
    ("decide", "decided"),
    ("replay", "replayed"),
    ("archive", "archived"),
    ("restore", "restored"),
    ("approve", "approved"),
    ("reject", "rejected"),
];

/// What the audit layer does with a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audit {
    /// A read (GET, HEAD): nothing to audit.
    Read,
    /// A change: a row with this action (`resource.verb`) after a 2xx.
    Action(String),
    /// A change that is not audited, for this reason ([`EXEMPT`]).
    Exempt(&'static str),
    /// A change whose action neither derives from its path nor is named
    /// in [`NAMED`]: the route table's test refuses it.
    Unnamed,
}

impl Route {
    /// What the audit layer does with this route (see the module's doc).
    pub fn audit(&self) -> Audit {
        if self.method == Method::GET || self.method == Method::HEAD {
            return Audit::Read;
        }
        let method = self.method.as_str();
        if let Some((_, _, why)) = EXEMPT
            .iter()
            .find(|(m, p, _)| *m == method && *p == self.path)
        {
            return Audit::Exempt(why);
        }
        if let Some((_, _, action)) = NAMED
            .iter()
            .find(|(m, p, _)| *m == method && *p == self.path)
        {
            return Audit::Action((*action).to_owned());
        }
        derive(&self.method, self.path).map_or(Audit::Unnamed, Audit::Action)
    }
}

/// A collection's name in the singular, as actions say it
/// (`ticket-types` → `ticket_type`); `None` for a word that is not a
/// plural.
fn singular(word: &str) -> Option<String> {
    let one = match word.strip_suffix("ies") {
        Some(stem) => format!("{stem}y"),
        None => word.strip_suffix('s')?.to_owned(),
    };
    (!one.is_empty() && one.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        .then(|| one.replace('-', "_"))
}

/// The action of a change by its method and path under `/api/`, whose
/// segments alternate between a collection and an id
/// (`/api/groups/{id}/members/{member}`), optionally ending in a verb of
/// [`VERBS`].
fn derive(method: &Method, path: &str) -> Option<String> {
    let segments: Vec<&str> = path.strip_prefix("/api/")?.split('/').collect();
    let is_param = |s: &str| s.starts_with('{') && s.ends_with('}');
    // A collection, an id, a collection, an id, …
    let alternates = segments
        .iter()
        .enumerate()
        .all(|(i, s)| is_param(s) == (i % 2 == 1));
    let n = segments.len();
    let last = *segments.last()?;
    if is_param(last) {
        // …/{id}: the resource itself.
        let resource = singular(segments[n - 2])?;
        let verb = match *method {
            Method::PUT => "saved",
            Method::PATCH => "updated",
            Method::DELETE => "deleted",
            _ => return None,
        };
        return alternates.then(|| format!("{resource}.{verb}"));
    }
    if *method != Method::POST {
        return None;
    }
    if n >= 3 && is_param(segments[n - 2]) {
        // …/{id}/<verb>: an act on the resource.
        if let Some((_, past)) = VERBS.iter().find(|(verb, _)| *verb == last) {
            let before: Vec<&str> = segments[..n - 1].to_vec();
            let alternate = before
                .iter()
                .enumerate()
                .all(|(i, s)| is_param(s) == (i % 2 == 1));
            let resource = singular(segments[n - 3])?;
            return alternate.then(|| format!("{resource}.{past}"));
        }
    }
    // …/<collection>: one made in it.
    let resource = singular(last)?;
    alternates.then(|| format!("{resource}.created"))
}

/// A few words a handler attaches to its answer for the audit row
/// (`"version 3"`, `"scopes read, write"`): never a secret.
#[derive(Debug, Clone)]
pub(crate) struct AuditNote(pub(crate) String);

impl IntoResponseParts for AuditNote {
    type Error = std::convert::Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

/// The longest summary a row keeps, in characters.
const MAX_SUMMARY_CHARS: usize = 300;

/// The largest answer the layer reads for the resource's id.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// What a route writes, decided once from the table.
#[derive(Clone)]
struct Plan {
    action: String,
    /// The target's kind: the action's resource.
    kind: String,
    /// A resource made: its `name` in the answer is the default summary.
    created: bool,
    access: Access,
}

/// The route table's audit plans by method and path, for [`record`].
#[derive(Clone)]
pub(crate) struct Auditor {
    state: AppState,
    plans: Arc<HashMap<(Method, &'static str), Plan>>,
}

impl Auditor {
    pub(crate) fn new(state: AppState, table: &[Route]) -> Self {
        let plans = table
            .iter()
            .filter_map(|route| {
                let action = match route.audit() {
                    Audit::Action(action) => action,
                    Audit::Unnamed => format!("{} {}", route.method, route.path),
                    Audit::Read | Audit::Exempt(_) => return None,
                };
                let kind = action
                    .split_once('.')
                    .map_or("unknown", |(kind, _)| kind)
                    .to_owned();
                let plan = Plan {
                    created: action.ends_with(".created"),
                    action,
                    kind,
                    access: route.access,
                };
                Some(((route.method.clone(), route.path), plan))
            })
            .collect();
        Self {
            state,
            plans: Arc::new(plans),
        }
    }
}

/// Describes the audit's counter: its `# HELP` in `/metrics`.
pub(crate) fn describe() {
    metrics::describe_counter!(
        "tok_audit_write_failures_total",
        "Changes made whose audit row could not be written (each also logged)"
    );
}

/// Writes a change's row `pending` before its handler runs, and ends it
/// after: `done` for a 2xx, gone for a 4xx (refused: nothing was made),
/// `unknown` for anything else (an error that may have come after the
/// change committed). A change whose row could not be written is not
/// made: the caller gets 503 `audit_unavailable`. Sits inside
/// [`crate::auth::authorize`], so the caller is known.
pub(crate) async fn record(
    State(auditor): State<Auditor>,
    request: Request,
    next: Next,
) -> Response {
    let plan = request
        .extensions()
        .get::<MatchedPath>()
        .and_then(|path| {
            auditor
                .plans
                .get(&(request.method().clone(), path.as_str()))
        })
        .cloned();
    let Some(plan) = plan else {
        return next.run(request).await;
    };
    let (mut parts, body) = request.into_parts();
    let caller = parts.extensions.get::<Caller>().cloned();
    let acting_for = parts
        .headers
        .get("x-tok-tenant")
        .and_then(|v| v.to_str().ok())
        .map(|v| TenantId::from(v.trim()));
    let last_param = match RawPathParams::from_request_parts(&mut parts, &()).await {
        Ok(params) => params.iter().last().map(|(_, value)| value.to_owned()),
        Err(_) => None,
    };
    let actor = match &caller {
        Some(Caller(key)) => Actor {
            kind: match key.tenant_id {
                Some(_) => ActorKind::Key,
                None => ActorKind::Platform,
            },
            id: Some(key.id.clone()),
            name: Some(key.name.clone()),
        },
        None => Actor {
            kind: ActorKind::Anonymous,
            id: None,
            name: None,
        },
    };
    let tenant_of = |target_id: Option<&String>| match plan.access {
        Access::Tenant(_) => match &caller {
            Some(Caller(key)) => key.tenant_id.clone().or_else(|| acting_for.clone()),
            None => None,
        },
        // A tenant's deletion is the platform's own row: it outlives the
        // tenant's rows, which the deletion erases.
        _ if plan.kind == "tenant" && plan.action != "tenant.deleted" => {
            target_id.cloned().map(TenantId::from)
        }
        _ => None,
    };
    let store = auditor.state.engine.store();
    let ahead = NewAudit {
        tenant_id: tenant_of(last_param.as_ref()),
        actor,
        action: plan.action.clone(),
        target: Target {
            kind: plan.kind.clone(),
            id: last_param.clone(),
        },
        summary: None,
    };
    let pending = match store.begin_audit(ahead).await {
        Ok(row) => row,
        Err(e) => {
            metrics::counter!("tok_audit_write_failures_total").increment(1);
            tracing::error!(action = %plan.action, error = %e, "a change was refused: its audit row could not be written first");
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "audit_unavailable",
                "the change was not made: its audit row could not be written first; try again shortly",
            )
            .into_response();
        }
    };
    let response = next.run(Request::from_parts(parts, body)).await;
    let status = response.status();
    if status.is_client_error() {
        if let Err(e) = store.drop_audit(&pending).await {
            tracing::warn!(action = %plan.action, error = %e, "the audit row of a refused change could not be removed; the scheduler will say its outcome is unknown");
        }
        return response;
    }
    let note = response.extensions().get::<AuditNote>().cloned();
    // The answer is read only for what a row names of it: the resource's
    // id, and a created one's name.
    let (response, answer) = if status.is_success() {
        let (parts, body) = response.into_parts();
        match axum::body::to_bytes(body, MAX_ANSWER_BYTES).await {
            Ok(bytes) => {
                let answer = serde_json::from_slice::<Value>(&bytes).ok();
                (
                    Response::from_parts(parts, axum::body::Body::from(bytes)),
                    answer,
                )
            }
            Err(e) => {
                tracing::error!(action = %plan.action, error = %e, "could not read an answer to audit it");
                (Response::from_parts(parts, axum::body::Body::empty()), None)
            }
        }
    } else {
        (response, None)
    };
    let answered = |key: &str| {
        answer
            .as_ref()
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let target_id = answered("id").or(last_param);
    let (outcome, summary) = if status.is_success() {
        let summary = note
            .map(|n| n.0)
            .or_else(|| plan.created.then(|| answered("name")).flatten());
        (AuditOutcome::Done, summary)
    } else {
        (
            AuditOutcome::Unknown,
            Some(format!(
                "answered {status}: the change may or may not have been made"
            )),
        )
    };
    let end = AuditEnd {
        outcome,
        tenant_id: tenant_of(target_id.as_ref()),
        target_id,
        summary: summary.map(|s| clip(&s)),
    };
    if let Err(e) = store.end_audit(&pending, end).await {
        metrics::counter!("tok_audit_write_failures_total").increment(1);
        tracing::error!(action = %plan.action, error = %e, "the change's audit row stays pending: the scheduler will say its outcome is unknown");
    }
    response
}

/// `text` cut to [`MAX_SUMMARY_CHARS`].
fn clip(text: &str) -> String {
    match text.char_indices().nth(MAX_SUMMARY_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(method: Method, path: &str) -> Option<String> {
        derive(&method, path)
    }

    #[test]
    fn actions_derive_from_the_method_and_the_path() {
        for (method, path, expected) in [
            (Method::POST, "/api/automations", Some("automation.created")),
            (
                Method::PUT,
                "/api/automations/{id}",
                Some("automation.saved"),
            ),
            (
                Method::DELETE,
                "/api/automations/{id}",
                Some("automation.deleted"),
            ),
            (
                Method::PATCH,
                "/api/ticket-types/{id}",
                Some("ticket_type.updated"),
            ),
            (
                Method::POST,
                "/api/automations/{id}/pause",
                Some("automation.paused"),
            ),
            (
                Method::POST,
                "/api/sources/{id}/rotate",
                Some("source.rotated"),
            ),
            (Method::POST, "/api/runs/{id}/retry", Some("run.retried")),
            (
                Method::POST,
                "/api/groups/{id}/members",
                Some("member.created"),
            ),
            (
                Method::PATCH,
                "/api/groups/{id}/members/{member}",
                Some("member.updated"),
            ),
            (Method::POST, "/api/policies", Some("policy.created")),
            // Not derivable: a POST on an id, two literals in a row, an
            // unknown verb, a word that is no collection.
            (Method::POST, "/api/approvals/{id}", None),
            (Method::POST, "/api/runs/bulk", None),
            (Method::POST, "/api/platform/incidents/{id}/resolve", None),
            (Method::POST, "/api/runs/{id}/frobnicate", None),
            (Method::POST, "/api/dashboard", None),
            (Method::DELETE, "/api/automations", None),
            (Method::POST, "/metrics", None),
        ] {
            assert_eq!(
                action(method.clone(), path).as_deref(),
                expected,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn a_long_summary_is_clipped() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(MAX_SUMMARY_CHARS + 5);
        assert_eq!(clip(&long).chars().count(), MAX_SUMMARY_CHARS + 1);
    }
}
