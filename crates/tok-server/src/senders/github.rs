//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the raw
//! body under the webhook's secret. Nothing but the body is signed (there
//! is no timestamp), so `X-GitHub-Delivery`, the GUID GitHub keeps for a
//! redelivery, is the idempotency key, and `X-GitHub-Event` (`push`,
//! `issues`, `ping`…), which the body does not carry, is kept for filters.

use super::{Described, Headers, Refusal, Signed, any_matches, names, signs};

const SIGNATURE: &str = "X-Hub-Signature-256";
const DELIVERY: &str = "X-GitHub-Delivery";
const EVENT: &str = "X-GitHub-Event";

pub(super) const HEADERS: &[Described] = &[
    signs(
        SIGNATURE,
        "sha256=<hex HMAC-SHA256 of the body under the webhook's secret>",
    ),
    names(DELIVERY, "the delivery's GUID (the idempotency key)"),
    names(EVENT, "the event's name, kept as `_sender.event`"),
];

pub(super) const SUMMARY: &str = "X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body under the webhook's secret>; X-GitHub-Delivery is the idempotency key and X-GitHub-Event is kept as _sender.event";

pub(super) fn verify(secrets: &[&str], headers: &Headers, body: &[u8]) -> Result<Signed, Refusal> {
    let value = headers.required(
        SIGNATURE,
        "GitHub sends it when the webhook has a secret; set the same secret in the webhook's settings",
    )?;
    let Some(hex_sig) = value.strip_prefix("sha256=") else {
        return Err(Refusal::invalid(
            SIGNATURE,
            "X-Hub-Signature-256 must be sha256=<hex>",
        ));
    };
    let candidate = hex::decode(hex_sig)
        .map_err(|_| Refusal::invalid(SIGNATURE, "X-Hub-Signature-256 is not sha256=<hex>"))?;
    let keys: Vec<Vec<u8>> = secrets.iter().map(|s| s.as_bytes().to_vec()).collect();
    if !any_matches(&keys, &[body], &[candidate]) {
        return Err(Refusal::invalid(
            SIGNATURE,
            "X-Hub-Signature-256 does not match the body and the source's secret",
        ));
    }
    Ok(Signed {
        delivery: headers.name(DELIVERY),
        event: headers.name(EVENT),
    })
}

#[cfg(test)]
mod tests {
    use super::super::Preset;
    use super::super::tests::headers;
    use super::*;

    /// GitHub's documentation ("Validating webhook deliveries", testing
    /// the webhook payload validation): this secret and payload give this
    /// signature.
    const SECRET: &str = "It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    const SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    #[test]
    fn the_documented_example_verifies_and_names_the_delivery() {
        let sent = headers(&[
            (SIGNATURE, SIG),
            (DELIVERY, "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
            (EVENT, "issues"),
        ]);
        let signed = Preset::Github.verify(&[SECRET], &sent, BODY, 0).unwrap();
        assert_eq!(
            signed.delivery.as_deref(),
            Some("72d3162e-cc78-11e3-81ab-4c9367dc0958")
        );
        assert_eq!(signed.event.as_deref(), Some("issues"));
        // During a rotation either secret verifies.
        assert!(
            Preset::Github
                .verify(&["the-new-secret-of-the-hook", SECRET], &sent, BODY, 0)
                .is_ok()
        );
    }

    #[test]
    fn a_changed_body_another_secret_or_no_header_is_refused() {
        let sent = headers(&[(SIGNATURE, SIG)]);
        let changed = Preset::Github.verify(&[SECRET], &sent, b"Hello, World?", 0);
        assert_eq!(changed.unwrap_err().code(), "signature_invalid");
        let other = Preset::Github.verify(&["It's a Smurfin' Secret"], &sent, BODY, 0);
        assert_eq!(other.unwrap_err().code(), "signature_invalid");
        let sha1 = headers(&[(SIGNATURE, "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59")]);
        let refused = Preset::Github
            .verify(&[SECRET], &sha1, BODY, 0)
            .unwrap_err();
        assert_eq!(
            (refused.code(), refused.header()),
            ("signature_invalid", SIGNATURE)
        );
        let none = Preset::Github
            .verify(&[SECRET], &headers(&[]), BODY, 0)
            .unwrap_err();
        assert_eq!(
            (none.code(), none.header()),
            ("signature_missing", SIGNATURE)
        );
    }
}
