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
//!
//! The keys and what seals and opens with them are `keyring.rs`; the
//! envelope as stored and what can be told of it without a key,
//! `envelope.rs`; sealing a whole database anew (at a start, and for
//! `tok secrets rotate`), `reseal.rs`.

mod envelope;
mod keyring;
mod reseal;
#[cfg(test)]
mod tests;

pub use envelope::{holds_credentials, sealed_under, text_sealed_under};
pub use keyring::{Keyring, Owner, SecretKey, SourceOwner};
pub(crate) use reseal::Resealing;

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
