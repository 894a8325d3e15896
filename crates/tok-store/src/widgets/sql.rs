//! [`WidgetStore`] on every store, on the tenant's database: the same SQL
//! on both databases, but for the row lock of an update.

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::{TenantId, new_id};

use super::{NewWidget, Widget, WidgetPatch, WidgetStore};
use crate::rows::now_ms;
use crate::sql::{Driver, DriverOf, Route, Row, SqlStore as _, on};
use crate::{Page, Result, StoreError};

fn widget<D: Driver>(row: &Row<D>) -> Result<Widget> {
    Ok(Widget {
        id: row.text("id")?,
        name: row.text("name")?,
        connection: row.opt_text("connection")?,
        request: row.json("request")?,
        ttl_ms: row.int("ttl_ms")?,
        data: row.opt_json("data")?,
        fetched_at: row.opt_int("fetched_at")?,
        created_at: row.int("created_at")?,
    })
}

#[async_trait]
impl<R: Route> WidgetStore for R {
    async fn create_widget(&self, tenant: &TenantId, new: NewWidget) -> Result<Widget> {
        let id = new_id("wid");
        let db = self.db_for(tenant).await?;
        let inserted = db
            .call(async {
                let writer = db.writer().await;
                let mut conn = writer.acquire().await?;
                on(
                    "widgets",
                    "INSERT INTO widgets (id, tenant_id, name, connection, request, ttl_ms,
                        created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                )
                .text(&id)
                .text(tenant.as_str())
                .text(&new.name)
                .opt_text(new.connection.as_deref())
                .json(&new.request)
                .int(new.ttl_ms)
                .int(now_ms())
                .fetch_optional::<DriverOf<R>>(&mut conn)
                .await
            })
            .await?;
        if inserted.is_none() {
            return Err(StoreError::Taken(format!(
                "a widget named `{}` already exists",
                new.name
            )));
        }
        self.widget(tenant, &id)
            .await?
            .ok_or(StoreError::NotFound("widget"))
    }

    async fn widgets(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<Widget>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let rows = on(
                "widgets",
                "SELECT * FROM widgets
                 WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR name > $2)
                 ORDER BY name LIMIT $3",
            )
            .text(tenant.as_str())
            .opt_text(after)
            .int(i64::from(limit) + 1)
            .fetch_all::<DriverOf<R>>(&mut conn)
            .await?;
            let items = rows.iter().map(widget).collect::<Result<_>>()?;
            Ok(Page::of(items, limit, |w: &Widget| w.name.clone()))
        })
        .await
    }

    async fn widget(&self, tenant: &TenantId, id: &str) -> Result<Option<Widget>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let row = on(
                "widgets",
                "SELECT * FROM widgets WHERE tenant_id = $1 AND id = $2",
            )
            .text(tenant.as_str())
            .text(id)
            .fetch_optional::<DriverOf<R>>(&mut conn)
            .await?;
            row.as_ref().map(widget).transpose()
        })
        .await
    }

    async fn widgets_through(
        &self,
        tenant: &TenantId,
        id: &str,
        name: &str,
    ) -> Result<Vec<Widget>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let rows = on(
                "widgets",
                "SELECT * FROM widgets
                 WHERE tenant_id = $1 AND (connection = $2 OR connection = $3)
                 ORDER BY name",
            )
            .text(tenant.as_str())
            .text(id)
            .text(name)
            .fetch_all::<DriverOf<R>>(&mut conn)
            .await?;
            rows.iter().map(widget).collect()
        })
        .await
    }

    async fn update_widget(
        &self,
        tenant: &TenantId,
        id: &str,
        patch: WidgetPatch,
    ) -> Result<Option<Widget>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            let select = format!(
                "SELECT connection, request FROM widgets WHERE tenant_id = $1 AND id = $2 {}",
                DriverOf::<R>::LOCK_ROWS
            );
            let row = on("widgets", &select)
                .text(tenant.as_str())
                .text(id)
                .fetch_optional::<DriverOf<R>>(&mut tx)
                .await?;
            let Some(row) = row else {
                tx.rollback().await?;
                return Ok(None);
            };
            let was_connection = row.opt_text("connection")?;
            let was: Value = row.json("request")?;
            let connection = patch.connection.unwrap_or_else(|| was_connection.clone());
            let request = patch.request.unwrap_or_else(|| was.clone());
            // An answer to another request is no cache of this one.
            let changed = request != was || connection != was_connection;
            let row = on(
                "widgets",
                "UPDATE widgets SET connection = $3, request = $4,
                    ttl_ms = COALESCE($5, ttl_ms),
                    data = CASE WHEN $6 THEN NULL ELSE data END,
                    fetched_at = CASE WHEN $6 THEN NULL ELSE fetched_at END
                 WHERE tenant_id = $1 AND id = $2
                 RETURNING *",
            )
            .text(tenant.as_str())
            .text(id)
            .opt_text(connection.as_deref())
            .json(&request)
            .opt_int(patch.ttl_ms)
            .bool(changed)
            .fetch_one::<DriverOf<R>>(&mut tx)
            .await?;
            tx.commit().await?;
            widget(&row).map(Some)
        })
        .await
    }

    async fn delete_widget(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            let deleted = on(
                "widgets",
                "DELETE FROM widgets WHERE tenant_id = $1 AND id = $2",
            )
            .text(tenant.as_str())
            .text(id)
            .execute::<DriverOf<R>>(&mut conn)
            .await?;
            Ok(deleted > 0)
        })
        .await
    }

    async fn save_widget_data(
        &self,
        tenant: &TenantId,
        id: &str,
        data: &Value,
        fetched_at: i64,
    ) -> Result<bool> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            let saved = on(
                "widgets",
                "UPDATE widgets SET data = $3, fetched_at = $4
                 WHERE tenant_id = $1 AND id = $2
                   AND (fetched_at IS NULL OR fetched_at <= $4)",
            )
            .text(tenant.as_str())
            .text(id)
            .json(data)
            .int(fetched_at)
            .execute::<DriverOf<R>>(&mut conn)
            .await?;
            Ok(saved > 0)
        })
        .await
    }
}
