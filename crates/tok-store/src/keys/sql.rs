//! [`KeyStore`] on either database: the same SQL on both, but for the row
//! lock of the tenant whose keys change and the lock a rotation of the
//! platform admin key takes ([`Driver::ADMIN_KEY_LOCK`]).

use async_trait::async_trait;
use tok_core::ids::{TenantId, new_id};

use super::{
    AdminKeyState, ApiKey, KeyChange, KeyPatch, KeyStore, MAX_KEYS_PER_TENANT, NewKey, Scope,
};
use crate::rows::now_ms;
use crate::sql::{Conn, Driver, Row, SqlStore, on};
use crate::{Page, Result, StoreError};

const KEY_COLUMNS: &str =
    "id, tenant_id, name, scopes, created_at, expires_at, last_used_at, revoked_at";

fn api_key<D: Driver>(row: &Row<D>) -> Result<ApiKey> {
    Ok(ApiKey {
        id: row.text("id")?,
        tenant_id: row.opt_text("tenant_id")?.map(TenantId::from),
        name: row.text("name")?,
        scopes: Scope::split(&row.text("scopes")?),
        created_at: row.int("created_at")?,
        expires_at: row.opt_int("expires_at")?,
        last_used_at: row.opt_int("last_used_at")?,
        revoked_at: row.opt_int("revoked_at")?,
    })
}

/// Locks the tenant's row until the transaction ends: the lock that
/// changes of the tenant's keys queue on. False when there is no such
/// tenant.
async fn lock_tenant<D: Driver>(conn: &mut Conn<D>, tenant: &TenantId) -> Result<bool> {
    let sql = format!("SELECT id FROM tenants WHERE id = $1 {}", D::LOCK_ROWS);
    let locked = on("tenants", &sql)
        .text(tenant.as_str())
        .fetch_optional::<D>(conn)
        .await?;
    Ok(locked.is_some())
}

/// The tenant's key `id`, with the tenant's row locked: the lock two
/// changes of its last two admin keys queue on. `None` when there is no
/// such tenant or key. Every refusal after it rolls back before it
/// answers: a dropped transaction keeps the row locked until its
/// connection is next used.
async fn locked_key<D: Driver>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    id: &str,
) -> Result<Option<ApiKey>> {
    if !lock_tenant::<D>(conn, tenant).await? {
        return Ok(None);
    }
    let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 AND id = $2");
    let row = on("api_keys", &sql)
        .text(tenant.as_str())
        .text(id)
        .fetch_optional::<D>(conn)
        .await?;
    row.as_ref().map(api_key).transpose()
}

/// How many other admin keys of the tenant work at `now`.
async fn other_admins<D: Driver>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    id: &str,
    now: i64,
) -> Result<usize> {
    let sql = format!(
        "SELECT {KEY_COLUMNS} FROM api_keys
                 WHERE tenant_id = $1 AND id <> $2 AND revoked_at IS NULL"
    );
    let others = on("api_keys", &sql)
        .text(tenant.as_str())
        .text(id)
        .fetch_all::<D>(conn)
        .await?;
    let mut count = 0;
    for row in &others {
        let key = api_key(row)?;
        if key.scopes.contains(&Scope::Admin) && !key.expired(now) {
            count += 1;
        }
    }
    Ok(count)
}

#[async_trait]
impl<S: SqlStore> KeyStore for S {
    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>> {
        let sql =
            format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = $1 AND revoked_at IS NULL");
        let mut conn = self.reader().acquire().await?;
        let row = on("api_keys", &sql)
            .text(hash)
            .fetch_optional::<S::Driver>(&mut conn)
            .await?;
        row.as_ref().map(api_key).transpose()
    }

