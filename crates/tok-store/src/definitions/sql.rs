//! [`DefinitionStore`] on every store, on the tenant's database, and
//! [`SourceLookup`] on one database: the same SQL on both databases.

use async_trait::async_trait;
use tok_core::ids::{AutomationId, SourceId, TenantId, new_id};

use super::{DefinitionStore, SourceLookup};
use crate::rows::now_ms;
use crate::secrets::{Keyring, SourceOwner};
use crate::sql::{Driver, DriverOf, Route, Row, SqlStore, on};
use crate::{
    AutomationRow, AutomationStatus, NewSource, NewVersion, Page, Result, SavedVersion, Source,
    SourcePatch, SourceRotation, StoreError,
};

/// A source's row, its signing secrets opened with `keys` (see
/// [`Source::secret_error`] for one that does not open).
fn source<D: Driver>(row: &Row<D>, keys: &Keyring) -> Result<Source> {
    let mut source = Source {
        id: SourceId::from(row.text("id")?),
        tenant_id: TenantId::from(row.text("tenant_id")?),
        name: row.text("name")?,
        token: row.text("token")?,
        params: row.json("params")?,
        critical: row.bool("critical")?,
        rate_limit: row.opt_int32("rate_limit")?,
        secret: row.opt_text("secret")?,
        verify_preset: row.opt_text("verify_preset")?,
        schema: row.opt_json("body_schema")?,
        previous_token: row.opt_text("previous_token")?,
        previous_token_until: row.opt_int("previous_token_until")?,
        previous_secret: row.opt_text("previous_secret")?,
        previous_secret_until: row.opt_int("previous_secret_until")?,
        created_at: row.int("created_at")?,
        secret_error: None,
    };
    let owner = SourceOwner {
        tenant: &source.tenant_id,
        source_id: source.id.as_str(),
        source_name: &source.name,
    };
    let opened = source
        .secret
        .as_deref()
        .map(|stored| keys.open_text(owner, stored))
        .transpose()
        .and_then(|secret| {
            let previous = source
                .previous_secret
                .as_deref()
                .map(|stored| keys.open_text(owner, stored))
                .transpose()?;
            Ok((secret, previous))
        });
    match opened {
        Ok((secret, previous)) => {
            source.secret = secret;
            source.previous_secret = previous;
        }
        Err(error) => source.secret_error = Some(error),
    }
    Ok(source)
}

/// What a source's secret column holds for `secret`: sealed for the
/// tenant's source `id`.
fn sealed_secret(
    keys: &Keyring,
    tenant: &TenantId,
    id: &SourceId,
    secret: Option<&str>,
) -> Result<Option<String>> {
    let owner = SourceOwner {
        tenant,
        source_id: id.as_str(),
        source_name: id.as_str(),
    };
    Ok(secret.map(|s| keys.seal_text(owner, s)).transpose()?)
}

/// An automation's row of [`AUTOMATION_SELECT`].
pub(crate) fn automation<D: Driver>(row: &Row<D>) -> Result<AutomationRow> {
    Ok(AutomationRow {
        id: AutomationId::from(row.text("id")?),
        tenant_id: TenantId::from(row.text("tenant_id")?),
        name: row.text("name")?,
        status: AutomationStatus::parse(&row.text("status")?),
        version: row.int32("current_version")?,
        definition: row.json("definition")?,
        hash: row.text("hash")?,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
        next_run_at: row.opt_int("next_run_at")?,
    })
}

/// The current version of automations, with their next scheduled start.
pub(crate) const AUTOMATION_SELECT: &str =
    "SELECT a.id, a.tenant_id, a.name, a.status, a.current_version,
        a.created_at, a.updated_at, v.definition, v.hash, s.next_run_at
    FROM automations a
    JOIN automation_versions v ON v.automation_id = a.id AND v.version = a.current_version
    LEFT JOIN trigger_schedules s ON s.tenant_id = a.tenant_id AND s.automation_id = a.id";

#[async_trait]
impl<S: SqlStore> SourceLookup for S {
    async fn source_by_token(&self, token: &str) -> Result<Option<Source>> {
        let mut conn = self.reader().acquire().await?;
        let row = on(
            "sources",
            "SELECT * FROM sources
             WHERE token = $1 OR (previous_token = $1 AND previous_token_until > $2)",
        )
        .text(token)
        .int(now_ms())
        .fetch_optional::<S::Driver>(&mut conn)
        .await?;
        row.map(|row| source(&row, self.keys())).transpose()
    }
}

