//! Tenant isolation and authentication: another tenant's ids answer 404
//! exactly like ids that do not exist, listings show only the caller's
//! records, keys are required (401), tenants are the admin's (403), the
//! admin acts for a tenant only with `X-Tok-Tenant`, and a live stream
//! lasts no longer than the key it was opened with.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::helpers::{
    Tenant, TestApp, backend_tests, ids, log_step, manual, on_webhook, plain_source,
};

backend_tests!(
    crate::helpers::run;
    another_tenants_records_answer_404,
    listings_show_only_the_callers_records,
    missing_or_invalid_key_is_401,
    tenant_key_cannot_create_tenants,
    admin_acts_for_a_tenant_with_x_tok_tenant,
    every_route_keeps_tenants_apart,
    a_stream_ends_when_its_key_is_revoked_or_expires,
);

/// Tenant A with a source, a webhook automation and one finished run.
struct Owned {
    tenant: Tenant,
    source: String,
    automation: String,
    run: String,
    /// The webhook's event that started `run`.
    event: String,
}

async fn tenant_with_a_run(app: &TestApp, name: &str) -> Owned {
    let tenant = app.create_tenant(name).await;
    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let source_id = source["id"].as_str().unwrap().to_owned();
    let automation = app
        .create_automation(
            &tenant,
            &on_webhook(
                "Hook",
                &source_id,
                &json!([log_step("st_a", "for {{who}}")]),
            ),
        )
        .await;
    app.webhook(source["token"].as_str().unwrap(), &json!({ "who": name }))
        .await
        .expect(StatusCode::ACCEPTED);
    let runs = app.wait_for_runs(&tenant, "", 1).await;
    let run = runs[0]["id"].as_str().unwrap().to_owned();
    let event = runs[0]["event_id"].as_str().unwrap().to_owned();
    Owned {
        tenant,
        source: source_id,
        automation,
        run,
        event,
    }
}

async fn another_tenants_records_answer_404(app: &TestApp) {
    let a = tenant_with_a_run(app, "Acme").await;
    let b = app.create_tenant("Beta").await;

    for uri in [
        format!("/api/runs/{}", a.run),
        format!("/api/automations/{}", a.automation),
        format!("/api/sources/{}", a.source),
    ] {
        let theirs = app
            .get(&b.key, &uri)
            .await
            .expect_error(StatusCode::NOT_FOUND, "not_found");
        let gone = app
            .get(&b.key, &format!("{uri}x"))
            .await
            .expect_error(StatusCode::NOT_FOUND, "not_found");
        assert_eq!(
            theirs, gone,
            "another tenant's id must look like one that does not exist ({uri})"
        );
        app.get(&a.tenant.key, &uri).await.expect(StatusCode::OK);
    }

    let automation = format!("/api/automations/{}", a.automation);
    let definition = manual("Hijack", &json!([log_step("st_x", "x")]));
    app.put(&b.key, &automation, &definition)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    for action in ["pause", "resume"] {
        let reply = app
            .post(&b.key, &format!("{automation}/{action}"), &json!({}))
            .await;
        reply.expect_error(StatusCode::NOT_FOUND, "not_found");
    }
    let reply = app
        .post(
            &b.key,
            &format!("{automation}/runs"),
            &json!({ "input": {} }),
        )
        .await;
    reply.expect_error(StatusCode::NOT_FOUND, "not_found");

    // None of it touched A's automation.
    let shown = app
        .get(&a.tenant.key, &automation)
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        (&shown["version"], &shown["status"], &shown["name"]),
        (&json!(1), &json!("active"), &json!("Hook"))
    );
    let runs = app
        .get(&a.tenant.key, "/api/dashboard/runs")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        ids(runs["items"].as_array().unwrap()),
        [a.run.as_str()],
        "{runs:#}"
    );
}

