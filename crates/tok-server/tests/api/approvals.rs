//! Approvals, as people drive them: an `approval` step waits for a member
//! of its group to decide; the decision and who made it are the step's
//! outputs and a line in the trace of the run's ticket; a member who is
//! not an approver is refused (403), a second decision too (409); a group
//! with nobody in it fails the step with `no_approvers`. A comment is at
//! most 4 KiB.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual, trace_messages};

backend_tests!(crate::helpers::run;
    a_member_of_the_group_approves_and_the_run_goes_on,
    a_non_member_is_refused_and_a_second_decision_conflicts,
    an_approval_without_approvers_fails_for_good,
    a_rejection_is_the_steps_output_and_signals_cannot_forge_one,
    a_comment_over_4_kib_is_refused_and_decides_nothing,
);

fn approval(approvers: Value) -> Value {
    json!({ "id": "st_ok", "type": "approval",
            "config": { "approvers": approvers, "prompt": "Refund order {{orderId}}?" } })
}

fn step<'a>(run: &'a Value, id: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .and_then(|steps| steps.iter().rev().find(|s| s["step_id"] == id))
        .unwrap_or_else(|| panic!("no step {id} in {run:#}"))
}

/// Starts `steps` and waits until the run waits for a decision; returns
/// the run id and the pending approval.
async fn waiting_for_decision(app: &TestApp, tenant: &Tenant, steps: Value) -> (String, Value) {
    let automation = app
        .create_automation(tenant, &manual("Refund", &steps))
        .await;
    let run = app
        .start_run(
            tenant,
            &automation,
            &json!({ "input": { "orderId": "5001" } }),
        )
        .await;
    app.wait_for_run(tenant, &run, |r| r["status"] == "waiting")
        .await;
    let pending = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    let items = pending["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{pending:#}");
    (run, items[0].clone())
}

