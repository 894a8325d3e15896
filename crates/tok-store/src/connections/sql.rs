//! [`ConnectionStore`] on every store, on the tenant's database: the same
//! SQL on both databases, but for the row lock and the database clock. A
//! connection's credentials are sealed as they are written and opened as
//! they are read (`secrets/`).

use async_trait::async_trait;
use serde_json::Value;
use tok_core::ids::{JobId, TenantId, new_id};

use super::{
    Admission, CallOutcome, Connection, ConnectionPatch, ConnectionStore, ExpectedConnection, Gate,
    NewConnection,
};
use crate::rows::now_ms;
use crate::secrets::{Keyring, Owner, holds_credentials};
use crate::sql::{Driver, DriverOf, Route, Row, SqlStore, on};
use crate::{Page, Result, StoreError};

/// A connection's row, its credentials opened with `keys`, or left `Null`
/// (a listing opens none).
fn connection<D: Driver>(row: &Row<D>, keys: Option<&Keyring>) -> Result<Connection> {
    let stored: Value = row.json("credentials")?;
    let has_credentials = holds_credentials(&stored);
    let tenant = TenantId::from(row.text("tenant_id")?);
    let id = row.text("id")?;
    let name = row.text("name")?;
    let credentials = match keys {
        Some(keys) => keys.open(
            Owner {
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
        service: row.text("service")?,
        base_url: row.opt_text("base_url")?,
        credentials,
        has_credentials,
        rate: row.opt_float("rate")?,
        burst: row.int32("burst")?,
        max_concurrency: row.opt_int32("max_concurrency")?,
        breaker_threshold: row.int32("breaker_threshold")?,
        breaker_cooldown_ms: row.int("breaker_cooldown_ms")?,
        breaker_state: row.text("breaker_state")?,
        failures: row.int32("failures")?,
        created_at: row.int("created_at")?,
    })
}

/// The tenant's connection `name_or_id`, opened with `keys` when given.
async fn connection_read<S: SqlStore>(
    store: &S,
    tenant: &TenantId,
    name_or_id: &str,
    keys: Option<&Keyring>,
) -> Result<Option<Connection>> {
    let mut conn = store.reader().acquire().await?;
    let row = on(
        "connections",
        "SELECT * FROM connections WHERE tenant_id = $1 AND (id = $2 OR name = $2)",
    )
    .text(tenant.as_str())
    .text(name_or_id)
    .fetch_optional::<S::Driver>(&mut conn)
    .await?;
    row.as_ref().map(|row| connection(row, keys)).transpose()
}

#[async_trait]
impl<R: Route> ConnectionStore for R {
    async fn create_connection(&self, tenant: &TenantId, new: NewConnection) -> Result<Connection> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let now = now_ms();
            let id = new_id("con");
            let sealed = db.keys().seal(
                Owner {
                    tenant,
                    connection_id: &id,
                    connection_name: &new.name,
                },
                &new.credentials,
            )?;
            let writer = db.writer().await;
            let mut conn = writer.acquire().await?;
            let inserted = on(
                "connections",
                "INSERT INTO connections (id, tenant_id, name, service, base_url, credentials,
                    rate, burst, tokens, refilled_at, max_concurrency, breaker_threshold,
                    breaker_cooldown_ms, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $10)
                 ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
            )
            .text(&id)
            .text(tenant.as_str())
            .text(&new.name)
            .text(&new.service)
            .opt_text(new.base_url.as_deref())
            .json(&sealed)
            .opt_float(new.rate)
            .int32(new.burst)
            .float(f64::from(new.burst))
            .int(now)
            .opt_int32(new.max_concurrency)
            .int32(new.breaker_threshold)
            .int(new.breaker_cooldown_ms)
            .fetch_optional::<DriverOf<R>>(&mut conn)
            .await?;
            drop(conn);
            drop(writer);
            if inserted.is_none() {
                return Err(StoreError::Taken(format!(
                    "a connection named `{}` already exists",
                    new.name
                )));
            }
            self.connection(tenant, &id)
                .await?
                .ok_or(StoreError::NotFound("connection"))
        })
        .await
    }

    async fn connections(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<Connection>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let mut conn = db.reader().acquire().await?;
            let rows = on(
                "connections",
                "SELECT * FROM connections
                 WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR name > $2)
                 ORDER BY name LIMIT $3",
            )
            .text(tenant.as_str())
            .opt_text(after)
            .int(i64::from(limit) + 1)
            .fetch_all::<DriverOf<R>>(&mut conn)
            .await?;
            let items = rows
                .iter()
                .map(|row| connection(row, None))
                .collect::<Result<Vec<_>>>()?;
            Ok(Page::of(items, limit, |c: &Connection| c.name.clone()))
        })
        .await
    }

    async fn connection(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<Connection>> {
        let db = self.db_for(tenant).await?;
        db.call(async { connection_read(&*db, tenant, name_or_id, Some(db.keys())).await })
            .await
    }

    async fn connection_unopened(
        &self,
        tenant: &TenantId,
        name_or_id: &str,
    ) -> Result<Option<Connection>> {
        let db = self.db_for(tenant).await?;
        db.call(async { connection_read(&*db, tenant, name_or_id, None).await })
            .await
    }

    async fn update_connection(
        &self,
        tenant: &TenantId,
        id: &str,
        patch: ConnectionPatch,
    ) -> Result<Option<Connection>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            // Sealing needs only the tenant and the id (the name is for errors
            // of opening).
            let sealed = patch
                .credentials
                .as_ref()
                .map(|credentials| {
                    db.keys().seal(
                        Owner {
                            tenant,
                            connection_id: id,
                            connection_name: id,
                        },
                        credentials,
                    )
                })
                .transpose()?;
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            if let Some(expected) = &patch.expect {
                let sql = format!(
                    "SELECT base_url, credentials FROM connections
                     WHERE tenant_id = $1 AND id = $2 {}",
                    DriverOf::<R>::LOCK_ROWS
                );
                let held = on("connections", &sql)
                    .text(tenant.as_str())
                    .text(id)
                    .fetch_optional::<DriverOf<R>>(&mut tx)
                    .await?;
                let Some(held) = held else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                let now = ExpectedConnection {
                    base_url: held.opt_text("base_url")?,
                    has_credentials: holds_credentials(&held.json::<Value>("credentials")?),
                };
                if now != *expected {
                    tx.rollback().await?;
                    return Err(StoreError::Changed(
                        "the connection's base_url or credentials changed while this change \
                         was judged; read it again and send the change again"
                            .into(),
                    ));
                }
            }
            // A new burst caps the tokens at once; a new rate refills from what
            // is left at the old one.
            let base_url = patch.base_url.clone().flatten();
            let row = on(
                "connections",
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
            .text(tenant.as_str())
            .text(id)
            .bool(patch.base_url.is_some())
            .opt_text(base_url.as_deref())
            .opt_json(sealed.as_ref())
            .bool(patch.rate.is_some())
            .opt_float(patch.rate.flatten())
            .opt_int32(patch.burst)
            .bool(patch.max_concurrency.is_some())
            .opt_int32(patch.max_concurrency.flatten())
            .opt_int32(patch.breaker_threshold)
            .opt_int(patch.breaker_cooldown_ms)
            .fetch_optional::<DriverOf<R>>(&mut tx)
            .await?;
            tx.commit().await?;
            row.as_ref().map(|row| connection(row, None)).transpose()
        })
        .await
    }

    async fn delete_connection(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            on(
                "connection_slots",
                "DELETE FROM connection_slots WHERE tenant_id = $1 AND connection_id = $2",
            )
            .text(tenant.as_str())
            .text(id)
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            let done = on(
                "connections",
                "DELETE FROM connections WHERE tenant_id = $1 AND id = $2",
            )
            .text(tenant.as_str())
            .text(id)
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            tx.commit().await?;
            Ok(done > 0)
        })
        .await
    }

    async fn admit(
        &self,
        tenant: &TenantId,
        connection_id: &str,
        job: JobId,
        lease_ms: i64,
    ) -> Result<Admission> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            // Lock the connection first; count the slots in a second statement,
            // so that (in READ COMMITTED) the count sees what the admissions
            // this one waited for have committed.
            let sql = format!(
                "SELECT rate, burst, tokens, refilled_at, max_concurrency, breaker_state,
                    opened_at, breaker_cooldown_ms
                 FROM connections WHERE tenant_id = $1 AND id = $2 {}",
                DriverOf::<R>::LOCK_ROWS
            );
            let row = on("connections", &sql)
                .text(tenant.as_str())
                .text(connection_id)
                .fetch_optional::<DriverOf<R>>(&mut tx)
                .await?
                .ok_or(StoreError::NotFound("connection"))?;
            let sql = format!(
                "SELECT clock.n AS now,
                    (SELECT COUNT(*) FROM connection_slots s
                     WHERE s.tenant_id = $1 AND s.connection_id = $2 AND s.job_id <> $3
                       AND s.expires_at > clock.n) AS in_flight
                 FROM (SELECT {} AS n) clock",
                DriverOf::<R>::DB_NOW
            );
            let slots = on("connection_slots", &sql)
                .text(tenant.as_str())
                .text(connection_id)
                .int(job.0)
                .fetch_one::<DriverOf<R>>(&mut tx)
                .await?;
            let now = slots.int("now")?;
            let gate = Gate {
                rate: row.opt_float("rate")?,
                burst: row.int32("burst")?,
                tokens: row.float("tokens")?,
                refilled_at: row.int("refilled_at")?,
                max_concurrency: row.opt_int32("max_concurrency")?,
                in_flight: slots.int("in_flight")?,
                breaker_state: row.text("breaker_state")?,
                opened_at: row.opt_int("opened_at")?,
                cooldown_ms: row.int("breaker_cooldown_ms")?,
            };
            let (admission, state) = gate.decide(now);
            if let Some((tokens, breaker_state, opened_at)) = state {
                on(
                    "connections",
                    "UPDATE connections SET tokens = $3, refilled_at = $4, breaker_state = $5,
                        opened_at = $6
                     WHERE tenant_id = $1 AND id = $2",
                )
                .text(tenant.as_str())
                .text(connection_id)
                .float(tokens)
                .int(now)
                .text(&breaker_state)
                .opt_int(opened_at)
                .execute::<DriverOf<R>>(&mut tx)
                .await?;
                on(
                    "connection_slots",
                    "INSERT INTO connection_slots (connection_id, tenant_id, job_id, expires_at)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (connection_id, job_id) DO UPDATE SET expires_at = $4",
                )
                .text(connection_id)
                .text(tenant.as_str())
                .int(job.0)
                .int(now + lease_ms)
                .execute::<DriverOf<R>>(&mut tx)
                .await?;
            }
            tx.commit().await?;
            Ok(admission)
        })
        .await
    }

    async fn release(
        &self,
        tenant: &TenantId,
        connection_id: &str,
        job: JobId,
        outcome: CallOutcome,
    ) -> Result<()> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            on(
                "connection_slots",
                "DELETE FROM connection_slots
                 WHERE tenant_id = $1 AND connection_id = $2 AND job_id = $3",
            )
            .text(tenant.as_str())
            .text(connection_id)
            .int(job.0)
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            let sql = match outcome {
                CallOutcome::Answered => format!(
                    "UPDATE connections SET failures = 0, breaker_state = 'closed',
                        opened_at = NULL
                     WHERE tenant_id = $1 AND id = $2 AND {} IS NOT NULL",
                    DriverOf::<R>::DB_NOW
                ),
                CallOutcome::Unavailable => format!(
                    "UPDATE connections SET failures = failures + 1,
                        breaker_state = CASE
                            WHEN breaker_state = 'half_open'
                              OR failures + 1 >= breaker_threshold THEN 'open'
                            ELSE breaker_state END,
                        opened_at = CASE
                            WHEN breaker_state = 'half_open'
                              OR failures + 1 >= breaker_threshold THEN {}
                            ELSE opened_at END
                     WHERE tenant_id = $1 AND id = $2",
                    DriverOf::<R>::DB_NOW
                ),
            };
            on("connections", &sql)
                .text(tenant.as_str())
                .text(connection_id)
                .execute::<DriverOf<R>>(&mut tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }
}
