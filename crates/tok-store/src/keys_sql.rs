//! The API key queries ([`KeyStore`](crate::KeyStore)) for both backends
//! (see `rows.rs` for why a macro per file).

macro_rules! impl_keys {
    (
        store = $store:ty,
        db = $db:ty,
        lock = $lock:expr,
    ) => {
        const KEY_COLUMNS: &str =
            "id, tenant_id, name, scopes, created_at, expires_at, last_used_at, revoked_at";

        fn key_from_row(row: &<$db as sqlx::Database>::Row) -> ApiKey {
            ApiKey {
                id: row.get("id"),
                tenant_id: row.get::<Option<String>, _>("tenant_id").map(TenantId::from),
                name: row.get("name"),
                scopes: Scope::split(&row.get::<String, _>("scopes")),
                created_at: row.get("created_at"),
                expires_at: row.get("expires_at"),
                last_used_at: row.get("last_used_at"),
                revoked_at: row.get("revoked_at"),
            }
        }

        /// The tenant's key `id`, with the tenant's row locked: the lock
        /// two changes of its last two admin keys queue on. `None` when
        /// there is no such tenant or key. Every refusal after it rolls back
        /// before it answers: a dropped transaction keeps the row locked
        /// until its connection is next used.
        async fn locked_key(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &str,
        ) -> Result<Option<ApiKey>> {
            let locked = sqlx::query(concat!("SELECT id FROM tenants WHERE id = $1 ", lock_rows!()))
                .bind(tenant.as_str())
                .fetch_optional(&mut **tx)
                .await?;
            if locked.is_none() {
                return Ok(None);
            }
            let row = sqlx::query(&format!(
                "SELECT {KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 AND id = $2"
            ))
            .bind(tenant.as_str())
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
            Ok(row.as_ref().map(key_from_row))
        }

        /// How many other admin keys of the tenant work at `now`.
        async fn other_admins(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &str,
            now: i64,
        ) -> Result<usize> {
            let others = sqlx::query(&format!(
                "SELECT {KEY_COLUMNS} FROM api_keys
                 WHERE tenant_id = $1 AND id <> $2 AND revoked_at IS NULL"
            ))
            .bind(tenant.as_str())
            .bind(id)
            .fetch_all(&mut **tx)
            .await?;
            Ok(others
                .iter()
                .map(key_from_row)
                .filter(|k| k.scopes.contains(&Scope::Admin) && !k.expired(now))
                .count())
        }

        #[async_trait::async_trait]
        impl KeyStore for $store {
            async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>> {
                let row = sqlx::query(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = $1 AND revoked_at IS NULL"
                ))
                .bind(hash)
                .fetch_optional(self.reader())
                .await?;
                Ok(row.as_ref().map(key_from_row))
            }

            async fn create_key(&self, tenant: &TenantId, key: NewKey) -> Result<ApiKey> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                // The tenant's row is the lock concurrent makes queue on, so
                // the count below holds until this one commits.
                let locked = sqlx::query(concat!("SELECT id FROM tenants WHERE id = $1 ", lock_rows!()))
                    .bind(tenant.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
                if locked.is_none() {
                    tx.rollback().await?;
                    return Err(StoreError::NotFound("tenant"));
                }
                let held: i64 = sqlx::query(
                    "SELECT COUNT(*) AS n FROM api_keys WHERE tenant_id = $1 AND revoked_at IS NULL",
                )
                .bind(tenant.as_str())
                .fetch_one(&mut *tx)
                .await?
                .get("n");
                if held >= MAX_KEYS_PER_TENANT {
                    tx.rollback().await?;
                    return Err(StoreError::Conflict(format!(
                        "the tenant holds {held} keys, the most it may; revoke one it no longer uses first"
                    )));
                }
                let row = sqlx::query(&format!(
                    "INSERT INTO api_keys (id, tenant_id, hash, created_at, name, scopes, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     RETURNING {KEY_COLUMNS}"
                ))
                .bind(new_id("key"))
                .bind(tenant.as_str())
                .bind(&key.hash)
                .bind(now_ms())
                .bind(&key.name)
                .bind(Scope::join(&key.scopes))
                .bind(key.expires_at)
                .fetch_one(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(key_from_row(&row))
            }

            async fn keys(
                &self,
                tenant: &TenantId,
                limit: u32,
                after: Option<&str>,
            ) -> Result<Page<ApiKey>> {
                let rows = sqlx::query(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys
                     WHERE tenant_id = $1 AND revoked_at IS NULL
                       AND (CAST($2 AS TEXT) IS NULL OR id > $2)
                     ORDER BY id LIMIT $3"
                ))
                .bind(tenant.as_str())
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(self.reader())
                .await?;
                let items = rows.iter().map(key_from_row).collect();
                Ok(Page::of(items, limit, |k: &ApiKey| k.id.clone()))
            }

            async fn revoke_key(&self, tenant: &TenantId, id: &str) -> Result<KeyChange> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let key = match locked_key(&mut tx, tenant, id).await? {
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
                    && other_admins(&mut tx, tenant, id, now).await? == 0
                {
                    tx.rollback().await?;
                    return Ok(KeyChange::LastAdmin);
                }
                sqlx::query("UPDATE api_keys SET revoked_at = $3 WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(KeyChange::Done(ApiKey {
                    revoked_at: Some(now),
                    ..key
                }))
            }

            async fn update_key(
                &self,
                tenant: &TenantId,
                id: &str,
                patch: KeyPatch,
            ) -> Result<KeyChange> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let key = match locked_key(&mut tx, tenant, id).await? {
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
                    && other_admins(&mut tx, tenant, id, now).await? == 0
                {
                    tx.rollback().await?;
                    return Ok(KeyChange::LastAdmin);
                }
                let row = sqlx::query(&format!(
                    "UPDATE api_keys SET name = COALESCE($3, name), scopes = COALESCE($4, scopes)
                     WHERE tenant_id = $1 AND id = $2
                     RETURNING {KEY_COLUMNS}"
                ))
                .bind(tenant.as_str())
                .bind(id)
                .bind(patch.name.as_deref())
                .bind(patch.scopes.as_deref().map(Scope::join))
                .fetch_one(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(KeyChange::Done(key_from_row(&row)))
            }

            async fn touch_key(&self, id: &str, at: i64) -> Result<()> {
                sqlx::query(
                    "UPDATE api_keys SET last_used_at = $2
                     WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)",
                )
                .bind(id)
                .bind(at)
                .execute(&*self.writer().await)
                .await?;
                Ok(())
            }

            async fn has_admin_key(&self) -> Result<bool> {
                let row = sqlx::query(
                    "SELECT 1 AS one FROM api_keys
                     WHERE tenant_id IS NULL AND revoked_at IS NULL LIMIT 1",
                )
                .fetch_optional(self.reader())
                .await?;
                Ok(row.is_some())
            }

            async fn add_admin_key(&self, hash: &str) -> Result<()> {
                sqlx::query(
                    "INSERT INTO api_keys (id, tenant_id, hash, created_at, name, scopes)
                     VALUES ($1, NULL, $2, $3, 'platform admin', 'admin')
                     ON CONFLICT (hash) DO NOTHING",
                )
                .bind(new_id("key"))
                .bind(hash)
                .bind(now_ms())
                .execute(&*self.writer().await)
                .await?;
                Ok(())
            }

            async fn admin_key_state(&self, hash: &str) -> Result<AdminKeyState> {
                let row = sqlx::query("SELECT tenant_id, revoked_at FROM api_keys WHERE hash = $1")
                    .bind(hash)
                    .fetch_optional(self.reader())
                    .await?;
                Ok(match row {
                    None => AdminKeyState::Unknown,
                    Some(row) if row.get::<Option<String>, _>("tenant_id").is_some() => {
                        AdminKeyState::Tenant
                    }
                    Some(row) => match row.get::<Option<i64>, _>("revoked_at") {
                        None => AdminKeyState::Current,
                        Some(at) => AdminKeyState::RotatedOut { at },
                    },
                })
            }

            async fn rotate_admin_key(&self, hash: &str) -> Result<u64> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                // Two rotations at once would each revoke the keys before
                // them and keep their own: one after the other, the second
                // revokes the first's.
                if let Some((sql, key)) = $lock {
                    sqlx::query(sql).bind(key).execute(&mut *tx).await?;
                }
                let now = now_ms();
                let held = sqlx::query("SELECT tenant_id, revoked_at FROM api_keys WHERE hash = $1")
                    .bind(hash)
                    .fetch_optional(&mut *tx)
                    .await?;
                if let Some(held) = held {
                    // A tenant's key of that secret stays the tenant's: the
                    // admin key must be a secret of its own.
                    if held.get::<Option<String>, _>("tenant_id").is_some() {
                        tx.rollback().await?;
                        return Err(StoreError::Conflict(
                            "this secret is a tenant's key; the platform admin key must be a \
                             secret of its own: choose another"
                                .into(),
                        ));
                    }
                    if let Some(at) = held.get::<Option<i64>, _>("revoked_at") {
                        tx.rollback().await?;
                        return Err(StoreError::Conflict(format!(
                            "this key was the platform admin key and was rotated out at {}; a \
                             key rotated out is never taken back: rotate to a new one",
                            crate::rfc3339::format(at)
                        )));
                    }
                } else {
                    sqlx::query(
                        "INSERT INTO api_keys (id, tenant_id, hash, created_at, name, scopes)
                         VALUES ($1, NULL, $2, $3, 'platform admin', 'admin')",
                    )
                    .bind(new_id("key"))
                    .bind(hash)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                }
                let revoked = sqlx::query(
                    "UPDATE api_keys SET revoked_at = $2
                     WHERE tenant_id IS NULL AND hash <> $1 AND revoked_at IS NULL",
                )
                .bind(hash)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(revoked)
            }
        }
    };
}

pub(crate) use impl_keys;
