//! Searching runs by what they carry (`POST /api/runs/search`): one run of
//! three is found by the order id in its webhook's body, with the listing's
//! filters beside the rules; pages go on by cursor; another tenant's runs
//! are never found; a search without rules is refused, naming `where`.
//! Over runs with big contexts, read a few megabytes at a time, every page
//! is right; a call that reaches its budget of contexts stops at the last
//! run it looked at, and its cursor goes on from there to the same answer
//! as one call without a budget.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, ids, log_step, on_webhook, plain_source};

backend_tests!(
    crate::helpers::run;
    a_search_finds_the_run_whose_body_holds_the_order,
    a_search_over_big_contexts_answers_every_page,
    a_selection_stops_at_its_budget_of_contexts_and_goes_on_from_its_cursor,
);

/// Runs of a tenant whose bodies are about `kb` kilobytes each, every third
/// one `picked`: the runs newest first, and those picked.
async fn big_runs(
    app: &TestApp,
    n: usize,
    kb: usize,
) -> (crate::helpers::Tenant, Vec<String>, Vec<String>) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &plain_source("bulky")).await;
    app.create_automation(
        &tenant,
        &on_webhook(
            "Keep",
            source["id"].as_str().unwrap(),
            &json!([log_step("st_keep", "kept")]),
        ),
    )
    .await;
    let token = source["token"].as_str().unwrap();
    let blob = "b".repeat(kb * 1024);
    for i in 0..n {
        app.webhook(
            token,
            &json!({ "n": i, "picked": i % 3 == 0, "blob": blob }),
        )
        .await
        .expect(StatusCode::ACCEPTED);
    }
    let runs = ids(&app.wait_for_runs(&tenant, "", n).await);
    let mut picked = Vec::new();
    for run in &runs {
        let detail = app
            .get(&tenant.key, &format!("/api/runs/{run}"))
            .await
            .expect(StatusCode::OK);
        if detail["context"]["_body"]["picked"] == true {
            picked.push(run.clone());
        }
    }
    assert_eq!(picked.len(), n.div_ceil(3));
    (tenant, runs, picked)
}

fn picked() -> Value {
    json!({ "match": "all", "rules": [{ "field": "_body.picked", "operator": "eq", "value": true }] })
}

