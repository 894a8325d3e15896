//! The platform admin's tenants: renamed as they were named (checked alike,
//! audited), and deleted with every row of theirs. A deletion answers 202
//! at once: the tenant's keys fail from then on, its webhooks answer 404,
//! the admin acting for it 410, and `GET /api/tenants/{id}` shows it
//! `deleting` with the rows left, until the scheduler has erased them all
//! and it answers 404. Another tenant's work goes on untouched, and the
//! platform's audit rows of the deletion outlive the tenant's own.

use axum::http::StatusCode;
use serde_json::{Value, json};
use tok_core::ids::TenantId;

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, on_webhook, plain_source};

backend_tests!(
    crate::helpers::run;
    a_tenant_is_renamed_checked_as_it_was_named,
    a_deleted_tenant_stops_at_once_and_is_erased_to_its_last_row,
    a_deletion_asked_again_answers_the_same,
);

async fn a_tenant_is_renamed_checked_as_it_was_named(app: &TestApp) {
    let admin = &app.admin_key;
    let tenant = app.create_tenant("Acme").await;
    let uri = format!("/api/tenants/{}", tenant.id);
    let renamed = app
        .patch(admin, &uri, &json!({ "name": "  Acme Ltd  " }))
        .await
        .expect(StatusCode::OK);
    assert_eq!(renamed["name"], "Acme Ltd", "{renamed:#}");
    assert_eq!(renamed["status"], "active");
    let shown = app.get(admin, &uri).await.expect(StatusCode::OK);
    assert_eq!(shown["name"], "Acme Ltd");
    assert!(shown.get("deletion").is_none(), "{shown:#}");

    let long = "a".repeat(201);
    for (name, says) in [
        (json!("   "), "must not be empty"),
        (json!(long), "longer than 200"),
        (json!("Acme\nLtd"), "control characters"),
    ] {
        let error = app
            .patch(admin, &uri, &json!({ "name": name }))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(error["field"], "name", "{error:#}");
        assert!(
            error["message"].as_str().unwrap().contains(says),
            "{error:#}"
        );
        // A creation refuses it alike.
        let error = app
            .post(admin, "/api/tenants", &json!({ "name": name }))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(error["field"], "name", "{error:#}");
    }
    assert_eq!(
        app.get(admin, &uri).await.expect(StatusCode::OK)["name"],
        "Acme Ltd"
    );
    // A tenant's own key cannot rename it.
    app.patch(&tenant.key, &uri, &json!({ "name": "Mine" }))
        .await
        .expect_error(StatusCode::FORBIDDEN, "admin_only");

    // One row, by the platform admin, naming the field changed.
    let rows = app
        .get(
            admin,
            &format!("/api/audit?action=tenant.updated&target={}", tenant.id),
        )
        .await
        .expect(StatusCode::OK);
    let rows = rows["items"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["actor"]["kind"], "platform");
    assert_eq!(rows[0]["summary"], "name");
    assert_eq!(rows[0]["outcome"], "done");
    assert_eq!(rows[0]["tenant_id"], json!(tenant.id));
}

