//! API keys across real processes: a key revoked through one `tok serve`
//! is refused by another on the same PostgreSQL database at its very next
//! request (keys are looked up on every request, never cached), and a
//! start with a new `TOK_ADMIN_KEY` revokes the admin key before it and
//! the one generated at the first start, each change a row of the
//! platform's audit log.

mod support;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tok_store::Backend;
use tok_store::testing::TestDb;

use support::{ADMIN_KEY, Api, Server, free_port};

#[tokio::test]
async fn a_key_revoked_on_one_process_is_refused_by_another_at_once() {
    let db = TestDb::create(Backend::Postgres).await;
    let (port_a, port_b) = (free_port(), free_port());
    let _a = Server::start(&db.url, port_a, &[], &[("TOK_NODE_ID", "node-a")]);
    let _b = Server::start(&db.url, port_b, &[], &[("TOK_NODE_ID", "node-b")]);
    let (a, b) = (Api::new(port_a), Api::new(port_b));
    a.wait_ready().await;
    b.wait_ready().await;

    let tenant = a
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
        .await;
    let admin = tenant["api_key"].as_str().unwrap().to_owned();
    let made = a
        .post(
            "/api/keys",
            &admin,
            json!({ "name": "ci deploy", "scopes": ["write"] }),
        )
        .await;
    let (id, key) = (made["id"].as_str().unwrap(), made["key"].as_str().unwrap());
    b.get("/api/automations", key).await;
    let (status, _) = b.call(Method::GET, "/api/keys", key, None, None).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "`write` does not grant `admin`"
    );

    let (status, body) = a
        .call(
            Method::DELETE,
            &format!("/api/keys/{id}"),
            &admin,
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    // The next request on the other process, with no wait.
    let (status, body) = b
        .call(Method::GET, "/api/automations", key, None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");
    b.get("/api/automations", &admin).await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_start_with_a_new_admin_key_revokes_the_ones_before() {
    let db = TestDb::create(Backend::Sqlite).await;
    let status = async |port: u16, key: &str| {
        Api::new(port)
            .call(Method::GET, "/api/tenants", key, None, None)
            .await
            .0
    };

    // The first start without TOK_ADMIN_KEY prints a generated key.
    let port = free_port();
    let mut first = Server::start(&db.url, port, &[], &[("TOK_ADMIN_KEY", "")]);
    let (line, _) = first.line_where(|l| l.contains("Generated the platform admin key"));
    let generated = line.rsplit(' ').next().unwrap().trim().to_owned();
    Api::new(port).wait_ready().await;
    assert_eq!(status(port, &generated).await, StatusCode::OK);
    first.kill();

    let port = free_port();
    let mut second = Server::start(&db.url, port, &[], &[("TOK_ADMIN_KEY", "tok-admin-one")]);
    Api::new(port).wait_ready().await;
    assert_eq!(status(port, "tok-admin-one").await, StatusCode::OK);
    assert_eq!(status(port, &generated).await, StatusCode::UNAUTHORIZED);
    second.kill();

    let port = free_port();
    let third = Server::start(&db.url, port, &[], &[("TOK_ADMIN_KEY", "tok-admin-two")]);
    Api::new(port).wait_ready().await;
    assert_eq!(status(port, "tok-admin-two").await, StatusCode::OK);
    assert_eq!(
        status(port, "tok-admin-one").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(status(port, &generated).await, StatusCode::UNAUTHORIZED);
    // Each change is a row of the platform's own audit log, naming no
    // secret.
    let log = Api::new(port).get("/api/audit", "tok-admin-two").await;
    let rows: Vec<(&str, &str)> = log["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["actor"]["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("key.rotated", "platform"),
            ("key.rotated", "platform"),
            ("key.created", "platform")
        ],
        "{log:#}"
    );
    assert!(
        log["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["tenant_id"].is_null())
    );
    let text = log.to_string();
    for secret in [generated.as_str(), "tok-admin-one", "tok-admin-two"] {
        assert!(!text.contains(secret), "{text}");
    }
    drop(third);
    db.cleanup().await;
}
