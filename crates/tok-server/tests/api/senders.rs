//! Sources that know their sender (`verify: {preset, secret}`): for each of
//! Standard Webhooks, Stripe, GitHub, Shopify and Slack, a body signed the
//! way the sender's documentation shows is accepted (202), and its
//! delivery id, sent again with another body, is the same event
//! (`duplicate: true`); a changed body, another secret, a missing header
//! or a stale timestamp is a 401 with its own code naming the header
//! read, and nothing of it is stored; during a secret's rotation both
//! secrets verify and after it only the new one. Slack's `url_verification`
//! is answered with its challenge and starts nothing; GitHub's event type
//! reaches the run as `_sender.event`.
//!
//! The signatures here are computed by this file, apart from the server's
//! code; the documented vectors themselves are checked in the server's
//! unit tests (`crate::senders`).

use axum::http::{Method, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, on_webhook};

backend_tests!(
    crate::helpers::run;
    standard_signatures_are_checked,
    stripe_signatures_are_checked,
    github_signatures_are_checked,
    shopify_signatures_are_checked,
    slack_signatures_are_checked,
    a_standard_secret_rotates_with_both_valid_during_the_overlap,
    a_stripe_secret_rotates_with_both_valid_during_the_overlap,
    a_github_secret_rotates_with_both_valid_during_the_overlap,
    a_shopify_secret_rotates_with_both_valid_during_the_overlap,
    a_slack_secret_rotates_with_both_valid_during_the_overlap,
    slacks_url_verification_is_answered_and_starts_nothing,
    githubs_event_type_reaches_the_filter_as_sender_event,
    a_sender_and_its_secret_are_checked_when_the_source_is_saved,
    svix_deliveries_are_taken_under_svix_header_names,
);

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Sender {
    Standard,
    Stripe,
    Github,
    Shopify,
    Slack,
}

pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn hmac(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

impl Sender {
    pub(crate) fn preset(self) -> &'static str {
        match self {
            Sender::Standard => "standard",
            Sender::Stripe => "stripe",
            Sender::Github => "github",
            Sender::Shopify => "shopify",
            Sender::Slack => "slack",
        }
    }

    /// A secret of this sender's kind, told apart by `seed`.
    pub(crate) fn secret(self, seed: &str) -> String {
        match self {
            Sender::Standard => format!(
                "whsec_{}",
                STANDARD.encode(format!("the-standard-key-{seed}"))
            ),
            Sender::Stripe => format!("whsec_stripe_endpoint_secret_{seed}"),
            Sender::Github => format!("a GitHub hook's secret {seed}"),
            Sender::Shopify => format!("shpss_shopify_client_secret_{seed}"),
            Sender::Slack => format!("8f742231b10e8888abcd99yyy{seed}"),
        }
    }

    /// The header a wrong signature is refused on.
    fn signature_header(self) -> &'static str {
        match self {
            Sender::Standard => "webhook-signature",
            Sender::Stripe => "Stripe-Signature",
            Sender::Github => "X-Hub-Signature-256",
            Sender::Shopify => "X-Shopify-Hmac-Sha256",
            Sender::Slack => "X-Slack-Signature",
        }
    }

    /// The header a request without any is refused on: the first the
    /// sender always sends.
    fn first_header(self) -> &'static str {
        match self {
            Sender::Standard => "webhook-id",
            other => other.signature_header(),
        }
    }

    /// The header of the signed timestamp; GitHub and Shopify sign none.
    fn timestamp_header(self) -> Option<&'static str> {
        match self {
            Sender::Standard => Some("webhook-timestamp"),
            Sender::Stripe => Some("Stripe-Signature"),
            Sender::Slack => Some("X-Slack-Request-Timestamp"),
            Sender::Github | Sender::Shopify => None,
        }
    }

    /// A body as this sender sends it: Stripe and Slack name the
    /// delivery in it (the event's `id`, the Events API's `event_id`).
    pub(crate) fn body(self, delivery: &str, n: u32) -> Value {
        match self {
            Sender::Stripe => json!({
                "id": delivery, "object": "event", "type": "charge.succeeded",
                "data": { "object": { "amount": 2000 + n, "currency": "eur" } }
            }),
            Sender::Slack => json!({
                "type": "event_callback", "event_id": delivery, "team_id": "T1DC2JH3J",
                "event": { "type": "app_mention", "text": format!("hi {n}") }
            }),
            Sender::Github => json!({ "action": "opened", "issue": { "number": n } }),
            Sender::Shopify => {
                json!({ "id": 820982911946154508u64, "total_price": format!("{n}.00") })
            }
            Sender::Standard => json!({ "type": "invoice.paid", "n": n }),
        }
    }

    /// The headers this sender sends with `body`, signed with `secret` at
    /// `at` (unix seconds), naming the delivery `delivery`.
    pub(crate) fn sign(
        self,
        secret: &str,
        body: &str,
        at: i64,
        delivery: &str,
    ) -> Vec<(&'static str, String)> {
        match self {
            Sender::Standard => {
                let key = STANDARD
                    .decode(secret.strip_prefix("whsec_").unwrap())
                    .unwrap();
                let mac = hmac(&key, format!("{delivery}.{at}.{body}").as_bytes());
                vec![
                    ("webhook-id", delivery.to_owned()),
                    ("webhook-timestamp", at.to_string()),
                    ("webhook-signature", format!("v1,{}", STANDARD.encode(mac))),
                ]
            }
            Sender::Stripe => {
                let mac = hmac(secret.as_bytes(), format!("{at}.{body}").as_bytes());
                vec![(
                    "Stripe-Signature",
                    format!("t={at},v1={}", hex::encode(mac)),
                )]
            }
            Sender::Github => vec![
                (
                    "X-Hub-Signature-256",
                    format!(
                        "sha256={}",
                        hex::encode(hmac(secret.as_bytes(), body.as_bytes()))
                    ),
                ),
                ("X-GitHub-Delivery", delivery.to_owned()),
                ("X-GitHub-Event", "issues".to_owned()),
            ],
            Sender::Shopify => vec![
                (
                    "X-Shopify-Hmac-Sha256",
                    STANDARD.encode(hmac(secret.as_bytes(), body.as_bytes())),
                ),
                ("X-Shopify-Webhook-Id", delivery.to_owned()),
                ("X-Shopify-Topic", "orders/create".to_owned()),
            ],
            Sender::Slack => {
                let mac = hmac(secret.as_bytes(), format!("v0:{at}:{body}").as_bytes());
                vec![
                    ("X-Slack-Signature", format!("v0={}", hex::encode(mac))),
                    ("X-Slack-Request-Timestamp", at.to_string()),
                ]
            }
        }
    }
}

