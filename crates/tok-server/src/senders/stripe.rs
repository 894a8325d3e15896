//! Stripe: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]`, the
//! HMAC-SHA256 of `{t}.{body}` under the endpoint's signing secret taken
//! as it is (`whsec_…` is not decoded, unlike Standard Webhooks). Several
//! `v1` are sent while Stripe rolls the secret; any one matching is
//! enough; `v0` (test-mode legacy) is not read. Stripe names a delivery by
//! the event's `id` in the body, which its retries repeat
//! ([`super::Preset::body_key`]).

use super::{Described, Headers, Refusal, Signed, any_matches, fresh, signs};

const HEADER: &str = "Stripe-Signature";

pub(super) const HEADERS: &[Described] = &[signs(
    HEADER,
    "t=<unix seconds>,v1=<hex HMAC-SHA256 of `{t}.{body}` under the signing secret>",
)];

pub(super) const SUMMARY: &str = "Stripe-Signature: t=<unix seconds, within 5 minutes>,v1=<hex HMAC-SHA256 of `t.body` under the endpoint's signing secret whsec_…>; the event's `id` is the idempotency key";

pub(super) fn verify(
    secrets: &[&str],
    headers: &Headers,
    body: &[u8],
    now: i64,
) -> Result<Signed, Refusal> {
    let value = headers.required(
        HEADER,
        "Stripe sends it with every event; check the endpoint's URL in Stripe's dashboard",
    )?;
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for pair in value.split(',') {
        match pair.trim().split_once('=') {
            Some(("t", t)) => timestamp = Some(t.trim()),
            Some(("v1", hex_sig)) => {
                // A v1 that is not hex matches nothing; the others may.
                if let Ok(sig) = hex::decode(hex_sig.trim()) {
                    candidates.push(sig);
                }
            }
            _ => {}
        }
    }
    let Some(timestamp) = timestamp else {
        return Err(Refusal::missing(
            HEADER,
            "Stripe-Signature has no t=<unix seconds>",
        ));
    };
    if candidates.is_empty() {
        return Err(Refusal::missing(
            HEADER,
            "Stripe-Signature has no v1=<hex> signature",
        ));
    }
    fresh(HEADER, timestamp, now)?;
    let keys: Vec<Vec<u8>> = secrets.iter().map(|s| s.as_bytes().to_vec()).collect();
    if !any_matches(&keys, &[timestamp.as_bytes(), b".", body], &candidates) {
        return Err(Refusal::invalid(
            HEADER,
            "no v1 signature of Stripe-Signature matches the body and the source's signing secret",
        ));
    }
    Ok(Signed::default())
}

#[cfg(test)]
mod tests {
    use super::super::Preset;
    use super::super::tests::headers;
    use super::*;

    // Stripe's documentation shows the header's shape
    // (`t=1492774577,v1=5257a869…,v0=6ffbb59b…`) but not the secret and
    // body behind it, so this vector was computed apart from tok, with
    // Python's `hmac` module:
    //   hmac.new(SECRET, b"1492774577." + BODY, hashlib.sha256).hexdigest()
    const SECRET: &str = "whsec_test_secret_of_the_stripe_example";
    const AT: i64 = 1492774577;
    const BODY: &[u8] = b"{\n  \"id\": \"evt_test_webhook\",\n  \"object\": \"event\"\n}";
    const V1: &str = "8c5e3728ac262a4a022cd06cdca78a43b0272e7f21d7505fc7c56e74758b9db8";

    fn sent(value: &str) -> axum::http::HeaderMap {
        headers(&[(HEADER, value)])
    }

    #[test]
    fn a_signature_as_stripe_makes_it_verifies_among_others() {
        let value = format!("t={AT},v1={V1}");
        assert!(
            Preset::Stripe
                .verify(&[SECRET], &sent(&value), BODY, AT + 299)
                .is_ok()
        );
        // The v1 of a secret being rolled out, and a legacy v0, beside it.
        let rolling = format!(
            "t={AT},v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd,v1={V1},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"
        );
        assert!(
            Preset::Stripe
                .verify(&[SECRET], &sent(&rolling), BODY, AT)
                .is_ok()
        );
    }

    #[test]
    fn what_stripe_did_not_sign_is_refused_with_the_reason() {
        let value = format!("t={AT},v1={V1}");
        let code = |secret: &str, value: &str, body: &[u8], now: i64| {
            Preset::Stripe
                .verify(&[secret], &sent(value), body, now)
                .unwrap_err()
                .code()
        };
        assert_eq!(code(SECRET, &value, b"{}", AT), "signature_invalid");
        assert_eq!(
            code("whsec_another_endpoints_secret", &value, BODY, AT),
            "signature_invalid"
        );
        assert_eq!(
            code(SECRET, &value, BODY, AT + 301),
            "timestamp_out_of_range"
        );
        assert_eq!(
            code(SECRET, &format!("v1={V1}"), BODY, AT),
            "signature_missing"
        );
        assert_eq!(
            code(SECRET, &format!("t={AT}"), BODY, AT),
            "signature_missing"
        );
        // The timestamp is signed: moving it breaks the signature.
        let moved = format!("t={},v1={V1}", AT + 1);
        assert_eq!(code(SECRET, &moved, BODY, AT), "signature_invalid");
        let missing = Preset::Stripe
            .verify(&[SECRET], &headers(&[]), BODY, AT)
            .unwrap_err();
        assert_eq!(
            (missing.code(), missing.header()),
            ("signature_missing", HEADER)
        );
    }
}
