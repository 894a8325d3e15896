//! An event the dispatcher cannot start runs for, as an operator sees it:
//! dispatched in one batch with other tenants' events, it fails the
//! batch's transaction; the dispatcher takes the batch apart, sets that
//! one event aside (`GET /api/events/{id}`: `failed`, with its error) and
//! the others become runs and complete — and so do the events sent after
//! the engine restarts. A replay dispatches it again.
//!
//! The event at fault is the store's injected refusal (debug builds only:
//! a body with `"tok_fault": "refuse_dispatch"`), so that both backends
//! refuse it alike; on PostgreSQL, a real one is tried too: a
//! `flow.cancelOn` value too big for its index.

use axum::http::StatusCode;
use rand::distr::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, on_webhook, plain_source};

backend_tests!(
    crate::helpers::run;
    an_event_whose_runs_are_refused_is_set_aside_and_the_others_go_on,
);

/// A source of `tenant` with an automation that logs; the webhook token.
async fn hooked(app: &TestApp, tenant: &Tenant, automation: impl Fn(&str) -> Value) -> String {
    let source = app.create_source(tenant, &plain_source("shop")).await;
    let id = source["id"].as_str().unwrap();
    app.create_automation(tenant, &automation(id)).await;
    source["token"].as_str().unwrap().to_owned()
}

fn logging(source: &str) -> Value {
    on_webhook(
        "Orders",
        source,
        &json!([log_step("st_log", "order {{_body.n}}")]),
    )
}

async fn send(app: &TestApp, token: &str, body: &Value) -> String {
    let accepted = app.webhook(token, body).await.expect(StatusCode::ACCEPTED);
    accepted["event_id"].as_str().unwrap().to_owned()
}

/// The event once the dispatcher is done with it (no longer pending).
async fn taken(app: &TestApp, tenant: &Tenant, event: &str) -> Value {
    let uri = format!("/api/events/{event}");
    app.poll(&format!("event {event} taken"), async || {
        let event = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
        (event["status"] != "pending").then_some(event).ok_or(())
    })
    .await
}

/// The event's one run, finished: it completed.
async fn completed(app: &TestApp, tenant: &Tenant, event: &str) {
    let event = taken(app, tenant, event).await;
    assert_eq!(event["status"], "dispatched", "{event:#}");
    let runs = event["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{event:#}");
    let run = app
        .wait_for_final(tenant, runs[0]["id"].as_str().unwrap())
        .await;
    assert_eq!(run["status"], "completed", "{run:#}");
}

/// The event was set aside: failed, with an error that says why and what
/// to do, and no run.
async fn set_aside(app: &TestApp, tenant: &Tenant, event: &str, why: &str) {
    let event = taken(app, tenant, event).await;
    assert_eq!(event["status"], "failed", "{event:#}");
    let error = event["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("dispatch_failed: "), "{error}");
    assert!(error.contains(why), "{error}");
    assert!(error.contains("set aside"), "{error}");
    assert_eq!(event["runs"], json!([]), "{event:#}");
}

async fn an_event_whose_runs_are_refused_is_set_aside_and_the_others_go_on(app: &TestApp) {
    let culprit = app.create_tenant("Culprit").await;
    let culprit_token = hooked(app, &culprit, logging).await;
    let other = app.create_tenant("Other").await;
    let other_token = hooked(app, &other, logging).await;

    // One batch: the engine takes them together when it starts.
    app.stop_engine().await;
    let refused = send(
        app,
        &culprit_token,
        &json!({ "n": 0, "tok_fault": "refuse_dispatch" }),
    )
    .await;
    let mut fine = vec![
        (
            &culprit,
            send(app, &culprit_token, &json!({ "n": 1 })).await,
        ),
        (&other, send(app, &other_token, &json!({ "n": 2 })).await),
        (&other, send(app, &other_token, &json!({ "n": 3 })).await),
    ];
    app.start_engine().await;
    set_aside(
        app,
        &culprit,
        &refused,
        "refused this event's runs as invalid data",
    )
    .await;
    for (tenant, event) in &fine {
        completed(app, tenant, event).await;
    }

    // After a restart, the event stays aside and new events go on.
    app.stop_engine().await;
    app.start_engine().await;
    fine = vec![
        (&other, send(app, &other_token, &json!({ "n": 4 })).await),
        (
            &culprit,
            send(app, &culprit_token, &json!({ "n": 5 })).await,
        ),
    ];
    for (tenant, event) in &fine {
        completed(app, tenant, event).await;
    }
    let again = taken(app, &culprit, &refused).await;
    assert_eq!(again["status"], "failed", "{again:#}");

    // A replay dispatches it again: refused again, it is set aside in turn.
    let replayed = app
        .post(
            &culprit.key,
            &format!("/api/events/{refused}/replay"),
            &json!({ "mode": "always" }),
        )
        .await;
    let replay = replayed.body["event_id"].as_str().unwrap().to_owned();
    set_aside(app, &culprit, &replay, "invalid data").await;

    if app.backend == tok_store::Backend::Postgres {
        a_cancel_on_value_too_big_for_its_index_is_set_aside(app).await;
    }
}

/// PostgreSQL refuses an index entry over 8 KB: a run whose
/// `flow.cancelOn` value (kept in an index) is a 100 KB string that does
/// not compress cannot be written.
async fn a_cancel_on_value_too_big_for_its_index_is_set_aside(app: &TestApp) {
    let tenant = app.create_tenant("Cancels").await;
    // A run that waits keeps its `cancelOn` row (one that ends at its
    // dispatch needs none).
    let cancelling = |source: &str| {
        let waits = json!([{ "id": "st_wait", "type": "wait_for_event",
                             "config": { "key": "shipped", "timeout": "1h" } }]);
        let mut automation = on_webhook("Orders", source, &waits);
        automation["flow"] =
            json!({ "cancelOn": [{ "source": "order.cancelled", "match": "_body.order" }] });
        automation
    };
    let token = hooked(app, &tenant, cancelling).await;
    let other = app.create_tenant("Bystander").await;
    let other_token = hooked(app, &other, logging).await;
    // Letters at random: they do not compress.
    let order: String = StdRng::seed_from_u64(51)
        .sample_iter(Alphanumeric)
        .take(100_000)
        .map(char::from)
        .collect();
    app.stop_engine().await;
    let refused = send(app, &token, &json!({ "n": 0, "order": order })).await;
    let bystander = send(app, &other_token, &json!({ "n": 1 })).await;
    app.start_engine().await;
    set_aside(app, &tenant, &refused, "invalid data").await;
    completed(app, &other, &bystander).await;
}
