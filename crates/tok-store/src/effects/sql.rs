//! [`EffectStore`] on every store: the same SQL on both databases, on the
//! tenant's database.

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::{RunId, TenantId};

use super::EffectStore;
use crate::Result;
use crate::rows::now_ms;
use crate::sql::{DriverOf, Route, SqlStore as _, on};
use crate::storable::{nul_at, nul_refused};

const STORED: &str = "SELECT result FROM step_effects
     WHERE tenant_id = $1 AND idempotency_key = $2 AND name = $3";

#[async_trait]
impl<R: Route> EffectStore for R {
    async fn effect_result(
        &self,
        tenant: &TenantId,
        idempotency_key: &str,
        name: &str,
    ) -> Result<Option<Value>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let row = on("step_effects", STORED)
                .text(tenant.as_str())
                .text(idempotency_key)
                .text(name)
                .fetch_optional::<DriverOf<R>>(&mut conn)
                .await?;
            row.map(|r| r.json("result")).transpose()
        })
        .await
    }

    async fn store_effect_result(
        &self,
        tenant: &TenantId,
        run: &RunId,
        idempotency_key: &str,
        name: &str,
        result: &Value,
    ) -> Result<Value> {
        if let Some(pointer) = nul_at(result) {
            return Err(nul_refused("the effect's result", &pointer));
        }
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            on(
                "step_effects",
                "INSERT INTO step_effects (tenant_id, idempotency_key, name, run_id, result,
                    created_at)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (tenant_id, idempotency_key, name) DO NOTHING",
            )
            .text(tenant.as_str())
            .text(idempotency_key)
            .text(name)
            .text(run.as_str())
            .json(result)
            .int(now_ms())
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            let stored = on("step_effects", STORED)
                .text(tenant.as_str())
                .text(idempotency_key)
                .text(name)
                .fetch_one::<DriverOf<R>>(&mut tx)
                .await?;
            tx.commit().await?;
            stored.json("result")
        })
        .await
    }
}
