//! Connection credentials and webhook signing secrets encrypted at rest
//! (docs/security.md, "Credentials at rest"): the store seals a
//! connection's credentials and a source's signing secrets when it writes
//! them, and opens them when it reads them for use
//! ([`ConnectionStore::connection`](crate::ConnectionStore::connection), a
//! source's row), so every caller sees the plain value and the database
//! holds none of it.
//!
//! The cipher is XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`): an
//! AEAD whose 24-byte nonces may be drawn at random for every seal without
//! counting them. The keys come from `TOK_SECRET_KEY`: 32 random bytes in
//! base64, several comma-separated for a rotation, the newest first. The
//! newest seals; any of them opens what it sealed. Each key is known by its
//! id, the first 8 hex digits of a SHA-256 of the key (nothing of the key
//! can be learned from it), so a stored credential says which key sealed it.
//!
//! A sealed credential is the envelope
//! `{"sealed":"v1","key":"<id>","nonce":"<base64>","data":"<base64>"}` in
//! the `credentials` column. Its associated data is the tenant's and the
//! connection's ids: a ciphertext copied to another row, or another
//! tenant's, does not open. Credentials `{}` (none) are stored as they are.
//!
//! A source's signing secret (`sources.secret`, and `previous_secret`
//! during a rotation's overlap) is sealed the same way, the envelope's JSON
//! text in its `TEXT` column, with the tenant's and the source's ids as
//! associated data (a rotation moves the current secret to
//! `previous_secret` as it is: both columns of one source open alike).

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tok_core::ids::TenantId;

/// The envelope's version this code writes and reads.
const ENVELOPE: &str = "v1";

/// The bytes of a key.
const KEY_BYTES: usize = 32;

/// Why a credential or a signing secret could not be sealed or opened. The
/// messages name whose it is and the key's id, never a key or a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// No key is configured (PostgreSQL without `TOK_SECRET_KEY`).
    #[error(
        "connection credentials and webhook signing secrets are encrypted at rest under \
         TOK_SECRET_KEY, which is not set: set it on every tok process to 32 random bytes in \
         base64 (`openssl rand -base64 32`), or save the connection without credentials (the \
         source without a signing secret)"
    )]
    NoKey,
    /// The value was sealed under a key the configuration lacks. `owner`
    /// says whose it is: "the credentials of connection `shop`".
    #[error(
        "{owner} are sealed under key `{key}`, which TOK_SECRET_KEY does not hold (it holds \
         {held}): add that key to TOK_SECRET_KEY, after the newest"
    )]
    UnknownKey {
        owner: String,
        key: String,
        held: String,
    },
    /// The key is there but the ciphertext does not open with it: it was
    /// sealed for another connection, source or tenant, or it was altered.
    #[error(
        "{owner} do not open under key `{key}`: they were sealed for another row or tenant, or \
         altered"
    )]
    Broken { owner: String, key: String },
    /// An envelope this version of tok cannot read.
    #[error("{owner} are in an envelope this tok does not know ({what})")]
    Envelope { owner: String, what: String },
}

/// One key of `TOK_SECRET_KEY`. Never prints: its `Debug` shows its id.
#[derive(Clone)]
pub struct SecretKey {
    id: String,
    cipher: XChaCha20Poly1305,
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey({})", self.id)
    }
}

impl SecretKey {
    fn from_bytes(bytes: &[u8]) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"tok secret key id\0");
        hash.update(bytes);
        Self {
            id: hex::encode(&hash.finalize()[..4]),
            cipher: XChaCha20Poly1305::new_from_slice(bytes).expect("a 32-byte key"),
        }
    }

    /// The key's id: what a sealed credential names it by.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// The keys credentials are sealed and opened with, the newest first. Cheap
/// to clone; prints the keys' ids only.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Arc<Vec<SecretKey>>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.keys.iter()).finish()
    }
}

