//! Sources and versioned automations: [`DefinitionStore`], whose every
//! call names its tenant, and [`SourceLookup`], the one read that comes
//! before any tenant is known (a webhook's token names its source, and so
//! its tenant), which the routed store asks of every database.

use async_trait::async_trait;
use tok_core::ids::{AutomationId, SourceId, TenantId};

use crate::{Page, Result};

mod sql;
mod types;

pub use types::*;

pub(crate) use sql::{AUTOMATION_SELECT, automation};

/// Sources and versioned automations.
#[async_trait]
pub trait DefinitionStore: Send + Sync {
    async fn create_source(&self, tenant: &TenantId, source: NewSource) -> Result<Source>;
    async fn source(&self, tenant: &TenantId, id: &SourceId) -> Result<Option<Source>>;
    async fn sources(&self, tenant: &TenantId) -> Result<Vec<Source>>;
    /// A page of sources, oldest first, after the source id `after`.
    async fn sources_page(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<Source>>;
    /// Changes what `patch` sets; `None`: no such source.
    async fn update_source(
        &self,
        tenant: &TenantId,
        id: &SourceId,
        patch: SourcePatch,
    ) -> Result<Option<Source>>;
    /// Replaces the token, the signing secret or both, keeping what they
    /// replace valid until `rotation.until`; `None`: no such source.
    async fn rotate_source(
        &self,
        tenant: &TenantId,
        id: &SourceId,
        rotation: SourceRotation,
    ) -> Result<Option<Source>>;
    /// Removes the source: its URLs answer 404 from then on. The events it
    /// brought are kept. `false`: no such source.
    async fn delete_source(&self, tenant: &TenantId, id: &SourceId) -> Result<bool>;

    async fn create_automation(&self, tenant: &TenantId, def: NewVersion) -> Result<AutomationRow>;
    /// Saves a new version; runs already started keep theirs.
    async fn save_version(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
        def: NewVersion,
    ) -> Result<AutomationRow>;
    /// Pauses, resumes or archives; an archived automation stays archived
    /// (`false`, as for no such automation).
    async fn set_automation_status(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
        status: AutomationStatus,
    ) -> Result<bool>;
    async fn automation(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
    ) -> Result<Option<AutomationRow>>;
    /// Every automation of the tenant, archived ones included (their runs
    /// still time out).
    async fn automations(&self, tenant: &TenantId) -> Result<Vec<AutomationRow>>;
    /// A page of automations, oldest first, after the automation id `after`;
    /// archived automations are not listed.
    async fn automations_page(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<AutomationRow>>;
    async fn automation_version(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
        version: i32,
    ) -> Result<Option<SavedVersion>>;
}

/// The source of a webhook token, whichever tenant it is of.
#[async_trait]
pub trait SourceLookup: Send + Sync {
    /// The source a webhook token belongs to; the token is what names the
    /// tenant. The token before a rotation opens it until the overlap ends.
    async fn source_by_token(&self, token: &str) -> Result<Option<Source>>;
}
