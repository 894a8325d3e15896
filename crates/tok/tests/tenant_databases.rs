//! `db_for(tenant)` across real processes: `tok serve` on a shared
//! PostgreSQL database with one tenant (by name) on a database of its own
//! (`TOK_TENANT_DATABASES`). Its runs complete on its database, the other
//! tenants' on the shared one. Then a tenant with a run waiting for a
//! signal moves, as docs/operations.md says: the server stops, `tok tenant
//! move` copies its rows, the server starts routed anew, and the signal sent
//! after the move completes the waiting run on the new database; `tok
//! tenant forget` then clears what the move left behind.
//!
//! And a tenant database that does not answer, behind a TCP proxy that
//! refuses every connection: the server starts and is ready, the other
//! tenants work, that tenant's calls and webhooks are 503
//! `tenant_database_unavailable` with `Retry-After`, the failures are
//! counted per database on `/metrics`, and once the database answers it is
//! migrated and its tenant's work goes on there.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use tok_store::testing::{TestDb, backends};
use tok_store::{Backend, PgStore};

use proxy::{Mode, Proxy};
use support::{ADMIN_KEY, Api, Server, free_port};

struct Tenant {
    id: String,
    key: String,
    automation: String,
}

/// A tenant named `name` with a manual automation: wait for the signal
/// `go-{{n}}` when `waits`, then log.
async fn tenant(api: &Api, name: &str, waits: bool) -> Tenant {
    let made = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": name }))
        .await;
    let key = made["api_key"].as_str().unwrap().to_owned();
    let mut steps = vec![];
    if waits {
        steps.push(
            json!({ "id": "st_wait", "type": "wait_for_event", "config": { "key": "go-{{n}}" } }),
        );
    }
    steps
        .push(json!({ "id": "st_log", "type": "flow/log", "config": { "message": "done {{n}}" } }));
    let automation = api
        .post(
            "/api/automations",
            &key,
            json!({ "name": "Work", "trigger": { "kind": "manual" }, "steps": steps }),
        )
        .await;
    Tenant {
        id: made["id"].as_str().unwrap().to_owned(),
        key,
        automation: automation["id"].as_str().unwrap().to_owned(),
    }
}

async fn start(api: &Api, tenant: &Tenant, n: u32) -> String {
    let started = api
        .post(
            &format!("/api/automations/{}/runs", tenant.automation),
            &tenant.key,
            json!({ "input": { "n": n } }),
        )
        .await;
    started["run_id"].as_str().unwrap().to_owned()
}

