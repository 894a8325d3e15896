//! Versions and waiting runs: a run keeps the version it started with
//! while it waits, however many new versions are saved meanwhile, and
//! finishes on it; every version shows its own definition hash.

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, backend_tests, log_step, manual};

backend_tests!(crate::helpers::run;
    a_run_waiting_across_two_new_versions_finishes_on_its_own,
);

async fn a_run_waiting_across_two_new_versions_finishes_on_its_own(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let version = |n: u32| {
        manual(
            "Orders",
            &json!([
                { "id": "st_paid", "type": "wait_for_event", "config": { "key": "order:paid" } },
                log_step("st_done", &format!("version {n}"))
            ]),
        )
    };
    let id = app.create_automation(&tenant, &version(1)).await;
    let run = app.start_run(&tenant, &id, &json!({ "input": {} })).await;
    app.wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    for n in [2, 3] {
        let saved = app
            .put(&tenant.key, &format!("/api/automations/{id}"), &version(n))
            .await
            .expect(StatusCode::OK);
        assert_eq!(saved["version"], n, "{saved:#}");
    }
    let mut hashes = Vec::new();
    for n in 1..=3 {
        let shown = app
            .get(&tenant.key, &format!("/api/automations/{id}/versions/{n}"))
            .await
            .expect(StatusCode::OK);
        let hash = shown["hash"].as_str().expect("a hash").to_owned();
        assert!(!hash.is_empty(), "{shown:#}");
        hashes.push(hash);
    }
    hashes.sort();
    hashes.dedup();
    assert_eq!(hashes.len(), 3, "each version has its own hash");

    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": "order:paid", "payload": {} }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["version"], 1, "{done:#}");
    let last = done["steps"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["step_id"], "st_done");
    assert_eq!(last["log"][0], "info: version 1", "{done:#}");

    let next = app.start_run(&tenant, &id, &json!({ "input": {} })).await;
    let waiting = app
        .wait_for_run(&tenant, &next, |r| r["status"] == "waiting")
        .await;
    assert_eq!(waiting["version"], 3, "a new run starts on the newest");
}
