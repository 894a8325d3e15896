//! The audit log (`GET /api/audit`): every change made through the API is
//! one row naming the key that made it, the action and what it changed;
//! refused changes and machine traffic write none; the listing filters by
//! actor, action, target and time, pages newest first, shows a tenant its
//! own rows only and the platform admin everyone's; and no secret the API
//! hands out or takes in ever appears in it. The route table's test holds
//! every change of every router to being audited or exempt with a reason.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use tok_server::Audit;

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual, plain_source};

backend_tests!(
    crate::helpers::run;
    each_change_is_a_row_naming_its_actor_action_and_target,
    each_change_of_a_resources_life_is_a_row,
    listings_filter_and_page_newest_first,
    a_tenant_sees_its_rows_and_the_admin_everyones,
    no_secret_reaches_the_log,
);

/// Every route of every router that changes something is audited with an
/// action `resource.verb`, or exempt for a reason; one whose action
/// cannot be derived from its method and path fails here until it is
/// named (`tok_server::NAMED`) or exempted (`tok_server::EXEMPT`).
#[test]
fn every_change_is_audited_or_exempt() {
    let routes = tok_server::route_table();
    let mut unnamed = Vec::new();
    let mut audited = 0;
    for route in &routes {
        match route.audit() {
            Audit::Read => assert!(
                route.method == Method::GET || route.method == Method::HEAD,
                "{route}"
            ),
            Audit::Action(action) => {
                let (resource, verb) = action.split_once('.').unwrap_or_default();
                let word = |w: &str| {
                    !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                };
                assert!(
                    word(resource) && word(verb),
                    "{route}: the action `{action}` is not `resource.verb`"
                );
                audited += 1;
            }
            Audit::Exempt(why) => assert!(why.len() > 10, "{route}: say why it is exempt"),
            Audit::Unnamed => unnamed.push(route.to_string()),
        }
    }
    assert!(
        unnamed.is_empty(),
        "changes whose audit action cannot be derived from their method and path: name each \
         in tok_server::NAMED (crates/tok-server/src/audit.rs), or exempt it with a reason in \
         tok_server::EXEMPT: {unnamed:#?}"
    );
    assert!(audited > 15, "the table has {audited} audited routes");
    // Every exemption and name is of a route that exists.
    for (method, path, _) in tok_server::EXEMPT.iter().chain(tok_server::NAMED) {
        assert!(
            routes
                .iter()
                .any(|r| r.method.as_str() == *method && r.path == *path),
            "{method} {path} is named or exempt but no router serves it"
        );
    }
    let exempt = |method: &str, path: &str| {
        routes
            .iter()
            .find(|r| r.method.as_str() == method && r.path == path)
            .map(|r| r.audit())
    };
    assert!(matches!(
        exempt("POST", "/webhook/{token}"),
        Some(Audit::Exempt(_))
    ));
    assert!(matches!(
        exempt("POST", "/api/signals"),
        Some(Audit::Exempt(_))
    ));
    assert!(matches!(
        exempt("POST", "/api/automations/{id}/runs"),
        Some(Audit::Exempt(_))
    ));
}

/// Every row the caller may list, page after page (`query` without
/// `limit` and `cursor`), and the raw text of each page.
async fn every_row(
    app: &TestApp,
    key: &str,
    headers: &[(&str, &str)],
    query: &str,
    limit: u32,
) -> (Vec<Value>, Vec<String>) {
    let mut rows = Vec::new();
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut uri = format!("/api/audit?limit={limit}");
        if !query.is_empty() {
            uri.push('&');
            uri.push_str(query);
        }
        if let Some(c) = &cursor {
            uri.push_str(&format!("&cursor={c}"));
        }
        let page = app
            .request(Method::GET, &uri, Some(key), headers, Body::empty())
            .await
            .expect(StatusCode::OK);
        pages.push(page.to_string());
        rows.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages.len() < 1_000, "the pages never end");
    }
    (rows, pages)
}

/// The newest row the tenant's key may list.
async fn newest(app: &TestApp, tenant: &Tenant) -> Value {
    let page = app
        .get(&tenant.key, "/api/audit?limit=1")
        .await
        .expect(StatusCode::OK);
    page["items"][0].clone()
}

