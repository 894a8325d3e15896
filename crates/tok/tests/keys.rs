//! API keys across real processes: a key revoked through one `tok serve`
//! is refused by another on the same PostgreSQL database at its very next
//! request (keys are looked up on every request, never cached); the
//! platform admin key changes only by `tok admin-key rotate`, never by a
//! start with another `TOK_ADMIN_KEY`, so a node of a fleet restarted with
//! an old one brings nothing back; each change is a row of the platform's
//! audit log.

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

/// `tok admin-key rotate` on the database `url`, with `env`; its stdout
/// after asserting it succeeded.
fn rotate(url: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tok"))
        .args(["admin-key", "rotate"])
        .args(args)
        .env("TOK_DATABASE_URL", url)
        .env_remove("TOK_ADMIN_KEY")
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tok admin-key rotate");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "tok admin-key rotate failed: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The key `tok admin-key rotate` printed once.
fn printed_key(out: &str) -> String {
    out.lines()
        .find(|l| l.contains("shown once"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no new key in: {out}"))
        .trim()
        .to_owned()
}

async fn status(port: u16, key: &str) -> StatusCode {
    Api::new(port)
        .call(Method::GET, "/api/tenants", key, None, None)
        .await
        .0
}

tok_store::backend_tests!(tok_store::testing::run_on_fresh_db;
    a_start_never_rotates_the_admin_key_and_the_rotate_command_does,
);

/// The admin key changes only by `tok admin-key rotate`: a start with
/// another `TOK_ADMIN_KEY` (a new one, or one rotated out) changes nothing
/// and says so at error level; the command revokes the key before at once
/// and never takes a rotated-out key back; each change is a row of the
/// platform's audit log, naming no secret.
async fn a_start_never_rotates_the_admin_key_and_the_rotate_command_does(db: &TestDb) {
    // The first start without TOK_ADMIN_KEY prints a generated key.
    let port = free_port();
    let mut first = Server::start(&db.url, port, &[], &[("TOK_ADMIN_KEY", "")]);
    let (line, _) = first.line_where(|l| l.contains("Generated the platform admin key"));
    let generated = line.rsplit(' ').next().unwrap().trim().to_owned();
    Api::new(port).wait_ready().await;
    assert_eq!(status(port, &generated).await, StatusCode::OK);
    first.kill();

    // A start with another value changes nothing, and says so.
    let port = free_port();
    let mut second = Server::start(&db.url, port, &[], &[("TOK_ADMIN_KEY", "tok-admin-one")]);
    let (said, _) =
        second.line_where(|l| l.contains("TOK_ADMIN_KEY is not the platform admin key"));
    assert!(said.contains("ERROR"), "{said}");
    assert!(said.contains("tok admin-key rotate --from-env"), "{said}");
    assert!(
        !said.contains("tok-admin-one"),
        "no secret in the log: {said}"
    );
    Api::new(port).wait_ready().await;
    assert_eq!(status(port, &generated).await, StatusCode::OK);
    assert_eq!(
        status(port, "tok-admin-one").await,
        StatusCode::UNAUTHORIZED
    );
    second.kill();

    // The command makes it the admin key; the one before is refused.
    let out = rotate(
        &db.url,
        &["--from-env"],
        &[("TOK_ADMIN_KEY", "tok-admin-one")],
    );
    assert!(
        out.contains("1 admin key(s) before it are refused"),
        "{out}"
    );
    assert!(!out.contains("tok-admin-one"), "{out}");
    let again = rotate(
        &db.url,
        &["--from-env"],
        &[("TOK_ADMIN_KEY", "tok-admin-one")],
    );
    assert!(again.contains("nothing changed"), "{again}");
    // Without --from-env it makes a key and shows it once.
    let out = rotate(&db.url, &[], &[]);
    let newest = printed_key(&out);
    assert!(newest.starts_with("tok_admin_"), "{out}");

    // A node restarted with the key before (a fleet's stale configuration)
    // brings nothing back and revokes nothing.
    let port = free_port();
    let stale = Server::start(&db.url, port, &[], &[("TOK_ADMIN_KEY", "tok-admin-one")]);
    let (said, _) = stale.line_where(|l| l.contains("TOK_ADMIN_KEY is not the platform admin key"));
    assert!(said.contains("rotated out at"), "{said}");
    Api::new(port).wait_ready().await;
    assert_eq!(status(port, &newest).await, StatusCode::OK);
    for old in ["tok-admin-one", generated.as_str()] {
        assert_eq!(status(port, old).await, StatusCode::UNAUTHORIZED, "{old}");
    }

    // Each change is a row of the platform's own audit log, naming no
    // secret.
    let log = Api::new(port).get("/api/audit", &newest).await;
    let rows: Vec<(&str, &str, &str)> = log["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["actor"]["kind"].as_str().unwrap(),
                // The command, as in "`tok serve` run by … on …".
                r["actor"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .split('`')
                    .nth(1)
                    .unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("key.rotated", "platform", "tok admin-key rotate"),
            ("key.rotated", "platform", "tok admin-key rotate"),
            ("key.created", "platform", "tok serve"),
        ],
        "{log:#}"
    );
    let text = log.to_string();
    for secret in [generated.as_str(), "tok-admin-one", newest.as_str()] {
        assert!(!text.contains(secret), "{text}");
    }
    drop(stale);
}

/// Two nodes on one PostgreSQL: the admin key rotated while node A runs is
/// refused by A at once, and node B, started afterwards with the old
/// `TOK_ADMIN_KEY`, neither brings the old key back nor revokes the new.
#[tokio::test]
async fn a_node_started_with_an_old_admin_key_keeps_the_fleets_new_one() {
    if tok_store::testing::skip_postgres() {
        eprintln!("TOK_TEST_SKIP_POSTGRES=1: the two-node admin key test is NOT run");
        return;
    }
    let db = TestDb::create(Backend::Postgres).await;
    let (port_a, port_b) = (free_port(), free_port());
    let _a = Server::start(&db.url, port_a, &[], &[("TOK_NODE_ID", "node-a")]);
    Api::new(port_a).wait_ready().await;
    assert_eq!(status(port_a, ADMIN_KEY).await, StatusCode::OK);

    let newest = printed_key(&rotate(&db.url, &[], &[]));
    assert_eq!(status(port_a, ADMIN_KEY).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status(port_a, &newest).await, StatusCode::OK);

    // Node B starts with the fleet's old configuration (ADMIN_KEY).
    let b = Server::start(&db.url, port_b, &[], &[("TOK_NODE_ID", "node-b")]);
    let (said, _) = b.line_where(|l| l.contains("TOK_ADMIN_KEY is not the platform admin key"));
    assert!(said.contains("rotated out at"), "{said}");
    Api::new(port_b).wait_ready().await;
    for port in [port_a, port_b] {
        assert_eq!(status(port, &newest).await, StatusCode::OK, "node {port}");
        assert_eq!(
            status(port, ADMIN_KEY).await,
            StatusCode::UNAUTHORIZED,
            "node {port}"
        );
    }
    drop(b);
    db.cleanup().await;
}
