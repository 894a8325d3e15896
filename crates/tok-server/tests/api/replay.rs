//! Event replay as an operator sees it: an event that came before its
//! automation existed starts it when replayed `if_no_runs`, once (a second
//! replay starts nothing and names the run); `always` starts another run
//! each time; a filtered replay counts in a dry run what it would take and
//! replays only those; each replay is in the audit log; and another
//! tenant's event is a 404.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, on_webhook, plain_source};

backend_tests!(
    crate::helpers::run;
    an_event_before_its_automation_starts_it_once_when_replayed_if_no_runs,
    a_replay_always_starts_another_run,
    a_filtered_replay_takes_the_sources_events_in_the_window,
    a_replay_needs_its_mode_and_another_tenants_event_is_404,
);

/// A source and the webhook token to send to it.
async fn source(app: &TestApp, tenant: &Tenant, name: &str) -> (String, String) {
    let source = app.create_source(tenant, &plain_source(name)).await;
    (
        source["id"].as_str().unwrap().to_owned(),
        source["token"].as_str().unwrap().to_owned(),
    )
}

/// Sends a body to the webhook; returns the event's id.
async fn send(app: &TestApp, token: &str, body: &Value) -> String {
    let accepted = app.webhook(token, body).await.expect(StatusCode::ACCEPTED);
    accepted["event_id"].as_str().unwrap().to_owned()
}

/// Polls `GET /api/events/{id}` until the dispatcher has taken the event.
async fn dispatched(app: &TestApp, tenant: &Tenant, event: &str) -> Value {
    let uri = format!("/api/events/{event}");
    app.poll(&format!("event {event} dispatched"), async || {
        let event = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
        (event["status"] != "pending").then_some(event).ok_or(())
    })
    .await
}

/// `POST /api/events/{id}/replay`; returns the answer once the replay's
/// runs are known (the answer's own when it is 200, else the event's).
async fn replay(app: &TestApp, tenant: &Tenant, event: &str, mode: &str) -> Value {
    let reply = app
        .post(
            &tenant.key,
            &format!("/api/events/{event}/replay"),
            &json!({ "mode": mode }),
        )
        .await;
    if reply.status == StatusCode::ACCEPTED {
        let mut answer = reply.body;
        let replay = answer["event_id"].as_str().unwrap().to_owned();
        answer["runs"] = dispatched(app, tenant, &replay).await["runs"].clone();
        return answer;
    }
    reply.expect(StatusCode::OK)
}

fn run_ids(runs: &Value) -> Vec<String> {
    runs.as_array()
        .unwrap_or_else(|| panic!("a list of runs: {runs:#}"))
        .iter()
        .map(|r| {
            r["id"]
                .as_str()
                .unwrap_or_else(|| r.as_str().unwrap())
                .to_owned()
        })
        .collect()
}

