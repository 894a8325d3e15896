//! Standard Webhooks (standardwebhooks.com; Svix and its users): HMAC-SHA256
//! of `{webhook-id}.{webhook-timestamp}.{body}` under the secret's bytes
//! (`whsec_<base64>` decoded, or the string as it is), sent base64 as
//! `webhook-signature: v1,<sig>` (several, space-separated, during the
//! sender's own rotation). The id is signed, so it is the delivery's key.
//!
//! Svix signs the same way but, unless its customer chose the white-label
//! `webhook-*` names, sends the three headers as `svix-id`,
//! `svix-timestamp` and `svix-signature`: both spellings are read, the
//! three headers of one delivery all of one spelling.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{Described, Headers, Refusal, Signed, any_matches, fresh, signs};

/// The names of the three headers, in one spelling.
struct Names {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
    /// What to send, for the message of a missing header.
    send: &'static str,
}

/// The specification's names (and Svix's white-label option).
const SPECIFIED: Names = Names {
    id: "webhook-id",
    timestamp: "webhook-timestamp",
    signature: "webhook-signature",
    send: "send webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks), or svix-id, svix-timestamp and svix-signature (Svix)",
};

/// Svix's own names, which it sends by default.
const SVIX: Names = Names {
    id: "svix-id",
    timestamp: "svix-timestamp",
    signature: "svix-signature",
    send: "send svix-id, svix-timestamp and svix-signature (Svix), or webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks)",
};

pub(super) const HEADERS: &[Described] = &[
    signs(
        SPECIFIED.id,
        "the message id (signed; the idempotency key); Svix may send it as svix-id",
    ),
    signs(
        SPECIFIED.timestamp,
        "unix seconds, within 5 minutes of the server's clock; Svix may send it as svix-timestamp",
    ),
    signs(
        SPECIFIED.signature,
        "v1,<base64 HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}`>, several space-separated; Svix may send it as svix-signature",
    ),
    signs(SVIX.id, "Svix's name of webhook-id"),
    signs(SVIX.timestamp, "Svix's name of webhook-timestamp"),
    signs(SVIX.signature, "Svix's name of webhook-signature"),
];

pub(super) const SUMMARY: &str = "Standard Webhooks headers webhook-id, webhook-timestamp (unix seconds, within 5 minutes) and webhook-signature (v1,<base64 HMAC-SHA256 of id.timestamp.body>), or the same as Svix names them: svix-id, svix-timestamp and svix-signature";

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

/// The spelling a delivery uses: Svix's when it sends any `svix-*` header
/// and no `webhook-*` one, else the specification's (whose names a
/// missing header's message then gives first).
fn spelling(headers: &Headers) -> &'static Names {
    let sends = |names: &Names| {
        [names.id, names.timestamp, names.signature]
            .iter()
            .any(|name| headers.0.contains_key(*name))
    };
    if !sends(&SPECIFIED) && sends(&SVIX) {
        &SVIX
    } else {
        &SPECIFIED
    }
}

pub(super) fn verify(
    secrets: &[&str],
    headers: &Headers,
    body: &[u8],
    now: i64,
) -> Result<Signed, Refusal> {
    let names = spelling(headers);
    let id = headers.required(names.id, names.send)?;
    let timestamp = headers.required(names.timestamp, names.send)?;
    let signatures = headers.required(names.signature, names.send)?;
    fresh(names.timestamp, timestamp, now)?;
    let sent: Vec<&str> = signatures
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("v1,"))
        .collect();
    if sent.is_empty() {
        return Err(Refusal::missing(
            names.signature,
            format!("{} holds no v1,<base64> signature", names.signature),
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
            names.signature,
            format!(
                "{} does not match the body and the source's secret",
                names.signature
            ),
        ));
    }
    Ok(Signed {
        delivery: headers.name(names.id),
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
            (SPECIFIED.id, ID_),
            (SPECIFIED.timestamp, &AT.to_string()),
            (SPECIFIED.signature, signature),
        ])
    }

    /// The same delivery as Svix sends it by default.
    fn sent_by_svix(signature: &str) -> axum::http::HeaderMap {
        headers(&[
            (SVIX.id, ID_),
            (SVIX.timestamp, &AT.to_string()),
            (SVIX.signature, signature),
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
        assert_eq!(none.unwrap_err().header(), SPECIFIED.id);
    }

    #[test]
    fn svix_names_verify_as_svix_documents_them() {
        // Svix's documentation gives this very example with svix-* headers.
        let signed = Preset::Standard
            .verify(&[SECRET], &sent_by_svix(SIG), BODY, AT + 10)
            .unwrap();
        assert_eq!(signed.delivery.as_deref(), Some(ID_));
        let changed = Preset::Standard.verify(&[SECRET], &sent_by_svix(SIG), br#"{"test": 1}"#, AT);
        let refused = changed.unwrap_err();
        assert_eq!(refused.code(), "signature_invalid");
        assert_eq!(refused.header(), SVIX.signature);
        let late = Preset::Standard.verify(&[SECRET], &sent_by_svix(SIG), BODY, AT + 301);
        assert_eq!(late.unwrap_err().header(), SVIX.timestamp);
        // One delivery's headers are of one spelling: an id of one and a
        // signature of the other is not a delivery of either.
        let mixed = headers(&[
            (SVIX.id, ID_),
            (SPECIFIED.timestamp, &AT.to_string()),
            (SPECIFIED.signature, SIG),
        ]);
        let refused = Preset::Standard
            .verify(&[SECRET], &mixed, BODY, AT)
            .unwrap_err();
        assert_eq!(refused.header(), SPECIFIED.id);
        assert!(refused.to_string().contains("svix-id"), "{refused}");
    }
}
