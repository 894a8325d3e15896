//! A ticket's log says what each automation did, not only what failed: a
//! run about a ticket (one that wrote to it, or one its change started)
//! ends with one line in the ticket's trace naming the automation and how
//! it ended — completed, failed or cancelled — written with the run's end.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, manual, on_event};

backend_tests!(
    crate::helpers::run;
    a_completed_run_says_so_in_its_tickets_trace,
    a_failed_run_says_so_once_with_its_error,
    a_cancelled_run_says_so,
    a_run_a_ticket_change_started_says_how_it_ended,
    an_upsert_of_a_known_ticket_attaches_and_close_closes_it,
);

/// A tenant with the ticket type `order`.
async fn desk(app: &TestApp) -> Tenant {
    let tenant = app.create_tenant("Acme").await;
    app.create_ticket_type(&tenant, "order", &["new", "shipped"])
        .await;
    tenant
}

fn upsert() -> Value {
    json!({ "id": "st_ticket", "type": "ticket/upsert",
            "config": { "externalId": "{{orderId}}", "type": "order" } })
}

/// Starts `automation` for the order and waits until its run ended; the
/// run and its ticket.
async fn ended(app: &TestApp, tenant: &Tenant, automation: &str, order: &str) -> (Value, Value) {
    let run = app
        .start_run(
            tenant,
            automation,
            &json!({ "input": { "orderId": order } }),
        )
        .await;
    let run = app.wait_for_final(tenant, &run).await;
    let ticket = run["subject_ticket_id"]
        .as_str()
        .unwrap_or_else(|| panic!("the run wrote to a ticket: {run:#}"));
    let ticket = app.ticket(tenant, ticket).await;
    (run, ticket)
}

/// The trace lines of `kind`.
fn lines<'a>(ticket: &'a Value, kind: &str) -> Vec<&'a Value> {
    ticket["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == kind)
        .collect()
}

async fn a_completed_run_says_so_in_its_tickets_trace(app: &TestApp) {
    let tenant = desk(app).await;
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "New order",
                &json!([upsert(),
                        { "id": "st_ship", "type": "ticket/set-status", "config": { "status": "shipped" } }]),
            ),
        )
        .await;
    let (run, ticket) = ended(app, &tenant, &automation, "5001").await;
    assert_eq!(run["status"], "completed", "{run:#}");
    let trace = ticket["trace"].as_array().unwrap();
    let last = trace.last().unwrap();
    assert_eq!(last["kind"], "run_completed", "{ticket:#}");
    assert_eq!(
        last["message"],
        "Automation \u{201c}New order\u{201d} completed"
    );
    assert_eq!(last["run_id"], run["id"]);
    assert_eq!(last["automation_id"], automation.as_str());
    assert_eq!(lines(&ticket, "run_completed").len(), 1, "{ticket:#}");

    // A second run on the same ticket adds its own line.
    let (again, ticket) = ended(app, &tenant, &automation, "5001").await;
    let done = lines(&ticket, "run_completed");
    assert_eq!(done.len(), 2, "{ticket:#}");
    assert_eq!(done[1]["run_id"], again["id"]);
}

async fn a_failed_run_says_so_once_with_its_error(app: &TestApp) {
    let tenant = desk(app).await;
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Ship orders",
                &json!([upsert(),
                        { "id": "st_status", "type": "ticket/set-status", "config": { "status": "lost" } }]),
            ),
        )
        .await;
    let (run, ticket) = ended(app, &tenant, &automation, "5002").await;
    assert_eq!(run["status"], "failed", "{run:#}");
    let failed = lines(&ticket, "run_failed");
    assert_eq!(failed.len(), 1, "one line for one failure: {ticket:#}");
    let message = failed[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Automation \u{201c}Ship orders\u{201d} failed: ")
            && message.contains("st_status")
            && message.contains("lost"),
        "{message}"
    );
    assert_eq!(failed[0]["run_id"], run["id"]);
    assert!(lines(&ticket, "run_completed").is_empty(), "{ticket:#}");
}

