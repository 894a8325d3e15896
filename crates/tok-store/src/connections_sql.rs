//! The connection queries for both backends (see `rows.rs` for why a macro).

macro_rules! impl_connections {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        use $crate::connections::Gate;

        /// A connection's row, its credentials opened with `keys`, or left
        /// `Null` (a listing opens none).
        fn connection_from_row(
            row: &<$db as sqlx::Database>::Row,
            keys: Option<&$crate::secrets::Keyring>,
        ) -> Result<Connection> {
            let stored = row.get::<Json<Value>, _>("credentials").0;
            let has_credentials = $crate::secrets::holds_credentials(&stored);
            let tenant = TenantId::from(row.get::<String, _>("tenant_id"));
            let id: String = row.get("id");
            let name: String = row.get("name");
            let credentials = match keys {
                Some(keys) => keys.open(
                    $crate::secrets::Owner {
                        tenant: &tenant,
                        connection_id: &id,
                        connection_name: &name,
                    },
                    stored,
                )?,
                None => Value::Null,
            };
            Ok(Connection {
                id,
                name,
                service: row.get("service"),
                base_url: row.get("base_url"),
                credentials,
                has_credentials,
                rate: row.get("rate"),
                burst: row.get("burst"),
                max_concurrency: row.get("max_concurrency"),
                breaker_threshold: row.get("breaker_threshold"),
                breaker_cooldown_ms: row.get("breaker_cooldown_ms"),
                breaker_state: row.get("breaker_state"),
                failures: row.get("failures"),
                created_at: row.get("created_at"),
            })
        }

        /// The row of the tenant's connection `name_or_id`.
        async fn connection_row(
            store: &$store,
            tenant: &TenantId,
            name_or_id: &str,
        ) -> Result<Option<<$db as sqlx::Database>::Row>> {
            Ok(sqlx::query(
                "SELECT * FROM connections WHERE tenant_id = $1 AND (id = $2 OR name = $2)",
            )
            .bind(tenant.as_str())
            .bind(name_or_id)
            .fetch_optional(store.reader())
            .await?)
        }

        #[async_trait::async_trait]
        impl ConnectionStore for $store {
            async fn create_connection(
                &self,
                tenant: &TenantId,
                new: NewConnection,
            ) -> Result<Connection> {
                let now = now_ms();
                let id = new_id("con");
                let sealed = self.keys.seal(
                    $crate::secrets::Owner {
                        tenant,
                        connection_id: &id,
                        connection_name: &new.name,
                    },
                    &new.credentials,
                )?;
                let inserted = sqlx::query(
                    "INSERT INTO connections (id, tenant_id, name, service, base_url, credentials,
                        rate, burst, tokens, refilled_at, max_concurrency, breaker_threshold,
                        breaker_cooldown_ms, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $10)
                     ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                )
                .bind(&id)
                .bind(tenant.as_str())
                .bind(&new.name)
                .bind(&new.service)
                .bind(new.base_url.as_deref())
                .bind(Json(&sealed))
                .bind(new.rate)
                .bind(new.burst)
                .bind(f64::from(new.burst))
                .bind(now)
                .bind(new.max_concurrency)
                .bind(new.breaker_threshold)
                .bind(new.breaker_cooldown_ms)
                .fetch_optional(&*self.writer().await)
                .await?;
                if inserted.is_none() {
                    return Err(StoreError::Conflict(format!(
                        "a connection named `{}` already exists",
                        new.name
                    )));
                }
                self.connection(tenant, &id).await?.ok_or(StoreError::NotFound("connection"))
            }

            async fn connections(
                &self,
                tenant: &TenantId,
                limit: u32,
                after: Option<&str>,
            ) -> Result<Page<Connection>> {
                let rows = sqlx::query(
                    "SELECT * FROM connections
                     WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR name > $2)
                     ORDER BY name LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(self.reader())
                .await?;
                let items = rows
                    .iter()
                    .map(|row| connection_from_row(row, None))
                    .collect::<Result<Vec<_>>>()?;
                Ok($crate::Page::of(items, limit, |c: &Connection| c.name.clone()))
            }

            async fn connection(
                &self,
                tenant: &TenantId,
                name_or_id: &str,
            ) -> Result<Option<Connection>> {
                let row = connection_row(self, tenant, name_or_id).await?;
                row.as_ref()
                    .map(|row| connection_from_row(row, Some(&self.keys)))
                    .transpose()
            }

            async fn connection_unopened(
                &self,
                tenant: &TenantId,
                name_or_id: &str,
            ) -> Result<Option<Connection>> {
                let row = connection_row(self, tenant, name_or_id).await?;
                row.as_ref().map(|row| connection_from_row(row, None)).transpose()
            }

            async fn update_connection(
                &self,
                tenant: &TenantId,
                id: &str,
                patch: ConnectionPatch,
            ) -> Result<Option<Connection>> {
                // Sealing needs only the tenant and the id (the name is for
                // errors of opening).
                let sealed = patch
                    .credentials
                    .as_ref()
                    .map(|credentials| {
                        self.keys.seal(
                            $crate::secrets::Owner {
                                tenant,
                                connection_id: id,
                                connection_name: id,
                            },
                            credentials,
                        )
                    })
                    .transpose()?;
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                if let Some(expected) = &patch.expect {
                    let held = sqlx::query(concat!(
                        "SELECT base_url, credentials FROM connections
                         WHERE tenant_id = $1 AND id = $2 ",
                        lock_rows!()
                    ))
                    .bind(tenant.as_str())
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
                    let Some(held) = held else {
                        tx.rollback().await?;
                        return Ok(None);
                    };
                    let now = $crate::connections::ExpectedConnection {
                        base_url: held.get("base_url"),
                        has_credentials: $crate::secrets::holds_credentials(
                            &held.get::<Json<Value>, _>("credentials").0,
                        ),
                    };
                    if now != *expected {
                        tx.rollback().await?;
                        return Err(StoreError::Conflict(
                            "the connection's base_url or credentials changed while this change \
                             was judged; read it again and send the change again"
                                .into(),
                        ));
                    }
                }
                // A new burst caps the tokens at once; a new rate refills
                // from what is left at the old one.
                let row = sqlx::query(
                    "UPDATE connections SET
                        base_url = CASE WHEN $3 THEN $4 ELSE base_url END,
                        credentials = COALESCE($5, credentials),
                        rate = CASE WHEN $6 THEN $7 ELSE rate END,
                        burst = COALESCE($8, burst),
                        tokens = CASE WHEN tokens > COALESCE($8, burst) THEN COALESCE($8, burst)
                            ELSE tokens END,
                        max_concurrency = CASE WHEN $9 THEN $10 ELSE max_concurrency END,
                        breaker_threshold = COALESCE($11, breaker_threshold),
                        breaker_cooldown_ms = COALESCE($12, breaker_cooldown_ms)
                     WHERE tenant_id = $1 AND id = $2
                     RETURNING *",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(patch.base_url.is_some())
                .bind(patch.base_url.flatten())
                .bind(sealed.as_ref().map(Json))
                .bind(patch.rate.is_some())
                .bind(patch.rate.flatten())
                .bind(patch.burst)
                .bind(patch.max_concurrency.is_some())
                .bind(patch.max_concurrency.flatten())
                .bind(patch.breaker_threshold)
                .bind(patch.breaker_cooldown_ms)
                .fetch_optional(&mut *tx)
                .await?;
                tx.commit().await?;
                row.as_ref().map(|row| connection_from_row(row, None)).transpose()
            }

            async fn delete_connection(&self, tenant: &TenantId, id: &str) -> Result<bool> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query("DELETE FROM connection_slots WHERE tenant_id = $1 AND connection_id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                let done = sqlx::query("DELETE FROM connections WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(done.rows_affected() > 0)
            }

            async fn admit(
                &self,
                tenant: &TenantId,
                connection_id: &str,
                job: JobId,
                lease_ms: i64,
            ) -> Result<Admission> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                // Lock the connection first; count the slots in a second
                // statement, so that (in READ COMMITTED) the count sees what
                // the admissions this one waited for have committed.
                let row = sqlx::query(concat!(
                    "SELECT rate, burst, tokens, refilled_at, max_concurrency, breaker_state,
                        opened_at, breaker_cooldown_ms
                     FROM connections WHERE tenant_id = $1 AND id = $2 ", lock_rows!()
                ))
                .bind(tenant.as_str())
                .bind(connection_id)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::NotFound("connection"))?;
                let slots = sqlx::query(concat!(
                    "SELECT clock.n AS now,
                        (SELECT COUNT(*) FROM connection_slots s
                         WHERE s.tenant_id = $1 AND s.connection_id = $2 AND s.job_id <> $3
                           AND s.expires_at > clock.n) AS in_flight
                     FROM (SELECT ", db_now!(), " AS n) clock"
                ))
                .bind(tenant.as_str())
                .bind(connection_id)
                .bind(job.0)
                .fetch_one(&mut *tx)
                .await?;
                let now: i64 = slots.get("now");
                let gate = Gate {
                    rate: row.get("rate"),
                    burst: row.get("burst"),
                    tokens: row.get("tokens"),
                    refilled_at: row.get("refilled_at"),
                    max_concurrency: row.get("max_concurrency"),
                    in_flight: slots.get("in_flight"),
                    breaker_state: row.get("breaker_state"),
                    opened_at: row.get("opened_at"),
                    cooldown_ms: row.get("breaker_cooldown_ms"),
                };
                let (admission, state) = gate.decide(now);
                if let Some((tokens, breaker_state, opened_at)) = state {
                    sqlx::query(
                        "UPDATE connections SET tokens = $3, refilled_at = $4, breaker_state = $5,
                            opened_at = $6
                         WHERE tenant_id = $1 AND id = $2",
                    )
                    .bind(tenant.as_str())
                    .bind(connection_id)
                    .bind(tokens)
                    .bind(now)
                    .bind(&breaker_state)
                    .bind(opened_at)
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query(
                        "INSERT INTO connection_slots (connection_id, tenant_id, job_id, expires_at)
                         VALUES ($1, $2, $3, $4)
                         ON CONFLICT (connection_id, job_id) DO UPDATE SET expires_at = $4",
                    )
                    .bind(connection_id)
                    .bind(tenant.as_str())
                    .bind(job.0)
                    .bind(now + lease_ms)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(admission)
            }

            async fn release(
                &self,
                tenant: &TenantId,
                connection_id: &str,
                job: JobId,
                outcome: CallOutcome,
            ) -> Result<()> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query(
                    "DELETE FROM connection_slots
                     WHERE tenant_id = $1 AND connection_id = $2 AND job_id = $3",
                )
                .bind(tenant.as_str())
                .bind(connection_id)
                .bind(job.0)
                .execute(&mut *tx)
                .await?;
                let sql = match outcome {
                    CallOutcome::Answered => concat!(
                        "UPDATE connections SET failures = 0, breaker_state = 'closed',
                            opened_at = NULL
                         WHERE tenant_id = $1 AND id = $2 AND ", db_now!(), " IS NOT NULL"
                    ),
                    CallOutcome::Unavailable => concat!(
                        "UPDATE connections SET failures = failures + 1,
                            breaker_state = CASE
                                WHEN breaker_state = 'half_open'
                                  OR failures + 1 >= breaker_threshold THEN 'open'
                                ELSE breaker_state END,
                            opened_at = CASE
                                WHEN breaker_state = 'half_open'
                                  OR failures + 1 >= breaker_threshold THEN ", db_now!(), "
                                ELSE opened_at END
                         WHERE tenant_id = $1 AND id = $2"
                    ),
                };
                sqlx::query(sql)
                    .bind(tenant.as_str())
                    .bind(connection_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }
        }
    };
}

pub(crate) use impl_connections;
