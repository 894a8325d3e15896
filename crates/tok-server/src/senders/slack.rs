//! Slack: `X-Slack-Signature: v0=<hex>`, the HMAC-SHA256 of
//! `v0:{X-Slack-Request-Timestamp}:{body}` under the app's Signing Secret,
//! the timestamp within five minutes. The Events API names a delivery by
//! the body's `event_id`, which its retries repeat
//! ([`super::Preset::body_key`]); its `url_verification` handshake, signed
//! like the rest, is answered by the webhook with its `challenge`
//! ([`challenge`]).

use serde_json::Value;

use super::{Described, Headers, Refusal, Signed, any_matches, fresh, signs};

const SIGNATURE: &str = "X-Slack-Signature";
const TIMESTAMP: &str = "X-Slack-Request-Timestamp";

pub(super) const HEADERS: &[Described] = &[
    signs(
        SIGNATURE,
        "v0=<hex HMAC-SHA256 of `v0:{timestamp}:{body}` under the Signing Secret>",
    ),
    signs(
        TIMESTAMP,
        "unix seconds, within 5 minutes of the server's clock",
    ),
];

pub(super) const SUMMARY: &str = "X-Slack-Signature: v0=<hex HMAC-SHA256 of `v0:{X-Slack-Request-Timestamp}:{body}` under the app's Signing Secret>, the timestamp within 5 minutes; url_verification is answered with its challenge; the Events API's event_id is the idempotency key";

/// Longest challenge answered: Slack's are some 50 characters.
const MAX_CHALLENGE_LEN: usize = 200;

pub(super) fn verify(
    secrets: &[&str],
    headers: &Headers,
    body: &[u8],
    now: i64,
) -> Result<Signed, Refusal> {
    let signature = headers.required(
        SIGNATURE,
        "Slack sends it with every request; check the app's Request URL",
    )?;
    let timestamp = headers.required(
        TIMESTAMP,
        "Slack sends it with X-Slack-Signature, which signs it",
    )?;
    fresh(TIMESTAMP, timestamp, now)?;
    let Some(hex_sig) = signature.strip_prefix("v0=") else {
        return Err(Refusal::invalid(
            SIGNATURE,
            "X-Slack-Signature must be v0=<hex>",
        ));
    };
    let candidate = hex::decode(hex_sig)
        .map_err(|_| Refusal::invalid(SIGNATURE, "X-Slack-Signature is not v0=<hex>"))?;
    let keys: Vec<Vec<u8>> = secrets.iter().map(|s| s.as_bytes().to_vec()).collect();
    let parts: [&[u8]; 4] = [b"v0:", timestamp.as_bytes(), b":", body];
    if !any_matches(&keys, &parts, &[candidate]) {
        return Err(Refusal::invalid(
            SIGNATURE,
            "X-Slack-Signature does not match the timestamp, the body and the source's Signing Secret",
        ));
    }
    Ok(Signed::default())
}

/// The challenge of a `url_verification` body, which Slack sends once to
/// check the Request URL and expects back; `None` for any other body.
pub(crate) fn challenge(body: &Value) -> Option<&str> {
    (body.get("type").and_then(Value::as_str) == Some("url_verification"))
        .then(|| body.get("challenge").and_then(Value::as_str))
        .flatten()
        .filter(|c| c.len() <= MAX_CHALLENGE_LEN)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::Preset;
    use super::super::tests::headers;
    use super::*;

    // Slack's documentation ("Verifying requests from Slack") walks
    // through this Signing Secret, timestamp and slash command body to
    // this signature.
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const AT: i64 = 1531420618;
    const BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    fn sent(signature: &str, at: i64) -> axum::http::HeaderMap {
        headers(&[(SIGNATURE, signature), (TIMESTAMP, &at.to_string())])
    }

    #[test]
    fn the_documented_example_verifies() {
        assert!(
            Preset::Slack
                .verify(&[SECRET], &sent(SIG, AT), BODY, AT + 60)
                .is_ok()
        );
    }

    #[test]
    fn a_changed_body_a_moved_timestamp_or_a_late_send_is_refused() {
        let code = |headers: &axum::http::HeaderMap, body: &[u8], now: i64| {
            Preset::Slack
                .verify(&[SECRET], headers, body, now)
                .unwrap_err()
                .code()
        };
        assert_eq!(code(&sent(SIG, AT), b"token=x", AT), "signature_invalid");
        assert_eq!(code(&sent(SIG, AT + 1), BODY, AT), "signature_invalid");
        assert_eq!(
            code(&sent(SIG, AT), BODY, AT + 301),
            "timestamp_out_of_range"
        );
        let stale = Preset::Slack
            .verify(&[SECRET], &sent(SIG, AT), BODY, AT - 301)
            .unwrap_err();
        assert_eq!(stale.header(), TIMESTAMP);
        let no_time = headers(&[(SIGNATURE, SIG)]);
        let missing = Preset::Slack
            .verify(&[SECRET], &no_time, BODY, AT)
            .unwrap_err();
        assert_eq!(
            (missing.code(), missing.header()),
            ("signature_missing", TIMESTAMP)
        );
    }

    #[test]
    fn only_a_url_verification_has_a_challenge() {
        let handshake = json!({
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification"
        });
        assert_eq!(
            challenge(&handshake),
            Some("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P")
        );
        let event = json!({ "type": "event_callback", "challenge": "x" });
        assert_eq!(challenge(&event), None);
    }
}
