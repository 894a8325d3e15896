//! Platform incidents (stuck runs the scheduler found) are the platform
//! admin's: listed and resolved with the admin key, refused to a tenant.

use axum::http::StatusCode;
use serde_json::json;
use tok_store::NewPlatformIncident;

use crate::helpers::{TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    platform_incidents_are_for_the_admin_only,
);

async fn platform_incidents_are_for_the_admin_only(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let (id, _) = app
        .state
        .engine
        .store()
        .open_platform_incident(
            NewPlatformIncident {
                reason: "queue_stalled",
                source: "queue_stalled".into(),
                tenant_id: None,
                run_id: None,
                title: "The oldest ready job has waited 400 s while workers have free slots".into(),
                detail: json!({ "oldest_ready_ms": 400_000 }),
            },
            tok_store::now_ms(),
        )
        .await
        .unwrap();

    app.get(&tenant.key, "/api/platform/incidents")
        .await
        .expect_error(StatusCode::FORBIDDEN, "admin_only");
    let list = app
        .get(&app.admin_key, "/api/platform/incidents?status=open")
        .await
        .expect(StatusCode::OK);
    assert_eq!(list["items"][0]["id"], id.as_str(), "{list:#}");
    assert_eq!(list["items"][0]["reason"], "queue_stalled", "{list:#}");
    app.get(&app.admin_key, "/api/platform/incidents?status=closed")
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_query");

    let uri = format!("/api/platform/incidents/{id}/resolve");
    app.post(&tenant.key, &uri, &json!({}))
        .await
        .expect_error(StatusCode::FORBIDDEN, "admin_only");
    app.post(&app.admin_key, &uri, &json!({}))
        .await
        .expect(StatusCode::OK);
    app.post(&app.admin_key, &uri, &json!({}))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let open = app
        .get(&app.admin_key, "/api/platform/incidents?status=open")
        .await
        .expect(StatusCode::OK);
    assert_eq!(open["items"], json!([]), "{open:#}");
}
