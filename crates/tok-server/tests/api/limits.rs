//! Start limits (`settings.limits.startsPerMinute`), as a user sees them:
//! a limit of 0 is refused at save; a manual start over the limit answers
//! 429 `start_rate_exceeded` with `Retry-After`, and starts nothing; an
//! event over it creates a `refused` run (no step runs, its error says
//! `start_rate_exceeded`), listed with the other runs and opening no
//! incident; a child run over it is refused too, and its waiting parent's
//! step fails with `child_failed`.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, log_step, manual, on_webhook, plain_source};

backend_tests!(crate::helpers::run;
    a_start_limit_of_zero_is_refused_at_save,
    a_manual_start_over_the_limit_answers_429_with_retry_after,
    an_event_over_the_limit_creates_a_refused_run,
    a_child_over_its_limit_is_refused_and_fails_the_parent_waiting_for_it,
);

fn limited(mut definition: Value, per_minute: u32) -> Value {
    definition["settings"] = json!({ "limits": { "startsPerMinute": per_minute } });
    definition
}

async fn a_start_limit_of_zero_is_refused_at_save(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let definition = limited(manual("Report", &json!([log_step("st_log", "hi")])), 0);
    let error = app
        .post(&tenant.key, "/api/automations", &definition)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    assert_eq!(
        error["errors"][0]["path"], "settings.limits.startsPerMinute",
        "{error:#}"
    );
}

async fn a_manual_start_over_the_limit_answers_429_with_retry_after(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let definition = limited(manual("Report", &json!([log_step("st_log", "hi")])), 2);
    let automation = app.create_automation(&tenant, &definition).await;
    let uri = format!("/api/automations/{automation}/runs");
    for _ in 0..2 {
        app.post(&tenant.key, &uri, &json!({ "input": {} }))
            .await
            .expect(StatusCode::CREATED);
    }
    let reply = app.post(&tenant.key, &uri, &json!({ "input": {} })).await;
    let retry_after: u64 = reply
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a Retry-After header in seconds: {:?}", reply.headers));
    assert!(
        (1..=60).contains(&retry_after),
        "a start frees up within the minute: {retry_after}"
    );
    let error = reply.expect_error(StatusCode::TOO_MANY_REQUESTS, "start_rate_exceeded");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("2 runs per minute"),
        "{error:#}"
    );
    let runs = app
        .get(&tenant.key, &format!("/api/runs?automation={automation}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        runs["items"].as_array().unwrap().len(),
        2,
        "the refused start left no run: {runs:#}"
    );
}

async fn an_event_over_the_limit_creates_a_refused_run(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let (source_id, token) = (
        source["id"].as_str().unwrap(),
        source["token"].as_str().unwrap(),
    );
    let definition = limited(
        on_webhook("Orders", source_id, &json!([log_step("st_log", "order")])),
        1,
    );
    let automation = app.create_automation(&tenant, &definition).await;
    for n in 0..2 {
        app.webhook(token, &json!({ "n": n }))
            .await
            .expect(StatusCode::ACCEPTED);
    }
    let runs = app
        .wait_for_runs(&tenant, &format!("automation={automation}"), 2)
        .await;
    let mut statuses: Vec<&str> = runs.iter().map(|r| r["status"].as_str().unwrap()).collect();
    statuses.sort();
    assert_eq!(statuses, ["completed", "refused"], "{runs:#?}");

    let refused = app
        .get(&tenant.key, "/api/runs?status=refused")
        .await
        .expect(StatusCode::OK);
    let items = refused["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{refused:#}");
    let error = items[0]["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("start_rate_exceeded"), "{refused:#}");
    let id = items[0]["id"].as_str().unwrap();
    let detail = app
        .get(&tenant.key, &format!("/api/runs/{id}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(detail["steps"], json!([]), "no step ran: {detail:#}");
    let incidents = app
        .get(&tenant.key, "/api/incidents")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        incidents["items"],
        json!([]),
        "a refused start opens no incident"
    );
}

async fn a_child_over_its_limit_is_refused_and_fails_the_parent_waiting_for_it(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let child = limited(manual("Child", &json!([log_step("st_log", "child")])), 1);
    let child = app.create_automation(&tenant, &child).await;
    let parent = manual(
        "Parent",
        &json!([{ "id": "st_child", "type": "run_workflow",
                  "config": { "automation": child, "input": {} } }]),
    );
    let parent = app.create_automation(&tenant, &parent).await;
    let first = app
        .start_run(&tenant, &parent, &json!({ "input": {} }))
        .await;
    let first = app.wait_for_final(&tenant, &first).await;
    assert_eq!(first["status"], "completed", "{first:#}");

    let second = app
        .start_run(&tenant, &parent, &json!({ "input": {} }))
        .await;
    let second = app.wait_for_final(&tenant, &second).await;
    assert_eq!(second["status"], "failed", "{second:#}");
    let error = second["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("child_failed") && error.contains("start_rate_exceeded"),
        "{second:#}"
    );
    let refused = app
        .get(
            &tenant.key,
            &format!("/api/runs?status=refused&automation={child}"),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(refused["items"].as_array().unwrap().len(), 1, "{refused:#}");
}
