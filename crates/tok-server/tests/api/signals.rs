//! Signals (DESIGN §5a): `POST /api/signals` answers 202 with the signal's
//! id, the runs it resumed and whether it was buffered; bad bodies get a 400
//! naming the field; an `Idempotency-Key` repeat answers the first signal;
//! one tenant's signals never reach another's; an `emit` step with a `key`
//! signals in its record transaction.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, manual};

backend_tests!(crate::helpers::run;
    a_signal_nothing_waits_for_is_buffered,
    bad_bodies_are_400_naming_the_field,
    a_repeated_idempotency_key_answers_the_first_signal,
    signals_are_the_tenants_own,
    an_emit_step_with_a_key_sends_a_signal,
    a_payload_postgresql_cannot_store_is_refused_on_every_backend,
    a_resumed_wait_names_the_key_or_the_run_that_sent_its_signal,
);

/// A wait resumed by `POST /api/signals` publishes the key that sent it
/// (by id, never the secret), also when it took the signal from the
/// buffer; one resumed by an `emit` step names that step's run.
async fn a_resumed_wait_names_the_key_or_the_run_that_sent_its_signal(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let keys = app
        .get(&tenant.key, "/api/keys")
        .await
        .expect(StatusCode::OK);
    let me = keys["items"][0]["id"].as_str().unwrap().to_owned();
    let waiter = app
        .create_automation(
            &tenant,
            &manual(
                "Waits",
                &json!([{ "id": "st_paid", "type": "wait_for_event",
                          "config": { "key": "{{key}}", "timeout": "1h" } }]),
            ),
        )
        .await;
    let wait_for = async |key: &str| {
        app.start_run(&tenant, &waiter, &json!({ "input": { "key": key } }))
            .await
    };
    let paid = async |run: &str| {
        let run = app.wait_for_final(&tenant, run).await;
        assert_eq!(run["status"], "completed", "{run:#}");
        run["steps"][0].clone()
    };

    // Sent while the run waits.
    let run = wait_for("order-1").await;
    app.wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    send(app, &tenant, &json!({ "key": "order-1" })).await;
    let step = paid(&run).await;
    assert_eq!(
        step["output"]["actor"],
        json!({ "kind": "key", "id": me }),
        "{step:#}"
    );
    let log = step["log"].to_string();
    assert!(log.contains(&format!("from key {me}")), "{step:#}");
    assert!(!log.contains(&tenant.key), "never the secret: {step:#}");

    // Buffered before the wait began.
    send(app, &tenant, &json!({ "key": "order-2" })).await;
    let step = paid(&wait_for("order-2").await).await;
    assert_eq!(
        step["output"]["actor"],
        json!({ "kind": "key", "id": me }),
        "{step:#}"
    );

    // Sent by an emit step of another run.
    let run = wait_for("order-3").await;
    app.wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
        .await;
    let emitter = app
        .create_automation(
            &tenant,
            &manual(
                "Emits",
                &json!([{ "id": "st_emit", "type": "emit", "config": { "key": "order-3" } }]),
            ),
        )
        .await;
    let sender = app.start_run(&tenant, &emitter, &json!({})).await;
    let step = paid(&run).await;
    assert_eq!(
        step["output"]["actor"],
        json!({ "kind": "run", "runId": sender }),
        "{step:#}"
    );
}

async fn send(app: &TestApp, tenant: &Tenant, body: &Value) -> Value {
    app.post(&tenant.key, "/api/signals", body)
        .await
        .expect(StatusCode::ACCEPTED)
}

