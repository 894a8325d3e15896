//! Incidents as the tenant and the platform admin see them: a run that
//! fails for good opens one, written for the tenant (title and impact, no
//! step or run ids) with the detail for the admin only; the same cause
//! counts occurrences instead of opening another while it is open; resolving
//! closes it; and another tenant sees none of it.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, manual};

backend_tests!(
    crate::helpers::run;
    a_run_that_fails_for_good_opens_one_incident_per_cause,
    incidents_are_resolved_once,
    incident_create_step_opens_an_incident_with_a_hidden_detail,
    incidents_listing_rejects_bad_filters_and_limits,
    another_tenants_incidents_are_invisible,
);

/// A tenant with the type `order` and a manual automation that creates the
/// order's ticket, then sets a status the type does not have: a terminal
/// failure at `st_status`.
async fn failing_desk(app: &TestApp, name: &str) -> (Tenant, String) {
    let tenant = app.create_tenant(name).await;
    app.create_ticket_type(&tenant, "order", &["new", "shipped"])
        .await;
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Ship orders",
                &json!([
                    { "id": "st_ticket", "type": "ticket/upsert",
                      "config": { "externalId": "{{orderId}}", "type": "order" } },
                    { "id": "st_status", "type": "ticket/set-status", "config": { "status": "lost" } }
                ]),
            ),
        )
        .await;
    (tenant, automation)
}

/// Starts a run for the order and waits until it has failed; returns the run.
async fn failed_run(app: &TestApp, tenant: &Tenant, automation: &str, order: &str) -> Value {
    let run_id = app
        .start_run(
            tenant,
            automation,
            &json!({ "input": { "orderId": order } }),
        )
        .await;
    let run = app.wait_for_final(tenant, &run_id).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    run
}

async fn incidents(app: &TestApp, tenant: &Tenant, query: &str) -> Vec<Value> {
    let page = app
        .get(&tenant.key, &format!("/api/incidents{query}"))
        .await
        .expect(StatusCode::OK);
    page["items"].as_array().unwrap().clone()
}

async fn admin_incidents(app: &TestApp, tenant: &Tenant) -> Vec<Value> {
    let page = app
        .get_as_admin(tenant, "/api/incidents")
        .await
        .expect(StatusCode::OK);
    page["items"].as_array().unwrap().clone()
}

/// What a tenant must never see in an incident.
#[track_caller]
fn assert_tenant_view(incident: &Value, hidden: &[&str]) {
    for key in ["detail", "source", "run_id"] {
        assert!(
            incident.get(key).is_none(),
            "a tenant key must not see `{key}`: {incident:#}"
        );
    }
    for key in ["title", "impact"] {
        let text = incident[key].as_str().unwrap_or_default();
        assert!(
            !text.is_empty(),
            "`{key}` is written for the tenant: {incident:#}"
        );
        for word in hidden {
            assert!(
                !text.contains(word),
                "`{key}` must not mention `{word}`: {incident:#}"
            );
        }
    }
}

async fn a_run_that_fails_for_good_opens_one_incident_per_cause(app: &TestApp) {
    let (tenant, automation) = failing_desk(app, "Acme").await;
    let run = failed_run(app, &tenant, &automation, "5001").await;
    let run_id = run["id"].as_str().unwrap();
    let step = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step_id"] == "st_status")
        .unwrap_or_else(|| panic!("the failed step is listed: {run:#}"));
    assert_eq!(step["status"], "failed", "{run:#}");
    assert_eq!(
        step["attempt"], 1,
        "a terminal error is not retried: {run:#}"
    );

    let listed = incidents(app, &tenant, "").await;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    let incident = &listed[0];
    assert_tenant_view(incident, &["st_status", "st_ticket", run_id, &automation]);
    assert_eq!(incident["status"], "open");
    assert_eq!(incident["occurrences"], 1);
    assert!(
        incident["title"].as_str().unwrap().contains("5001"),
        "the title names the ticket the tenant knows: {incident:#}"
    );
    assert!(
        crate::helpers::ms(&incident["created_at"]).is_some() && incident["resolved_at"].is_null()
    );

    let admin = admin_incidents(app, &tenant).await;
    assert_eq!(admin.len(), 1, "{admin:#?}");
    let full = &admin[0];
    assert_eq!(full["id"], incident["id"]);
    assert_eq!(full["title"], incident["title"]);
    assert_eq!(full["run_id"], run_id, "{full:#}");
    assert!(full["source"].is_string(), "{full:#}");
    let detail = &full["detail"];
    assert_eq!(detail["failed_step"]["id"], "st_status", "{full:#}");
    assert_eq!(detail["run_id"], run_id, "{full:#}");
    assert_eq!(detail["automation"]["id"], automation, "{full:#}");
    assert_eq!(detail["input"], json!({ "orderId": "5001" }), "{full:#}");
    let message = detail["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("lost") && message.contains("new, shipped"),
        "the full message says what was allowed: {full:#}"
    );

    // The ticket says so too.
    let tickets = app
        .get(&tenant.key, "/api/tickets?external_id=5001")
        .await
        .expect(StatusCode::OK);
    let ticket = app
        .ticket(&tenant, tickets["items"][0]["id"].as_str().unwrap())
        .await;
    let failed_line = ticket["trace"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["kind"] == "run_failed")
        .unwrap_or_else(|| panic!("a failed run writes to its ticket's trace: {ticket:#}"));
    assert_eq!(failed_line["run_id"], run_id);

    // The same automation failing at the same step again is the same cause.
    failed_run(app, &tenant, &automation, "5002").await;
    let listed = incidents(app, &tenant, "").await;
    assert_eq!(listed.len(), 1, "no second incident: {listed:#?}");
    assert_eq!(listed[0]["id"], incident["id"]);
    assert_eq!(listed[0]["occurrences"], 2, "{listed:#?}");
    assert_tenant_view(&listed[0], &["st_status", "st_ticket", run_id]);
}

