//! `repeat`, as a user drives it: the `do` steps run again until `until`
//! holds, each iteration's steps with their own paths (`0.do.<n>.<i>`) in
//! the run's detail and the count in the repeat's output; a repeat whose
//! condition still asks for more at `maxIterations` fails the run with
//! `repeat_limit_exceeded`; `every` parks the run between iterations.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, log_step, manual};

backend_tests!(crate::helpers::run;
    a_repeat_runs_until_its_condition_holds,
    a_repeat_that_never_ends_stops_at_its_limit,
    a_repeat_with_every_waits_between_iterations,
);

/// Counts iterations in `st_count.n` until it reaches `until` (or forever).
fn counting(until: i64, max: i64, every: Option<&str>) -> Value {
    let mut config = json!({
        "until": { "rules": [{ "field": "st_count.n", "operator": "gte", "value": until }] },
        "maxIterations": max
    });
    if let Some(every) = every {
        config["every"] = json!(every);
    }
    manual(
        "Count",
        &json!([
            { "id": "st_repeat", "type": "repeat", "config": config, "do": [
                { "id": "st_count", "type": "set", "config": { "values": { "n": "{{index}}" } } }
            ] },
            log_step("st_log", "done after {{st_repeat.iterations}}")
        ]),
    )
}

fn paths_of<'a>(run: &'a Value, id: &str) -> Vec<&'a str> {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == id)
        .map(|s| s["path"].as_str().unwrap())
        .collect()
}

async fn a_repeat_runs_until_its_condition_holds(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app.create_automation(&tenant, &counting(2, 10, None)).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(
        paths_of(&done, "st_count"),
        ["0.do.0.0", "0.do.1.0", "0.do.2.0"]
    );
    let repeat = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step_id"] == "st_repeat")
        .expect("the repeat's record");
    assert_eq!(repeat["output"], json!({ "iterations": 3 }));
    let log = done["steps"].as_array().unwrap().last().unwrap()["log"][0].clone();
    assert_eq!(log, "info: done after 3");
}

async fn a_repeat_that_never_ends_stops_at_its_limit(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app.create_automation(&tenant, &counting(99, 3, None)).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let failed = app.wait_for_final(&tenant, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("repeat_limit_exceeded"), "{error}");
    assert_eq!(paths_of(&failed, "st_count").len(), 3);

    let bad = app
        .post(
            &tenant.key,
            "/api/automations",
            &manual(
                "Forever",
                &json!([{ "id": "r", "type": "repeat", "config": {},
                "do": [log_step("x", "x")] }]),
            ),
        )
        .await;
    let error = bad.expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    assert!(error.to_string().contains("until"), "{error}");
}

async fn a_repeat_with_every_waits_between_iterations(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(&tenant, &counting(1, 5, Some("1h")))
        .await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;
    let waiting = app
        .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    assert_eq!(paths_of(&waiting, "st_count"), ["0.do.0.0"], "{waiting:#}");
}
