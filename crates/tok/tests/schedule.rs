//! The scheduler across real processes: two `tok serve` on one PostgreSQL
//! with a cron every 2 s. Over ten seconds each tick has exactly one run,
//! whichever node fired it; the node holding the wake is killed with
//! SIGKILL, and the other keeps firing within one lease (3 s here, set by
//! `TOK_SCHEDULER_LEASE`).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::Row as _;
use tok_store::testing::{TestDb, backends};
use tok_store::{Backend, PgStore};

use support::{ADMIN_KEY, Api, Server, free_port};

const LEASE_MS: i64 = 3_000;

/// Every run of the tenant by its tick (`_event.scheduledAt`, Unix ms) →
/// how many runs that tick has, and when the first was created.
async fn runs_by_tick(api: &Api, key: &str) -> BTreeMap<i64, (usize, i64)> {
    let mut ticks = BTreeMap::new();
    for run in api.all("/api/dashboard/runs", key, None).await {
        let detail: Value = api
            .get(&format!("/api/runs/{}", run["id"].as_str().unwrap()), key)
            .await;
        assert_eq!(detail["trigger_type"], "schedule", "{detail}");
        let at: jiff::Timestamp = detail["context"]["_event"]["scheduledAt"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let entry = ticks.entry(at.as_millisecond()).or_insert((0, i64::MAX));
        entry.0 += 1;
        let created: jiff::Timestamp = detail["created_at"]
            .as_str()
            .expect("created_at, RFC 3339")
            .parse()
            .unwrap();
        entry.1 = entry.1.min(created.as_millisecond());
    }
    ticks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_fire_each_tick_once_and_the_survivor_takes_over() {
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let db = TestDb::create(Backend::Postgres).await;
    let ports = [free_port(), free_port()];
    let start = |i: usize| {
        let node = format!("schedule-node-{i}");
        Server::start(
            &db.url,
            ports[i],
            &[],
            &[
                ("TOK_NODE_ID", node.as_str()),
                ("TOK_SCHEDULER_LEASE", "3s"),
                ("TOK_SCHEDULER_TICK", "500ms"),
            ],
        )
    };
    let mut servers = vec![start(0)];
    let api = Api::new(ports[0]);
    api.wait_ready().await;
    servers.push(start(1));
    Api::new(ports[1]).wait_ready().await;

    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": "Every two seconds",
            "trigger": { "kind": "schedule", "cron": "*/2 * * * * *" },
            "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "tick" } }]
        }),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;

    // Each tick of the ten seconds: one run, and no tick left out.
    let ticks = runs_by_tick(&api, &key).await;
    assert!(ticks.len() >= 4, "ticks fired: {ticks:?}");
    assert!(ticks.values().all(|(n, _)| *n == 1), "{ticks:?}");
    let at: Vec<i64> = ticks.keys().copied().collect();
    assert!(at.windows(2).all(|w| w[1] - w[0] == 2_000), "{at:?}");

    // Kill the node that holds the wake.
    let pg = PgStore::connect(&db.url, 2).await.unwrap();
    let holder: String = sqlx::query("SELECT holder FROM scheduler_lease")
        .fetch_one(pg.pool())
        .await
        .unwrap()
        .get("holder");
    let dead = if holder == "schedule-node-0" { 0 } else { 1 };
    let survivor = Api::new(ports[1 - dead]);
    servers[dead].kill();
    let killed_at = tok_store::now_ms();
    tokio::time::sleep(Duration::from_secs(8)).await;

    let ticks = runs_by_tick(&survivor, &key).await;
    assert!(ticks.values().all(|(n, _)| *n == 1), "{ticks:?}");
    let after: Vec<(i64, i64)> = ticks
        .iter()
        .filter(|(_, (_, created))| *created > killed_at)
        .map(|(at, (_, created))| (*at, *created))
        .collect();
    let first = after.first().expect("the survivor fired after the kill");
    assert!(
        first.1 - killed_at <= LEASE_MS + 2_000,
        "the survivor fired {} ms after the kill; the lease is {LEASE_MS} ms",
        first.1 - killed_at
    );
    // Its first run stands for the ticks missed meanwhile (one catch-up
    // run); from then on it fires every tick again.
    assert!(after.len() >= 3, "{after:?}");
    assert!(
        after[1..].windows(2).all(|w| w[1].0 - w[0].0 == 2_000),
        "{after:?}"
    );
    drop(pg);
    drop(servers);
    db.cleanup().await;
}
