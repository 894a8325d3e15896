//! A source's JSON Schema (`schema`, draft 2020-12): a body that meets it is
//! accepted, one that does not is a 400 `schema_violation` listing each
//! failing place (a JSON pointer) and rule, and nothing of it is stored; a
//! schema that does not compile is refused when it is saved, naming where;
//! `PATCH` changes or removes it.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    a_body_is_checked_against_the_sources_schema,
    a_schema_that_does_not_compile_is_refused_naming_where,
);

fn order_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["id", "amount"],
        "properties": {
            "id": { "type": "string", "pattern": "^ord_" },
            "amount": { "type": "integer", "minimum": 1 },
            "email": { "type": "string", "format": "email" },
            "items": { "type": "array", "items": { "$ref": "#/$defs/item" } }
        },
        "$defs": { "item": { "type": "object", "required": ["sku"] } }
    })
}

async fn a_body_is_checked_against_the_sources_schema(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(
            &tenant,
            &json!({ "name": "orders", "schema": order_schema(),
                     "params": [{ "name": "orderId", "path": "id", "type": "string", "required": true }] }),
        )
        .await;
    assert_eq!(source["schema"], order_schema(), "{source:#}");
    let (id, token) = (
        source["id"].as_str().unwrap(),
        source["token"].as_str().unwrap(),
    );
    app.stop_engine().await;

    app.webhook(
        token,
        &json!({ "id": "ord_1", "amount": 5, "items": [{ "sku": "a" }] }),
    )
    .await
    .expect(StatusCode::ACCEPTED);

    let error = app
        .webhook(
            token,
            &json!({ "id": "inv_1", "amount": 0, "email": "nobody", "items": [{ "sku": "a" }, { "qty": 1 }] }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "schema_violation");
    let mut failures: Vec<(String, String)> = error["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(
                e["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{e:#}"
            );
            (
                e["path"].as_str().unwrap().to_owned(),
                e["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    failures.sort();
    assert_eq!(
        failures,
        [
            ("/amount".to_owned(), "minimum".to_owned()),
            ("/email".to_owned(), "format".to_owned()),
            ("/id".to_owned(), "pattern".to_owned()),
            ("/items/1".to_owned(), "required".to_owned()),
        ],
        "{error:#}"
    );
    assert!(
        error["message"].as_str().unwrap().contains("4 failures"),
        "{error:#}"
    );
    // The whole body's rule is said to be the body's.
    let whole = app
        .webhook(token, &json!(["not", "an", "order"]))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "schema_violation");
    assert_eq!(whole["errors"][0]["path"], "", "{whole:#}");
    assert_eq!(whole["errors"][0]["rule"], "type", "{whole:#}");
    let queue = app
        .get(&tenant.key, "/api/dashboard/queue")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        queue["pending_events"], 1,
        "only the valid body is kept: {queue:#}"
    );

    // Without its schema, the source takes what its params allow.
    let changed = app
        .patch(
            &tenant.key,
            &format!("/api/sources/{id}"),
            &json!({ "schema": null }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(changed["schema"], Value::Null, "{changed:#}");
    app.webhook(token, &json!({ "id": "inv_1", "amount": 0 }))
        .await
        .expect(StatusCode::ACCEPTED);
    // And with a new one, at once.
    app.patch(
        &tenant.key,
        &format!("/api/sources/{id}"),
        &json!({ "schema": { "required": ["currency"] } }),
    )
    .await
    .expect(StatusCode::OK);
    let error = app
        .webhook(token, &json!({ "id": "inv_2", "amount": 0 }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "schema_violation");
    assert_eq!(error["errors"][0]["rule"], "required", "{error:#}");
}

async fn a_schema_that_does_not_compile_is_refused_naming_where(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let cases = [
        (
            json!({ "properties": { "amount": { "type": "money" } } }),
            "/properties/amount/type",
        ),
        (json!({ "minimum": "five" }), "/minimum"),
        (json!({ "pattern": "(" }), ""),
    ];
    for (schema, path) in cases {
        let error = app
            .post(
                &tenant.key,
                "/api/sources",
                &json!({ "name": "bad", "schema": schema }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_schema");
        assert_eq!(error["field"], "schema", "{error:#}");
        if !path.is_empty() {
            assert_eq!(error["path"], path, "{error:#}");
        }
    }
    // Nothing is fetched from outside the schema.
    let error = app
        .post(
            &tenant.key,
            "/api/sources",
            &json!({ "name": "remote", "schema": { "$ref": "https://example.com/order.json" } }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_schema");
    assert!(
        error["message"].as_str().unwrap().contains("not fetched"),
        "{error:#}"
    );
    // A change is checked alike.
    let source = app
        .create_source(&tenant, &json!({ "name": "ok", "schema": true }))
        .await;
    app.patch(
        &tenant.key,
        &format!("/api/sources/{}", source["id"].as_str().unwrap()),
        &json!({ "schema": { "type": 5 } }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "invalid_schema");
    let listed = app
        .get(&tenant.key, "/api/sources")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed:#}");
    assert_eq!(listed["items"][0]["schema"], true);
}
