//! Connections through the API: created with credentials and limits, the
//! credentials never come back (not in the answer to the create, not in a
//! listing, not in the answer to a change), bad limits are refused with
//! what was expected, and another tenant sees none of them. A change
//! replaces what it names (the same checks as a create), and the next
//! call of a step uses it: the new bearer, the new base URL; a base URL of
//! another origin is refused while a step calls a literal URL of the old
//! one; a connection that an automation or a widget names is not deleted.
//! A key without `admin` moves a connection holding credentials to another
//! origin only by giving the credentials again (relative URLs follow the
//! base URL, so they would take the old ones there), and a connection's
//! credentials never carry a header that sends them elsewhere.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tok_engine::OutboundAllow;
use tok_store::Backend;

use crate::helpers::{Tenant, TestApp, backend_tests, manual};

backend_tests!(
    crate::helpers::run;
    credentials_are_write_only,
    bad_connections_are_refused_with_what_was_expected,
    another_tenants_connections_are_invisible,
    a_change_replaces_what_it_names_and_keeps_the_rest,
    bad_changes_are_refused_with_what_was_expected,
    a_connection_that_automations_or_widgets_name_is_not_deleted,
);

backend_tests!(
    run_two_origins;
    changed_credentials_and_base_url_go_on_the_next_call,
    a_base_url_of_another_origin_is_refused_while_literal_urls_call_the_old_one,
    a_write_key_moves_credentials_to_another_origin_only_by_giving_them_again,
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

fn uri(connection: &Value) -> String {
    format!("/api/connections/{}", connection["id"].as_str().unwrap())
}

async fn a_change_replaces_what_it_names_and_keeps_the_rest(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let created = app
        .post(&tenant.key, "/api/connections", &invoicing())
        .await
        .expect(StatusCode::CREATED);
    let uri = uri(&created);
    let changed = app
        .patch(
            &tenant.key,
            &uri,
            &json!({
                "name": "invoicing", "service": "http",
                "credentials": { "bearer": "sk_live_rotated_value" },
                "rate": null, "burst": 3,
                "breaker": { "threshold": 7 },
            }),
        )
        .await
        .expect(StatusCode::OK);
    assert!(
        !changed.to_string().contains("sk_live_rotated"),
        "{changed}"
    );
    assert_eq!(changed["rate"], Value::Null, "{changed:#}");
    assert_eq!(changed["burst"], 3);
    assert_eq!(changed["breaker"]["threshold"], 7);
    // What the change does not name stays.
    assert_eq!(changed["max_concurrency"], 4, "{changed:#}");
    assert_eq!(changed["breaker"]["cooldown_ms"], 5000);
    assert_eq!(changed["base_url"], "https://api.invoicing.example/v1");
    assert_eq!(changed["has_credentials"], true);
    assert_eq!(
        (&changed["id"], &changed["name"]),
        (&created["id"], &created["name"])
    );
    let shown = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
    assert_eq!(shown, changed);

    let changed = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "max_concurrency": null, "credentials": {}, "rate": 2.5 }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(changed["max_concurrency"], Value::Null, "{changed:#}");
    assert_eq!(changed["has_credentials"], false);
    assert_eq!(changed["rate"], 2.5);
    // The connection is found by its name as well.
    let by_name = app
        .patch(
            &tenant.key,
            "/api/connections/invoicing",
            &json!({ "burst": 9 }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(by_name["burst"], 9);
}

async fn bad_changes_are_refused_with_what_was_expected(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    let created = app
        .post(&tenant.key, "/api/connections", &invoicing())
        .await
        .expect(StatusCode::CREATED);
    let bare = app
        .post(
            &tenant.key,
            "/api/connections",
            &json!({ "name": "open-data", "service": "http" }),
        )
        .await
        .expect(StatusCode::CREATED);
    let cases = [
        (
            &created,
            json!({ "name": "billing" }),
            "`name` cannot change",
        ),
        (
            &created,
            json!({ "service": "mcp" }),
            "`service` cannot change",
        ),
        (&created, json!({ "rate": 0 }), "must be positive"),
        (
            &created,
            json!({ "burst": 0 }),
            "`burst` must be at least 1",
        ),
        (&created, json!({ "max_concurrency": 0 }), "at least 1"),
        (
            &created,
            json!({ "breaker": { "cooldown_ms": 5 } }),
            "`breaker.cooldown_ms` at least 100",
        ),
        (
            &created,
            json!({ "base_url": "ftp://x" }),
            "http:// or https://",
        ),
        (
            &created,
            json!({ "credentials": "token" }),
            "must be an object",
        ),
        (
            &created,
            json!({ "base_url": null }),
            "a connection with `credentials` needs `base_url`",
        ),
        (
            &bare,
            json!({ "credentials": { "bearer": SECRET } }),
            "a connection with `credentials` needs `base_url`",
        ),
        (&created, json!({ "timeout": 5 }), "unknown field `timeout`"),
    ];
    for (connection, body, expected) in cases {
        let error = app
            .patch(&tenant.key, &uri(connection), &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
        assert!(!message.contains(SECRET), "{message}");
    }
    // Nothing of it was written.
    let shown = app
        .get(&tenant.key, &uri(&created))
        .await
        .expect(StatusCode::OK);
    assert_eq!(shown, created);
    // Another tenant's id answers as one that does not exist.
    let theirs = app
        .patch(&other.key, &uri(&created), &json!({ "rate": 1 }))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let missing = app
        .patch(
            &other.key,
            "/api/connections/con_missing",
            &json!({ "rate": 1 }),
        )
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    assert_eq!(theirs, missing);
    app.delete(&other.key, &uri(&created))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.get(&tenant.key, &uri(&created))
        .await
        .expect(StatusCode::OK);
}

async fn a_connection_that_automations_or_widgets_name_is_not_deleted(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let created = app
        .post(&tenant.key, "/api/connections", &invoicing())
        .await
        .expect(StatusCode::CREATED);
    let uri = uri(&created);
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Bill",
                &json!([{ "id": "st_bill", "type": "http",
                          "config": { "connection": "invoicing", "method": "POST", "url": "/invoices" } }]),
            ),
        )
        .await;
    let widget = app
        .post(
            &tenant.key,
            "/api/widgets",
            &json!({ "name": "Unpaid", "connection": created["id"],
                     "request": { "url": "/invoices?unpaid" }, "ttlSec": 60 }),
        )
        .await
        .expect(StatusCode::CREATED);
    let refused = app
        .delete(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([
            { "kind": "automation", "id": automation, "name": "Bill",
              "path": "steps.0.config.connection" },
            { "kind": "widget", "id": widget["id"], "name": "Unpaid", "path": "connection" },
        ]),
        "{refused:#}"
    );
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("connection `invoicing` is in use by automation `Bill` at steps.0.config.connection, widget `Unpaid`"),
        "{message}"
    );
    app.get(&tenant.key, &uri).await.expect(StatusCode::OK);

    // Once neither names it, it goes.
    app.delete(
        &tenant.key,
        &format!("/api/widgets/{}", widget["id"].as_str().unwrap()),
    )
    .await
    .expect(StatusCode::NO_CONTENT);
    app.put(
        &tenant.key,
        &format!("/api/automations/{automation}"),
        &manual(
            "Bill",
            &json!([{ "id": "st_log", "type": "flow/log", "config": { "message": "no more" } }]),
        ),
    )
    .await
    .expect(StatusCode::OK);
    let gone = app.delete(&tenant.key, &uri).await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT, "{:#}", gone.body);
    app.get(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.delete(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let list = app
        .get(&tenant.key, "/api/connections")
        .await
        .expect(StatusCode::OK);
    assert_eq!(list["items"], json!([]));
}

/// An app whose guard opens one local service under two origins,
/// `http://127.0.0.1:P` and `http://localhost:P`.
async fn run_two_origins(backend: Backend, test: impl AsyncFnOnce(&TestApp)) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let allow = OutboundAllow::parse(&format!("127.0.0.1:{port},localhost:{port}")).unwrap();
    crate::helpers::run_serving(backend, Some(listener), allow, test).await;
}

