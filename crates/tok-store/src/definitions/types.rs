//! The rows of sources and automations and the inputs that write them,
//! as [`DefinitionStore`](super::DefinitionStore) reads and writes them.

use serde::Serialize;
use serde_json::Value;
use tok_core::ids::{AutomationId, SourceId, TenantId};

#[derive(Debug, Clone)]
pub struct NewSource {
    pub name: String,
    pub token: String,
    pub params: Value,
    pub critical: bool,
    pub rate_limit: Option<i32>,
    pub secret: Option<String>,
    /// Whose signature the secret checks (`standard`, `stripe`, …); the
    /// server knows the senders, the store keeps the name.
    pub verify_preset: Option<String>,
    /// A JSON Schema the bodies must meet, checked by the server at ingest.
    pub schema: Option<Value>,
}

/// A source as the store reads it, its signing secrets opened. Its `Debug`
/// shows neither its tokens nor its secrets.
#[derive(Clone, Serialize)]
pub struct Source {
    pub id: SourceId,
    pub tenant_id: TenantId,
    pub name: String,
    #[serde(skip)]
    pub token: String,
    pub params: Value,
    pub critical: bool,
    pub rate_limit: Option<i32>,
    /// The signing secret, opened (it is sealed at rest). When it does not
    /// open ([`Source::secret_error`]) this holds what is stored, so the
    /// source still reads as signed; [`Source::secrets`] then refuses.
    #[serde(skip)]
    pub secret: Option<String>,
    /// Whose signature `secret` checks, as the server names the senders;
    /// `None` with a secret is `standard` (Standard Webhooks), as every
    /// signed source was before senders had names.
    pub verify_preset: Option<String>,
    /// The JSON Schema its bodies must meet, if it has one.
    pub schema: Option<Value>,
    /// The token before the last rotation, valid until
    /// `previous_token_until` (ms since the epoch).
    #[serde(skip)]
    pub previous_token: Option<String>,
    pub previous_token_until: Option<i64>,
    /// The signing secret before the last rotation, valid until
    /// `previous_secret_until`.
    #[serde(skip)]
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<i64>,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    /// Why the signing secrets do not open (their key is not in
    /// `TOK_SECRET_KEY`, or they were altered); `None` when they opened.
    #[serde(skip)]
    pub secret_error: Option<crate::SecretError>,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("Source")
            .field("id", &self.id)
            .field("tenant_id", &self.tenant_id)
            .field("name", &self.name)
            .field("token", &"***")
            .field("secret", &hidden(&self.secret))
            .field("verify_preset", &self.verify_preset)
            .field("previous_token", &hidden(&self.previous_token))
            .field("previous_secret", &hidden(&self.previous_secret))
            .field("secret_error", &self.secret_error)
            .finish_non_exhaustive()
    }
}

impl Source {
    /// The signing secrets a webhook may be signed with at `now`: the
    /// current one and, within a rotation's overlap, the one before; or why
    /// they do not open (nothing is verified with what is stored).
    pub fn secrets(&self, now: i64) -> Result<Vec<&str>, crate::SecretError> {
        if let Some(error) = &self.secret_error {
            return Err(error.clone());
        }
        let previous = self
            .previous_secret
            .as_deref()
            .filter(|_| self.previous_secret_until.is_some_and(|until| until > now));
        Ok(self.secret.as_deref().into_iter().chain(previous).collect())
    }

    /// Until when `token` opens this source: `None` for its current token
    /// (for as long as it stays current), the overlap's end for the token
    /// before the last rotation.
    pub fn token_until(&self, token: &str) -> Option<i64> {
        if token == self.token {
            None
        } else {
            self.previous_token_until
        }
    }
}

/// What a source's change sets; `None` leaves the field as it is.
#[derive(Debug, Clone, Default)]
pub struct SourcePatch {
    pub name: Option<String>,
    pub params: Option<Value>,
    pub critical: Option<bool>,
    /// `Some(None)` removes the rate limit.
    pub rate_limit: Option<Option<i32>>,
    /// `Some(None)` removes the schema.
    pub schema: Option<Option<Value>>,
    /// The sender and its secret, for a source that had none: a signed
    /// source's secret rotates ([`SourceRotation`]) instead.
    pub verify: Option<(String, String)>,
}

/// A rotation of a source's token, its signing secret, or both. What is
/// replaced stays valid until `until` (ms since the epoch); an `until` not
/// after the rotation's time ends it at once.
#[derive(Debug, Clone)]
pub struct SourceRotation {
    /// The new token, when the token rotates.
    pub token: Option<String>,
    /// The new signing secret, when the secret rotates.
    pub secret: Option<String>,
    pub until: i64,
}

/// A definition to save as a new automation or a new version of one.
#[derive(Debug, Clone)]
pub struct NewVersion {
    pub name: String,
    pub definition: Value,
    pub hash: String,
    /// `webhook`, `event`, `poll`, `schedule` or `manual`.
    pub trigger_kind: String,
    /// The source id of a webhook trigger, the event name of an event trigger.
    pub trigger_key: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AutomationStatus {
    Active,
    Paused,
    /// Deleted: starts no run and is in no listing; its row and versions
    /// stay for the runs that name it.
    Archived,
}

impl AutomationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Archived => "archived",
        }
    }

    pub(crate) fn parse(s: &str) -> Self {
        match s {
            "paused" => Self::Paused,
            "archived" => Self::Archived,
            _ => Self::Active,
        }
    }
}

/// One saved version of an automation: its definition and the hash of it.
#[derive(Debug, Clone)]
pub struct SavedVersion {
    pub definition: Value,
    pub hash: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct AutomationRow {
    pub id: AutomationId,
    pub tenant_id: TenantId,
    pub name: String,
    pub status: AutomationStatus,
    pub version: i32,
    pub definition: Value,
    pub hash: String,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub updated_at: i64,
    /// When its poll or schedule trigger is due next; `None` for other
    /// triggers (and on the row a create or a new version answers, before
    /// the scheduler's row is written).
    #[serde(serialize_with = "crate::rfc3339::serialize_opt")]
    pub next_run_at: Option<i64>,
}
