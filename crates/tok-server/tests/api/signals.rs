//! Signals (README.md, "Waiting for a signal"): `POST /api/signals` answers
//! 202 with the signal's id, the runs it resumed and whether it was
//! buffered; bad bodies get a 400 naming the field; an `Idempotency-Key`
//! repeat answers the first signal; one tenant's signals never reach
//! another's; an `emit` step with a `key` signals in its record
//! transaction. A signal about a ticket (`subject`) resumes only the waits
//! about that ticket, and its subject must be a ticket of the sender's
//! tenant (docs/workflows.md, "Signals about a ticket: `subject`").

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
    a_signal_resumes_only_the_runs_waiting_about_its_ticket,
    a_subject_must_be_a_ticket_of_the_senders_tenant,
    a_wait_about_the_runs_ticket_fails_in_a_run_without_one,
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
            "subject": null,
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
    // The pointer is into the whole body, as for every route.
    assert_eq!(error["path"], "/payload/note", "{error:#}");
}

/// An automation that files the order's ticket and then waits for the
/// `shipped` signal about it.
fn ships_when_told() -> Value {
    manual(
        "Ships",
        &json!([
            { "id": "st_ticket", "type": "ticket/upsert",
              "config": { "externalId": "{{orderId}}", "type": "order" } },
            { "id": "st_shipped", "type": "wait_for_event",
              "config": { "key": "shipped", "subject": "ticket", "timeout": "1h" } }
        ]),
    )
}