#[async_trait]
impl<R: Route> DefinitionStore for R {
    async fn create_source(&self, tenant: &TenantId, new: NewSource) -> Result<Source> {
        let source = Source {
            id: SourceId::from(new_id("src")),
            tenant_id: tenant.clone(),
            name: new.name,
            token: new.token,
            params: new.params,
            critical: new.critical,
            rate_limit: new.rate_limit,
            secret: new.secret,
            verify_preset: new.verify_preset,
            schema: new.schema,
            previous_token: None,
            previous_token_until: None,
            previous_secret: None,
            previous_secret_until: None,
            created_at: now_ms(),
            secret_error: None,
        };
        let db = self.db_for(tenant).await?;
        let sealed = sealed_secret(db.keys(), tenant, &source.id, source.secret.as_deref())?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            on(
                "sources",
                "INSERT INTO sources (id, tenant_id, name, token, params, critical, rate_limit,
                    secret, created_at, verify_preset, body_schema)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .text(source.id.as_str())
            .text(tenant.as_str())
            .text(&source.name)
            .text(&source.token)
            .json(&source.params)
            .bool(source.critical)
            .opt_int32(source.rate_limit)
            .opt_text(sealed.as_deref())
            .int(source.created_at)
            .opt_text(source.verify_preset.as_deref())
            .opt_json(source.schema.as_ref())
            .execute::<DriverOf<R>>(&mut conn)
            .await
        })
        .await?;
        Ok(source)
    }

    async fn source(&self, tenant: &TenantId, id: &SourceId) -> Result<Option<Source>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let row = on(
                "sources",
                "SELECT * FROM sources WHERE tenant_id = $1 AND id = $2",
            )
            .text(tenant.as_str())
            .text(id.as_str())
            .fetch_optional::<DriverOf<R>>(&mut conn)
            .await?;
            row.map(|row| source(&row, db.keys())).transpose()
        })
        .await
    }

    async fn sources(&self, tenant: &TenantId) -> Result<Vec<Source>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let rows = on(
                "sources",
                "SELECT * FROM sources WHERE tenant_id = $1 ORDER BY id",
            )
            .text(tenant.as_str())
            .fetch_all::<DriverOf<R>>(&mut conn)
            .await?;
            rows.iter().map(|row| source(row, db.keys())).collect()
        })
        .await
    }

    async fn sources_page(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<Source>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let rows = on(
                "sources",
                "SELECT * FROM sources
                 WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR id > $2)
                 ORDER BY id LIMIT $3",
            )
            .text(tenant.as_str())
            .opt_text(after)
            .int(i64::from(limit) + 1)
            .fetch_all::<DriverOf<R>>(&mut conn)
            .await?;
            let items = rows
                .iter()
                .map(|row| source(row, db.keys()))
                .collect::<Result<_>>()?;
            Ok(Page::of(items, limit, |s: &Source| s.id.to_string()))
        })
        .await
    }

    async fn update_source(
        &self,
        tenant: &TenantId,
        id: &SourceId,
        patch: SourcePatch,
    ) -> Result<Option<Source>> {
        let db = self.db_for(tenant).await?;
        let sealed = sealed_secret(
            db.keys(),
            tenant,
            id,
            patch.verify.as_ref().map(|(_, secret)| secret.as_str()),
        )?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            let row = on(
                "sources",
                "UPDATE sources SET name = COALESCE($3, name), params = COALESCE($4, params),
                    critical = COALESCE($5, critical),
                    rate_limit = CASE WHEN $6 THEN $7 ELSE rate_limit END,
                    body_schema = CASE WHEN $8 THEN $9 ELSE body_schema END,
                    verify_preset = COALESCE($10, verify_preset),
                    secret = COALESCE($11, secret)
                 WHERE tenant_id = $1 AND id = $2
                 RETURNING *",
            )
            .text(tenant.as_str())
            .text(id.as_str())
            .opt_text(patch.name.as_deref())
            .opt_json(patch.params.as_ref())
            .opt_bool(patch.critical)
            .bool(patch.rate_limit.is_some())
            .opt_int32(patch.rate_limit.flatten())
            .bool(patch.schema.is_some())
            .opt_json(patch.schema.as_ref().and_then(|s| s.as_ref()))
            .opt_text(patch.verify.as_ref().map(|(preset, _)| preset.as_str()))
            .opt_text(sealed.as_deref())
            .fetch_optional::<DriverOf<R>>(&mut conn)
            .await?;
            row.map(|row| source(&row, db.keys())).transpose()
        })
        .await
    }

    async fn rotate_source(
        &self,
        tenant: &TenantId,
        id: &SourceId,
        rotation: SourceRotation,
    ) -> Result<Option<Source>> {
        let db = self.db_for(tenant).await?;
        // The right-hand sides read the row as it was: what is replaced
        // becomes the previous value, kept while the overlap lasts (none
        // when it has no length). A sealed secret moves to
        // `previous_secret` as it is: both columns of a source are sealed
        // for the same source.
        let sealed = sealed_secret(db.keys(), tenant, id, rotation.secret.as_deref())?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            let row = on(
                "sources",
                "UPDATE sources SET
                    previous_token = CASE WHEN CAST($3 AS TEXT) IS NULL THEN previous_token
                        WHEN $5 > $6 THEN token ELSE NULL END,
                    previous_token_until = CASE WHEN CAST($3 AS TEXT) IS NULL
                        THEN previous_token_until WHEN $5 > $6 THEN $5 ELSE NULL END,
                    token = COALESCE($3, token),
                    previous_secret = CASE WHEN CAST($4 AS TEXT) IS NULL THEN previous_secret
                        WHEN $5 > $6 THEN secret ELSE NULL END,
                    previous_secret_until = CASE WHEN CAST($4 AS TEXT) IS NULL
                        THEN previous_secret_until
                        WHEN $5 > $6 AND secret IS NOT NULL THEN $5 ELSE NULL END,
                    secret = COALESCE($4, secret)
                 WHERE tenant_id = $1 AND id = $2
                 RETURNING *",
            )
            .text(tenant.as_str())
            .text(id.as_str())
            .opt_text(rotation.token.as_deref())
            .opt_text(sealed.as_deref())
            .int(rotation.until)
            .int(now_ms())
            .fetch_optional::<DriverOf<R>>(&mut conn)
            .await?;
            row.map(|row| source(&row, db.keys())).transpose()
        })
        .await
    }

    async fn delete_source(&self, tenant: &TenantId, id: &SourceId) -> Result<bool> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            let deleted = on(
                "sources",
                "DELETE FROM sources WHERE tenant_id = $1 AND id = $2",
            )
            .text(tenant.as_str())
            .text(id.as_str())
            .execute::<DriverOf<R>>(&mut conn)
            .await?;
            Ok(deleted > 0)
        })
        .await
    }

    async fn create_automation(&self, tenant: &TenantId, def: NewVersion) -> Result<AutomationRow> {
        let id = new_id("aut");
        let now = now_ms();
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            on(
                "automations",
                "INSERT INTO automations (id, tenant_id, name, status, current_version,
                    trigger_kind, trigger_key, created_at, updated_at)
                 VALUES ($1, $2, $3, 'active', 1, $4, $5, $6, $6)",
            )
            .text(&id)
            .text(tenant.as_str())
            .text(&def.name)
            .text(&def.trigger_kind)
            .opt_text(def.trigger_key.as_deref())
            .int(now)
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            on(
                "automation_versions",
                "INSERT INTO automation_versions (automation_id, tenant_id, version, definition,
                    hash, created_at)
                 VALUES ($1, $2, 1, $3, $4, $5)",
            )
            .text(&id)
            .text(tenant.as_str())
            .json(&def.definition)
            .text(&def.hash)
            .int(now)
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            tx.commit().await?;
            Ok::<_, StoreError>(())
        })
        .await?;
        Ok(AutomationRow {
            id: AutomationId::from(id),
            tenant_id: tenant.clone(),
            name: def.name,
            status: AutomationStatus::Active,
            version: 1,
            definition: def.definition,
            hash: def.hash,
            created_at: now,
            updated_at: now,
            next_run_at: None,
        })
    }

    async fn save_version(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
        def: NewVersion,
    ) -> Result<AutomationRow> {
        let now = now_ms();
        let db = self.db_for(tenant).await?;
        let (version, status, created_at) = db
            .call(async {
                let writer = db.writer().await;
                let mut tx = writer.begin().await?;
                let row = on(
                    "automations",
                    "UPDATE automations SET current_version = current_version + 1, name = $3,
                        trigger_kind = $4, trigger_key = $5, updated_at = $6
                     WHERE tenant_id = $1 AND id = $2
                     RETURNING current_version, status, created_at",
                )
                .text(tenant.as_str())
                .text(id.as_str())
                .text(&def.name)
                .text(&def.trigger_kind)
                .opt_text(def.trigger_key.as_deref())
                .int(now)
                .fetch_optional::<DriverOf<R>>(&mut tx)
                .await?
                .ok_or(StoreError::NotFound("automation"))?;
                let version = row.int32("current_version")?;
                on(
                    "automation_versions",
                    "INSERT INTO automation_versions (automation_id, tenant_id, version,
                        definition, hash, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .text(id.as_str())
                .text(tenant.as_str())
                .int32(version)
                .json(&def.definition)
                .text(&def.hash)
                .int(now)
                .execute::<DriverOf<R>>(&mut tx)
                .await?;
                tx.commit().await?;
                Ok((version, row.text("status")?, row.int("created_at")?))
            })
            .await?;
        Ok(AutomationRow {
            id: id.clone(),
            tenant_id: tenant.clone(),
            name: def.name,
            status: AutomationStatus::parse(&status),
            version,
            definition: def.definition,
            hash: def.hash,
            created_at,
            updated_at: now,
            next_run_at: None,
        })
    }

    async fn set_automation_status(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
        status: AutomationStatus,
    ) -> Result<bool> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            let set = on(
                "automations",
                "UPDATE automations SET status = $3, updated_at = $4
                 WHERE tenant_id = $1 AND id = $2 AND status <> 'archived'",
            )
            .text(tenant.as_str())
            .text(id.as_str())
            .text(status.as_str())
            .int(now_ms())
            .execute::<DriverOf<R>>(&mut conn)
            .await?;
            Ok(set > 0)
        })
        .await
    }

    async fn automation(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
    ) -> Result<Option<AutomationRow>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let sql = format!("{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND a.id = $2");
            let row = on("automations", &sql)
                .text(tenant.as_str())
                .text(id.as_str())
                .fetch_optional::<DriverOf<R>>(&mut conn)
                .await?;
            row.as_ref().map(automation).transpose()
        })
        .await
    }

    async fn automations(&self, tenant: &TenantId) -> Result<Vec<AutomationRow>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let sql = format!("{AUTOMATION_SELECT} WHERE a.tenant_id = $1 ORDER BY a.id");
            let rows = on("automations", &sql)
                .text(tenant.as_str())
                .fetch_all::<DriverOf<R>>(&mut conn)
                .await?;
            rows.iter().map(automation).collect()
        })
        .await
    }

    async fn automations_page(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<AutomationRow>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let sql = format!(
                "{AUTOMATION_SELECT}
                 WHERE a.tenant_id = $1 AND a.status <> 'archived'
                   AND (CAST($2 AS TEXT) IS NULL OR a.id > $2)
                 ORDER BY a.id LIMIT $3"
            );
            let rows = on("automations", &sql)
                .text(tenant.as_str())
                .opt_text(after)
                .int(i64::from(limit) + 1)
                .fetch_all::<DriverOf<R>>(&mut conn)
                .await?;
            let items = rows.iter().map(automation).collect::<Result<_>>()?;
            Ok(Page::of(items, limit, |a: &AutomationRow| a.id.to_string()))
        })
        .await
    }

    async fn automation_version(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
        version: i32,
    ) -> Result<Option<SavedVersion>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let row = on(
                "automation_versions",
                "SELECT definition, hash FROM automation_versions
                 WHERE tenant_id = $1 AND automation_id = $2 AND version = $3",
            )
            .text(tenant.as_str())
            .text(id.as_str())
            .int32(version)
            .fetch_optional::<DriverOf<R>>(&mut conn)
            .await?;
            row.map(|r| {
                Ok(SavedVersion {
                    definition: r.json("definition")?,
                    hash: r.text("hash")?,
                })
            })
            .transpose()
        })
        .await
    }
}