/// What reached the service: each call's `Host` and `Authorization`.
#[derive(Default)]
struct Calls(Mutex<Vec<(String, String)>>);

async fn record(State(calls): State<Arc<Calls>>, headers: HeaderMap) -> axum::Json<Value> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    calls
        .0
        .lock()
        .unwrap()
        .push((header("host"), header("authorization")));
    axum::Json(json!({ "ok": true }))
}

/// Serves the test's listener; answers its port and what reaches it.
fn serve(app: &TestApp) -> (u16, Arc<Calls>) {
    let listener = app.service_listener();
    let port = listener.local_addr().unwrap().port();
    let calls = Arc::new(Calls::default());
    let router = axum::Router::new()
        .route("/hit", axum::routing::any(record))
        .with_state(calls.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (port, calls)
}

/// Runs the automation once to its end; it must complete.
async fn run_once(app: &TestApp, tenant: &Tenant, automation: &str) {
    let run = app
        .start_run(tenant, automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
}

async fn changed_credentials_and_base_url_go_on_the_next_call(app: &TestApp) {
    let (port, calls) = serve(app);
    let tenant = app.create_tenant("Acme").await;
    let created = app
        .post(
            &tenant.key,
            "/api/connections",
            &json!({ "name": "shop", "service": "http",
                     "base_url": format!("http://127.0.0.1:{port}"),
                     "credentials": { "bearer": "sk_old_bearer" } }),
        )
        .await
        .expect(StatusCode::CREATED);
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Ping",
                &json!([{ "id": "st_ping", "type": "http",
                          "config": { "connection": "shop", "url": "/hit" } }]),
            ),
        )
        .await;
    run_once(app, &tenant, &automation).await;
    app.patch(
        &tenant.key,
        &uri(&created),
        &json!({ "credentials": { "bearer": "sk_new_bearer" } }),
    )
    .await
    .expect(StatusCode::OK);
    run_once(app, &tenant, &automation).await;
    // The relative URL follows the base URL to its new origin.
    app.patch(
        &tenant.key,
        &uri(&created),
        &json!({ "base_url": format!("http://localhost:{port}") }),
    )
    .await
    .expect(StatusCode::OK);
    run_once(app, &tenant, &automation).await;
    let seen = calls.0.lock().unwrap().clone();
    let at = |host: &str, bearer: &str| (format!("{host}:{port}"), format!("Bearer {bearer}"));
    assert_eq!(
        seen,
        [
            at("127.0.0.1", "sk_old_bearer"),
            at("127.0.0.1", "sk_new_bearer"),
            at("localhost", "sk_new_bearer"),
        ]
    );
}