/// The tenant's key's own id (`first key`), as the keys listing shows it.
async fn first_key_id(app: &TestApp, tenant: &Tenant) -> String {
    let keys = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    keys["items"][0]["id"].as_str().unwrap().to_owned()
}

async fn send(app: &TestApp, key: &str, method: Method, uri: &str, body: &Value) -> Value {
    let reply = app
        .request(
            method,
            uri,
            Some(key),
            &[("content-type", "application/json")],
            Body::from(body.to_string()),
        )
        .await;
    assert!(
        reply.status.is_success(),
        "{uri}: {:?} {:#}",
        reply.status,
        reply.body
    );
    reply.body
}

/// Asserts the newest row: this action by this key on this target.
#[track_caller]
fn assert_row(row: &Value, action: &str, actor: &str, kind: &str, target: &str) {
    assert_eq!(row["action"], action, "{row:#}");
    assert_eq!(row["actor"]["id"], actor, "{row:#}");
    assert_eq!(
        row["target"],
        json!({ "kind": kind, "id": target }),
        "{row:#}"
    );
}

async fn each_change_is_a_row_naming_its_actor_action_and_target(app: &TestApp) {
    let admin = app.admin_key.clone();
    let created = send(
        app,
        &admin,
        Method::POST,
        "/api/tenants",
        &json!({ "name": "Acme" }),
    )
    .await;
    let tenant = Tenant {
        id: created["id"].as_str().unwrap().to_owned(),
        key: created["api_key"].as_str().unwrap().to_owned(),
    };
    let me = first_key_id(app, &tenant).await;
    let row = newest(app, &tenant).await;
    assert_eq!(row["action"], "tenant.created", "{row:#}");
    assert_eq!(row["actor"]["kind"], "platform", "{row:#}");
    assert_eq!(row["actor"]["name"], "platform admin", "{row:#}");
    assert_eq!(row["target"], json!({ "kind": "tenant", "id": tenant.id }));
    assert_eq!(row["tenant_id"], tenant.id.as_str());
    assert_eq!(row["summary"], "Acme", "{row:#}");
    assert!(crate::helpers::ms(&row["at"]).is_some(), "{row:#}");

    let uri = format!("/api/tenants/{}", tenant.id);
    send(
        app,
        &admin,
        Method::PATCH,
        &uri,
        &json!({ "settings": { "retention": { "auditDays": 400 } } }),
    )
    .await;
    let row = newest(app, &tenant).await;
    assert_row(
        &row,
        "tenant.updated",
        row["actor"]["id"].as_str().unwrap(),
        "tenant",
        &tenant.id,
    );
    assert_eq!(row["actor"]["kind"], "platform");
    assert_eq!(row["summary"], "retention: auditDays", "{row:#}");

    // A tenant's key's changes, one by one.
    let source = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/sources",
        &plain_source("eshop"),
    )
    .await;
    let source_id = source["id"].as_str().unwrap();
    let row = newest(app, &tenant).await;
    assert_row(&row, "source.created", &me, "source", source_id);
    assert_eq!(
        row["actor"],
        json!({ "kind": "key", "id": me, "name": "first key" })
    );
    assert_eq!(row["summary"], "eshop");

    let definition = manual("Greeter", &json!([log_step("st_hi", "hi")]));
    let automation = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/automations",
        &definition,
    )
    .await;
    let automation = automation["id"].as_str().unwrap().to_owned();
    assert_row(
        &newest(app, &tenant).await,
        "automation.created",
        &me,
        "automation",
        &automation,
    );
    let uri = format!("/api/automations/{automation}");
    send(app, &tenant.key, Method::PUT, &uri, &definition).await;
    let row = newest(app, &tenant).await;
    assert_row(&row, "automation.saved", &me, "automation", &automation);
    assert_eq!(row["summary"], "\u{201c}Greeter\u{201d}, version 2");
    for (act, action) in [
        ("pause", "automation.paused"),
        ("resume", "automation.resumed"),
    ] {
        send(
            app,
            &tenant.key,
            Method::POST,
            &format!("{uri}/{act}"),
            &json!({}),
        )
        .await;
        assert_row(
            &newest(app, &tenant).await,
            action,
            &me,
            "automation",
            &automation,
        );
    }

    // Starting a run is not audited: the run is its record.
    let before = newest(app, &tenant).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    app.wait_for_final(&tenant, &run).await;
    assert_eq!(
        newest(app, &tenant).await,
        before,
        "a run's start writes no row"
    );

    let ticket_type = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/ticket-types",
        &json!({ "name": "order", "statuses": ["new", "done"], "fields": [] }),
    )
    .await;
    assert_row(
        &newest(app, &tenant).await,
        "ticket_type.created",
        &me,
        "ticket_type",
        ticket_type["id"].as_str().unwrap(),
    );
    let group = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/groups",
        &json!({ "name": "desk", "members": [{ "name": "Ann" }] }),
    )
    .await;
    assert_row(
        &newest(app, &tenant).await,
        "group.created",
        &me,
        "group",
        group["id"].as_str().unwrap(),
    );
    let member = group["members"][0]["id"].as_str().unwrap().to_owned();
    let ticket = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/tickets",
        &json!({ "external_id": "T-1", "type": "order" }),
    )
    .await;
    let ticket = ticket["id"].as_str().unwrap().to_owned();
    assert_row(
        &newest(app, &tenant).await,
        "ticket.created",
        &me,
        "ticket",
        &ticket,
    );
    send(
        app,
        &tenant.key,
        Method::PATCH,
        &format!("/api/tickets/{ticket}"),
        &json!({ "status": "done" }),
    )
    .await;
    assert_row(
        &newest(app, &tenant).await,
        "ticket.updated",
        &me,
        "ticket",
        &ticket,
    );
    let connection = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/connections",
        &json!({ "name": "stats", "service": "http", "base_url": "http://127.0.0.1:9" }),
    )
    .await;
    assert_row(
        &newest(app, &tenant).await,
        "connection.created",
        &me,
        "connection",
        connection["id"].as_str().unwrap(),
    );
    let widget = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/widgets",
        &json!({ "name": "w", "connection": "stats", "request": { "url": "/x" }, "ttlSec": 60 }),
    )
    .await;
    assert_row(
        &newest(app, &tenant).await,
        "widget.created",
        &me,
        "widget",
        widget["id"].as_str().unwrap(),
    );

    // A key made and revoked, by another key that then acts itself.
    let made = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/keys",
        &json!({ "name": "ops", "scopes": ["admin"] }),
    )
    .await;
    let ops = made["id"].as_str().unwrap().to_owned();
    let ops_secret = made["key"].as_str().unwrap().to_owned();
    let row = newest(app, &tenant).await;
    assert_row(&row, "key.created", &me, "key", &ops);
    assert_eq!(row["summary"], "\u{201c}ops\u{201d} with admin");

    // Run control: a run waiting for an approval is paused, resumed and
    // decided; another is cancelled; a failed one retried.
    let approve = manual(
        "Approve",
        &json!([{ "id": "st_ok", "type": "approval",
                  "config": { "approvers": { "members": [member] }, "prompt": "ok?" } }]),
    );
    let approve = send(app, &tenant.key, Method::POST, "/api/automations", &approve).await;
    let approve = approve["id"].as_str().unwrap().to_owned();
    let waiting = app
        .start_run(&tenant, &approve, &json!({ "input": {} }))
        .await;
    app.wait_for_run(&tenant, &waiting, |r| r["status"] == "waiting")
        .await;
    for (act, action) in [("pause", "run.paused"), ("resume", "run.resumed")] {
        send(
            app,
            &ops_secret,
            Method::POST,
            &format!("/api/runs/{waiting}/{act}"),
            &json!({}),
        )
        .await;
        assert_row(&newest(app, &tenant).await, action, &ops, "run", &waiting);
    }
    let approvals = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    let approval = approvals["items"][0]["id"].as_str().unwrap().to_owned();
    send(
        app,
        &ops_secret,
        Method::POST,
        &format!("/api/approvals/{approval}"),
        &json!({ "decision": "approve", "member": member }),
    )
    .await;
    let row = newest(app, &tenant).await;
    assert_row(&row, "approval.decided", &ops, "approval", &approval);
    let summary = row["summary"].as_str().unwrap();
    assert!(summary.starts_with("approved (step st_ok"), "{row:#}");
    let other = app
        .start_run(&tenant, &approve, &json!({ "input": {} }))
        .await;
    app.wait_for_run(&tenant, &other, |r| r["status"] == "waiting")
        .await;
    send(
        app,
        &ops_secret,
        Method::POST,
        &format!("/api/runs/{other}/cancel"),
        &json!({}),
    )
    .await;
    let row = newest(app, &tenant).await;
    assert_row(&row, "run.cancelled", &ops, "run", &other);
    let summary = row["summary"].as_str().unwrap();
    assert!(summary.ends_with("now cancelled"), "{row:#}");

    let failing = manual(
        "Fails",
        &json!([{ "id": "st_call", "type": "http", "config": { "url": "http://127.0.0.1:9/x" } }]),
    );
    let failing = send(app, &tenant.key, Method::POST, "/api/automations", &failing).await;
    let failing = failing["id"].as_str().unwrap().to_owned();
    let failed = app
        .start_run(&tenant, &failing, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &failed).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    send(
        app,
        &ops_secret,
        Method::POST,
        &format!("/api/runs/{failed}/retry"),
        &json!({}),
    )
    .await;
    assert_row(
        &newest(app, &tenant).await,
        "run.retried",
        &ops,
        "run",
        &failed,
    );

    // An incident resolved.
    let alert = manual(
        "Alert",
        &json!([{ "id": "st_alert", "type": "incident/create",
                  "config": { "title": "down", "impact": "none", "source": "probe" } }]),
    );
    let alert = send(app, &tenant.key, Method::POST, "/api/automations", &alert).await;
    let run = app
        .start_run(
            &tenant,
            alert["id"].as_str().unwrap(),
            &json!({ "input": {} }),
        )
        .await;
    app.wait_for_final(&tenant, &run).await;
    let incidents = app
        .get(&tenant.key, "/api/incidents")
        .await
        .expect(StatusCode::OK);
    let incident = incidents["items"][0]["id"].as_str().unwrap().to_owned();
    send(
        app,
        &ops_secret,
        Method::POST,
        &format!("/api/incidents/{incident}/resolve"),
        &json!({}),
    )
    .await;
    assert_row(
        &newest(app, &tenant).await,
        "incident.resolved",
        &ops,
        "incident",
        &incident,
    );

    // The first key is revoked by `ops`: a revocation names the key.
    let uri = format!("/api/keys/{me}");
    let reply = app
        .request(Method::DELETE, &uri, Some(&ops_secret), &[], Body::empty())
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{:#}", reply.body);
    let row = app
        .get(&ops_secret, "/api/audit?limit=1")
        .await
        .expect(StatusCode::OK)["items"][0]
        .clone();
    assert_row(&row, "key.revoked", &ops, "key", &me);
    assert_eq!(row["summary"], "\u{201c}first key\u{201d}");

    // A refused change writes nothing: a cancel of a finished run (409),
    // a bad body (400), another's id (404).
    let before = app
        .get(&ops_secret, "/api/audit?limit=1")
        .await
        .expect(StatusCode::OK);
    for (method, uri, body) in [
        (
            Method::POST,
            format!("/api/runs/{failed}/cancel"),
            json!({}),
        ),
        (
            Method::POST,
            "/api/sources".to_owned(),
            json!({ "name": "" }),
        ),
        (
            Method::PUT,
            "/api/automations/aut_nope".to_owned(),
            definition.clone(),
        ),
    ] {
        let reply = app
            .request(
                method,
                &uri,
                Some(&ops_secret),
                &[("content-type", "application/json")],
                Body::from(body.to_string()),
            )
            .await;
        assert!(reply.status.is_client_error(), "{uri}: {:?}", reply.status);
    }
    let after = app
        .get(&ops_secret, "/api/audit?limit=1")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        after["items"], before["items"],
        "refused changes write no row"
    );
}