/// Whose credential: the associated data of its seal, and the name errors
/// speak of.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub tenant: &'a TenantId,
    pub connection_id: &'a str,
    pub connection_name: &'a str,
}

impl Owner<'_> {
    fn associated_data(&self) -> Vec<u8> {
        format!(
            "tok connection credentials {ENVELOPE}\0{}\0{}",
            self.tenant.as_str(),
            self.connection_id
        )
        .into_bytes()
    }

    fn named(&self) -> String {
        format!("the credentials of connection `{}`", self.connection_name)
    }
}

/// Whose signing secret: a source's, the associated data of its seal and
/// the name errors speak of. The current secret and the one before a
/// rotation are sealed alike, so a rotation moves one column to the other
/// as it is.
#[derive(Debug, Clone, Copy)]
pub struct SourceOwner<'a> {
    pub tenant: &'a TenantId,
    pub source_id: &'a str,
    pub source_name: &'a str,
}

impl SourceOwner<'_> {
    fn associated_data(&self) -> Vec<u8> {
        format!(
            "tok source signing secret {ENVELOPE}\0{}\0{}",
            self.tenant.as_str(),
            self.source_id
        )
        .into_bytes()
    }

    fn named(&self) -> String {
        format!("the signing secrets of source `{}`", self.source_name)
    }
}

impl Keyring {
    /// Parses `TOK_SECRET_KEY`: keys in base64, comma-separated, the newest
    /// first. `origin` names where the text came from in errors, which
    /// never show a key.
    pub fn parse(text: &str, origin: &str) -> Result<Self, String> {
        let mut keys: Vec<SecretKey> = Vec::new();
        for (n, entry) in text.split(',').map(str::trim).enumerate() {
            let at = format!("{origin}: key {}", n + 1);
            if entry.is_empty() {
                return Err(format!(
                    "{at} is empty; expected 32 random bytes in base64 (`openssl rand -base64 32`), \
                     several separated by commas, the newest first"
                ));
            }
            let bytes = BASE64
                .decode(entry)
                .map_err(|_| format!("{at} is not base64; expected 32 random bytes in base64 (`openssl rand -base64 32`)"))?;
            if bytes.len() != KEY_BYTES {
                return Err(format!(
                    "{at} is {} bytes; expected {KEY_BYTES} random bytes in base64 (`openssl rand -base64 32`)",
                    bytes.len()
                ));
            }
            let key = SecretKey::from_bytes(&bytes);
            if keys.iter().any(|k| k.id == key.id) {
                return Err(format!("{at} (id `{}`) is named twice", key.id));
            }
            keys.push(key);
        }
        Ok(Self {
            keys: Arc::new(keys),
        })
    }

    /// A keyring of one new random key, and that key in base64 (to keep).
    pub fn generate() -> (Self, String) {
        let bytes = XChaCha20Poly1305::generate_key(&mut OsRng);
        let text = BASE64.encode(bytes);
        (
            Self {
                keys: Arc::new(vec![SecretKey::from_bytes(&bytes)]),
            },
            text,
        )
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key that seals, if any.
    pub fn newest(&self) -> Option<&SecretKey> {
        self.keys.first()
    }

    /// The keys' ids, the newest first.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(SecretKey::id).collect()
    }

    /// These keys, then those of `older` that are not among them: what
    /// opens the credentials either sealed.
    pub fn then(&self, older: &Keyring) -> Keyring {
        let mut keys = self.keys.as_ref().clone();
        for key in older.keys.iter() {
            if !keys.iter().any(|k| k.id == key.id) {
                keys.push(key.clone());
            }
        }
        Keyring {
            keys: Arc::new(keys),
        }
    }

    /// What the `credentials` column holds for `credentials`: `{}` as it
    /// is (nothing to hide), anything else sealed under the newest key.
    pub fn seal(&self, owner: Owner<'_>, credentials: &Value) -> Result<Value, SecretError> {
        if is_empty(credentials) {
            return Ok(json!({}));
        }
        let plain = serde_json::to_vec(credentials).expect("JSON values serialize");
        self.seal_bytes(&owner.associated_data(), &plain)
    }

