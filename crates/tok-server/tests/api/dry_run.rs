//! `POST /webhook/{token}?dry_run=true`: checked like a real webhook (its
//! signature, JSON, schema and contract), answered 200 with the params and,
//! for each automation of the source, whether its filter holds and why;
//! no row is written (the inbox and the runs, counted before and after),
//! and the real webhook sent after it is new, not a duplicate.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Reply, Tenant, TestApp, backend_tests, log_step, on_webhook};
use crate::senders::{Sender, now, signed_source};

backend_tests!(
    crate::helpers::run;
    a_dry_run_says_which_automations_would_start_and_stores_nothing,
    a_dry_run_of_a_signed_source_checks_the_signature,
);

async fn dry_run(app: &TestApp, token: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    app.request(
        Method::POST,
        &format!("/webhook/{token}?dry_run=true"),
        None,
        &all,
        axum::body::Body::from(body.to_string()),
    )
    .await
}

/// The inbox's pending events and the runs of `tenant`.
async fn rows(app: &TestApp, tenant: &Tenant) -> (i64, usize) {
    let queue = app
        .get(&tenant.key, "/api/dashboard/queue")
        .await
        .expect(StatusCode::OK);
    let runs = app
        .get(&tenant.key, "/api/dashboard/runs?limit=500")
        .await
        .expect(StatusCode::OK);
    (
        queue["pending_events"].as_i64().unwrap(),
        runs["items"].as_array().unwrap().len(),
    )
}

fn filtered(name: &str, source: &str, rules: Value) -> Value {
    let mut definition = on_webhook(name, source, &json!([log_step("st_log", "started")]));
    definition["trigger"]["filter"] = json!({ "match": "all", "rules": rules });
    definition
}

