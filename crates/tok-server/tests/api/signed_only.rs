//! Fail-closed webhooks: with `settings.webhooks.requireSignature` (set by
//! the platform admin; `TOK_REQUIRE_SIGNED_WEBHOOKS` is the default of a
//! tenant that has none), a source cannot be created without `verify`
//! (400 `signature_required`), an older unsigned source's webhooks are
//! refused (401 `signature_required`) and stored nowhere, and giving that
//! source a sender with `PATCH` makes it work again, signed.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, plain_source};
use crate::senders::{Sender, send, send_signed, signed_source};

backend_tests!(
    crate::helpers::run;
    a_tenant_that_requires_signatures_refuses_unsigned_sources_and_webhooks,
    the_setting_is_the_admins_and_is_checked,
);

backend_tests!(
    crate::helpers::run_requiring_signatures;
    the_platforms_default_holds_for_a_tenant_without_its_own_choice,
);

async fn require(app: &TestApp, tenant: &Tenant, value: Value) -> Value {
    app.patch(
        &app.admin_key,
        &format!("/api/tenants/{}", tenant.id),
        &json!({ "settings": { "webhooks": { "requireSignature": value } } }),
    )
    .await
    .expect(StatusCode::OK)
}

async fn pending_events(app: &TestApp, tenant: &Tenant) -> i64 {
    app.get(&tenant.key, "/api/dashboard/queue")
        .await
        .expect(StatusCode::OK)["pending_events"]
        .as_i64()
        .unwrap()
}

async fn a_tenant_that_requires_signatures_refuses_unsigned_sources_and_webhooks(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    let older = app.create_source(&tenant, &plain_source("older")).await;
    let (older_id, older_token) = (
        older["id"].as_str().unwrap(),
        older["token"].as_str().unwrap(),
    );
    let others = app.create_source(&other, &plain_source("theirs")).await;
    app.stop_engine().await;
    app.webhook(older_token, &json!({ "n": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);

    let changed = require(app, &tenant, json!(true)).await;
    assert_eq!(
        changed["settings"]["webhooks"],
        json!({ "requireSignature": true, "inForce": true }),
        "{changed:#}"
    );

    // No new source without a sender's signature…
    let refused = app
        .post(&tenant.key, "/api/sources", &plain_source("new"))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "signature_required");
    assert_eq!(refused["field"], "verify", "{refused:#}");
    // …and the older one's webhooks are refused, stored nowhere.
    let error = app
        .webhook(older_token, &json!({ "n": 2 }))
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_required");
    assert!(
        error["message"].as_str().unwrap().contains("older"),
        "the source is named: {error:#}"
    );
    assert_eq!(pending_events(app, &tenant).await, 1);
    let help = app
        .request(
            Method::GET,
            &format!("/webhook/{older_token}"),
            None,
            &[],
            axum::body::Body::empty(),
        )
        .await
        .expect(StatusCode::OK);
    assert!(
        help["signature"].as_str().unwrap().contains("refused"),
        "{help:#}"
    );
    // Another tenant is not concerned.
    app.webhook(others["token"].as_str().unwrap(), &json!({ "n": 3 }))
        .await
        .expect(StatusCode::ACCEPTED);

    // A signed source is created and works.
    let secret = Sender::Github.secret("hook");
    let (_, token) = signed_source(app, &tenant, Sender::Github, &secret).await;
    send_signed(
        app,
        Sender::Github,
        &token,
        &secret,
        "d-1",
        &json!({ "n": 4 }),
    )
    .await
    .expect(StatusCode::ACCEPTED);

    // The older source is given a sender, and takes signed webhooks only.
    let shopify = Sender::Shopify.secret("shop");
    let given = app
        .patch(
            &tenant.key,
            &format!("/api/sources/{older_id}"),
            &json!({ "verify": { "preset": "shopify", "secret": shopify } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(given["verify"], json!({ "preset": "shopify" }), "{given:#}");
    assert!(!given.to_string().contains(&shopify));
    send(app, older_token, &[], &json!({ "n": 5 }))
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_missing");
    send_signed(
        app,
        Sender::Shopify,
        older_token,
        &shopify,
        "w-1",
        &json!({ "n": 6 }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    // A signed source's secret rotates; its sender is not replaced.
    let again = app
        .patch(
            &tenant.key,
            &format!("/api/sources/{older_id}"),
            &json!({ "verify": { "preset": "github", "secret": secret } }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert!(
        again["message"].as_str().unwrap().contains("rotate"),
        "{again:#}"
    );
    assert_eq!(pending_events(app, &tenant).await, 3);

    // Back to the platform's default (off here): unsigned sources again.
    let back = require(app, &tenant, Value::Null).await;
    assert_eq!(
        back["settings"]["webhooks"],
        json!({ "requireSignature": null, "inForce": false }),
        "{back:#}"
    );
    app.create_source(&tenant, &plain_source("new")).await;
}

async fn the_setting_is_the_admins_and_is_checked(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let path = format!("/api/tenants/{}", tenant.id);
    app.patch(
        &tenant.key,
        &path,
        &json!({ "settings": { "webhooks": { "requireSignature": true } } }),
    )
    .await
    .expect_error(StatusCode::FORBIDDEN, "admin_only");
    for bad in [
        json!({ "requireSignatures": true }),
        json!({ "requireSignature": "yes" }),
    ] {
        let error = app
            .patch(
                &app.admin_key,
                &path,
                &json!({ "settings": { "webhooks": bad } }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_settings");
        assert_eq!(error["field"], "settings.webhooks", "{error:#}");
    }
    // Nothing was changed by the refused requests.
    app.create_source(&tenant, &plain_source("still")).await;
}

/// `TOK_REQUIRE_SIGNED_WEBHOOKS=true`: a tenant that did not choose accepts
/// signed webhooks only; one the admin exempts (`false`) takes unsigned
/// ones, until it is back to the default (`null`).
async fn the_platforms_default_holds_for_a_tenant_without_its_own_choice(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    app.post(&tenant.key, "/api/sources", &plain_source("plain"))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "signature_required");
    let exempt = require(app, &tenant, json!(false)).await;
    assert_eq!(
        exempt["settings"]["webhooks"],
        json!({ "requireSignature": false, "inForce": false }),
        "{exempt:#}"
    );
    let plain = app.create_source(&tenant, &plain_source("plain")).await;
    let token = plain["token"].as_str().unwrap();
    app.webhook(token, &json!({ "n": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);
    let back = require(app, &tenant, Value::Null).await;
    assert_eq!(
        back["settings"]["webhooks"],
        json!({ "requireSignature": null, "inForce": true }),
        "{back:#}"
    );
    app.webhook(token, &json!({ "n": 2 }))
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_required");
    // Another tenant, which never chose, is held to the default.
    let other = app.create_tenant("Other").await;
    let secret = Sender::Slack.secret("app");
    let (_, slack) = signed_source(app, &other, Sender::Slack, &secret).await;
    send_signed(app, Sender::Slack, &slack, &secret, "", &json!({ "n": 3 }))
        .await
        .expect(StatusCode::ACCEPTED);
    app.post(&other.key, "/api/sources", &plain_source("plain"))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "signature_required");
}
