//! Start controls (`flow`, docs/workflows.md, "Shaping the starts:
//! debounce, throttle, batch, singleton") as a user sees them through the
//! API: events of one key debounced into one run with the last body,
//! singleton runs `skipped` or replaced, throttled starts spread out and
//! none dropped (a waiting one says `blocked_by: throttle` with `until`),
//! batched events in runs of `maxSize` with `_events`, and a window or a
//! batch that outlives a restart of the engine.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, ms, on_webhook, plain_source};

backend_tests!(crate::helpers::run;
    events_in_a_quiet_period_start_one_run_with_the_last_body_per_key,
    a_singleton_skips_events_while_its_run_is_unfinished,
    a_singleton_in_cancel_mode_replaces_the_running_run,
    a_singleton_in_queue_mode_runs_its_events_one_after_the_other,
    throttled_events_all_run_spread_over_the_period_and_a_waiting_one_says_so,
    twelve_batched_events_run_in_batches_of_five_five_and_two,
    a_debounce_window_and_a_batch_outlive_a_restart,
    a_flow_is_checked_at_save_and_shown_in_the_automation,
    a_run_not_started_within_its_start_timeout_expires,
    a_cancel_event_cancels_only_the_run_it_matches,
);

/// A source and an automation on it with `flow`; returns the token and
/// the automation's id.
async fn controlled(app: &TestApp, tenant: &Tenant, flow: Value, steps: Value) -> (String, String) {
    let source = app.create_source(tenant, &plain_source("shop")).await;
    let mut definition = on_webhook("Orders", source["id"].as_str().unwrap(), &steps);
    definition["flow"] = flow;
    let automation = app.create_automation(tenant, &definition).await;
    (source["token"].as_str().unwrap().to_owned(), automation)
}

async fn send(app: &TestApp, token: &str, body: Value) {
    app.webhook(token, &body).await.expect(StatusCode::ACCEPTED);
}

/// The automation's runs, oldest first.
async fn runs_of(app: &TestApp, tenant: &Tenant, automation: &str) -> Vec<Value> {
    let page = app
        .get(
            &tenant.key,
            &format!("/api/runs?automation={automation}&limit=100"),
        )
        .await
        .expect(StatusCode::OK);
    let mut runs = page["items"].as_array().unwrap().clone();
    runs.sort_by_key(|r| (ms(&r["created_at"]), r["id"].as_str().unwrap().to_owned()));
    runs
}

/// Polls until the automation has `count` runs, all finished.
async fn finished_runs(
    app: &TestApp,
    tenant: &Tenant,
    automation: &str,
    count: usize,
) -> Vec<Value> {
    app.poll(&format!("{count} finished runs"), async || {
        let runs = runs_of(app, tenant, automation).await;
        let done = runs.len() == count && runs.iter().all(crate::helpers::is_final);
        done.then_some(runs).ok_or(())
    })
    .await
}

async fn detail(app: &TestApp, tenant: &Tenant, run: &Value) -> Value {
    let id = run["id"].as_str().unwrap();
    app.get(&tenant.key, &format!("/api/runs/{id}"))
        .await
        .expect(StatusCode::OK)
}

async fn events_in_a_quiet_period_start_one_run_with_the_last_body_per_key(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let flow = json!({ "debounce": { "key": "{{_body.customer}}", "period": "3s" } });
    let (token, automation) = controlled(
        app,
        &tenant,
        flow,
        json!([log_step("st_log", "{{_body.n}}")]),
    )
    .await;
    for n in 1..=5 {
        send(app, &token, json!({ "customer": "c-1", "n": n })).await;
    }
    send(app, &token, json!({ "customer": "c-2", "n": 100 })).await;
    // Held while the period runs: the run says so, until when.
    let held = app
        .poll("a debounced run", async || {
            let runs = runs_of(app, &tenant, &automation).await;
            let first = runs.first().cloned().ok_or(())?;
            (first["blocked_by"]["kind"] == "debounce")
                .then_some(first)
                .ok_or(())
        })
        .await;
    assert_eq!(held["status"], "queued", "{held:#}");
    assert!(held["blocked_by"]["until"].is_string(), "{held:#}");
    let runs = finished_runs(app, &tenant, &automation, 2).await;
    let mut last = Vec::new();
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
        let run = detail(app, &tenant, run).await;
        last.push((
            run["context"]["_body"]["customer"].clone(),
            run["context"]["_body"]["n"].clone(),
        ));
        assert_eq!(
            run["steps"][0]["log"],
            json!([format!("info: {}", run["context"]["_body"]["n"])])
        );
    }
    last.sort_by_key(|(c, _)| c.to_string());
    assert_eq!(last, [(json!("c-1"), json!(5)), (json!("c-2"), json!(100))]);
}