async fn a_signal_nothing_waits_for_is_buffered(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let sent = send(
        app,
        &tenant,
        &json!({ "key": "order-1", "payload": { "paid": true } }),
    )
    .await;
    assert!(
        sent["signal_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("sig_")),
        "{sent:#}"
    );
    assert_eq!(
        (&sent["resumed"], &sent["buffered"], &sent["duplicate"]),
        (&json!([]), &json!(true), &json!(false)),
        "{sent:#}"
    );
    // The payload is optional.
    let bare = send(app, &tenant, &json!({ "key": "order-1" })).await;
    assert_ne!(bare["signal_id"], sent["signal_id"], "{bare:#}");
    assert_eq!(bare["buffered"], true, "{bare:#}");
}

async fn bad_bodies_are_400_naming_the_field(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let long_key = "k".repeat(201);
    let big_payload = json!({ "blob": "x".repeat(61 * 1024) });
    let cases = [
        (json!({ "payload": {} }), "key", "`key` is missing"),
        (json!({ "key": null }), "key", "`key` is missing"),
        (json!({ "key": "" }), "key", "`key` must not be empty"),
        (json!({ "key": "   " }), "key", "`key` must not be empty"),
        (json!({ "key": 42 }), "key", "`key` must be a string"),
        (json!({ "key": long_key }), "key", "at most 200"),
        (
            json!({ "key": "k", "paylod": {} }),
            "paylod",
            "`paylod` is not a field of a signal",
        ),
        (
            json!({ "key": "k", "payload": big_payload }),
            "payload",
            "at most 61440",
        ),
    ];
    for (body, field, message) in cases {
        let error = app
            .post(&tenant.key, "/api/signals", &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(error["field"], field, "{error:#}");
        assert!(
            error["message"].as_str().unwrap().contains(message),
            "expected `{message}` in {error:#}"
        );
    }
    let error = app
        .post(&tenant.key, "/api/signals", &json!(["key", "k"]))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert!(
        error["message"].as_str().unwrap().contains("JSON object"),
        "{error:#}"
    );
    let not_json = app
        .request(
            Method::POST,
            "/api/signals",
            Some(&tenant.key),
            &[("content-type", "application/json")],
            Body::from("{\"key\": "),
        )
        .await;
    not_json.expect_error(StatusCode::BAD_REQUEST, "invalid_body");
}

async fn a_repeated_idempotency_key_answers_the_first_signal(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let keyed = |payload: Value| json!({ "key": "order-9", "payload": payload });
    let headers = [("idempotency-key", "delivery-77")];
    let first = app
        .post_with(
            &tenant.key,
            "/api/signals",
            &headers,
            &keyed(json!({ "n": 1 })),
        )
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(first["duplicate"], false, "{first:#}");
    let repeat = app
        .post_with(
            &tenant.key,
            "/api/signals",
            &headers,
            &keyed(json!({ "n": 2 })),
        )
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(
        repeat,
        json!({
            "signal_id": first["signal_id"],
            "resumed": first["resumed"],
            "buffered": first["buffered"],
            "duplicate": true,
        })
    );
    // A blank key is no key, and another key is another signal.
    for headers in [
        [("idempotency-key", "  ")],
        [("idempotency-key", "delivery-78")],
    ] {
        let other = app
            .post_with(&tenant.key, "/api/signals", &headers, &keyed(json!({})))
            .await
            .expect(StatusCode::ACCEPTED);
        assert_ne!(other["signal_id"], first["signal_id"], "{other:#}");
        assert_eq!(other["duplicate"], false, "{other:#}");
    }
}

async fn signals_are_the_tenants_own(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let beta = app.create_tenant("Beta").await;
    let headers = [("idempotency-key", "same-key")];
    let body = json!({ "key": "shared", "payload": {} });
    let a = app
        .post_with(&acme.key, "/api/signals", &headers, &body)
        .await
        .expect(StatusCode::ACCEPTED);
    let b = app
        .post_with(&beta.key, "/api/signals", &headers, &body)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_ne!(
        a["signal_id"], b["signal_id"],
        "an idempotency key is the tenant's own"
    );
    assert_eq!(
        (&a["duplicate"], &b["duplicate"]),
        (&json!(false), &json!(false))
    );

    // The admin signals only for a tenant it names.
    let admin_for_beta = app
        .post_with(
            &app.admin_key,
            "/api/signals",
            &[("x-tok-tenant", beta.id.as_str()), headers[0]],
            &body,
        )
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(
        admin_for_beta["signal_id"], b["signal_id"],
        "{admin_for_beta:#}"
    );
    assert_eq!(admin_for_beta["duplicate"], true, "{admin_for_beta:#}");
    app.post(&app.admin_key, "/api/signals", &body)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "tenant_required");
    app.request(
        Method::POST,
        "/api/signals",
        None,
        &[("content-type", "application/json")],
        Body::from(body.to_string()),
    )
    .await
    .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
}

async fn an_emit_step_with_a_key_sends_a_signal(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Notify",
                &json!([
                    { "id": "st_signal", "type": "emit",
                      "config": { "key": "order-{{orderId}}", "payload": { "paid": true } } },
                    { "id": "st_both", "type": "emit",
                      "config": { "event": "order.paid", "key": "order-{{orderId}}" } },
                ]),
            ),
        )
        .await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": { "orderId": 5 } }))
        .await;
    let run = app.wait_for_final(&tenant, &run).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(
        run["waits"],
        json!([]),
        "a finished run waits for nothing: {run:#}"
    );
    let steps = run["steps"].as_array().expect("steps");
    for step in steps {
        let output = &step["output"];
        assert!(
            output["signalId"]
                .as_str()
                .is_some_and(|id| id.starts_with("sig_")),
            "{run:#}"
        );
        assert_eq!(output["resumed"], json!([]), "nothing waited: {run:#}");
    }
    assert!(steps[0]["output"]["eventId"].is_null(), "{run:#}");
    assert!(steps[1]["output"]["eventId"].is_string(), "{run:#}");
    assert_ne!(
        steps[0]["output"]["signalId"],
        steps[1]["output"]["signalId"]
    );

    for (config, field) in [
        (json!({ "key": "" }), "key"),
        (json!({ "payload": {} }), "event"),
    ] {
        let body = manual(
            "Bad",
            &json!([{ "id": "st_e", "type": "emit", "config": config }]),
        );
        let error = app
            .post(&tenant.key, "/api/automations", &body)
            .await
            .expect(StatusCode::BAD_REQUEST);
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("`{field}`")),
            "an emit without a usable `{field}` is refused at save: {error:#}"
        );
    }
}

async fn a_payload_postgresql_cannot_store_is_refused_on_every_backend(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let body = json!({ "key": "order-1", "payload": { "note": "a\u{0}b" } });
    let error = app
        .post(&tenant.key, "/api/signals", &body)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "nul_in_json");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("payload")),
        "{error:#}"
    );
    assert_eq!(error["path"], "/note", "{error:#}");
}