    async fn create_key(&self, tenant: &TenantId, key: NewKey) -> Result<ApiKey> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        // The tenant's row is the lock concurrent makes queue on, so the
        // count below holds until this one commits.
        if !lock_tenant::<S::Driver>(&mut tx, tenant).await? {
            tx.rollback().await?;
            return Err(StoreError::NotFound("tenant"));
        }
        let held = on(
            "api_keys",
            "SELECT COUNT(*) AS n FROM api_keys WHERE tenant_id = $1 AND revoked_at IS NULL",
        )
        .text(tenant.as_str())
        .fetch_one::<S::Driver>(&mut tx)
        .await?
        .int("n")?;
        if held >= MAX_KEYS_PER_TENANT {
            tx.rollback().await?;
            return Err(StoreError::InvalidState(format!(
                "the tenant holds {held} keys, the most it may; revoke one it no longer uses first"
            )));
        }
        let sql = format!(
            "INSERT INTO api_keys (id, tenant_id, hash, created_at, name, scopes, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     RETURNING {KEY_COLUMNS}"
        );
        let id = new_id("key");
        let scopes = Scope::join(&key.scopes);
        let row = on("api_keys", &sql)
            .text(&id)
            .text(tenant.as_str())
            .text(&key.hash)
            .int(now_ms())
            .text(&key.name)
            .text(&scopes)
            .opt_int(key.expires_at)
            .fetch_one::<S::Driver>(&mut tx)
            .await?;
        tx.commit().await?;
        api_key(&row)
    }

    async fn keys(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<ApiKey>> {
        let sql = format!(
            "SELECT {KEY_COLUMNS} FROM api_keys
                     WHERE tenant_id = $1 AND revoked_at IS NULL
                       AND (CAST($2 AS TEXT) IS NULL OR id > $2)
                     ORDER BY id LIMIT $3"
        );
        let mut conn = self.reader().acquire().await?;
        let rows = on("api_keys", &sql)
            .text(tenant.as_str())
            .opt_text(after)
            .int(i64::from(limit) + 1)
            .fetch_all::<S::Driver>(&mut conn)
            .await?;
        let items = rows.iter().map(api_key).collect::<Result<_>>()?;
        Ok(Page::of(items, limit, |k: &ApiKey| k.id.clone()))
    }

    async fn revoke_key(&self, tenant: &TenantId, id: &str) -> Result<KeyChange> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        let key = match locked_key::<S::Driver>(&mut tx, tenant, id).await? {
            Some(key) if key.revoked_at.is_some() => {
                tx.rollback().await?;
                return Ok(KeyChange::Done(key));
            }
            Some(key) => key,
            None => {
                tx.rollback().await?;
                return Ok(KeyChange::NotFound);
            }
        };
        let now = now_ms();
        if key.scopes.contains(&Scope::Admin)
            && !key.expired(now)
            && other_admins::<S::Driver>(&mut tx, tenant, id, now).await? == 0
        {
            tx.rollback().await?;
            return Ok(KeyChange::LastAdmin);
        }
        on(
            "api_keys",
            "UPDATE api_keys SET revoked_at = $3 WHERE tenant_id = $1 AND id = $2",
        )
        .text(tenant.as_str())
        .text(id)
        .int(now)
        .execute::<S::Driver>(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(KeyChange::Done(ApiKey {
            revoked_at: Some(now),
            ..key
        }))
    }

    async fn update_key(&self, tenant: &TenantId, id: &str, patch: KeyPatch) -> Result<KeyChange> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        let key = match locked_key::<S::Driver>(&mut tx, tenant, id).await? {
            Some(key) if key.revoked_at.is_none() => key,
            _ => {
                tx.rollback().await?;
                return Ok(KeyChange::NotFound);
            }
        };
        let now = now_ms();
        let loses_admin = patch
            .scopes
            .as_ref()
            .is_some_and(|scopes| !scopes.contains(&Scope::Admin));
        if loses_admin
            && key.scopes.contains(&Scope::Admin)
            && !key.expired(now)
            && other_admins::<S::Driver>(&mut tx, tenant, id, now).await? == 0
        {
            tx.rollback().await?;
            return Ok(KeyChange::LastAdmin);
        }
        let sql = format!(
            "UPDATE api_keys SET name = COALESCE($3, name), scopes = COALESCE($4, scopes)
                     WHERE tenant_id = $1 AND id = $2
                     RETURNING {KEY_COLUMNS}"
        );
        let scopes = patch.scopes.as_deref().map(Scope::join);
        let row = on("api_keys", &sql)
            .text(tenant.as_str())
            .text(id)
            .opt_text(patch.name.as_deref())
            .opt_text(scopes.as_deref())
            .fetch_one::<S::Driver>(&mut tx)
            .await?;
        tx.commit().await?;
        api_key(&row).map(KeyChange::Done)
    }

    async fn touch_key(&self, id: &str, at: i64) -> Result<()> {
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on(
            "api_keys",
            "UPDATE api_keys SET last_used_at = $2
                     WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)",
        )
        .text(id)
        .int(at)
        .execute::<S::Driver>(&mut conn)
        .await?;
        Ok(())
    }

    async fn has_admin_key(&self) -> Result<bool> {
        let mut conn = self.reader().acquire().await?;
        let row = on(
            "api_keys",
            "SELECT 1 AS one FROM api_keys
                     WHERE tenant_id IS NULL AND revoked_at IS NULL LIMIT 1",
        )
        .fetch_optional::<S::Driver>(&mut conn)
        .await?;
        Ok(row.is_some())
    }

    async fn add_admin_key(&self, hash: &str) -> Result<()> {
        let (id, created_at) = (new_id("key"), now_ms());
        let writer = self.writer().await;
        let mut conn = writer.acquire().await?;
        on(
            "api_keys",
            "INSERT INTO api_keys (id, tenant_id, hash, created_at, name, scopes)
                     VALUES ($1, NULL, $2, $3, 'platform admin', 'admin')
                     ON CONFLICT (hash) DO NOTHING",
        )
        .text(&id)
        .text(hash)
        .int(created_at)
        .execute::<S::Driver>(&mut conn)
        .await?;
        Ok(())
    }

    async fn admin_key_state(&self, hash: &str) -> Result<AdminKeyState> {
        let mut conn = self.reader().acquire().await?;
        let row = on(
            "api_keys",
            "SELECT tenant_id, revoked_at FROM api_keys WHERE hash = $1",
        )
        .text(hash)
        .fetch_optional::<S::Driver>(&mut conn)
        .await?;
        let Some(row) = row else {
            return Ok(AdminKeyState::Unknown);
        };
        if row.opt_text("tenant_id")?.is_some() {
            return Ok(AdminKeyState::Tenant);
        }
        Ok(match row.opt_int("revoked_at")? {
            None => AdminKeyState::Current,
            Some(at) => AdminKeyState::RotatedOut { at },
        })
    }

    async fn rotate_admin_key(&self, hash: &str) -> Result<u64> {
        let writer = self.writer().await;
        let mut tx = writer.begin().await?;
        // Two rotations at once would each revoke the keys before them and
        // keep their own: one after the other, the second revokes the
        // first's.
        if let Some((sql, key)) = S::Driver::ADMIN_KEY_LOCK {
            on("api_keys", sql)
                .int(key)
                .execute::<S::Driver>(&mut tx)
                .await?;
        }
        let now = now_ms();
        let held = on(
            "api_keys",
            "SELECT tenant_id, revoked_at FROM api_keys WHERE hash = $1",
        )
        .text(hash)
        .fetch_optional::<S::Driver>(&mut tx)
        .await?;
        if let Some(held) = held {
            // A tenant's key of that secret stays the tenant's: the admin
            // key must be a secret of its own.
            if held.opt_text("tenant_id")?.is_some() {
                tx.rollback().await?;
                return Err(StoreError::Taken(
                    "this secret is a tenant's key; the platform admin key must be a \
                     secret of its own: choose another"
                        .into(),
                ));
            }
            if let Some(at) = held.opt_int("revoked_at")? {
                tx.rollback().await?;
                return Err(StoreError::InvalidState(format!(
                    "this key was the platform admin key and was rotated out at {}; a \
                     key rotated out is never taken back: rotate to a new one",
                    crate::rfc3339::format(at)
                )));
            }
        } else {
            let id = new_id("key");
            on(
                "api_keys",
                "INSERT INTO api_keys (id, tenant_id, hash, created_at, name, scopes)
                         VALUES ($1, NULL, $2, $3, 'platform admin', 'admin')",
            )
            .text(&id)
            .text(hash)
            .int(now)
            .execute::<S::Driver>(&mut tx)
            .await?;
        }
        let revoked = on(
            "api_keys",
            "UPDATE api_keys SET revoked_at = $2
                     WHERE tenant_id IS NULL AND hash <> $1 AND revoked_at IS NULL",
        )
        .text(hash)
        .int(now)
        .execute::<S::Driver>(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(revoked)
    }
}
