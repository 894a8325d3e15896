//! `/healthz` answers as soon as the server listens; `/readyz` once the
//! process says it is ready and while the database answers.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{TestApp, backend_tests};

backend_tests!(crate::helpers::run; healthz_and_readyz);

async fn healthz_and_readyz(app: &TestApp) {
    let health = app
        .request(Method::GET, "/healthz", None, &[], Body::empty())
        .await;
    assert_eq!(health.expect(StatusCode::OK), json!({ "status": "ok" }));

    let early = app
        .request(Method::GET, "/readyz", None, &[], Body::empty())
        .await;
    assert_eq!(
        early.expect(StatusCode::SERVICE_UNAVAILABLE),
        json!({ "status": "starting" })
    );

    app.state.set_ready();
    let ready = app
        .request(Method::GET, "/readyz", None, &[], Body::empty())
        .await;
    assert_eq!(ready.expect(StatusCode::OK), json!({ "status": "ready" }));
}