/// `DELETE uri` with the key; asserts a 204.
async fn delete(app: &TestApp, key: &str, uri: &str) {
    let reply = app
        .request(Method::DELETE, uri, Some(key), &[], Body::empty())
        .await;
    assert_eq!(
        reply.status,
        StatusCode::NO_CONTENT,
        "{uri}: {:#}",
        reply.body
    );
}

/// Changes and deletes of every kind of resource, each its row; a
/// resource named in the path by its name is the target by its id.
async fn each_change_of_a_resources_life_is_a_row(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let me = first_key_id(app, &tenant).await;
    let key = tenant.key.clone();
    let latest = async || newest(app, &tenant).await;

    let source = send(
        app,
        &key,
        Method::POST,
        "/api/sources",
        &plain_source("eshop"),
    )
    .await;
    let source = source["id"].as_str().unwrap().to_owned();
    let uri = format!("/api/sources/{source}");
    send(app, &key, Method::PATCH, &uri, &json!({ "name": "e-shop" })).await;
    assert_row(&latest().await, "source.updated", &me, "source", &source);
    send(
        app,
        &key,
        Method::POST,
        &format!("{uri}/rotate"),
        &json!({}),
    )
    .await;
    assert_row(&latest().await, "source.rotated", &me, "source", &source);
    delete(app, &key, &uri).await;
    assert_row(&latest().await, "source.deleted", &me, "source", &source);

    let automation = send(
        app,
        &key,
        Method::POST,
        "/api/automations",
        &manual("Gone", &json!([log_step("st", "x")])),
    )
    .await;
    let automation = automation["id"].as_str().unwrap().to_owned();
    delete(app, &key, &format!("/api/automations/{automation}")).await;
    assert_row(
        &latest().await,
        "automation.deleted",
        &me,
        "automation",
        &automation,
    );

    let connection = send(
        app,
        &key,
        Method::POST,
        "/api/connections",
        &json!({ "name": "stats", "service": "http", "base_url": "http://127.0.0.1:9" }),
    )
    .await;
    let connection = connection["id"].as_str().unwrap().to_owned();
    let uri = format!("/api/connections/{connection}");
    send(app, &key, Method::PATCH, &uri, &json!({ "rate": 2.5 })).await;
    assert_row(
        &latest().await,
        "connection.updated",
        &me,
        "connection",
        &connection,
    );
    let widget = send(
        app,
        &key,
        Method::POST,
        "/api/widgets",
        &json!({ "name": "w", "connection": "stats", "request": { "url": "/x" }, "ttlSec": 60 }),
    )
    .await;
    let widget = widget["id"].as_str().unwrap().to_owned();
    let widget_uri = format!("/api/widgets/{widget}");
    send(
        app,
        &key,
        Method::PATCH,
        &widget_uri,
        &json!({ "ttlSec": 600 }),
    )
    .await;
    assert_row(&latest().await, "widget.updated", &me, "widget", &widget);
    delete(app, &key, &widget_uri).await;
    assert_row(&latest().await, "widget.deleted", &me, "widget", &widget);
    delete(app, &key, &uri).await;
    assert_row(
        &latest().await,
        "connection.deleted",
        &me,
        "connection",
        &connection,
    );

    let group = send(
        app,
        &key,
        Method::POST,
        "/api/groups",
        &json!({ "name": "warehouse", "members": [{ "name": "Eva" }] }),
    )
    .await;
    let group = group["id"].as_str().unwrap().to_owned();
    // By its name in the path: the row names its id.
    send(
        app,
        &key,
        Method::PATCH,
        "/api/groups/warehouse",
        &json!({ "members": [{ "name": "Eva", "capacity": 5 }] }),
    )
    .await;
    assert_row(&latest().await, "group.updated", &me, "group", &group);
    let members = format!("/api/groups/{group}/members");
    let bo = send(app, &key, Method::POST, &members, &json!({ "name": "Bo" })).await;
    let bo = bo["id"].as_str().unwrap().to_owned();
    let row = latest().await;
    assert_row(&row, "member.created", &me, "member", &bo);
    assert_eq!(row["summary"], "Bo");
    let bo_uri = format!("{members}/{bo}");
    send(app, &key, Method::PATCH, &bo_uri, &json!({ "capacity": 3 })).await;
    assert_row(&latest().await, "member.updated", &me, "member", &bo);
    delete(app, &key, &bo_uri).await;
    assert_row(&latest().await, "member.deleted", &me, "member", &bo);
    delete(app, &key, &format!("/api/groups/{group}")).await;
    assert_row(&latest().await, "group.deleted", &me, "group", &group);

    let kind = send(
        app,
        &key,
        Method::POST,
        "/api/ticket-types",
        &json!({ "name": "order", "statuses": ["new"], "fields": [] }),
    )
    .await;
    let kind = kind["id"].as_str().unwrap().to_owned();
    let uri = format!("/api/ticket-types/{kind}");
    send(
        app,
        &key,
        Method::PATCH,
        &uri,
        &json!({ "statuses": ["new", "done"] }),
    )
    .await;
    assert_row(
        &latest().await,
        "ticket_type.updated",
        &me,
        "ticket_type",
        &kind,
    );
    delete(app, &key, &uri).await;
    assert_row(
        &latest().await,
        "ticket_type.deleted",
        &me,
        "ticket_type",
        &kind,
    );

    let made = send(
        app,
        &key,
        Method::POST,
        "/api/keys",
        &json!({ "name": "ci", "scopes": ["read"] }),
    )
    .await;
    let ci = made["id"].as_str().unwrap().to_owned();
    send(
        app,
        &key,
        Method::PATCH,
        &format!("/api/keys/{ci}"),
        &json!({ "scopes": ["write"] }),
    )
    .await;
    let row = latest().await;
    assert_row(&row, "key.updated", &me, "key", &ci);
    assert_eq!(row["summary"], "\u{201c}ci\u{201d} with write");
}

