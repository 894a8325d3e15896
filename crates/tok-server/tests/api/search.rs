//! Searching runs by what they carry (`POST /api/runs/search`): one run of
//! three is found by the order id in its webhook's body, with the listing's
//! filters beside the rules; pages go on by cursor; another tenant's runs
//! are never found; a search without rules is refused, naming `where`.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests, ids, log_step, on_webhook, plain_source};

backend_tests!(
    crate::helpers::run;
    a_search_finds_the_run_whose_body_holds_the_order,
);

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
