//! API keys: a tenant's keys with their names and scopes, and the platform
//! admin's. A key is kept as the SHA-256 of its secret only; the secret is
//! shown once, when the key is made. A revoked key keeps its row, since
//! runs and decisions name their key as their actor.

use async_trait::async_trait;
use serde::Serialize;
use tok_core::ids::TenantId;

use crate::{KeyOwner, Page, Result};

/// What a key may do. Every route of the API needs one scope; `admin`
/// grants every scope, and `write` grants `read` and `signal` too (a key
/// that changes a resource may look at it, and start its runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every listing and detail of the tenant's.
    Read,
    /// Creating and changing the tenant's resources, and acting on runs;
    /// grants `read` and `signal`.
    Write,
    /// Sending signals and starting runs: the key of a system that feeds
    /// tok and sees nothing of it.
    Signal,
    /// Everything, and managing the tenant's keys.
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Read, Scope::Write, Scope::Signal, Scope::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Signal => "signal",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether a key holding `self` may do what needs `needed`.
    pub fn grants(self, needed: Scope) -> bool {
        self == needed
            || self == Scope::Admin
            || (self == Scope::Write && matches!(needed, Scope::Read | Scope::Signal))
    }

    /// Scopes as stored: their names, comma-separated, sorted.
    pub fn join(scopes: &[Scope]) -> String {
        let mut names: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names.join(",")
    }

    /// The stored form back; a name this build does not know is left out
    /// (it grants nothing).
    pub fn split(text: &str) -> Vec<Scope> {
        text.split(',').filter_map(Scope::parse).collect()
    }
}

/// An API key as listed: everything but its secret, which is never kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub id: String,
    /// `None` for a platform admin key.
    pub tenant_id: Option<TenantId>,
    pub name: String,
    pub scopes: Vec<Scope>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    /// When a request last used the key (written at most once a minute
    /// per process).
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

impl ApiKey {
    pub fn owner(&self) -> KeyOwner {
        match &self.tenant_id {
            Some(t) => KeyOwner::Tenant(t.clone()),
            None => KeyOwner::Platform,
        }
    }

    /// Whether the key may do what needs `needed`. A platform admin key
    /// may do everything.
    pub fn grants(&self, needed: Scope) -> bool {
        self.tenant_id.is_none() || self.scopes.iter().any(|s| s.grants(needed))
    }

    /// Whether the key has expired at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        self.expires_at.is_some_and(|at| at <= now_ms)
    }
}

/// The most keys a tenant may hold at once (revoked ones aside): every
/// request reads one by its hash, and a tenant must not grow the table
/// without bound.
pub const MAX_KEYS_PER_TENANT: i64 = 100;

/// A tenant key to make: `hash` is the SHA-256 of its secret
/// ([`crate::hash_secret`]).
#[derive(Debug, Clone)]
pub struct NewKey {
    pub name: String,
    pub scopes: Vec<Scope>,
    pub expires_at: Option<i64>,
    pub hash: String,
}

/// What revoking or changing a key did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyChange {
    /// Done now (or, for a revocation, before): the key as it now is. A
    /// revoked key answers 401 from now on.
    Done(ApiKey),
    /// The tenant has no key of that id (that is not revoked, for a change).
    NotFound,
    /// It is the tenant's last key with `admin` that has not expired; it
    /// keeps `admin`, or nobody could manage the tenant's keys.
    LastAdmin,
}

/// A change to a key: `None` leaves the field as it is. The secret never
/// changes (make a new key for that).
#[derive(Debug, Clone, Default)]
pub struct KeyPatch {
    pub name: Option<String>,
    pub scopes: Option<Vec<Scope>>,
}

/// API keys. Lookups by hash cover every tenant (the key is what names its
/// tenant); everything else is scoped by tenant.
#[async_trait]
pub trait KeyStore: Send + Sync {
    /// The key with this hash, unless it was revoked (an expired key is
    /// returned, for the caller to say so).
    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>>;
    /// Makes a key of the tenant's; a tenant holding
    /// [`MAX_KEYS_PER_TENANT`] keys is a
    /// [`StoreError::InvalidState`](crate::StoreError::InvalidState).
    async fn create_key(&self, tenant: &TenantId, key: NewKey) -> Result<ApiKey>;
    /// A page of the tenant's keys that are not revoked, oldest first,
    /// after the key id `after`.
    async fn keys(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<ApiKey>>;
    /// Revokes a key of the tenant's, but never its last admin key.
    async fn revoke_key(&self, tenant: &TenantId, id: &str) -> Result<KeyChange>;
    /// Renames a key or changes its scopes, but never takes `admin` from
    /// the tenant's last admin key. A revoked key is not found.
    async fn update_key(&self, tenant: &TenantId, id: &str, patch: KeyPatch) -> Result<KeyChange>;
    /// Notes that the key was used at `at` (unix ms).
    async fn touch_key(&self, id: &str, at: i64) -> Result<()>;
    /// Whether a platform admin key that is not revoked exists.
    async fn has_admin_key(&self) -> Result<bool>;
    /// Adds a platform admin key (the one generated at first start); a
    /// hash already there is left as it is.
    async fn add_admin_key(&self, hash: &str) -> Result<()>;
    /// What the key with this hash is to the platform: its admin key, an
    /// admin key rotated out, a tenant's key, or none of these.
    async fn admin_key_state(&self, hash: &str) -> Result<AdminKeyState>;
    /// Makes the key with this hash the only platform admin key: adds it
    /// and revokes every other, in one transaction, serialized with any
    /// other rotation (on PostgreSQL, across processes). Returns how many
    /// it revoked: none when it is the only admin key already. A key that
    /// was an admin key and was rotated out is never taken back, and a
    /// tenant's key is not taken over
    /// ([`StoreError::InvalidState`](crate::StoreError::InvalidState) and
    /// [`StoreError::Taken`](crate::StoreError::Taken)). Only an
    /// explicit rotation calls it (`tok admin-key rotate`, or the first
    /// start), never a start with an old `TOK_ADMIN_KEY`.
    async fn rotate_admin_key(&self, hash: &str) -> Result<u64>;
}

/// What a key's hash is to the platform ([`KeyStore::admin_key_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminKeyState {
    /// A platform admin key that is not revoked.
    Current,
    /// A platform admin key revoked at `at` (ms since the epoch) by a
    /// rotation.
    RotatedOut { at: i64 },
    /// One of a tenant's keys.
    Tenant,
    /// No key has this hash.
    Unknown,
}

mod sql;