async fn listings_filter_and_page_newest_first(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let me = first_key_id(app, &tenant).await;
    let made = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/keys",
        &json!({ "name": "ci", "scopes": ["write"] }),
    )
    .await;
    let ci = made["id"].as_str().unwrap().to_owned();
    let ci_secret = made["key"].as_str().unwrap().to_owned();
    let mut sources = Vec::new();
    for (n, key) in [&tenant.key, &ci_secret, &tenant.key, &ci_secret, &ci_secret]
        .iter()
        .enumerate()
    {
        let source = send(
            app,
            key,
            Method::POST,
            "/api/sources",
            &plain_source(&format!("s{n}")),
        )
        .await;
        sources.push(source["id"].as_str().unwrap().to_owned());
    }
    let automation = send(
        app,
        &ci_secret,
        Method::POST,
        "/api/automations",
        &manual("A", &json!([log_step("st", "x")])),
    )
    .await;
    let automation = automation["id"].as_str().unwrap().to_owned();
    let uri = format!("/api/automations/{automation}/pause");
    send(app, &tenant.key, Method::POST, &uri, &json!({})).await;

    // Newest first, two a page, the same rows as one page.
    let (paged, pages) = every_row(app, &tenant.key, &[], "", 2).await;
    let (whole, _) = every_row(app, &tenant.key, &[], "", 500).await;
    assert_eq!(paged, whole);
    assert!(pages.len() >= 4, "{pages:#?}");
    let actions: Vec<&str> = whole
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "automation.paused",
            "automation.created",
            "source.created",
            "source.created",
            "source.created",
            "source.created",
            "source.created",
            "key.created",
            "tenant.created",
        ],
        "{whole:#?}"
    );
    let ats: Vec<i64> = whole
        .iter()
        .map(|r| crate::helpers::ms(&r["at"]).unwrap())
        .collect();
    assert!(ats.windows(2).all(|w| w[0] >= w[1]), "{ats:?}");

    // Each filter, and two together.
    let (of_ci, _) = every_row(app, &tenant.key, &[], &format!("actor={ci}"), 2).await;
    let targets: Vec<&str> = of_ci
        .iter()
        .map(|r| r["target"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        [&automation, &sources[4], &sources[3], &sources[1]]
    );
    let (paused, _) = every_row(app, &tenant.key, &[], "action=automation.paused", 10).await;
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0]["actor"]["id"], me.as_str());
    let (of_target, _) =
        every_row(app, &tenant.key, &[], &format!("target={automation}"), 10).await;
    let actions: Vec<&str> = of_target
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["automation.paused", "automation.created"]);
    let (both, _) = every_row(
        app,
        &tenant.key,
        &[],
        &format!("actor={ci}&action=source.created"),
        10,
    )
    .await;
    assert_eq!(both.len(), 3);
    let since = whole[1]["at"].as_str().unwrap().to_owned();
    let (recent, _) = every_row(app, &tenant.key, &[], &format!("since={since}"), 10).await;
    assert!(
        recent.len() >= 2 && recent.len() < whole.len() && recent[0] == whole[0],
        "{recent:#?}"
    );
    let (future, _) = every_row(app, &tenant.key, &[], "since=2999-01-01T00:00:00Z", 10).await;
    assert!(future.is_empty());

    // Bad filters are a 400 naming them.
    for (query, param) in [
        ("since=yesterday", "since"),
        ("since=", "since"),
        ("actor=", "actor"),
        ("limit=0", "limit"),
        ("cursor=bm9wZQ", "cursor"),
    ] {
        let reply = app.get(&tenant.key, &format!("/api/audit?{query}")).await;
        let code = if param == "limit" {
            "bad_limit"
        } else if param == "cursor" {
            "bad_cursor"
        } else {
            "bad_query"
        };
        let error = reply.expect_error(StatusCode::BAD_REQUEST, code);
        assert_eq!(error["param"], param, "{query}: {error:#}");
    }
    let forged = {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("audit:not-a-number")
    };
    let error = app
        .get(&tenant.key, &format!("/api/audit?cursor={forged}"))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "bad_cursor");
    assert_eq!(error["param"], "cursor");
    let unknown = app.get(&tenant.key, "/api/audit?who=me").await;
    let error = unknown.expect_error(StatusCode::BAD_REQUEST, "bad_query");
    assert!(
        error["message"].as_str().unwrap().contains("who"),
        "{error:#}"
    );
    // A key without `admin` may not read the log.
    let reply = app.get(&ci_secret, "/api/audit").await;
    let error = reply.expect_error(StatusCode::FORBIDDEN, "scope_missing");
    assert_eq!(error["scope"], "admin");
}