async fn a_singleton_skips_events_while_its_run_is_unfinished(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let flow = json!({ "singleton": { "key": "{{_body.order}}", "mode": "skip" } });
    let steps = json!([
        { "id": "st_wait", "type": "wait", "config": { "duration": "2s" } },
        log_step("st_log", "done")
    ]);
    let (token, automation) = controlled(app, &tenant, flow, steps).await;
    for n in 0..3 {
        send(app, &token, json!({ "order": "o-1", "n": n })).await;
    }
    let mut runs = finished_runs(app, &tenant, &automation, 3).await;
    // One dispatch may write all three in one millisecond: by status.
    runs.sort_by_key(|r| r["status"].as_str().unwrap().to_owned());
    let statuses: Vec<&str> = runs.iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["completed", "skipped", "skipped"], "{runs:#?}");
    let error = runs[1]["error"].as_str().unwrap();
    assert!(error.contains(runs[0]["id"].as_str().unwrap()), "{error}");
    let skipped = detail(app, &tenant, &runs[1]).await;
    assert_eq!(skipped["steps"], json!([]), "no step ran: {skipped:#}");
    // Listed by their status too.
    let listed = app
        .get(&tenant.key, "/api/runs?status=skipped")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"].as_array().unwrap().len(), 2, "{listed:#}");
    // With the first one finished, the key's next event runs.
    send(app, &token, json!({ "order": "o-1", "n": 3 })).await;
    let runs = finished_runs(app, &tenant, &automation, 4).await;
    let completed = runs.iter().filter(|r| r["status"] == "completed").count();
    assert_eq!(completed, 2, "{runs:#?}");
}

async fn a_singleton_in_cancel_mode_replaces_the_running_run(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let flow = json!({ "singleton": { "key": "{{_body.order}}", "mode": "cancel" } });
    let steps = json!([
        { "id": "st_wait", "type": "wait", "config": { "duration": "1h" } },
        log_step("st_log", "done")
    ]);
    let (token, automation) = controlled(app, &tenant, flow, steps).await;
    send(app, &token, json!({ "order": "o-1", "n": 1 })).await;
    send(app, &token, json!({ "order": "o-2", "n": 2 })).await;
    let first = app
        .poll("two waiting runs", async || {
            let runs = runs_of(app, &tenant, &automation).await;
            let waiting = runs.len() == 2 && runs.iter().all(|r| r["status"] == "waiting");
            waiting.then_some(runs).ok_or(())
        })
        .await;
    let mut of_order = std::collections::HashMap::new();
    for run in &first {
        let run = detail(app, &tenant, run).await;
        of_order.insert(run["context"]["_body"]["order"].clone(), run["id"].clone());
    }
    send(app, &token, json!({ "order": "o-1", "n": 3 })).await;
    let runs = app
        .poll("the replacing run", async || {
            let runs = runs_of(app, &tenant, &automation).await;
            let waiting = runs.iter().filter(|r| r["status"] == "waiting").count();
            (runs.len() == 3 && waiting == 2).then_some(runs).ok_or(())
        })
        .await;
    let cancelled: Vec<&Value> = runs.iter().filter(|r| r["status"] == "cancelled").collect();
    assert_eq!(cancelled.len(), 1, "{runs:#?}");
    assert_eq!(
        cancelled[0]["id"],
        of_order[&json!("o-1")],
        "the key's run, not o-2's"
    );
    let newest = runs
        .iter()
        .find(|r| !first.iter().any(|f| f["id"] == r["id"]))
        .unwrap();
    let error = cancelled[0]["error"].as_str().unwrap();
    assert!(error.contains(newest["id"].as_str().unwrap()), "{error}");
}

async fn a_singleton_in_queue_mode_runs_its_events_one_after_the_other(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let flow = json!({ "singleton": { "key": "{{_body.order}}", "mode": "queue" } });
    let steps = json!([
        { "id": "st_wait", "type": "wait", "config": { "duration": "1s" } },
        log_step("st_log", "{{_body.n}}")
    ]);
    let (token, automation) = controlled(app, &tenant, flow, steps).await;
    for n in 0..3 {
        send(app, &token, json!({ "order": "o-1", "n": n })).await;
    }
    send(app, &token, json!({ "order": "o-2", "n": 9 })).await;
    let queued = app
        .poll("a queued run", async || {
            let runs = runs_of(app, &tenant, &automation).await;
            let held = runs
                .into_iter()
                .find(|r| r["blocked_by"]["kind"] == "singleton");
            held.ok_or(())
        })
        .await;
    assert!(queued["blocked_by"]["until"].is_null(), "{queued:#}");
    assert_eq!(queued["status"], "queued", "{queued:#}");
    let runs = finished_runs(app, &tenant, &automation, 4).await;
    let mut of_key = Vec::new();
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
        let run = detail(app, &tenant, run).await;
        if run["context"]["_body"]["order"] == "o-1" {
            of_key.push((
                ms(&run["started_at"]).unwrap(),
                ms(&run["finished_at"]).unwrap(),
                run["context"]["_body"]["n"].as_i64().unwrap(),
            ));
        }
    }
    of_key.sort();
    let order: Vec<i64> = of_key.iter().map(|(_, _, n)| *n).collect();
    assert_eq!(order, [0, 1, 2], "in the order the events came");
    for pair in of_key.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "one at a time: {of_key:?}");
    }
}