async fn incidents_are_resolved_once(app: &TestApp) {
    let (tenant, automation) = failing_desk(app, "Acme").await;
    failed_run(app, &tenant, &automation, "5001").await;
    let first = incidents(app, &tenant, "").await[0].clone();
    let id = first["id"].as_str().unwrap();
    let uri = format!("/api/incidents/{id}/resolve");

    let resolved = app
        .post(&tenant.key, &uri, &json!({}))
        .await
        .expect(StatusCode::OK);
    assert_eq!(resolved["id"], id);
    assert_eq!(resolved["status"], "resolved", "{resolved:#}");
    assert!(
        crate::helpers::ms(&resolved["resolved_at"]).is_some(),
        "{resolved:#}"
    );
    assert_tenant_view(&resolved, &["st_status"]);
    let again = app
        .post(&tenant.key, &uri, &json!({}))
        .await
        .expect_error(StatusCode::CONFLICT, "already_resolved");
    assert!(again["message"].as_str().unwrap().contains(id), "{again:#}");

    assert!(incidents(app, &tenant, "?status=open").await.is_empty());
    let done = incidents(app, &tenant, "?status=resolved").await;
    assert_eq!(done.len(), 1, "{done:#?}");
    assert_eq!(done[0]["id"], id);

    // Once resolved, the same cause opens a new incident.
    let run = failed_run(app, &tenant, &automation, "5002").await;
    let open = incidents(app, &tenant, "?status=open").await;
    assert_eq!(open.len(), 1, "{open:#?}");
    assert_ne!(open[0]["id"], id);
    assert_eq!(open[0]["occurrences"], 1);
    assert_eq!(incidents(app, &tenant, "").await.len(), 2);

    // The admin acting for the tenant resolves it and sees the detail.
    let second = open[0]["id"].as_str().unwrap();
    let by_admin = app
        .request(
            Method::POST,
            &format!("/api/incidents/{second}/resolve"),
            Some(&app.admin_key),
            &[("x-tok-tenant", tenant.id.as_str())],
            Body::empty(),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(by_admin["status"], "resolved");
    assert_eq!(by_admin["run_id"], run["id"], "{by_admin:#}");
    assert_eq!(by_admin["detail"]["failed_step"]["id"], "st_status");

    app.post(&tenant.key, "/api/incidents/inc_nope/resolve", &json!({}))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}

async fn incident_create_step_opens_an_incident_with_a_hidden_detail(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Printer watch",
                &json!([{
                    "id": "st_alert", "type": "incident/create",
                    "config": {
                        "title": "The label printer is down",
                        "impact": "Parcels wait for labels",
                        "detail": "toner sensor {{code}}",
                        "source": "printer"
                    }
                }]),
            ),
        )
        .await;
    for code in ["E42", "E43"] {
        let run = app
            .start_run(&tenant, &automation, &json!({ "input": { "code": code } }))
            .await;
        let run = app.wait_for_final(&tenant, &run).await;
        assert_eq!(run["status"], "completed", "{run:#}");
    }
    let listed = incidents(app, &tenant, "").await;
    assert_eq!(
        listed.len(),
        1,
        "one source, one open incident: {listed:#?}"
    );
    assert_eq!(listed[0]["title"], "The label printer is down");
    assert_eq!(listed[0]["impact"], "Parcels wait for labels");
    assert_eq!(listed[0]["occurrences"], 2);
    assert_tenant_view(&listed[0], &["E42", "toner"]);
    let admin = admin_incidents(app, &tenant).await;
    let detail = &admin[0]["detail"];
    assert_eq!(detail["message"], "toner sensor E42", "{detail:#}");
    // What every incident carries, an `incident/create` step's too.
    assert!(detail["automation"]["id"].is_string(), "{detail:#}");
    assert!(detail["run_id"].is_string(), "{detail:#}");
    assert_eq!(detail["step"]["path"], "0", "{detail:#}");
    assert_eq!(detail["attempt"], 1);
    assert_eq!(detail["error"], Value::Null);
    assert_eq!(detail["input"], json!({ "code": "E42" }));
    assert_eq!(admin[0]["source"], "printer");
}

async fn incidents_listing_rejects_bad_filters_and_limits(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    for query in ["status=closed", "limit=many", "colour=red"] {
        app.get(&tenant.key, &format!("/api/incidents?{query}"))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "bad_query");
    }
    for limit in ["0", "501"] {
        app.get(&tenant.key, &format!("/api/incidents?limit={limit}"))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "bad_limit");
    }
    let page = app
        .get(&tenant.key, "/api/incidents?limit=500&status=open")
        .await
        .expect(StatusCode::OK);
    assert_eq!(page, json!({ "items": [], "next_cursor": null }));
}

async fn another_tenants_incidents_are_invisible(app: &TestApp) {
    let (a, automation) = failing_desk(app, "Acme").await;
    failed_run(app, &a, &automation, "5001").await;
    let incident = incidents(app, &a, "").await[0].clone();
    let b = app.create_tenant("Beta").await;

    assert!(incidents(app, &b, "").await.is_empty());
    assert!(admin_incidents(app, &b).await.is_empty());
    let uri = format!(
        "/api/incidents/{}/resolve",
        incident["id"].as_str().unwrap()
    );
    app.post(&b.key, &uri, &json!({}))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let still = incidents(app, &a, "").await;
    assert_eq!(still[0]["status"], "open", "{still:#?}");
    let tickets = app.get(&b.key, "/api/tickets").await.expect(StatusCode::OK);
    assert_eq!(tickets["items"], json!([]));
}
