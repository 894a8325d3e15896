//! U+0000 in everything a client sends: every query parameter of every
//! `GET` route, and a string and a key of the JSON body of every route that
//! takes one, each answered 400 naming where — `nul_in_query` with the
//! parameter, `nul_in_json` with the body's JSON pointer — on both
//! backends alike (PostgreSQL cannot hold the character; it answered 503
//! "database did not answer"), and nothing of it stored.
//!
//! The routes come from the router's own table (`tok_server::route_table`)
//! and each route's query parameters from the server itself: the names the
//! OpenAPI document declares, and those a listing lists when it refuses an
//! unknown one. A route added later is tried without a change here; one
//! that takes no body is named in [`NO_BODY`], so that a route which takes
//! one cannot be missed.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use tok_server::{Access, Route};

use crate::helpers::{Reply, Tenant, TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    nul_in_any_query_parameter_of_any_get_route_is_a_400_naming_it,
    nul_in_any_json_body_is_a_400_naming_where,
);

/// Routes of `POST`, `PUT` or `PATCH` that read no body: what they are sent
/// is not read, so it cannot be stored.
const NO_BODY: &[&str] = &[
    "POST /api/automations/{id}/pause",
    "POST /api/automations/{id}/resume",
    "POST /api/runs/{id}/retry",
    "POST /api/runs/{id}/cancel",
    "POST /api/runs/{id}/pause",
    "POST /api/runs/{id}/resume",
    "POST /api/operations/{id}/cancel",
    "POST /api/incidents/{id}/resolve",
    "POST /api/platform/incidents/{id}/resolve",
];

/// A guard against a request that never answers (a stream): answered in
/// time, or the case fails.
const PATIENCE: Duration = Duration::from_secs(20);

struct Setup {
    tenant: Tenant,
    token: String,
}

async fn setup(app: &TestApp) -> Setup {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(&tenant, &json!({ "name": "orders", "params": [] }))
        .await;
    Setup {
        tenant,
        token: source["token"].as_str().unwrap().to_owned(),
    }
}

/// The route's path with its parameters filled in, and the key that may
/// call it.
fn target<'a>(route: &Route, setup: &'a Setup, app: &'a TestApp) -> (String, Option<&'a str>) {
    let path = route
        .path
        .split('/')
        .map(|part| match part {
            "{token}" => setup.token.clone(),
            p if p.starts_with('{') => "1".to_owned(),
            p => p.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("/");
    let key = match route.access {
        Access::Public => None,
        Access::OwnSecret | Access::Platform => Some(app.admin_key.as_str()),
        Access::Tenant(_) => Some(setup.tenant.key.as_str()),
    };
    (path, key)
}

async fn send(
    app: &TestApp,
    method: Method,
    uri: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> Reply {
    let headers: &[(&str, &str)] = if body.is_some() {
        &[("content-type", "application/json")]
    } else {
        &[]
    };
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_owned()));
    tokio::time::timeout(PATIENCE, app.request(method, uri, key, headers, body))
        .await
        .unwrap_or_else(|_| panic!("{uri}: no answer within {PATIENCE:?}"))
}

/// The query parameters of every `GET` route: those the OpenAPI document
/// declares, and those a route lists when it refuses one it does not know.
async fn query_parameters(
    app: &TestApp,
    setup: &Setup,
    route: &Route,
    document: &Value,
) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let declared = document["paths"][route.path]["get"]["parameters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for parameter in declared {
        if parameter["in"] == "query"
            && let Some(name) = parameter["name"].as_str()
        {
            names.insert(name.to_owned());
        }
    }
    let (path, key) = target(route, setup, app);
    // A route that answers with a stream (`/api/stream`) keeps it open: it
    // lists nothing, and what the document declares is tried.
    let unknown = format!("{path}?zzz_unknown=1");
    let asked = app.request(Method::GET, &unknown, key, &[], Body::empty());
    let Ok(refused) = tokio::time::timeout(Duration::from_secs(2), asked).await else {
        names.insert("q".to_owned());
        return names;
    };
    if let Some(message) = refused.body["error"]["message"].as_str()
        && let Some((_, expected)) = message.split_once("expected one of ")
    {
        for name in expected.split(", ") {
            let name = name.trim_matches(|c: char| !(c.is_alphanumeric() || c == '_'));
            if !name.is_empty() {
                names.insert(name.to_owned());
            }
        }
    }
    // A route that reads no query at all still gets one.
    names.insert("q".to_owned());
    names
}

