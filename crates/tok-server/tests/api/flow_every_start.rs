//! Start controls (`flow`) on every way a run starts, as a user sees them:
//! a manual start passes its automation's singleton, throttle and debounce
//! like a webhook's event (answering the run it joined, for a debounce);
//! a manual run is cancelled by its `cancelOn` event; a schedule with a
//! singleton never runs two ticks at once and its runs have its
//! `flow.priority`; a child run of an automation with a start control is
//! refused when either automation is saved (a child is its parent's step,
//! never held or skipped).

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual, plain_source};

backend_tests!(crate::helpers::run;
    a_manual_start_passes_its_automations_start_control,
    a_manual_run_is_cancelled_by_its_cancel_on_event,
    a_schedule_with_a_singleton_never_overlaps_and_has_its_priority,
    a_child_run_of_an_automation_with_a_start_control_is_refused_at_save,
);

fn waiting() -> Value {
    json!([
        { "id": "st_wait", "type": "wait", "config": { "duration": "1h" } },
        log_step("st_log", "done")
    ])
}

async fn controlled_manual(
    app: &TestApp,
    tenant: &Tenant,
    name: &str,
    flow: Value,
    steps: Value,
) -> String {
    let mut definition = manual(name, &steps);
    definition["flow"] = flow;
    app.create_automation(tenant, &definition).await
}

async fn run(app: &TestApp, tenant: &Tenant, id: &str) -> Value {
    app.get(&tenant.key, &format!("/api/runs/{id}"))
        .await
        .expect(StatusCode::OK)
}