/// Sends `body` with `headers`.
pub(crate) async fn send(
    app: &TestApp,
    token: &str,
    headers: &[(&'static str, String)],
    body: &Value,
) -> crate::helpers::Reply {
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    app.webhook_with(token, &headers, body).await
}

/// `body` signed by `sender` with `secret` now, as delivery `delivery`.
pub(crate) async fn send_signed(
    app: &TestApp,
    sender: Sender,
    token: &str,
    secret: &str,
    delivery: &str,
    body: &Value,
) -> crate::helpers::Reply {
    let headers = sender.sign(secret, &body.to_string(), now(), delivery);
    send(app, token, &headers, body).await
}

/// A source of `tenant` checking `sender` with `secret`: its id and token.
pub(crate) async fn signed_source(
    app: &TestApp,
    tenant: &Tenant,
    sender: Sender,
    secret: &str,
) -> (String, String) {
    let source = app
        .create_source(
            tenant,
            &json!({
                "name": format!("{} events", sender.preset()),
                "params": [],
                "verify": { "preset": sender.preset(), "secret": secret },
            }),
        )
        .await;
    assert_eq!(source["signed"], true, "{source:#}");
    assert_eq!(source["verify"], json!({ "preset": sender.preset() }));
    assert!(
        !source.to_string().contains(secret),
        "the secret is never shown: {source:#}"
    );
    (
        source["id"].as_str().unwrap().to_owned(),
        source["token"].as_str().unwrap().to_owned(),
    )
}

async fn pending_events(app: &TestApp, tenant: &Tenant) -> i64 {
    let queue = app
        .get(&tenant.key, "/api/dashboard/queue")
        .await
        .expect(StatusCode::OK);
    queue["pending_events"].as_i64().expect("pending_events")
}

async fn standard_signatures_are_checked(app: &TestApp) {
    signatures_are_checked(app, Sender::Standard).await;
}

async fn stripe_signatures_are_checked(app: &TestApp) {
    signatures_are_checked(app, Sender::Stripe).await;
}

async fn github_signatures_are_checked(app: &TestApp) {
    signatures_are_checked(app, Sender::Github).await;
}

async fn shopify_signatures_are_checked(app: &TestApp) {
    signatures_are_checked(app, Sender::Shopify).await;
}

async fn slack_signatures_are_checked(app: &TestApp) {
    signatures_are_checked(app, Sender::Slack).await;
}

/// A request the sender did not sign, and how it must be refused.
struct Refused {
    what: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Value,
    code: &'static str,
    /// The header the refusal names.
    header: &'static str,
}

/// One sender's webhook: accepted when signed as it signs, the same event
/// for its delivery id, refused with the reason otherwise, and nothing
/// refused in the inbox.
async fn signatures_are_checked(app: &TestApp, sender: Sender) {
    let tenant = app.create_tenant("Acme").await;
    let secret = sender.secret("one");
    let (_, token) = signed_source(app, &tenant, sender, &secret).await;
    // Nothing is dispatched: what was accepted stays in the inbox, counted.
    app.stop_engine().await;

    let delivery = match sender {
        Sender::Stripe => "evt_1NG8Du2eZvKYlo2CUI79vXWy",
        Sender::Slack => "Ev0PV52K21",
        _ => "72d3162e-cc78-11e3-81ab-4c9367dc0958",
    };
    let first_body = sender.body(delivery, 1);
    let first = send_signed(app, sender, &token, &secret, delivery, &first_body)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(first["duplicate"], false, "{sender:?}: {first:#}");

    // The sender's retry names the same delivery: the same event, even
    // with another body (the delivery id comes before the body's hash)
    // and, for the senders that sign one, another timestamp.
    let retry_body = sender.body(delivery, 2);
    let headers = sender.sign(&secret, &retry_body.to_string(), now() - 5, delivery);
    let retry = send(app, &token, &headers, &retry_body)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(retry["duplicate"], true, "{sender:?}: {retry:#}");
    assert_eq!(retry["event_id"], first["event_id"], "{sender:?}");

    // Refused: each with its code and the header read.
    let body = sender.body("d-refused", 3);
    let text = body.to_string();
    let signed = sender.sign(&secret, &text, now(), "d-refused");
    let changed = sender.body("d-refused", 4);
    let mut cases = vec![
        Refused {
            what: "a changed body",
            headers: signed.clone(),
            body: changed,
            code: "signature_invalid",
            header: sender.signature_header(),
        },
        Refused {
            what: "another secret",
            headers: sender.sign(&sender.secret("two"), &text, now(), "d-refused"),
            body: body.clone(),
            code: "signature_invalid",
            header: sender.signature_header(),
        },
        Refused {
            what: "no header",
            headers: Vec::new(),
            body: body.clone(),
            code: "signature_missing",
            header: sender.first_header(),
        },
    ];
    if let Some(header) = sender.timestamp_header() {
        cases.push(Refused {
            what: "a timestamp ten minutes old",
            headers: sender.sign(&secret, &text, now() - 600, "d-refused"),
            body: body.clone(),
            code: "timestamp_out_of_range",
            header,
        });
    }
    for Refused {
        what,
        headers,
        body,
        code,
        header,
    } in cases
    {
        let error = send(app, &token, &headers, &body)
            .await
            .expect_error(StatusCode::UNAUTHORIZED, code);
        assert_eq!(error["header"], header, "{sender:?}, {what}: {error:#}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(header),
            "{sender:?}, {what}: the message names the header: {message}"
        );
    }
    // Still the one event: nothing of a refused request was kept.
    assert_eq!(pending_events(app, &tenant).await, 1, "{sender:?}");

    // The help says which sender and which headers.
    let help = app
        .request(
            Method::GET,
            &format!("/webhook/{token}"),
            None,
            &[],
            axum::body::Body::empty(),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(help["verify"]["preset"], sender.preset(), "{help:#}");
    let names: Vec<&str> = help["verify"]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&sender.signature_header()), "{help:#}");
    assert!(
        help["signature"]
            .as_str()
            .unwrap()
            .contains(sender.signature_header()),
        "{help:#}"
    );
}

/// The headers Svix sends by default for `body`, signed as its
/// documentation says: base64 HMAC-SHA256 of `{svix-id}.{svix-timestamp}.{body}`
/// under the bytes `whsec_<base64>` encodes, as `svix-signature: v1,<sig>`.
fn svix_headers(secret: &str, body: &str, at: i64, id: &str) -> Vec<(&'static str, String)> {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let signature = STANDARD.encode(hmac(&key, format!("{id}.{at}.{body}").as_bytes()));
    vec![
        ("svix-id", id.to_owned()),
        ("svix-timestamp", at.to_string()),
        ("svix-signature", format!("v1,{signature}")),
    ]
}

/// Svix sends `svix-id`, `svix-timestamp` and `svix-signature` unless its
/// customer chose the `webhook-*` names: a `standard` source takes both,
/// `svix-id` is the delivery's key, and a refusal names the `svix-*`
/// header it read.
async fn svix_deliveries_are_taken_under_svix_header_names(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let secret = Sender::Standard.secret("svix");
    let (_, token) = signed_source(app, &tenant, Sender::Standard, &secret).await;
    app.stop_engine().await;

    let body = json!({ "type": "invoice.paid", "n": 1 });
    let headers = svix_headers(
        &secret,
        &body.to_string(),
        now(),
        "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
    );
    let first = send(app, &token, &headers, &body)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(first["duplicate"], false, "{first:#}");
    // Svix's retry of the same message: the same event.
    let again = json!({ "type": "invoice.paid", "n": 2 });
    let headers = svix_headers(
        &secret,
        &again.to_string(),
        now() - 5,
        "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
    );
    let retry = send(app, &token, &headers, &again)
        .await
        .expect(StatusCode::ACCEPTED);
    assert_eq!(retry["duplicate"], true, "{retry:#}");
    assert_eq!(retry["event_id"], first["event_id"]);

    let text = body.to_string();
    let refused = [
        (
            "another body",
            svix_headers(&secret, r#"{"type":"invoice.void"}"#, now(), "msg_b"),
            "signature_invalid",
            "svix-signature",
        ),
        (
            "another secret",
            svix_headers(&Sender::Standard.secret("other"), &text, now(), "msg_b"),
            "signature_invalid",
            "svix-signature",
        ),
        (
            "a timestamp ten minutes old",
            svix_headers(&secret, &text, now() - 600, "msg_b"),
            "timestamp_out_of_range",
            "svix-timestamp",
        ),
    ];
    for (what, headers, code, header) in refused {
        let error = send(app, &token, &headers, &body)
            .await
            .expect_error(StatusCode::UNAUTHORIZED, code);
        assert_eq!(error["header"], header, "{what}: {error:#}");
    }
    // Without svix-timestamp, the refusal says what to send.
    let mut partial = svix_headers(&secret, &text, now(), "msg_c");
    partial.retain(|(name, _)| *name != "svix-timestamp");
    let error = send(app, &token, &partial, &body)
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_missing");
    assert_eq!(error["header"], "svix-timestamp", "{error:#}");
    assert_eq!(pending_events(app, &tenant).await, 1);

    // The webhook's help lists both spellings.
    let help = app
        .request(
            Method::GET,
            &format!("/webhook/{token}"),
            None,
            &[],
            axum::body::Body::empty(),
        )
        .await
        .expect(StatusCode::OK);
    let names: Vec<&str> = help["verify"]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    for name in [
        "webhook-signature",
        "svix-id",
        "svix-timestamp",
        "svix-signature",
    ] {
        assert!(names.contains(&name), "{name}: {help:#}");
    }
}

async fn a_standard_secret_rotates_with_both_valid_during_the_overlap(app: &TestApp) {
    secret_rotates(app, Sender::Standard).await;
}

async fn a_stripe_secret_rotates_with_both_valid_during_the_overlap(app: &TestApp) {
    secret_rotates(app, Sender::Stripe).await;
}

async fn a_github_secret_rotates_with_both_valid_during_the_overlap(app: &TestApp) {
    secret_rotates(app, Sender::Github).await;
}

async fn a_shopify_secret_rotates_with_both_valid_during_the_overlap(app: &TestApp) {
    secret_rotates(app, Sender::Shopify).await;
}

async fn a_slack_secret_rotates_with_both_valid_during_the_overlap(app: &TestApp) {
    secret_rotates(app, Sender::Slack).await;
}

/// `POST /api/sources/{id}/rotate {"secret", "overlap"}`: the old secret
/// and the new verify until the overlap ends, then only the new one.
async fn secret_rotates(app: &TestApp, sender: Sender) {
    let tenant = app.create_tenant("Acme").await;
    let (old, new) = (sender.secret("old"), sender.secret("new"));
    let (id, token) = signed_source(app, &tenant, sender, &old).await;
    let rotated = app
        .post(
            &tenant.key,
            &format!("/api/sources/{id}/rotate"),
            &json!({ "token": false, "secret": new, "overlap": "2s" }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(rotated["verify"]["preset"], sender.preset(), "{rotated:#}");
    let ends =
        crate::helpers::ms(&rotated["previous_secret_expires_at"]).expect("the old secret's end");
    let mut n = 0;
    let mut delivery = || {
        n += 1;
        format!("d-{n}")
    };
    for secret in [&old, &new] {
        let d = delivery();
        send_signed(app, sender, &token, secret, &d, &sender.body(&d, 1))
            .await
            .expect(StatusCode::ACCEPTED);
    }
    let d = delivery();
    send_signed(
        app,
        sender,
        &token,
        &sender.secret("other"),
        &d,
        &sender.body(&d, 1),
    )
    .await
    .expect_error(StatusCode::UNAUTHORIZED, "signature_invalid");

    // After the overlap: the new secret only.
    let wait = ends - tok_store::now_ms() + 50;
    if wait > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(wait as u64)).await;
    }
    let d = delivery();
    send_signed(app, sender, &token, &old, &d, &sender.body(&d, 1))
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_invalid");
    let d = delivery();
    send_signed(app, sender, &token, &new, &d, &sender.body(&d, 1))
        .await
        .expect(StatusCode::ACCEPTED);
    let shown = app
        .get(&tenant.key, &format!("/api/sources/{id}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        shown["previous_secret_expires_at"],
        Value::Null,
        "{shown:#}"
    );

    // The new secret is checked as this sender's.
    let short = match sender {
        Sender::Standard => "whsec_c2hvcnQ=",
        _ => "short",
    };
    let refused = app
        .post(
            &tenant.key,
            &format!("/api/sources/{id}/rotate"),
            &json!({ "token": false, "secret": short }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert!(
        refused["message"].as_str().unwrap().contains("at least 16"),
        "{refused:#}"
    );
}

async fn slacks_url_verification_is_answered_and_starts_nothing(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let secret = Sender::Slack.secret("app");
    let (id, token) = signed_source(app, &tenant, Sender::Slack, &secret).await;
    app.create_automation(
        &tenant,
        &on_webhook("Mentions", &id, &json!([log_step("st_log", "mentioned")])),
    )
    .await;
    let handshake = json!({
        "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
        "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
        "type": "url_verification"
    });
    // Slack signs the handshake too; one not signed gets no challenge.
    send(app, &token, &[], &handshake)
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "signature_missing");
    let answer = send_signed(app, Sender::Slack, &token, &secret, "", &handshake)
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        answer,
        json!({ "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P" })
    );

    // An event after it starts the one run there is: the handshake none.
    let event = Sender::Slack.body("Ev0PV52K22", 1);
    send_signed(app, Sender::Slack, &token, &secret, "", &event)
        .await
        .expect(StatusCode::ACCEPTED);
    let runs = app.wait_for_runs(&tenant, "", 1).await;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let queue = app
        .get(&tenant.key, "/api/dashboard/queue")
        .await
        .expect(StatusCode::OK);
    assert_eq!(queue["pending_events"], 0, "{queue:#}");
}

async fn githubs_event_type_reaches_the_filter_as_sender_event(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let secret = Sender::Github.secret("hook");
    let (id, token) = signed_source(app, &tenant, Sender::Github, &secret).await;
    let mut pushes = on_webhook(
        "On push",
        &id,
        &json!([log_step("st_log", "pushed {{_sender.delivery}}")]),
    );
    pushes["trigger"]["filter"] = json!({
        "match": "all",
        "rules": [{ "field": "_sender.event", "operator": "eq", "value": "push" }]
    });
    app.create_automation(&tenant, &pushes).await;
    for (event, delivery) in [("issues", "d-issues"), ("push", "d-push")] {
        let body = json!({ "ref": "refs/heads/main", "n": delivery });
        let mut headers = Sender::Github.sign(&secret, &body.to_string(), now(), delivery);
        for header in headers.iter_mut() {
            if header.0 == "X-GitHub-Event" {
                header.1 = event.to_owned();
            }
        }
        send(app, &token, &headers, &body)
            .await
            .expect(StatusCode::ACCEPTED);
    }
    let runs = app.wait_for_runs(&tenant, "", 1).await;
    let run = app
        .get(
            &tenant.key,
            &format!("/api/runs/{}", runs[0]["id"].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK);
    let text = run.to_string();
    assert!(text.contains("pushed d-push"), "{run:#}");
    assert!(!text.contains("d-issues"), "{run:#}");
}

async fn a_sender_and_its_secret_are_checked_when_the_source_is_saved(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let cases = [
        (
            json!({ "preset": "paypal", "secret": "a-long-enough-secret" }),
            "verify.preset",
            "standard, stripe, github, shopify, slack",
        ),
        (
            json!({ "preset": "github", "secret": "hunter2" }),
            "verify.secret",
            "at least 16",
        ),
        (
            json!({ "preset": "slack", "secret": " 8f742231b10e8888abcd99yyyzzz85a5" }),
            "verify.secret",
            "spaces",
        ),
    ];
    for (verify, field, says) in cases {
        let error = app
            .post(
                &tenant.key,
                "/api/sources",
                &json!({ "name": "x", "verify": verify }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(error["field"], field, "{error:#}");
        assert!(
            error["message"].as_str().unwrap().contains(says),
            "{error:#}"
        );
    }
    let both = app
        .post(
            &tenant.key,
            "/api/sources",
            &json!({
                "name": "x",
                "secret": Sender::Standard.secret("a"),
                "verify": { "preset": "github", "secret": "a-long-enough-secret" }
            }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert!(
        both["message"].as_str().unwrap().contains("not both"),
        "{both:#}"
    );
    // The older `secret` is Standard Webhooks'.
    let older = app
        .create_source(
            &tenant,
            &json!({ "name": "older", "secret": Sender::Standard.secret("a") }),
        )
        .await;
    assert_eq!(
        older["verify"],
        json!({ "preset": "standard" }),
        "{older:#}"
    );
    let unsigned = app
        .create_source(&tenant, &json!({ "name": "plain" }))
        .await;
    assert_eq!(unsigned["verify"], Value::Null);
    assert_eq!(unsigned["signed"], false);
}
