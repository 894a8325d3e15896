//! `POST /webhook/{token}`: 202 with the event id, idempotent by header or
//! body, the source's contract (400 naming the param and its path), size
//! (413), malformed JSON (400), JSON tok cannot store (400, and only that
//! webhook), unknown tokens (404); `GET` explains it all.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use tok_server::MAX_WEBHOOK_BYTES;

use crate::helpers::{
    Tenant, TestApp, backend_tests, json_request, log_step, on_webhook, plain_source,
};

backend_tests!(
    crate::helpers::run;
    accepts_an_event_and_deduplicates_a_repeated_body,
    idempotency_key_header_deduplicates_different_bodies,
    concurrent_identical_bodies_share_one_event_and_one_run,
    missing_or_mistyped_param_names_the_param_and_its_path,
    nested_params_reach_the_run,
    invalid_json_is_400,
    a_body_with_nul_is_400_and_the_webhooks_sent_with_it_are_accepted,
    body_over_256_kib_is_413,
    unknown_token_is_404,
    get_explains_method_params_and_an_example_body,
);

/// A source whose contract has a nested path through an array.
fn converter_source() -> Value {
    json!({
        "name": "converter",
        "params": [
            { "name": "docId", "path": "data.doc.id", "type": "string", "required": true },
            { "name": "firstError", "path": "errors.0.message", "type": "string", "required": true },
            { "name": "pages", "path": "data.doc.pages", "type": "integer", "required": false }
        ]
    })
}

async fn tenant_and_source(app: &TestApp, source: &Value) -> (Tenant, Value) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, source).await;
    (tenant, source)
}

fn token(source: &Value) -> &str {
    source["token"].as_str().expect("token")
}

async fn accepts_an_event_and_deduplicates_a_repeated_body(app: &TestApp) {
    let (_, source) = tenant_and_source(app, &plain_source("eshop")).await;
    let order = json!({ "kind": "order.created", "data": { "order": { "id": "5001" } } });

    let first = app
        .webhook(token(&source), &order)
        .await
        .expect(StatusCode::ACCEPTED);
    let event_id = first["event_id"].as_str().expect("event_id").to_owned();
    assert!(event_id.starts_with("evt_"), "{first:#}");
    assert_eq!(first["duplicate"], false, "{first:#}");

    let again = app
        .webhook(token(&source), &order)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(again, json!({ "event_id": event_id, "duplicate": true }));

    let other = json!({ "kind": "order.created", "data": { "order": { "id": "5002" } } });
    let second = app
        .webhook(token(&source), &other)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(second["duplicate"], false, "{second:#}");
    assert_ne!(
        second["event_id"], event_id,
        "a different body is a different event"
    );
}

