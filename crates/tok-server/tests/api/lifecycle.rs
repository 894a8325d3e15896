//! The whole life of automations and sources: a deleted automation starts
//! no run while its runs in flight finish and its versions stay readable;
//! a resource in use is not deleted (409 `in_use` naming its users); a
//! source changes, rotates its token (the old URL answers within the
//! overlap and 404 after) and its signing secret (either accepted during
//! the overlap), and is deleted once no automation names it.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::helpers::{
    Reply, Tenant, TestApp, backend_tests, log_step, manual, ms, on_webhook, plain_source,
};

backend_tests!(
    crate::helpers::run;
    a_deleted_automation_starts_no_run_while_its_run_in_flight_completes,
    an_automation_that_another_starts_is_not_deleted,
    a_rotated_token_answers_within_the_overlap_and_404_after,
    a_rotated_secret_is_accepted_beside_the_new_one_during_the_overlap,
    a_source_changes_and_is_deleted_once_no_automation_names_it,
);

async fn delete(app: &TestApp, tenant: &Tenant, uri: &str) -> Reply {
    app.request(Method::DELETE, uri, Some(&tenant.key), &[], Body::empty())
        .await
}

async fn a_deleted_automation_starts_no_run_while_its_run_in_flight_completes(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let (source_id, token) = (
        source["id"].as_str().unwrap(),
        source["token"].as_str().unwrap(),
    );
    let waits = on_webhook(
        "Waits for payment",
        source_id,
        &json!([
            { "id": "st_paid", "type": "wait_for_event", "config": { "key": "paid-{{n}}" } },
            log_step("st_done", "paid {{n}}"),
        ]),
    );
    let deleted = app.create_automation(&tenant, &waits).await;
    // A second automation on the same source shows when an event was
    // dispatched: its run exists once the deleted one's would.
    let witness = app
        .create_automation(
            &tenant,
            &on_webhook(
                "Witness",
                source_id,
                &json!([log_step("st_w", "saw {{n}}")]),
            ),
        )
        .await;

    app.webhook(token, &json!({ "n": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);
    let in_flight = app
        .poll("the run in flight", async || {
            let page = app
                .get(
                    &tenant.key,
                    &format!("/api/dashboard/runs?automation={deleted}"),
                )
                .await
                .expect(StatusCode::OK);
            let run = page["items"].get(0).cloned().ok_or(())?;
            (run["status"] == "waiting")
                .then(|| run["id"].as_str().unwrap().to_owned())
                .ok_or(())
        })
        .await;

    delete(app, &tenant, &format!("/api/automations/{deleted}"))
        .await
        .expect(StatusCode::NO_CONTENT);

    // Gone from the listing; still readable by its id and version, as its
    // runs name it.
    let listed = app
        .get(&tenant.key, "/api/automations")
        .await
        .expect(StatusCode::OK);
    let names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Witness"], "{listed:#}");
    let shown = app
        .get(&tenant.key, &format!("/api/automations/{deleted}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(shown["status"], "archived", "{shown:#}");
    app.get(
        &tenant.key,
        &format!("/api/automations/{deleted}/versions/1"),
    )
    .await
    .expect(StatusCode::OK);

    // It changes no more, and starts nothing by hand.
    for reply in [
        app.put(&tenant.key, &format!("/api/automations/{deleted}"), &waits)
            .await,
        app.post(
            &tenant.key,
            &format!("/api/automations/{deleted}/resume"),
            &json!({}),
        )
        .await,
        app.post(
            &tenant.key,
            &format!("/api/automations/{deleted}/runs"),
            &json!({ "input": {} }),
        )
        .await,
        delete(app, &tenant, &format!("/api/automations/{deleted}")).await,
    ] {
        let refused = reply.expect_error(StatusCode::CONFLICT, "automation_archived");
        assert!(
            refused["message"].as_str().unwrap().contains("was deleted"),
            "{refused:#}"
        );
    }

    // A new event reaches the witness only.
    let second = app
        .webhook(token, &json!({ "n": 2 }))
        .await
        .expect(StatusCode::ACCEPTED);
    let seen = app
        .wait_for_runs(&tenant, &format!("automation={witness}"), 2)
        .await;
    assert!(
        seen.iter().any(|r| r["event_id"] == second["event_id"]),
        "{seen:#?}"
    );
    let runs = app
        .get(
            &tenant.key,
            &format!("/api/dashboard/runs?automation={deleted}"),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        runs["items"].as_array().unwrap().len(),
        1,
        "the deleted automation started no run: {runs:#}"
    );

    // Its run in flight still finishes, on its own version.
    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": "paid-1", "payload": {} }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    let done = app.wait_for_final(&tenant, &in_flight).await;
    assert_eq!(done["status"], "completed", "{done:#}");
}

async fn an_automation_that_another_starts_is_not_deleted(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let child = app
        .create_automation(
            &tenant,
            &manual("Pack order", &json!([log_step("st_p", "packing")])),
        )
        .await;
    let parent = app
        .create_automation(
            &tenant,
            &manual(
                "Take order",
                &json!([{ "id": "st_pack", "type": "run_workflow",
                          "config": { "automation": "Pack order" } }]),
            ),
        )
        .await;
    let refused = delete(app, &tenant, &format!("/api/automations/{child}"))
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "automation", "id": parent, "name": "Take order",
                 "path": "steps.0.config.automation" }]),
        "{refused:#}"
    );
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("automation `Pack order`")
            && message.contains("automation `Take order` at steps.0.config.automation"),
        "{message}"
    );
    // Once the parent is gone, the child goes too.
    delete(app, &tenant, &format!("/api/automations/{parent}"))
        .await
        .expect(StatusCode::NO_CONTENT);
    delete(app, &tenant, &format!("/api/automations/{child}"))
        .await
        .expect(StatusCode::NO_CONTENT);
}

async fn a_rotated_token_answers_within_the_overlap_and_404_after(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let id = source["id"].as_str().unwrap();
    let old = source["token"].as_str().unwrap().to_owned();
    assert_eq!(source["previous_token_expires_at"], Value::Null);

    let rotated = app
        .post(
            &tenant.key,
            &format!("/api/sources/{id}/rotate"),
            &json!({ "overlap": "2s" }),
        )
        .await
        .expect(StatusCode::OK);
    let new = rotated["token"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    assert!(
        rotated["url"].as_str().unwrap().ends_with(&new),
        "{rotated:#}"
    );
    let until = ms(&rotated["previous_token_expires_at"]).expect("the overlap's end");

    // Within the overlap both URLs take webhooks, for the same source.
    for token in [&old, &new] {
        app.webhook(token, &json!({ "n": 1 }))
            .await
            .expect(StatusCode::ACCEPTED);
    }
    // After it, the old one names nothing.
    let refused = app
        .poll("the old URL to close", async || {
            let reply = app.webhook(&old, &json!({ "n": 2 })).await;
            (reply.status == StatusCode::NOT_FOUND)
                .then_some(reply)
                .ok_or(())
        })
        .await
        .expect_error(StatusCode::NOT_FOUND, "unknown_webhook");
    assert!(
        tok_store::now_ms() >= until,
        "the old URL closed before the overlap's end: {refused:#}"
    );
    app.webhook(&new, &json!({ "n": 3 }))
        .await
        .expect(StatusCode::ACCEPTED);

    // Without an overlap, the URL before closes at once.
    let again = app
        .post(
            &tenant.key,
            &format!("/api/sources/{id}/rotate"),
            &json!({}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(again["previous_token_expires_at"], Value::Null, "{again:#}");
    app.webhook(&new, &json!({ "n": 4 }))
        .await
        .expect_error(StatusCode::NOT_FOUND, "unknown_webhook");
    app.webhook(again["token"].as_str().unwrap(), &json!({ "n": 5 }))
        .await
        .expect(StatusCode::ACCEPTED);

    for (body, field) in [
        (json!({ "overlap": "8d" }), "at most 7d"),
        (json!({ "overlap": "soon" }), "`overlap`"),
        (json!({ "token": false }), "nothing to rotate"),
        (json!({ "secret": secret("new") }), "not signed"),
        (json!({ "tokn": true }), "tokn"),
    ] {
        let refused = app
            .post(&tenant.key, &format!("/api/sources/{id}/rotate"), &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert!(
            refused["message"].as_str().unwrap().contains(field),
            "{body}: {refused:#}"
        );
    }
}

fn secret(seed: &str) -> String {
    format!(
        "whsec_{}",
        STANDARD.encode(format!("a-key-of-the-sender-{seed}"))
    )
}

fn signed(secret: &str, id: &str, body: &str) -> [(&'static str, String); 3] {
    let now = tok_store::now_ms() / 1000;
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{now}.{body}").as_bytes());
    [
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", now.to_string()),
        (
            "webhook-signature",
            format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())),
        ),
    ]
}

async fn send_signed(app: &TestApp, token: &str, secret: &str, id: &str) -> Reply {
    let body = json!({ "id": id });
    let headers = signed(secret, id, &body.to_string());
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    app.webhook_with(token, &headers, &body).await
}

async fn a_rotated_secret_is_accepted_beside_the_new_one_during_the_overlap(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(
            &tenant,
            &json!({ "name": "shop", "params": [], "secret": secret("one") }),
        )
        .await;
    let (id, token) = (
        source["id"].as_str().unwrap(),
        source["token"].as_str().unwrap(),
    );

    let rotated = app
        .post(
            &tenant.key,
            &format!("/api/sources/{id}/rotate"),
            &json!({ "token": false, "secret": secret("two"), "overlap": "1h" }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(rotated["token"], token, "the URL stays: {rotated:#}");
    assert_eq!(rotated["previous_token_expires_at"], Value::Null);
    assert!(
        ms(&rotated["previous_secret_expires_at"]).is_some(),
        "{rotated:#}"
    );
    let text = rotated.to_string();
    assert!(
        !text.contains(&secret("one")) && !text.contains(&secret("two")),
        "no secret is shown: {text}"
    );

    send_signed(app, token, &secret("one"), "msg_1")
        .await
        .expect(StatusCode::ACCEPTED);
    send_signed(app, token, &secret("two"), "msg_2")
        .await
        .expect(StatusCode::ACCEPTED);
    send_signed(app, token, &secret("other"), "msg_3")
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_invalid");

    // A rotation without an overlap keeps only the newest secret.
    app.post(
        &tenant.key,
        &format!("/api/sources/{id}/rotate"),
        &json!({ "token": false, "secret": secret("three") }),
    )
    .await
    .expect(StatusCode::OK);
    for old in ["one", "two"] {
        send_signed(app, token, &secret(old), &format!("msg_{old}"))
            .await
            .expect_error(StatusCode::UNAUTHORIZED, "signature_invalid");
    }
    send_signed(app, token, &secret("three"), "msg_4")
        .await
        .expect(StatusCode::ACCEPTED);
}

async fn a_source_changes_and_is_deleted_once_no_automation_names_it(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(
            &tenant,
            &json!({ "name": "eshop", "params": [], "rate_limit": 5 }),
        )
        .await;
    let (id, token) = (
        source["id"].as_str().unwrap(),
        source["token"].as_str().unwrap(),
    );
    let uri = format!("/api/sources/{id}");

    let changed = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "name": "e-shop", "rate_limit": null, "critical": true,
                     "params": [{ "name": "orderId", "path": "order.id", "type": "string",
                                  "required": true }] }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(changed["name"], "e-shop");
    assert_eq!(changed["rate_limit"], Value::Null);
    assert_eq!(changed["critical"], true);
    assert_eq!(changed["token"], token, "a change keeps the URL");
    // The new contract holds at the next webhook.
    app.webhook(token, &json!({ "order": {} }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "missing_param");

    for (body, code, says) in [
        (json!({ "name": " " }), "invalid_body", "`name`"),
        (json!({ "rate_limit": 0 }), "invalid_body", "`rate_limit`"),
        (json!({ "secret": "whsec_x" }), "invalid_body", "secret"),
        (
            json!({ "params": [{ "name": "a", "path": "", "type": "string" }] }),
            "invalid_params",
            "",
        ),
    ] {
        let refused = app
            .patch(&tenant.key, &uri, &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, code);
        assert!(
            refused["message"].as_str().unwrap().contains(says),
            "{body}: {refused:#}"
        );
    }

    let automation = app
        .create_automation(
            &tenant,
            &on_webhook("Orders", id, &json!([log_step("st_a", "order")])),
        )
        .await;
    let refused = delete(app, &tenant, &uri)
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "automation", "id": automation, "name": "Orders",
                 "path": "trigger.source" }]),
        "{refused:#}"
    );
    delete(app, &tenant, &format!("/api/automations/{automation}"))
        .await
        .expect(StatusCode::NO_CONTENT);
    delete(app, &tenant, &uri)
        .await
        .expect(StatusCode::NO_CONTENT);
    app.get(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.webhook(token, &json!({ "order": { "id": "1" } }))
        .await
        .expect_error(StatusCode::NOT_FOUND, "unknown_webhook");
    delete(app, &tenant, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}
