//! What turns a webhook away before the inbox: a source's rate limit (429
//! with `Retry-After`, and the sender's next request after the wait goes
//! through) and backpressure (a queue deeper than the threshold refuses
//! sources not marked critical, and still takes the critical ones).

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    a_source_rate_limit_answers_429_with_retry_after,
    backpressure_spares_critical_sources,
);

async fn a_source_rate_limit_answers_429_with_retry_after(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(
            &tenant,
            &json!({ "name": "shop", "params": [], "rate_limit": 2 }),
        )
        .await;
    let token = source["token"].as_str().unwrap();
    for n in 0..2 {
        app.webhook(token, &json!({ "n": n }))
            .await
            .expect(StatusCode::ACCEPTED);
    }
    let reply = app.webhook(token, &json!({ "n": 2 })).await;
    assert_eq!(
        reply
            .headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let error = reply.expect_error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("2 requests per second")
    );
    assert!(error["retry_after_ms"].as_u64().unwrap() <= 500);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    app.webhook(token, &json!({ "n": 3 }))
        .await
        .expect(StatusCode::ACCEPTED);
}

async fn backpressure_spares_critical_sources(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let shop = app
        .create_source(&tenant, &json!({ "name": "shop", "params": [] }))
        .await;
    let alarms = app
        .create_source(
            &tenant,
            &json!({ "name": "alarms", "params": [], "critical": true }),
        )
        .await;
    app.state
        .record_queue_depth(tok_server::DEFAULT_BACKPRESSURE_DEPTH + 1);
    let error = app
        .webhook(shop["token"].as_str().unwrap(), &json!({ "n": 1 }))
        .await
        .expect_error(StatusCode::TOO_MANY_REQUESTS, "overloaded");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("critical are still accepted")
    );
    app.webhook(alarms["token"].as_str().unwrap(), &json!({ "n": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);
    app.state.record_queue_depth(0);
    app.webhook(shop["token"].as_str().unwrap(), &json!({ "n": 2 }))
        .await
        .expect(StatusCode::ACCEPTED);
}
