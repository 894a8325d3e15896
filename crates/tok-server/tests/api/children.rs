//! Runs that start other runs, as a user drives them: a `run_workflow` step
//! starts a child (trigger `parent`, `parent_run_id` in the listing and
//! the detail) and waits for it, going on with the `output` of the child's
//! `end` step; a failed or cancelled child fails the waiting step with
//! `child_failed`; a cancelled parent takes the child it waits for with it;
//! children started without waiting are awaited by `wait_for_runs`; an
//! `idempotencyKey` starts one child however many runs ask; nesting stops
//! at depth 3 with `nesting_depth_exceeded`.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual};

backend_tests!(crate::helpers::run;
    a_parent_waits_for_its_child_and_goes_on_with_its_output,
    a_parent_cancelled_while_its_child_waits_cancels_both,
    a_failed_child_fails_the_waiting_step_with_child_failed,
    a_cancelled_child_fails_the_waiting_step,
    children_started_without_waiting_are_awaited_by_wait_for_runs,
    an_idempotency_key_starts_one_child_for_every_run_that_asks,
    runs_nest_at_most_three_deep,
);

/// The child: makes an invoice number and ends with it as its output.
fn invoice() -> Value {
    manual(
        "Invoice",
        &json!([
            { "id": "st_number", "type": "set", "config": { "values": { "number": "F-{{orderId}}" } } },
            { "id": "st_end", "type": "end",
              "config": { "output": { "number": "{{st_number.number}}", "order": "{{orderId}}" } } }
        ]),
    )
}

/// A parent that starts `child` (by name) for its order and logs the
/// child's output.
fn parent(child: &str, wait: bool) -> Value {
    manual(
        "Order",
        &json!([
            { "id": "st_child", "type": "run_workflow",
              "config": { "automation": child, "input": { "orderId": "{{orderId}}" }, "wait": wait } },
            log_step("st_log", "child {{st_child.runId}} {{st_child.status}}")
        ]),
    )
}

async fn start(app: &TestApp, tenant: &Tenant, automation: &str, order: &str) -> String {
    app.start_run(
        tenant,
        automation,
        &json!({ "input": { "orderId": order } }),
    )
    .await
}

async fn detail(app: &TestApp, tenant: &Tenant, run: &str) -> Value {
    app.get(&tenant.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK)
}

fn step<'a>(run: &'a Value, id: &str, status: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .and_then(|steps| {
            steps
                .iter()
                .find(|s| s["step_id"] == id && s["status"] == status)
        })
        .unwrap_or_else(|| panic!("no {status} step {id} in {run:#}"))
}

/// The id of the child the parent's `st_child` step started, once started.
async fn child_of(app: &TestApp, tenant: &Tenant, parent: &str) -> String {
    let waiting = app
        .wait_for_run(tenant, parent, |r| {
            r["steps"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["step_id"] == "st_child"))
        })
        .await;
    let step = waiting["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["step_id"] == "st_child"))
        .expect("the step");
    step["output"]["runId"]
        .as_str()
        .unwrap_or_else(|| panic!("the child's id: {waiting:#}"))
        .to_owned()
}

async fn a_parent_waits_for_its_child_and_goes_on_with_its_output(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_automation(&tenant, &invoice()).await;
    let order = app
        .create_automation(&tenant, &parent("Invoice", true))
        .await;
    let run = start(app, &tenant, &order, "5001").await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    // One row: the wait, read as what it became.
    let resumed = step(&done, "st_child", "completed");
    let child = resumed["output"]["runId"]
        .as_str()
        .expect("the child")
        .to_owned();
    assert_eq!(
        resumed["output"],
        json!({ "runId": child, "status": "completed",
                "output": { "number": "F-5001", "order": "5001" } }),
        "{done:#}"
    );
    assert_eq!(
        done["context"]["st_child"]["output"]["number"], "F-5001",
        "the steps after it read the child's output"
    );
    assert_eq!(
        step(&done, "st_log", "completed")["log"][0],
        format!("info: child {child} completed")
    );

    let child_run = detail(app, &tenant, &child).await;
    assert_eq!(child_run["trigger_type"], "parent", "{child_run:#}");
    assert_eq!(child_run["parent_run_id"], run);
    assert_eq!(child_run["depth"], 1);
    assert_eq!(child_run["status"], "completed");
    assert_eq!(
        child_run["output"],
        json!({ "number": "F-5001", "order": "5001" })
    );
    assert_eq!(done["parent_run_id"], Value::Null);

    let listing = app
        .get(&tenant.key, &format!("/api/runs?parent={run}"))
        .await
        .expect(StatusCode::OK);
    let items = listing["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{listing:#}");
    assert_eq!(items[0]["id"], child);
    assert_eq!(items[0]["trigger_type"], "parent");
    assert_eq!(items[0]["parent_run_id"], run);
    let by_trigger = app
        .get(&tenant.key, "/api/runs?trigger=parent")
        .await
        .expect(StatusCode::OK);
    assert_eq!(by_trigger["items"].as_array().map(Vec::len), Some(1));
}