async fn listings_show_only_the_callers_records(app: &TestApp) {
    let a = tenant_with_a_run(app, "Acme").await;
    let b = tenant_with_a_run(app, "Beta").await;

    for (mine, theirs) in [(&a, &b), (&b, &a)] {
        let key = &mine.tenant.key;
        let runs = app
            .get(key, "/api/dashboard/runs")
            .await
            .expect(StatusCode::OK);
        assert_eq!(
            ids(runs["items"].as_array().unwrap()),
            [mine.run.as_str()],
            "{runs:#}"
        );
        let filtered = app
            .get(
                key,
                &format!("/api/dashboard/runs?automation={}", theirs.automation),
            )
            .await;
        assert_eq!(filtered.expect(StatusCode::OK)["items"], json!([]));

        let automations = app
            .get(key, "/api/automations")
            .await
            .expect(StatusCode::OK);
        assert_eq!(
            ids(automations["items"].as_array().unwrap()),
            [mine.automation.as_str()]
        );
        let sources = app.get(key, "/api/sources").await.expect(StatusCode::OK);
        assert_eq!(
            ids(sources["items"].as_array().unwrap()),
            [mine.source.as_str()]
        );
    }

    // Each run saw only its own tenant's event.
    let run = app
        .get(&b.tenant.key, &format!("/api/runs/{}", b.run))
        .await
        .expect(StatusCode::OK);
    assert_eq!(run["steps"][0]["log"], json!(["info: for Beta"]));
}

async fn missing_or_invalid_key_is_401(app: &TestApp) {
    let a = tenant_with_a_run(app, "Acme").await;
    let routes: [(Method, String); 5] = [
        (Method::GET, "/api/dashboard/runs".into()),
        (Method::GET, format!("/api/runs/{}", a.run)),
        (Method::GET, "/api/automations".into()),
        (Method::POST, "/api/sources".into()),
        (Method::POST, "/api/tenants".into()),
    ];
    let wrong = format!("{}x", a.tenant.key);
    let not_bearer = format!("Basic {}", a.tenant.key);
    for (method, uri) in &routes {
        let body = || Body::from(json!({ "name": "x" }).to_string());
        let json = ("content-type", "application/json");
        let none = app
            .request(method.clone(), uri, None, &[json], body())
            .await;
        none.expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
        let invalid = app
            .request(method.clone(), uri, Some(&wrong), &[json], body())
            .await;
        invalid.expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
        let scheme = app
            .request(
                method.clone(),
                uri,
                None,
                &[json, ("authorization", &not_bearer)],
                body(),
            )
            .await;
        scheme.expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
    }
}

async fn tenant_key_cannot_create_tenants(app: &TestApp) {
    let a = app.create_tenant("Acme").await;
    let reply = app
        .post(&a.key, "/api/tenants", &json!({ "name": "Mallory" }))
        .await;
    reply.expect_error(StatusCode::FORBIDDEN, "admin_only");
    let created = app
        .post(&app.admin_key, "/api/tenants", &json!({ "name": "  " }))
        .await;
    created.expect_error(StatusCode::BAD_REQUEST, "invalid_body");
}

async fn admin_acts_for_a_tenant_with_x_tok_tenant(app: &TestApp) {
    let a = tenant_with_a_run(app, "Acme").await;
    let b = app.create_tenant("Beta").await;
    let admin = app.admin_key.as_str();
    let as_a = [("x-tok-tenant", a.tenant.id.as_str())];

    let run = app
        .request(
            Method::GET,
            &format!("/api/runs/{}", a.run),
            Some(admin),
            &as_a,
            Body::empty(),
        )
        .await;
    assert_eq!(run.expect(StatusCode::OK)["id"], a.run.as_str());
    let as_b = [("x-tok-tenant", b.id.as_str())];
    let run = app
        .request(
            Method::GET,
            &format!("/api/runs/{}", a.run),
            Some(admin),
            &as_b,
            Body::empty(),
        )
        .await;
    run.expect_error(StatusCode::NOT_FOUND, "not_found");

    // Writes land in the tenant the header names.
    let source = app
        .post_with(admin, "/api/sources", &as_b, &plain_source("made by admin"))
        .await
        .expect(StatusCode::CREATED);
    let listed = app.get(&b.key, "/api/sources").await.expect(StatusCode::OK);
    assert_eq!(listed["items"][0]["id"], source["id"], "{listed:#}");
    let theirs = app
        .get(&a.tenant.key, "/api/sources")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        ids(theirs["items"].as_array().unwrap()),
        [a.source.as_str()]
    );

    let no_header = app.get(admin, "/api/dashboard/runs").await;
    let error = no_header.expect_error(StatusCode::BAD_REQUEST, "tenant_required");
    assert!(
        error["message"].as_str().unwrap().contains("X-Tok-Tenant"),
        "{error:#}"
    );
    let unknown = [("x-tok-tenant", "ten_nonexistent")];
    let reply = app
        .request(
            Method::GET,
            "/api/dashboard/runs",
            Some(admin),
            &unknown,
            Body::empty(),
        )
        .await;
    reply.expect_error(StatusCode::NOT_FOUND, "not_found");

    // A tenant key ignores the header: it never reaches another tenant.
    let sneaky = app
        .request(
            Method::GET,
            "/api/dashboard/runs",
            Some(&b.key),
            &as_a,
            Body::empty(),
        )
        .await;
    assert_eq!(sneaky.expect(StatusCode::OK)["items"], json!([]));
}