    /// The plain credentials of what the `credentials` column holds: a
    /// sealed envelope opened, anything else (written before credentials
    /// were sealed, or `{}`) as it is.
    pub fn open(&self, owner: Owner<'_>, stored: Value) -> Result<Value, SecretError> {
        let Some(envelope) = Envelope::of(&stored) else {
            return Ok(stored);
        };
        let named = owner.named();
        let plain = self.open_bytes(&envelope, &owner.associated_data(), &named)?;
        serde_json::from_slice(&plain).map_err(|_| SecretError::Broken {
            owner: named,
            key: envelope.key.to_owned(),
        })
    }

    /// What a source's `secret` (or `previous_secret`) column holds for
    /// the signing secret `secret`: the envelope's JSON text, sealed under
    /// the newest key.
    pub fn seal_text(&self, owner: SourceOwner<'_>, secret: &str) -> Result<String, SecretError> {
        self.seal_bytes(&owner.associated_data(), secret.as_bytes())
            .map(|envelope| envelope.to_string())
    }

    /// The plain signing secret of what a source's secret column holds: an
    /// envelope opened, anything else (a secret written before they were
    /// sealed) as it is.
    pub fn open_text(&self, owner: SourceOwner<'_>, stored: &str) -> Result<String, SecretError> {
        let Some(parsed) = envelope_text(stored) else {
            return Ok(stored.to_owned());
        };
        let envelope = Envelope::of(&parsed).expect("envelope_text returns envelopes");
        let named = owner.named();
        let plain = self.open_bytes(&envelope, &owner.associated_data(), &named)?;
        String::from_utf8(plain).map_err(|_| SecretError::Broken {
            owner: named,
            key: envelope.key.to_owned(),
        })
    }

    /// `plain` sealed under the newest key, bound to `aad`, as an envelope.
    fn seal_bytes(&self, aad: &[u8], plain: &[u8]) -> Result<Value, SecretError> {
        let key = self.newest().ok_or(SecretError::NoKey)?;
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let data = key
            .cipher
            .encrypt(&nonce, Payload { msg: plain, aad })
            .expect("XChaCha20-Poly1305 seals any message of a secret's size");
        Ok(json!({
            "sealed": ENVELOPE,
            "key": key.id,
            "nonce": BASE64.encode(nonce),
            "data": BASE64.encode(data),
        }))
    }

    /// The plain bytes of `envelope`, sealed bound to `aad`; `owner` names
    /// whose they are in errors.
    fn open_bytes(
        &self,
        envelope: &Envelope<'_>,
        aad: &[u8],
        owner: &str,
    ) -> Result<Vec<u8>, SecretError> {
        let broken = |what: &str| SecretError::Envelope {
            owner: owner.to_owned(),
            what: what.to_owned(),
        };
        if envelope.version != ENVELOPE {
            return Err(broken(&format!(
                "version `{}`; this tok reads `{ENVELOPE}`",
                envelope.version
            )));
        }
        let key = self
            .keys
            .iter()
            .find(|k| k.id == envelope.key)
            .ok_or_else(|| SecretError::UnknownKey {
                owner: owner.to_owned(),
                key: envelope.key.to_owned(),
                held: self.held(),
            })?;
        let nonce = BASE64
            .decode(envelope.nonce)
            .ok()
            .filter(|n| n.len() == 24)
            .ok_or_else(|| broken("its nonce is not 24 bytes in base64"))?;
        let data = BASE64
            .decode(envelope.data)
            .map_err(|_| broken("its data is not base64"))?;
        key.cipher
            .decrypt(XNonce::from_slice(&nonce), Payload { msg: &data, aad })
            .map_err(|_| SecretError::Broken {
                owner: owner.to_owned(),
                key: key.id.clone(),
            })
    }