/// Polls the run until its status is `status`; panics after 30 s.
async fn reaches(api: &Api, tenant: &Tenant, run: &str, status: &str) -> Value {
    let mut detail = Value::Null;
    for _ in 0..300 {
        detail = api.get(&format!("/api/runs/{run}"), &tenant.key).await;
        if detail["status"] == status {
            return detail;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run {run} did not become {status}: {detail:#}");
}

/// The statuses of the tenant's runs in one database, by run id.
async fn runs_in(db: &PgStore, tenant: &Tenant) -> Vec<(String, String)> {
    sqlx::query_as("SELECT id, status FROM runs WHERE tenant_id = $1 ORDER BY id")
        .bind(&tenant.id)
        .fetch_all(db.pool())
        .await
        .unwrap()
}

fn tok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tok"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tok");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tok {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_runs_on_its_own_database_and_a_moved_tenants_waiting_run_completes_there() {
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let shared = TestDb::create(Backend::Postgres).await;
    let own = TestDb::create(Backend::Postgres).await;
    let port = free_port();
    let routes = format!("Own={}", own.url);
    let mut server = Server::start(
        &shared.url,
        port,
        &[],
        &[("TOK_TENANT_DATABASES", routes.as_str())],
    );
    let api = Api::new(port);
    api.wait_ready().await;

    let on_own = tenant(&api, "Own", false).await;
    let stays = tenant(&api, "Stays", false).await;
    let mover = tenant(&api, "Mover", true).await;
    let mut own_runs = Vec::new();
    let mut shared_runs = Vec::new();
    for n in 0..3 {
        own_runs.push(start(&api, &on_own, n).await);
        shared_runs.push(start(&api, &stays, n).await);
    }
    for run in &own_runs {
        reaches(&api, &on_own, run, "completed").await;
    }
    for run in &shared_runs {
        reaches(&api, &stays, run, "completed").await;
    }
    let waiting = start(&api, &mover, 7).await;
    reaches(&api, &mover, &waiting, "waiting").await;

    // Each tenant's runs are rows of its own database only.
    let shared_pg = PgStore::connect(&shared.url, 2).await.unwrap();
    let own_pg = PgStore::connect(&own.url, 2).await.unwrap();
    let completed = |runs: &[String]| -> Vec<(String, String)> {
        let mut rows: Vec<_> = runs
            .iter()
            .map(|r| (r.clone(), "completed".to_owned()))
            .collect();
        rows.sort();
        rows
    };
    assert_eq!(runs_in(&own_pg, &on_own).await, completed(&own_runs));
    assert_eq!(runs_in(&shared_pg, &on_own).await, vec![]);
    assert_eq!(runs_in(&shared_pg, &stays).await, completed(&shared_runs));
    assert_eq!(runs_in(&own_pg, &stays).await, vec![]);
    assert_eq!(
        runs_in(&shared_pg, &mover).await,
        vec![(waiting.clone(), "waiting".to_owned())]
    );

    // The move: stop, copy, switch, resume.
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(40)).is_some());
    let report = tok(&[
        "tenant",
        "move",
        &mover.id,
        "--from",
        &shared.url,
        "--to",
        &own.url,
    ]);
    assert!(report.contains("  runs: 1\n"), "{report}");
    let routes = format!("Own={};{}={}", own.url, mover.id, own.url);
    let server = Server::start(
        &shared.url,
        port,
        &[],
        &[("TOK_TENANT_DATABASES", routes.as_str())],
    );
    api.wait_ready().await;

    let sent = api
        .post(
            "/api/signals",
            &mover.key,
            json!({ "key": "go-7", "payload": {} }),
        )
        .await;
    assert_eq!(sent["resumed"].as_array().map(Vec::len), Some(1), "{sent}");
    let done = reaches(&api, &mover, &waiting, "completed").await;
    assert!(done["steps"].to_string().contains("done 7"), "{done}");
    let after = start(&api, &mover, 8).await;
    reaches(&api, &mover, &after, "waiting").await;
    api.post(
        "/api/signals",
        &mover.key,
        json!({ "key": "go-8", "payload": {} }),
    )
    .await;
    reaches(&api, &mover, &after, "completed").await;
    assert_eq!(
        runs_in(&own_pg, &mover).await,
        completed(&[waiting.clone(), after.clone()])
    );
    // The shared database kept the old copy, untouched, until it is forgotten.
    assert_eq!(
        runs_in(&shared_pg, &mover).await,
        vec![(waiting.clone(), "waiting".to_owned())]
    );
    tok(&["tenant", "forget", &mover.id, "--database", &shared.url]);
    assert_eq!(runs_in(&shared_pg, &mover).await, vec![]);
    // Its API key still answers (the keys stay shared).
    api.get(&format!("/api/runs/{waiting}"), &mover.key).await;

    drop(server);
    drop((shared_pg, own_pg));
    shared.cleanup().await;
    own.cleanup().await;
}

/// `tok migrate` with `env`: its exit status and stderr.
fn migrate_with(env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tok"))
        .arg("migrate")
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tok");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_malformed_tenant_database_entry_stops_the_start_saying_where() {
    let pg = ("TOK_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
    let (ok, err) = migrate_with(&[pg, ("TOK_TENANT_DATABASES", "a=postgres://x/a;acme")]);
    assert!(!ok);
    assert!(
        err.contains("TOK_TENANT_DATABASES: entry 2 `acme` has no `=`"),
        "{err}"
    );
    let (ok, err) = migrate_with(&[
        ("TOK_DATABASE_URL", "sqlite://tok-data/never.db"),
        ("TOK_TENANT_DATABASES", "acme=postgres://x/a"),
    ]);
    assert!(!ok);
    assert!(
        err.contains("TOK_DATABASE_URL must then be postgres"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("tok-tenant-dbs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tenants.json");
    std::fs::write(&file, r#"{ "acme": "mysql://x/a" }"#).unwrap();
    let (ok, err) = migrate_with(&[pg, ("TOK_TENANT_DATABASES_FILE", file.to_str().unwrap())]);
    assert!(!ok);
    assert!(
        err.contains("tenants.json: `acme`: the database of `acme` is `mysql://x/a`; expected a postgres://… URL"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The answer to a webhook of `source_url` and its `Retry-After`.
async fn webhook(api: &Api, source_url: &str, key: &str) -> (u16, Option<String>, Value) {
    let response = api
        .http
        .post(source_url)
        .header("Idempotency-Key", key)
        .json(&json!({ "kind": "order.created", "data": { "order": key } }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry, response.json().await.unwrap_or(Value::Null))
}

/// A webhook source and an automation that logs what it got.
async fn webhook_source(api: &Api, tenant: &Tenant) -> String {
    let source = api
        .post("/api/sources", &tenant.key, json!({ "name": "shop" }))
        .await;
    api.post(
        "/api/automations",
        &tenant.key,
        json!({
            "name": "Hook",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "got {{data.order}}" } }]
        }),
    )
    .await;
    source["url"].as_str().unwrap().to_owned()
}

/// The sum of `tok_database_errors_total` for `database` on `/metrics`.
async fn database_errors(api: &Api, database: &str) -> f64 {
    let text = api
        .http
        .get(format!("{}/metrics", api.base))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let label = format!("database=\"{database}\"");
    text.lines()
        .filter(|l| l.starts_with("tok_database_errors_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls until the webhook is answered 202; its event.
async fn accepted_once_back(api: &Api, source_url: &str, key: &str) -> Value {
    for _ in 0..300 {
        let (status, _, body) = webhook(api, source_url, key).await;
        if status == 202 {
            return body;
        }
        assert_eq!(status, 503, "while its database comes back: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the tenant's webhook was not accepted within 30 s of its database answering");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_database_that_does_not_answer_stops_only_its_tenant_and_is_taken_back_when_it_does()
 {
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let shared = TestDb::create(Backend::Postgres).await;
    let own = TestDb::create(Backend::Postgres).await;
    let mut own_url = reqwest::Url::parse(&own.url).unwrap();
    let upstream = own_url.port().unwrap_or(5432);
    let proxy = Proxy::start_in(upstream, Mode::Refusing).await;
    own_url.set_port(Some(proxy.port)).unwrap();
    let routes = format!("Apart={own_url}");
    let port = free_port();
    // The tenant database refuses from the start: the server starts anyway.
    let server = Server::start(
        &shared.url,
        port,
        &[],
        &[("TOK_TENANT_DATABASES", routes.as_str())],
    );
    let api = Api::new(port);
    api.wait_ready().await;
    let (healthz, _) = api
        .call(reqwest::Method::GET, "/healthz", "", None, None)
        .await;
    assert_eq!(healthz.as_u16(), 200);

    let stays = tenant(&api, "Stays", false).await;
    let run = start(&api, &stays, 1).await;
    reaches(&api, &stays, &run, "completed").await;

    // The tenant whose database refuses: made (tenants are the shared
    // database's), but its own calls are answered 503 with when to try again.
    let made = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Apart" }))
        .await;
    let apart_key = made["api_key"].as_str().unwrap().to_owned();
    let (status, body) = api
        .call(
            reqwest::Method::GET,
            "/api/automations",
            &apart_key,
            None,
            None,
        )
        .await;
    assert_eq!(status.as_u16(), 503, "{body}");
    assert_eq!(
        body["error"]["code"], "tenant_database_unavailable",
        "{body}"
    );
    let response = api
        .http
        .get(format!("{}/api/runs", api.base))
        .bearer_auth(&apart_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("2"),
        "a 503 of a tenant database away says when to try again"
    );
    // Readiness follows the shared database only; the failures are counted
    // under the database's name.
    api.wait_ready().await;
    assert!(database_errors(&api, "Apart").await >= 1.0);
    let other = start(&api, &stays, 2).await;
    reaches(&api, &stays, &other, "completed").await;

    // It answers: migrated, and the tenant works there.
    proxy.set(Mode::Flowing);
    let mut automations = Value::Null;
    for _ in 0..300 {
        let (status, body) = api
            .call(
                reqwest::Method::GET,
                "/api/automations",
                &apart_key,
                None,
                None,
            )
            .await;
        if status.as_u16() == 200 {
            automations = body;
            break;
        }
        assert_eq!(status.as_u16(), 503, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        automations.is_object(),
        "the tenant's calls did not come back within 30 s"
    );
    let apart = Tenant {
        id: made["id"].as_str().unwrap().to_owned(),
        key: apart_key.clone(),
        automation: String::new(),
    };
    let apart_hook = webhook_source(&api, &apart).await;
    let stays_hook = webhook_source(&api, &stays).await;
    let (status, _, event) = webhook(&api, &apart_hook, "before").await;
    assert_eq!(status, 202, "{event}");
    let own_pg = PgStore::connect(&own.url, 2).await.unwrap();
    let shared_pg = PgStore::connect(&shared.url, 2).await.unwrap();

    // Down again under its webhooks: 503 with Retry-After, nothing stored,
    // while the other tenant's webhooks are accepted and run.
    proxy.set(Mode::Refusing);
    let mut refused = None;
    for _ in 0..100 {
        let (status, retry, body) = webhook(&api, &apart_hook, "while-away").await;
        if status == 503 {
            refused = Some((retry, body));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (retry, body) = refused.expect("a webhook of a tenant whose database refuses is a 503");
    assert_eq!(
        body["error"]["code"], "tenant_database_unavailable",
        "{body}"
    );
    assert_eq!(retry.as_deref(), Some("2"));
    let (status, _, body) = webhook(&api, &stays_hook, "while-apart-away").await;
    assert_eq!(status, 202, "the other tenant's webhook: {body}");

    proxy.set(Mode::Flowing);
    accepted_once_back(&api, &apart_hook, "while-away").await;
    let apart_runs = |db: &PgStore| {
        let pool = db.pool().clone();
        let id = apart.id.clone();
        async move {
            let rows: Vec<(String,)> =
                sqlx::query_as("SELECT status FROM runs WHERE tenant_id = $1")
                    .bind(&id)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            rows
        }
    };
    let mut statuses = Vec::new();
    for _ in 0..300 {
        statuses = apart_runs(&own_pg).await;
        if statuses.len() == 2 && statuses.iter().all(|(s,)| s == "completed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        statuses,
        vec![("completed".to_owned(),), ("completed".to_owned(),)],
        "the tenant's two webhooks, one from before its database went away and \
         one refused while it was away and sent again, each ran once on its database"
    );
    assert!(apart_runs(&shared_pg).await.is_empty());
    assert_eq!(
        runs_in(&shared_pg, &stays).await.len(),
        3,
        "the other tenant's two manual runs and the run of its webhook sent while the tenant \
         database was away"
    );

    drop(server);
    drop((own_pg, shared_pg, proxy));
    shared.cleanup().await;
    own.cleanup().await;
}
