//! A tenant's API keys: made with scopes and shown once, listed without
//! secrets, refused outside their scopes (403 `scope_missing` naming the
//! scope), revoked at once, expired on time; every route of the router
//! declares the scope it needs, and a key without it is refused there.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use tok_server::Access;
use tok_store::Scope;

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual};

backend_tests!(
    crate::helpers::run;
    a_key_is_shown_once_and_listed_without_its_secret,
    a_key_outside_its_scope_is_403_naming_the_scope,
    a_revoked_key_is_refused_at_once,
    a_keys_name_and_scopes_change_at_once,
    the_last_admin_key_stays,
    an_expired_key_is_refused_and_says_so,
    bad_key_bodies_are_400_naming_the_field,
    a_keys_use_is_noted,
    a_tenant_holds_at_most_100_keys,
    every_route_refuses_a_key_without_its_scope,
);

async fn a_keys_name_and_scopes_change_at_once(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let (id, secret) = make_key(app, &tenant, &["read"]).await;
    let body = manual("Nightly", &json!([log_step("st_a", "a")]));
    app.post(&secret, "/api/automations", &body)
        .await
        .expect_error(StatusCode::FORBIDDEN, "scope_missing");

    let changed = app
        .patch(
            &tenant.key,
            &format!("/api/keys/{id}"),
            &json!({ "name": "sync", "scopes": ["write"] }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(changed["name"], "sync");
    assert_eq!(changed["scopes"], json!(["write"]));
    assert!(changed.get("key").is_none(), "no secret: {changed:#}");
    // The same secret now writes.
    app.post(&secret, "/api/automations", &body)
        .await
        .expect(StatusCode::CREATED);

    // The tenant's only admin key keeps `admin`.
    let keys = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    let first = keys["items"][0]["id"].as_str().unwrap().to_owned();
    let refused = app
        .patch(
            &tenant.key,
            &format!("/api/keys/{first}"),
            &json!({ "scopes": ["read"] }),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "last_admin_key");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("take `admin`"),
        "{refused:#}"
    );
    // With another admin key, it may.
    app.patch(
        &tenant.key,
        &format!("/api/keys/{id}"),
        &json!({ "scopes": ["admin"] }),
    )
    .await
    .expect(StatusCode::OK);
    app.patch(
        &tenant.key,
        &format!("/api/keys/{first}"),
        &json!({ "scopes": ["read"] }),
    )
    .await
    .expect(StatusCode::OK);
    app.get(&tenant.key, "/api/keys")
        .await
        .expect_error(StatusCode::FORBIDDEN, "scope_missing");

    for (body, says) in [
        (json!({ "scopes": [] }), "at least one"),
        (json!({ "scopes": ["root"] }), "`scopes[0]` is `root`"),
        (json!({ "name": "" }), "`name`"),
        (json!({ "key": "tok_x" }), "key"),
    ] {
        let refused = app
            .patch(&secret, &format!("/api/keys/{id}"), &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert!(
            refused["message"].as_str().unwrap().contains(says),
            "{body}: {refused:#}"
        );
    }
    app.patch(&secret, "/api/keys/key_missing", &json!({ "name": "x" }))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}

/// Makes a key of `tenant`'s with these scopes; returns (id, secret).
async fn make_key(app: &TestApp, tenant: &Tenant, scopes: &[&str]) -> (String, String) {
    let made = app
        .post(
            &tenant.key,
            "/api/keys",
            &json!({ "name": format!("{} key", scopes.join("+")), "scopes": scopes }),
        )
        .await
        .expect(StatusCode::CREATED);
    (
        made["id"].as_str().unwrap().to_owned(),
        made["key"].as_str().unwrap().to_owned(),
    )
}

async fn delete(app: &TestApp, key: &str, uri: &str) -> crate::helpers::Reply {
    app.request(Method::DELETE, uri, Some(key), &[], Body::empty())
        .await
}

async fn a_key_is_shown_once_and_listed_without_its_secret(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let made = app
        .post(
            &tenant.key,
            "/api/keys",
            &json!({ "name": "eshop sync", "scopes": ["read", "signal"] }),
        )
        .await
        .expect(StatusCode::CREATED);
    let secret = made["key"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("tok_"), "{made:#}");
    assert_eq!(made["name"], "eshop sync");
    assert_eq!(made["scopes"], json!(["read", "signal"]));
    assert_eq!(made["expires_at"], Value::Null);

    let list = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    let items = list["items"].as_array().unwrap();
    let names: Vec<&str> = items.iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["first key", "eshop sync"], "{list:#}");
    assert_eq!(items[0]["scopes"], json!(["admin"]));
    let text = list.to_string();
    assert!(
        !text.contains(&secret) && !text.contains(&tenant.key),
        "a listing shows no secret: {text}"
    );
    assert!(items.iter().all(|k| k.get("key").is_none()), "{list:#}");

    // The new key works, for its tenant only.
    app.get(&secret, "/api/automations")
        .await
        .expect(StatusCode::OK);
    let other = app.create_tenant("Other").await;
    let theirs = app
        .get(&other.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    assert_eq!(theirs["items"].as_array().unwrap().len(), 1, "{theirs:#}");
    delete(
        app,
        &other.key,
        &format!("/api/keys/{}", made["id"].as_str().unwrap()),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.get(&secret, "/api/automations")
        .await
        .expect(StatusCode::OK);
}

async fn a_key_outside_its_scope_is_403_naming_the_scope(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let (_, read) = make_key(app, &tenant, &["read"]).await;
    let (_, signal) = make_key(app, &tenant, &["signal"]).await;
    let (_, write) = make_key(app, &tenant, &["write"]).await;

    let refused = app
        .post(
            &read,
            "/api/automations",
            &manual("M", &json!([log_step("a", "x")])),
        )
        .await
        .expect_error(StatusCode::FORBIDDEN, "scope_missing");
    assert_eq!(refused["scope"], "write", "{refused:#}");
    assert_eq!(
        refused["message"],
        "this needs a key with the `write` scope; key `read key` has `read`"
    );
    // Nothing was saved.
    let list = app
        .get(&read, "/api/automations")
        .await
        .expect(StatusCode::OK);
    assert_eq!(list["items"], json!([]));

    // `write` grants `read` and `signal`, not `admin`; `signal` grants only itself.
    let id = app
        .create_automation(&tenant, &manual("M", &json!([log_step("a", "x")])))
        .await;
    app.get(&write, &format!("/api/automations/{id}"))
        .await
        .expect(StatusCode::OK);
    let refused = app
        .get(&write, "/api/keys")
        .await
        .expect_error(StatusCode::FORBIDDEN, "scope_missing");
    assert_eq!(refused["scope"], "admin");
    app.post(
        &signal,
        "/api/signals",
        &json!({ "key": "k", "payload": {} }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    app.post(
        &write,
        "/api/signals",
        &json!({ "key": "k", "payload": {} }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    app.post(&signal, &format!("/api/automations/{id}/runs"), &json!({}))
        .await
        .expect(StatusCode::CREATED);
    let refused = app
        .get(&signal, "/api/runs")
        .await
        .expect_error(StatusCode::FORBIDDEN, "scope_missing");
    assert_eq!(refused["scope"], "read");
    app.post(&read, "/api/signals", &json!({ "key": "k", "payload": {} }))
        .await
        .expect_error(StatusCode::FORBIDDEN, "scope_missing");
}

async fn a_revoked_key_is_refused_at_once(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let (id, secret) = make_key(app, &tenant, &["write"]).await;
    app.get(&secret, "/api/runs").await.expect(StatusCode::OK);
    let reply = delete(app, &tenant.key, &format!("/api/keys/{id}")).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{:#}", reply.body);
    app.get(&secret, "/api/runs")
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
    let list = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    assert!(
        !list.to_string().contains(&id),
        "a revoked key is not listed: {list:#}"
    );
    // Revoking it again changes nothing.
    let again = delete(app, &tenant.key, &format!("/api/keys/{id}")).await;
    assert_eq!(again.status, StatusCode::NO_CONTENT);
    delete(app, &tenant.key, "/api/keys/key_nope")
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}

async fn the_last_admin_key_stays(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let list = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    let first = list["items"][0]["id"].as_str().unwrap().to_owned();
    let refused = delete(app, &tenant.key, &format!("/api/keys/{first}"))
        .await
        .expect_error(StatusCode::CONFLICT, "last_admin_key");
    assert!(
        refused["message"].as_str().unwrap().contains(&first),
        "{refused:#}"
    );
    app.get(&tenant.key, "/api/runs")
        .await
        .expect(StatusCode::OK);

    // With a second admin key, the first one can go.
    let (_, second) = make_key(app, &tenant, &["admin"]).await;
    let reply = delete(app, &second, &format!("/api/keys/{first}")).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{:#}", reply.body);
    app.get(&tenant.key, "/api/runs")
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
    // The platform admin can still make keys for the tenant.
    let made = app
        .request(
            Method::POST,
            "/api/keys",
            Some(&app.admin_key),
            &[
                ("x-tok-tenant", tenant.id.as_str()),
                ("content-type", "application/json"),
            ],
            Body::from(json!({ "name": "rescue", "scopes": ["admin"] }).to_string()),
        )
        .await
        .expect(StatusCode::CREATED);
    app.get(made["key"].as_str().unwrap(), "/api/keys")
        .await
        .expect(StatusCode::OK);
}

async fn an_expired_key_is_refused_and_says_so(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let soon = tok_store::rfc3339::format(tok_store::now_ms() + 1500);
    let made = app
        .post(
            &tenant.key,
            "/api/keys",
            &json!({ "name": "brief", "scopes": ["read"], "expires_at": soon }),
        )
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(made["expires_at"], soon.as_str());
    assert_eq!(made["expired"], false);
    let secret = made["key"].as_str().unwrap().to_owned();
    let refused = app
        .poll("the key to expire", async || {
            let reply = app.get(&secret, "/api/runs").await;
            match reply.status {
                StatusCode::OK => Err(()),
                _ => Ok(reply.expect_error(StatusCode::UNAUTHORIZED, "key_expired")),
            }
        })
        .await;
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains(&format!("`brief` expired at {soon}")),
        "{refused:#}"
    );
    let list = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    assert_eq!(list["items"][1]["expired"], true, "{list:#}");
}

async fn bad_key_bodies_are_400_naming_the_field(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    for (body, field, says) in [
        (
            json!({ "name": "x", "scopes": ["read", "owner"] }),
            "scopes",
            "`scopes[1]` is `owner`",
        ),
        (
            json!({ "name": "x", "scopes": [] }),
            "scopes",
            "at least one of",
        ),
        (
            json!({ "name": " ", "scopes": ["read"] }),
            "name",
            "`name` must have",
        ),
        (
            json!({ "name": "x", "scopes": ["read"], "expires_at": "2001-01-01T00:00:00Z" }),
            "expires_at",
            "has passed",
        ),
        (
            json!({ "name": "x", "scopes": ["read"], "expires_at": "soon" }),
            "expires_at",
            "`expires_at`",
        ),
    ] {
        let error = app
            .post(&tenant.key, "/api/keys", &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(error["field"], field, "{body}: {error:#}");
        assert!(
            error["message"].as_str().unwrap().contains(says),
            "{body}: {error:#}"
        );
    }
    let list = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        1,
        "nothing was made"
    );
}

async fn a_keys_use_is_noted(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let (id, secret) = make_key(app, &tenant, &["read"]).await;
    let unused = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    let row = |list: &Value| {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["id"] == id.as_str())
            .cloned()
            .unwrap()
    };
    assert_eq!(row(&unused)["last_used_at"], Value::Null);
    app.get(&secret, "/api/runs").await.expect(StatusCode::OK);
    let used = app
        .poll("the key's last use", async || {
            let list = app
                .get(&tenant.key, "/api/keys")
                .await
                .expect(StatusCode::OK);
            let key = row(&list);
            if key["last_used_at"].is_null() {
                Err(())
            } else {
                Ok(key)
            }
        })
        .await;
    assert!(
        used["last_used_at"].as_str().unwrap().ends_with('Z'),
        "{used:#}"
    );
}

async fn a_tenant_holds_at_most_100_keys(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let mut last = String::new();
    // The first key and 99 more.
    for _ in 1..tok_store::MAX_KEYS_PER_TENANT {
        last = make_key(app, &tenant, &["read"]).await.0;
    }
    let refused = app
        .post(
            &tenant.key,
            "/api/keys",
            &json!({ "name": "one more", "scopes": ["read"] }),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "conflict");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("holds 100 keys"),
        "{refused:#}"
    );
    let reply = delete(app, &tenant.key, &format!("/api/keys/{last}")).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    make_key(app, &tenant, &["read"]).await;
}

/// Every route of the router, with a key that lacks the scope it declares:
/// refused before anything is read (403 `scope_missing` naming the scope,
/// or `admin_only` for the platform's routes); and with a key that has it,
/// not refused. A route without a key of its own (`Public`, `OwnSecret`)
/// answers without one.
async fn every_route_refuses_a_key_without_its_scope(app: &TestApp) {
    app.state.set_ready();
    let tenant = app.create_tenant("Acme").await;
    let mut keys = std::collections::HashMap::new();
    for scope in ["read", "write", "signal", "admin"] {
        keys.insert(scope, make_key(app, &tenant, &[scope]).await.1);
    }
    // A key that does not grant the scope, for each scope.
    let lacking = |scope: Scope| match scope {
        Scope::Read => &keys["signal"],
        Scope::Write | Scope::Signal => &keys["read"],
        Scope::Admin => &keys["write"],
    };
    let json = [("content-type", "application/json")];
    let routes = tok_server::route_table();
    assert!(
        routes
            .iter()
            .any(|r| r.access == Access::Tenant(Scope::Signal)),
        "the table declares scopes"
    );
    for route in &routes {
        let uri = route.path.replace('{', "x_").replace('}', "");
        let send = async |key: Option<&str>| {
            app.request(route.method.clone(), &uri, key, &json, Body::from("{}"))
                .await
        };
        match route.access {
            Access::Tenant(scope) => {
                let refused = send(Some(lacking(scope)))
                    .await
                    .expect_error(StatusCode::FORBIDDEN, "scope_missing");
                assert_eq!(refused["scope"], scope.as_str(), "{route}: {refused:#}");
                send(None)
                    .await
                    .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
                // The live stream never ends; the others answer.
                if route.path != "/api/stream" {
                    let granted = send(Some(&keys[scope.as_str()])).await;
                    assert!(
                        !matches!(
                            granted.status,
                            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                        ),
                        "{route} refuses a key with `{}`: {:#}",
                        scope.as_str(),
                        granted.body
                    );
                }
            }
            Access::Platform => {
                send(Some(&keys["admin"]))
                    .await
                    .expect_error(StatusCode::FORBIDDEN, "admin_only");
            }
            Access::Public | Access::OwnSecret => {
                let reply = send(None).await;
                assert!(
                    !matches!(reply.status, StatusCode::FORBIDDEN)
                        && (reply.status != StatusCode::UNAUTHORIZED || route.path == "/metrics"),
                    "{route} wants a key it does not declare: {:?}",
                    reply.status
                );
            }
        }
    }
}