/// A child that waits for a signal nobody sends.
fn stuck_child() -> Value {
    manual(
        "Approval",
        &json!([{ "id": "st_wait", "type": "wait_for_event", "config": { "key": "never-{{orderId}}" } }]),
    )
}

async fn a_parent_cancelled_while_its_child_waits_cancels_both(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_automation(&tenant, &stuck_child()).await;
    let order = app
        .create_automation(&tenant, &parent("Approval", true))
        .await;
    let run = start(app, &tenant, &order, "5002").await;
    let child = child_of(app, &tenant, &run).await;
    app.wait_for_run(&tenant, &child, |r| r["status"] == "waiting")
        .await;
    let parked = app
        .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    assert_eq!(
        parked["waits"],
        json!([{ "path": "0", "kind": "runs", "key": format!("run:{child}"), "due_at": null }]),
        "the parent's detail says what it waits for: {parked:#}"
    );

    let cancelled = app
        .post(&tenant.key, &format!("/api/runs/{run}/cancel"), &json!({}))
        .await
        .expect(StatusCode::OK);
    assert_eq!(cancelled["status"], "cancelled");
    let parent_run = detail(app, &tenant, &run).await;
    assert_eq!(parent_run["status"], "cancelled");
    assert_eq!(parent_run["waits"], json!([]));
    let child_run = detail(app, &tenant, &child).await;
    assert_eq!(child_run["status"], "cancelled", "{child_run:#}");
    assert_eq!(child_run["waits"], json!([]));
    assert!(
        child_run["error"]
            .as_str()
            .is_some_and(|e| e.contains(&run)),
        "the child says why it was cancelled: {child_run:#}"
    );
    // A signal for the child's wait finds nothing to resume.
    let sent = app
        .post(
            &tenant.key,
            "/api/signals",
            &json!({ "key": "never-5002", "payload": {} }),
        )
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(sent["resumed"], json!([]));
}

