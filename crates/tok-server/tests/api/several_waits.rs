//! Waits for several signals and for a ticket's condition
//! (docs/workflows.md, "Waiting for several signals: `keys` and `mode`" and
//! "Waiting for a ticket's condition: `wait_for_condition`"): a
//! `wait_for_event` on `keys` in `all` mode goes on only once a signal has
//! come on every key, in either order, and its output names them; in `any`
//! mode the first signal ends it and its output names its key. A
//! `wait_for_condition` on the run's subject ticket goes on when a change
//! of the ticket (`PATCH /api/tickets/{id}`) makes its rules hold, not on a
//! change that does not, and at once when they hold as it begins.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, manual};

backend_tests!(crate::helpers::run;
    all_goes_on_only_after_a_signal_on_every_key_in_either_order,
    any_goes_on_with_the_first_signal_and_names_its_key,
    a_ticket_set_to_shipped_resumes_the_runs_condition_wait,
    a_condition_that_holds_already_goes_on_at_once,
    reserved_keys_are_refused_to_senders,
);

async fn send(app: &TestApp, tenant: &Tenant, body: &Value) -> Value {
    app.post(&tenant.key, "/api/signals", body)
        .await
        .expect(StatusCode::ACCEPTED)
}

/// The keys a waiting run's detail shows it waits on, sorted.
fn waiting_keys(run: &Value) -> Vec<String> {
    let mut keys: Vec<String> = run["waits"]
        .as_array()
        .map(|waits| {
            waits
                .iter()
                .filter_map(|w| w["key"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    keys.sort();
    keys
}

async fn all_goes_on_only_after_a_signal_on_every_key_in_either_order(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let both = app
        .create_automation(
            &tenant,
            &manual(
                "Paid and packed",
                &json!([
                    { "id": "st_both", "type": "wait_for_event",
                      "config": { "keys": ["paid-{{o}}", "packed-{{o}}"], "mode": "all",
                                  "timeout": "1h" } },
                    { "id": "st_done", "type": "flow/log", "config": { "message": "ready" } }
                ]),
            ),
        )
        .await;
    for (order, first, second) in [("1", "paid", "packed"), ("2", "packed", "paid")] {
        let run = app
            .start_run(&tenant, &both, &json!({ "input": { "o": order } }))
            .await;
        let parked = app
            .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
            .await;
        assert_eq!(
            waiting_keys(&parked),
            [format!("packed-{order}"), format!("paid-{order}")],
            "the run waits on both keys: {parked:#}"
        );

        let sent = send(
            app,
            &tenant,
            &json!({ "key": format!("{first}-{order}"), "payload": { "by": first } }),
        )
        .await;
        assert_eq!(sent["resumed"], json!([run]), "{sent:#}");
        // The run takes the signal (it runs until its step has taken it) and
        // waits on for the other key.
        let missing = [format!("{second}-{order}")];
        let half = app
            .wait_for_run(&tenant, &run, |r| {
                r["status"] == "waiting" && waiting_keys(r) == missing
            })
            .await;
        assert_eq!(half["status"], "waiting", "after one signal: {half:#}");
        assert_eq!(
            half["steps"].as_array().map(Vec::len),
            Some(1),
            "one step, still waiting: {half:#}"
        );
        assert_eq!(half["steps"][0]["status"], "waiting", "{half:#}");

        send(
            app,
            &tenant,
            &json!({ "key": format!("{second}-{order}"), "payload": { "by": second } }),
        )
        .await;
        let done = app.wait_for_final(&tenant, &run).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        let output = &done["steps"][0]["output"];
        assert_eq!(output["timedOut"], false, "{output:#}");
        assert_eq!(
            output["keys"],
            json!([format!("{first}-{order}"), format!("{second}-{order}")]),
            "the keys in the order their signals came: {output:#}"
        );
        for key in [first, second] {
            assert_eq!(
                output["signals"][format!("{key}-{order}")]["payload"],
                json!({ "by": key }),
                "{output:#}"
            );
        }
        assert!(
            done["waits"].as_array().is_none_or(Vec::is_empty),
            "{done:#}"
        );
        assert!(done["context"].get("_waiting").is_none(), "{done:#}");
    }
}

async fn any_goes_on_with_the_first_signal_and_names_its_key(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let either = app
        .create_automation(
            &tenant,
            &manual(
                "Approved or rejected",
                &json!([{ "id": "st_either", "type": "wait_for_event",
                          "config": { "keys": ["approved", "rejected"], "mode": "any" } }]),
            ),
        )
        .await;
    let run = app.start_run(&tenant, &either, &json!({})).await;
    app.wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    let sent = send(
        app,
        &tenant,
        &json!({ "key": "rejected", "payload": { "why": "stock" } }),
    )
    .await;
    assert_eq!(sent["resumed"], json!([run]), "{sent:#}");
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let output = &done["steps"][0]["output"];
    assert_eq!(
        (&output["key"], &output["payload"], &output["signalId"]),
        (
            &json!("rejected"),
            &json!({ "why": "stock" }),
            &sent["signal_id"]
        ),
        "{output:#}"
    );
    // The other key's wait went with it: its signal is buffered.
    let later = send(app, &tenant, &json!({ "key": "approved" })).await;
    assert_eq!(
        (&later["resumed"], &later["buffered"]),
        (&json!([]), &json!(true)),
        "{later:#}"
    );
}

/// Files the order's ticket (the run's subject), then waits until it is
/// `shipped`.
fn ships() -> Value {
    manual(
        "Ships",
        &json!([
            { "id": "st_ticket", "type": "ticket/upsert",
              "config": { "externalId": "{{orderId}}", "type": "order" } },
            { "id": "st_shipped", "type": "wait_for_condition",
              "config": { "rules": [{ "field": "status", "operator": "eq", "value": "shipped" }],
                          "timeout": "1d" } },
            { "id": "st_done", "type": "flow/log", "config": { "message": "shipped" } }
        ]),
    )
}

async fn a_ticket_set_to_shipped_resumes_the_runs_condition_wait(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_ticket_type(&tenant, "order", &["new", "packed", "shipped"])
        .await;
    let ships = app.create_automation(&tenant, &ships()).await;
    let run = app
        .start_run(&tenant, &ships, &json!({ "input": { "orderId": "7" } }))
        .await;
    let parked = app
        .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    let ticket = parked["subject_ticket_id"]
        .as_str()
        .expect("a subject ticket")
        .to_owned();
    assert_eq!(
        (&parked["waits"][0]["kind"], &parked["waits"][0]["subject"]),
        (&json!("condition"), &json!(ticket)),
        "the run waits on its ticket: {parked:#}"
    );
    assert_eq!(
        (
            &parked["blocked_by"]["kind"],
            &parked["blocked_by"]["detail"]
        ),
        (&json!("condition"), &json!({ "ticketId": ticket })),
        "{parked:#}"
    );

    // A change that does not make the rules hold: the wait stays (the
    // resume would have taken it in the change's own transaction).
    let uri = format!("/api/tickets/{ticket}");
    app.patch(&tenant.key, &uri, &json!({ "status": "packed" }))
        .await
        .expect(StatusCode::OK);
    let still = app
        .get(&tenant.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        (&still["status"], &still["waits"][0]["kind"]),
        (&json!("waiting"), &json!("condition")),
        "a packed ticket is not shipped: {still:#}"
    );

    app.patch(&tenant.key, &uri, &json!({ "status": "shipped" }))
        .await
        .expect(StatusCode::OK);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let step = &done["steps"][1];
    assert_eq!(
        (
            &step["step_id"],
            &step["output"]["timedOut"],
            &step["output"]["ticket"]["status"],
            &step["output"]["ticket"]["id"]
        ),
        (
            &json!("st_shipped"),
            &json!(false),
            &json!("shipped"),
            &json!(ticket)
        ),
        "{step:#}"
    );
    assert!(
        step["log"].to_string().contains("the condition holds"),
        "{step:#}"
    );
}

async fn a_condition_that_holds_already_goes_on_at_once(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_ticket_type(&tenant, "order", &["new", "packed", "shipped"])
        .await;
    app.create_ticket(
        &tenant,
        &json!({ "external_id": "8", "type": "order", "status": "shipped" }),
    )
    .await;
    let ships = app.create_automation(&tenant, &ships()).await;
    let run = app
        .start_run(&tenant, &ships, &json!({ "input": { "orderId": "8" } }))
        .await;
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(
        done["steps"][1]["output"]["ticket"]["status"], "shipped",
        "{done:#}"
    );
}

/// `tok:` keys are tok's own (a condition waits on one): a sender gets a
/// 400 naming the field, and an automation cannot wait on one.
async fn reserved_keys_are_refused_to_senders(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let error = app
        .post(
            &tenant.key,
            "/api/signals",
            &json!({ "key": "tok:condition" }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert_eq!(error["field"], "key", "{error:#}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("reserved")),
        "{error:#}"
    );
    let waits_on_it = manual(
        "Sneaky",
        &json!([{ "id": "st_w", "type": "wait_for_event",
                  "config": { "keys": ["a", "tok:condition"], "mode": "any" } }]),
    );
    let refused = app
        .post(&tenant.key, "/api/automations", &waits_on_it)
        .await
        .expect(StatusCode::BAD_REQUEST);
    assert!(
        refused.to_string().contains("steps.0.config.keys.1"),
        "{refused:#}"
    );
}