async fn a_member_of_the_group_approves_and_the_run_goes_on(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_ticket_type(&tenant, "Refund", &["new", "done"])
        .await;
    let group = app
        .create_group(&tenant, "Finance", &["Alice", "Bob"])
        .await;
    let bob = group["members"][1]["id"].as_str().unwrap().to_owned();
    let (run, pending) = waiting_for_decision(
        app,
        &tenant,
        json!([
            { "id": "st_ticket", "type": "ticket/upsert",
              "config": { "externalId": "refund-{{orderId}}", "type": "Refund", "title": "Refund" } },
            approval(json!({ "group": "Finance" })),
            log_step("st_after", "{{st_ok.decision}} by {{st_ok.by.name}}"),
        ]),
    )
    .await;
    assert_eq!(pending["status"], "pending");
    assert_eq!(pending["run_id"], run.as_str());
    assert_eq!(pending["prompt"], "Refund order 5001?");
    assert_eq!(pending["approvers"][1]["name"], "Bob", "{pending:#}");
    let waiting = app
        .get(&tenant.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(step(&waiting, "st_ok")["status"], "waiting", "{waiting:#}");
    assert_eq!(waiting["waits"][0]["kind"], "event", "{waiting:#}");

    let id = pending["id"].as_str().unwrap();
    let decided = app
        .post(
            &tenant.key,
            &format!("/api/approvals/{id}"),
            &json!({ "decision": "approve", "member": bob, "comment": "fine" }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(decided["status"], "approved", "{decided:#}");
    assert_eq!(decided["decided_by"]["name"], "Bob");

    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let output = &step(&done, "st_ok")["output"];
    assert_eq!(output["decision"], "approve", "{done:#}");
    assert_eq!(output["by"], json!({ "id": bob, "name": "Bob" }));
    assert_eq!(output["comment"], "fine");
    assert_eq!(step(&done, "st_after")["log"][0], "info: approve by Bob");
    let pending = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    assert_eq!(pending["items"], json!([]), "nothing pending any more");

    let ticket_id = done["subject_ticket_id"]
        .as_str()
        .expect("the run's ticket");
    let ticket = app.ticket(&tenant, ticket_id).await;
    let trace = trace_messages(&ticket);
    assert!(
        trace
            .iter()
            .any(|m| m == "Approved by Bob (step st_ok): fine"),
        "{trace:#?}"
    );
}

async fn a_non_member_is_refused_and_a_second_decision_conflicts(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let finance = app.create_group(&tenant, "Finance", &["Alice"]).await;
    let support = app.create_group(&tenant, "Support", &["Carol"]).await;
    let alice = finance["members"][0]["id"].as_str().unwrap().to_owned();
    let carol = support["members"][0]["id"].as_str().unwrap().to_owned();
    let (run, pending) = waiting_for_decision(
        app,
        &tenant,
        json!([approval(json!({ "members": [alice] }))]),
    )
    .await;
    let uri = format!("/api/approvals/{}", pending["id"].as_str().unwrap());

    let error = app
        .post(
            &tenant.key,
            &uri,
            &json!({ "decision": "approve", "member": carol }),
        )
        .await
        .expect_error(StatusCode::FORBIDDEN, "not_an_approver");
    assert!(
        error["message"].as_str().unwrap().contains(&carol),
        "{error:#}"
    );
    app.post(
        &tenant.key,
        &uri,
        &json!({ "decision": "maybe", "member": alice }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "invalid_body");

    app.post(
        &tenant.key,
        &uri,
        &json!({ "decision": "approve", "member": alice }),
    )
    .await
    .expect(StatusCode::OK);
    let error = app
        .post(
            &tenant.key,
            &uri,
            &json!({ "decision": "reject", "member": alice }),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "already_decided");
    assert_eq!(error["approval"]["status"], "approved", "{error:#}");
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(step(&done, "st_ok")["output"]["decision"], "approve");

    // Another tenant sees none of it.
    let other = app.create_tenant("Other").await;
    let listed = app
        .get(&other.key, "/api/approvals?status=all")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"], json!([]));
    app.post(
        &other.key,
        &uri,
        &json!({ "decision": "approve", "member": alice }),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "not_found");
}

async fn an_approval_without_approvers_fails_for_good(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = manual(
        "Refund",
        &json!([approval(json!({ "members": ["mem_nobody"] }))]),
    );
    let automation = app.create_automation(&tenant, &automation).await;
    let run = app
        .start_run(
            &tenant,
            &automation,
            &json!({ "input": { "orderId": "1" } }),
        )
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    let failed: Vec<&Value> = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == "st_ok")
        .collect();
    assert_eq!(failed.len(), 1, "never retried: {done:#}");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("no_approvers:"),
        "{done:#}"
    );
    let all = app
        .get(&tenant.key, "/api/approvals?status=all")
        .await
        .expect(StatusCode::OK);
    assert_eq!(all["items"], json!([]), "no approval was opened");
}

async fn a_rejection_is_the_steps_output_and_signals_cannot_forge_one(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let group = app.create_group(&tenant, "Finance", &["Alice"]).await;
    let alice = group["members"][0]["id"].as_str().unwrap().to_owned();
    let (run, pending) = waiting_for_decision(
        app,
        &tenant,
        json!([
            approval(json!({ "group": group["id"] })),
            { "id": "st_branch", "type": "condition", "match": "all",
              "rules": [{ "field": "st_ok.decision", "operator": "eq", "value": "approve" }],
              "then": [log_step("st_yes", "refunded")],
              "else": [log_step("st_no", "refused")] }
        ]),
    )
    .await;
    let id = pending["id"].as_str().unwrap();
    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": format!("approval:{id}"), "payload": { "decision": "approve" } }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    app.post(
        &tenant.key,
        &format!("/api/approvals/{id}"),
        &json!({ "decision": "reject", "member": alice }),
    )
    .await
    .expect(StatusCode::OK);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(step(&done, "st_ok")["output"]["decision"], "reject");
    assert_eq!(step(&done, "st_no")["status"], "completed", "{done:#}");
    assert!(
        done["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["step_id"] != "st_yes")
    );
}

async fn a_comment_over_4_kib_is_refused_and_decides_nothing(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let finance = app.create_group(&tenant, "Finance", &["Alice"]).await;
    let alice = finance["members"][0]["id"].as_str().unwrap().to_owned();
    let (run, pending) = waiting_for_decision(
        app,
        &tenant,
        json!([approval(json!({ "members": [alice] }))]),
    )
    .await;
    let uri = format!("/api/approvals/{}", pending["id"].as_str().unwrap());

    let too_long = "é".repeat(2048) + "x";
    assert_eq!(too_long.len(), 4097);
    let error = app
        .post(
            &tenant.key,
            &uri,
            &json!({ "decision": "approve", "member": alice, "comment": too_long }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert_eq!(error["field"], "comment", "{error:#}");
    assert_eq!(error["limit"], 4096, "{error:#}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("4097 bytes") && message.contains("4096"),
        "{message}"
    );
    let still = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
    assert_eq!(still["status"], "pending", "nothing was decided: {still:#}");

    let just_fits = "é".repeat(2048);
    assert_eq!(just_fits.len(), 4096);
    let decided = app
        .post(
            &tenant.key,
            &uri,
            &json!({ "decision": "reject", "member": alice, "comment": just_fits }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(decided["status"], "rejected", "{decided:#}");
    assert_eq!(decided["comment"], just_fits.as_str());
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(step(&done, "st_ok")["status"], "completed", "{done:#}");
}
