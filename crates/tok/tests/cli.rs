//! The command-line client against a real `tok serve`: `tok apply` creates
//! an automation, leaves an identical one alone and saves a changed one as
//! version 2 saying what changed; applies a directory of every kind of
//! object (secrets from the environment, references by name), changing
//! nothing the second time, only the field that changed the third,
//! moving a connection to another origin with its credentials given again,
//! and deleting with `--prune` what the directory no longer holds; `tok runs` prints the runs' table and
//! filters it; `tok signal` resumes a waiting run; and with no server, or a
//! key the server refuses, the client says so and exits non-zero.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};

/// `tok ARGS` as a client of `url` with `key`.
fn tok(url: &str, key: &str, args: &[&str]) -> Output {
    tok_with(url, key, args, &[])
}

/// `tok ARGS` with these environment variables.
fn tok_with(url: &str, key: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tok"))
        .args(args)
        .envs(env.iter().copied())
        .env("TOK_URL", url)
        .env("TOK_API_KEY", key)
        .env_remove("TOK_TENANT")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run tok")
}

/// Its stdout, after asserting it succeeded.
fn ok(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "tok failed ({}): stdout {stdout} stderr {stderr}",
        output.status
    );
    stdout
}

/// Its stderr, after asserting it failed.
fn failed(output: Output) -> String {
    assert!(
        !output.status.success(),
        "tok succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A server on a fresh database and a tenant's key.
async fn server(url: &str) -> (Server, Api, String) {
    let port = free_port();
    // Connections' credentials are sealed under a key of the test's.
    let (_, secret_key) = tok_store::Keyring::generate();
    let server = Server::start(url, port, &[], &[("TOK_SECRET_KEY", &secret_key)]);
    let api = Api::new(port);
    api.wait_ready().await;
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Cli" }))
        .await;
    (server, api, tenant["api_key"].as_str().unwrap().to_owned())
}

fn write(dir: &Path, name: &str, definition: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(definition).unwrap()).unwrap();
    path.to_string_lossy().into_owned()
}

fn greeting(message: &str) -> Value {
    json!({
        "name": "Greeting",
        "trigger": { "kind": "manual" },
        "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": message } }]
    })
}

