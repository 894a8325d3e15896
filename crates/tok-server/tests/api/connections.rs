//! Connections through the API: created with credentials and limits, the
//! credentials never come back (not in the answer to the create, not in a
//! listing), bad limits are refused with what was expected, and another
//! tenant sees none of them.

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    credentials_are_write_only,
    bad_connections_are_refused_with_what_was_expected,
    another_tenants_connections_are_invisible,
);

const SECRET: &str = "sk_live_very_secret_value";

fn invoicing() -> serde_json::Value {
    json!({
        "name": "invoicing",
        "service": "http",
        "base_url": "https://api.invoicing.example/v1",
        "credentials": { "bearer": SECRET },
        "rate": 10, "burst": 20, "max_concurrency": 4,
        "breaker": { "threshold": 3, "cooldown_ms": 5000 }
    })
}

async fn credentials_are_write_only(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let reply = app
        .post(&tenant.key, "/api/connections", &invoicing())
        .await;
    let created = reply.expect(StatusCode::CREATED);
    assert!(!created.to_string().contains(SECRET), "{created}");
    assert_eq!(created["has_credentials"], true);
    assert_eq!(created["rate"], 10.0);
    assert_eq!(created["burst"], 20);
    assert_eq!(created["max_concurrency"], 4);
    assert_eq!(created["breaker"]["threshold"], 3);
    assert_eq!(created["breaker"]["state"], "closed");

    let id = created["id"].as_str().unwrap();
    let one = app
        .get(&tenant.key, &format!("/api/connections/{id}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(one["name"], "invoicing");
    assert!(!one.to_string().contains(SECRET), "{one}");
    let list = app
        .get(&tenant.key, "/api/connections")
        .await
        .expect(StatusCode::OK);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(!list.to_string().contains(SECRET), "{list}");

    app.post(&tenant.key, "/api/connections", &invoicing())
        .await
        .expect_error(StatusCode::CONFLICT, "conflict");
}

async fn bad_connections_are_refused_with_what_was_expected(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let cases = [
        (
            json!({ "name": "x", "service": "ftp" }),
            "expected one of http, mcp",
        ),
        (json!({ "name": "x", "service": "mcp" }), "needs `base_url`"),
        (
            json!({ "name": "x", "service": "http", "base_url": "ftp://x" }),
            "http:// or https://",
        ),
        (
            json!({ "name": "x", "service": "http", "rate": 0 }),
            "must be positive",
        ),
        (
            json!({ "name": "x", "service": "http", "max_concurrency": 0 }),
            "at least 1",
        ),
        (
            json!({ "name": "x", "service": "http", "credentials": "token" }),
            "must be an object",
        ),
        (
            json!({ "name": "x", "service": "http", "credentials": { "bearer": SECRET } }),
            "a connection with `credentials` needs `base_url`",
        ),
        (
            json!({ "name": " ", "service": "http" }),
            "must not be empty",
        ),
    ];
    for (body, expected) in cases {
        let error = app
            .post(&tenant.key, "/api/connections", &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
}

async fn another_tenants_connections_are_invisible(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    let created = app
        .post(&acme.key, "/api/connections", &invoicing())
        .await
        .expect(StatusCode::CREATED);
    let id = created["id"].as_str().unwrap();
    app.get(&other.key, &format!("/api/connections/{id}"))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let list = app
        .get(&other.key, "/api/connections")
        .await
        .expect(StatusCode::OK);
    assert!(list["items"].as_array().unwrap().is_empty());
}
