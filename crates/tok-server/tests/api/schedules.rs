//! Poll and schedule triggers through the API: a bad cron expression, an
//! unknown time zone or a poll interval under 10 s is refused at save with
//! the place and what is expected; a saved one shows when it is due next
//! (`next_run_at`), and a poll automation gets runs with trigger `poll` and
//! `_event.scheduledAt` from the engine's own scheduler.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, log_step};

backend_tests!(
    crate::helpers::run;
    bad_schedules_are_refused_at_save,
    saved_schedules_show_when_they_are_due_next,
    a_poll_automation_gets_poll_runs,
);

fn scheduled(trigger: Value) -> Value {
    json!({ "name": "scheduled", "trigger": trigger, "steps": [log_step("st_log", "tick")] })
}

async fn bad_schedules_are_refused_at_save(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    for (trigger, path, message) in [
        (
            json!({"kind": "schedule", "cron": "0 8 * *"}),
            "trigger.cron",
            "cron `0 8 * *` has 4 fields; expected 5 (minute hour day month weekday) or 6 (with seconds first)",
        ),
        (
            json!({"kind": "schedule", "cron": "0 8 * * 1-5", "timezone": "Europe/Praha"}),
            "trigger.timezone",
            "`Europe/Praha` is not a known time zone; use an IANA name like `Europe/Prague` or `UTC`",
        ),
        (
            json!({"kind": "poll", "intervalSec": 5}),
            "trigger.intervalSec",
            "the poll interval is 5 s; the minimum is 10 s",
        ),
    ] {
        let reply = app
            .post(&tenant.key, "/api/automations", &scheduled(trigger))
            .await;
        let error = reply.expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
        assert_eq!(
            error["errors"],
            json!([{ "path": path, "message": message }]),
            "{error:#}"
        );
    }
    let reply = app
        .post(
            &tenant.key,
            "/api/automations",
            &scheduled(json!({"kind": "schedule", "cron": "0 61 * * *"})),
        )
        .await;
    let error = reply.expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    assert_eq!(error["errors"][0]["path"], "trigger.cron", "{error:#}");
}

async fn saved_schedules_show_when_they_are_due_next(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let before = tok_store::now_ms();
    let cron = app
        .create_automation(
            &tenant,
            &scheduled(
                json!({"kind": "schedule", "cron": "0 8 1 1 *", "timezone": "Europe/Prague"}),
            ),
        )
        .await;
    let shown = app
        .get(&tenant.key, &format!("/api/automations/{cron}"))
        .await
        .expect(StatusCode::OK);
    let next = crate::helpers::ms(&shown["next_run_at"]).expect("next_run_at, RFC 3339");
    let expected = tok_core::schedule::CronSchedule::parse("0 8 1 1 *", Some("Europe/Prague"))
        .unwrap()
        .next_after(before)
        .unwrap();
    assert_eq!(next, expected, "08:00 Prague time next New Year's Day");

    // Saved as a manual automation: nothing is due any more.
    app.put(
        &tenant.key,
        &format!("/api/automations/{cron}"),
        &scheduled(json!({"kind": "manual"})),
    )
    .await
    .expect(StatusCode::OK);
    let shown = app
        .get(&tenant.key, &format!("/api/automations/{cron}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(shown["next_run_at"], Value::Null, "{shown:#}");
}

async fn a_poll_automation_gets_poll_runs(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let before = tok_store::now_ms();
    let poll = app
        .create_automation(
            &tenant,
            &scheduled(json!({"kind": "poll", "service": "mail"})),
        )
        .await;
    let runs = app
        .wait_for_runs(&tenant, &format!("automation={poll}"), 1)
        .await;
    assert_eq!(runs[0]["trigger_type"], "poll", "{:#}", runs[0]);
    let run = app
        .get(
            &tenant.key,
            &format!("/api/runs/{}", runs[0]["id"].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(run["status"], "completed", "{run:#}");
    let scheduled_at: jiff::Timestamp = run["context"]["_event"]["scheduledAt"]
        .as_str()
        .expect("scheduledAt")
        .parse()
        .unwrap();
    assert!(scheduled_at.as_millisecond() >= before - 1000, "{run:#}");
    let shown = app
        .get(&tenant.key, &format!("/api/automations/{poll}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        crate::helpers::ms(&shown["next_run_at"]),
        Some(scheduled_at.as_millisecond() + 60_000),
        "mail polls every 60 s by default: {shown:#}"
    );
}