async fn a_base_url_of_another_origin_is_refused_while_literal_urls_call_the_old_one(
    app: &TestApp,
) {
    let (port, calls) = serve(app);
    let old = format!("http://127.0.0.1:{port}");
    let tenant = app.create_tenant("Acme").await;
    let created = app
        .post(
            &tenant.key,
            "/api/connections",
            &json!({ "name": "shop", "service": "http", "base_url": old,
                     "credentials": { "bearer": "sk_shop" } }),
        )
        .await
        .expect(StatusCode::CREATED);
    let literal = app
        .create_automation(
            &tenant,
            &manual(
                "Literal",
                &json!([
                    { "id": "st_log", "type": "flow/log", "config": { "message": "first" } },
                    { "id": "st_ping", "type": "http",
                      "config": { "connection": created["id"], "url": format!("{old}/hit") } },
                ]),
            ),
        )
        .await;
    let widget = app
        .post(
            &tenant.key,
            "/api/widgets",
            &json!({ "name": "Hits", "connection": "shop",
                     "request": { "url": format!("{old}/hit") }, "ttlSec": 60 }),
        )
        .await
        .expect(StatusCode::CREATED);
    let moved = json!({ "base_url": format!("http://localhost:{port}/v2") });
    let refused = app
        .patch(&tenant.key, &uri(&created), &moved)
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([
            { "kind": "automation", "id": literal, "name": "Literal", "path": "steps.1.config.url" },
            { "kind": "widget", "id": widget["id"], "name": "Hits", "path": "request.url" },
        ]),
        "{refused:#}"
    );
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("connection `shop` cannot move to")
            && message.contains("automation `Literal` at steps.1.config.url"),
        "{message}"
    );
    let shown = app
        .get(&tenant.key, &uri(&created))
        .await
        .expect(StatusCode::OK);
    assert_eq!(shown["base_url"], old.as_str(), "nothing changed");
    run_once(app, &tenant, &literal).await;
    assert_eq!(calls.0.lock().unwrap().len(), 1, "the step still calls");

    // Another path of the same origin is no move; made relative, the
    // step and the widget follow the base URL anywhere.
    app.patch(
        &tenant.key,
        &uri(&created),
        &json!({ "base_url": format!("{old}/v1") }),
    )
    .await
    .expect(StatusCode::OK);
    app.put(
        &tenant.key,
        &format!("/api/automations/{literal}"),
        &manual(
            "Literal",
            &json!([{ "id": "st_ping", "type": "http",
                      "config": { "connection": "shop", "url": "/hit" } }]),
        ),
    )
    .await
    .expect(StatusCode::OK);
    app.patch(
        &tenant.key,
        &format!("/api/widgets/{}", widget["id"].as_str().unwrap()),
        &json!({ "request": { "url": "/hit" } }),
    )
    .await
    .expect(StatusCode::OK);
    let moved = app
        .patch(&tenant.key, &uri(&created), &moved)
        .await
        .expect(StatusCode::OK);
    assert_eq!(moved["base_url"], format!("http://localhost:{port}/v2"));
}

