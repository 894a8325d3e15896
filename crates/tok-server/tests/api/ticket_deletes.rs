//! A ticket is deleted with its trace (`DELETE /api/tickets/{id}`, the
//! `write` scope, audited): not while a run in flight is about it (409
//! `in_use` naming the run), which the run's end frees; a finished run
//! keeps its record; another tenant's ticket answers 404.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, manual};

backend_tests!(
    crate::helpers::run;
    a_ticket_is_deleted_with_its_trace_once_no_run_in_flight_is_about_it,
);

/// Files the order's ticket, then waits for the `shipped` signal about it.
fn ships_when_told() -> Value {
    manual(
        "Ships",
        &json!([
            { "id": "st_ticket", "type": "ticket/upsert",
              "config": { "externalId": "{{orderId}}", "type": "order" } },
            { "id": "st_shipped", "type": "wait_for_event",
              "config": { "key": "shipped", "subject": "ticket", "timeout": "1h" } }
        ]),
    )
}

async fn a_ticket_is_deleted_with_its_trace_once_no_run_in_flight_is_about_it(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    app.create_ticket_type(&tenant, "order", &["new", "shipped"])
        .await;
    let ships = app.create_automation(&tenant, &ships_when_told()).await;
    let run = app
        .start_run(&tenant, &ships, &json!({ "input": { "orderId": "A-1" } }))
        .await;
    let parked = app
        .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    let ticket = parked["subject_ticket_id"].as_str().unwrap().to_owned();
    let uri = format!("/api/tickets/{ticket}");
    assert!(
        !app.ticket(&tenant, &ticket).await["trace"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // In use by the waiting run: refused, nothing deleted. The event the
    // ticket's creation wrote may not be dispatched yet when the run parks
    // (the refusal then names it too, for a moment): asked again until
    // only the run holds the ticket.
    let refused = app
        .poll("the events about the ticket to be dispatched", async || {
            let refused = app
                .delete(&tenant.key, &uri)
                .await
                .expect_error(StatusCode::CONFLICT, "in_use");
            let undispatched = refused["used_by"]
                .as_array()
                .is_some_and(|users| users.iter().any(|u| u["kind"] == "events"));
            (!undispatched).then_some(refused).ok_or(())
        })
        .await;
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "run", "id": run, "name": run, "path": null }]),
        "{refused:#}"
    );
    assert!(
        refused["message"].as_str().unwrap().contains("cancel them"),
        "{refused:#}"
    );
    app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
    // Not another tenant's, nor with a key that only reads.
    app.delete(&other.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let reader = app
        .post(
            &tenant.key,
            "/api/keys",
            &json!({ "name": "reader", "scopes": ["read"] }),
        )
        .await
        .expect(StatusCode::CREATED);
    app.delete(reader["key"].as_str().unwrap(), &uri)
        .await
        .expect_error(StatusCode::FORBIDDEN, "scope_missing");

    // The run ends: the ticket goes, with its trace.
    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": "shipped", "subject": ticket }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    let done = app.wait_for_final(&tenant, &run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    app.delete(&tenant.key, &uri)
        .await
        .expect(StatusCode::NO_CONTENT);
    app.get(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let listed = app
        .get(&tenant.key, "/api/tickets")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"], json!([]));
    app.delete(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    // The finished run keeps its record, naming the ticket by its id.
    let kept = app
        .get(&tenant.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(kept["subject_ticket_id"], json!(ticket));

    let rows = app
        .get(
            &tenant.key,
            &format!("/api/audit?action=ticket.deleted&target={ticket}"),
        )
        .await
        .expect(StatusCode::OK);
    let rows = rows["items"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        1,
        "one row, for the deletion that was made: {rows:#?}"
    );
    assert_eq!(rows[0]["outcome"], "done");
    assert_eq!(rows[0]["target"], json!({ "kind": "ticket", "id": ticket }));
}
