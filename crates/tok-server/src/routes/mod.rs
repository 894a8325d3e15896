//! One router per resource, each built as a [`Routes`]: the axum router and
//! the table of what it serves, made together. axum cannot list a router's
//! routes, and a list kept beside the router would drift from it; a route
//! added any other way than through [`Routes`] is not served at all. The
//! tests read the table (`tok_server::route_table`): the OpenAPI document
//! must have every route, and every route must be covered by the tenant
//! isolation test and the scope test. Each route states who may call it
//! ([`Access`]); the authorizer enforces the table.

pub(crate) mod approvals;
pub(crate) mod audit;
pub(crate) mod automations;
pub(crate) mod connections;
pub(crate) mod dashboard;
pub(crate) mod events;
pub(crate) mod groups;
pub(crate) mod health;
pub(crate) mod in_use;
pub(crate) mod incidents;
pub(crate) mod keys;
pub(crate) mod metrics;
pub(crate) mod operations;
pub(crate) mod platform_incidents;
pub(crate) mod runs;
pub(crate) mod search;
pub(crate) mod signals;
pub(crate) mod sources;
pub(crate) mod stream;
pub(crate) mod tenants;
pub(crate) mod ticket_types;
pub(crate) mod tickets;
pub(crate) mod webhook;
pub(crate) mod widgets;

use axum::Router;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{self, MethodRouter};
use serde::Deserialize;
use serde_json::Value;
use tok_store::Scope;

use crate::AppState;
use crate::error::ApiError;

/// One route the router serves: a method on a path (axum's template, with
/// `{name}` for a path parameter), and who may call it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// Who may call a route. The authorizer (`crate::auth::authorize`) reads
/// it from the route table before any handler runs, so a route whose
/// handler forgets to ask for a key is still guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Anyone: health, the OpenAPI document, the dashboard's files.
    Public,
    /// Whoever holds the route's own secret, which the handler checks: a
    /// webhook's token in its URL, `/metrics`'s token.
    OwnSecret,
    /// The platform admin key only.
    Platform,
    /// A tenant's key that grants this scope, or the platform admin key
    /// acting for the tenant (`X-Tok-Tenant`).
    Tenant(Scope),
}

pub(crate) use Access::{OwnSecret, Platform, Public};

/// `Tenant(Read)` and its kin, for the routers' tables.
pub(crate) const READ: Access = Access::Tenant(Scope::Read);
pub(crate) const WRITE: Access = Access::Tenant(Scope::Write);
pub(crate) const SIGNAL: Access = Access::Tenant(Scope::Signal);
pub(crate) const ADMIN: Access = Access::Tenant(Scope::Admin);

/// A router and the table of its routes, added one method at a time.
pub(crate) struct Routes {
    router: Router<AppState>,
    table: Vec<Route>,
}

impl Routes {
    pub(crate) fn new() -> Self {
        Self {
            router: Router::new(),
            table: Vec::new(),
        }
    }

    pub(crate) fn get<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &'static str,
        access: Access,
        handler: H,
    ) -> Self {
        self.on(Method::GET, path, access, routing::get(handler))
    }

    pub(crate) fn post<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &'static str,
        access: Access,
        handler: H,
    ) -> Self {
        self.on(Method::POST, path, access, routing::post(handler))
    }

    pub(crate) fn put<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &'static str,
        access: Access,
        handler: H,
    ) -> Self {
        self.on(Method::PUT, path, access, routing::put(handler))
    }

    pub(crate) fn patch<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &'static str,
        access: Access,
        handler: H,
    ) -> Self {
        self.on(Method::PATCH, path, access, routing::patch(handler))
    }

    pub(crate) fn delete<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &'static str,
        access: Access,
        handler: H,
    ) -> Self {
        self.on(Method::DELETE, path, access, routing::delete(handler))
    }

    /// Adds `method` on `path`; axum merges the methods of one path.
    fn on(
        mut self,
        method: Method,
        path: &'static str,
        access: Access,
        handler: MethodRouter<AppState>,
    ) -> Self {
        self.router = self.router.route(path, handler);
        self.table.push(Route {
            method,
            path,
            access,
        });
        self
    }

    pub(crate) fn merge(mut self, other: Routes) -> Self {
        self.router = self.router.merge(other.router);
        self.table.extend(other.table);
        self
    }

    /// The router and the table of what it serves.
    pub(crate) fn into_parts(self) -> (Router<AppState>, Vec<Route>) {
        (self.router, self.table)
    }
}