async fn a_manual_start_passes_its_automations_start_control(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let input = json!({ "input": { "account": "a-1" } });

    let singleton = json!({ "singleton": { "key": "{{account}}", "mode": "skip" } });
    let sync = controlled_manual(app, &tenant, "Sync", singleton, waiting()).await;
    let first = app.start_run(&tenant, &sync, &input).await;
    app.wait_for_run(&tenant, &first, |r| r["status"] == "waiting")
        .await;
    let mut stream = crate::isolation::open_stream(app, &tenant.key).await;
    let second = app.start_run(&tenant, &sync, &input).await;
    assert_ne!(second, first);
    // The live stream says what the start became.
    let (text, seen) = crate::isolation::read_stream(&mut stream, |text| {
        text.lines()
            .any(|line| line.contains(&second) && line.contains(r#""status":"skipped""#))
    })
    .await;
    assert!(seen, "the stream shows the skipped run: {text}");
    let skipped = run(app, &tenant, &second).await;
    assert_eq!(skipped["status"], "skipped", "{skipped:#}");
    let error = skipped["error"].as_str().unwrap();
    assert!(error.contains(&first), "names the key's run: {error}");
    // Another key runs beside it.
    let other = app
        .start_run(&tenant, &sync, &json!({ "input": { "account": "a-2" } }))
        .await;
    app.wait_for_run(&tenant, &other, |r| r["status"] == "waiting")
        .await;

    let throttle = json!({ "throttle": { "limit": 1, "period": "1h" } });
    let report = controlled_manual(
        app,
        &tenant,
        "Report",
        throttle,
        json!([log_step("st_log", "x")]),
    )
    .await;
    let once = app
        .start_run(&tenant, &report, &json!({ "input": {} }))
        .await;
    let once = app.wait_for_final(&tenant, &once).await;
    assert_eq!(once["status"], "completed", "{once:#}");
    let again = app
        .start_run(&tenant, &report, &json!({ "input": {} }))
        .await;
    let held = run(app, &tenant, &again).await;
    assert_eq!(
        (&held["status"], &held["blocked_by"]["kind"]),
        (&json!("queued"), &json!("throttle")),
        "the second start within the hour waits: {held:#}"
    );

    let debounce = json!({ "debounce": { "key": "{{account}}", "period": "1h" } });
    let digest = controlled_manual(
        app,
        &tenant,
        "Digest",
        debounce,
        json!([log_step("st_log", "{{n}}")]),
    )
    .await;
    let opened = app
        .start_run(
            &tenant,
            &digest,
            &json!({ "input": { "account": "a-1", "n": 1 } }),
        )
        .await;
    let joined = app
        .start_run(
            &tenant,
            &digest,
            &json!({ "input": { "account": "a-1", "n": 2 } }),
        )
        .await;
    assert_eq!(joined, opened, "the second start joined the open run");
    let open = run(app, &tenant, &opened).await;
    assert_eq!(open["context"]["n"], 2, "with the newer input: {open:#}");
    assert_eq!(open["blocked_by"]["kind"], "debounce", "{open:#}");
}

async fn a_manual_run_is_cancelled_by_its_cancel_on_event(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let cancellations = app
        .create_source(&tenant, &plain_source("cancellations"))
        .await;
    let flow = json!({ "cancelOn": [{ "source": cancellations["id"], "match": "_body.orderId" }] });
    let ship = controlled_manual(app, &tenant, "Ship", flow, waiting()).await;
    let kept = app
        .start_run(&tenant, &ship, &json!({ "input": { "orderId": "o-2" } }))
        .await;
    let cancelled = app
        .start_run(&tenant, &ship, &json!({ "input": { "orderId": "o-1" } }))
        .await;
    for id in [&kept, &cancelled] {
        app.wait_for_run(&tenant, id, |r| r["status"] == "waiting")
            .await;
    }
    app.webhook(
        cancellations["token"].as_str().unwrap(),
        &json!({ "orderId": "o-1" }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    let done = app.wait_for_final(&tenant, &cancelled).await;
    assert_eq!(done["status"], "cancelled", "{done:#}");
    assert!(
        done["error"].as_str().unwrap().contains("flow.cancelOn"),
        "{done:#}"
    );
    let other = run(app, &tenant, &kept).await;
    assert_eq!(other["status"], "waiting", "{other:#}");
}

async fn a_schedule_with_a_singleton_never_overlaps_and_has_its_priority(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let definition = json!({
        "name": "Every second",
        "trigger": { "kind": "schedule", "cron": "* * * * * *" },
        "flow": { "singleton": { "mode": "skip" }, "priority": 7 },
        "steps": waiting(),
    });
    let every = app.create_automation(&tenant, &definition).await;
    let runs = app
        .poll("three ticks", async || {
            let page = app
                .get(
                    &tenant.key,
                    &format!("/api/runs?automation={every}&limit=100"),
                )
                .await
                .expect(StatusCode::OK);
            let runs = page["items"].as_array().unwrap().clone();
            let skipped = runs.iter().filter(|r| r["status"] == "skipped").count();
            (skipped >= 2).then_some(runs).ok_or(())
        })
        .await;
    // Pause it: no tick after this one.
    app.post(
        &tenant.key,
        &format!("/api/automations/{every}/pause"),
        &json!({}),
    )
    .await
    .expect(StatusCode::OK);
    let unfinished: Vec<&Value> = runs
        .iter()
        .filter(|r| !crate::helpers::is_final(r) && r["status"] != "skipped")
        .collect();
    assert_eq!(unfinished.len(), 1, "one tick's run at a time: {runs:#?}");
    assert_eq!(unfinished[0]["trigger_type"], "schedule", "{runs:#?}");
    let detail = run(app, &tenant, unfinished[0]["id"].as_str().unwrap()).await;
    assert_eq!(detail["priority"], 7, "{detail:#}");
}

async fn a_child_run_of_an_automation_with_a_start_control_is_refused_at_save(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let mut child = manual("Child", &json!([log_step("st_log", "child")]));
    child["flow"] = json!({ "singleton": { "mode": "skip" } });
    app.create_automation(&tenant, &child).await;
    let parent = manual(
        "Parent",
        &json!([{ "id": "st_child", "type": "run_workflow", "config": { "automation": "Child" } }]),
    );
    let refused = app
        .post(&tenant.key, "/api/automations", &parent)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    let error = &refused["errors"][0];
    assert_eq!(error["path"], "steps.0.config.automation", "{refused:#}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("flow.singleton"),
        "{refused:#}"
    );

    // The other way round: a child in use may not get a start control.
    let plain = manual("Plain", &json!([log_step("st_log", "plain")]));
    let plain_id = app.create_automation(&tenant, &plain).await;
    let parent = manual(
        "Parent",
        &json!([{ "id": "st_child", "type": "run_workflow", "config": { "automation": "Plain" } }]),
    );
    app.create_automation(&tenant, &parent).await;
    let mut gated = plain.clone();
    gated["flow"] = json!({ "debounce": { "period": "1m" } });
    let refused = app
        .put(&tenant.key, &format!("/api/automations/{plain_id}"), &gated)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    let error = &refused["errors"][0];
    assert_eq!(error["path"], "flow.debounce", "{refused:#}");
    assert!(
        error["message"].as_str().unwrap().contains("Parent"),
        "{refused:#}"
    );
}
