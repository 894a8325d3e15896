//! Standard Webhooks (standardwebhooks.com; Svix and its users): HMAC-SHA256
//! of `{webhook-id}.{webhook-timestamp}.{body}` under the secret's bytes
//! (`whsec_<base64>` decoded, or the string as it is), sent base64 as
//! `webhook-signature: v1,<sig>` (several, space-separated, during the
//! sender's own rotation). The id is signed, so it is the delivery's key.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{Described, Headers, Refusal, Signed, any_matches, fresh, signs};

const ID: &str = "webhook-id";
const TIMESTAMP: &str = "webhook-timestamp";
const SIGNATURE: &str = "webhook-signature";

pub(super) const HEADERS: &[Described] = &[
    signs(ID, "the message id (signed; the idempotency key)"),
    signs(
        TIMESTAMP,
        "unix seconds, within 5 minutes of the server's clock",
    ),
    signs(
        SIGNATURE,
        "v1,<base64 HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}`>, several space-separated",
    ),
];

pub(super) const SUMMARY: &str = "Standard Webhooks headers webhook-id, webhook-timestamp (unix seconds, within 5 minutes) and webhook-signature (v1,<base64 HMAC-SHA256 of id.timestamp.body>)";

/// The HMAC key a secret stands for: the bytes `whsec_<base64>` encodes,
/// or the string itself.
pub(super) fn key(secret: &str) -> Result<Vec<u8>, String> {
    match secret.strip_prefix("whsec_") {
        Some(encoded) => STANDARD
            .decode(encoded)
            .map_err(|_| "starts with whsec_ but the rest is not base64".to_owned()),
        None => Ok(secret.as_bytes().to_vec()),
    }
}

pub(super) fn verify(
    secrets: &[&str],
    headers: &Headers,
    body: &[u8],
    now: i64,
) -> Result<Signed, Refusal> {
    let id = headers.required(
        ID,
        "send webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks)",
    )?;
    let timestamp = headers.required(
        TIMESTAMP,
        "send webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks)",
    )?;
    let signatures = headers.required(
        SIGNATURE,
        "send webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks)",
    )?;
    fresh(TIMESTAMP, timestamp, now)?;
    let sent: Vec<&str> = signatures
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("v1,"))
        .collect();
    if sent.is_empty() {
        return Err(Refusal::missing(
            SIGNATURE,
            "webhook-signature holds no v1,<base64> signature",
        ));
    }
    // One that is not base64 matches nothing; the others may.
    let candidates: Vec<Vec<u8>> = sent
        .iter()
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .collect();
    // A secret that does not decode was refused when it was kept; one
    // written otherwise is its own bytes.
    let keys: Vec<Vec<u8>> = secrets
        .iter()
        .map(|s| key(s).unwrap_or_else(|_| s.as_bytes().to_vec()))
        .collect();
    let parts: [&[u8]; 5] = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
    if !any_matches(&keys, &parts, &candidates) {
        return Err(Refusal::invalid(
            SIGNATURE,
            "webhook-signature does not match the body and the source's secret",
        ));
    }
    Ok(Signed {
        delivery: headers.name(ID),
        event: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::Preset;
    use super::super::tests::headers;
    use super::*;

    /// The example of the Standard Webhooks specification's reference
    /// libraries (and Svix's documentation): this secret, id, timestamp
    /// and body give this signature.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID_: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const AT: i64 = 1614265330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn sent(signature: &str) -> axum::http::HeaderMap {
        headers(&[
            (ID, ID_),
            (TIMESTAMP, &AT.to_string()),
            (SIGNATURE, signature),
        ])
    }

    #[test]
    fn the_documented_example_verifies() {
        let signed = Preset::Standard
            .verify(&[SECRET], &sent(SIG), BODY, AT + 10)
            .unwrap();
        assert_eq!(signed.delivery.as_deref(), Some(ID_));
        // Among others, during the sender's rotation.
        let several = format!("v1,bm90LXRoaXMtb25l {SIG}");
        assert!(
            Preset::Standard
                .verify(&[SECRET], &sent(&several), BODY, AT)
                .is_ok()
        );
    }

    #[test]
    fn a_changed_body_another_secret_or_a_late_send_is_refused() {
        let changed = Preset::Standard.verify(&[SECRET], &sent(SIG), br#"{"test": 1}"#, AT);
        assert_eq!(changed.unwrap_err().code(), "signature_invalid");
        let other = Preset::Standard.verify(
            &["whsec_c29tZW9uZSBlbHNlJ3Mga2V5IGVudGlyZWx5"],
            &sent(SIG),
            BODY,
            AT,
        );
        assert_eq!(other.unwrap_err().code(), "signature_invalid");
        let late = Preset::Standard.verify(&[SECRET], &sent(SIG), BODY, AT + 301);
        assert_eq!(late.unwrap_err().code(), "timestamp_out_of_range");
        let none = Preset::Standard.verify(&[SECRET], &headers(&[]), BODY, AT);
        assert_eq!(none.unwrap_err().header(), ID);
    }
}