async fn throttled_events_all_run_spread_over_the_period_and_a_waiting_one_says_so(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let flow = json!({ "throttle": { "key": "{{_body.shop}}", "limit": 2, "period": "1s" } });
    let (token, automation) =
        controlled(app, &tenant, flow, json!([log_step("st_log", "go")])).await;
    for n in 0..10 {
        send(app, &token, json!({ "shop": "s-1", "n": n })).await;
    }
    let waiting = app
        .poll("a throttled run", async || {
            let runs = runs_of(app, &tenant, &automation).await;
            let held = runs
                .into_iter()
                .find(|r| r["blocked_by"]["kind"] == "throttle");
            held.ok_or(())
        })
        .await;
    let until: jiff::Timestamp = waiting["blocked_by"]["until"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        until > jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1),
        "{waiting:#}"
    );
    assert!(
        waiting["blocked_by"]["detail"]["reason"]
            .as_str()
            .unwrap()
            .contains("2 starts per 1s"),
        "{waiting:#}"
    );
    let runs = finished_runs(app, &tenant, &automation, 10).await;
    assert!(
        runs.iter().all(|r| r["status"] == "completed"),
        "none dropped: {runs:#?}"
    );
    let starts: Vec<i64> = runs.iter().map(|r| ms(&r["started_at"]).unwrap()).collect();
    let spread = starts.iter().max().unwrap() - starts.iter().min().unwrap();
    assert!(spread >= 4_000, "ten starts at 2/s take 4.5 s: {spread} ms");
}

async fn twelve_batched_events_run_in_batches_of_five_five_and_two(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let flow = json!({ "batch": { "maxSize": 5, "timeout": "3s" } });
    let steps = json!([log_step("st_log", "{{_events}}")]);
    let (token, automation) = controlled(app, &tenant, flow, steps).await;
    for n in 0..12 {
        send(app, &token, json!({ "n": n })).await;
    }
    let runs = finished_runs(app, &tenant, &automation, 3).await;
    let mut batches = Vec::new();
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
        let run = detail(app, &tenant, run).await;
        let ns: Vec<i64> = run["context"]["_events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["n"].as_i64().unwrap())
            .collect();
        batches.push(ns);
    }
    batches.sort();
    assert_eq!(
        batches,
        [vec![0, 1, 2, 3, 4], vec![5, 6, 7, 8, 9], vec![10, 11]],
        "in order, the last after its timeout"
    );
}

async fn a_debounce_window_and_a_batch_outlive_a_restart(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let debounce = json!({ "debounce": { "period": "2s" } });
    let (debounced, debounced_id) =
        controlled(app, &tenant, debounce, json!([log_step("st_log", "x")])).await;
    let batch = json!({ "batch": { "maxSize": 10, "timeout": "2s" } });
    let (batched, batched_id) =
        controlled(app, &tenant, batch, json!([log_step("st_log", "x")])).await;
    send(app, &debounced, json!({ "n": 1 })).await;
    send(app, &batched, json!({ "n": 1 })).await;
    app.poll("both held", async || {
        let a = runs_of(app, &tenant, &debounced_id).await;
        let b = runs_of(app, &tenant, &batched_id).await;
        (a.len() == 1 && b.len() == 1).then_some(()).ok_or(())
    })
    .await;
    app.stop_engine().await;
    app.start_engine().await;
    send(app, &debounced, json!({ "n": 2 })).await;
    send(app, &batched, json!({ "n": 2 })).await;
    let runs = finished_runs(app, &tenant, &debounced_id, 1).await;
    let run = detail(app, &tenant, &runs[0]).await;
    assert_eq!(run["context"]["_body"]["n"], 2, "the last body: {run:#}");
    let runs = finished_runs(app, &tenant, &batched_id, 1).await;
    let run = detail(app, &tenant, &runs[0]).await;
    assert_eq!(
        run["context"]["_events"],
        json!([{ "n": 1 }, { "n": 2 }]),
        "{run:#}"
    );
}

