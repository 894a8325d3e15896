//! The keys of `TOK_SECRET_KEY` ([`Keyring`]), and the sealing and
//! opening of a connection's credentials ([`Owner`]) and of a source's
//! signing secrets ([`SourceOwner`]) with them.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tok_core::ids::TenantId;

use super::SecretError;
use super::envelope::{ENVELOPE, Envelope, envelope_text, is_empty};

/// The bytes of a key.
const KEY_BYTES: usize = 32;

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