async fn a_dry_run_says_which_automations_would_start_and_stores_nothing(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(
            &tenant,
            &json!({ "name": "orders", "params": [
                { "name": "total", "path": "order.total", "type": "number", "required": true }
            ] }),
        )
        .await;
    let (id, token) = (
        source["id"].as_str().unwrap(),
        source["token"].as_str().unwrap(),
    );
    let big = app
        .create_automation(
            &tenant,
            &filtered(
                "Big orders",
                id,
                json!([{ "field": "total", "operator": "gt", "value": 100 }]),
            ),
        )
        .await;
    let euro = app
        .create_automation(
            &tenant,
            &filtered(
                "Euro orders",
                id,
                json!([{ "field": "currency", "operator": "eq", "value": "EUR" }]),
            ),
        )
        .await;
    let paused = app
        .create_automation(
            &tenant,
            &on_webhook("Paused", id, &json!([log_step("st_log", "x")])),
        )
        .await;
    app.post(
        &tenant.key,
        &format!("/api/automations/{paused}/pause"),
        &json!({}),
    )
    .await
    .expect(StatusCode::OK);
    let elsewhere = app
        .create_source(&tenant, &json!({ "name": "other" }))
        .await;
    app.create_automation(
        &tenant,
        &on_webhook(
            "Elsewhere",
            elsewhere["id"].as_str().unwrap(),
            &json!([log_step("st_log", "x")]),
        ),
    )
    .await;
    app.stop_engine().await;
    let before = rows(app, &tenant).await;

    let body = json!({ "order": { "total": 250 }, "currency": "USD" });
    let answer = dry_run(app, token, &[], &body).await.expect(StatusCode::OK);
    assert_eq!(answer["dry_run"], true, "{answer:#}");
    assert_eq!(answer["params"], json!({ "total": 250 }), "{answer:#}");
    assert_eq!(answer["would_start"], 1, "{answer:#}");
    assert_eq!(answer["signature"]["checked"], false);
    let automations = answer["automations"].as_array().unwrap();
    assert_eq!(
        automations.len(),
        3,
        "the other source's is not listed: {answer:#}"
    );
    let by_id = |id: &str| {
        automations
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {answer:#}"))
            .clone()
    };
    let big = by_id(&big);
    assert_eq!(big["would_start"], true, "{big:#}");
    assert_eq!(big["filter"]["holds"], true);
    let line = big["filter"]["lines"][0].as_str().unwrap();
    assert!(line.contains("total") && line.contains("250"), "{line}");
    let euro = by_id(&euro);
    assert_eq!(euro["would_start"], false, "{euro:#}");
    assert_eq!(euro["filter"]["holds"], false);
    let line = euro["filter"]["lines"][0].as_str().unwrap();
    assert!(line.contains("currency") && line.contains("USD"), "{line}");
    let paused = by_id(&paused);
    assert_eq!(paused["would_start"], false, "{paused:#}");
    assert!(paused["why"].as_str().unwrap().contains("paused"));

    // The contract is checked as for a real one.
    dry_run(app, token, &[], &json!({ "order": {} }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "missing_param");
    let bad = app
        .request(
            Method::POST,
            &format!("/webhook/{token}?dry_run=maybe"),
            None,
            &[("content-type", "application/json")],
            axum::body::Body::from(body.to_string()),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_query");
    assert_eq!(bad["field"], "dry_run");

    // Nothing was written: not the event, not a run, not its key.
    assert_eq!(rows(app, &tenant).await, before);
    let real = app.webhook(token, &body).await.expect(StatusCode::ACCEPTED);
    assert_eq!(real["duplicate"], false, "{real:#}");
    assert_eq!(rows(app, &tenant).await, (before.0 + 1, before.1));
    // And the dispatcher decides as the dry run said.
    app.start_engine().await;
    let runs = app.wait_for_runs(&tenant, "", 1).await;
    assert_eq!(runs[0]["automation_id"], big["id"], "{runs:#?}");
}

async fn a_dry_run_of_a_signed_source_checks_the_signature(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    let secret = Sender::Stripe.secret("dry");
    let (_, token) = signed_source(app, &tenant, Sender::Stripe, &secret).await;
    app.stop_engine().await;
    let before = rows(app, &tenant).await;
    let body = Sender::Stripe.body("evt_dry", 1);

    // Without a signature: refused, like a real one.
    let error = dry_run(app, &token, &[], &body)
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_missing");
    assert_eq!(error["header"], "Stripe-Signature");
    // Signed: checked and answered.
    let headers = Sender::Stripe.sign(&secret, &body.to_string(), now(), "");
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let answer = dry_run(app, &token, &headers, &body)
        .await
        .expect(StatusCode::OK);
    assert_eq!(answer["signature"]["checked"], true, "{answer:#}");
    assert_eq!(answer["idempotency_key"], "key:evt_dry", "{answer:#}");
    assert_eq!(answer["params"]["_sender"]["preset"], "stripe");
    // Asked with the tenant's own key and no Stripe header (the
    // dashboard's "try a body"): answered, saying it was not checked.
    let bearer = format!("Bearer {}", tenant.key);
    let answer = dry_run(app, &token, &[("authorization", &bearer)], &body)
        .await
        .expect(StatusCode::OK);
    assert_eq!(answer["signature"]["checked"], false, "{answer:#}");
    assert!(
        answer["signature"]["note"]
            .as_str()
            .unwrap()
            .contains("not checked")
    );
    // With a Stripe header beside the key, the header is checked.
    dry_run(
        app,
        &token,
        &[
            ("authorization", &bearer),
            ("stripe-signature", "t=1,v1=00"),
        ],
        &body,
    )
    .await
    .expect_error(StatusCode::UNAUTHORIZED, "timestamp_out_of_range");
    // Another tenant's key is no key of this source's tenant.
    let theirs = format!("Bearer {}", other.key);
    dry_run(app, &token, &[("authorization", &theirs)], &body)
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_missing");
    assert_eq!(rows(app, &tenant).await, before);

    // Slack's handshake in a dry run: what a real one answers, no event.
    let slack = Sender::Slack.secret("dry");
    let (_, slack_token) = signed_source(app, &tenant, Sender::Slack, &slack).await;
    let handshake = json!({ "type": "url_verification", "challenge": "c-123" });
    let headers = Sender::Slack.sign(&slack, &handshake.to_string(), now(), "");
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let answer = dry_run(app, &slack_token, &headers, &handshake)
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        answer["answer"],
        json!({ "challenge": "c-123" }),
        "{answer:#}"
    );
    assert_eq!(answer["would_start"], 0);
    assert_eq!(rows(app, &tenant).await, before);
}