async fn a_write_key_moves_credentials_to_another_origin_only_by_giving_them_again(app: &TestApp) {
    let (port, calls) = serve(app);
    let (home, away) = (
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
    );
    let tenant = app.create_tenant("Acme").await;
    let writer = app
        .post(
            &tenant.key,
            "/api/keys",
            &json!({ "name": "deploy", "scopes": ["write"] }),
        )
        .await
        .expect(StatusCode::CREATED)["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let created = app
        .post(
            &tenant.key,
            "/api/connections",
            &json!({ "name": "shop", "service": "http", "base_url": home,
                     "credentials": { "bearer": "sk_shop_secret" } }),
        )
        .await
        .expect(StatusCode::CREATED);
    // A relative URL: it follows the base URL wherever it goes.
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Ping",
                &json!([{ "id": "st_ping", "type": "http",
                          "config": { "connection": "shop", "url": "/hit" } }]),
            ),
        )
        .await;

    // The write key points the base URL at another origin: refused.
    let refused = app
        .patch(&writer, &uri(&created), &json!({ "base_url": away }))
        .await
        .expect_error(StatusCode::CONFLICT, "credentials_required");
    assert_eq!(refused["field"], "credentials");
    assert_eq!(refused["from"], home.as_str());
    assert_eq!(refused["to"], away.as_str());
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("connection `shop` holds credentials")
            && message.contains("`admin` scope"),
        "{message}"
    );
    assert!(!message.contains("sk_shop_secret"), "{message}");
    let shown = app
        .get(&writer, &uri(&created))
        .await
        .expect(StatusCode::OK);
    assert_eq!(shown["base_url"], home.as_str(), "nothing changed");
    run_once(app, &tenant, &automation).await;
    // So is another scheme or port of the same host, with another change beside it.
    for other in [
        format!("https://127.0.0.1:{port}"),
        "http://127.0.0.1:1".into(),
    ] {
        app.patch(
            &writer,
            &uri(&created),
            &json!({ "base_url": other, "rate": 5 }),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "credentials_required");
    }
    // Another path of the same origin is no move.
    app.patch(
        &writer,
        &uri(&created),
        &json!({ "base_url": format!("{home}/v2") }),
    )
    .await
    .expect(StatusCode::OK);

    // Given again in the same request, the credentials may go.
    let moved = app
        .patch(
            &writer,
            &uri(&created),
            &json!({ "base_url": away, "credentials": { "bearer": "sk_given_again" } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(moved["base_url"], away.as_str());
    assert_eq!(moved["has_credentials"], true);
    run_once(app, &tenant, &automation).await;
    // Removed in the same request, nothing of them goes either; and the
    // tenant's admin key may move them as they are.
    app.patch(
        &writer,
        &uri(&created),
        &json!({ "base_url": home, "credentials": null }),
    )
    .await
    .expect(StatusCode::OK);
    app.patch(
        &tenant.key,
        &uri(&created),
        &json!({ "credentials": { "bearer": "sk_admins" } }),
    )
    .await
    .expect(StatusCode::OK);
    app.patch(&tenant.key, &uri(&created), &json!({ "base_url": away }))
        .await
        .expect(StatusCode::OK);

    let seen = calls.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (
                format!("127.0.0.1:{port}"),
                "Bearer sk_shop_secret".to_owned()
            ),
            (
                format!("localhost:{port}"),
                "Bearer sk_given_again".to_owned()
            ),
        ],
        "the first credentials never reached the other origin"
    );

    // Credentials whose headers would send a call elsewhere are refused.
    for (name, at) in [
        ("Host", "credentials.headers.Host"),
        ("X-Forwarded-Host", "credentials.headers.X-Forwarded-Host"),
    ] {
        let refused = app
            .patch(
                &writer,
                &uri(&created),
                &json!({ "credentials": { "headers": { name: "evil.example", "X-Key": "k" } } }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(refused["field"], at, "{refused:#}");
    }
}
