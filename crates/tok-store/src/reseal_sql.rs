//! Sealing the credentials and the webhook signing secrets of a whole
//! database anew, for both backends: the plain ones of a database from
//! before they were sealed (at every start, after the SQL migrations) and,
//! for `tok secrets rotate`, every one not sealed under the newest key.
//!
//! Tenant by tenant, in pages of [`PAGE`] connections (then sources) by
//! id: a page is read
//! without a lock, and only a page with credentials to seal is read again,
//! its rows locked, in a short write transaction that seals them. On
//! PostgreSQL that transaction first takes the migrations' advisory lock,
//! so processes starting at once seal each credential once, and each
//! re-reads under the lock what another sealed meanwhile. Whatever stops it
//! halfway, the next run goes on: a sealed credential is not sealed again.

/// Connections read at a time.
pub(crate) const PAGE: i64 = 100;

macro_rules! impl_reseal {
    (
        store = $store:ty,
        db = $db:ty,
        lock = $lock:expr,
    ) => {
        impl $store {
            /// Seals what `which` asks for in this database (see the module
            /// doc), and says how many.
            async fn reseal(
                &self,
                which: $crate::secrets::Reseal,
            ) -> Result<$crate::secrets::Resealed> {
                use $crate::secrets::{
                    Owner, Reseal, SourceOwner, holds_credentials, sealed_under, text_sealed_under,
                };
                let keys = &self.keys;
                let newest = keys.newest().map(|k| k.id().to_owned());
                if which == Reseal::All && newest.is_none() {
                    return Err($crate::secrets::SecretError::NoKey.into());
                }
                let due = |stored: &Value| {
                    holds_credentials(stored)
                        && match which {
                            Reseal::Plain => sealed_under(stored).is_none(),
                            Reseal::All => sealed_under(stored) != newest.as_deref(),
                        }
                };
                // A source's secret column: a secret to seal anew.
                let text_due = |stored: &Option<String>| {
                    stored.as_deref().is_some_and(|stored| match which {
                        Reseal::Plain => text_sealed_under(stored).is_none(),
                        Reseal::All => text_sealed_under(stored) != newest,
                    })
                };
                let mut done = $crate::secrets::Resealed {
                    database: self.name.clone(),
                    key: newest.clone(),
                    resealed: 0,
                    signing_secrets: 0,
                    left_plain: 0,
                };
                let tenants: Vec<String> = sqlx::query_scalar("SELECT id FROM tenants ORDER BY id")
                    .fetch_all(self.reader())
                    .await?;
                for tenant in tenants.into_iter().map(TenantId::from) {
                    let mut after = String::new();
                    loop {
                        let page = sqlx::query(
                            "SELECT id, credentials FROM connections
                             WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                        )
                        .bind(tenant.as_str())
                        .bind(&after)
                        .bind($crate::reseal_sql::PAGE)
                        .fetch_all(self.reader())
                        .await?;
                        let Some(last) = page.last().map(|r| r.get::<String, _>("id")) else {
                            break;
                        };
                        let waiting = page
                            .iter()
                            .filter(|r| due(&r.get::<Json<Value>, _>("credentials").0))
                            .count() as u64;
                        if waiting > 0 && newest.is_none() {
                            done.left_plain += waiting;
                        } else if waiting > 0 {
                            let writer = self.writer().await;
                            let mut tx = writer.begin().await?;
                            if let Some((sql, key)) = $lock {
                                sqlx::query(sql).bind(key).execute(&mut *tx).await?;
                            }
                            let rows = sqlx::query(concat!(
                                "SELECT id, name, credentials FROM connections
                                 WHERE tenant_id = $1 AND id > $2 AND id <= $3 ORDER BY id ",
                                lock_rows!()
                            ))
                            .bind(tenant.as_str())
                            .bind(&after)
                            .bind(&last)
                            .fetch_all(&mut *tx)
                            .await?;
                            for row in &rows {
                                let stored = row.get::<Json<Value>, _>("credentials").0;
                                if !due(&stored) {
                                    continue;
                                }
                                let (id, name): (String, String) = (row.get("id"), row.get("name"));
                                let owner = Owner {
                                    tenant: &tenant,
                                    connection_id: &id,
                                    connection_name: &name,
                                };
                                let plain = keys.open(owner, stored)?;
                                let sealed = keys.seal(owner, &plain)?;
                                sqlx::query(
                                    "UPDATE connections SET credentials = $3
                                     WHERE tenant_id = $1 AND id = $2",
                                )
                                .bind(tenant.as_str())
                                .bind(&id)
                                .bind(Json(&sealed))
                                .execute(&mut *tx)
                                .await?;
                                done.resealed += 1;
                            }
                            tx.commit().await?;
                        }
                        if (page.len() as i64) < $crate::reseal_sql::PAGE {
                            break;
                        }
                        after = last;
                    }
                    let mut after = String::new();
                    loop {
                        let page = sqlx::query(
                            "SELECT id, secret, previous_secret FROM sources
                             WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                        )
                        .bind(tenant.as_str())
                        .bind(&after)
                        .bind($crate::reseal_sql::PAGE)
                        .fetch_all(self.reader())
                        .await?;
                        let Some(last) = page.last().map(|r| r.get::<String, _>("id")) else {
                            break;
                        };
                        let waiting = page
                            .iter()
                            .filter(|r| {
                                text_due(&r.get("secret")) || text_due(&r.get("previous_secret"))
                            })
                            .count() as u64;
                        if waiting > 0 && newest.is_none() {
                            done.left_plain += waiting;
                        } else if waiting > 0 {
                            let writer = self.writer().await;
                            let mut tx = writer.begin().await?;
                            if let Some((sql, key)) = $lock {
                                sqlx::query(sql).bind(key).execute(&mut *tx).await?;
                            }
                            let rows = sqlx::query(concat!(
                                "SELECT id, name, secret, previous_secret FROM sources
                                 WHERE tenant_id = $1 AND id > $2 AND id <= $3 ORDER BY id ",
                                lock_rows!()
                            ))
                            .bind(tenant.as_str())
                            .bind(&after)
                            .bind(&last)
                            .fetch_all(&mut *tx)
                            .await?;
                            for row in &rows {
                                let secret: Option<String> = row.get("secret");
                                let previous: Option<String> = row.get("previous_secret");
                                if !text_due(&secret) && !text_due(&previous) {
                                    continue;
                                }
                                let (id, name): (String, String) = (row.get("id"), row.get("name"));
                                let owner = SourceOwner {
                                    tenant: &tenant,
                                    source_id: &id,
                                    source_name: &name,
                                };
                                let anew = |stored: Option<String>| -> Result<Option<String>> {
                                    if !text_due(&stored) {
                                        return Ok(stored);
                                    }
                                    let stored = stored.unwrap_or_default();
                                    let plain = keys.open_text(owner, &stored)?;
                                    Ok(Some(keys.seal_text(owner, &plain)?))
                                };
                                let (secret, previous) = (anew(secret)?, anew(previous)?);
                                sqlx::query(
                                    "UPDATE sources SET secret = $3, previous_secret = $4
                                     WHERE tenant_id = $1 AND id = $2",
                                )
                                .bind(tenant.as_str())
                                .bind(&id)
                                .bind(secret.as_deref())
                                .bind(previous.as_deref())
                                .execute(&mut *tx)
                                .await?;
                                done.signing_secrets += 1;
                            }
                            tx.commit().await?;
                        }
                        if (page.len() as i64) < $crate::reseal_sql::PAGE {
                            break;
                        }
                        after = last;
                    }
                }
                Ok(done)
            }
        }
    };
}

pub(crate) use impl_reseal;
