//! The senders a webhook source can name (`verify: {preset, secret}`): how
//! each one signs what it sends, and what it names a delivery by.
//!
//! The webhook reads the request's raw bytes, then asks the source's
//! [`Preset`] to [`verify`](Preset::verify) them with the source's secrets
//! (two during a rotation's overlap) before anything is parsed or stored.
//! A preset answers what it vouched for ([`Signed`]: the sender's delivery
//! id, its event type) or why it refuses ([`Refusal`], a 401 naming the
//! header it read). One file per sender holds its header names, its
//! message and its documented test vectors; this module holds what they
//! share: reading headers, the timestamp window, and the HMAC compared in
//! constant time (`hmac`'s `verify_slice`).

mod github;
mod shopify;
mod slack;
mod standard;
mod stripe;

use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

use crate::error::ApiError;

/// How far a signed timestamp may be from the server's clock, either way:
/// the five minutes Stripe, Slack and Standard Webhooks document.
pub(crate) const TOLERANCE_SECS: u64 = 300;

/// Most signatures read from one header (Stripe and Standard Webhooks send
/// several during their own key rotations): what a sender sends, bounded.
const MAX_SIGNATURES: usize = 16;

/// Longest secret a source keeps.
const MAX_SECRET_BYTES: usize = 1024;

/// Shortest secret a source keeps: a guessable one is no signature.
const MIN_SECRET_BYTES: usize = 16;

/// The senders tok knows the signatures of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Preset {
    /// Standard Webhooks (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`, or Svix's `svix-*` names of the same): Svix
    /// and whoever follows the specification.
    Standard,
    Stripe,
    Github,
    Shopify,
    Slack,
}

/// One header a sender sends, for the webhook's help.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub(crate) struct SentHeader {
    pub(crate) name: &'static str,
    /// What it carries.
    pub(crate) carries: &'static str,
}

/// What a verified request vouches for besides its body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Signed {
    /// The sender's own id of this delivery (its idempotency key), when it
    /// sends one in a header.
    pub(crate) delivery: Option<String>,
    /// The sender's event type, when it sends it in a header rather than
    /// the body (`X-GitHub-Event`, `X-Shopify-Topic`).
    pub(crate) event: Option<String>,
}

/// Why a request is not taken as the sender's: a 401 naming the header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// A header the sender always sends is absent (or has no signature).
    #[error("{message}")]
    Missing {
        header: &'static str,
        message: String,
    },
    /// The header is there, but what it says does not hold.
    #[error("{message}")]
    Invalid {
        header: &'static str,
        message: String,
    },
    /// The signed timestamp is more than [`TOLERANCE_SECS`] away.
    #[error(
        "{header} is {away} s away from the server's clock; at most {TOLERANCE_SECS} s are accepted, so a captured request cannot be sent again later"
    )]
    Stale { header: &'static str, away: u64 },
}

impl Refusal {
    fn missing(header: &'static str, message: impl Into<String>) -> Self {
        Refusal::Missing {
            header,
            message: message.into(),
        }
    }

    fn invalid(header: &'static str, message: impl Into<String>) -> Self {
        Refusal::Invalid {
            header,
            message: message.into(),
        }
    }

    pub(crate) fn code(&self) -> &'static str {
        match self {
            Refusal::Missing { .. } => "signature_missing",
            Refusal::Invalid { .. } => "signature_invalid",
            Refusal::Stale { .. } => "timestamp_out_of_range",
        }
    }

    pub(crate) fn header(&self) -> &'static str {
        match self {
            Refusal::Missing { header, .. }
            | Refusal::Invalid { header, .. }
            | Refusal::Stale { header, .. } => header,
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            refusal.code(),
            refusal.to_string(),
        )
        .with("header", refusal.header())
    }
}