/// For a field of a change (`PATCH`) that may be `null`: with
/// `#[serde(default, deserialize_with = "present")]` on an `Option<T>`, a
/// field given (even as `null`, when `T` takes it) is `Some`, an absent
/// one `None`.
pub(crate) fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// The caller's W3C trace context, when it sent a valid one: the runs it
/// starts continue it ([`tok_engine::traces::valid_traceparent`]).
pub(crate) fn traceparent(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(tok_engine::traces::valid_traceparent)
}

/// Refuses JSON (`what`: "the body", "`input`") with U+0000 in a string or
/// key: PostgreSQL cannot store it, and both backends answer alike, with a
/// 400 that names where it is (`crate::nul`).
pub(crate) fn storable_json(what: &str, value: &Value) -> Result<(), ApiError> {
    crate::nul::refuse_in_json(what, value)
}

/// `limit` and `cursor` of every listing.
///
/// Every listing answers `{items, next_cursor}` and reads keyset pages: the
/// cursor names the last row of the page before, so a page stays right while
/// rows are added. The cursor is opaque to clients: the listing's name and the
/// row's key, base64url-encoded, so a cursor that this API did not give out,
/// or that another listing gave out, is a 400 that says so rather than a
/// silently empty page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    pub(crate) limit: Option<u32>,
    pub(crate) cursor: Option<String>,
}

/// The page size when a listing is asked without `limit`.
pub(crate) const DEFAULT_LIMIT: u32 = 50;
/// The largest `limit` a listing takes.
pub(crate) const MAX_LIMIT: u32 = 500;

impl PageQuery {
    /// The page size: 50 by default, at most 500.
    pub(crate) fn limit(&self) -> Result<u32, ApiError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(n @ 1..=MAX_LIMIT) => Ok(n),
            Some(n) => Err(ApiError::bad_request(
                "bad_limit",
                format!("limit is {n}; it must be between 1 and {MAX_LIMIT}"),
            )
            .with("param", "limit")),
        }
    }

    /// The key of the row the page starts after, from the cursor `listing`
    /// gave out; `None` for the first page.
    pub(crate) fn after(&self, listing: &str) -> Result<Option<String>, ApiError> {
        let Some(cursor) = self.cursor.as_deref() else {
            return Ok(None);
        };
        let bad = |why: String| {
            ApiError::bad_request(
                "bad_cursor",
                format!(
                    "cursor `{cursor}` {why}; pass the `next_cursor` of the page before as it is, \
                     or no cursor for the first page"
                ),
            )
            .with("param", "cursor")
        };
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(cursor)
            .map_err(|_| bad("is not a cursor this API gave out".into()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| bad("is not a cursor this API gave out".into()))?;
        match text.split_once(':') {
            Some((from, key)) if from == listing && !key.is_empty() => Ok(Some(key.to_owned())),
            Some((from, _)) if !from.is_empty() && from != listing => Err(bad(format!(
                "is from the {from} listing, not the {listing} listing"
            ))),
            _ => Err(bad("is not a cursor this API gave out".into())),
        }
    }
}

/// The opaque cursor of `listing` for the row key `key` (see [`PageQuery`]).
pub(crate) fn cursor(listing: &str, key: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{listing}:{key}"))
}

/// A listing's answer: `items` and the cursor of the next page (`null` on
/// the last one).
pub(crate) fn page(listing: &str, items: Vec<Value>, next: Option<&str>) -> Value {
    serde_json::json!({ "items": items, "next_cursor": next.map(|key| cursor(listing, key)) })
}