async fn a_run_not_started_within_its_start_timeout_expires(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let flow = json!({ "throttle": { "limit": 1, "period": "1h" }, "startTimeout": "1s" });
    let (token, automation) =
        controlled(app, &tenant, flow, json!([log_step("st_log", "x")])).await;
    send(app, &token, json!({ "n": 1 })).await;
    send(app, &token, json!({ "n": 2 })).await;
    let mut runs = finished_runs(app, &tenant, &automation, 2).await;
    runs.sort_by_key(|r| r["status"].as_str().unwrap().to_owned());
    let statuses: Vec<&str> = runs.iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["completed", "expired"], "{runs:#?}");
    let expired = detail(app, &tenant, &runs[1]).await;
    assert!(
        expired["error"]
            .as_str()
            .unwrap()
            .contains("flow.startTimeout"),
        "{expired:#}"
    );
    assert_eq!(expired["steps"], json!([]), "{expired:#}");
    assert!(expired["started_at"].is_null(), "{expired:#}");
    assert!(expired["blocked_by"].is_null(), "{expired:#}");
}

async fn a_cancel_event_cancels_only_the_run_it_matches(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let cancellations = app
        .create_source(&tenant, &plain_source("cancellations"))
        .await;
    let flow = json!({ "cancelOn": [{
        "source": cancellations["id"],
        "where": { "rules": [{ "field": "_body.reason", "operator": "neq", "value": "test" }] },
        "match": "_body.orderId"
    }] });
    let steps = json!([
        { "id": "st_wait", "type": "wait", "config": { "duration": "1h" } },
        log_step("st_log", "shipped")
    ]);
    let (orders, automation) = controlled(app, &tenant, flow, steps).await;
    send(app, &orders, json!({ "orderId": "o-1" })).await;
    send(app, &orders, json!({ "orderId": "o-2" })).await;
    let waiting = app
        .poll("two waiting orders", async || {
            let runs = runs_of(app, &tenant, &automation).await;
            let all = runs.len() == 2 && runs.iter().all(|r| r["status"] == "waiting");
            all.then_some(runs).ok_or(())
        })
        .await;
    let mut of_order = std::collections::HashMap::new();
    for run in &waiting {
        let run = detail(app, &tenant, run).await;
        of_order.insert(
            run["context"]["_body"]["orderId"].clone(),
            run["id"].clone(),
        );
    }
    let cancel_token = cancellations["token"].as_str().unwrap();
    // `where` does not hold: nothing is cancelled.
    send(
        app,
        cancel_token,
        json!({ "orderId": "o-1", "reason": "test" }),
    )
    .await;
    // A tenant's events are dispatched oldest first: once a later order
    // has its run, the test cancel has been dispatched.
    send(app, &orders, json!({ "orderId": "o-3" })).await;
    let runs = app
        .poll("o-3's run", async || {
            let runs = runs_of(app, &tenant, &automation).await;
            (runs.len() == 3).then_some(runs).ok_or(())
        })
        .await;
    assert!(runs.iter().all(|r| r["status"] != "cancelled"), "{runs:#?}");
    send(
        app,
        cancel_token,
        json!({ "orderId": "o-1", "reason": "customer" }),
    )
    .await;
    let cancelled = app
        .poll("o-1 cancelled", async || {
            let runs = runs_of(app, &tenant, &automation).await;
            let gone: Vec<Value> = runs
                .into_iter()
                .filter(|r| r["status"] == "cancelled")
                .collect();
            (!gone.is_empty()).then_some(gone).ok_or(())
        })
        .await;
    assert_eq!(cancelled.len(), 1, "{cancelled:#?}");
    assert_eq!(cancelled[0]["id"], of_order[&json!("o-1")]);
    assert!(
        cancelled[0]["error"]
            .as_str()
            .unwrap()
            .contains("flow.cancelOn"),
        "{cancelled:#?}"
    );
    let other = app
        .get(
            &tenant.key,
            &format!("/api/runs/{}", of_order[&json!("o-2")].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(other["status"], "waiting", "{other:#}");
}

async fn a_flow_is_checked_at_save_and_shown_in_the_automation(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &plain_source("shop")).await;
    let mut definition = on_webhook(
        "Orders",
        source["id"].as_str().unwrap(),
        &json!([log_step("st_log", "x")]),
    );
    definition["flow"] = json!({ "throttle": { "limit": 0, "period": "1s" } });
    let error = app
        .post(&tenant.key, "/api/automations", &definition)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    assert_eq!(
        error["errors"][0]["path"], "flow.throttle.limit",
        "{error:#}"
    );
    definition["flow"] =
        json!({ "debounce": { "key": "{{_body.customer}}", "period": "5m", "maxWait": "1h" } });
    let id = app.create_automation(&tenant, &definition).await;
    let shown = app
        .get(&tenant.key, &format!("/api/automations/{id}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        shown["definition"]["flow"],
        json!({ "debounce": { "key": "{{_body.customer}}", "period": "5m", "maxWait": "1h" } }),
        "{shown:#}"
    );
}
