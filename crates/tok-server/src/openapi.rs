//! `GET /api/openapi.json`: the OpenAPI 3.1 document of the HTTP API, made
//! from the code by `utoipa`.
//!
//! Each route module says what its routes are: every handler carries a
//! `#[utoipa::path(method, path = "…", responses(…))]` attribute and the
//! module's `Api` lists the handlers (`#[openapi(paths(list, show, …))]`).
//! Adding a route to the document is one line: the attribute on its handler,
//! plus the handler's name in its module's `Api` (a new module: one line in
//! [`document`]). The API test `openapi::every_route_is_documented` reads the
//! router's route table (`crate::route_table`) and fails on any route the
//! document lacks; the API tests validate every JSON answer against the
//! schema documented for its path, method and status, so a shape that drifts
//! from its schema fails them.
//!
//! Every operation also answers errors as [`ErrorBody`] (`default`), and
//! every `{name}` in a path is a string path parameter; [`Conventions`] adds
//! both, so no handler repeats them.

use std::sync::OnceLock;

use axum::Json;
use serde_json::Value;
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::{
    ContentBuilder, ObjectBuilder, Ref, Required, ResponseBuilder, Type, schema::SchemaType,
};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::routes::{self, Public, Routes};

pub(crate) fn router() -> Routes {
    Routes::new().get("/api/openapi.json", Public, serve)
}

/// This document.
#[utoipa::path(get, path = "/api/openapi.json", tag = "openapi", responses((status = 200, description = "The OpenAPI 3.1 document", body = schemas::OpenApiDocument)))]
async fn serve() -> Json<Value> {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    Json(
        DOCUMENT
            .get_or_init(|| serde_json::to_value(document()).expect("the document serializes"))
            .clone(),
    )
}

/// The runs listing under the dashboard's prefix: the same query and answer
/// as `GET /api/runs`.
#[utoipa::path(get, path = "/api/dashboard/runs", tag = "runs", responses((status = 200, body = schemas::RunPage)))]
#[allow(dead_code)]
fn dashboard_runs() {}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "tok",
        description = "A durable multi-tenant automation runtime. Authenticate with `Authorization: Bearer <api key>`; errors are `{\"error\": {\"code\", \"message\", …}}`."
    ),
    paths(serve, dashboard_runs),
    components(schemas(ErrorBody, ErrorDetail))
)]
struct Base;

/// The whole document: [`Base`] and every route module's `Api`.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = Base::openapi();
    for part in [
        routes::health::Api::openapi(),
        routes::webhook::Api::openapi(),
        routes::tenants::Api::openapi(),
        routes::sources::Api::openapi(),
        routes::automations::Api::openapi(),
        routes::runs::Api::openapi(),
        routes::events::Api::openapi(),
        routes::operations::Api::openapi(),
        routes::search::Api::openapi(),
        routes::signals::Api::openapi(),
        routes::approvals::Api::openapi(),
        routes::widgets::Api::openapi(),
        routes::ticket_types::Api::openapi(),
        routes::groups::Api::openapi(),
        routes::tickets::Api::openapi(),
        routes::incidents::Api::openapi(),
        routes::platform_incidents::Api::openapi(),
        routes::connections::Api::openapi(),
        routes::keys::Api::openapi(),
        routes::audit::Api::openapi(),
        routes::metrics::Api::openapi(),
        routes::stream::Api::openapi(),
        routes::dashboard::Api::openapi(),
    ] {
        doc.merge(part);
    }
    Conventions.modify(&mut doc);
    doc
}

/// An error answer, on every route.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

/// What went wrong: a stable `code`, a `message` for people, and fields
/// that say where (`path`, `field`, …) when the error has them.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct ErrorDetail {
    code: String,
    message: String,
}

/// Adds what every operation shares: the error answer and the path
/// parameters.
struct Conventions;

impl Modify for Conventions {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let access: std::collections::HashMap<(String, &str), routes::Access> =
            crate::route_table()
                .into_iter()
                .map(|r| ((r.method.to_string(), r.path), r.access))
                .collect();
        for (path, item) in doc.paths.paths.iter_mut() {
            let names: Vec<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            let operations = [
                ("GET", &mut item.get),
                ("POST", &mut item.post),
                ("PUT", &mut item.put),
                ("PATCH", &mut item.patch),
                ("DELETE", &mut item.delete),
            ];
            for (method, operation) in operations {
                let Some(operation) = operation else {
                    continue;
                };
                // Who may call it, from the router's own table.
                if let Some(needs) = access
                    .get(&(method.to_owned(), path.as_str()))
                    .and_then(|a| who_may_call(*a))
                {
                    let text = operation.description.get_or_insert_with(String::new);
                    if !text.is_empty() {
                        text.push_str("\n\n");
                    }
                    text.push_str(&needs);
                }
                // Handlers of different modules share names (`list`, `show`):
                // the tag makes the id unique, `runs_list`.
                if let (Some(tag), Some(id)) = (
                    operation.tags.as_ref().and_then(|t| t.first()),
                    operation.operation_id.as_mut(),
                ) {
                    *id = format!("{}_{id}", tag.replace('-', "_"));
                }
                for name in &names {
                    let parameters = operation.parameters.get_or_insert_with(Vec::new);
                    if !parameters.iter().any(|p| p.name == *name) {
                        parameters.push(
                            ParameterBuilder::new()
                                .name(*name)
                                .parameter_in(ParameterIn::Path)
                                .required(Required::True)
                                .schema(Some(
                                    ObjectBuilder::new()
                                        .schema_type(SchemaType::Type(Type::String)),
                                ))
                                .build(),
                        );
                    }
                }
                with_errors(operation);
            }
        }
    }
}

/// What an operation's description says of the key it needs; nothing for
/// a route that checks its own secret (its description says which).
fn who_may_call(access: routes::Access) -> Option<String> {
    match access {
        routes::Access::Public => Some("No key needed.".to_owned()),
        routes::Access::OwnSecret => None,
        routes::Access::Platform => Some("Needs the platform admin key.".to_owned()),
        routes::Access::Tenant(scope) => Some(format!(
            "Needs a key with the `{}` scope (or one that grants it; 403 `scope_missing` otherwise).",
            scope.as_str()
        )),
    }
}

/// Adds the error answer as the operation's `default` response.
fn with_errors(operation: &mut utoipa::openapi::path::Operation) {
    let error = ResponseBuilder::new()
        .description("An error: what was wrong, where, and what was expected")
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build();
    operation
        .responses
        .responses
        .entry("default".into())
        .or_insert(error.into());
}

pub(crate) mod schemas;