/// Everything a tenant can own, made through the API: the ids of each.
struct Estate {
    tenant: Tenant,
    ids: Vec<String>,
    source: String,
    automation: String,
    manual: String,
    run: String,
    waiting_run: String,
    approval: String,
    group: String,
    ticket_type: String,
    member: String,
    incident: String,
    ticket: String,
    connection: String,
    connection_name: String,
    widget: String,
    key: String,
    /// The webhook's event behind the first run.
    event: String,
    /// A bulk operation (a retry of the failed runs: none).
    operation: String,
}

async fn estate(app: &TestApp, name: &str) -> Estate {
    let owned = tenant_with_a_run(app, name).await;
    let tenant = owned.tenant.clone();
    let ticket_type = app
        .create_ticket_type(&tenant, &format!("order-{name}"), &["new", "done"])
        .await;
    let group = app
        .create_group(&tenant, &format!("Desk {name}"), &["Ann"])
        .await;
    let member = group["members"][0]["id"].as_str().unwrap().to_owned();
    let approve = app
        .create_automation(
            &tenant,
            &manual(
                "Approve",
                &json!([{ "id": "st_ok", "type": "approval",
                          "config": { "approvers": { "members": [member] }, "prompt": "ok?" } }]),
            ),
        )
        .await;
    let waiting_run = app
        .start_run(&tenant, &approve, &json!({ "input": {} }))
        .await;
    app.wait_for_run(&tenant, &waiting_run, |r| r["status"] == "waiting")
        .await;
    let approvals = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    let approval = approvals["items"][0]["id"].as_str().unwrap().to_owned();
    let alert = app
        .create_automation(
            &tenant,
            &manual(
                "Alert",
                &json!([{ "id": "st_alert", "type": "incident/create",
                          "config": { "title": format!("{name} is down"), "impact": "none", "source": "probe" } }]),
            ),
        )
        .await;
    let run = app
        .start_run(&tenant, &alert, &json!({ "input": {} }))
        .await;
    app.wait_for_final(&tenant, &run).await;
    let incidents = app
        .get(&tenant.key, "/api/incidents")
        .await
        .expect(StatusCode::OK);
    let incident = incidents["items"][0]["id"].as_str().unwrap().to_owned();
    let ticket = app
        .create_ticket(
            &tenant,
            &json!({ "external_id": format!("T-{name}"), "type": format!("order-{name}") }),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let connection_name = format!("stats-{name}");
    let connection = app
        .post(
            &tenant.key,
            "/api/connections",
            &json!({ "name": connection_name, "service": "http",
                     "base_url": "http://127.0.0.1:9", "credentials": { "bearer": "sk_x" } }),
        )
        .await
        .expect(StatusCode::CREATED)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let widget = app
        .post(
            &tenant.key,
            "/api/widgets",
            &json!({ "name": "w", "connection": connection_name,
                     "request": { "url": "/x" }, "ttlSec": 60 }),
        )
        .await
        .expect(StatusCode::CREATED)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let key = app
        .post(
            &tenant.key,
            "/api/keys",
            &json!({ "name": format!("{name}'s reader"), "scopes": ["read"] }),
        )
        .await
        .expect(StatusCode::CREATED)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let operation = app
        .post(
            &tenant.key,
            "/api/runs/bulk",
            &json!({ "filter": { "status": "failed" }, "action": "retry" }),
        )
        .await
        .expect(StatusCode::ACCEPTED)["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let uri = format!("/api/operations/{operation}");
    app.poll("the operation done", async || {
        let op = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
        (op["status"] == "done").then_some(()).ok_or(())
    })
    .await;
    let ids = vec![
        operation.clone(),
        key.clone(),
        tenant.id.clone(),
        owned.source.clone(),
        owned.automation.clone(),
        owned.run.clone(),
        owned.event.clone(),
        approve.clone(),
        waiting_run.clone(),
        approval.clone(),
        group["id"].as_str().unwrap().to_owned(),
        ticket_type["id"].as_str().unwrap().to_owned(),
        member.clone(),
        alert.clone(),
        run.clone(),
        incident.clone(),
        ticket.clone(),
        connection.clone(),
        widget.clone(),
    ];
    Estate {
        tenant,
        ids,
        source: owned.source,
        automation: owned.automation,
        manual: approve,
        run,
        waiting_run,
        approval,
        group: group["id"].as_str().unwrap().to_owned(),
        ticket_type: ticket_type["id"].as_str().unwrap().to_owned(),
        member,
        incident,
        ticket,
        connection,
        connection_name,
        widget,
        key,
        event: owned.event,
        operation,
    }
}

/// How a route is tried with tenant B's key.
enum Probe {
    /// Served to anyone (health, documents, the dashboard's files, a
    /// webhook, whose token is its credential): B's answer shows none of
    /// A's ids.
    Open(String),
    /// The platform admin's: a tenant key gets 403.
    AdminOnly(Method, String, Value),
    /// A's record by its id: 404 `not_found`, as an id that does not exist.
    Theirs(Method, String, Value),
    /// A listing: B's rows only (some of B's ids, none of A's).
    Listing(String),
    /// A write without an id, naming A's rows in its body where it can: it
    /// does not reach them (a 4xx when `refused`, else a 4xx or B's own row).
    Write(String, Value, bool),
}

fn probe(route: &tok_server::Route, a: &Estate) -> Option<Probe> {
    use Probe::*;
    let m = route.method.clone();
    let empty = json!({});
    Some(match (route.method.as_str(), route.path) {
        ("GET", "/healthz" | "/readyz" | "/metrics" | "/api/openapi.json" | "/") => {
            Open(route.path.into())
        }
        ("GET", p) if p.starts_with("/dashboard/") => Open(p.into()),
        ("GET" | "POST", "/webhook/{token}") => Open("/webhook/no-such-token".into()),
        ("GET" | "POST", "/api/tenants") => {
            AdminOnly(m, "/api/tenants".into(), json!({ "name": "x" }))
        }
        ("PATCH", "/api/tenants/{id}") => AdminOnly(
            m,
            format!("/api/tenants/{}", a.tenant.id),
            json!({ "name": "x" }),
        ),
        ("GET" | "DELETE", "/api/tenants/{id}") => {
            AdminOnly(m, format!("/api/tenants/{}", a.tenant.id), empty)
        }
        ("GET", "/api/platform/incidents") => AdminOnly(m, route.path.into(), empty),
        ("POST", "/api/platform/incidents/{id}/resolve") => AdminOnly(
            m,
            format!("/api/platform/incidents/{}/resolve", a.incident),
            empty,
        ),
        ("GET", "/api/approvals/{id}") => {
            Theirs(m, format!("/api/approvals/{}", a.approval), empty)
        }
        ("POST", "/api/approvals/{id}") => Theirs(
            m,
            format!("/api/approvals/{}", a.approval),
            json!({ "decision": "approve", "member": a.member }),
        ),
        ("GET", "/api/automations/{id}") => {
            Theirs(m, format!("/api/automations/{}", a.automation), empty)
        }
        ("PUT", "/api/automations/{id}") => Theirs(
            m,
            format!("/api/automations/{}", a.automation),
            manual("Hijack", &json!([log_step("st_x", "x")])),
        ),
        ("DELETE", "/api/automations/{id}") => {
            Theirs(m, format!("/api/automations/{}", a.automation), empty)
        }
        ("POST", "/api/automations/{id}/pause" | "/api/automations/{id}/resume") => {
            Theirs(m, route.path.replace("{id}", &a.automation), empty)
        }
        ("POST", "/api/automations/{id}/runs") => Theirs(
            m,
            format!("/api/automations/{}/runs", a.manual),
            json!({ "input": {} }),
        ),
        ("GET", "/api/automations/{id}/versions/{version}") => Theirs(
            m,
            format!("/api/automations/{}/versions/1", a.automation),
            empty,
        ),
        ("GET" | "DELETE", "/api/connections/{id}") => {
            Theirs(m, format!("/api/connections/{}", a.connection), empty)
        }
        ("PATCH", "/api/connections/{id}") => Theirs(
            m,
            format!("/api/connections/{}", a.connection),
            json!({ "rate": 1, "credentials": { "bearer": "sk_taken_over" } }),
        ),
        ("GET" | "DELETE", "/api/groups/{id}") => {
            Theirs(m, format!("/api/groups/{}", a.group), empty)
        }
        ("PATCH", "/api/groups/{id}") => Theirs(
            m,
            format!("/api/groups/{}", a.group),
            json!({ "members": [{ "name": "Mallory" }] }),
        ),
        ("POST", "/api/groups/{id}/members") => Theirs(
            m,
            format!("/api/groups/{}/members", a.group),
            json!({ "name": "Mallory" }),
        ),
        ("PATCH" | "DELETE", "/api/groups/{id}/members/{member_id}") => Theirs(
            m,
            format!("/api/groups/{}/members/{}", a.group, a.member),
            json!({ "capacity": 1 }),
        ),
        ("GET" | "DELETE", "/api/ticket-types/{id}") => {
            Theirs(m, format!("/api/ticket-types/{}", a.ticket_type), empty)
        }
        ("PATCH", "/api/ticket-types/{id}") => Theirs(
            m,
            format!("/api/ticket-types/{}", a.ticket_type),
            json!({ "statuses": ["taken over"] }),
        ),
        ("POST", "/api/incidents/{id}/resolve") => {
            Theirs(m, format!("/api/incidents/{}/resolve", a.incident), empty)
        }
        ("GET", "/api/runs/{id}") => Theirs(m, format!("/api/runs/{}", a.run), empty),
        ("POST", "/api/runs/{id}/retry") => Theirs(m, format!("/api/runs/{}/retry", a.run), empty),
        ("POST", "/api/runs/{id}/cancel" | "/api/runs/{id}/pause" | "/api/runs/{id}/resume") => {
            Theirs(m, route.path.replace("{id}", &a.waiting_run), empty)
        }
        ("GET", "/api/operations/{id}") => {
            Theirs(m, format!("/api/operations/{}", a.operation), empty)
        }
        ("POST", "/api/operations/{id}/cancel") => {
            Theirs(m, format!("/api/operations/{}/cancel", a.operation), empty)
        }
        // What A's webhook carried: B finds none of A's runs by it.
        ("POST", "/api/runs/search") => Write(
            route.path.into(),
            json!({ "where": { "rules": [
                { "field": "_body.who", "operator": "isNotEmpty" }
            ] } }),
            false,
        ),
        ("POST", "/api/runs/bulk") => Write(
            route.path.into(),
            // A dry run: an operation B made would name A's id in its filter.
            json!({ "filter": { "automation": a.automation }, "action": "cancel", "dry_run": true }),
            false,
        ),
        ("GET", "/api/events/{id}") => Theirs(m, format!("/api/events/{}", a.event), empty),
        ("POST", "/api/events/{id}/replay") => Theirs(
            m,
            format!("/api/events/{}/replay", a.event),
            json!({ "mode": "always" }),
        ),
        ("POST", "/api/events/replay") => Write(
            route.path.into(),
            json!({ "filter": { "source": a.source }, "mode": "always" }),
            false,
        ),
        ("GET", "/api/sources/{id}") => Theirs(m, format!("/api/sources/{}", a.source), empty),
        ("PATCH", "/api/sources/{id}") => Theirs(
            m,
            format!("/api/sources/{}", a.source),
            json!({ "name": "taken over" }),
        ),
        ("DELETE", "/api/sources/{id}") => Theirs(m, format!("/api/sources/{}", a.source), empty),
        ("POST", "/api/sources/{id}/rotate") => Theirs(
            m,
            format!("/api/sources/{}/rotate", a.source),
            json!({ "overlap": "1h" }),
        ),
        ("GET" | "DELETE", "/api/tickets/{id}") => {
            Theirs(m, format!("/api/tickets/{}", a.ticket), empty)
        }
        ("PATCH", "/api/tickets/{id}") => Theirs(
            m,
            format!("/api/tickets/{}", a.ticket),
            json!({ "title": "taken over" }),
        ),
        ("GET" | "DELETE", "/api/widgets/{id}") => {
            Theirs(m, format!("/api/widgets/{}", a.widget), empty)
        }
        ("PATCH", "/api/widgets/{id}") => Theirs(
            m,
            format!("/api/widgets/{}", a.widget),
            json!({ "ttlSec": 5 }),
        ),
        ("GET", "/api/keys") => Listing(route.path.into()),
        ("POST", "/api/keys") => Write(
            route.path.into(),
            json!({ "name": "B's", "scopes": ["read"] }),
            false,
        ),
        ("DELETE", "/api/keys/{id}") => Theirs(m, format!("/api/keys/{}", a.key), empty),
        ("PATCH", "/api/keys/{id}") => Theirs(
            m,
            format!("/api/keys/{}", a.key),
            json!({ "scopes": ["admin"] }),
        ),
        ("GET", "/api/widgets/{id}/data") => Theirs(
            m,
            format!("/api/widgets/{}/data?refresh=true", a.widget),
            empty,
        ),
        ("GET", "/api/approvals") => Listing("/api/approvals?status=all".into()),
        (
            "GET",
            "/api/audit"
            | "/api/automations"
            | "/api/connections"
            | "/api/dashboard/runs"
            | "/api/runs"
            | "/api/dashboard/session"
            | "/api/dashboard/queue"
            | "/api/dashboard/queue/history"
            | "/api/groups"
            | "/api/incidents"
            | "/api/sources"
            | "/api/ticket-types"
            | "/api/tickets"
            | "/api/widgets"
            | "/api/operations"
            | "/api/stream",
        ) => Listing(route.path.into()),
        ("POST", "/api/automations") => Write(
            route.path.into(),
            on_webhook(
                "On their source",
                &a.source,
                &json!([log_step("st_x", "x")]),
            ),
            true,
        ),
        ("POST", "/api/connections") => Write(
            route.path.into(),
            json!({ "name": a.connection_name, "service": "http",
                    "base_url": "http://127.0.0.1:9", "credentials": { "bearer": "sk_y" } }),
            false,
        ),
        ("POST", "/api/groups") => Write(
            route.path.into(),
            json!({ "name": "B's desk", "members": [{ "name": "Bo" }] }),
            false,
        ),
        ("POST", "/api/signals") => Write(
            route.path.into(),
            json!({ "key": format!("approval-like-{}", a.waiting_run), "payload": {} }),
            false,
        ),
        ("POST", "/api/sources") => Write(route.path.into(), plain_source("B's"), false),
        ("POST", "/api/ticket-types") => Write(
            route.path.into(),
            json!({ "name": "B's type", "statuses": ["open"], "fields": [] }),
            false,
        ),
        ("POST", "/api/tickets") => Write(
            route.path.into(),
            json!({ "external_id": "B-1", "assignee_id": a.member }),
            true,
        ),
        ("POST", "/api/widgets") => Write(
            route.path.into(),
            json!({ "name": "w", "connection": a.connection_name,
                    "request": { "url": "/x" }, "ttlSec": 60 }),
            false,
        ),
        _ => return None,
    })
}

/// The text of an answer, with whatever ids it holds.
fn text_of(body: &Value) -> String {
    match body {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn leaks<'a>(text: &str, ids: &'a [String]) -> Vec<&'a String> {
    ids.iter().filter(|id| text.contains(id.as_str())).collect()
}

/// Every route of the router, tried by tenant B (with its own key, and as
/// the platform admin acting for B) on tenant A's records: 404 for A's
/// ids, only B's rows in listings and the live stream, A's rows out of
/// reach of B's writes, and A's records unchanged afterwards. A route
/// this test does not know fails it.
async fn every_route_keeps_tenants_apart(app: &TestApp) {
    app.state.set_ready();
    let a = estate(app, "Acme").await;
    let b = estate(app, "Beta").await;
    let routes = tok_server::route_table();
    let uncovered: Vec<String> = routes
        .iter()
        .filter(|r| probe(r, &a).is_none())
        .map(ToString::to_string)
        .collect();
    assert!(
        uncovered.is_empty(),
        "routes the tenant isolation test does not try (add each to `probe`): {uncovered:#?}"
    );
    let details = [
        format!("/api/runs/{}", a.run),
        format!("/api/runs/{}", a.waiting_run),
        format!("/api/automations/{}", a.automation),
        format!("/api/approvals/{}", a.approval),
        format!("/api/tickets/{}", a.ticket),
        format!("/api/widgets/{}", a.widget),
        format!("/api/connections/{}", a.connection),
        format!("/api/groups/{}", a.group),
        format!("/api/ticket-types/{}", a.ticket_type),
        format!("/api/sources/{}", a.source),
        format!("/api/events/{}", a.event),
        format!("/api/operations/{}", a.operation),
        "/api/incidents".to_owned(),
    ];
    let mut before = Vec::new();
    for uri in &details {
        before.push(app.get(&a.tenant.key, uri).await.expect(StatusCode::OK));
    }

    let as_b = format!("Bearer {}", b.tenant.key);
    let admin = format!("Bearer {}", app.admin_key);
    let callers: [(&str, Vec<(&str, &str)>); 2] = [
        ("B's key", vec![("authorization", as_b.as_str())]),
        (
            "the admin acting for B",
            vec![
                ("authorization", admin.as_str()),
                ("x-tok-tenant", b.tenant.id.as_str()),
            ],
        ),
    ];
    let mut made_by_b = Vec::new();
    for route in &routes {
        for (caller, headers) in &callers {
            let probe = probe(route, &a).unwrap();
            let context = format!("{route} by {caller}");
            match probe {
                Probe::Open(uri) => {
                    let reply = app
                        .request(route.method.clone(), &uri, None, headers, Body::empty())
                        .await;
                    assert!(
                        !reply.status.is_server_error(),
                        "{context}: {:?}",
                        reply.status
                    );
                    let text = text_of(&reply.body);
                    assert!(leaks(&text, &a.ids).is_empty(), "{context} shows A's ids");
                }
                // The admin key is the platform's, not B's to try there.
                Probe::AdminOnly(..) if *caller != "B's key" => {}
                Probe::AdminOnly(method, uri, body) => {
                    send_json(app, method, &uri, headers, &body)
                        .await
                        .expect_error(StatusCode::FORBIDDEN, "admin_only");
                }
                Probe::Theirs(method, uri, body) => {
                    let theirs = send_json(app, method.clone(), &uri, headers, &body).await;
                    let error = theirs
                        .clone()
                        .expect_error(StatusCode::NOT_FOUND, "not_found");
                    let missing = uri.replacen(&format!("/{}", id_in(&uri, &a)), "/nope_0", 1);
                    let gone = send_json(app, method, &missing, headers, &body).await;
                    assert_eq!(
                        error,
                        gone.expect_error(StatusCode::NOT_FOUND, "not_found"),
                        "{context}: A's id must answer as one that does not exist"
                    );
                }
                Probe::Listing(uri) if uri == "/api/stream" => {
                    let text = stream_until_own_run(app, &b, headers).await;
                    assert!(
                        leaks(&text, &a.ids).is_empty(),
                        "{context} streams A's events: {text}"
                    );
                }
                Probe::Listing(uri) => {
                    let reply = send_json(app, Method::GET, &uri, headers, &Value::Null).await;
                    let text = text_of(&reply.expect(StatusCode::OK));
                    assert!(
                        leaks(&text, &a.ids).is_empty(),
                        "{context} lists A's rows: {text}"
                    );
                    if uri != "/api/dashboard/queue" && *caller == "B's key" {
                        assert!(
                            !leaks(&text, &b.ids).is_empty(),
                            "{context} lists none of B's own rows: {text}"
                        );
                    }
                }
                Probe::Write(uri, body, refused) => {
                    let reply = send_json(app, Method::POST, &uri, headers, &body).await;
                    assert!(
                        reply.status.is_client_error() || (!refused && reply.status.is_success()),
                        "{context}: {:?} {:#}",
                        reply.status,
                        reply.body
                    );
                    // Naming back what B sent is no leak; any other id of A's is.
                    let sent = body.to_string();
                    let text = text_of(&reply.body);
                    let leaked: Vec<_> = leaks(&text, &a.ids)
                        .into_iter()
                        .filter(|id| !sent.contains(id.as_str()))
                        .collect();
                    assert!(leaked.is_empty(), "{context} reached A's rows: {text}");
                    for key in ["id", "signal_id"] {
                        if let Some(id) = reply.body[key].as_str() {
                            made_by_b.push(id.to_owned());
                        }
                    }
                    if uri == "/api/signals" {
                        assert_eq!(reply.body["resumed"], json!([]), "{context}");
                    }
                }
            }
        }
    }

    // A's records are as they were, and A sees nothing B made.
    for (uri, was) in details.iter().zip(before) {
        let now = app.get(&a.tenant.key, uri).await.expect(StatusCode::OK);
        assert_eq!(now, was, "{uri} changed while B tried it");
    }
    let mut theirs = b.ids.clone();
    theirs.extend(made_by_b);
    for route in &routes {
        if let Some(Probe::Listing(uri)) = probe(route, &b)
            && uri != "/api/stream"
        {
            let text = text_of(&app.get(&a.tenant.key, &uri).await.expect(StatusCode::OK));
            assert!(
                leaks(&text, &theirs).is_empty(),
                "A's {uri} shows B's rows: {text}"
            );
        }
    }
}

/// The id of A's in `uri`.
fn id_in<'a>(uri: &str, a: &'a Estate) -> &'a str {
    a.ids
        .iter()
        .find(|id| uri.contains(&format!("/{id}")))
        .unwrap_or_else(|| panic!("{uri} has none of A's ids"))
}

