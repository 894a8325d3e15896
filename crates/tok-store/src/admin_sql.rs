//! Tenants ([`AdminStore`](crate::AdminStore)) for both
//! backends (see `rows.rs` for why a macro per file).

macro_rules! impl_admin {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// The columns [`tenant_from_row`] reads.
        pub(crate) const TENANT_COLUMNS: &str = "id, name, settings, created_at, deleting_since";

        pub(crate) fn tenant_from_row(row: &<$db as sqlx::Database>::Row) -> Tenant {
            let settings = row
                .try_get::<Json<Value>, _>("settings")
                .map(|s| s.0)
                .unwrap_or(Value::Null);
            Tenant {
                id: TenantId::from(row.get::<String, _>("id")),
                name: row.get("name"),
                created_at: row.get("created_at"),
                suspended: settings
                    .get("suspended")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                limits: tok_core::quotas::TenantLimits::of_settings(&settings),
                webhooks: crate::WebhookSettings::of_settings(&settings),
                deleting_since: row.try_get("deleting_since").unwrap_or(None),
            }
        }

        /// The tenant's quotas as the admin set them, read in the caller's
        /// transaction (a dispatch's or a record's start limit falls back
        /// on the tenant's); a tenant that is gone has none set.
        async fn tenant_limits_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
        ) -> Result<tok_core::quotas::TenantLimits> {
            let row = sqlx::query(&format!(
                "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
            ))
            .bind(tenant.as_str())
            .fetch_optional(&mut **tx)
            .await?;
            Ok(row
                .as_ref()
                .map(tenant_from_row)
                .map(|t| t.limits)
                .unwrap_or_default())
        }

        #[async_trait::async_trait]
        impl AdminStore for $store {
            async fn create_tenant(&self, name: &str, key_hash: &str) -> Result<Tenant> {
                let tenant = Tenant {
                    id: TenantId::from(new_id("ten")),
                    name: name.to_owned(),
                    created_at: now_ms(),
                    suspended: false,
                    limits: Default::default(),
                    webhooks: Default::default(),
                    deleting_since: None,
                };
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query(
                    "INSERT INTO tenants (id, name, settings, created_at) VALUES ($1, $2, $3, $4)",
                )
                .bind(tenant.id.as_str())
                .bind(name)
                .bind(Json(serde_json::json!({})))
                .bind(tenant.created_at)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO api_keys (id, tenant_id, hash, created_at, name, scopes)
                     VALUES ($1, $2, $3, $4, 'first key', 'admin')",
                )
                .bind(new_id("key"))
                .bind(tenant.id.as_str())
                .bind(key_hash)
                .bind(tenant.created_at)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(tenant)
            }

            async fn tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
                let row = sqlx::query(&format!(
                    "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
                ))
                .bind(id.as_str())
                .fetch_optional(self.reader())
                .await?;
                Ok(row.as_ref().map(tenant_from_row))
            }

            async fn update_tenant(
                &self,
                id: &TenantId,
                patch: TenantPatch,
            ) -> Result<Option<Tenant>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let row = sqlx::query(&format!(
                    "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1 {}",
                    lock_rows!()
                ))
                .bind(id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = row else {
                    return Ok(None);
                };
                if tenant_from_row(&row).deleting() {
                    return Err(StoreError::Conflict(format!(
                        "tenant {id} is being deleted: it cannot be changed"
                    )));
                }
                let mut settings = match row.try_get::<Json<Value>, _>("settings")?.0 {
                    Value::Object(map) => map,
                    _ => serde_json::Map::new(),
                };
                settings.extend(patch.settings());
                sqlx::query(
                    "UPDATE tenants SET settings = $2, name = COALESCE($3, name) WHERE id = $1",
                )
                .bind(id.as_str())
                .bind(Json(Value::Object(settings)))
                .bind(patch.name.as_deref())
                .execute(&mut *tx)
                .await?;
                let row = sqlx::query(&format!(
                    "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
                ))
                .bind(id.as_str())
                .fetch_one(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(Some(tenant_from_row(&row)))
            }

            async fn tenants(&self, limit: u32, after: Option<&str>) -> Result<Page<Tenant>> {
                let rows = sqlx::query(&format!(
                    "SELECT {TENANT_COLUMNS} FROM tenants
                     WHERE CAST($1 AS TEXT) IS NULL OR id > $1
                     ORDER BY id LIMIT $2"
                ))
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(self.reader())
                .await?;
                let items = rows.iter().map(tenant_from_row).collect();
                Ok(Page::of(items, limit, |t: &Tenant| t.id.to_string()))
            }

            async fn tenant_ids(&self) -> Result<Vec<TenantId>> {
                let rows =
                    sqlx::query("SELECT id FROM tenants WHERE deleting_since IS NULL ORDER BY id")
                        .fetch_all(self.reader())
                        .await?;
                Ok(rows
                    .iter()
                    .map(|r| TenantId::from(r.get::<String, _>("id")))
                    .collect())
            }
        }
    };
}

pub(crate) use impl_admin;