async fn a_tenant_sees_its_rows_and_the_admin_everyones(app: &TestApp) {
    let a = app.create_tenant("Acme").await;
    let b = app.create_tenant("Beta").await;
    let a_source = send(
        app,
        &a.key,
        Method::POST,
        "/api/sources",
        &plain_source("a"),
    )
    .await;
    let b_source = send(
        app,
        &b.key,
        Method::POST,
        "/api/sources",
        &plain_source("b"),
    )
    .await;
    let a_source = a_source["id"].as_str().unwrap();
    let b_source = b_source["id"].as_str().unwrap();

    let (rows_a, pages_a) = every_row(app, &a.key, &[], "", 500).await;
    assert!(
        rows_a.iter().all(|r| r["tenant_id"] == a.id.as_str()),
        "{rows_a:#?}"
    );
    assert!(rows_a.iter().any(|r| r["target"]["id"] == a_source));
    for text in &pages_a {
        assert!(!text.contains(&b.id) && !text.contains(b_source), "{text}");
    }
    // Another tenant's ids as filters find nothing.
    let (theirs, _) = every_row(app, &a.key, &[], &format!("target={b_source}"), 10).await;
    assert!(theirs.is_empty(), "{theirs:#?}");

    // The admin without `X-Tok-Tenant`: every tenant's rows.
    let admin = app.admin_key.clone();
    let (all, _) = every_row(app, &admin, &[], "", 500).await;
    for source in [a_source, b_source] {
        assert!(all.iter().any(|r| r["target"]["id"] == source), "{all:#?}");
    }
    let created: Vec<&Value> = all
        .iter()
        .filter(|r| r["action"] == "tenant.created")
        .collect();
    assert_eq!(created.len(), 2, "{all:#?}");
    // With it: that tenant's, its changes by the admin included.
    let as_b = [("x-tok-tenant", b.id.as_str())];
    let made = app
        .post_with(&admin, "/api/sources", &as_b, &plain_source("by admin"))
        .await
        .expect(StatusCode::CREATED);
    let (rows_b, _) = every_row(app, &admin, &as_b, "", 500).await;
    assert!(
        rows_b.iter().all(|r| r["tenant_id"] == b.id.as_str()),
        "{rows_b:#?}"
    );
    assert_eq!(rows_b[0]["target"]["id"], made["id"], "{rows_b:#?}");
    assert_eq!(rows_b[0]["actor"]["kind"], "platform", "{rows_b:#?}");
    let (seen_by_b, _) = every_row(app, &b.key, &[], "", 500).await;
    assert_eq!(
        seen_by_b, rows_b,
        "the tenant sees what the admin did to it"
    );
    // A tenant key ignores the header.
    let as_a = [("x-tok-tenant", a.id.as_str())];
    let (sneaky, _) = every_row(app, &b.key, &as_a, "", 500).await;
    assert_eq!(sneaky, rows_b);
}

