//! One process serves a SQLite file: a second `tok serve` on the same file
//! refuses to start (it would release the first one's claims and run their
//! steps again) and says why; once the first is gone, even by SIGKILL, a
//! new one starts.

mod support;

use std::process::{Command, Stdio};

use tok_store::Backend;
use tok_store::testing::TestDb;

use support::{ADMIN_KEY, Api, Server, free_port};

/// Runs a second `tok serve` on `url` to its end: its exit status and stderr.
fn second_server(url: &str) -> (std::process::ExitStatus, String) {
    let port = free_port();
    let output = Command::new(env!("CARGO_BIN_EXE_tok"))
        .arg("serve")
        .env("TOK_DATABASE_URL", url)
        .env("TOK_LISTEN", format!("127.0.0.1:{port}"))
        .env("TOK_PUBLIC_URL", format!("http://localhost:{port}/"))
        .env("TOK_ADMIN_KEY", ADMIN_KEY)
        // The same node id as the first: nothing else tells them apart.
        .env("TOK_NODE_ID", "tok-test-node")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run a second tok serve");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_second_server_on_one_sqlite_file_refuses_to_start() {
    let db = TestDb::create(Backend::Sqlite).await;
    let port = free_port();
    let mut first = Server::start(&db.url, port, &[], &[]);
    Api::new(port).wait_ready().await;

    let (status, stderr) = second_server(&db.url);
    assert!(!status.success(), "the second server started: {stderr}");
    assert!(
        stderr.contains("another tok process already serves the SQLite database"),
        "{stderr}"
    );
    assert!(stderr.contains("use PostgreSQL"), "{stderr}");
    let api = Api::new(port);
    let still = api.http.get(format!("{}/readyz", api.base)).send().await;
    assert!(
        still.is_ok_and(|r| r.status().is_success()),
        "the first server still serves"
    );

    // The lock ends with its process, however it ends.
    first.kill();
    let port = free_port();
    let _again = Server::start(&db.url, port, &[], &[]);
    Api::new(port).wait_ready().await;
    db.cleanup().await;
}
