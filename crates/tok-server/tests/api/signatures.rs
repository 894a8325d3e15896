//! Signed webhooks (Standard Webhooks): a source with a secret accepts only
//! requests whose `webhook-signature` is the HMAC of id, timestamp and body
//! under that secret, sent within five minutes; everything else is a 401
//! that says what was wrong (`signature_missing`, `signature_invalid`,
//! `timestamp_out_of_range`) and names the header read, and nothing
//! reaches the inbox. The other senders are in `senders.rs`.

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::helpers::{TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    a_correctly_signed_webhook_is_accepted,
    unsigned_forged_and_stale_webhooks_are_refused,
);

fn secret() -> String {
    format!("whsec_{}", STANDARD.encode(b"a-shared-key-of-the-sender"))
}

fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// A signature of `body` as message `msg_2` sent at `timestamp` (any text).
fn sign_at(timestamp: &str, body: &str) -> String {
    let key = STANDARD
        .decode(secret().strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("msg_2.{timestamp}.{body}").as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

async fn signed_source(app: &TestApp) -> (crate::helpers::Tenant, String) {
    let tenant = app.create_tenant("Acme").await;
    let source = app
        .create_source(
            &tenant,
            &json!({ "name": "shop", "params": [], "secret": secret() }),
        )
        .await;
    (tenant, source["token"].as_str().unwrap().to_owned())
}

async fn a_correctly_signed_webhook_is_accepted(app: &TestApp) {
    let (_tenant, token) = signed_source(app).await;
    let body = json!({ "kind": "order.created" });
    let ts = now().to_string();
    let signature = format!(
        "v1,bm90LXRoaXMtb25l {}",
        sign(&secret(), "msg_1", now(), &body.to_string())
    );
    let answer = app
        .webhook_with(
            &token,
            &[
                ("webhook-id", "msg_1"),
                ("webhook-timestamp", &ts),
                ("webhook-signature", &signature),
            ],
            &body,
        )
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(answer["duplicate"], false);
    // The message id is the idempotency key: the sender's retry is a duplicate.
    let again = app
        .webhook_with(
            &token,
            &[
                ("webhook-id", "msg_1"),
                ("webhook-timestamp", &ts),
                ("webhook-signature", &signature),
            ],
            &body,
        )
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(again["event_id"], answer["event_id"]);
    assert_eq!(again["duplicate"], true);
    // The signed id is the key: the same request replayed with another
    // Idempotency-Key is still the same event.
    let replayed = app
        .webhook_with(
            &token,
            &[
                ("webhook-id", "msg_1"),
                ("webhook-timestamp", &ts),
                ("webhook-signature", &signature),
                ("idempotency-key", "a-new-key-of-the-replayer"),
            ],
            &body,
        )
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(replayed["event_id"], answer["event_id"]);
    assert_eq!(replayed["duplicate"], true);
}

async fn unsigned_forged_and_stale_webhooks_are_refused(app: &TestApp) {
    let (_tenant, token) = signed_source(app).await;
    let body = json!({ "kind": "order.created" });
    let text = body.to_string();
    let fresh = now().to_string();
    let stale = (now() - 3600).to_string();
    let good = sign(&secret(), "msg_2", now(), &text);
    let forged = sign(
        &format!("whsec_{}", STANDARD.encode(b"someone else")),
        "msg_2",
        now(),
        &text,
    );
    let stale_signature = sign(&secret(), "msg_2", now() - 3600, &text);
    // (headers, code, what the message says)
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![],
            "signature_missing",
            "send webhook-id, webhook-timestamp and webhook-signature",
        ),
        (
            vec![
                ("webhook-id", "msg_2"),
                ("webhook-timestamp", &fresh),
                ("webhook-signature", &forged),
            ],
            "signature_invalid",
            "does not match",
        ),
        (
            vec![
                ("webhook-id", "msg_3"),
                ("webhook-timestamp", &fresh),
                ("webhook-signature", &good),
            ],
            "signature_invalid",
            "does not match",
        ),
        (
            vec![
                ("webhook-id", "msg_2"),
                ("webhook-timestamp", &stale),
                ("webhook-signature", &stale_signature),
            ],
            "timestamp_out_of_range",
            "away from the server's clock",
        ),
        (
            vec![
                ("webhook-id", "msg_2"),
                ("webhook-timestamp", "yesterday"),
                ("webhook-signature", &good),
            ],
            "signature_invalid",
            "unix seconds",
        ),
    ];
    // A timestamp at either end of i64 is far from now, not an overflow.
    let (min, max) = (i64::MIN.to_string(), i64::MAX.to_string());
    let at_min = sign_at(&min, &text);
    let at_max = sign_at(&max, &text);
    let mut cases = cases;
    for (ts, signature) in [(&min, &at_min), (&max, &at_max)] {
        cases.push((
            vec![
                ("webhook-id", "msg_2"),
                ("webhook-timestamp", ts.as_str()),
                ("webhook-signature", signature.as_str()),
            ],
            "timestamp_out_of_range",
            "away from the server's clock",
        ));
    }
    for (headers, code, expected) in cases {
        let error = app
            .webhook_with(&token, &headers, &body)
            .await
            .expect_error(StatusCode::UNAUTHORIZED, code);
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{headers:?}: {message}");
        assert!(
            error["header"]
                .as_str()
                .is_some_and(|h| h.starts_with("webhook-")),
            "the header read is named: {error:#}"
        );
    }
    // A body changed after signing does not pass either.
    let tampered: Value = json!({ "kind": "order.cancelled" });
    app.webhook_with(
        &token,
        &[
            ("webhook-id", "msg_2"),
            ("webhook-timestamp", &fresh),
            ("webhook-signature", &good),
        ],
        &tampered,
    )
    .await
    .expect_error(StatusCode::UNAUTHORIZED, "signature_invalid");
    let help = app
        .request(
            axum::http::Method::GET,
            &format!("/webhook/{token}"),
            None,
            &[],
            axum::body::Body::empty(),
        )
        .await
        .expect(StatusCode::OK);
    assert!(
        help["signature"]
            .as_str()
            .unwrap()
            .contains("webhook-signature")
    );
}
