//! Dashboard widgets (`docs/dashboard.md`): a tile that shows what one HTTP request
//! to an outside service answers, and the answer kept as its cache. The
//! store keeps the widget's definition and its last answer with the time it
//! was fetched; whether the cache is fresh, and the call itself, are the
//! engine's (the call runs with no database connection held, between two
//! short statements).

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::TenantId;

use crate::Result;

#[derive(Debug, Clone)]
pub struct NewWidget {
    pub name: String,
    /// The connection (name or id) whose credentials and limits the call
    /// uses; `None` calls the request's absolute URL directly.
    pub connection: Option<String>,
    /// An `http` step's config: `method`, `url`, `headers`, `body`, `timeoutMs`.
    pub request: Value,
    /// How long a fetched answer is served from the cache.
    pub ttl_ms: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Widget {
    pub id: String,
    pub name: String,
    pub connection: Option<String>,
    pub request: Value,
    pub ttl_ms: i64,
    /// The last answer's body; `None` until the first fetch.
    pub data: Option<Value>,
    /// When `data` was fetched (ms since the epoch).
    pub fetched_at: Option<i64>,
    pub created_at: i64,
}

/// A change to a widget: each `Some` replaces what is stored. Its name
/// never changes.
#[derive(Debug, Clone, Default)]
pub struct WidgetPatch {
    /// `Some(None)`: the request's absolute URL is called directly.
    pub connection: Option<Option<String>>,
    pub request: Option<Value>,
    pub ttl_ms: Option<i64>,
}

#[async_trait]
pub trait WidgetStore: Send + Sync {
    /// Fails with [`crate::StoreError::Taken`] when the tenant has a
    /// widget of that name.
    async fn create_widget(&self, tenant: &TenantId, new: NewWidget) -> Result<Widget>;
    /// A page of the tenant's widgets by name, after the name `after`,
    /// each with its cached answer.
    async fn widgets(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<crate::Page<Widget>>;
    async fn widget(&self, tenant: &TenantId, id: &str) -> Result<Option<Widget>>;
    /// The tenant's widgets that call through the connection whose id is
    /// `id` or whose name is `name` (a widget names it by either), by name:
    /// what must change before that connection is deleted or moved.
    async fn widgets_through(&self, tenant: &TenantId, id: &str, name: &str)
    -> Result<Vec<Widget>>;
    /// Changes the widget `id` as `patch` says; when its request or its
    /// connection is another than before, its cached answer is dropped (the
    /// next read fetches), while a new time to live keeps it. `None` when
    /// the tenant has no widget `id`.
    async fn update_widget(
        &self,
        tenant: &TenantId,
        id: &str,
        patch: WidgetPatch,
    ) -> Result<Option<Widget>>;
    /// Deletes the widget `id`; false when the tenant has none of that id.
    async fn delete_widget(&self, tenant: &TenantId, id: &str) -> Result<bool>;
    /// Keeps `data` as the widget's answer fetched at `fetched_at`, unless
    /// a fetch that began later was kept first (then it answers false, and
    /// the newer answer stays).
    async fn save_widget_data(
        &self,
        tenant: &TenantId,
        id: &str,
        data: &Value,
        fetched_at: i64,
    ) -> Result<bool>;
}

mod sql;