/// Polls `GET /api/runs/{id}` until the run is in `status`.
async fn until_status(api: &Api, key: &str, run: &str, status: &str) {
    for _ in 0..600 {
        if api.get(&format!("/api/runs/{run}"), key).await["status"] == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {run} did not become {status} within 30 s");
}

// On both backends: "unchanged" compares the file with the definition as
// each database gives it back.
tok_store::backend_tests!(run_on_fresh_db;
    apply_creates_then_leaves_an_identical_definition_and_saves_a_changed_one_as_version_2,
    apply_a_directory_creates_then_changes_only_what_changed_and_prunes,
);

async fn apply_creates_then_leaves_an_identical_definition_and_saves_a_changed_one_as_version_2(
    db: &TestDb,
) {
    let (_server, api, key) = server(&db.url).await;
    let dir = std::env::temp_dir().join(format!("tok-cli-{}", tok_store::random_token()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = write(&dir, "greeting.json", &greeting("hello"));

    let created = ok(tok(&api.base, &key, &["apply", "-f", &first]));
    assert!(
        created.starts_with("created automation Greeting (") && created.contains("version 1"),
        "{created}"
    );
    let again = ok(tok(&api.base, &key, &["apply", "-f", &first]));
    assert!(
        again.contains("Greeting") && again.contains("unchanged, version 1"),
        "{again}"
    );

    let mut changed = greeting("hello again");
    changed["settings"] = json!({ "retry": { "max_attempts": 2, "backoff": ["7s"] } });
    let second = write(&dir, "greeting2.json", &changed);
    let saved = ok(tok(&api.base, &key, &["apply", "-f", &second]));
    assert!(saved.contains("new version 2 (was 1)"), "{saved}");
    assert!(saved.contains("~ steps: changed st_log"), "{saved}");
    assert!(
        saved.contains("+ settings: ") && saved.contains("max_attempts"),
        "{saved}"
    );
    assert!(
        !saved.contains("trigger"),
        "the trigger did not change: {saved}"
    );

    let listed = api.get("/api/automations", &key).await;
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "one automation, by name: {listed}");
    assert_eq!(items[0]["version"], 2);

    // A definition the server refuses: its code and message are shown.
    let mut broken = greeting("x");
    broken["steps"][0]["type"] = json!("no/such-step");
    let broken = write(&dir, "broken.json", &broken);
    let refused = failed(tok(&api.base, &key, &["apply", "-f", &broken]));
    assert!(refused.contains("invalid_definition"), "{refused}");
    assert!(refused.contains("no/such-step"), "{refused}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory of one object of every kind, the automation naming the
/// others by name.
fn setup_dir(dir: &Path) {
    write(
        dir,
        "sources.json",
        &json!({ "kind": "source", "name": "eshop", "rate_limit": 5,
                 "params": [{ "name": "orderId", "path": "order.id", "type": "string" }],
                 "secret": { "env": "ESHOP_SECRET" } }),
    );
    std::fs::create_dir_all(dir.join("desk")).unwrap();
    write(
        dir,
        "desk/connection.json",
        &json!({ "kind": "connection", "name": "invoicing", "service": "http",
                 "base_url": "http://127.0.0.1:9", "rate": 5,
                 "credentials": { "bearer": { "env": "INVOICING_TOKEN" } } }),
    );
    write(
        dir,
        "desk/more.json",
        &json!([
            { "kind": "group", "name": "warehouse",
              "members": [{ "name": "Eva", "capacity": 3 }, { "name": "Jan" }] },
            { "kind": "ticket_type", "name": "order", "statuses": ["new", "shipped"] },
            { "kind": "widget", "name": "open invoices", "connection": "invoicing",
              "request": { "url": "/invoices" }, "ttlSec": 60 }
        ]),
    );
    write(
        dir,
        "orders.json",
        &json!({
            "name": "Orders",
            "trigger": { "kind": "webhook", "source": "eshop" },
            "steps": [
                { "id": "st_ticket", "type": "ticket/upsert",
                  "config": { "externalId": "{{orderId}}", "type": "order" } },
                { "id": "st_bill", "type": "http",
                  "config": { "connection": "invoicing", "method": "POST", "url": "/invoices" } }
            ]
        }),
    );
    write(dir, "nightly.json", &greeting("nightly"));
}

async fn apply_a_directory_creates_then_changes_only_what_changed_and_prunes(db: &TestDb) {
    let (_server, api, key) = server(&db.url).await;
    let dir = std::env::temp_dir().join(format!("tok-apply-{}", tok_store::random_token()));
    std::fs::create_dir_all(&dir).unwrap();
    setup_dir(&dir);
    let path = dir.to_string_lossy().into_owned();
    let secrets = [
        ("ESHOP_SECRET", "whsec_c2VjcmV0LW9mLXRoZS1lc2hvcC0xMjM0"),
        ("INVOICING_TOKEN", "sk_live_from_the_environment"),
    ];
    let apply = |args: &[&str]| {
        let mut all = vec!["apply", "-f", path.as_str()];
        all.extend_from_slice(args);
        tok_with(&api.base, &key, &all, &secrets)
    };

    // Without its secret in the environment, nothing is sent.
    let refused = failed(tok(&api.base, &key, &["apply", "-f", &path]));
    assert!(
        refused.contains("INVOICING_TOKEN, which is not set")
            && refused.contains("desk/connection.json"),
        "{refused}"
    );

    let planned = ok(apply(&["--dry-run"]));
    assert!(planned.contains("would create source eshop"), "{planned}");
    assert!(
        planned.contains("plan: 7 to create, 0 to change"),
        "{planned}"
    );
    let listed = api.get("/api/sources", &key).await;
    assert_eq!(listed["items"], json!([]), "a dry run saves nothing");

    let created = ok(apply(&[]));
    for line in [
        "created source eshop (",
        "created connection invoicing (",
        "created group warehouse (",
        "created ticket_type order (",
        "created widget open invoices (",
        "created automation Orders (",
        "created automation Greeting (",
        "7 created, 0 changed, 0 unchanged",
    ] {
        assert!(created.contains(line), "`{line}` in {created}");
    }
    // The trigger names the source by its id; the source is signed.
    let sources = api.get("/api/sources", &key).await;
    let source = &sources["items"][0];
    assert_eq!(source["signed"], true, "{sources:#}");
    let automations = api.get("/api/automations", &key).await;
    let orders = automations["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "Orders")
        .unwrap();
    assert_eq!(orders["definition"]["trigger"]["source"], source["id"]);
    let connections = api.get("/api/connections", &key).await;
    assert_eq!(connections["items"][0]["has_credentials"], true);

    let audited = api.get("/api/audit?limit=500", &key).await["items"].clone();
    assert!(
        !audited.as_array().unwrap().is_empty(),
        "the creates are audited"
    );
    let again = ok(apply(&[]));
    assert_eq!(
        api.get("/api/audit?limit=500", &key).await["items"],
        audited,
        "an unchanged apply writes no audit row"
    );
    assert!(
        again.contains("0 created, 0 changed, 7 unchanged"),
        "applying the same directory again changes nothing: {again}"
    );
    assert!(
        again.contains("source eshop (") && again.contains(") unchanged"),
        "{again}"
    );

    // One field changed: only that object is sent, saying what changed.
    let mut changed: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("sources.json")).unwrap()).unwrap();
    changed["rate_limit"] = json!(10);
    write(&dir, "sources.json", &changed);
    let third = ok(apply(&[]));
    assert!(third.contains("changed source eshop ("), "{third}");
    assert!(third.contains("~ rate_limit: 5 → 10"), "{third}");
    assert!(
        third.contains("0 created, 1 changed, 6 unchanged"),
        "{third}"
    );
    let source = api
        .get(
            &format!("/api/sources/{}", source["id"].as_str().unwrap()),
            &key,
        )
        .await;
    assert_eq!(source["rate_limit"], 10);

    // A connection's limit and a group's members changed the same way.
    write(
        &dir,
        "desk/connection.json",
        &json!({ "kind": "connection", "name": "invoicing", "service": "http",
                 "base_url": "http://127.0.0.1:9", "rate": 2,
                 "credentials": { "bearer": { "env": "INVOICING_TOKEN" } } }),
    );
    let mut more: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("desk/more.json")).unwrap())
            .unwrap();
    more[0]["members"] = json!([{ "name": "Eva", "capacity": 3 }, { "name": "Ota" }]);
    write(&dir, "desk/more.json", &more);
    let fourth = ok(apply(&[]));
    assert!(
        fourth.contains("changed connection invoicing ("),
        "{fourth}"
    );
    assert!(fourth.contains("~ rate: 5.0 → 2"), "{fourth}");
    assert!(fourth.contains("changed group warehouse ("), "{fourth}");
    assert!(
        fourth.contains("0 created, 2 changed, 5 unchanged"),
        "{fourth}"
    );
    let groups = api.get("/api/groups", &key).await;
    let members: Vec<&str> = groups["items"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(members, ["Eva", "Ota"], "{groups:#}");
    let connections = api.get("/api/connections", &key).await;
    assert_eq!(connections["items"][0]["rate"], 2.0);

    // The connection moved to another origin by a key without `admin`:
    // apply gives the file's credentials again in the same change.
    let writer = api
        .post(
            "/api/keys",
            &key,
            json!({ "name": "deploy", "scopes": ["write"] }),
        )
        .await["key"]
        .as_str()
        .unwrap()
        .to_owned();
    write(
        &dir,
        "desk/connection.json",
        &json!({ "kind": "connection", "name": "invoicing", "service": "http",
                 "base_url": "http://127.0.0.2:9", "rate": 2,
                 "credentials": { "bearer": { "env": "INVOICING_TOKEN" } } }),
    );
    let moved = ok(tok_with(
        &api.base,
        &writer,
        &["apply", "-f", &path],
        &secrets,
    ));
    assert!(
        moved.contains("changed connection invoicing (")
            && moved.contains("0 created, 1 changed, 6 unchanged"),
        "{moved}"
    );
    let connections = api.get("/api/connections", &key).await;
    assert_eq!(connections["items"][0]["base_url"], "http://127.0.0.2:9");
    assert_eq!(connections["items"][0]["has_credentials"], true);

    // Files removed: --prune deletes what they held, after a dry run that
    // only says so.
    std::fs::remove_file(dir.join("nightly.json")).unwrap();
    more.as_array_mut().unwrap().pop();
    write(&dir, "desk/more.json", &more);
    let planned = ok(apply(&["--prune", "--dry-run"]));
    assert!(
        planned.contains("would delete automation Greeting ("),
        "{planned}"
    );
    assert!(
        planned.contains("would delete widget open invoices ("),
        "{planned}"
    );
    let pruned = ok(apply(&["--prune"]));
    assert!(pruned.contains("deleted automation Greeting ("), "{pruned}");
    assert!(
        pruned.contains("deleted widget open invoices ("),
        "{pruned}"
    );
    assert!(pruned.contains("5 unchanged, 2 deleted"), "{pruned}");
    let widgets = api.get("/api/widgets", &key).await;
    assert_eq!(widgets["items"], json!([]), "{widgets:#}");
    let automations = api.get("/api/automations", &key).await;
    let names: Vec<&str> = automations["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Orders"], "{automations:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn runs_prints_the_table_and_filters_it_and_signal_resumes_a_waiting_run() {
    run_on_fresh_db(Backend::Sqlite, async |db| {
        let (_server, api, key) = server(&db.url).await;
        let greeting = api.post("/api/automations", &key, greeting("hi")).await;
        let greeting = greeting["id"].as_str().unwrap().to_owned();
        let payment = api
            .post(
                "/api/automations",
                &key,
                json!({
                    "name": "Payment",
                    "trigger": { "kind": "manual" },
                    "steps": [
                        { "id": "st_paid", "type": "wait_for_event", "config": { "key": "order-7" } },
                        { "id": "st_log", "type": "flow/log", "config": { "message": "paid {{st_paid.payload.amount}}" } }
                    ]
                }),
            )
            .await;
        let payment = payment["id"].as_str().unwrap().to_owned();
        let done = api
            .post(&format!("/api/automations/{greeting}/runs"), &key, json!({}))
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let waiting = api
            .post(&format!("/api/automations/{payment}/runs"), &key, json!({}))
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        until_status(&api, &key, &done, "completed").await;
        until_status(&api, &key, &waiting, "waiting").await;

        let table = ok(tok(&api.base, &key, &["runs"]));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("RUN") && lines[0].contains("STATUS"), "{table}");
        let line_of = |run: &str| {
            lines
                .iter()
                .find(|l| l.starts_with(run))
                .unwrap_or_else(|| panic!("no line for {run}: {table}"))
                .to_string()
        };
        assert!(line_of(&done).contains("Greeting") && line_of(&done).contains("completed"));
        assert!(line_of(&waiting).contains("Payment") && line_of(&waiting).contains("waiting"));

        let only_waiting = ok(tok(&api.base, &key, &["runs", "--status", "waiting"]));
        assert!(only_waiting.contains(&waiting) && !only_waiting.contains(&done), "{only_waiting}");
        let by_name = ok(tok(&api.base, &key, &["runs", "--automation", "Greeting"]));
        assert!(by_name.contains(&done) && !by_name.contains(&waiting), "{by_name}");
        let by_id = ok(tok(&api.base, &key, &["runs", "--automation", &payment]));
        assert!(by_id.contains(&waiting) && !by_id.contains(&done), "{by_id}");
        let none = ok(tok(&api.base, &key, &["runs", "--status", "failed"]));
        assert_eq!(none.trim(), "no runs");
        let bad = failed(tok(&api.base, &key, &["runs", "--status", "broken"]));
        assert!(bad.contains("bad_query") && bad.contains("`broken`"), "{bad}");

        let sent = ok(tok(
            &api.base,
            &key,
            &["signal", "order-7", "--payload", r#"{"amount": 42}"#],
        ));
        assert!(sent.contains(&format!("resumed 1 run(s): {waiting}")), "{sent}");
        until_status(&api, &key, &waiting, "completed").await;
        let nobody = ok(tok(&api.base, &key, &["signal", "order-8"]));
        assert!(nobody.contains("no run waits for it"), "{nobody}");
        let not_json = failed(tok(&api.base, &key, &["signal", "order-9", "--payload", "{nope"]));
        assert!(not_json.contains("--payload is not JSON"), "{not_json}");
        let no_ticket = failed(tok(&api.base, &key, &["signal", "order-9", "--subject", "tk_none"]));
        assert!(
            no_ticket.contains("unknown_subject") && no_ticket.contains("\"tk_none\""),
            "{no_ticket}"
        );
    })
    .await;
}

#[tokio::test]
async fn runs_follow_prints_a_run_as_it_changes() {
    run_on_fresh_db(Backend::Sqlite, async |db| {
        let (_server, api, key) = server(&db.url).await;
        let greeting = api.post("/api/automations", &key, greeting("hi")).await;
        let greeting = greeting["id"].as_str().unwrap().to_owned();
        let mut follow = Command::new(env!("CARGO_BIN_EXE_tok"))
            .args(["runs", "--follow"])
            .env("TOK_URL", &api.base)
            .env("TOK_API_KEY", &key)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start tok runs --follow");
        let (send, lines) = channel();
        let stdout = follow.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let header = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a header");
        assert!(header.starts_with("RUN"), "{header}");
        // The stream is open once the server counts it; a run started
        // before could be missed, so start runs until one is printed.
        let mut started = Vec::new();
        let mut seen = Vec::new();
        'wait: for _ in 0..60 {
            let run = api
                .post(
                    &format!("/api/automations/{greeting}/runs"),
                    &key,
                    json!({}),
                )
                .await["run_id"]
                .as_str()
                .unwrap()
                .to_owned();
            started.push(run);
            while let Ok(line) = lines.recv_timeout(Duration::from_millis(500)) {
                seen.push(line.clone());
                if line.contains("completed")
                    && started.iter().any(|r| line.starts_with(r.as_str()))
                {
                    break 'wait;
                }
            }
        }
        let _ = follow.kill();
        let _ = follow.wait();
        assert!(
            seen.iter()
                .any(|l| l.contains("completed") && l.contains("Greeting")),
            "no completed line for {started:?}: {seen:#?}"
        );
    })
    .await;
}

#[tokio::test]
async fn without_a_server_or_with_a_refused_key_the_client_says_so_and_fails() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [
        &["runs"][..],
        &["signal", "k"],
        &["apply", "-f", "/nonexistent.json"],
    ] {
        let said = failed(tok(&url, "some-key", args));
        if args[0] == "apply" {
            assert!(said.contains("could not read /nonexistent.json"), "{said}");
        } else {
            assert!(
                said.contains(&format!("no tok server at {url}")),
                "{args:?}: {said}"
            );
            assert!(said.contains("Connection refused"), "{said}");
        }
    }
    run_on_fresh_db(Backend::Sqlite, async |db| {
        let (_server, api, _key) = server(&db.url).await;
        let said = failed(tok(&api.base, "not-a-key", &["runs"]));
        assert!(said.contains("refused the API key (401"), "{said}");
        assert!(said.contains("TOK_API_KEY"), "{said}");
    })
    .await;
}
