//! The widget queries for both backends (see `rows.rs` for why a macro).

macro_rules! impl_widgets {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        fn widget_from_row(row: &<$db as sqlx::Database>::Row) -> Widget {
            Widget {
                id: row.get("id"),
                name: row.get("name"),
                connection: row.get("connection"),
                request: row.get::<Json<Value>, _>("request").0,
                ttl_ms: row.get("ttl_ms"),
                data: row.get::<Option<Json<Value>>, _>("data").map(|d| d.0),
                fetched_at: row.get("fetched_at"),
                created_at: row.get("created_at"),
            }
        }

        #[async_trait::async_trait]
        impl WidgetStore for $store {
            async fn create_widget(&self, tenant: &TenantId, new: NewWidget) -> Result<Widget> {
                let id = new_id("wid");
                let inserted = sqlx::query(
                    "INSERT INTO widgets (id, tenant_id, name, connection, request, ttl_ms, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                )
                .bind(&id)
                .bind(tenant.as_str())
                .bind(&new.name)
                .bind(new.connection.as_deref())
                .bind(Json(&new.request))
                .bind(new.ttl_ms)
                .bind(now_ms())
                .fetch_optional(&*self.writer().await)
                .await?;
                if inserted.is_none() {
                    return Err(StoreError::Conflict(format!(
                        "a widget named `{}` already exists",
                        new.name
                    )));
                }
                self.widget(tenant, &id).await?.ok_or(StoreError::NotFound("widget"))
            }

            async fn widgets(
                &self,
                tenant: &TenantId,
                limit: u32,
                after: Option<&str>,
            ) -> Result<$crate::Page<Widget>> {
                let rows = sqlx::query(
                    "SELECT * FROM widgets
                     WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR name > $2)
                     ORDER BY name LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(self.reader())
                .await?;
                let items = rows.iter().map(widget_from_row).collect();
                Ok($crate::Page::of(items, limit, |w: &Widget| w.name.clone()))
            }

            async fn widget(&self, tenant: &TenantId, id: &str) -> Result<Option<Widget>> {
                let row = sqlx::query("SELECT * FROM widgets WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.as_ref().map(widget_from_row))
            }

            async fn update_widget(
                &self,
                tenant: &TenantId,
                id: &str,
                patch: WidgetPatch,
            ) -> Result<Option<Widget>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let row = sqlx::query(concat!(
                    "SELECT connection, request FROM widgets WHERE tenant_id = $1 AND id = $2 ",
                    lock_rows!()
                ))
                .bind(tenant.as_str())
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = row else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                let connection: Option<String> = patch
                    .connection
                    .unwrap_or_else(|| row.get("connection"));
                let was: Value = row.get::<Json<Value>, _>("request").0;
                let request = patch.request.unwrap_or_else(|| was.clone());
                // An answer to another request is no cache of this one.
                let changed =
                    request != was || connection != row.get::<Option<String>, _>("connection");
                let row = sqlx::query(
                    "UPDATE widgets SET connection = $3, request = $4, ttl_ms = COALESCE($5, ttl_ms),
                        data = CASE WHEN $6 THEN NULL ELSE data END,
                        fetched_at = CASE WHEN $6 THEN NULL ELSE fetched_at END
                     WHERE tenant_id = $1 AND id = $2
                     RETURNING *",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(connection.as_deref())
                .bind(Json(&request))
                .bind(patch.ttl_ms)
                .bind(changed)
                .fetch_one(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(Some(widget_from_row(&row)))
            }

            async fn delete_widget(&self, tenant: &TenantId, id: &str) -> Result<bool> {
                let done = sqlx::query("DELETE FROM widgets WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .execute(&*self.writer().await)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn save_widget_data(
                &self,
                tenant: &TenantId,
                id: &str,
                data: &Value,
                fetched_at: i64,
            ) -> Result<bool> {
                let done = sqlx::query(
                    "UPDATE widgets SET data = $3, fetched_at = $4
                     WHERE tenant_id = $1 AND id = $2 AND (fetched_at IS NULL OR fetched_at <= $4)",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(Json(data))
                .bind(fetched_at)
                .execute(&*self.writer().await)
                .await?;
                Ok(done.rows_affected() > 0)
            }
        }
    };
}

pub(crate) use impl_widgets;
