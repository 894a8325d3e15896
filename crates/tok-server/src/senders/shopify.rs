//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`, the HMAC-SHA256 of the raw
//! body under the app's client secret. No timestamp is signed;
//! `X-Shopify-Webhook-Id`, the same on Shopify's retries, is the
//! idempotency key, and `X-Shopify-Topic` (`orders/create`…), which the
//! body does not carry, is kept for filters.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{Described, Headers, Refusal, Signed, any_matches, names, signs};

const SIGNATURE: &str = "X-Shopify-Hmac-Sha256";
const DELIVERY: &str = "X-Shopify-Webhook-Id";
const TOPIC: &str = "X-Shopify-Topic";

pub(super) const HEADERS: &[Described] = &[
    signs(
        SIGNATURE,
        "<base64 HMAC-SHA256 of the body under the app's client secret>",
    ),
    names(DELIVERY, "the webhook's id (the idempotency key)"),
    names(TOPIC, "the topic, kept as `_sender.event`"),
];

pub(super) const SUMMARY: &str = "X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256 of the body under the app's client secret>; X-Shopify-Webhook-Id is the idempotency key and X-Shopify-Topic is kept as _sender.event";

pub(super) fn verify(secrets: &[&str], headers: &Headers, body: &[u8]) -> Result<Signed, Refusal> {
    let value = headers.required(
        SIGNATURE,
        "Shopify sends it with every webhook; check that the subscription points at this URL",
    )?;
    let candidate = STANDARD
        .decode(value)
        .map_err(|_| Refusal::invalid(SIGNATURE, "X-Shopify-Hmac-Sha256 is not base64"))?;
    let keys: Vec<Vec<u8>> = secrets.iter().map(|s| s.as_bytes().to_vec()).collect();
    if !any_matches(&keys, &[body], &[candidate]) {
        return Err(Refusal::invalid(
            SIGNATURE,
            "X-Shopify-Hmac-Sha256 does not match the body and the source's secret",
        ));
    }
    Ok(Signed {
        delivery: headers.name(DELIVERY),
        event: headers.name(TOPIC),
    })
}

#[cfg(test)]
mod tests {
    use super::super::Preset;
    use super::super::tests::headers;
    use super::*;

    // Shopify's documentation shows how to compute the header but gives no
    // secret, body and digest together, so this vector was computed apart
    // from tok, with Python's `hmac` module:
    //   base64.b64encode(hmac.new(SECRET, BODY, hashlib.sha256).digest())
    const SECRET: &str = "shpss_a_shopify_app_client_secret";
    const BODY: &[u8] =
        br#"{"id":820982911946154508,"email":"jon@example.com","total_price":"403.00"}"#;
    const SIG: &str = "9RBsCNZ4BfVyeGy3btF9ivB5bvYs2MGnbui/+1J3Fbo=";

    #[test]
    fn a_body_signed_as_shopify_signs_verifies_and_names_the_delivery() {
        let sent = headers(&[
            (SIGNATURE, SIG),
            (DELIVERY, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
            (TOPIC, "orders/create"),
        ]);
        let signed = Preset::Shopify.verify(&[SECRET], &sent, BODY, 0).unwrap();
        assert_eq!(
            signed.delivery.as_deref(),
            Some("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043")
        );
        assert_eq!(signed.event.as_deref(), Some("orders/create"));
    }

    #[test]
    fn a_changed_body_another_secret_or_no_header_is_refused() {
        let sent = headers(&[(SIGNATURE, SIG)]);
        let changed = Preset::Shopify.verify(&[SECRET], &sent, b"{}", 0);
        assert_eq!(changed.unwrap_err().code(), "signature_invalid");
        let other = Preset::Shopify.verify(&["shpss_another_apps_secret"], &sent, BODY, 0);
        assert_eq!(other.unwrap_err().code(), "signature_invalid");
        // Hex where base64 is expected is a wrong signature, not a match.
        let hex = headers(&[(SIGNATURE, "f5106c08d67805f572786cb76ed17d8a")]);
        assert!(Preset::Shopify.verify(&[SECRET], &hex, BODY, 0).is_err());
        let none = Preset::Shopify
            .verify(&[SECRET], &headers(&[]), BODY, 0)
            .unwrap_err();
        assert_eq!(
            (none.code(), none.header()),
            ("signature_missing", SIGNATURE)
        );
    }
}
