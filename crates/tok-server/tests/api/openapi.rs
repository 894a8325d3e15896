//! The OpenAPI document against the code: every route of the router's table
//! is in it, and every JSON answer the API tests see matches the schema it
//! documents for that path, method and status ([`check_reply`], called on
//! each reply by the helpers).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, run};

/// The document as the server serves it.
fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        serde_json::to_value(tok_server::openapi::document()).expect("the document serializes")
    })
}

/// Every route the router serves, as (method, path), from the table it is
/// built from. The dashboard's page and assets (`/`, `/dashboard/…`) are
/// not part of the API and are left out.
fn declared_routes() -> Vec<(String, String)> {
    let mut routes: Vec<(String, String)> = tok_server::route_table()
        .into_iter()
        .filter(|r| r.path != "/" && !r.path.starts_with("/dashboard/"))
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect();
    routes.sort();
    routes.dedup();
    routes
}

#[test]
fn every_route_is_documented() {
    let declared = declared_routes();
    assert!(declared.len() > 40, "the route table has only {declared:?}");
    let paths = &document()["paths"];
    let missing: Vec<String> = declared
        .iter()
        .filter(|(method, path)| paths[path][method.to_lowercase()].is_null())
        .map(|(method, path)| format!("{method} {path}"))
        .collect();
    assert!(
        missing.is_empty(),
        "routes missing from the OpenAPI document (annotate the handler with \
         #[utoipa::path] and list it in its module's `Api`): {missing:#?}"
    );
    let documented: usize = paths
        .as_object()
        .expect("paths")
        .values()
        .map(|item| {
            item.as_object()
                .map_or(0, |ops| ops.len() - ops.contains_key("parameters") as usize)
        })
        .sum();
    assert_eq!(
        documented,
        declared.len(),
        "the document has operations no router declares"
    );
}

/// Every operation says which key it needs, from the router's own table.
#[test]
fn every_operation_says_which_key_it_needs() {
    let doc = document();
    let mut silent = Vec::new();
    for route in tok_server::route_table() {
        let wanted = match route.access {
            tok_server::Access::Tenant(scope) => {
                format!("Needs a key with the `{}` scope", scope.as_str())
            }
            tok_server::Access::Platform => "Needs the platform admin key.".to_owned(),
            tok_server::Access::Public => "No key needed.".to_owned(),
            tok_server::Access::OwnSecret => continue,
        };
        let method = route.method.as_str().to_lowercase();
        let Some(operation) = doc["paths"][route.path].get(&method) else {
            continue; // the dashboard's files are not in the document
        };
        let text = operation["description"].as_str().unwrap_or_default();
        if !text.contains(&wanted) {
            silent.push(format!("{route}: {text:?} lacks {wanted:?}"));
        }
    }
    assert!(silent.is_empty(), "{silent:#?}");
}

/// Every success answer of every operation documents its body: a JSON
/// schema, or a content type that is not JSON (the stream, the metrics).
#[test]
fn every_success_answer_documents_its_body() {
    let mut undocumented = Vec::new();
    for (path, item) in document()["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            let Some(responses) = operation["responses"].as_object() else {
                continue;
            };
            for (status, response) in responses {
                // 204 No Content has no body to document.
                if !status.starts_with('2') || status == "204" {
                    continue;
                }
                let content = response["content"].as_object();
                let documented = content.is_some_and(|c| {
                    c.iter().all(|(kind, media)| {
                        !kind.starts_with("application/json") || media["schema"].is_object()
                    }) && !c.is_empty()
                });
                if !documented {
                    undocumented.push(format!("{} {path} {status}", method.to_uppercase()));
                }
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "answers without a documented body (add `body = …` or `content_type` to the \
         #[utoipa::path] response): {undocumented:#?}"
    );
}

/// The document's template for a concrete path: segments equal, or a
/// `{name}` segment; a template with fewer parameters wins.
fn template_for(path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.split('/').collect();
    document()["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .filter(|template| {
            let parts: Vec<&str> = template.split('/').collect();
            parts.len() == segments.len()
                && parts
                    .iter()
                    .zip(&segments)
                    .all(|(t, s)| t == s || (t.starts_with('{') && t.ends_with('}')))
        })
        .min_by_key(|template| template.matches('{').count())
        .map(String::as_str)
}

/// The compiled schema of one operation's answer, compiled once per test
/// binary: compiling it with all the document's components costs far more
/// than checking an answer.
fn validator(
    template: &str,
    method: &Method,
    status: StatusCode,
    schema: &serde_json::Map<String, Value>,
) -> Arc<jsonschema::Validator> {
    static COMPILED: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let key = format!("{method} {template} {status}");
    let compiled = COMPILED.get_or_init(Mutex::default);
    if let Some(validator) = compiled.lock().unwrap().get(&key) {
        return Arc::clone(validator);
    }
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": document()["components"],
        "allOf": [schema],
    });
    let validator =
        Arc::new(jsonschema::validator_for(&root).expect("the document's schemas compile"));
    compiled.lock().unwrap().insert(key, Arc::clone(&validator));
    validator
}

