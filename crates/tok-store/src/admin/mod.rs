//! Tenants, as the platform admin sees them: a tenant's row, what the
//! admin may change of it, and [`AdminStore`], which creates, reads and
//! changes them.

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tok_core::ids::TenantId;

use crate::{Page, Result};

#[derive(Debug, Clone, Serialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    /// Suspended by the platform admin: the built-in step authorizer denies
    /// every step with side effects of its runs.
    pub suspended: bool,
    /// Its quotas as the admin set them (`settings.limits`); a setting
    /// that no longer reads (written by hand) counts as none set.
    #[serde(skip)]
    pub limits: tok_core::quotas::TenantLimits,
    /// How its webhooks are guarded (`settings.webhooks`).
    #[serde(skip)]
    pub webhooks: WebhookSettings,
    /// When the platform admin asked for it to be deleted (unix ms): its
    /// keys are revoked, nothing of it starts, and its rows are being
    /// erased ([`OffboardingStore`](crate::OffboardingStore)). `None`: in
    /// service.
    #[serde(skip)]
    pub deleting_since: Option<i64>,
}

impl Tenant {
    /// Whether it is being deleted.
    pub fn deleting(&self) -> bool {
        self.deleting_since.is_some()
    }
}

/// `settings.webhooks`: how a tenant's webhooks are guarded, as the
/// platform admin set it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookSettings {
    /// `requireSignature`: every source must check its sender's signature
    /// (a source without `verify` cannot be created, and an older one's
    /// webhooks are refused). `None`: the platform's default
    /// (`TOK_REQUIRE_SIGNED_WEBHOOKS`) decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_signature: Option<bool>,
}

impl WebhookSettings {
    /// The setting in a tenant's `settings` object; one that no longer
    /// reads (written by hand) counts as none set.
    pub fn of_settings(settings: &Value) -> Self {
        settings
            .get("webhooks")
            .and_then(|w| serde_json::from_value(w.clone()).ok())
            .unwrap_or_default()
    }

    /// Whether signatures are required, given the platform's default.
    pub fn requires_signature(&self, platform_default: bool) -> bool {
        self.require_signature.unwrap_or(platform_default)
    }
}

/// What the platform admin changes of a tenant (`PATCH /api/tenants/{id}`):
/// each field left `None` stays as it is. The settings live in the tenant's
/// `settings` object, so a new one needs no migration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantPatch {
    /// A new name (the caller checked it).
    pub name: Option<String>,
    pub suspended: Option<bool>,
    /// Replaces `settings.limits` whole (the caller merged the change).
    pub limits: Option<tok_core::quotas::TenantLimits>,
    /// Replaces `settings.webhooks` whole (the caller merged the change).
    pub webhooks: Option<WebhookSettings>,
}

impl TenantPatch {
    /// The patch as the keys of `settings` it sets.
    pub fn settings(&self) -> serde_json::Map<String, Value> {
        let mut map = serde_json::Map::new();
        if let Some(suspended) = self.suspended {
            map.insert("suspended".into(), Value::Bool(suspended));
        }
        if let Some(limits) = &self.limits {
            let limits =
                serde_json::to_value(limits).unwrap_or_else(|_| Value::Object(Default::default()));
            map.insert("limits".into(), limits);
        }
        if let Some(webhooks) = &self.webhooks {
            let webhooks = serde_json::to_value(webhooks)
                .unwrap_or_else(|_| Value::Object(Default::default()));
            map.insert("webhooks".into(), webhooks);
        }
        map
    }
}

/// Tenants: the platform-level part (their keys are
/// [`KeyStore`](crate::KeyStore)'s).
#[async_trait]
pub trait AdminStore: Send + Sync {
    /// Creates a tenant together with its first API key (stored as a hash),
    /// named `first key`, with the `admin` scope.
    async fn create_tenant(&self, name: &str, key_hash: &str) -> Result<Tenant>;
    /// The tenant, in service or being deleted ([`Tenant::deleting`]).
    async fn tenant(&self, id: &TenantId) -> Result<Option<Tenant>>;
    /// Applies the admin's change to a tenant's name and settings; `None`:
    /// no such tenant. A tenant being deleted cannot be changed
    /// ([`StoreError::InvalidState`](crate::StoreError::InvalidState)); on a
    /// [`RoutedStore`](crate::RoutedStore), neither can a tenant's name
    /// where `TOK_TENANT_DATABASES` routes it by name.
    async fn update_tenant(&self, id: &TenantId, patch: TenantPatch) -> Result<Option<Tenant>>;
    /// A page of tenants (those being deleted too), oldest first, after the
    /// tenant id `after`.
    async fn tenants(&self, limit: u32, after: Option<&str>) -> Result<Page<Tenant>>;
    /// The tenants in service: the ones the engine dispatches, claims and
    /// schedules for (not those being deleted).
    async fn tenant_ids(&self) -> Result<Vec<TenantId>>;
}

mod sql;

pub(crate) use sql::{TENANT_COLUMNS, tenant, tenant_limits_in};