impl Preset {
    pub(crate) const ALL: [Preset; 5] = [
        Preset::Standard,
        Preset::Stripe,
        Preset::Github,
        Preset::Shopify,
        Preset::Slack,
    ];

    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Preset::Standard => "standard",
            Preset::Stripe => "stripe",
            Preset::Github => "github",
            Preset::Shopify => "shopify",
            Preset::Slack => "slack",
        }
    }

    /// Checks `secret` as this sender hands it out, before it is kept.
    pub(crate) fn check_secret(self, secret: &str) -> Result<(), String> {
        if secret.len() > MAX_SECRET_BYTES {
            return Err(format!(
                "is {} bytes; at most {MAX_SECRET_BYTES} are kept",
                secret.len()
            ));
        }
        if secret.trim() != secret || secret.chars().any(char::is_control) {
            return Err(
                "has spaces or control characters at its ends or inside; paste the secret exactly as the sender shows it"
                    .into(),
            );
        }
        let key_len = match self {
            Preset::Standard => standard::key(secret)?.len(),
            _ => secret.len(),
        };
        if key_len < MIN_SECRET_BYTES {
            return Err(format!(
                "holds {key_len} bytes; at least {MIN_SECRET_BYTES} are needed ({})",
                self.secret_hint()
            ));
        }
        Ok(())
    }

    /// Where a tenant finds this sender's secret.
    fn secret_hint(self) -> &'static str {
        match self {
            Preset::Standard => "Standard Webhooks: whsec_<base64>",
            Preset::Stripe => "Stripe shows the endpoint's signing secret, whsec_…",
            Preset::Github => "the secret typed into the GitHub webhook's settings",
            Preset::Shopify => "the app's client secret, or the one Shopify shows for the webhook",
            Preset::Slack => "the app's Signing Secret, under Basic Information",
        }
    }

    /// Verifies `body` as sent with `headers` against any of `secrets` at
    /// `now` (unix seconds). Nothing of the body is parsed here.
    pub(crate) fn verify(
        self,
        secrets: &[&str],
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Signed, Refusal> {
        let headers = Headers(headers);
        match self {
            Preset::Standard => standard::verify(secrets, &headers, body, now),
            Preset::Stripe => stripe::verify(secrets, &headers, body, now),
            Preset::Github => github::verify(secrets, &headers, body),
            Preset::Shopify => shopify::verify(secrets, &headers, body),
            Preset::Slack => slack::verify(secrets, &headers, body, now),
        }
    }

    /// Whether `headers` carry any of the headers this sender signs with:
    /// a dry run asked with the tenant's key and none of them is not
    /// checked, one with any of them is.
    pub(crate) fn sent_any(self, headers: &HeaderMap) -> bool {
        self.headers()
            .iter()
            .any(|h| h.signs && headers.contains_key(h.header.name))
    }

    /// The headers a sender sends, for the webhook's help.
    pub(crate) fn sent_headers(self) -> Vec<SentHeader> {
        self.headers().iter().map(|h| h.header).collect()
    }

    fn headers(self) -> &'static [Described] {
        match self {
            Preset::Standard => standard::HEADERS,
            Preset::Stripe => stripe::HEADERS,
            Preset::Github => github::HEADERS,
            Preset::Shopify => shopify::HEADERS,
            Preset::Slack => slack::HEADERS,
        }
    }

    /// The body's top-level field that names the delivery, for a sender
    /// that names it in the (signed) body rather than a header: Stripe's
    /// event id, which its retries repeat; the Events API's `event_id`.
    pub(crate) fn body_key(self) -> Option<&'static str> {
        match self {
            Preset::Stripe => Some("id"),
            Preset::Slack => Some("event_id"),
            Preset::Standard | Preset::Github | Preset::Shopify => None,
        }
    }

    /// The challenge to answer instead of taking the body as an event:
    /// Slack's `url_verification` handshake, for a Slack source only.
    pub(crate) fn challenge(self, body: &serde_json::Value) -> Option<&str> {
        match self {
            Preset::Slack => slack::challenge(body),
            _ => None,
        }
    }

    /// One line for the webhook's help: how the sender signs.
    pub(crate) fn summary(self) -> &'static str {
        match self {
            Preset::Standard => standard::SUMMARY,
            Preset::Stripe => stripe::SUMMARY,
            Preset::Github => github::SUMMARY,
            Preset::Shopify => shopify::SUMMARY,
            Preset::Slack => slack::SUMMARY,
        }
    }
}

/// A header of a sender, and whether it is part of the signature (a dry
/// run with the tenant's key checks the signature once any of those is
/// sent).
struct Described {
    header: SentHeader,
    signs: bool,
}

const fn signs(name: &'static str, carries: &'static str) -> Described {
    Described {
        header: SentHeader { name, carries },
        signs: true,
    }
}

const fn names(name: &'static str, carries: &'static str) -> Described {
    Described {
        header: SentHeader { name, carries },
        signs: false,
    }
}

/// The request's headers as the senders read them.
struct Headers<'a>(&'a HeaderMap);

