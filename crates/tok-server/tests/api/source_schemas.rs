//! A source's JSON Schema (`schema`, draft 2020-12): a body that meets it is
//! accepted, one that does not is a 400 `schema_violation` listing each
//! failing place (a JSON pointer) and rule, and nothing of it is stored; a
//! schema that does not compile is refused when it is saved, naming where;
//! `PATCH` changes or removes it. A schema that would cost too much (a
//! 1.5 KB of doubling `$defs`, which expands to a million
//! subschemas) is refused when it is saved, naming where and the limit,
//! while a tree that refers to itself is kept and checks bodies; a body
//! whose check would cost too much is refused unchecked.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    a_body_is_checked_against_the_sources_schema,
    a_schema_that_does_not_compile_is_refused_naming_where,
    a_schema_that_expands_past_the_limit_is_refused_at_save,
    a_tree_schema_that_refers_to_itself_is_kept_and_checks_bodies,
    a_body_whose_check_costs_too_much_is_refused_unchecked,
    a_costly_schema_kept_before_it_was_weighed_accepts_nothing,
);

/// A hostile schema: each of `levels` definitions refers twice to the
/// one before (`d_i = {"allOf": [{"$ref": d_(i-1)}, {"$ref": d_(i-1)}]}`).
pub(crate) fn doubling_schema(levels: usize) -> Value {
    let mut defs = serde_json::Map::new();
    defs.insert("d_0".into(), json!({ "type": "object" }));
    for i in 1..=levels {
        let before = format!("#/$defs/d_{}", i - 1);
        defs.insert(
            format!("d_{i}"),
            json!({ "allOf": [{ "$ref": before }, { "$ref": before }] }),
        );
    }
    json!({ "$defs": defs, "$ref": format!("#/$defs/d_{levels}") })
}

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

async fn a_schema_that_expands_past_the_limit_is_refused_at_save(app: &TestApp) {
    let tenant = app.create_tenant("Mallory").await;
    let schema = doubling_schema(20);
    let size = schema.to_string().len();
    assert!(size < 1600, "a schema of 1.5 KB: {size} bytes");
    let error = app
        .post(
            &tenant.key,
            "/api/sources",
            &json!({ "name": "bomb", "schema": schema }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_schema");
    assert_eq!(error["field"], "schema", "{error:#}");
    // The first definition whose expansion passes the limit: d_12 expands
    // to 4·2^12 - 3 subschemas.
    assert_eq!(error["path"], "/$defs/d_12", "{error:#}");
    assert_eq!(error["limit"], 10_000, "{error:#}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("/$defs/d_12")
            && message.contains("16381")
            && message.contains("10000")
            && message.contains("$ref"),
        "{message}"
    );

    // Nor can a source be changed to it.
    let source = app
        .create_source(
            &tenant,
            &json!({ "name": "ok", "schema": doubling_schema(8) }),
        )
        .await;
    let id = source["id"].as_str().unwrap();
    app.patch(
        &tenant.key,
        &format!("/api/sources/{id}"),
        &json!({ "schema": doubling_schema(30) }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "invalid_schema");
    let kept = app
        .get(&tenant.key, &format!("/api/sources/{id}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        kept["schema"],
        doubling_schema(8),
        "the schema before stays"
    );

    // The one kept (8 levels, 1,022 subschemas) checks bodies as it says.
    let token = source["token"].as_str().unwrap();
    app.stop_engine().await;
    app.webhook(token, &json!({ "any": "object" }))
        .await
        .expect(StatusCode::ACCEPTED);
    let error = app
        .webhook(token, &json!(["not", "an", "object"]))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "schema_violation");
    assert_eq!(error["errors"][0]["rule"], "type", "{error:#}");
}

/// A comment thread: each comment's replies are comments.
fn thread_schema() -> Value {
    json!({
        "type": "object",
        "required": ["author", "text"],
        "properties": {
            "author": { "type": "string" },
            "text": { "type": "string", "maxLength": 200 },
            "replies": { "type": "array", "items": { "$ref": "#" } }
        }
    })
}

async fn a_tree_schema_that_refers_to_itself_is_kept_and_checks_bodies(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(
            &tenant,
            &json!({ "name": "threads", "schema": thread_schema() }),
        )
        .await;
    assert_eq!(source["schema"], thread_schema());
    let token = source["token"].as_str().unwrap();
    app.stop_engine().await;

    // Forty levels of replies, each with a sibling.
    let leaf = json!({ "author": "b", "text": "me too" });
    let mut thread = leaf.clone();
    for i in 0..40 {
        thread = json!({ "author": format!("a{i}"), "text": "hi", "replies": [thread, leaf] });
    }
    app.webhook(token, &thread)
        .await
        .expect(StatusCode::ACCEPTED);

    // A reply deep down without its text.
    let mut broken = json!({ "author": "c" });
    for _ in 0..10 {
        broken = json!({ "author": "a", "text": "hi", "replies": [leaf, broken] });
    }
    let error = app
        .webhook(token, &broken)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "schema_violation");
    let path = error["errors"][0]["path"].as_str().unwrap();
    assert_eq!(path, "/replies/1".repeat(10), "{error:#}");
    assert_eq!(error["errors"][0]["rule"], "required", "{error:#}");
}

async fn a_body_whose_check_costs_too_much_is_refused_unchecked(app: &TestApp) {
    let tenant = app.create_tenant("Mallory").await;
    // Each level of the body is checked twice over: 2^depth checks.
    let schema = json!({ "allOf": [
        { "items": { "$ref": "#" } },
        { "items": { "$ref": "#" } }
    ] });
    let source = app
        .create_source(&tenant, &json!({ "name": "twice", "schema": schema }))
        .await;
    let token = source["token"].as_str().unwrap();
    app.stop_engine().await;

    let mut shallow = json!([]);
    for _ in 0..4 {
        shallow = json!([shallow]);
    }
    app.webhook(token, &shallow)
        .await
        .expect(StatusCode::ACCEPTED);

    // 60 levels: 2^60 checks, were it checked.
    let mut deep = json!([]);
    for _ in 0..60 {
        deep = json!([deep]);
    }
    let error = app
        .webhook(token, &deep)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "schema_too_costly");
    assert_eq!(error["limit"], 1_000_000, "{error:#}");
    let queue = app
        .get(&tenant.key, "/api/dashboard/queue")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        queue["pending_events"], 1,
        "only the shallow body: {queue:#}"
    );
}

/// A schema an earlier version kept (written here to the store directly,
/// past the API's checks) that costs too much is not used: the source's
/// webhooks are refused until it is changed, none is let through unchecked.
async fn a_costly_schema_kept_before_it_was_weighed_accepts_nothing(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(&tenant, &json!({ "name": "old", "schema": true }))
        .await;
    let id = source["id"].as_str().unwrap();
    let token = source["token"].as_str().unwrap();
    app.state
        .engine
        .store()
        .update_source(
            &tok_core::ids::TenantId::from(tenant.id.as_str()),
            &tok_core::ids::SourceId::from(id),
            tok_store::SourcePatch {
                schema: Some(Some(doubling_schema(20))),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    app.stop_engine().await;
    let error = app
        .webhook(token, &json!({ "a": 1 }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_schema");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("PATCH /api/sources/{id}")),
        "{message}"
    );
    assert!(message.contains("/$defs/d_12"), "{message}");
    // Changed, it takes bodies again.
    app.patch(
        &tenant.key,
        &format!("/api/sources/{id}"),
        &json!({ "schema": { "type": "object" } }),
    )
    .await
    .expect(StatusCode::OK);
    app.webhook(token, &json!({ "a": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);
}
