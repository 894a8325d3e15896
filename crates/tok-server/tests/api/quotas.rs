//! Tenant quotas (docs/security.md, "Tenant quotas"), as the admin sets
//! them and a tenant meets them: `PATCH /api/tenants/{id} {"settings":
//! {"limits": {…}}}` checks each limit and names the one that is wrong;
//! over `signalsPerSecond` a signal is 429 `rate_limited` with
//! `Retry-After` until the admin raises it; one key's stream past `streams`
//! is 429 until one of its streams closes; the tenant's `startsPerMinute`
//! limits its automations that set none.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::helpers::{Tenant, TestApp, backend_tests, manual};

backend_tests!(crate::helpers::run;
    limits_show_their_defaults_and_a_bad_one_names_its_field,
    signals_past_the_tenants_burst_are_429_until_the_admin_raises_it,
    a_keys_stream_past_the_limit_is_429_and_a_closed_one_frees_its_place,
    the_tenants_start_limit_holds_for_automations_without_their_own,
);

async fn set_limits(app: &TestApp, tenant: &Tenant, limits: Value) -> Value {
    let changed = app
        .patch(
            &app.admin_key,
            &format!("/api/tenants/{}", tenant.id),
            &json!({ "settings": { "limits": limits } }),
        )
        .await
        .expect(StatusCode::OK);
    changed["settings"]["limits"].clone()
}

async fn limits_show_their_defaults_and_a_bad_one_names_its_field(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let shown = set_limits(app, &tenant, json!({})).await;
    assert_eq!(
        shown,
        json!({
            "signalsPerSecond": { "rate": 100.0, "burst": 200 },
            "streams": 5,
            "startsPerMinute": null,
            "concurrency": null,
        })
    );
    let shown = set_limits(
        app,
        &tenant,
        json!({ "signalsPerSecond": 10, "streams": 2 }),
    )
    .await;
    assert_eq!(
        shown["signalsPerSecond"],
        json!({ "rate": 10.0, "burst": 20 })
    );
    assert_eq!(shown["streams"], 2);
    // A change names only what it changes; null is the default again.
    let shown = set_limits(app, &tenant, json!({ "streams": null })).await;
    assert_eq!(shown["streams"], 5);
    assert_eq!(shown["signalsPerSecond"]["rate"], 10.0, "{shown:#}");

    let uri = format!("/api/tenants/{}", tenant.id);
    let cases = [
        (
            json!({ "streams": 0 }),
            "settings.limits.streams",
            "from 1 to 1000",
        ),
        (
            json!({ "streams": "many" }),
            "settings.limits.streams",
            "whole number",
        ),
        (
            json!({ "signalsPerSecond": -1 }),
            "settings.limits.signalsPerSecond",
            "rate per second",
        ),
        (
            json!({ "signalsPerSecond": { "rate": 5, "burst": 0 } }),
            "settings.limits.signalsPerSecond.burst",
            "from 1 to 100000",
        ),
        (
            json!({ "startsPerMinute": 0 }),
            "settings.limits.startsPerMinute",
            "from 1",
        ),
        (
            json!({ "concurency": 2 }),
            "settings.limits.concurency",
            "not a tenant limit",
        ),
    ];
    for (limits, field, expected) in cases {
        let error = app
            .patch(
                &app.admin_key,
                &uri,
                &json!({ "settings": { "limits": limits } }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_settings");
        assert_eq!(error["field"], field, "{limits}: {error:#}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with(field) && message.contains(expected),
            "{limits}: {message}"
        );
    }
    // Nothing of a refused change was kept.
    let shown = set_limits(app, &tenant, json!({})).await;
    assert_eq!(shown["streams"], 5, "{shown:#}");
    // Only the platform admin sets a tenant's limits.
    let own = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "settings": { "limits": { "streams": 100 } } }),
        )
        .await;
    assert_eq!(own.status, StatusCode::FORBIDDEN, "{:#}", own.body);
}

async fn signal(app: &TestApp, tenant: &Tenant, n: usize) -> crate::helpers::Reply {
    app.post(
        &tenant.key,
        "/api/signals",
        &json!({ "key": format!("k-{n}") }),
    )
    .await
}