async fn idempotency_key_header_deduplicates_different_bodies(app: &TestApp) {
    let (_, source) = tenant_and_source(app, &plain_source("eshop")).await;
    let key = [("idempotency-key", "order-5001")];

    let first = app
        .webhook_with(token(&source), &key, &json!({ "n": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(first["duplicate"], false, "{first:#}");

    let again = app
        .webhook_with(token(&source), &key, &json!({ "n": 2 }))
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(
        again,
        json!({ "event_id": first["event_id"], "duplicate": true })
    );

    // The header, not the body, is the key: the first body under another key is new.
    let other = [("idempotency-key", "order-5002")];
    let third = app
        .webhook_with(token(&source), &other, &json!({ "n": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(third["duplicate"], false, "{third:#}");
    assert_ne!(third["event_id"], first["event_id"]);
}

async fn concurrent_identical_bodies_share_one_event_and_one_run(app: &TestApp) {
    let (tenant, source) = tenant_and_source(app, &plain_source("eshop")).await;
    let steps = json!([log_step("st_a", "order {{orderId}}")]);
    let definition = on_webhook("Once", source["id"].as_str().unwrap(), &steps);
    let automation = app.create_automation(&tenant, &definition).await;

    // A sender retrying impatiently: the same body eight times at once.
    let uri = format!("/webhook/{}", token(&source));
    let body = json!({ "orderId": "5001" });
    let requests = (0..8)
        .map(|_| json_request(Method::POST, &uri, &[], &body))
        .collect();
    let replies = app.send_together(requests).await;
    let bodies: Vec<Value> = replies
        .into_iter()
        .map(|r| r.expect(StatusCode::ACCEPTED))
        .collect();
    let event_id = &bodies[0]["event_id"];
    assert!(
        bodies.iter().all(|b| &b["event_id"] == event_id),
        "one event for all: {bodies:#?}"
    );
    let firsts = bodies.iter().filter(|b| b["duplicate"] == false).count();
    assert_eq!(firsts, 1, "exactly one is not a duplicate: {bodies:#?}");

    let runs = app
        .wait_for_runs(&tenant, &format!("automation={automation}"), 1)
        .await;
    assert_eq!(&runs[0]["event_id"], event_id);
    // A later, different event proves the first was dispatched once and only once.
    app.webhook(token(&source), &json!({ "orderId": "5002" }))
        .await
        .expect(StatusCode::ACCEPTED);
    app.wait_for_runs(&tenant, &format!("automation={automation}"), 2)
        .await;
}

async fn missing_or_mistyped_param_names_the_param_and_its_path(app: &TestApp) {
    let (_, source) = tenant_and_source(app, &converter_source()).await;

    let no_errors = json!({ "data": { "doc": { "id": "D-7" } }, "errors": [] });
    let error = app
        .webhook(token(&source), &no_errors)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "missing_param");
    assert_eq!(error["param"], "firstError", "{error:#}");
    assert_eq!(error["path"], "errors.0.message", "{error:#}");
    assert_eq!(
        error["message"],
        "required param `firstError` is missing: looked for it at `errors.0.message`"
    );

    let null_id = json!({ "data": { "doc": { "id": null } }, "errors": [{ "message": "late" }] });
    let error = app
        .webhook(token(&source), &null_id)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "missing_param");
    assert_eq!(
        (&error["param"], &error["path"]),
        (&json!("docId"), &json!("data.doc.id"))
    );

    let wrong = json!({ "data": { "doc": { "id": "D-7", "pages": "three" } }, "errors": [{ "message": "late" }] });
    let error = app
        .webhook(token(&source), &wrong)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "wrong_type");
    assert_eq!(
        (&error["param"], &error["path"]),
        (&json!("pages"), &json!("data.doc.pages"))
    );
    assert_eq!(error["expected"], "integer", "{error:#}");

    // Extra fields are fine, and an optional param may be absent.
    let good = json!({ "data": { "doc": { "id": "D-7" } }, "errors": [{ "message": "late", "code": 9 }], "extra": true });
    app.webhook(token(&source), &good)
        .await
        .expect(StatusCode::ACCEPTED);
}

async fn nested_params_reach_the_run(app: &TestApp) {
    let (tenant, source) = tenant_and_source(app, &converter_source()).await;
    let steps = json!([log_step(
        "st_log",
        "{{docId}} failed: {{firstError}} (body says {{_body.errors.0.message}})"
    )]);
    let automation = app
        .create_automation(
            &tenant,
            &on_webhook("Converter errors", source["id"].as_str().unwrap(), &steps),
        )
        .await;

    let body =
        json!({ "data": { "doc": { "id": "D-7" } }, "errors": [{ "message": "font missing" }] });
    let accepted = app
        .webhook(token(&source), &body)
        .await
        .expect(StatusCode::ACCEPTED);

    let runs = app
        .wait_for_runs(&tenant, &format!("automation={automation}"), 1)
        .await;
    assert_eq!(runs[0]["event_id"], accepted["event_id"]);
    assert_eq!(runs[0]["status"], "completed", "{:#}", runs[0]);
    let run = app
        .get(
            &tenant.key,
            &format!("/api/runs/{}", runs[0]["id"].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        run["steps"][0]["log"],
        json!(["info: D-7 failed: font missing (body says font missing)"])
    );
}

async fn invalid_json_is_400(app: &TestApp) {
    let (_, source) = tenant_and_source(app, &plain_source("eshop")).await;
    let uri = format!("/webhook/{}", token(&source));
    let headers = [("content-type", "application/json")];
    let reply = app
        .request(
            Method::POST,
            &uri,
            None,
            &headers,
            Body::from("{\"kind\": \"order\",\n oops}"),
        )
        .await;
    let error = reply.expect_error(StatusCode::BAD_REQUEST, "invalid_json");
    assert_eq!(error["line"], 2, "{error:#}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("the body is not valid JSON"),
        "{error:#}"
    );

    let empty = app
        .request(Method::POST, &uri, None, &headers, Body::empty())
        .await;
    empty.expect_error(StatusCode::BAD_REQUEST, "invalid_json");
}

/// A JSON object of exactly `size` bytes.
fn json_of_size(size: usize) -> String {
    let frame = "{\"pad\":\"\"}".len();
    format!("{{\"pad\":\"{}\"}}", "x".repeat(size - frame))
}

/// U+0000 in a string is valid JSON that PostgreSQL cannot store: that one
/// webhook is refused, on every backend, and the webhooks of any tenant sent
/// at the same moment (sharing its group commit) are accepted.
async fn a_body_with_nul_is_400_and_the_webhooks_sent_with_it_are_accepted(app: &TestApp) {
    let (_, mine) = tenant_and_source(app, &plain_source("eshop")).await;
    let other = app.create_tenant("Globex").await;
    let theirs = app.create_source(&other, &plain_source("crm")).await;
    let mut requests = Vec::new();
    for i in 0..40 {
        let source = if i % 2 == 0 { &mine } else { &theirs };
        let uri = format!("/webhook/{}", token(source));
        requests.push(json_request(Method::POST, &uri, &[], &json!({ "n": i })));
        if i == 20 {
            let nul = json!({ "customer": { "name": "Ann\u{0}" } });
            let uri = format!("/webhook/{}", token(&mine));
            requests.push(json_request(Method::POST, &uri, &[], &nul));
        }
    }
    let mut replies = app.send_together(requests).await;
    let refused = replies.remove(21);
    let error = refused.expect_error(StatusCode::BAD_REQUEST, "nul_in_json");
    assert_eq!(error["path"], "/customer/name", "{error:#}");
    assert!(
        error["message"].as_str().unwrap().contains("U+0000"),
        "{error:#}"
    );
    for reply in replies {
        let accepted = reply.expect(StatusCode::ACCEPTED);
        assert_eq!(accepted["duplicate"], false, "{accepted:#}");
    }
}

async fn body_over_256_kib_is_413(app: &TestApp) {
    let (_, source) = tenant_and_source(app, &plain_source("eshop")).await;
    let uri = format!("/webhook/{}", token(&source));
    let json = [("content-type", "application/json")];

    let at_limit = json_of_size(MAX_WEBHOOK_BYTES);
    assert_eq!(at_limit.len(), 256 * 1024);
    let reply = app
        .request(Method::POST, &uri, None, &json, Body::from(at_limit))
        .await;
    reply.expect(StatusCode::ACCEPTED);

    // Once without Content-Length (the body is read up to the limit) and
    // once with it (rejected before reading).
    let over = json_of_size(MAX_WEBHOOK_BYTES + 1);
    let reply = app
        .request(Method::POST, &uri, None, &json, Body::from(over.clone()))
        .await;
    let error = reply.expect_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert_eq!(error["limit"], MAX_WEBHOOK_BYTES, "{error:#}");

    let length = over.len().to_string();
    let headers = [
        ("content-type", "application/json"),
        ("content-length", length.as_str()),
    ];
    let reply = app
        .request(Method::POST, &uri, None, &headers, Body::from(over))
        .await;
    reply.expect_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
}

async fn unknown_token_is_404(app: &TestApp) {
    tenant_and_source(app, &plain_source("eshop")).await;
    let reply = app.webhook("no-such-token", &json!({ "kind": "x" })).await;
    reply.expect_error(StatusCode::NOT_FOUND, "unknown_webhook");
    let help = app
        .request(
            Method::GET,
            "/webhook/no-such-token",
            None,
            &[],
            Body::empty(),
        )
        .await;
    help.expect_error(StatusCode::NOT_FOUND, "unknown_webhook");
    // A token no webhook can have (U+0000, which PostgreSQL cannot even
    // compare, or bytes that are not UTF-8) names nothing, on both backends.
    let (_, source) = tenant_and_source(app, &plain_source("shop")).await;
    for bad in ["%00", "%FF%FE"] {
        for uri in [
            format!("/webhook/{}{bad}", token(&source)),
            format!("/webhook/{bad}{}", token(&source)),
        ] {
            let body = Body::from(json!({ "kind": "x" }).to_string());
            let reply = app.request(Method::POST, &uri, None, &[], body).await;
            let error = reply.expect_error(StatusCode::NOT_FOUND, "not_found");
            assert!(
                error["message"].as_str().unwrap().contains("/webhook/"),
                "{error:#}"
            );
        }
    }
}

async fn get_explains_method_params_and_an_example_body(app: &TestApp) {
    let (_, source) = tenant_and_source(app, &converter_source()).await;
    let url = format!("{}/webhook/{}", crate::helpers::PUBLIC_URL, token(&source));
    assert_eq!(source["url"], url, "the API shows the full URL: {source:#}");

    let uri = format!("/webhook/{}", token(&source));
    let help = app
        .request(Method::GET, &uri, None, &[], Body::empty())
        .await
        .expect(StatusCode::OK);
    assert_eq!(help["method"], "POST", "{help:#}");
    assert_eq!(help["url"], url, "{help:#}");
    assert_eq!(
        help["params"],
        json!([
            { "name": "docId", "path": "data.doc.id", "type": "string", "required": true },
            { "name": "firstError", "path": "errors.0.message", "type": "string", "required": true },
            { "name": "pages", "path": "data.doc.pages", "type": "integer", "required": false }
        ])
    );
    let example = &help["example"];
    assert_eq!(
        *example,
        json!({ "data": { "doc": { "id": "<docId>", "pages": 1 } }, "errors": [{ "message": "<firstError>" }] })
    );

    // The example satisfies the contract it describes.
    app.webhook(token(&source), example)
        .await
        .expect(StatusCode::ACCEPTED);
}