async fn an_event_before_its_automation_starts_it_once_when_replayed_if_no_runs(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let (source_id, token) = source(app, &tenant, "eshop").await;
    let event = send(app, &token, &json!({ "order": "A-1" })).await;
    let before = dispatched(app, &tenant, &event).await;
    assert_eq!(before["runs"], json!([]), "{before:#}");
    assert_eq!(before["source_id"], json!(source_id));

    let automation = app
        .create_automation(
            &tenant,
            &on_webhook(
                "Ship",
                &source_id,
                &json!([log_step("st_ship", "ship {{order}}")]),
            ),
        )
        .await;
    let first = replay(app, &tenant, &event, "if_no_runs").await;
    assert_eq!(first["replayed"], json!(true), "{first:#}");
    assert_eq!(first["replay_of"], json!(event));
    let runs = run_ids(&first["runs"]);
    assert_eq!(runs.len(), 1, "one run started: {first:#}");
    let run = app.wait_for_final(&tenant, &runs[0]).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(run["automation_id"], json!(automation));
    assert_eq!(run["context"]["_body"]["order"], "A-1", "{run:#}");

    // The event has a run now (through its replay): a second replay, of
    // the event or of its replay, starts none and names it.
    for again in [event.as_str(), first["event_id"].as_str().unwrap()] {
        let second = replay(app, &tenant, again, "if_no_runs").await;
        assert_eq!(second["replayed"], json!(false), "{second:#}");
        assert_eq!(second["reason"], "has_runs");
        assert_eq!(run_ids(&second["runs"]), runs);
    }
    let listed = app
        .get(
            &tenant.key,
            &format!("/api/runs?event={}", first["event_id"].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(run_ids(&listed["items"]), runs, "{listed:#}");
    let all = app.wait_for_runs(&tenant, "", 1).await;
    assert_eq!(all.len(), 1);

    let audit = app
        .get(&tenant.key, "/api/audit?action=event.replayed")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        audit["items"].as_array().map(Vec::len),
        Some(3),
        "each replay call is in the audit log: {audit:#}"
    );
}

async fn a_replay_always_starts_another_run(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let (source_id, token) = source(app, &tenant, "eshop").await;
    app.create_automation(
        &tenant,
        &on_webhook("Ship", &source_id, &json!([log_step("st_ship", "ship")])),
    )
    .await;
    let event = send(app, &token, &json!({ "order": "A-2" })).await;
    let original = app.wait_for_runs(&tenant, "", 1).await;
    let skipped = replay(app, &tenant, &event, "if_no_runs").await;
    assert_eq!(skipped["reason"], "has_runs", "{skipped:#}");
    assert_eq!(run_ids(&skipped["runs"]), run_ids(&json!(original)));

    let again = replay(app, &tenant, &event, "always").await;
    assert_eq!(again["replayed"], json!(true), "{again:#}");
    assert_eq!(run_ids(&again["runs"]).len(), 1, "{again:#}");
    let all = app.wait_for_runs(&tenant, "", 2).await;
    assert_eq!(all.len(), 2, "the replay started a second run");
}

async fn a_filtered_replay_takes_the_sources_events_in_the_window(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let (shop, shop_token) = source(app, &tenant, "eshop").await;
    let (_, other_token) = source(app, &tenant, "invoices").await;
    let mut events = Vec::new();
    for order in ["B-1", "B-2", "B-3"] {
        events.push(send(app, &shop_token, &json!({ "order": order })).await);
    }
    let other = send(app, &other_token, &json!({ "invoice": 7 })).await;
    for event in events.iter().chain([&other]) {
        dispatched(app, &tenant, event).await;
    }
    app.create_automation(
        &tenant,
        &on_webhook(
            "Ship",
            &shop,
            &json!([log_step("st_ship", "ship {{order}}")]),
        ),
    )
    .await;

    let filter = json!({ "source": shop, "since": "2020-01-01T00:00:00Z" });
    let dry = app
        .post(
            &tenant.key,
            "/api/events/replay",
            &json!({ "filter": filter, "mode": "if_no_runs", "dry_run": true, "limit": 2 }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(dry["count"], json!(3), "{dry:#}");
    let page: Vec<&str> = dry["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        page,
        [events[0].as_str(), events[1].as_str()],
        "oldest first"
    );
    assert!(dry["next_cursor"].is_string(), "{dry:#}");
    assert_eq!(
        app.get(&tenant.key, "/api/runs")
            .await
            .expect(StatusCode::OK)["items"],
        json!([]),
        "a dry run starts nothing"
    );

    let window_closed = app
        .post(
            &tenant.key,
            "/api/events/replay",
            &json!({ "filter": { "source": shop, "until": "2020-01-01T00:00:00Z" },
                     "mode": "if_no_runs", "dry_run": true }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(window_closed["count"], json!(0), "{window_closed:#}");

    let done = app
        .post(
            &tenant.key,
            "/api/events/replay",
            &json!({ "filter": filter, "mode": "if_no_runs" }),
        )
        .await
        .expect(StatusCode::OK);
    let replayed: Vec<&str> = done["replayed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        replayed,
        events.iter().map(String::as_str).collect::<Vec<_>>(),
        "{done:#}"
    );
    let runs = app.wait_for_runs(&tenant, "", 3).await;
    let mut orders = Vec::new();
    for run in &runs {
        let detail = app
            .get(
                &tenant.key,
                &format!("/api/runs/{}", run["id"].as_str().unwrap()),
            )
            .await
            .expect(StatusCode::OK);
        orders.push(
            detail["context"]["_body"]["order"]
                .as_str()
                .unwrap_or("?")
                .to_owned(),
        );
    }
    orders.sort_unstable();
    assert_eq!(orders, ["B-1", "B-2", "B-3"]);

    // Replays are not replayed again, and the events now have runs.
    let twice = app
        .post(
            &tenant.key,
            "/api/events/replay",
            &json!({ "filter": filter, "mode": "if_no_runs" }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(twice["replayed"], json!([]), "{twice:#}");
    assert_eq!(twice["skipped"].as_array().map(Vec::len), Some(3));
    assert!(
        twice["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["reason"] == "has_runs"),
        "{twice:#}"
    );
}

async fn a_replay_needs_its_mode_and_another_tenants_event_is_404(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let beta = app.create_tenant("Beta").await;
    let (_, token) = source(app, &acme, "eshop").await;
    let event = send(app, &token, &json!({ "order": "C-1" })).await;
    dispatched(app, &acme, &event).await;

    let uri = format!("/api/events/{event}/replay");
    let error = app
        .post(&acme.key, &uri, &json!({}))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert!(
        error["message"].as_str().unwrap().contains("if_no_runs"),
        "{error:#}"
    );
    app.post(&acme.key, &uri, &json!({ "mode": "sometimes" }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    app.post(
        &acme.key,
        "/api/events/replay",
        &json!({ "filter": { "since": "yesterday" }, "mode": "always" }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "invalid_body");

    app.get(&beta.key, &format!("/api/events/{event}"))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.post(&beta.key, &uri, &json!({ "mode": "always" }))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let theirs = app
        .post(
            &beta.key,
            "/api/events/replay",
            &json!({ "filter": {}, "mode": "always", "dry_run": true }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(theirs["count"], json!(0), "{theirs:#}");
}