impl Headers<'_> {
    /// The trimmed value of `name`, `None` when it is absent or empty; a
    /// value that is not visible ASCII cannot be what the sender sent.
    fn get(&self, name: &'static str) -> Result<Option<&str>, Refusal> {
        match self.0.get(name) {
            None => Ok(None),
            Some(value) => match value.to_str() {
                Ok(text) if text.trim().is_empty() => Ok(None),
                Ok(text) => Ok(Some(text.trim())),
                Err(_) => Err(Refusal::invalid(
                    name,
                    format!("{name} holds bytes that are not visible ASCII"),
                )),
            },
        }
    }

    /// The value of `name`, which the sender always sends.
    fn required(&self, name: &'static str, what: &str) -> Result<&str, Refusal> {
        self.get(name)?
            .ok_or_else(|| Refusal::missing(name, format!("{name} is missing: {what}")))
    }

    /// A delivery id or event type header, kept when it is short enough
    /// to be one (a longer value is left out, not refused: the signature
    /// does not depend on it; an id past the inbox's key length is hashed
    /// into the key by the webhook).
    fn name(&self, name: &'static str) -> Option<String> {
        self.get(name)
            .ok()
            .flatten()
            .filter(|v| v.len() <= MAX_NAME_LEN)
            .map(str::to_owned)
    }
}

/// Longest delivery id or event type kept from a header.
const MAX_NAME_LEN: usize = 1024;

/// The signed timestamp of `header`, checked against `now`.
fn fresh(header: &'static str, text: &str, now: i64) -> Result<(), Refusal> {
    let sent: i64 = text.parse().map_err(|_| {
        Refusal::invalid(
            header,
            format!(
                "{header} must be unix seconds, like {now}; it is `{}`",
                short(text)
            ),
        )
    })?;
    // Any i64 may be sent: the distance is taken without overflow.
    let away = now.abs_diff(sent);
    if away > TOLERANCE_SECS {
        return Err(Refusal::Stale { header, away });
    }
    Ok(())
}

/// HMAC-SHA256 of the concatenated `parts` under `key`.
fn mac(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Whether any of `candidates` (at most [`MAX_SIGNATURES`] read) is the
/// HMAC of `parts` under any of `keys`, each compared in constant time.
fn any_matches(keys: &[Vec<u8>], parts: &[&[u8]], candidates: &[Vec<u8>]) -> bool {
    let mut found = false;
    for key in keys {
        let mac = mac(key, parts);
        for candidate in candidates.iter().take(MAX_SIGNATURES) {
            // No early exit: the time taken does not say which matched.
            found |= mac.clone().verify_slice(candidate).is_ok();
        }
    }
    found
}

/// At most 40 characters of `text`, for a message that quotes it.
fn short(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A header map of `pairs`.
    pub(crate) fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            let name = axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            map.insert(name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn every_preset_reads_back_by_its_name() {
        for preset in Preset::ALL {
            assert_eq!(Preset::parse(preset.as_str()), Some(preset));
        }
        assert_eq!(Preset::parse("Stripe"), None);
    }

    #[test]
    fn a_secret_is_checked_for_length_and_stray_spaces() {
        assert!(
            Preset::Github
                .check_secret("It's a Secret to Everybody")
                .is_ok()
        );
        let short = Preset::Github.check_secret("hunter2").unwrap_err();
        assert!(short.contains("7 bytes"), "{short}");
        let spaced = Preset::Slack
            .check_secret(" 8f742231b10e8888abcd99yyyzzz85a5")
            .unwrap_err();
        assert!(spaced.contains("spaces"), "{spaced}");
        assert!(Preset::Stripe.check_secret(&"x".repeat(2000)).is_err());
        // Standard Webhooks measures the key the secret decodes to.
        assert!(Preset::Standard.check_secret("whsec_c2hvcnQ=").is_err());
        assert!(
            Preset::Standard
                .check_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .is_ok()
        );
    }

    #[test]
    fn a_timestamp_far_either_way_or_not_a_number_is_refused() {
        assert_eq!(fresh("t", "1000", 1300), Ok(()));
        assert_eq!(
            fresh("t", "1000", 1301),
            Err(Refusal::Stale {
                header: "t",
                away: 301
            })
        );
        assert!(matches!(
            fresh("t", &i64::MIN.to_string(), 0),
            Err(Refusal::Stale { .. })
        ));
        assert!(matches!(
            fresh("t", "soon", 0),
            Err(Refusal::Invalid { .. })
        ));
    }

    #[test]
    fn a_refusal_is_a_401_naming_its_header() {
        let error = ApiError::from(Refusal::missing("X-Hub-Signature-256", "gone"));
        assert_eq!(error.status, StatusCode::UNAUTHORIZED);
        assert_eq!(error.code, "signature_missing");
        assert_eq!(error.extra["header"], "X-Hub-Signature-256");
    }
}