async fn nul_in_any_query_parameter_of_any_get_route_is_a_400_naming_it(app: &TestApp) {
    app.state.set_ready();
    let setup = setup(app).await;
    let document = send(app, Method::GET, "/api/openapi.json", None, None)
        .await
        .expect(StatusCode::OK);
    let mut failures = Vec::new();
    let mut tried = 0;
    for route in tok_server::route_table() {
        if route.method != Method::GET {
            continue;
        }
        let names = query_parameters(app, &setup, &route, &document).await;
        let (path, key) = target(&route, &setup, app);
        for name in &names {
            for query in [format!("{name}=%00"), format!("{name}=a%00b&zzz=1")] {
                tried += 1;
                let uri = format!("{path}?{query}");
                let reply = send(app, Method::GET, &uri, key, None).await;
                let error = &reply.body["error"];
                if reply.status != StatusCode::BAD_REQUEST
                    || error["code"] != "nul_in_query"
                    || error["param"] != name.as_str()
                    || !error["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(name.as_str()))
                {
                    failures.push(format!("GET {uri}: {} {}", reply.status, reply.body));
                }
            }
        }
    }
    assert!(tried > 100, "every GET route was tried: {tried} requests");
    assert!(
        failures.is_empty(),
        "{} answers were not 400 nul_in_query naming the parameter:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Requests that once answered 503 from PostgreSQL.
    for uri in [
        "/api/audit?action=%00",
        "/api/tickets?external_id=%00",
        "/api/runs?automation=%00",
        "/api/runs?event=%00",
    ] {
        let error = app
            .get(&setup.tenant.key, uri)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "nul_in_query");
        let param = uri.split_once('?').unwrap().1.split_once('=').unwrap().0;
        assert_eq!(error["param"], param, "{uri}");
    }
}

async fn nul_in_any_json_body_is_a_400_naming_where(app: &TestApp) {
    app.state.set_ready();
    let setup = setup(app).await;
    let table: Vec<String> = tok_server::route_table()
        .iter()
        .map(ToString::to_string)
        .collect();
    for name in NO_BODY {
        assert!(
            table.iter().any(|r| r == name),
            "{name} is no route: {table:#?}"
        );
    }
    let mut failures = Vec::new();
    let mut read = 0;
    for route in tok_server::route_table() {
        if ![Method::POST, Method::PUT, Method::PATCH].contains(&route.method) {
            continue;
        }
        let (path, key) = target(&route, &setup, app);
        let name = route.to_string();
        let takes_none = NO_BODY.contains(&name.as_str());
        for (body, pointer) in [
            (r#"{"name": "a\u0000b"}"#, "/name"),
            (r#"{"items": [1, {"k\u0000": true}]}"#, "/items/1/k\u{0}"),
        ] {
            let reply = send(app, route.method.clone(), &path, key, Some(body)).await;
            if takes_none {
                if reply.status.is_server_error() || reply.body["error"]["code"] == "nul_in_json" {
                    failures.push(format!(
                        "{name}: {} {} (a route that reads its body is not for NO_BODY)",
                        reply.status, reply.body
                    ));
                }
                continue;
            }
            read += 1;
            let error = &reply.body["error"];
            if reply.status != StatusCode::BAD_REQUEST
                || error["code"] != "nul_in_json"
                || error["path"] != pointer
            {
                failures.push(format!(
                    "{name} with {body}: {} {} (a route that takes no body goes in NO_BODY)",
                    reply.status, reply.body
                ));
            }
        }
    }
    assert!(read > 40, "every route with a body was tried: {read}");
    assert!(
        failures.is_empty(),
        "{} answers were not 400 nul_in_json naming where:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // A source named with U+0000, and nothing of it was kept.
    let error = app
        .post(
            &setup.tenant.key,
            "/api/sources",
            &json!({ "name": "a\u{0}b" }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "nul_in_json");
    assert_eq!(error["path"], "/name");
    let sources = app
        .get(&setup.tenant.key, "/api/sources")
        .await
        .expect(StatusCode::OK);
    assert_eq!(sources["items"].as_array().unwrap().len(), 1, "{sources:#}");
}
