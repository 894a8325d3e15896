//! Every error a client can get is JSON `{"error": {"code", "message"}}`
//! (every operation's `default` answer, docs/api.md), including a path or a
//! method that does not exist, and the key is read the way HTTP says to
//! read it.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    unknown_route_and_method_answer_json,
    bearer_scheme_is_case_insensitive
);

async fn unknown_route_and_method_answer_json(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let reply = app.get(&tenant.key, "/api/dashbord/runs").await;
    let error = reply.expect_error(StatusCode::NOT_FOUND, "not_found");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("/api/dashbord/runs"),
        "{error:#}"
    );

    let reply = app
        .request(
            Method::DELETE,
            "/api/dashboard/runs",
            Some(&tenant.key),
            &[],
            Body::empty(),
        )
        .await;
    reply.expect_error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    let reply = app
        .request(Method::PUT, "/webhook/abc", None, &[], Body::from("{}"))
        .await;
    reply.expect_error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
}

async fn bearer_scheme_is_case_insensitive(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let auth = format!("{scheme} {}", tenant.key);
        let reply = app
            .request(
                Method::GET,
                "/api/dashboard/runs",
                None,
                &[("authorization", &auth)],
                Body::empty(),
            )
            .await;
        assert_eq!(
            reply.expect(StatusCode::OK),
            json!({ "items": [], "next_cursor": null }),
            "{scheme}"
        );
    }
}
