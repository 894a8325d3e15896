//! Runs as a client sees them: the dashboard listing (filters, cursor pages,
//! limits) and one run with its steps and their log lines.

use std::collections::HashSet;

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Tenant, TestApp, backend_tests, ids, log_step, manual, on_webhook, plain_source,
};

backend_tests!(
    crate::helpers::run;
    webhook_run_completes_with_steps_and_log_lines,
    failed_run_shows_the_failed_step_and_why,
    trigger_filter_decides_which_events_start_runs,
    listing_filters_by_status_automation_and_trigger,
    listing_pages_with_a_cursor,
    listing_rejects_bad_limits_and_filters,
    unknown_run_is_404,
    a_manual_starts_input_is_bounded_like_a_webhooks_body,
);

/// Log, then a condition on the body's `kind` with a step in each branch.
fn order_steps() -> Value {
    json!([
        log_step("st_log", "order {{orderId}} received"),
        {
            "id": "st_check", "type": "condition", "match": "all",
            "rules": [{ "field": "kind", "operator": "eq", "value": "order.created" }],
            "then": [{ "id": "st_mark", "type": "set", "config": { "values": { "stage": "new {{orderId}}" } } }],
            "else": [log_step("st_other", "not an order")]
        },
        log_step("st_done", "stage is {{stage}}")
    ])
}

fn order_source() -> Value {
    json!({
        "name": "eshop",
        "params": [{ "name": "orderId", "path": "data.order.id", "type": "string", "required": true }]
    })
}