async fn a_search_over_big_contexts_answers_every_page(app: &TestApp) {
    // 30 runs of 200 KB: several batches of contexts a page.
    let (tenant, _, picked_runs) = big_runs(app, 30, 200).await;
    let mut seen = Vec::new();
    let mut cursor = Value::Null;
    let mut pages = 0;
    loop {
        let mut body = json!({ "where": picked(), "limit": 3 });
        if !cursor.is_null() {
            body["cursor"] = cursor.clone();
        }
        let page = app
            .post(&tenant.key, "/api/runs/search", &body)
            .await
            .expect(StatusCode::OK);
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 3, "{page:#}");
        seen.extend(ids(items));
        pages += 1;
        cursor = page["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(seen, picked_runs, "newest first, each once");
    assert!(pages >= 4, "{pages} pages");
    // A dry run counts them all in one call (8 MB is within its budget).
    let dry = app
        .post(
            &tenant.key,
            "/api/runs/bulk",
            &json!({ "filter": { "where": picked() }, "action": "cancel", "dry_run": true }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(dry["count"], 10, "{dry:#}");
    assert_eq!(dry["complete"], true);
    assert_eq!(dry["next_cursor"], Value::Null);
    assert_eq!(ids(dry["runs"].as_array().unwrap()), picked_runs);
}

async fn a_selection_stops_at_its_budget_of_contexts_and_goes_on_from_its_cursor(app: &TestApp) {
    use tok_engine::operations::{Budget, BulkFilter, count, search};
    let (tenant, _, picked_runs) = big_runs(app, 12, 100).await;
    let store = app.state.engine.store();
    let tenant_id = tok_core::ids::TenantId::from(tenant.id.as_str());
    let filter = BulkFilter {
        where_: Some(serde_json::from_value(picked()).unwrap()),
        ..BulkFilter::default()
    };
    let selection = filter.selection(None).unwrap();

    // 250 KiB a call: two or three runs' contexts, then a cursor.
    let mut total = 0;
    let mut shown = Vec::new();
    let mut after = None;
    let mut calls = 0;
    loop {
        let mut budget = Budget::of(250 * 1024);
        let counted = count(
            &**store,
            &tenant_id,
            &selection,
            50,
            after,
            total,
            &mut budget,
        )
        .await
        .unwrap()
        .expect("within the most runs");
        calls += 1;
        total += counted.total;
        shown.extend(counted.first.iter().map(|r| r.id.to_string()));
        match counted.after {
            Some(next) => after = Some(next),
            None => break,
        }
        assert!(calls < 20, "the count goes on");
    }
    assert!(calls >= 4, "{calls} calls");
    assert_eq!(total, 4);
    assert_eq!(
        shown, picked_runs,
        "each once, newest first, across the calls"
    );

    // A search stops where its budget ran out, and its cursor goes on.
    let mut found = Vec::new();
    let mut cursor = None;
    let mut searches = 0;
    loop {
        let mut budget = Budget::of(250 * 1024);
        let (runs, next) = search(
            &**store,
            &tenant_id,
            &selection,
            cursor,
            100,
            10_000,
            &mut budget,
        )
        .await
        .unwrap();
        searches += 1;
        found.extend(runs.iter().map(|r| r.id.to_string()));
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert!(searches >= 4, "{searches} calls");
    assert_eq!(found, picked_runs);

    // Through the API, a dry run's cursor is refused without `dry_run`,
    // and one it did not give out is refused as such.
    let error = app
        .post(
            &tenant.key,
            "/api/runs/bulk",
            &json!({ "filter": { "where": picked() }, "action": "cancel", "cursor": "x" }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert_eq!(error["field"], "cursor");
    app.post(
        &tenant.key,
        "/api/runs/bulk",
        &json!({ "filter": { "where": picked() }, "action": "cancel", "dry_run": true,
                 "cursor": "bm90LWEtY3Vyc29y" }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "bad_cursor");
}

fn order_is(order: &str) -> Value {
    json!({ "match": "all", "rules": [
        { "field": "_body.order.id", "operator": "eq", "value": order }
    ] })
}

async fn a_search_finds_the_run_whose_body_holds_the_order(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let beta = app.create_tenant("Beta").await;
    let mut tokens = Vec::new();
    for tenant in [&acme, &beta] {
        let source = app.create_source(tenant, &plain_source("eshop")).await;
        let id = source["id"].as_str().unwrap();
        app.create_automation(
            tenant,
            &on_webhook("Ship", id, &json!([log_step("st_ship", "ship")])),
        )
        .await;
        tokens.push(source["token"].as_str().unwrap().to_owned());
    }
    for order in ["A-1", "A-2", "A-3"] {
        app.webhook(
            &tokens[0],
            &json!({ "order": { "id": order, "total": 10 } }),
        )
        .await
        .expect(StatusCode::ACCEPTED);
    }
    // Beta's run carries the same order id: Acme never finds it.
    app.webhook(&tokens[1], &json!({ "order": { "id": "A-2" } }))
        .await
        .expect(StatusCode::ACCEPTED);
    let runs = app.wait_for_runs(&acme, "", 3).await;
    let theirs = app.wait_for_runs(&beta, "", 1).await;

    let found = app
        .post(
            &acme.key,
            "/api/runs/search",
            &json!({ "where": order_is("A-2") }),
        )
        .await
        .expect(StatusCode::OK);
    let found_ids = ids(found["items"].as_array().unwrap());
    assert_eq!(found_ids.len(), 1, "{found:#}");
    let detail = app
        .get(&acme.key, &format!("/api/runs/{}", found_ids[0]))
        .await
        .expect(StatusCode::OK);
    assert_eq!(detail["context"]["_body"]["order"]["id"], "A-2");
    assert!(ids(&runs).contains(&found_ids[0]));
    assert!(!found_ids.contains(&theirs[0]["id"].as_str().unwrap().to_owned()));
    assert_eq!(found["next_cursor"], Value::Null);

    // The listing's filters hold beside the rules.
    let none = app
        .post(
            &acme.key,
            "/api/runs/search",
            &json!({ "where": order_is("A-2"), "status": "failed" }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(none["items"], json!([]), "{none:#}");

    // Pages: every run of the three, one at a time, newest first.
    let every =
        json!({ "rules": [{ "field": "_body.order.total", "operator": "gte", "value": 10 }] });
    let mut seen = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let mut body = json!({ "where": every, "limit": 1 });
        if !cursor.is_null() {
            body["cursor"] = cursor.clone();
        }
        let page = app
            .post(&acme.key, "/api/runs/search", &body)
            .await
            .expect(StatusCode::OK);
        seen.extend(ids(page["items"].as_array().unwrap()));
        cursor = page["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(seen, ids(&runs), "newest first, each once");

    let error = app
        .post(
            &acme.key,
            "/api/runs/search",
            &json!({ "status": "failed" }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert_eq!(error["field"], "where", "{error:#}");
}
