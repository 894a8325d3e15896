//! [`AdminStore`] on either database: the same SQL on both, but for the
//! row lock of an update; and the tenant's row as the other parts of the
//! store read it ([`tenant`], [`tenant_limits_in`]).

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::{TenantId, new_id};
use tok_core::quotas::TenantLimits;

use super::{AdminStore, Tenant, TenantPatch, WebhookSettings};
use crate::rows::now_ms;
use crate::sql::{Conn, Driver, Row, SqlStore, on};
use crate::{Page, Result, StoreError};

/// The columns [`tenant`] reads.
pub(crate) const TENANT_COLUMNS: &str = "id, name, settings, created_at, deleting_since";

/// A tenant from its row ([`TENANT_COLUMNS`]). Settings that cannot be
/// read (written by hand) count as none set, and so does a
/// `deleting_since` that cannot.
pub(crate) fn tenant<D: Driver>(row: &Row<D>) -> Result<Tenant> {
    let settings = row
        .opt_json::<Value>("settings")
        .ok()
        .flatten()
        .unwrap_or(Value::Null);
    Ok(Tenant {
        id: TenantId::from(row.text("id")?),
        name: row.text("name")?,
        created_at: row.int("created_at")?,
        suspended: settings
            .get("suspended")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        limits: TenantLimits::of_settings(&settings),
        webhooks: WebhookSettings::of_settings(&settings),
        deleting_since: row.opt_int("deleting_since").unwrap_or(None),
    })
}

/// The tenant's quotas as the admin set them, read in the caller's
/// transaction (a dispatch's or a record's start limit falls back on the
/// tenant's); a tenant that is gone has none set.
pub(crate) async fn tenant_limits_in<D: Driver>(
    conn: &mut Conn<D>,
    tenant_id: &TenantId,
) -> Result<TenantLimits> {
    let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1");
    let row = on("tenants", &sql)
        .text(tenant_id.as_str())
        .fetch_optional::<D>(conn)
        .await?;
    Ok(row
        .as_ref()
        .map(tenant)
        .transpose()?
        .map(|t| t.limits)
        .unwrap_or_default())
}

#[async_trait]
impl<S: SqlStore> AdminStore for S {
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
        let settings = serde_json::json!({});
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        on(
            "tenants",
            "INSERT INTO tenants (id, name, settings, created_at) VALUES ($1, $2, $3, $4)",
        )
        .text(tenant.id.as_str())
        .text(name)
        .json(&settings)
        .int(tenant.created_at)
        .execute::<S::Driver>(&mut tx)
        .await?;
        let key_id = new_id("key");
        on(
            "api_keys",
            "INSERT INTO api_keys (id, tenant_id, hash, created_at, name, scopes)
                     VALUES ($1, $2, $3, $4, 'first key', 'admin')",
        )
        .text(&key_id)
        .text(tenant.id.as_str())
        .text(key_hash)
        .int(tenant.created_at)
        .execute::<S::Driver>(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(tenant)
    }

    async fn tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1");
        let mut conn = self.reader().acquire().await?;
        let row = on("tenants", &sql)
            .text(id.as_str())
            .fetch_optional::<S::Driver>(&mut conn)
            .await?;
        row.as_ref().map(tenant).transpose()
    }

    async fn update_tenant(&self, id: &TenantId, patch: TenantPatch) -> Result<Option<Tenant>> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        let select = format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1 {}",
            S::Driver::LOCK_ROWS
        );
        let row = on("tenants", &select)
            .text(id.as_str())
            .fetch_optional::<S::Driver>(&mut tx)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        if tenant(&row)?.deleting() {
            return Err(StoreError::InvalidState(format!(
                "tenant {id} is being deleted: it cannot be changed"
            )));
        }
        let mut settings = match row.json::<Value>("settings")? {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        settings.extend(patch.settings());
        let settings = Value::Object(settings);
        on(
            "tenants",
            "UPDATE tenants SET settings = $2, name = COALESCE($3, name) WHERE id = $1",
        )
        .text(id.as_str())
        .json(&settings)
        .opt_text(patch.name.as_deref())
        .execute::<S::Driver>(&mut tx)
        .await?;
        let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1");
        let row = on("tenants", &sql)
            .text(id.as_str())
            .fetch_one::<S::Driver>(&mut tx)
            .await?;
        tx.commit().await?;
        tenant(&row).map(Some)
    }

    async fn tenants(&self, limit: u32, after: Option<&str>) -> Result<Page<Tenant>> {
        let sql = format!(
            "SELECT {TENANT_COLUMNS} FROM tenants
                     WHERE CAST($1 AS TEXT) IS NULL OR id > $1
                     ORDER BY id LIMIT $2"
        );
        let mut conn = self.reader().acquire().await?;
        let rows = on("tenants", &sql)
            .opt_text(after)
            .int(i64::from(limit) + 1)
            .fetch_all::<S::Driver>(&mut conn)
            .await?;
        let items = rows.iter().map(tenant).collect::<Result<_>>()?;
        Ok(Page::of(items, limit, |t: &Tenant| t.id.to_string()))
    }

    async fn tenant_ids(&self) -> Result<Vec<TenantId>> {
        let mut conn = self.reader().acquire().await?;
        let rows = on(
            "tenants",
            "SELECT id FROM tenants WHERE deleting_since IS NULL ORDER BY id",
        )
        .fetch_all::<S::Driver>(&mut conn)
        .await?;
        rows.iter()
            .map(|r| Ok(TenantId::from(r.text("id")?)))
            .collect()
    }
}
