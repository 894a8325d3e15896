//! Sources and versioned automations ([`DefinitionStore`](crate::DefinitionStore))
//! for both backends (see `rows.rs` for why a macro per file).

macro_rules! impl_definitions {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// A source's row, its signing secrets opened with `keys` (see
        /// [`Source::secret_error`] for one that does not open).
        fn source_from_row(
            row: &<$db as sqlx::Database>::Row,
            keys: &$crate::secrets::Keyring,
        ) -> Source {
            let mut source = Source {
                id: SourceId::from(row.get::<String, _>("id")),
                tenant_id: TenantId::from(row.get::<String, _>("tenant_id")),
                name: row.get("name"),
                token: row.get("token"),
                params: row.get::<Json<Value>, _>("params").0,
                critical: row.get("critical"),
                rate_limit: row.get("rate_limit"),
                secret: row.get("secret"),
                verify_preset: row.get("verify_preset"),
                schema: row
                    .get::<Option<Json<Value>>, _>("body_schema")
                    .map(|schema| schema.0),
                previous_token: row.get("previous_token"),
                previous_token_until: row.get("previous_token_until"),
                previous_secret: row.get("previous_secret"),
                previous_secret_until: row.get("previous_secret_until"),
                created_at: row.get("created_at"),
                secret_error: None,
            };
            let owner = $crate::secrets::SourceOwner {
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
            source
        }

        /// What a source's secret column holds for `secret`: sealed for
        /// the tenant's source `id`.
        fn sealed_secret(
            keys: &$crate::secrets::Keyring,
            tenant: &TenantId,
            id: &SourceId,
            secret: Option<&str>,
        ) -> Result<Option<String>> {
            let owner = $crate::secrets::SourceOwner {
                tenant,
                source_id: id.as_str(),
                source_name: id.as_str(),
            };
            Ok(secret.map(|s| keys.seal_text(owner, s)).transpose()?)
        }

        fn automation_from_row(row: &<$db as sqlx::Database>::Row) -> AutomationRow {
            AutomationRow {
                id: AutomationId::from(row.get::<String, _>("id")),
                tenant_id: TenantId::from(row.get::<String, _>("tenant_id")),
                name: row.get("name"),
                status: AutomationStatus::parse(row.get::<&str, _>("status")),
                version: row.get("current_version"),
                definition: row.get::<Json<Value>, _>("definition").0,
                hash: row.get("hash"),
                created_at: row.get("created_at"),
                updated_at: row.get("updated_at"),
                next_run_at: row.get("next_run_at"),
            }
        }

        const AUTOMATION_SELECT: &str = "SELECT a.id, a.tenant_id, a.name, a.status, a.current_version,
                a.created_at, a.updated_at, v.definition, v.hash, s.next_run_at
            FROM automations a
            JOIN automation_versions v ON v.automation_id = a.id AND v.version = a.current_version
            LEFT JOIN trigger_schedules s ON s.tenant_id = a.tenant_id AND s.automation_id = a.id";

        #[async_trait::async_trait]
        impl DefinitionStore for $store {
            async fn create_source(&self, tenant: &TenantId, source: NewSource) -> Result<Source> {
                let source = Source {
                    id: SourceId::from(new_id("src")),
                    tenant_id: tenant.clone(),
                    name: source.name,
                    token: source.token,
                    params: source.params,
                    critical: source.critical,
                    rate_limit: source.rate_limit,
                    secret: source.secret,
                    verify_preset: source.verify_preset,
                    schema: source.schema,
                    previous_token: None,
                    previous_token_until: None,
                    previous_secret: None,
                    previous_secret_until: None,
                    created_at: now_ms(),
                    secret_error: None,
                };
                let sealed = sealed_secret(&self.keys, tenant, &source.id, source.secret.as_deref())?;
                sqlx::query(
                    "INSERT INTO sources (id, tenant_id, name, token, params, critical, rate_limit,
                        secret, created_at, verify_preset, body_schema)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                )
                .bind(source.id.as_str())
                .bind(tenant.as_str())
                .bind(&source.name)
                .bind(&source.token)
                .bind(Json(&source.params))
                .bind(source.critical)
                .bind(source.rate_limit)
                .bind(sealed.as_deref())
                .bind(source.created_at)
                .bind(source.verify_preset.as_deref())
                .bind(source.schema.as_ref().map(Json))
                .execute(&*self.writer().await)
                .await?;
                Ok(source)
            }

            async fn source(&self, tenant: &TenantId, id: &SourceId) -> Result<Option<Source>> {
                let row = sqlx::query("SELECT * FROM sources WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id.as_str())
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.as_ref().map(|row| source_from_row(row, &self.keys)))
            }

            async fn sources(&self, tenant: &TenantId) -> Result<Vec<Source>> {
                let rows = sqlx::query("SELECT * FROM sources WHERE tenant_id = $1 ORDER BY id")
                    .bind(tenant.as_str())
                    .fetch_all(self.reader())
                    .await?;
                Ok(rows.iter().map(|row| source_from_row(row, &self.keys)).collect())
            }

            async fn sources_page(
                &self,
                tenant: &TenantId,
                limit: u32,
                after: Option<&str>,
            ) -> Result<Page<Source>> {
                let rows = sqlx::query(
                    "SELECT * FROM sources
                     WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR id > $2)
                     ORDER BY id LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(self.reader())
                .await?;
                let items = rows.iter().map(|row| source_from_row(row, &self.keys)).collect();
                Ok(Page::of(items, limit, |s: &Source| s.id.to_string()))
            }

            async fn source_by_token(&self, token: &str) -> Result<Option<Source>> {
                let row = sqlx::query(
                    "SELECT * FROM sources
                     WHERE token = $1 OR (previous_token = $1 AND previous_token_until > $2)",
                )
                .bind(token)
                .bind(now_ms())
                .fetch_optional(self.reader())
                .await?;
                Ok(row.as_ref().map(|row| source_from_row(row, &self.keys)))
            }

            async fn update_source(
                &self,
                tenant: &TenantId,
                id: &SourceId,
                patch: SourcePatch,
            ) -> Result<Option<Source>> {
                let sealed = sealed_secret(
                    &self.keys,
                    tenant,
                    id,
                    patch.verify.as_ref().map(|(_, secret)| secret.as_str()),
                )?;
                let row = sqlx::query(
                    "UPDATE sources SET name = COALESCE($3, name), params = COALESCE($4, params),
                        critical = COALESCE($5, critical),
                        rate_limit = CASE WHEN $6 THEN $7 ELSE rate_limit END,
                        body_schema = CASE WHEN $8 THEN $9 ELSE body_schema END,
                        verify_preset = COALESCE($10, verify_preset),
                        secret = COALESCE($11, secret)
                     WHERE tenant_id = $1 AND id = $2
                     RETURNING *",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(patch.name.as_deref())
                .bind(patch.params.as_ref().map(Json))
                .bind(patch.critical)
                .bind(patch.rate_limit.is_some())
                .bind(patch.rate_limit.flatten())
                .bind(patch.schema.is_some())
                .bind(patch.schema.as_ref().and_then(|s| s.as_ref()).map(Json))
                .bind(patch.verify.as_ref().map(|(preset, _)| preset.as_str()))
                .bind(sealed.as_deref())
                .fetch_optional(&*self.writer().await)
                .await?;
                Ok(row.as_ref().map(|row| source_from_row(row, &self.keys)))
            }

            async fn rotate_source(
                &self,
                tenant: &TenantId,
                id: &SourceId,
                rotation: SourceRotation,
            ) -> Result<Option<Source>> {
                // The right-hand sides read the row as it was: what is
                // replaced becomes the previous value, kept while the
                // overlap lasts (none when it has no length). A sealed
                // secret moves to `previous_secret` as it is: both columns
                // of a source are sealed for the same source.
                let sealed = sealed_secret(&self.keys, tenant, id, rotation.secret.as_deref())?;
                let row = sqlx::query(
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
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(rotation.token.as_deref())
                .bind(sealed.as_deref())
                .bind(rotation.until)
                .bind(now_ms())
                .fetch_optional(&*self.writer().await)
                .await?;
                Ok(row.as_ref().map(|row| source_from_row(row, &self.keys)))
            }

            async fn delete_source(&self, tenant: &TenantId, id: &SourceId) -> Result<bool> {
                let done = sqlx::query("DELETE FROM sources WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id.as_str())
                    .execute(&*self.writer().await)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn create_automation(
                &self,
                tenant: &TenantId,
                def: NewVersion,
            ) -> Result<AutomationRow> {
                let id = new_id("aut");
                let now = now_ms();
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query(
                    "INSERT INTO automations (id, tenant_id, name, status, current_version,
                        trigger_kind, trigger_key, created_at, updated_at)
                     VALUES ($1, $2, $3, 'active', 1, $4, $5, $6, $6)",
                )
                .bind(&id)
                .bind(tenant.as_str())
                .bind(&def.name)
                .bind(&def.trigger_kind)
                .bind(def.trigger_key.as_deref())
                .bind(now)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO automation_versions (automation_id, tenant_id, version, definition,
                        hash, created_at)
                     VALUES ($1, $2, 1, $3, $4, $5)",
                )
                .bind(&id)
                .bind(tenant.as_str())
                .bind(Json(&def.definition))
                .bind(&def.hash)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
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
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let row = sqlx::query(
                    "UPDATE automations SET current_version = current_version + 1, name = $3,
                        trigger_kind = $4, trigger_key = $5, updated_at = $6
                     WHERE tenant_id = $1 AND id = $2
                     RETURNING current_version, status, created_at",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(&def.name)
                .bind(&def.trigger_kind)
                .bind(def.trigger_key.as_deref())
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::NotFound("automation"))?;
                let version: i32 = row.get("current_version");
                sqlx::query(
                    "INSERT INTO automation_versions (automation_id, tenant_id, version, definition,
                        hash, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(id.as_str())
                .bind(tenant.as_str())
                .bind(version)
                .bind(Json(&def.definition))
                .bind(&def.hash)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(AutomationRow {
                    id: id.clone(),
                    tenant_id: tenant.clone(),
                    name: def.name,
                    status: AutomationStatus::parse(row.get::<&str, _>("status")),
                    version,
                    definition: def.definition,
                    hash: def.hash,
                    created_at: row.get("created_at"),
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
                let done = sqlx::query(
                    "UPDATE automations SET status = $3, updated_at = $4
                     WHERE tenant_id = $1 AND id = $2 AND status <> 'archived'",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(status.as_str())
                .bind(now_ms())
                .execute(&*self.writer().await)
                .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn automation(
                &self,
                tenant: &TenantId,
                id: &AutomationId,
            ) -> Result<Option<AutomationRow>> {
                let sql = format!("{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND a.id = $2");
                let row = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(id.as_str())
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.as_ref().map(automation_from_row))
            }

            async fn automations(&self, tenant: &TenantId) -> Result<Vec<AutomationRow>> {
                let sql = format!("{AUTOMATION_SELECT} WHERE a.tenant_id = $1 ORDER BY a.id");
                let rows = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .fetch_all(self.reader())
                    .await?;
                Ok(rows.iter().map(automation_from_row).collect())
            }

            async fn automations_page(
                &self,
                tenant: &TenantId,
                limit: u32,
                after: Option<&str>,
            ) -> Result<Page<AutomationRow>> {
                let sql = format!(
                    "{AUTOMATION_SELECT}
                     WHERE a.tenant_id = $1 AND a.status <> 'archived'
                       AND (CAST($2 AS TEXT) IS NULL OR a.id > $2)
                     ORDER BY a.id LIMIT $3"
                );
                let rows = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(after)
                    .bind(i64::from(limit) + 1)
                    .fetch_all(self.reader())
                    .await?;
                let items = rows.iter().map(automation_from_row).collect();
                Ok(Page::of(items, limit, |a: &AutomationRow| a.id.to_string()))
            }

            async fn automation_version(
                &self,
                tenant: &TenantId,
                id: &AutomationId,
                version: i32,
            ) -> Result<Option<SavedVersion>> {
                let row = sqlx::query(
                    "SELECT definition, hash FROM automation_versions
                     WHERE tenant_id = $1 AND automation_id = $2 AND version = $3",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(version)
                .fetch_optional(self.reader())
                .await?;
                Ok(row.map(|r| SavedVersion {
                    definition: r.get::<Json<Value>, _>("definition").0,
                    hash: r.get("hash"),
                }))
            }
        }
    };
}

pub(crate) use impl_definitions;