async fn signals_past_the_tenants_burst_are_429_until_the_admin_raises_it(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    // The default burst (200) at a rate so slow that no token comes back
    // while the test runs: the 201st is refused whatever the machine's speed.
    set_limits(
        app,
        &tenant,
        json!({ "signalsPerSecond": { "rate": 0.001, "burst": 200 } }),
    )
    .await;
    for n in 0..200 {
        signal(app, &tenant, n).await.expect(StatusCode::ACCEPTED);
    }
    let refused = signal(app, &tenant, 200).await;
    let retry_after: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(retry_after >= 1, "{retry_after}");
    let error = refused.expect_error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("settings.limits.signalsPerSecond") && message.contains("bursts of 200"),
        "{message}"
    );
    // Another tenant's signals are its own to count.
    signal(app, &other, 0).await.expect(StatusCode::ACCEPTED);

    set_limits(
        app,
        &tenant,
        json!({ "signalsPerSecond": { "rate": 0.001, "burst": 205 } }),
    )
    .await;
    for n in 0..205 {
        signal(app, &tenant, 300 + n)
            .await
            .expect(StatusCode::ACCEPTED);
    }
    signal(app, &tenant, 600)
        .await
        .expect_error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
}

/// Opens `GET /api/stream` and keeps its response (the live stream) alive
/// while the caller holds it; dropping it closes the stream.
async fn open_stream(app: &TestApp, key: &str) -> axum::response::Response {
    let request = Request::get("/api/stream")
        .header("authorization", format!("Bearer {key}"))
        .body(Body::empty())
        .unwrap();
    app.router.clone().oneshot(request).await.unwrap()
}

async fn a_keys_stream_past_the_limit_is_429_and_a_closed_one_frees_its_place(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let mut open = Vec::new();
    for _ in 0..5 {
        let stream = open_stream(app, &tenant.key).await;
        assert_eq!(stream.status(), StatusCode::OK);
        open.push(stream);
    }
    let request = Request::get("/api/stream")
        .header("authorization", format!("Bearer {}", tenant.key))
        .body(Body::empty())
        .unwrap();
    let refused = app.send(request).await;
    let error = refused.expect_error(StatusCode::TOO_MANY_REQUESTS, "too_many_streams");
    assert_eq!(error["limit"], 5, "{error:#}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("settings.limits.streams"),
        "{error:#}"
    );
    // Another tenant's key has places of its own.
    let other = app.create_tenant("Other").await;
    assert_eq!(open_stream(app, &other.key).await.status(), StatusCode::OK);

    drop(open.pop());
    let again = open_stream(app, &tenant.key).await;
    assert_eq!(
        again.status(),
        StatusCode::OK,
        "a closed stream freed its place"
    );
    open.push(again);
    assert_eq!(
        open_stream(app, &tenant.key).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // A raised limit holds at once.
    set_limits(app, &tenant, json!({ "streams": 6 })).await;
    assert_eq!(open_stream(app, &tenant.key).await.status(), StatusCode::OK);
}

async fn the_tenants_start_limit_holds_for_automations_without_their_own(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    set_limits(app, &tenant, json!({ "startsPerMinute": 1 })).await;
    let log = json!([{ "id": "st_log", "type": "flow/log", "config": { "message": "hi" } }]);
    let plain = app.create_automation(&tenant, &manual("Plain", &log)).await;
    let mut own = manual("Own", &log);
    own["settings"] = json!({ "limits": { "startsPerMinute": 2 } });
    let own = app.create_automation(&tenant, &own).await;

    let start = async |automation: &str| {
        app.post(
            &tenant.key,
            &format!("/api/automations/{automation}/runs"),
            &json!({ "input": {} }),
        )
        .await
    };
    start(&plain).await.expect(StatusCode::CREATED);
    let refused = start(&plain).await;
    assert!(refused.headers.contains_key("retry-after"));
    refused.expect_error(StatusCode::TOO_MANY_REQUESTS, "start_rate_exceeded");
    // An automation's own limit comes before its tenant's.
    start(&own).await.expect(StatusCode::CREATED);
    start(&own).await.expect(StatusCode::CREATED);
    start(&own)
        .await
        .expect_error(StatusCode::TOO_MANY_REQUESTS, "start_rate_exceeded");
}