async fn a_cancelled_run_says_so(app: &TestApp) {
    let tenant = desk(app).await;
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Slow order",
                &json!([upsert(),
                        { "id": "st_wait", "type": "wait", "config": { "duration": "1h" } },
                        { "id": "st_after", "type": "flow/log", "config": { "message": "later" } }]),
            ),
        )
        .await;
    let run = app
        .start_run(
            &tenant,
            &automation,
            &json!({ "input": { "orderId": "5003" } }),
        )
        .await;
    let waiting = app
        .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    let ticket = waiting["subject_ticket_id"].as_str().unwrap().to_owned();
    let before = app.ticket(&tenant, &ticket).await;
    assert!(lines(&before, "run_cancelled").is_empty());
    app.post(&tenant.key, &format!("/api/runs/{run}/cancel"), &json!({}))
        .await
        .expect(StatusCode::OK);
    let after = app.ticket(&tenant, &ticket).await;
    let cancelled = lines(&after, "run_cancelled");
    assert_eq!(cancelled.len(), 1, "{after:#}");
    assert_eq!(
        cancelled[0]["message"],
        "Automation \u{201c}Slow order\u{201d} was cancelled"
    );
    assert_eq!(cancelled[0]["run_id"], run.as_str());
}

/// A run started by a person's change to a ticket is about that ticket:
/// its end is in the ticket's trace even when it wrote nothing to it.
async fn a_run_a_ticket_change_started_says_how_it_ended(app: &TestApp) {
    let tenant = desk(app).await;
    let automation = app
        .create_automation(
            &tenant,
            &on_event(
                "Watcher",
                "ticket.updated",
                &json!([{ "id": "st_log", "type": "flow/log", "config": { "message": "seen" } }]),
            ),
        )
        .await;
    let ticket = app
        .create_ticket(&tenant, &json!({ "external_id": "T-1", "type": "order" }))
        .await;
    let id = ticket["id"].as_str().unwrap().to_owned();
    app.patch(
        &tenant.key,
        &format!("/api/tickets/{id}"),
        &json!({ "status": "shipped" }),
    )
    .await
    .expect(StatusCode::OK);
    let runs = app
        .wait_for_runs(&tenant, &format!("automation={automation}"), 1)
        .await;
    let run = app
        .wait_for_final(&tenant, runs[0]["id"].as_str().unwrap())
        .await;
    assert_eq!(run["status"], "completed", "{run:#}");
    let shown = app.ticket(&tenant, &id).await;
    let done = lines(&shown, "run_completed");
    assert_eq!(done.len(), 1, "{shown:#}");
    assert_eq!(
        done[0]["message"],
        "Automation \u{201c}Watcher\u{201d} completed"
    );
    assert_eq!(done[0]["run_id"], run["id"]);
}

/// `ticket/upsert` of an external id the desk knows attaches the run to
/// that ticket (`created: false`, an `attached` line), and `ticket/close`
/// closes it with its reason; closing it again changes nothing.
async fn an_upsert_of_a_known_ticket_attaches_and_close_closes_it(app: &TestApp) {
    let tenant = desk(app).await;
    let open = app
        .create_automation(&tenant, &manual("Open order", &json!([upsert()])))
        .await;
    let (first, ticket) = ended(app, &tenant, &open, "5101").await;
    assert_eq!(first["status"], "completed", "{first:#}");
    assert_eq!(first["context"]["st_ticket"]["created"], true, "{first:#}");
    assert_eq!(ticket["closed"], false, "{ticket:#}");

    let close = app
        .create_automation(
            &tenant,
            &manual(
                "Close order",
                &json!([upsert(),
                        { "id": "st_close", "type": "ticket/close", "config": { "reason": "delivered" } }]),
            ),
        )
        .await;
    let (second, closed) = ended(app, &tenant, &close, "5101").await;
    assert_eq!(second["status"], "completed", "{second:#}");
    assert_eq!(
        second["subject_ticket_id"], first["subject_ticket_id"],
        "the same ticket: {second:#}"
    );
    assert_eq!(
        second["context"]["st_ticket"]["created"], false,
        "{second:#}"
    );
    assert_eq!(
        second["context"]["st_ticket"]["ticketId"], ticket["id"],
        "{second:#}"
    );
    assert_eq!(second["context"]["st_close"]["closed"], true, "{second:#}");
    assert_eq!(closed["closed"], true, "{closed:#}");
    let attached = lines(&closed, "attached");
    assert_eq!(attached.len(), 1, "{closed:#}");
    assert_eq!(attached[0]["run_id"], second["id"], "{closed:#}");
    let messages: Vec<&str> = closed["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["message"].as_str())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("Closed by") && m.ends_with(": delivered")),
        "{messages:?}"
    );

    // Closed already: the step succeeds and writes no second line.
    let (third, again) = ended(app, &tenant, &close, "5101").await;
    assert_eq!(third["status"], "completed", "{third:#}");
    assert_eq!(third["context"]["st_close"]["closed"], true, "{third:#}");
    let closings = again["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Closed by"))
        })
        .count();
    assert_eq!(closings, 1, "{again:#}");
}
