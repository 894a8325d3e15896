//! An automation's own guardrails and a run's progress, as a user sees
//! them: `settings.limits.maxSteps`, `maxActions` and `maxStateBytes` below
//! the platform's (above it, or 0, the save is refused naming the key); a
//! run whose context would pass `maxStateBytes` fails at that step with
//! `state_too_large`, one past `maxActions` with `action_limit_exceeded`;
//! `settings.pruneStateAfter` keeps only the latest steps' outputs in the
//! context while their step rows keep them whole; and `progress` counts a
//! run's steps up, against a total where the tree fixes it.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, manual};

backend_tests!(crate::helpers::run;
    limits_above_the_platforms_or_below_the_tree_are_refused_at_save,
    a_context_past_max_state_bytes_fails_its_step_with_state_too_large,
    a_run_past_its_max_actions_fails_before_the_next_step,
    prune_state_after_keeps_the_latest_outputs_and_the_step_rows_keep_all,
    progress_counts_up_to_the_total_the_tree_fixes,
);

fn with_settings(mut definition: Value, settings: Value) -> Value {
    definition["settings"] = settings;
    definition
}

fn set(id: &str, values: Value) -> Value {
    json!({ "id": id, "type": "set", "config": { "values": values } })
}

fn steps_of<'a>(run: &'a Value, id: &str) -> Vec<&'a Value> {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == id)
        .collect()
}

async fn limits_above_the_platforms_or_below_the_tree_are_refused_at_save(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let two = json!([set("st_a", json!({"a": 1})), set("st_b", json!({"b": 2}))]);
    for (limits, path, words) in [
        (
            json!({ "maxActions": 5000 }),
            "settings.limits.maxActions",
            "at most 1000",
        ),
        (
            json!({ "maxStateBytes": 0 }),
            "settings.limits.maxStateBytes",
            "at least 1",
        ),
        (
            json!({ "maxSteps": 51 }),
            "settings.limits.maxSteps",
            "at most 50",
        ),
        (json!({ "maxSteps": 1 }), "steps", "maxSteps` allows 1"),
    ] {
        let definition = with_settings(manual("Guarded", &two), json!({ "limits": limits }));
        let error = app
            .post(&tenant.key, "/api/automations", &definition)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
        let found = error["errors"].as_array().unwrap().iter().any(|e| {
            e["path"] == path && e["message"].as_str().unwrap_or_default().contains(words)
        });
        assert!(found, "{limits}: {error:#}");
    }
    let definition = with_settings(
        manual("Guarded", &two),
        json!({ "limits": { "maxSteps": 2, "maxActions": 10, "maxStateBytes": 10000 },
                "pruneStateAfter": 1 }),
    );
    app.create_automation(&tenant, &definition).await;
}

async fn a_context_past_max_state_bytes_fails_its_step_with_state_too_large(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let big = "x".repeat(3000);
    let definition = with_settings(
        manual(
            "Big",
            &json!([
                set("st_small", json!({"note": "fits"})),
                set("st_big", json!({"blob": big})),
                set("st_after", json!({"after": true}))
            ]),
        ),
        json!({ "limits": { "maxStateBytes": 2000 } }),
    );
    let automation = app.create_automation(&tenant, &definition).await;
    let run = app.start_run(&tenant, &automation, &json!({})).await;
    let run = app.wait_for_final(&tenant, &run).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    let error = run["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("state_too_large") && error.contains("st_big") && error.contains("2000"),
        "the error names the limit and the step: {run:#}"
    );
    assert_eq!(steps_of(&run, "st_small")[0]["status"], "completed");
    assert_eq!(steps_of(&run, "st_big")[0]["status"], "failed", "{run:#}");
    assert!(steps_of(&run, "st_after").is_empty(), "{run:#}");
    assert!(
        run["context"].get("st_big").is_none(),
        "the outputs that did not fit are not in the context: {run:#}"
    );
}

async fn a_run_past_its_max_actions_fails_before_the_next_step(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let steps: Vec<Value> = (1..=5)
        .map(|i| set(&format!("st_{i}"), json!({ format!("v{i}"): i })))
        .collect();
    let definition = with_settings(
        manual("Many", &json!(steps)),
        json!({ "limits": { "maxActions": 3 } }),
    );
    let automation = app.create_automation(&tenant, &definition).await;
    let run = app.start_run(&tenant, &automation, &json!({})).await;
    let run = app.wait_for_final(&tenant, &run).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    let error = run["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("action_limit_exceeded")
            && error.contains("st_4")
            && error.contains("maxActions"),
        "{run:#}"
    );
    assert_eq!(steps_of(&run, "st_3").len(), 1, "{run:#}");
    assert!(steps_of(&run, "st_4").is_empty(), "{run:#}");
}

async fn prune_state_after_keeps_the_latest_outputs_and_the_step_rows_keep_all(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let long = "y".repeat(2000);
    let definition = with_settings(
        manual(
            "Pruned",
            &json!([
                set("st_1", json!({"first": long})),
                set("st_2", json!({"second": 2})),
                set("st_3", json!({"third": "{{st_2.second}}"}))
            ]),
        ),
        json!({ "pruneStateAfter": 2 }),
    );
    let automation = app.create_automation(&tenant, &definition).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": { "order": 7 } }))
        .await;
    let run = app.wait_for_final(&tenant, &run).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    let context = &run["context"];
    assert!(
        context.get("st_1").is_none() && context.get("first").is_none(),
        "the oldest step's outputs left the context: {context:#}"
    );
    assert_eq!(context["st_2"]["second"], 2, "{context:#}");
    assert_eq!(context["st_3"]["third"], 2, "{context:#}");
    assert_eq!(
        context["order"], 7,
        "the trigger's params stay: {context:#}"
    );
    assert_eq!(
        steps_of(&run, "st_1")[0]["output"]["first"],
        json!(long),
        "the step row keeps the pruned output whole: {run:#}"
    );
}

async fn progress_counts_up_to_the_total_the_tree_fixes(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let straight = manual(
        "Straight",
        &json!([set("st_a", json!({"a": 1})),
                { "id": "st_wait", "type": "wait_for_event", "config": { "key": "go" } },
                set("st_b", json!({"b": 2}))]),
    );
    let automation = app.create_automation(&tenant, &straight).await;
    let run = app.start_run(&tenant, &automation, &json!({})).await;
    let waiting = app
        .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    assert_eq!(
        waiting["progress"],
        json!({ "done": 2, "total": 3 }),
        "the waiting step counts as begun: {waiting:#}"
    );
    let listed = app
        .get(&tenant.key, "/api/runs")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        listed["items"][0]["progress"],
        json!({ "done": 2, "total": 3 })
    );
    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": "go", "payload": {} }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(
        done["progress"],
        json!({ "done": 3, "total": 3 }),
        "{done:#}"
    );

    // A tree that decides at run time has no total; its count goes on.
    let branching = manual(
        "Branching",
        &json!([set("st_a", json!({"a": 1})),
                { "id": "st_if", "type": "condition", "match": "all",
                  "rules": [{ "field": "st_a.a", "operator": "eq", "value": 1 }],
                  "then": [set("st_t", json!({"t": 1})), set("st_u", json!({"u": 1}))] }]),
    );
    let automation = app.create_automation(&tenant, &branching).await;
    let run = app.start_run(&tenant, &automation, &json!({})).await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["progress"], json!({ "done": 4 }), "{done:#}");
}