async fn send_json(
    app: &TestApp,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> crate::helpers::Reply {
    let mut all = headers.to_vec();
    all.push(("content-type", "application/json"));
    let body = if body.is_null() {
        Body::empty()
    } else {
        Body::from(body.to_string())
    };
    app.request(method, uri, None, &all, body).await
}

/// Follows `GET /api/stream` as `headers` say while B's run goes from
/// start to finish (A's runs have all finished before it starts): the text
/// streamed until B's run completed.
async fn stream_until_own_run(app: &TestApp, b: &Estate, headers: &[(&str, &str)]) -> String {
    let mut request = Request::builder().method(Method::GET).uri("/api/stream");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let run = app
        .start_run(&b.tenant, &b.manual, &json!({ "input": {} }))
        .await;
    let mut text = String::new();
    let seen = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
            if text.contains(&run) {
                return;
            }
        }
    })
    .await;
    assert!(
        seen.is_ok(),
        "B's stream never showed B's run {run}: {text}"
    );
    text
}

/// An open `GET /api/stream` with `key`.
pub(crate) async fn open_stream(app: &TestApp, key: &str) -> Body {
    let request = Request::builder()
        .method(Method::GET)
        .uri("/api/stream")
        .header("authorization", format!("Bearer {key}"))
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body()
}

