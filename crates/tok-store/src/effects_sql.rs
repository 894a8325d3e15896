//! The queries of effects once ([`EffectStore`](crate::EffectStore)) for
//! both backends (see `rows.rs` for why a macro per file).

macro_rules! impl_effects {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        #[async_trait::async_trait]
        impl $crate::effects::EffectStore for $store {
            async fn effect_result(
                &self,
                tenant: &TenantId,
                idempotency_key: &str,
                name: &str,
            ) -> Result<Option<Value>> {
                let row = sqlx::query(
                    "SELECT result FROM step_effects
                     WHERE tenant_id = $1 AND idempotency_key = $2 AND name = $3",
                )
                .bind(tenant.as_str())
                .bind(idempotency_key)
                .bind(name)
                .fetch_optional(self.reader())
                .await?;
                Ok(row.map(|r| r.get::<Json<Value>, _>("result").0))
            }

            async fn store_effect_result(
                &self,
                tenant: &TenantId,
                run: &RunId,
                idempotency_key: &str,
                name: &str,
                result: &Value,
            ) -> Result<Value> {
                if let Some(pointer) = $crate::storable::nul_at(result) {
                    return Err($crate::storable::nul_refused(
                        "the effect's result",
                        &pointer,
                    ));
                }
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query(
                    "INSERT INTO step_effects (tenant_id, idempotency_key, name, run_id, result,
                        created_at)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (tenant_id, idempotency_key, name) DO NOTHING",
                )
                .bind(tenant.as_str())
                .bind(idempotency_key)
                .bind(name)
                .bind(run.as_str())
                .bind(Json(result))
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
                let stored = sqlx::query(
                    "SELECT result FROM step_effects
                     WHERE tenant_id = $1 AND idempotency_key = $2 AND name = $3",
                )
                .bind(tenant.as_str())
                .bind(idempotency_key)
                .bind(name)
                .fetch_one(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(stored.get::<Json<Value>, _>("result").0)
            }
        }
    };
}

pub(crate) use impl_effects;