/// Two runs wait for `shipped`, each about its own order's ticket: a
/// signal about a third ticket, or about no ticket, resumes neither; one
/// about the first run's ticket resumes that run alone, whose wait step
/// publishes the subject; an `emit` step about the run's ticket resumes
/// the second.
async fn a_signal_resumes_only_the_runs_waiting_about_its_ticket(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.create_ticket_type(&tenant, "order", &["new", "shipped"])
        .await;
    let ships = app.create_automation(&tenant, &ships_when_told()).await;
    let mut waiting = Vec::new();
    for order in ["1", "2"] {
        let run = app
            .start_run(&tenant, &ships, &json!({ "input": { "orderId": order } }))
            .await;
        let parked = app
            .wait_for_run(&tenant, &run, |r| r["status"] == "waiting")
            .await;
        let ticket = parked["subject_ticket_id"]
            .as_str()
            .expect("a ticket")
            .to_owned();
        assert_eq!(
            (&parked["waits"][0]["key"], &parked["waits"][0]["subject"]),
            (&json!("shipped"), &json!(ticket)),
            "the wait shows the ticket it is about: {parked:#}"
        );
        assert_eq!(
            parked["blocked_by"]["detail"],
            json!({ "key": "shipped", "subject": ticket }),
            "{parked:#}"
        );
        waiting.push((run, ticket));
    }
    let [(first, first_ticket), (second, second_ticket)] = &waiting[..] else {
        unreachable!()
    };
    let other = app
        .create_ticket(&tenant, &json!({ "external_id": "3", "type": "order" }))
        .await;
    let other = other["id"].as_str().unwrap();

    for body in [
        json!({ "key": "shipped", "subject": other }),
        json!({ "key": "shipped" }),
        json!({ "key": "shipped", "subject": null }),
    ] {
        let sent = send(app, &tenant, &body).await;
        assert_eq!(
            (&sent["resumed"], &sent["buffered"], &sent["subject"]),
            (
                &json!([]),
                &json!(true),
                body.get("subject").unwrap_or(&Value::Null)
            ),
            "{body}: resumes nothing: {sent:#}"
        );
    }
    for (run, _) in &waiting {
        let detail = app
            .get(&tenant.key, &format!("/api/runs/{run}"))
            .await
            .expect(StatusCode::OK);
        assert_eq!(detail["status"], "waiting", "{detail:#}");
    }

    let sent = send(
        app,
        &tenant,
        &json!({ "key": "shipped", "subject": first_ticket, "payload": { "carrier": "dhl" } }),
    )
    .await;
    assert_eq!(
        (&sent["resumed"], &sent["subject"]),
        (&json!([first]), &json!(first_ticket)),
        "{sent:#}"
    );
    let done = app.wait_for_final(&tenant, first).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let step = &done["steps"][1];
    assert_eq!(
        (
            &step["output"]["subject"],
            &step["output"]["payload"],
            &step["output"]["signalId"]
        ),
        (
            &json!(first_ticket),
            &json!({ "carrier": "dhl" }),
            &sent["signal_id"]
        ),
        "{step:#}"
    );
    assert!(
        step["log"]
            .to_string()
            .contains(&format!("about ticket {first_ticket}")),
        "{step:#}"
    );
    let still = app
        .get(&tenant.key, &format!("/api/runs/{second}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        still["status"], "waiting",
        "another ticket's signal: {still:#}"
    );

    // An emit step about its own run's ticket (the same order's).
    let emitter = app
        .create_automation(
            &tenant,
            &manual(
                "Tells",
                &json!([
                    { "id": "st_ticket", "type": "ticket/upsert",
                      "config": { "externalId": "{{orderId}}", "type": "order" } },
                    { "id": "st_tell", "type": "emit",
                      "config": { "key": "shipped", "subject": "ticket" } }
                ]),
            ),
        )
        .await;
    let teller = app
        .start_run(&tenant, &emitter, &json!({ "input": { "orderId": "2" } }))
        .await;
    let told = app.wait_for_final(&tenant, &teller).await;
    assert_eq!(told["status"], "completed", "{told:#}");
    assert_eq!(
        (
            &told["steps"][1]["output"]["subject"],
            &told["steps"][1]["output"]["resumed"]
        ),
        (&json!(second_ticket), &json!([second])),
        "{told:#}"
    );
    let done = app.wait_for_final(&tenant, second).await;
    assert_eq!(
        done["steps"][1]["output"]["subject"],
        json!(second_ticket),
        "{done:#}"
    );
}

/// A subject is the id of one of the sender's tickets: another tenant's
/// ticket is refused exactly like an id that names no ticket (the answer
/// says nothing of the other tenant), and a subject that is no id at all
/// is a 400 naming the field. An `emit` step about a ticket that is not
/// the tenant's fails.
async fn a_subject_must_be_a_ticket_of_the_senders_tenant(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let beta = app.create_tenant("Beta").await;
    app.create_ticket_type(&beta, "order", &["new"]).await;
    let theirs = app
        .create_ticket(&beta, &json!({ "external_id": "B-1", "type": "order" }))
        .await;
    let theirs = theirs["id"].as_str().unwrap().to_owned();
    let made_up = "tk_0000000000000000000000";

    let refused = async |subject: &str| {
        let error = app
            .post(
                &acme.key,
                "/api/signals",
                &json!({ "key": "shipped", "subject": subject }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "unknown_subject");
        assert_eq!(error["field"], "subject", "{error:#}");
        error["message"].as_str().unwrap().replace(subject, "<id>")
    };
    let other_tenants = refused(&theirs).await;
    assert_eq!(
        other_tenants,
        refused(made_up).await,
        "another tenant's ticket answers like none"
    );
    assert!(
        other_tenants.contains("is not a ticket of yours") && !other_tenants.contains("Beta"),
        "{other_tenants}"
    );
    // Beta's own signal about it is fine.
    let sent = send(app, &beta, &json!({ "key": "shipped", "subject": theirs })).await;
    assert_eq!(sent["subject"], json!(theirs), "{sent:#}");

    let long = "t".repeat(201);
    for (subject, message) in [
        (
            json!(42),
            "`subject` must be a ticket id (a string), not 42",
        ),
        (json!({ "id": "tk_1" }), "`subject` must be a ticket id"),
        (json!(""), "`subject` must not be empty"),
        (json!("  "), "`subject` must not be empty"),
        (json!(long), "at most 200"),
    ] {
        let error = app
            .post(
                &acme.key,
                "/api/signals",
                &json!({ "key": "shipped", "subject": subject }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(error["field"], "subject", "{error:#}");
        assert!(
            error["message"].as_str().unwrap().contains(message),
            "expected `{message}` in {error:#}"
        );
    }

    let emitter = app
        .create_automation(
            &acme,
            &manual(
                "Tells",
                &json!([{ "id": "st_tell", "type": "emit",
                          "config": { "key": "shipped", "subject": "{{ticket}}" } }]),
            ),
        )
        .await;
    let run = app
        .start_run(&acme, &emitter, &json!({ "input": { "ticket": theirs } }))
        .await;
    let failed = app.wait_for_final(&acme, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!(
            "`subject` names ticket `{theirs}`, which does not exist"
        )),
        "{failed:#}"
    );
    let body = manual(
        "Bad",
        &json!([{ "id": "st_e", "type": "emit", "config": { "event": "x", "subject": "ticket" } }]),
    );
    let error = app
        .post(&acme.key, "/api/automations", &body)
        .await
        .expect(StatusCode::BAD_REQUEST);
    assert!(
        error["error"].to_string().contains("give `key` too"),
        "a subject without a signal is refused at save: {error:#}"
    );
}

/// A wait about `"ticket"` in a run that has no subject ticket fails its
/// step at once, saying why, instead of waiting for ever.
async fn a_wait_about_the_runs_ticket_fails_in_a_run_without_one(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app
        .create_automation(
            &tenant,
            &manual(
                "Waits",
                &json!([{ "id": "st_shipped", "type": "wait_for_event",
                          "config": { "key": "shipped", "subject": "ticket" } }]),
            ),
        )
        .await;
    let run = app.start_run(&tenant, &automation, &json!({})).await;
    let failed = app.wait_for_final(&tenant, &run).await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("the run has no subject ticket") && error.contains("ticket/upsert"),
        "{failed:#}"
    );
    assert_eq!(failed["waits"], json!([]), "{failed:#}");
}