async fn a_failed_child_fails_the_waiting_step_with_child_failed(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    // Setting a status with no ticket to act on fails for good.
    app.create_automation(
        &tenant,
        &manual(
            "Broken",
            &json!([{ "id": "st_status", "type": "ticket/set-status", "config": { "status": "done" } }]),
        ),
    )
    .await;
    let order = app
        .create_automation(&tenant, &parent("Broken", true))
        .await;
    let run = start(app, &tenant, &order, "5003").await;
    let failed = app.wait_for_final(&tenant, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().expect("an error");
    let child = step(&failed, "st_child", "failed")["output"]["runId"]
        .as_str()
        .expect("the child")
        .to_owned();
    assert!(
        error.contains("child_failed")
            && error.contains(&child)
            && error.contains("st_status")
            && error.contains("no ticket to act on"),
        "the parent's error names the child and carries its error: {error}"
    );
    let step = step(&failed, "st_child", "failed");
    assert_eq!(
        step["attempt"], 1,
        "child_failed is not retried: {failed:#}"
    );
    let child_run = detail(app, &tenant, &child).await;
    assert_eq!(child_run["status"], "failed");
}

async fn a_cancelled_child_fails_the_waiting_step(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_automation(&tenant, &stuck_child()).await;
    let order = app
        .create_automation(&tenant, &parent("Approval", true))
        .await;
    let run = start(app, &tenant, &order, "5004").await;
    let child = child_of(app, &tenant, &run).await;
    app.wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    app.post(
        &tenant.key,
        &format!("/api/runs/{child}/cancel"),
        &json!({}),
    )
    .await
    .expect(StatusCode::OK);
    let failed = app.wait_for_final(&tenant, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().expect("an error");
    assert!(
        error.contains("child_failed") && error.contains("cancelled"),
        "{error}"
    );
}

async fn children_started_without_waiting_are_awaited_by_wait_for_runs(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_automation(&tenant, &invoice()).await;
    let fan_out = manual(
        "Fan out",
        &json!([
            { "id": "st_a", "type": "run_workflow",
              "config": { "automation": "Invoice", "input": { "orderId": "A" }, "wait": false } },
            { "id": "st_b", "type": "run_workflow",
              "config": { "automation": "Invoice", "input": { "orderId": "B" }, "wait": false } },
            { "id": "st_both", "type": "wait_for_runs",
              "config": { "runs": ["{{st_a.runId}}", "{{st_b.runId}}"], "mode": "all", "timeout": "1h" } },
            log_step("st_log", "{{st_both.runs.0.output.number}} {{st_both.runs.1.output.number}}")
        ]),
    );
    let automation = app.create_automation(&tenant, &fan_out).await;
    let run = start(app, &tenant, &automation, "0").await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let a = step(&done, "st_a", "completed")["output"]["runId"].clone();
    let b = step(&done, "st_b", "completed")["output"]["runId"].clone();
    let outputs = &step(&done, "st_both", "completed")["output"];
    assert_eq!(outputs["timedOut"], false, "{done:#}");
    let mut ended: Vec<(Value, Value, Value)> = outputs["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            (
                r["runId"].clone(),
                r["status"].clone(),
                r["output"]["number"].clone(),
            )
        })
        .collect();
    ended.sort_by_key(|(_, _, number)| number.to_string());
    assert_eq!(
        ended,
        vec![
            (a, json!("completed"), json!("F-A")),
            (b, json!("completed"), json!("F-B"))
        ]
    );
    let line = step(&done, "st_log", "completed")["log"][0].clone();
    assert!(line == "info: F-A F-B" || line == "info: F-B F-A", "{line}");
}

async fn an_idempotency_key_starts_one_child_for_every_run_that_asks(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_automation(&tenant, &invoice()).await;
    let once = manual(
        "Once per order",
        &json!([
            { "id": "st_child", "type": "run_workflow",
              "config": { "automation": "Invoice", "input": { "orderId": "{{orderId}}" },
                          "idempotencyKey": "invoice-{{orderId}}" } }
        ]),
    );
    let automation = app.create_automation(&tenant, &once).await;
    let first = start(app, &tenant, &automation, "7").await;
    let first = app.wait_for_final(&tenant, &first).await;
    let second = start(app, &tenant, &automation, "7").await;
    let second = app.wait_for_final(&tenant, &second).await;
    for run in [&first, &second] {
        assert_eq!(run["status"], "completed", "{run:#}");
    }
    let child = |run: &Value| step(run, "st_child", "completed")["output"].clone();
    assert_eq!(child(&first)["runId"], child(&second)["runId"]);
    assert_eq!(child(&second)["output"]["number"], "F-7");
    let children = app
        .get(&tenant.key, "/api/runs?trigger=parent")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        children["items"].as_array().map(Vec::len),
        Some(1),
        "{children:#}"
    );
}

async fn runs_nest_at_most_three_deep(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    // Each run starts another run of itself and waits for it.
    let nest = manual(
        "Nest",
        &json!([{ "id": "st_child", "type": "run_workflow", "config": { "automation": "Nest" } }]),
    );
    let automation = app.create_automation(&tenant, &nest).await;
    let root = start(app, &tenant, &automation, "1").await;
    let failed = app.wait_for_final(&tenant, &root).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("child_failed")),
        "{failed:#}"
    );
    // Down the chain: depths 1, 2, 3; the run at depth 3 could not start a fourth.
    let mut run = root;
    for depth in 1..=3 {
        let listing = app
            .get(&tenant.key, &format!("/api/runs?parent={run}"))
            .await
            .expect(StatusCode::OK);
        let items = listing["items"].as_array().expect("items").clone();
        assert_eq!(items.len(), 1, "{listing:#}");
        assert_eq!(items[0]["depth"], depth);
        run = items[0]["id"].as_str().expect("an id").to_owned();
    }
    let deepest = detail(app, &tenant, &run).await;
    assert_eq!(deepest["status"], "failed");
    let error = deepest["error"].as_str().expect("an error");
    assert!(error.contains("nesting_depth_exceeded"), "{error}");
    let none = app
        .get(&tenant.key, &format!("/api/runs?parent={run}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(none["items"], json!([]));
}