/// The query of a listing without filters, as its handler takes it (a
/// rejection is turned into a 400 by [`Asked::of`]).
pub(crate) type ListingQuery =
    Result<axum::extract::Query<PageQuery>, axum::extract::rejection::QueryRejection>;

/// What a listing without filters was asked for: how many rows, after which
/// key. Its handler reads the page with these and answers with
/// [`Asked::answer`].
pub(crate) struct Asked {
    listing: &'static str,
    pub(crate) limit: u32,
    after: Option<String>,
}

impl Asked {
    /// The page asked of `listing`: a query it does not know (`bad_query`),
    /// a bad `limit` (`bad_limit`) or a cursor it did not give out
    /// (`bad_cursor`) is a 400 that names it.
    pub(crate) fn of(listing: &'static str, query: ListingQuery) -> Result<Self, ApiError> {
        let query = query
            .map(|q| q.0)
            .map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
        Ok(Self {
            listing,
            limit: query.limit()?,
            after: query.after(listing)?,
        })
    }

    /// The key of the row the page starts after (none: the first page).
    pub(crate) fn after(&self) -> Option<&str> {
        self.after.as_deref()
    }

    /// The listing's answer: each row of `found` as `view` shows it, and the
    /// cursor of the next page.
    pub(crate) fn answer<T>(
        &self,
        found: tok_store::Page<T>,
        view: impl Fn(&T) -> Value,
    ) -> axum::Json<Value> {
        let items: Vec<Value> = found.items.iter().map(view).collect();
        axum::Json(page(self.listing, items, found.next_cursor.as_deref()))
    }
}

/// Path parameters whose rejection is an [`ApiError`]. A parameter that is
/// not UTF-8 once decoded, is not of the expected type, or has U+0000 names
/// nothing, so it answers 404 like an id that does not exist — on both
/// backends alike: PostgreSQL cannot even compare text with U+0000, and
/// would fail the lookup instead of finding nothing.
pub(crate) struct Path<T>(pub(crate) T);

impl<T, S> axum::extract::FromRequestParts<S> for Path<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let path = parts.uri.path().to_owned();
        let names_nothing = |why: &str| {
            ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                format!("nothing is served at `{path}`: {why}"),
            )
        };
        if path.contains("%00") {
            return Err(names_nothing("no id has the character U+0000 (%00)"));
        }
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(names_nothing(&rejection.body_text())),
        }
    }
}

/// A JSON body whose rejection is an [`ApiError`] saying what was wrong. A
/// body with U+0000 in a string is `400 nul_in_json` naming where, before
/// anything else is said of it (`crate::nul`).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T, S> axum::extract::FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let JsonBytes(bytes) = JsonBytes::from_request(
            axum::extract::Request::from_parts(parts.clone(), body),
            state,
        )
        .await?;
        let req = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::bad_request("invalid_body", rejection.body_text())),
        }
    }
}

impl<T: serde::de::DeserializeOwned> JsonBody<T> {
    /// Parses bytes already read (through [`JsonBytes`]), with the same
    /// errors as the extractor.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        crate::nul::refuse_in_json_text("the body", bytes)?;
        serde_json::from_slice(bytes).map(Self).map_err(|e| {
            ApiError::bad_request("invalid_body", format!("the body is not valid: {e}"))
        })
    }
}

/// A body read whole, for a handler that parses it itself (an automation's
/// definition, an optional body): a body with U+0000 in a JSON string is
/// `400 nul_in_json` naming where, as with [`JsonBody`].
pub(crate) struct JsonBytes(pub(crate) axum::body::Bytes);

impl<S> axum::extract::FromRequest<S> for JsonBytes
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rejection| {
                let code = match rejection.status() {
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
                    _ => "invalid_body",
                };
                ApiError::new(rejection.status(), code, rejection.body_text())
            })?;
        crate::nul::refuse_in_json_text("the body", &bytes)?;
        Ok(Self(bytes))
    }
}