/// What `body` streams until `done` holds for the text so far (`true`), or
/// until it ends (`false`); a stream that does neither within 30 seconds
/// fails the test.
pub(crate) async fn read_stream(body: &mut Body, done: impl Fn(&str) -> bool) -> (String, bool) {
    let mut text = String::new();
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
            if done(&text) {
                return true;
            }
        }
        false
    })
    .await;
    match outcome {
        Ok(done) => (text, done),
        Err(_) => panic!("the stream neither showed what was awaited nor ended: {text}"),
    }
}

/// A key of the tenant's (its id and secret) made by its admin key.
async fn new_key(app: &TestApp, tenant: &Tenant, body: Value) -> (String, String) {
    let made = app
        .post(&tenant.key, "/api/keys", &body)
        .await
        .expect(StatusCode::CREATED);
    (
        made["id"].as_str().unwrap().to_owned(),
        made["key"].as_str().unwrap().to_owned(),
    )
}

/// A stream keeps no key alive: revoked (by another request, on any
/// process) or past its `expires_at`, the key's open streams end with a
/// `closed` event saying why, and the key opens no new one.
async fn a_stream_ends_when_its_key_is_revoked_or_expires(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(&tenant, &manual("Tick", &json!([log_step("st_a", "tick")])))
        .await;
    let (id, key) = new_key(app, &tenant, json!({ "name": "wall", "scopes": ["read"] })).await;
    let mut first = open_stream(app, &key).await;
    let mut second = open_stream(app, &key).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    for stream in [&mut first, &mut second] {
        let (_, seen) = read_stream(stream, |t| t.contains(&run)).await;
        assert!(seen, "the stream follows the tenant's runs");
    }

    app.delete(&tenant.key, &format!("/api/keys/{id}"))
        .await
        .expect(StatusCode::NO_CONTENT);
    for stream in [&mut first, &mut second] {
        let (text, _) = read_stream(stream, |_| false).await;
        assert!(
            text.contains("event: closed") && text.contains("\"reason\":\"key_revoked\""),
            "{text}"
        );
    }
    app.get(&key, "/api/stream")
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");

    // A key that expires in two seconds: its stream ends then.
    let soon = tok_store::rfc3339::format(tok_store::now_ms() + 2_000);
    let (_, brief) = new_key(
        app,
        &tenant,
        json!({ "name": "brief", "scopes": ["read"], "expires_at": soon }),
    )
    .await;
    let mut stream = open_stream(app, &brief).await;
    let (text, _) = read_stream(&mut stream, |_| false).await;
    assert!(
        text.contains("event: closed") && text.contains("\"reason\":\"key_expired\""),
        "{text}"
    );
    app.get(&brief, "/api/stream")
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "key_expired");
}