/// Fails when a JSON answer differs from the schema the document gives for
/// its path, method and status (or `default`), or when a route that answered
/// is not documented at all. Answers of the fallbacks (no such path, no such
/// method) and answers that are not JSON are left alone.
pub(crate) fn check_reply(method: &Method, path: &str, status: StatusCode, body: &Value) {
    let Some(template) = template_for(path) else {
        // The query's U+0000 is refused on every route, the dashboard's
        // pages (outside the document) included.
        assert!(
            matches!(
                status,
                StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
            ) || body["error"]["code"] == "nul_in_query",
            "{method} {path} answered {status} but no path of the OpenAPI document matches it"
        );
        return;
    };
    let operation = &document()["paths"][template][method.as_str().to_lowercase()];
    if operation.is_null() {
        assert!(
            status == StatusCode::METHOD_NOT_ALLOWED || status == StatusCode::NOT_FOUND,
            "{method} {path} answered {status} but the OpenAPI document has no {method} {template}"
        );
        return;
    }
    let responses = &operation["responses"];
    let response = match &responses[status.as_str()] {
        Value::Null if status.is_success() => panic!(
            "{method} {template} answered {status}, which its OpenAPI responses do not list: {}",
            responses
        ),
        Value::Null => &responses["default"],
        r => r,
    };
    let Some(schema) = response["content"]["application/json"]["schema"].as_object() else {
        panic!(
            "{method} {path} ({template}) answered {status} with JSON, but its OpenAPI \
             response documents no JSON schema for it (give the #[utoipa::path] response a \
             `body = …`): {body:#}"
        );
    };
    let validator = validator(template, method, status, schema);
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("at `{}`: {e}", e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} {path} ({template}) answered {status} with a body that differs from its \
         OpenAPI schema:\n{}\nbody: {body:#}",
        errors.join("\n")
    );
}

backend_tests!(run; served_document);

/// `GET /api/openapi.json` needs no key and is an OpenAPI 3.1 document.
async fn served_document(app: &TestApp) {
    let doc = app
        .request(
            Method::GET,
            "/api/openapi.json",
            None,
            &[],
            axum::body::Body::empty(),
        )
        .await
        .expect(StatusCode::OK);
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "{doc:#}"
    );
    assert_eq!(
        doc["paths"]["/api/runs/{id}"]["get"]["parameters"][0]["name"],
        "id"
    );
    assert_eq!(&doc, document());
    let mut ids: Vec<&str> = doc["paths"]
        .as_object()
        .expect("paths")
        .values()
        .flat_map(|item| item.as_object().expect("a path item").values())
        .filter_map(|operation| operation["operationId"].as_str())
        .collect();
    let count = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), count, "operation ids must be unique: {ids:?}");
}

/// The check bites: a body missing a documented field, a field of another
/// type, and a success status the operation does not list all fail it.
#[test]
fn answers_that_differ_from_the_document_fail() {
    let fails = |method: Method, path: &str, status: StatusCode, body: Value| {
        std::panic::catch_unwind(|| check_reply(&method, path, status, &body)).is_err()
    };
    let widget = json!({
        "id": "w1", "name": "Queue", "connection": null, "request": {"url": "https://x.test"},
        "ttl_sec": 60, "fetched_at": null, "created_at": "2026-01-01T00:00:00Z",
    });
    assert!(!fails(
        Method::GET,
        "/api/widgets/w1",
        StatusCode::OK,
        widget.clone()
    ));
    let mut missing = widget.clone();
    missing.as_object_mut().unwrap().remove("ttl_sec");
    assert!(fails(
        Method::GET,
        "/api/widgets/w1",
        StatusCode::OK,
        missing
    ));
    let mut retyped = widget.clone();
    retyped["created_at"] = json!(1_767_225_600_000_i64);
    assert!(fails(
        Method::GET,
        "/api/widgets/w1",
        StatusCode::OK,
        retyped
    ));
    assert!(fails(Method::POST, "/api/widgets", StatusCode::OK, widget));
    assert!(fails(
        Method::GET,
        "/api/runs/r1",
        StatusCode::NOT_FOUND,
        json!({ "message": "no code" })
    ));
    assert!(fails(
        Method::GET,
        "/api/runs",
        StatusCode::OK,
        json!({ "items": [{}] })
    ));
    let tenant = json!({
        "id": "ten_1", "name": "Acme", "suspended": false, "status": "active",
        "created_at": "2026-01-01T00:00:00Z",
    });
    let page = |items: Value| json!({ "items": items, "next_cursor": null });
    assert!(!fails(
        Method::GET,
        "/api/tenants",
        StatusCode::OK,
        page(json!([tenant]))
    ));
    let mut in_ms = tenant.clone();
    in_ms["created_at"] = json!(1_767_225_600_000_i64);
    assert!(fails(
        Method::GET,
        "/api/tenants",
        StatusCode::OK,
        page(json!([in_ms]))
    ));
    assert!(fails(
        Method::GET,
        "/api/tenants",
        StatusCode::OK,
        json!({ "items": [tenant] })
    ));
}