/// A tenant with a webhook whose runs complete; returns the tenant, its
/// webhook token and the run its first event started.
async fn working_tenant(app: &TestApp, name: &str) -> (Tenant, String, String) {
    let tenant = app.create_tenant(name).await;
    let source = app.create_source(&tenant, &plain_source("orders")).await;
    let token = source["token"].as_str().unwrap().to_owned();
    let source_id = source["id"].as_str().unwrap();
    app.create_automation(
        &tenant,
        &on_webhook("On order", source_id, &json!([log_step("st_log", "order")])),
    )
    .await;
    app.create_ticket_type(&tenant, "order", &["new", "done"])
        .await;
    app.create_ticket(&tenant, &json!({ "external_id": "A-1", "type": "order" }))
        .await;
    let event = app
        .webhook(&token, &json!({ "order": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);
    let event = event["event_id"].as_str().unwrap().to_owned();
    let runs = app
        .poll("the event's run", async || {
            let page = app
                .get(&tenant.key, &format!("/api/dashboard/runs?event={event}"))
                .await
                .expect(StatusCode::OK);
            let items = page["items"].as_array().cloned().unwrap_or_default();
            items
                .first()
                .and_then(|r| r["id"].as_str().map(str::to_owned))
                .ok_or(())
        })
        .await;
    app.wait_for_final(&tenant, &runs).await;
    (tenant, token, runs)
}

async fn a_deleted_tenant_stops_at_once_and_is_erased_to_its_last_row(app: &TestApp) {
    let admin = &app.admin_key;
    let (gone, gone_token, _) = working_tenant(app, "Gone").await;
    let (kept, kept_token, kept_run) = working_tenant(app, "Kept").await;
    let uri = format!("/api/tenants/{}", gone.id);

    let reply = app
        .request(
            axum::http::Method::DELETE,
            &uri,
            Some(admin),
            &[],
            axum::body::Body::empty(),
        )
        .await;
    let location = reply
        .headers
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let asked = reply.expect(StatusCode::ACCEPTED);
    assert_eq!(location.as_deref(), Some(uri.as_str()));
    assert_eq!(asked["status"], "deleting", "{asked:#}");
    assert!(asked["deletion"]["requested_at"].is_string(), "{asked:#}");
    let remaining = asked["deletion"]["remaining"].as_object().unwrap();
    assert!(
        ["runs", "sources", "tickets", "api_keys"]
            .iter()
            .all(|t| remaining
                .get(*t)
                .and_then(Value::as_u64)
                .is_some_and(|n| n > 0)),
        "what is left, by table: {asked:#}"
    );

    // At once: its key fails, its webhook is gone, the admin cannot act
    // for it, and it changes no more.
    app.get(&gone.key, "/api/automations")
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
    app.webhook(&gone_token, &json!({ "order": 2 }))
        .await
        .expect_error(StatusCode::NOT_FOUND, "unknown_webhook");
    app.get_as_admin(&gone, "/api/runs")
        .await
        .expect_error(StatusCode::GONE, "tenant_deleted");
    app.patch(admin, &uri, &json!({ "suspended": true }))
        .await
        .expect_error(StatusCode::GONE, "tenant_deleted");
    let listed = app.get(admin, "/api/tenants").await.expect(StatusCode::OK);
    let statuses: Vec<(String, String)> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        statuses.contains(&("Gone".into(), "deleting".into()))
            && statuses.contains(&("Kept".into(), "active".into())),
        "{statuses:?}"
    );

    // The scheduler erases it to its last row; then it is gone.
    app.poll("the deleted tenant to be gone", async || {
        let reply = app.get(admin, &uri).await;
        (reply.status == StatusCode::NOT_FOUND)
            .then_some(())
            .ok_or(())
    })
    .await;
    let left = app
        .state
        .engine
        .store()
        .tenant_rows_left(&TenantId::from(gone.id.clone()), 1_000)
        .await
        .unwrap();
    assert!(left.is_empty(), "rows of the deleted tenant left: {left:?}");
    app.webhook(&gone_token, &json!({ "order": 3 }))
        .await
        .expect_error(StatusCode::NOT_FOUND, "unknown_webhook");

    // The other tenant is as it was, and goes on.
    app.get(&kept.key, &format!("/api/runs/{kept_run}"))
        .await
        .expect(StatusCode::OK);
    let tickets = app
        .get(&kept.key, "/api/tickets")
        .await
        .expect(StatusCode::OK);
    assert_eq!(tickets["items"].as_array().unwrap().len(), 1);
    app.webhook(&kept_token, &json!({ "order": 4 }))
        .await
        .expect(StatusCode::ACCEPTED);
    app.wait_for_runs(&kept, "", 2).await;

    // The platform's rows of the deletion outlive the tenant: who asked,
    // and when every row was gone. None of the tenant's own rows is left.
    let rows = app
        .get(admin, &format!("/api/audit?target={}&limit=500", gone.id))
        .await
        .expect(StatusCode::OK);
    let rows = rows["items"].as_array().unwrap();
    let actions: Vec<&str> = rows.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["tenant.erased", "tenant.deleted"], "{rows:#?}");
    for row in rows {
        assert_eq!(row["tenant_id"], Value::Null, "{row:#}");
        assert_eq!(row["outcome"], "done", "{row:#}");
    }
    assert_eq!(rows[1]["actor"]["kind"], "platform");
    assert!(
        rows[1]["actor"]["id"].is_string(),
        "the admin key: {:#}",
        rows[1]
    );
    let everything = app
        .get(admin, "/api/audit?limit=500")
        .await
        .expect(StatusCode::OK);
    assert!(
        everything["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["tenant_id"] != json!(gone.id)),
        "{everything:#}"
    );
}

async fn a_deletion_asked_again_answers_the_same(app: &TestApp) {
    let admin = &app.admin_key;
    // Nothing of the tenant is erased while the engine is stopped.
    app.stop_engine().await;
    let tenant = app.create_tenant("Twice").await;
    let uri = format!("/api/tenants/{}", tenant.id);
    let first = app.delete(admin, &uri).await.expect(StatusCode::ACCEPTED);
    let again = app.delete(admin, &uri).await.expect(StatusCode::ACCEPTED);
    assert_eq!(
        first["deletion"]["requested_at"], again["deletion"]["requested_at"],
        "the first ask stands"
    );
    let shown = app.get(admin, &uri).await.expect(StatusCode::OK);
    assert_eq!(shown["status"], "deleting");
    assert_eq!(shown["deletion"]["counted_up_to"], 10_000);
    app.delete(admin, "/api/tenants/ten_nobody")
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.delete(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
    app.start_engine().await;
    app.poll("the deleted tenant to be gone", async || {
        let reply = app.get(admin, &uri).await;
        (reply.status == StatusCode::NOT_FOUND)
            .then_some(())
            .ok_or(())
    })
    .await;
    app.delete(admin, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}