async fn no_secret_reaches_the_log(app: &TestApp) {
    let admin = app.admin_key.clone();
    let created = send(
        app,
        &admin,
        Method::POST,
        "/api/tenants",
        &json!({ "name": "Acme" }),
    )
    .await;
    let tenant = Tenant {
        id: created["id"].as_str().unwrap().to_owned(),
        key: created["api_key"].as_str().unwrap().to_owned(),
    };
    let mut secrets = vec![tenant.key.clone(), admin.clone()];
    let made = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/keys",
        &json!({ "name": "ci", "scopes": ["write"] }),
    )
    .await;
    secrets.push(made["key"].as_str().unwrap().to_owned());
    let bearer = "sk_live_bearer_that_must_stay_secret";
    send(
        app,
        &tenant.key,
        Method::POST,
        "/api/connections",
        &json!({ "name": "billing", "service": "http", "base_url": "https://billing.example.test",
                 "credentials": { "bearer": bearer } }),
    )
    .await;
    secrets.push(bearer.to_owned());
    let signing = {
        use base64::Engine as _;
        format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(b"the-senders-signing-key")
        )
    };
    let source = send(
        app,
        &tenant.key,
        Method::POST,
        "/api/sources",
        &json!({ "name": "signed", "params": [], "secret": signing }),
    )
    .await;
    secrets.push(signing.clone());
    // The webhook token is the source's credential too.
    secrets.push(source["token"].as_str().unwrap().to_owned());
    // Secrets given and handed out by changes: a rotation's new signing
    // secret and token, a connection's new credentials.
    let rotated_secret = {
        use base64::Engine as _;
        format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(b"the-senders-next-signing-key")
        )
    };
    let rotated = send(
        app,
        &tenant.key,
        Method::POST,
        &format!("/api/sources/{}/rotate", source["id"].as_str().unwrap()),
        &json!({ "secret": rotated_secret }),
    )
    .await;
    secrets.push(rotated_secret);
    secrets.push(rotated["token"].as_str().unwrap().to_owned());
    let new_bearer = "sk_live_the_next_bearer_that_must_stay_secret";
    send(
        app,
        &tenant.key,
        Method::PATCH,
        "/api/connections/billing",
        &json!({ "credentials": { "bearer": new_bearer } }),
    )
    .await;
    secrets.push(new_bearer.to_owned());
    let uri = format!("/api/tenants/{}", tenant.id);
    send(
        app,
        &admin,
        Method::PATCH,
        &uri,
        &json!({ "suspended": false }),
    )
    .await;

    for (who, key, headers) in [
        ("the tenant", tenant.key.as_str(), vec![]),
        ("the admin", admin.as_str(), vec![]),
        (
            "the admin for the tenant",
            admin.as_str(),
            vec![("x-tok-tenant", tenant.id.as_str())],
        ),
    ] {
        let (rows, pages) = every_row(app, key, &headers, "", 2).await;
        assert!(rows.len() >= 5, "{who}: {rows:#?}");
        for action in ["source.rotated", "connection.updated", "key.created"] {
            assert!(
                rows.iter().any(|r| r["action"] == action),
                "{who}: {action}"
            );
        }
        for text in &pages {
            for secret in &secrets {
                assert!(
                    !text.contains(secret.as_str()),
                    "{who} reads a secret in the log: {text}"
                );
            }
        }
    }
}
