//! Sealing the credentials and the webhook signing secrets of a whole
//! database anew, for every store on one database ([`Resealing`]): the
//! plain ones of a database from before they were sealed (at every start,
//! after the SQL migrations) and, for `tok secrets rotate`, every one not
//! sealed under the newest key.
//!
//! Tenant by tenant, in pages of [`PAGE`] connections (then sources) by
//! id: a page is read without a lock, and only a page with credentials to
//! seal is read again, its rows locked, in a short write transaction that
//! seals them. On PostgreSQL that transaction first takes the migrations'
//! advisory lock ([`Driver::MIGRATION_LOCK`]), so processes starting at
//! once seal each credential once, and each re-reads under the lock what
//! another sealed meanwhile; SQLite's one writer serializes them. Whatever
//! stops it halfway, the next run goes on: a sealed credential is not
//! sealed again.
//!
//! It runs once per start and per rotation, so its statements are put
//! together when it runs, from the driver's fragments.

use std::future::Future;

use serde_json::Value;
use tok_core::ids::TenantId;

use super::{
    Owner, Reseal, Resealed, SecretError, SourceOwner, holds_credentials, sealed_under,
    text_sealed_under,
};
use crate::Result;
use crate::sql::{Driver, SqlStore, on};

/// Connections (and sources) read at a time.
const PAGE: i64 = 100;

/// The resealing of one database's credentials and signing secrets, on
/// every store on one database (`PgStore`, `SqliteStore`).
pub(crate) trait Resealing: SqlStore {
    /// Seals what `which` asks for in this database (see the module doc),
    /// and says how many.
    fn reseal(&self, which: Reseal) -> impl Future<Output = Result<Resealed>> + Send;
}

impl<S: SqlStore> Resealing for S {
    async fn reseal(&self, which: Reseal) -> Result<Resealed> {
        let keys = self.keys();
        let newest = keys.newest().map(|k| k.id().to_owned());
        if which == Reseal::All && newest.is_none() {
            return Err(SecretError::NoKey.into());
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
        let mut done = Resealed {
            database: self.name().to_owned(),
            key: newest.clone(),
            resealed: 0,
            signing_secrets: 0,
            left_plain: 0,
        };
        let tenants = {
            let mut conn = self.reader().acquire().await?;
            on("tenants", "SELECT id FROM tenants ORDER BY id")
                .fetch_all::<S::Driver>(&mut conn)
                .await?
                .iter()
                .map(|row| Ok(TenantId::from(row.text("id")?)))
                .collect::<Result<Vec<_>>>()?
        };
        let connections = format!(
            "SELECT id, name, credentials FROM connections
             WHERE tenant_id = $1 AND id > $2 AND id <= $3 ORDER BY id {}",
            S::Driver::LOCK_ROWS
        );
        let sources = format!(
            "SELECT id, name, secret, previous_secret FROM sources
             WHERE tenant_id = $1 AND id > $2 AND id <= $3 ORDER BY id {}",
            S::Driver::LOCK_ROWS
        );
        for tenant in &tenants {
            let mut after = String::new();
            loop {
                let page = {
                    let mut conn = self.reader().acquire().await?;
                    on(
                        "connections",
                        "SELECT id, credentials FROM connections
                         WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                    )
                    .text(tenant.as_str())
                    .text(&after)
                    .int(PAGE)
                    .fetch_all::<S::Driver>(&mut conn)
                    .await?
                };
                let Some(last) = page.last().map(|r| r.text("id")).transpose()? else {
                    break;
                };
                let mut waiting = 0;
                for row in &page {
                    if due(&row.json("credentials")?) {
                        waiting += 1;
                    }
                }
                if waiting > 0 && newest.is_none() {
                    done.left_plain += waiting;
                } else if waiting > 0 {
                    let writer = self.writer().await;
                    let mut tx = writer.begin().await?;
                    if let Some((sql, key)) = S::Driver::MIGRATION_LOCK {
                        on("connections", sql)
                            .int(key)
                            .execute::<S::Driver>(&mut tx)
                            .await?;
                    }
                    let rows = on("connections", &connections)
                        .text(tenant.as_str())
                        .text(&after)
                        .text(&last)
                        .fetch_all::<S::Driver>(&mut tx)
                        .await?;
                    for row in &rows {
                        let stored: Value = row.json("credentials")?;
                        if !due(&stored) {
                            continue;
                        }
                        let (id, name) = (row.text("id")?, row.text("name")?);
                        let owner = Owner {
                            tenant,
                            connection_id: &id,
                            connection_name: &name,
                        };
                        let plain = keys.open(owner, stored)?;
                        let sealed = keys.seal(owner, &plain)?;
                        on(
                            "connections",
                            "UPDATE connections SET credentials = $3
                             WHERE tenant_id = $1 AND id = $2",
                        )
                        .text(tenant.as_str())
                        .text(&id)
                        .json(&sealed)
                        .execute::<S::Driver>(&mut tx)
                        .await?;
                        done.resealed += 1;
                    }
                    tx.commit().await?;
                }
                if (page.len() as i64) < PAGE {
                    break;
                }
                after = last;
            }
            let mut after = String::new();
            loop {
                let page = {
                    let mut conn = self.reader().acquire().await?;
                    on(
                        "sources",
                        "SELECT id, secret, previous_secret FROM sources
                         WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                    )
                    .text(tenant.as_str())
                    .text(&after)
                    .int(PAGE)
                    .fetch_all::<S::Driver>(&mut conn)
                    .await?
                };
                let Some(last) = page.last().map(|r| r.text("id")).transpose()? else {
                    break;
                };
                let mut waiting = 0;
                for row in &page {
                    if text_due(&row.opt_text("secret")?)
                        || text_due(&row.opt_text("previous_secret")?)
                    {
                        waiting += 1;
                    }
                }
                if waiting > 0 && newest.is_none() {
                    done.left_plain += waiting;
                } else if waiting > 0 {
                    let writer = self.writer().await;
                    let mut tx = writer.begin().await?;
                    if let Some((sql, key)) = S::Driver::MIGRATION_LOCK {
                        on("sources", sql)
                            .int(key)
                            .execute::<S::Driver>(&mut tx)
                            .await?;
                    }
                    let rows = on("sources", &sources)
                        .text(tenant.as_str())
                        .text(&after)
                        .text(&last)
                        .fetch_all::<S::Driver>(&mut tx)
                        .await?;
                    for row in &rows {
                        let secret = row.opt_text("secret")?;
                        let previous = row.opt_text("previous_secret")?;
                        if !text_due(&secret) && !text_due(&previous) {
                            continue;
                        }
                        let (id, name) = (row.text("id")?, row.text("name")?);
                        let owner = SourceOwner {
                            tenant,
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
                        on(
                            "sources",
                            "UPDATE sources SET secret = $3, previous_secret = $4
                             WHERE tenant_id = $1 AND id = $2",
                        )
                        .text(tenant.as_str())
                        .text(&id)
                        .opt_text(secret.as_deref())
                        .opt_text(previous.as_deref())
                        .execute::<S::Driver>(&mut tx)
                        .await?;
                        done.signing_secrets += 1;
                    }
                    tx.commit().await?;
                }
                if (page.len() as i64) < PAGE {
                    break;
                }
                after = last;
            }
        }
        Ok(done)
    }
}
