//! Effects once (`docs/workflows.md`, "Effects once"): what a custom step's `call.once(name, …)`
//! stores. The step reads the stored result first (no connection is then
//! held while the effect runs), runs the effect only when there is none,
//! and stores what it returned; a retried attempt of the step, which has the
//! same idempotency key, reads it back and does not run the effect again.
//!
//! Rows are the tenant's, keyed by (idempotency key, name), and expire
//! with their run's step data (`RetentionStore`).

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::{RunId, TenantId};

use crate::Result;

#[async_trait]
pub trait EffectStore: Send + Sync {
    /// The result stored for this step's effect `name`, if any.
    async fn effect_result(
        &self,
        tenant: &TenantId,
        idempotency_key: &str,
        name: &str,
    ) -> Result<Option<Value>>;

    /// Stores the result of the effect `name` of the step with this
    /// idempotency key, unless one is stored already: the stored one is
    /// returned, so two attempts that raced agree on one result.
    async fn store_effect_result(
        &self,
        tenant: &TenantId,
        run: &RunId,
        idempotency_key: &str,
        name: &str,
        result: &Value,
    ) -> Result<Value>;
}

mod sql;