    /// The ids held, for an error: "`a`, `b`" or "none".
    fn held(&self) -> String {
        if self.keys.is_empty() {
            return "none".into();
        }
        self.ids()
            .iter()
            .map(|id| format!("`{id}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Which credentials and signing secrets
/// [`Store::seal_credentials`](crate::Store::seal_credentials) seals under
/// the newest key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reseal {
    /// Those stored plain (written before they were sealed): at every
    /// start, after the SQL migrations.
    Plain,
    /// Every one not sealed under the newest key (`tok secrets rotate`),
    /// so that an older key can then be dropped.
    All,
}

/// What [`Store::seal_credentials`](crate::Store::seal_credentials) did in
/// one database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resealed {
    /// The database, its password hidden.
    pub database: String,
    /// The id of the key it sealed under; `None` without a key.
    pub key: Option<String>,
    /// Connections whose credentials were sealed under that key.
    pub resealed: u64,
    /// Sources whose signing secrets (the current one, and the one before
    /// a rotation while it is kept) were sealed under that key.
    pub signing_secrets: u64,
    /// Plain credentials and signing secrets left as they were: no key is
    /// configured.
    pub left_plain: u64,
}

/// Which key sealed what the `credentials` column holds; `None` for plain
/// credentials (or none).
pub fn sealed_under(stored: &Value) -> Option<&str> {
    Envelope::of(stored).map(|e| e.key)
}

/// Which key sealed what a source's secret column holds; `None` for a
/// plain secret.
pub fn text_sealed_under(stored: &str) -> Option<String> {
    envelope_text(stored).and_then(|v| Envelope::of(&v).map(|e| e.key.to_owned()))
}

/// The envelope a secret column's text holds, if it holds one: a plain
/// secret (never JSON of an envelope's shape) is not taken for one.
fn envelope_text(stored: &str) -> Option<Value> {
    if !stored.starts_with('{') {
        return None;
    }
    serde_json::from_str::<Value>(stored)
        .ok()
        .filter(|v| Envelope::of(v).is_some())
}

/// Whether a connection holds credentials, read from its column without
/// opening them.
pub fn holds_credentials(stored: &Value) -> bool {
    Envelope::of(stored).is_some() || !is_empty(stored)
}

fn is_empty(credentials: &Value) -> bool {
    match credentials {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

/// The fields of a sealed envelope: an object of exactly these four
/// strings (a plain credential of another shape is not taken for one).
struct Envelope<'a> {
    version: &'a str,
    key: &'a str,
    nonce: &'a str,
    data: &'a str,
}

impl<'a> Envelope<'a> {
    fn of(stored: &'a Value) -> Option<Self> {
        let map = stored.as_object()?;
        if map.len() != 4 {
            return None;
        }
        let field = |name: &str| map.get(name).and_then(Value::as_str);
        Some(Self {
            version: field("sealed")?,
            key: field("key")?,
            nonce: field("nonce")?,
            data: field("data")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner<'a>(tenant: &'a TenantId, id: &'a str) -> Owner<'a> {
        Owner {
            tenant,
            connection_id: id,
            connection_name: "shop",
        }
    }

    fn credentials() -> Value {
        json!({ "bearer": "sk_live_secret", "headers": { "X-Api-Key": "k" } })
    }

    #[test]
    fn a_sealed_credential_opens_to_what_was_sealed_and_shows_none_of_it() {
        let (keys, _) = Keyring::generate();
        let tenant = TenantId::from("ten_a".to_owned());
        let sealed = keys.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
        let text = sealed.to_string();
        assert!(!text.contains("sk_live_secret"), "{text}");
        assert_eq!(sealed["sealed"], "v1");
        assert_eq!(sealed["key"], keys.ids()[0]);
        assert_eq!(sealed_under(&sealed), Some(keys.ids()[0]));
        assert!(holds_credentials(&sealed));
        assert_eq!(
            keys.open(owner(&tenant, "con_1"), sealed).unwrap(),
            credentials()
        );
    }

    #[test]
    fn two_seals_of_one_credential_differ() {
        let (keys, _) = Keyring::generate();
        let tenant = TenantId::from("ten_a".to_owned());
        let a = keys.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
        let b = keys.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
        assert_ne!(a["nonce"], b["nonce"]);
        assert_ne!(a["data"], b["data"]);
    }

    #[test]
    fn a_seal_moved_to_another_connection_or_tenant_does_not_open() {
        let (keys, _) = Keyring::generate();
        let (a, b) = (
            TenantId::from("ten_a".to_owned()),
            TenantId::from("ten_b".to_owned()),
        );
        let sealed = keys.seal(owner(&a, "con_1"), &credentials()).unwrap();
        let id = keys.ids()[0].to_owned();
        let broken = SecretError::Broken {
            owner: "the credentials of connection `shop`".into(),
            key: id,
        };
        assert_eq!(
            keys.open(owner(&a, "con_2"), sealed.clone()),
            Err(broken.clone())
        );
        assert_eq!(keys.open(owner(&b, "con_1"), sealed.clone()), Err(broken));
        let mut altered = sealed;
        let data = altered["data"].as_str().unwrap().to_owned();
        let flipped = if data.starts_with('A') { "B" } else { "A" };
        altered["data"] = json!(format!("{flipped}{}", &data[1..]));
        assert!(matches!(
            keys.open(owner(&a, "con_1"), altered),
            Err(SecretError::Broken { .. })
        ));
    }

    #[test]
    fn an_older_key_opens_and_the_newest_seals() {
        let (old, old_text) = Keyring::generate();
        let (new, new_text) = Keyring::generate();
        let both = Keyring::parse(&format!("{new_text}, {old_text}"), "TOK_SECRET_KEY").unwrap();
        assert_eq!(both.ids(), vec![new.ids()[0], old.ids()[0]]);
        let tenant = TenantId::from("ten_a".to_owned());
        let under_old = old.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
        assert_eq!(
            both.open(owner(&tenant, "con_1"), under_old).unwrap(),
            credentials()
        );
        let resealed = both.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
        assert_eq!(sealed_under(&resealed), Some(new.ids()[0]));
    }

    #[test]
    fn a_key_not_held_is_named_with_the_ones_that_are() {
        let (old, _) = Keyring::generate();
        let (new, _) = Keyring::generate();
        let tenant = TenantId::from("ten_a".to_owned());
        let sealed = old.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
        let error = new
            .open(owner(&tenant, "con_1"), sealed.clone())
            .unwrap_err();
        let message = error.to_string();
        assert!(message.contains(old.ids()[0]), "{message}");
        assert!(message.contains(new.ids()[0]), "{message}");
        assert!(message.contains("TOK_SECRET_KEY"), "{message}");
        let none = Keyring::default()
            .open(owner(&tenant, "con_1"), sealed)
            .unwrap_err();
        assert!(none.to_string().contains("holds none"), "{none}");
    }

    #[test]
    fn nothing_to_hide_needs_no_key_and_plain_credentials_open_as_they_are() {
        let none = Keyring::default();
        let tenant = TenantId::from("ten_a".to_owned());
        assert_eq!(
            none.seal(owner(&tenant, "c"), &json!({})).unwrap(),
            json!({})
        );
        assert_eq!(
            none.seal(owner(&tenant, "c"), &Value::Null).unwrap(),
            json!({})
        );
        assert_eq!(
            none.seal(owner(&tenant, "c"), &credentials()),
            Err(SecretError::NoKey)
        );
        assert!(SecretError::NoKey.to_string().contains("TOK_SECRET_KEY"));
        assert_eq!(
            none.open(owner(&tenant, "c"), credentials()).unwrap(),
            credentials()
        );
        assert!(!holds_credentials(&json!({})));
        assert!(holds_credentials(&credentials()));
    }

    #[test]
    fn an_unknown_envelope_version_says_so() {
        let (keys, _) = Keyring::generate();
        let tenant = TenantId::from("ten_a".to_owned());
        let mut sealed = keys.seal(owner(&tenant, "c"), &credentials()).unwrap();
        sealed["sealed"] = json!("v9");
        let error = keys.open(owner(&tenant, "c"), sealed).unwrap_err();
        assert!(error.to_string().contains("version `v9`"), "{error}");
    }

    #[test]
    fn bad_keys_are_refused_without_showing_them() {
        let short = BASE64.encode([7u8; 16]);
        let error = Keyring::parse(&short, "TOK_SECRET_KEY").unwrap_err();
        assert!(error.contains("key 1 is 16 bytes; expected 32"), "{error}");
        assert!(!error.contains(&short), "{error}");
        let error = Keyring::parse("not base64!", "TOK_SECRET_KEY").unwrap_err();
        assert!(error.contains("key 1 is not base64"), "{error}");
        assert!(!error.contains("not base64!"), "{error}");
        let (_, key) = Keyring::generate();
        let error = Keyring::parse(&format!("{key},"), "TOK_SECRET_KEY").unwrap_err();
        assert!(error.contains("key 2 is empty"), "{error}");
        let error = Keyring::parse(&format!("{key},{key}"), "TOK_SECRET_KEY").unwrap_err();
        assert!(error.contains("named twice"), "{error}");
    }

    fn source<'a>(tenant: &'a TenantId, id: &'a str) -> SourceOwner<'a> {
        SourceOwner {
            tenant,
            source_id: id,
            source_name: "eshop",
        }
    }

    #[test]
    fn a_sealed_signing_secret_opens_for_its_source_only() {
        let (keys, _) = Keyring::generate();
        let (a, b) = (
            TenantId::from("ten_a".to_owned()),
            TenantId::from("ten_b".to_owned()),
        );
        let secret = "whsec_c2VjcmV0IG9mIHRoZSBzZW5kZXI=";
        let sealed = keys.seal_text(source(&a, "src_1"), secret).unwrap();
        assert!(!sealed.contains(secret), "{sealed}");
        assert_eq!(text_sealed_under(&sealed).as_deref(), Some(keys.ids()[0]));
        assert_eq!(
            keys.open_text(source(&a, "src_1"), &sealed).unwrap(),
            secret
        );
        for (tenant, id) in [(&a, "src_2"), (&b, "src_1")] {
            let error = keys.open_text(source(tenant, id), &sealed).unwrap_err();
            assert!(matches!(error, SecretError::Broken { .. }), "{error}");
            assert!(error.to_string().contains("source `eshop`"), "{error}");
        }
        // A connection's seal of the same ids is not a source's.
        let as_credentials = keys
            .seal(owner(&a, "src_1"), &json!({ "bearer": secret }))
            .unwrap();
        assert!(
            keys.open_text(source(&a, "src_1"), &as_credentials.to_string())
                .is_err()
        );
        // A secret stored before sealing opens as it is, and is known as plain.
        assert_eq!(keys.open_text(source(&a, "src_1"), secret).unwrap(), secret);
        assert_eq!(text_sealed_under(secret), None);
        assert_eq!(text_sealed_under("{\"a\": 1}"), None);
        assert_eq!(
            Keyring::default().seal_text(source(&a, "src_1"), secret),
            Err(SecretError::NoKey)
        );
    }

    #[test]
    fn a_keyring_prints_its_ids_and_no_key() {
        let (keys, text) = Keyring::generate();
        let printed = format!("{keys:?}");
        assert!(printed.contains(keys.ids()[0]), "{printed}");
        assert!(!printed.contains(&text), "{printed}");
    }
}