async fn webhook_run_completes_with_steps_and_log_lines(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &order_source()).await;
    let automation = app
        .create_automation(
            &tenant,
            &on_webhook("New order", source["id"].as_str().unwrap(), &order_steps()),
        )
        .await;
    let order = json!({ "kind": "order.created", "data": { "order": { "id": "5001" } } });
    let accepted = app
        .webhook(source["token"].as_str().unwrap(), &order)
        .await
        .expect(StatusCode::ACCEPTED);

    let listed = app.wait_for_runs(&tenant, "", 1).await;
    let summary = &listed[0];
    assert_eq!(summary["automation_id"], automation, "{summary:#}");
    assert_eq!(summary["event_id"], accepted["event_id"], "{summary:#}");
    assert_eq!(summary["status"], "completed", "{summary:#}");
    assert_eq!(summary["trigger_type"], "webhook", "{summary:#}");
    assert_eq!(summary["version"], 1, "{summary:#}");
    assert!(summary["error"].is_null(), "{summary:#}");
    let (started, finished) = (
        crate::helpers::ms(&summary["started_at"]),
        crate::helpers::ms(&summary["finished_at"]),
    );
    assert!(
        started.is_some() && finished.is_some() && started <= finished,
        "{summary:#}"
    );

    let run_id = summary["id"].as_str().unwrap();
    let run = app
        .get(&tenant.key, &format!("/api/runs/{run_id}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(run["id"], run_id);
    assert_eq!(run["status"], "completed");
    // What a client reads of each step, in the order the steps ran.
    let steps: Vec<Value> = run["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            let fields = ["path", "step_id", "type", "attempt", "status", "log"];
            Value::Object(
                fields
                    .iter()
                    .map(|&f| (f.to_owned(), s[f].clone()))
                    .collect(),
            )
        })
        .collect();
    let step = |path: &str, id: &str, kind: &str, log: Value| json!({ "path": path, "step_id": id, "type": kind, "attempt": 1, "status": "completed", "log": log });
    let condition_line = "Condition: kind eq order.created | kind = \"order.created\", compared with \"order.created\"";
    assert_eq!(
        steps,
        [
            step(
                "0",
                "st_log",
                "flow/log",
                json!(["info: order 5001 received"])
            ),
            step(
                "1",
                "st_check",
                "condition",
                json!([condition_line, "Condition: true → then"])
            ),
            step("1.then.0", "st_mark", "set", json!(["Set stage"])),
            step(
                "2",
                "st_done",
                "flow/log",
                json!(["info: stage is new 5001"])
            ),
        ]
    );
    assert!(
        run["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["error"].is_null()),
        "{run:#}"
    );
}

async fn failed_run_shows_the_failed_step_and_why(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let steps = json!([
        log_step("st_first", "starting"),
        { "id": "st_bad", "type": "set", "config": { "values": { "x": "{{nowhere}}" } } },
        log_step("st_never", "not reached")
    ]);
    let automation = app
        .create_automation(&tenant, &manual("Broken", &steps))
        .await;
    let run_id = app
        .start_run(&tenant, &automation, &json!({ "input": {} }))
        .await;

    let run = app.wait_for_final(&tenant, &run_id).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    let expected =
        "step `st_bad` config.values.x: template refers to `nowhere`, which is not in the context";
    assert_eq!(
        run["error"],
        format!("step `st_bad` failed: {expected}"),
        "{run:#}"
    );
    let steps = run["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "the run stops at the failed step: {run:#}");
    assert_eq!(steps[1]["step_id"], "st_bad");
    assert_eq!(steps[1]["status"], "failed");
    assert_eq!(steps[1]["error"], expected);
    assert_eq!(
        steps[1]["log"],
        json!([format!("failed (not retryable): {expected}")])
    );
}

async fn trigger_filter_decides_which_events_start_runs(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let (source_id, token) = (
        source["id"].as_str().unwrap(),
        source["token"].as_str().unwrap(),
    );
    let mut filtered = on_webhook(
        "Orders only",
        source_id,
        &json!([log_step("st_o", "order")]),
    );
    filtered["trigger"]["filter"] = json!({
        "match": "all",
        "rules": [{ "field": "kind", "operator": "eq", "value": "order.created" }]
    });
    let filtered = app.create_automation(&tenant, &filtered).await;
    let everything = app
        .create_automation(
            &tenant,
            &on_webhook("Everything", source_id, &json!([log_step("st_e", "any")])),
        )
        .await;

    let cancelled = app
        .webhook(token, &json!({ "kind": "order.cancelled" }))
        .await
        .expect(StatusCode::ACCEPTED);
    let created = app
        .webhook(token, &json!({ "kind": "order.created" }))
        .await
        .expect(StatusCode::ACCEPTED);
    // Both events were dispatched once the unfiltered automation has both runs.
    app.wait_for_runs(&tenant, &format!("automation={everything}"), 2)
        .await;
    let runs = app
        .wait_for_runs(&tenant, &format!("automation={filtered}"), 1)
        .await;
    assert_eq!(runs[0]["event_id"], created["event_id"], "{:#}", runs[0]);
    assert_ne!(runs[0]["event_id"], cancelled["event_id"]);
}

/// Three webhook runs of one automation, one manual run of another, one
/// failed manual run of a third; returns (tenant, webhook automation,
/// manual automation, failing automation).
async fn five_runs(app: &TestApp) -> (Tenant, String, String, String) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let hook = app
        .create_automation(
            &tenant,
            &on_webhook(
                "Hook",
                source["id"].as_str().unwrap(),
                &json!([log_step("st_a", "a")]),
            ),
        )
        .await;
    let by_hand = app
        .create_automation(&tenant, &manual("By hand", &json!([log_step("st_b", "b")])))
        .await;
    let broken = app
        .create_automation(&tenant, &manual("Broken", &json!([{ "id": "st_x", "type": "set", "config": { "values": { "x": "{{nope}}" } } }])))
        .await;
    for n in 0..3 {
        app.webhook(source["token"].as_str().unwrap(), &json!({ "n": n }))
            .await
            .expect(StatusCode::ACCEPTED);
    }
    app.start_run(&tenant, &by_hand, &json!({ "input": {} }))
        .await;
    app.start_run(&tenant, &broken, &json!({})).await;
    app.wait_for_runs(&tenant, "", 5).await;
    (tenant, hook, by_hand, broken)
}

async fn listing(app: &TestApp, tenant: &Tenant, query: &str) -> Vec<Value> {
    let page = app
        .get(&tenant.key, &format!("/api/dashboard/runs?{query}"))
        .await
        .expect(StatusCode::OK);
    assert!(
        page["next_cursor"].is_null(),
        "one page expected for {query}: {page:#}"
    );
    page["items"].as_array().expect("items").clone()
}

async fn listing_filters_by_status_automation_and_trigger(app: &TestApp) {
    let (tenant, hook, by_hand, broken) = five_runs(app).await;

    let hooked = listing(app, &tenant, &format!("automation={hook}")).await;
    assert_eq!(hooked.len(), 3, "{hooked:#?}");
    assert!(
        hooked
            .iter()
            .all(|r| r["automation_id"] == hook.as_str() && r["trigger_type"] == "webhook")
    );

    let webhook = listing(app, &tenant, "trigger=webhook").await;
    assert_eq!(ids(&webhook), ids(&hooked));

    let manual_runs = listing(app, &tenant, "trigger=manual").await;
    let automations: HashSet<&str> = manual_runs
        .iter()
        .map(|r| r["automation_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        automations,
        HashSet::from([by_hand.as_str(), broken.as_str()])
    );
    assert!(manual_runs.iter().all(|r| r["trigger_type"] == "manual"));

    let failed = listing(app, &tenant, "status=failed").await;
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["automation_id"], broken);
    assert_eq!(listing(app, &tenant, "status=completed").await.len(), 4);

    let combined = listing(
        app,
        &tenant,
        &format!("status=completed&trigger=manual&automation={by_hand}"),
    )
    .await;
    assert_eq!(combined.len(), 1, "{combined:#?}");
    assert_eq!(combined[0]["automation_id"], by_hand);
    assert!(
        listing(app, &tenant, &format!("status=failed&automation={hook}"))
            .await
            .is_empty()
    );
    assert!(
        listing(app, &tenant, "automation=aut_nonexistent")
            .await
            .is_empty()
    );
}

async fn listing_pages_with_a_cursor(app: &TestApp) {
    let (tenant, hook, _, _) = five_runs(app).await;
    let everything = listing(app, &tenant, "").await;
    assert_eq!(everything.len(), 5);
    let mut newest_first = ids(&everything);
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(ids(&everything), newest_first, "newest first");

    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut uri = "/api/dashboard/runs?limit=2".to_owned();
    loop {
        let page = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
        let items = page["items"].as_array().expect("items");
        sizes.push(items.len());
        seen.extend(ids(items));
        match page["next_cursor"].as_str() {
            Some(cursor) => uri = format!("/api/dashboard/runs?limit=2&cursor={cursor}"),
            None => break,
        }
        assert!(sizes.len() < 10, "the cursor never ends: {page:#}");
    }
    assert_eq!(sizes, [2, 2, 1]);
    assert_eq!(
        seen,
        ids(&everything),
        "pages cover every run once, in order"
    );

    // A page that ends exactly at the last run says there is no next one.
    let exact = app
        .get(&tenant.key, "/api/dashboard/runs?limit=5")
        .await
        .expect(StatusCode::OK);
    assert_eq!(ids(exact["items"].as_array().unwrap()), ids(&everything));
    assert!(exact["next_cursor"].is_null(), "{exact:#}");

    // Filters hold across pages.
    let first = app
        .get(
            &tenant.key,
            &format!("/api/dashboard/runs?automation={hook}&limit=2"),
        )
        .await
        .expect(StatusCode::OK);
    let cursor = first["next_cursor"].as_str().expect("a second page");
    let second = app
        .get(
            &tenant.key,
            &format!("/api/dashboard/runs?automation={hook}&limit=2&cursor={cursor}"),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(second["items"].as_array().unwrap().len(), 1, "{second:#}");
    assert!(second["next_cursor"].is_null(), "{second:#}");
    assert_eq!(second["items"][0]["automation_id"], hook);
}

async fn listing_rejects_bad_limits_and_filters(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    for limit in ["0", "501"] {
        let reply = app
            .get(&tenant.key, &format!("/api/dashboard/runs?limit={limit}"))
            .await;
        let error = reply.expect_error(StatusCode::BAD_REQUEST, "bad_limit");
        assert_eq!(
            error["message"],
            format!("limit is {limit}; it must be between 1 and 500")
        );
    }
    app.get(&tenant.key, "/api/dashboard/runs?limit=500")
        .await
        .expect(StatusCode::OK);
    for query in [
        "limit=-1",
        "limit=many",
        "status=done",
        "trigger=cron",
        "colour=red",
    ] {
        let reply = app
            .get(&tenant.key, &format!("/api/dashboard/runs?{query}"))
            .await;
        reply.expect_error(StatusCode::BAD_REQUEST, "bad_query");
    }
}

async fn unknown_run_is_404(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let reply = app
        .get(&tenant.key, "/api/runs/run_0000000000000000000000000000000")
        .await;
    reply.expect_error(StatusCode::NOT_FOUND, "not_found");
}

/// A manual start's input becomes its run's `_body`: past 256 KiB it is
/// refused with 413, as a webhook's body is, and nothing starts.
async fn a_manual_starts_input_is_bounded_like_a_webhooks_body(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(
            &tenant,
            &crate::helpers::manual("Big", &json!([crate::helpers::log_step("st_log", "x")])),
        )
        .await;
    let uri = format!("/api/automations/{automation}/runs");
    let big = json!({ "input": { "text": "A".repeat(300 * 1024) } });
    let refused = app
        .post(&tenant.key, &uri, &big)
        .await
        .expect_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert_eq!(refused["limit"], 256 * 1024, "{refused:#}");
    let runs = app
        .get(&tenant.key, &format!("/api/runs?automation={automation}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(runs["items"], json!([]), "nothing started: {runs:#}");
    // Under the bound, it starts.
    let fits = json!({ "input": { "text": "A".repeat(200 * 1024) } });
    app.post(&tenant.key, &uri, &fits)
        .await
        .expect(StatusCode::CREATED);
}
