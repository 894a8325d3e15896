//! The queries both backends share, written once.
//!
//! The SQL of PostgreSQL and SQLite differs in a handful of fragments (the
//! database clock, how a list of ids is bound, row locking, the fair
//! selection of events and jobs); everything else is the same text. `impl_common!` expands
//! the shared trait implementations for one backend with that backend's
//! fragments spliced in at compile time, so a query exists once and both
//! backends run it. Backend-specific code (connecting, migrations,
//! partitions) stays in `postgres.rs` and `sqlite.rs`.

/// Unix milliseconds of the process clock, for `created_at`-style columns.
/// Leases and due times use the database clock instead (`NOW` fragments).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// A tenant with this many events in one dispatch's batch crowds it: the
/// other tenants' events in the batch are dispatched first, on their own.
pub(crate) const DISPATCH_CROWDING: usize = 4;

/// Events older than this no longer deduplicate a repeated idempotency key.
pub(crate) const IDEMPOTENCY_WINDOW_MS: i64 = 24 * 60 * 60 * 1000;

/// The rows of a batch statement, bound as one JSON array (`rows_1`).
/// They borrow what they write: a payload or a context is serialized once
/// into the statement's parameter, never copied first.
///
/// Each row is a JSON array of its fields in the order [`array_row!`]
/// lists them, and the statement reads them by position (`x.value ->> 0`):
/// SQLite finds an array element by its index but an object's member by
/// comparing keys, and with objects a batch insert of step rows took twice
/// as long on the one writer.
pub(crate) struct EventRow<'a> {
    pub(crate) id: &'a str,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) event: &'a crate::NewEvent,
}

pub(crate) struct RunRow<'a> {
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) event_id: &'a tok_core::ids::EventId,
    pub(crate) status: &'static str,
    pub(crate) started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) run: &'a crate::NewRun,
}

/// New runs whose first jobs are written claimed by a dispatching node.
pub(crate) struct HandedOff<'a> {
    pub(crate) node: &'a str,
    pub(crate) lease_ms: i64,
    pub(crate) token: &'a str,
    /// The runs, by id.
    pub(crate) runs: &'a std::collections::HashSet<&'a str>,
}

pub(crate) struct JobRow<'a> {
    pub(crate) run_id: &'a tok_core::ids::RunId,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) path: &'a str,
    pub(crate) queue_key: Option<&'a str>,
    pub(crate) priority: i32,
    pub(crate) attempts: i32,
    pub(crate) locked_by: Option<&'a str>,
    pub(crate) claim_token: Option<&'a str>,
}

/// A claim to fence: the job, its tenant and the token it holds.
pub(crate) struct FenceRow<'a> {
    pub(crate) id: i64,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) token: &'a str,
}

/// A recorded job that stays: where it goes next, and whether it keeps its
/// lease (`token`) or is released.
pub(crate) struct JobMove<'a> {
    pub(crate) id: i64,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) path: String,
    pub(crate) delay_ms: i64,
    pub(crate) attempts: i32,
    pub(crate) token: Option<String>,
    pub(crate) lease_ms: i64,
    pub(crate) held: bool,
    pub(crate) queue_key: Option<String>,
    /// When the job is due (Unix ms), overriding `delay_ms`: a parked wait's timeout.
    pub(crate) run_at: Option<i64>,
    /// Why the job will be handed out again; `None` for a job that is not parked.
    pub(crate) resume: Option<crate::Resume>,
}

/// What a job recorded at a wait becomes (see `signals_sql.rs`): ready now
/// with a buffered signal (`run_at` `None`), or parked until its timeout.
pub(crate) struct Parked {
    pub(crate) run_at: Option<i64>,
    pub(crate) resume: crate::Resume,
}

pub(crate) struct StepRow<'a> {
    pub(crate) run_id: &'a tok_core::ids::RunId,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) step: &'a crate::StepRecord,
}

pub(crate) struct RunUpdate<'a> {
    pub(crate) id: &'a tok_core::ids::RunId,
    pub(crate) tenant_id: &'a tok_core::ids::TenantId,
    pub(crate) context: &'a serde_json::Value,
    pub(crate) actions: i32,
    pub(crate) status: &'static str,
    pub(crate) error: Option<&'a str>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) subject_ticket_id: Option<&'a str>,
}

/// Serializes a batch row as a JSON array: `row` names the row inside the
/// brackets, whose expressions are its elements, position 0 first.
macro_rules! array_row {
    ($ty:ident, |$row:ident| [$($field:expr),+ $(,)?]) => {
        impl serde::Serialize for $ty<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeTuple;
                let $row = self;
                let len = [$(stringify!($field)),+].len();
                let mut tuple = serializer.serialize_tuple(len)?;
                $(tuple.serialize_element(&$field)?;)+
                tuple.end()
            }
        }
    };
}

array_row!(EventRow, |r| [
    r.id,                         // 0
    r.tenant_id,                  // 1
    r.event.source_id,            // 2
    r.event.source_kind,          // 3
    r.event.idempotency_key,      // 4
    r.event.payload,              // 5
    r.event.params,               // 6
    r.event.cause_run_id,         // 7
    r.event.depth,                // 8
    r.event.origin_automation_id, // 9
    r.event.target_automation_id, // 10
    r.event.event_type,           // 11
    r.event.subject_ticket_id,    // 12
]);

array_row!(RunRow, |r| [
    r.run.id,                // 0
    r.tenant_id,             // 1
    r.run.automation_id,     // 2
    r.run.version,           // 3
    r.event_id,              // 4
    r.run.trigger_type,      // 5
    r.status,                // 6
    r.run.depth,             // 7
    r.run.queue_key,         // 8
    r.run.context,           // 9
    r.started_at,            // 10
    r.finished_at,           // 11
    r.run.idempotency_key,   // 12
    r.run.subject_ticket_id, // 13
    r.run.actions,           // 14
]);

array_row!(JobRow, |r| [
    r.run_id,      // 0
    r.tenant_id,   // 1
    r.path,        // 2
    r.attempts,    // 3
    r.queue_key,   // 4
    r.priority,    // 5
    r.locked_by,   // 6
    r.claim_token, // 7
]);

array_row!(FenceRow, |r| [r.id, r.tenant_id, r.token]);

array_row!(JobMove, |r| [
    r.id,        // 0
    r.tenant_id, // 1
    r.path,      // 2
    r.delay_ms,  // 3
    r.attempts,  // 4
    r.token,     // 5
    r.lease_ms,  // 6
    r.held,      // 7
    r.queue_key, // 8
    r.run_at,    // 9
    r.resume,    // 10
]);

array_row!(StepRow, |r| [
    r.run_id,           // 0
    r.tenant_id,        // 1
    r.step.path,        // 2
    r.step.step_id,     // 3
    r.step.kind,        // 4
    r.step.attempt,     // 5
    r.step.status,      // 6
    r.step.input,       // 7
    r.step.output,      // 8
    r.step.error,       // 9
    r.step.log,         // 10
    r.step.started_at,  // 11
    r.step.finished_at, // 12
]);

array_row!(RunUpdate, |r| [
    r.id,                // 0
    r.tenant_id,         // 1
    r.context,           // 2
    r.actions,           // 3
    r.status,            // 4
    r.error,             // 5
    r.finished_at,       // 6
    r.subject_ticket_id, // 7
]);

macro_rules! impl_common {
    (
        store = $store:ty,
        db = $db:ty,
        now = $now:literal,
        tenants_in_1 = $in1:literal,
        ids_in_2 = $in2:literal,
        ids_in_4 = $in4:literal,
        lock_row = $lock_row:literal,
        claim_prelude = $claim_prelude:literal,
        plan_prelude = $plan_prelude:literal,
        claim_candidates = $claim_candidates:literal,
        dispatch_select = $dispatch_select:literal,
        release_where = $release_where:literal,
        rows_1 = $rows1:literal,
        lock_jobs_runs = $lock_jobs_runs:literal,
        notify_work = $notify_work:literal,
        by_key_tenants_in_1 = $by_key_in1:literal,
        by_key_tenant = $by_key_tenant:literal,
        key_hint_jobs_2 = $key_hint_jobs2:literal,
        key_hint_runs_2 = $key_hint_runs2:literal,
        update_staying_runs_apart = $staying_apart:literal,
        skip_locked = $skip_locked:literal,
        list = $list:path,
    ) => {
        use serde_json::Value;
        use sqlx::Row as _;
        use sqlx::types::Json;
        use tok_core::ids::{new_id, AutomationId, EventId, JobId, RunId, SourceId, TenantId};
        use $crate::common::{now_ms, IDEMPOTENCY_WINDOW_MS};
        use $crate::*;

        fn tenant_from_row(row: &<$db as sqlx::Database>::Row) -> Tenant {
            Tenant {
                id: TenantId::from(row.get::<String, _>("id")),
                name: row.get("name"),
                created_at: row.get("created_at"),
            }
        }

        fn source_from_row(row: &<$db as sqlx::Database>::Row) -> Source {
            Source {
                id: SourceId::from(row.get::<String, _>("id")),
                tenant_id: TenantId::from(row.get::<String, _>("tenant_id")),
                name: row.get("name"),
                token: row.get("token"),
                params: row.get::<Json<Value>, _>("params").0,
                critical: row.get("critical"),
                rate_limit: row.get("rate_limit"),
                secret: row.get("secret"),
                created_at: row.get("created_at"),
            }
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
            }
        }

        fn run_from_row(row: &<$db as sqlx::Database>::Row) -> RunSummary {
            RunSummary {
                id: RunId::from(row.get::<String, _>("id")),
                automation_id: AutomationId::from(row.get::<String, _>("automation_id")),
                version: row.get("version"),
                event_id: EventId::from(row.get::<String, _>("event_id")),
                status: row.get("status"),
                trigger_type: row.get("trigger_type"),
                depth: row.get("depth"),
                actions: row.get("actions"),
                subject_ticket_id: row.get("subject_ticket_id"),
                created_at: row.get("created_at"),
                started_at: row.get("started_at"),
                finished_at: row.get("finished_at"),
                error: row.get("error"),
            }
        }

        /// Why a claimed job was handed out again. A value this version
        /// cannot read is logged and the job claimed as a fresh one.
        fn resume_from_row(row: &<$db as sqlx::Database>::Row) -> Option<Resume> {
            match row.try_get::<Option<Json<Resume>>, _>("resume") {
                Ok(resume) => resume.map(|r| r.0),
                Err(e) => {
                    tracing::warn!(job = row.get::<i64, _>("id"), error = %e, "unreadable resume of a claimed job");
                    None
                }
            }
        }

        fn event_from_row(row: &<$db as sqlx::Database>::Row) -> PendingEvent {
            PendingEvent {
                id: EventId::from(row.get::<String, _>("id")),
                tenant_id: TenantId::from(row.get::<String, _>("tenant_id")),
                source_id: row.get::<Option<String>, _>("source_id").map(SourceId::from),
                source_kind: row.get("source_kind"),
                payload: row.get::<Json<Value>, _>("payload").0,
                params: row.get::<Json<Value>, _>("params").0,
                depth: row.get("depth"),
                cause_run_id: row.get::<Option<String>, _>("cause_run_id").map(RunId::from),
                origin_automation_id: row
                    .get::<Option<String>, _>("origin_automation_id")
                    .map(AutomationId::from),
                target_automation_id: row
                    .get::<Option<String>, _>("target_automation_id")
                    .map(AutomationId::from),
                event_type: row.get("event_type"),
                subject_ticket_id: row.get("subject_ticket_id"),
                received_at: row.get("received_at"),
            }
        }

        const AUTOMATION_SELECT: &str = "SELECT a.id, a.tenant_id, a.name, a.status, a.current_version,
                a.created_at, a.updated_at, v.definition, v.hash
            FROM automations a
            JOIN automation_versions v ON v.automation_id = a.id AND v.version = a.current_version";

        const RUN_COLUMNS: &str = "id, automation_id, version, event_id, status, trigger_type, depth,
            actions, subject_ticket_id, created_at, started_at, finished_at, error";

        async fn insert_event(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            event: &NewEvent,
            status: &str,
        ) -> Result<Option<EventId>> {
            let id = new_id("evt");
            let now = now_ms();
            let inserted = sqlx::query(
                "INSERT INTO event_inbox (id, tenant_id, source_id, source_kind, idempotency_key,
                    payload, params, received_at, status, dispatched_at, cause_run_id, depth,
                    origin_automation_id, target_automation_id, event_type, subject_ticket_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
                 ON CONFLICT (tenant_id, source_kind, source_id, idempotency_key) DO NOTHING
                 RETURNING id",
            )
            .bind(&id)
            .bind(tenant.as_str())
            .bind(event.source_id.as_ref().map(|s| s.as_str()))
            .bind(&event.source_kind)
            .bind(&event.idempotency_key)
            .bind(Json(&event.payload))
            .bind(Json(&event.params))
            .bind(now)
            .bind(status)
            .bind((status == "dispatched").then_some(now))
            .bind(event.cause_run_id.as_ref().map(|r| r.as_str()))
            .bind(event.depth)
            .bind(event.origin_automation_id.as_ref().map(|a| a.as_str()))
            .bind(event.target_automation_id.as_ref().map(|a| a.as_str()))
            .bind(event.event_type.as_deref())
            .bind(event.subject_ticket_id.as_deref())
            .fetch_optional(&mut **tx)
            .await?;
            Ok(inserted.map(|_| EventId::from(id)))
        }

        async fn run_by_key(
            pool: &sqlx::Pool<$db>,
            tenant: &TenantId,
            automation: &AutomationId,
            key: &str,
        ) -> Result<Option<RunId>> {
            let row = sqlx::query(
                "SELECT id FROM runs
                 WHERE tenant_id = $1 AND automation_id = $2 AND idempotency_key = $3",
            )
            .bind(tenant.as_str())
            .bind(automation.as_str())
            .bind(key)
            .fetch_optional(pool)
            .await?;
            Ok(row.map(|r| RunId::from(r.get::<String, _>("id"))))
        }

        /// Runs of an automation on a ticket started within the last minute.
        async fn recent_runs(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            automation: &AutomationId,
            ticket: &str,
            now: i64,
        ) -> Result<i64> {
            let row = sqlx::query(
                "SELECT COUNT(*) AS n FROM runs
                 WHERE tenant_id = $1 AND subject_ticket_id = $2 AND automation_id = $3
                   AND created_at > $4",
            )
            .bind(tenant.as_str())
            .bind(ticket)
            .bind(automation.as_str())
            .bind(now - 60_000)
            .fetch_one(&mut **tx)
            .await?;
            Ok(row.get("n"))
        }

        /// Writes one event in the caller's transaction, or finds the event
        /// its idempotency key already wrote within the window.
        async fn accept_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            event: &NewEvent,
        ) -> Result<(EventId, Accepted)> {
            if let Some(id) = insert_event(tx, tenant, event, "pending").await? {
                return Ok((id, Accepted { duplicate: false }));
            }
            let existing = sqlx::query(
                "SELECT id, received_at FROM event_inbox
                 WHERE tenant_id = $1 AND source_kind = $2 AND source_id = $3
                   AND idempotency_key = $4",
            )
            .bind(tenant.as_str())
            .bind(&event.source_kind)
            .bind(event.source_id.as_ref().map(|s| s.as_str()))
            .bind(&event.idempotency_key)
            .fetch_one(&mut **tx)
            .await?;
            let existing_id: String = existing.get("id");
            if existing.get::<i64, _>("received_at") >= now_ms() - IDEMPOTENCY_WINDOW_MS {
                return Ok((EventId::from(existing_id), Accepted { duplicate: true }));
            }
            // The earlier event is outside the window: retire its key so
            // this one is a new event.
            sqlx::query(
                "UPDATE event_inbox SET idempotency_key = idempotency_key || ':' || id
                 WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.as_str())
            .bind(&existing_id)
            .execute(&mut **tx)
            .await?;
            let id = insert_event(tx, tenant, event, "pending")
                .await?
                .ok_or_else(|| StoreError::Conflict("idempotency key taken twice".into()))?;
            Ok((id, Accepted { duplicate: false }))
        }

        /// The inbox's group commit: every event of the batch in one
        /// transaction (see `batch.rs`). An event that cannot be stored
        /// (U+0000 in its JSON) is refused before and the others written;
        /// when the database refuses the batch over one row's data, the
        /// batch is written again event by event, and only the event at
        /// fault is refused.
        pub(crate) async fn accept_batch(
            pool: &sqlx::Pool<$db>,
            items: Vec<(TenantId, NewEvent)>,
        ) -> Result<Vec<Result<(EventId, Accepted)>>> {
            let checked: Vec<Result<()>> = items
                .iter()
                .map(|(_, event)| $crate::storable::check_event(event))
                .collect();
            let storable: Vec<(&TenantId, &NewEvent)> = items
                .iter()
                .zip(&checked)
                .filter(|(_, check)| check.is_ok())
                .map(|((tenant, event), _)| (tenant, event))
                .collect();
            let mut accepted = accept_storable(pool, &storable).await?.into_iter();
            Ok(checked
                .into_iter()
                .map(|check| match check {
                    Ok(()) => accepted.next().unwrap_or_else(|| {
                        Err(StoreError::Conflict("an event of the batch was not answered".into()))
                    }),
                    Err(refused) => Err(refused),
                })
                .collect())
        }

        /// [`accept_batch`] for events that passed its check.
        async fn accept_storable(
            pool: &sqlx::Pool<$db>,
            items: &[(&TenantId, &NewEvent)],
        ) -> Result<Vec<Result<(EventId, Accepted)>>> {
            if items.is_empty() {
                return Ok(Vec::new());
            }
            // One statement writes every new event, committed on its own
            // (a statement outside a transaction is one: no `BEGIN` and
            // `COMMIT` round trips); an event whose key is already taken (a
            // duplicate, or a key outside the window) then goes the
            // one-by-one way in a transaction. Nobody is answered before
            // both committed; a crash between them loses nothing answered,
            // and the retried webhooks find their rows as duplicates.
            let ids: Vec<String> = items.iter().map(|_| new_id("evt")).collect();
            let now = now_ms();
            let rows: Vec<$crate::common::EventRow> = items
                .iter()
                .zip(&ids)
                .map(|(&(tenant_id, event), id)| $crate::common::EventRow { id, tenant_id, event })
                .collect();
            let inserted = sqlx::query(concat!(
                "INSERT INTO event_inbox (id, tenant_id, source_id, source_kind, idempotency_key,
                    payload, params, received_at, status, cause_run_id, depth,
                    origin_automation_id, target_automation_id, event_type, subject_ticket_id)
                 SELECT x.value ->> 0, x.value ->> 1, x.value ->> 2,
                    x.value ->> 3, x.value ->> 4,
                    x.value -> 5, x.value -> 6, $2, 'pending',
                    x.value ->> 7, CAST(x.value ->> 8 AS INTEGER),
                    x.value ->> 9, x.value ->> 10,
                    x.value ->> 11, x.value ->> 12
                 FROM ", $rows1, "
                 WHERE true
                 ORDER BY x.key
                 ON CONFLICT (tenant_id, source_kind, source_id, idempotency_key) DO NOTHING
                 RETURNING id"
            ))
            .bind(Json(&rows))
            .bind(now)
            .fetch_all(pool)
            .await
            .map_err(StoreError::from);
            let written: std::collections::HashSet<String> = match inserted {
                Ok(rows) => rows.iter().map(|r| r.get::<String, _>("id")).collect(),
                // The statement wrote nothing: each event alone, so that
                // only the one at fault is refused.
                Err(e) if $crate::storable::refused_row(&e) => {
                    let mut out = Vec::with_capacity(items.len());
                    for (tenant, event) in items {
                        out.push(accept_alone(pool, tenant, event).await?);
                    }
                    return Ok(out);
                }
                Err(e) => return Err(e),
            };
            if written.len() == items.len() {
                return Ok(ids
                    .into_iter()
                    .map(|id| Ok((EventId::from(id), Accepted { duplicate: false })))
                    .collect());
            }
            let rest: Vec<usize> = ids
                .iter()
                .enumerate()
                .filter(|(_, id)| !written.contains(*id))
                .map(|(i, _)| i)
                .collect();
            let together = async {
                let mut tx = pool.begin().await?;
                let mut out = Vec::with_capacity(rest.len());
                for &i in &rest {
                    let (tenant, event) = items[i];
                    out.push(accept_in(&mut tx, tenant, event).await?);
                }
                tx.commit().await?;
                Result::Ok(out)
            }
            .await;
            let mut rest_answers = match together {
                Ok(out) => out.into_iter().map(Ok).collect::<Vec<_>>(),
                // The events written by the statement above stay; the rest
                // go alone.
                Err(e) if $crate::storable::refused_row(&e) => {
                    let mut out = Vec::with_capacity(rest.len());
                    for &i in &rest {
                        let (tenant, event) = items[i];
                        out.push(accept_alone(pool, tenant, event).await?);
                    }
                    out
                }
                Err(e) => return Err(e),
            }
            .into_iter();
            Ok(ids
                .into_iter()
                .map(|id| {
                    if written.contains(&id) {
                        Ok((EventId::from(id), Accepted { duplicate: false }))
                    } else {
                        rest_answers.next().unwrap_or_else(|| {
                            Err(StoreError::Conflict("an event of the batch was not answered".into()))
                        })
                    }
                })
                .collect())
        }

        /// One event in a transaction of its own: the answer, or its own
        /// refusal when the database refuses its row; `Err` only when the
        /// database could not take the write at all.
        async fn accept_alone(
            pool: &sqlx::Pool<$db>,
            tenant: &TenantId,
            event: &NewEvent,
        ) -> Result<Result<(EventId, Accepted)>> {
            let alone = async {
                let mut tx = pool.begin().await?;
                let accepted = accept_in(&mut tx, tenant, event).await?;
                tx.commit().await?;
                Result::Ok(accepted)
            }
            .await;
            match alone {
                Ok(accepted) => Ok(Ok(accepted)),
                Err(e) if $crate::storable::refused_row(&e) => {
                    tracing::warn!(tenant = %tenant, error = %e, "the database refused an event");
                    Ok(Err(StoreError::Refused(
                        "the database refused to store this event as invalid data; nothing was \
                         written, and sending it again will fail the same way"
                            .into(),
                    )))
                }
                Err(e) => Err(e),
            }
        }

        /// The records' group commit: each claim's record in one shared
        /// transaction. A record whose lease was lost writes nothing and is
        /// answered `LeaseLost`; the others go on. Text with U+0000 is made
        /// storable first (`storable.rs`); when the database still refuses
        /// the batch over one row's data, each record is written in a
        /// transaction of its own, and a record refused alone fails its run
        /// instead (`storable::refused_record`), so that its step does not
        /// run again and again while its batch-mates are written.
        pub(crate) async fn record_batch(
            pool: &sqlx::Pool<$db>,
            mut items: Vec<(ClaimedJob, Record)>,
        ) -> Result<Vec<Result<bool>>> {
            for (_, record) in &mut items {
                $crate::storable::mend_record(record);
            }
            let (refusal, items) = match record_together(pool, items).await? {
                Ok(answers) => return Ok(answers),
                Err(refused) => refused,
            };
            tracing::warn!(error = %refusal, records = items.len(),
                "the database refused a record batch; writing its records one by one");
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let answer = match record_together(pool, vec![item]).await? {
                    Ok(mut one) => one.pop().unwrap_or(Ok(false)),
                    Err((refusal, mut one)) => {
                        let (job, record) = one.pop().expect("the record refused");
                        tracing::error!(job = %job.id, run = %job.run_id, error = %refusal,
                            "the database refused a record; its run fails");
                        let failed = $crate::storable::refused_record(&job, &record, now_ms());
                        match record_together(pool, vec![(job, failed)]).await? {
                            // The job went: it does not stay leased.
                            Ok(mut one) => one.pop().unwrap_or(Ok(false)).map(|_| false),
                            Err((refusal, _)) => Err(refusal),
                        }
                    }
                };
                out.push(answer);
            }
            Ok(out)
        }

        /// [`record_batch`]'s records in one transaction: an answer per
        /// record, or, when the database refused a row's data, the refusal
        /// and the records (nothing of them written).
        async fn record_together(
            pool: &sqlx::Pool<$db>,
            items: Vec<(ClaimedJob, Record)>,
        ) -> Result<
            std::result::Result<Vec<Result<bool>>, (StoreError, Vec<(ClaimedJob, Record)>)>,
        > {
            let mut tx = pool.begin().await?;
            if !$plan_prelude.is_empty() {
                sqlx::Executor::execute(&mut *tx, $plan_prelude).await?;
            }
            let held = fenced_statuses(&mut tx, items.iter().map(|(job, _)| job)).await?;
            // Fenced records with their run's status; the lost ones apart.
            let mut fenced = Vec::with_capacity(items.len());
            let mut lost = Vec::new();
            let mut kept = Vec::with_capacity(items.len());
            for (job, record) in items {
                match held.get(&job.id.0) {
                    Some(status) => {
                        kept.push(true);
                        fenced.push((job, record, status.clone()));
                    }
                    None => {
                        kept.push(false);
                        lost.push((job, record));
                    }
                }
            }
            let written = async {
                let continued = write_records(&mut tx, &fenced).await?;
                tx.commit().await?;
                Result::Ok(continued)
            }
            .await;
            let continued = match written {
                Ok(continued) => continued,
                Err(e) if $crate::storable::refused_row(&e) => {
                    let (mut fenced, mut lost) = (fenced.into_iter(), lost.into_iter());
                    let items = kept
                        .into_iter()
                        .filter_map(|kept| match kept {
                            true => fenced.next().map(|(job, record, _)| (job, record)),
                            false => lost.next(),
                        })
                        .collect();
                    return Ok(Err((e, items)));
                }
                Err(e) => return Err(e),
            };
            let (mut continued, mut lost) = (continued.into_iter(), lost.into_iter());
            Ok(Ok(kept
                .into_iter()
                .map(|kept| match kept {
                    true => Ok(continued.next().unwrap_or(false)),
                    false => Err(StoreError::LeaseLost(
                        lost.next().map(|(job, _)| job.id).unwrap_or(JobId(0)),
                    )),
                })
                .collect()))
        }

        /// Writes step rows, one statement for all of them.
        async fn insert_steps(
            tx: &mut sqlx::Transaction<'_, $db>,
            steps: &[$crate::common::StepRow<'_>],
            now: i64,
        ) -> Result<()> {
            if steps.is_empty() {
                return Ok(());
            }
            sqlx::query(concat!(
                "INSERT INTO run_steps (run_id, tenant_id, path, step_id, type, attempt,
                    status, input, output, error, log, started_at, finished_at, created_at)
                 SELECT x.value ->> 0, x.value ->> 1, x.value ->> 2,
                    x.value ->> 3, x.value ->> 4,
                    CAST(x.value ->> 5 AS INTEGER), x.value ->> 6,
                    NULLIF(x.value -> 7, 'null'), NULLIF(x.value -> 8, 'null'),
                    x.value ->> 9, x.value -> 10,
                    CAST(x.value ->> 11 AS BIGINT),
                    CAST(x.value ->> 12 AS BIGINT), $2
                 FROM ", $rows1, "
                 ORDER BY x.key"
            ))
            .bind(Json(steps))
            .bind(now)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        /// Writes runs (with the steps the dispatch ran for them) and their
        /// first jobs, a statement for all runs, one for their steps and one
        /// for all jobs; returns the ids of the runs written (a run whose
        /// (event, automation) already had one is not) and the jobs written
        /// claimed for `handed`'s node.
        async fn insert_runs(
            tx: &mut sqlx::Transaction<'_, $db>,
            runs: &[(TenantId, EventId, NewRun)],
            handed: Option<&$crate::common::HandedOff<'_>>,
        ) -> Result<(std::collections::HashSet<String>, Vec<ClaimedJob>)> {
            if runs.is_empty() {
                return Ok(Default::default());
            }
            let now = now_ms();
            let is_handed = |run: &NewRun| handed.is_some_and(|h| h.runs.contains(run.id.as_str()));
            let rows: Vec<$crate::common::RunRow> = runs
                .iter()
                .map(|(tenant_id, event_id, run)| {
                    // A run whose first steps ran in the dispatch has started.
                    let started = !run.steps.is_empty();
                    let (status, started_at, finished_at) = match run.first_path {
                        Some(_) if is_handed(run) || started => (RunStatus::Running, Some(now), None),
                        Some(_) => (RunStatus::Queued, None, None),
                        None => (RunStatus::Completed, started.then_some(now), Some(now)),
                    };
                    $crate::common::RunRow {
                        tenant_id,
                        event_id,
                        status: status.as_str(),
                        started_at,
                        finished_at,
                        run,
                    }
                })
                .collect();
            let written: std::collections::HashSet<String> = sqlx::query(concat!(
                "INSERT INTO runs (id, tenant_id, automation_id, version, event_id, trigger_type,
                    status, depth, queue_key, context, actions, created_at, started_at,
                    finished_at, idempotency_key, subject_ticket_id)
                 SELECT x.value ->> 0, x.value ->> 1, x.value ->> 2,
                    CAST(x.value ->> 3 AS INTEGER), x.value ->> 4,
                    x.value ->> 5, x.value ->> 6,
                    CAST(x.value ->> 7 AS INTEGER), x.value ->> 8,
                    x.value -> 9, CAST(x.value ->> 14 AS INTEGER), $2, CAST(x.value ->> 10 AS BIGINT),
                    CAST(x.value ->> 11 AS BIGINT),
                    x.value ->> 12, x.value ->> 13
                 FROM ", $rows1, "
                 WHERE true
                 ORDER BY x.key
                 ON CONFLICT (event_id, automation_id) DO NOTHING
                 RETURNING id"
            ))
            .bind(Json(&rows))
            .bind(now)
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|r| r.get::<String, _>("id"))
            .collect();
            let steps: Vec<$crate::common::StepRow> = runs
                .iter()
                .filter(|(_, _, run)| written.contains(run.id.as_str()))
                .flat_map(|(tenant_id, _, run)| {
                    run.steps.iter().map(move |step| $crate::common::StepRow {
                        run_id: &run.id,
                        tenant_id,
                        step,
                    })
                })
                .collect();
            insert_steps(tx, &steps, now).await?;
            let jobs: Vec<$crate::common::JobRow> = runs
                .iter()
                .filter(|(_, _, run)| written.contains(run.id.as_str()))
                .filter_map(|(tenant_id, _, run)| {
                    let path = run.first_path.as_deref()?;
                    let claim = handed.filter(|_| is_handed(run));
                    Some($crate::common::JobRow {
                        run_id: &run.id,
                        tenant_id,
                        path,
                        queue_key: run.queue_key.as_deref(),
                        priority: run.priority,
                        attempts: i32::from(claim.is_some()),
                        locked_by: claim.map(|h| h.node),
                        claim_token: claim.map(|h| h.token),
                    })
                })
                .collect();
            if jobs.is_empty() {
                return Ok((written, Vec::new()));
            }
            let ids = sqlx::query(concat!(
                "INSERT INTO jobs (run_id, tenant_id, path, run_after, attempts, queue_key,
                    priority, created_at, locked_by, locked_until, claim_token)
                 SELECT x.value ->> 0, x.value ->> 1, x.value ->> 2, ",
                    $now, ", CAST(x.value ->> 3 AS INTEGER), x.value ->> 4,
                    CAST(x.value ->> 5 AS INTEGER), $2, x.value ->> 6,
                    CASE WHEN x.value ->> 6 IS NULL THEN NULL ELSE ", $now, " + $3 END,
                    x.value ->> 7
                 FROM ", $rows1, "
                 ORDER BY x.key
                 RETURNING id, run_id"
            ))
            .bind(Json(&jobs))
            .bind(now)
            .bind(handed.map_or(0, |h| h.lease_ms))
            .fetch_all(&mut **tx)
            .await?;
            let Some(handed) = handed else {
                return Ok((written, Vec::new()));
            };
            let ids: std::collections::HashMap<String, i64> = ids
                .iter()
                .map(|r| (r.get::<String, _>("run_id"), r.get::<i64, _>("id")))
                .collect();
            let claimed = runs
                .iter()
                .filter(|(_, _, run)| is_handed(run))
                .filter_map(|(tenant_id, _, run)| {
                    Some(ClaimedJob {
                        id: JobId(*ids.get(run.id.as_str())?),
                        tenant_id: tenant_id.clone(),
                        run_id: run.id.clone(),
                        path: run.first_path.clone()?,
                        attempt: 1,
                        claim_token: handed.token.to_string(),
                        automation_id: run.automation_id.clone(),
                        version: run.version,
                        context: run.context.clone(),
                        actions: run.actions,
                        depth: run.depth,
                        subject_ticket_id: run.subject_ticket_id.clone(),
                        resume: None,
                    })
                })
                .collect();
            Ok((written, claimed))
        }

        /// The fence of a batch of claims and their runs' statuses in one
        /// statement (the rows locked on PostgreSQL): the jobs whose claim
        /// token still holds, with their run's status. A job missing from
        /// the answer has lost its lease.
        async fn fenced_statuses<'j>(
            tx: &mut sqlx::Transaction<'_, $db>,
            jobs: impl Iterator<Item = &'j ClaimedJob>,
        ) -> Result<std::collections::HashMap<i64, String>> {
            let jobs: Vec<&ClaimedJob> = jobs.collect();
            let rows: Vec<$crate::common::FenceRow> = jobs
                .iter()
                .map(|job| $crate::common::FenceRow {
                    id: job.id.0,
                    tenant_id: &job.tenant_id,
                    token: &job.claim_token,
                })
                .collect();
            // `r.actions`, not in the index `runs_tenant_status`, keeps
            // SQLite's planner from reading the tenant's runs through that
            // covering index instead of seeking `(tenant_id, id)`; on
            // PostgreSQL the run is found by its key alone (a plan that
            // seeks by tenant reads all of the tenant's runs).
            Ok(sqlx::query(concat!(
                "SELECT j.id, r.status, r.actions FROM ", $rows1, "
                 JOIN jobs j ON j.id = CAST(x.value ->> 0 AS BIGINT)
                    AND j.tenant_id = x.value ->> 1
                    AND j.claim_token = x.value ->> 2
                 JOIN runs r ON r.tenant_id ", $by_key_tenant, " = j.tenant_id AND r.id = j.run_id
                 WHERE j.id ", $in2, "
                 ORDER BY j.id ",
                $lock_jobs_runs
            ))
            .bind(Json(&rows))
            .bind($list(jobs.iter().map(|job| job.id.0)))
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|r| (r.get::<i64, _>("id"), r.get::<String, _>("status")))
            .collect())
        }

        /// The end of record transactions: each job moves on (or goes), the
        /// step rows and the runs' new states are written, a statement each
        /// for the whole batch. The jobs were fenced by the caller, and
        /// `current` is each run's status read under that fence: a run
        /// paused meanwhile stays paused, its job held back.
        /// Returns, per record, whether the job stays leased for a `Continue`.
        async fn write_records(
            tx: &mut sqlx::Transaction<'_, $db>,
            items: &[(ClaimedJob, Record, String)],
        ) -> Result<Vec<bool>> {
            if items.is_empty() {
                return Ok(Vec::new());
            }
            let now = now_ms();
            let mut parked = settle_waits(tx, &items).await?;
            let mut continued = Vec::with_capacity(items.len());
            let mut moves = Vec::new();
            let mut moved_ids = Vec::new();
            let mut done = Vec::new();
            let mut steps = Vec::new();
            let mut runs = Vec::with_capacity(items.len());
            let mut staying = Vec::with_capacity(items.len());
            for (job, record, current) in items {
                let paused = current == "paused" && !record.status.is_final();
                let status = if paused { RunStatus::Paused } else { record.status };
                let queue_key = record.subject_ticket_id.as_ref().map(|t| format!("ticket:{t}"));
                // A paused run's job is released and held back, never kept.
                let next = match &record.next {
                    NextJob::Continue { path, .. } if paused => {
                        NextJob::Step { path: path.clone(), delay_ms: 0 }
                    }
                    next => next.clone(),
                };
                continued.push(matches!(next, NextJob::Continue { .. }));
                // Continue keeps the lease under a new token (and leaves
                // `run_after`, an indexed column, alone, so PostgreSQL can
                // update the row in place); Step and Retry release it.
                // A wait parks the job (released, due at its timeout) or
                // resumes it at once with a buffered signal: `settle_waits`
                // decided which.
                let parked = match next {
                    NextJob::Wait { .. } => parked.remove(&job.id.0),
                    _ => None,
                };
                let (run_at, resume) = match parked {
                    Some($crate::common::Parked { run_at, resume }) => (run_at, Some(resume)),
                    None => (None, None),
                };
                let (path, delay_ms, attempts, token, lease_ms) = match next {
                    NextJob::Continue { path, token, lease_ms } => (path, 0, 1, Some(token), lease_ms),
                    NextJob::Step { path, delay_ms } => (path, delay_ms, 0, None, 0),
                    NextJob::Retry { path, attempts, delay_ms } => (path, delay_ms, attempts, None, 0),
                    NextJob::Wait { path, .. } => (path, 0, 0, None, 0),
                    NextJob::Done => {
                        done.push(job.id.0);
                        (String::new(), 0, 0, None, 0)
                    }
                };
                if !matches!(record.next, NextJob::Done) {
                    moved_ids.push(job.id.0);
                    moves.push($crate::common::JobMove {
                        id: job.id.0,
                        tenant_id: &job.tenant_id,
                        path,
                        delay_ms,
                        attempts,
                        token,
                        lease_ms,
                        held: paused,
                        queue_key,
                        run_at,
                        resume,
                    });
                }
                for step in &record.steps {
                    steps.push($crate::common::StepRow {
                        run_id: &job.run_id,
                        tenant_id: &job.tenant_id,
                        step,
                    });
                }
                // A run whose status and ticket stay is updated without
                // naming them where the backend asks for it: SQLite rewrites
                // the entries of every index on a column the `SET` list
                // names, changed or not. (PostgreSQL compares the values, and
                // one statement is one round trip less.)
                let stays = $staying_apart
                    && status.as_str() == current.as_str()
                    && (record.subject_ticket_id.is_none()
                        || record.subject_ticket_id == job.subject_ticket_id);
                let runs = if stays { &mut staying } else { &mut runs };
                runs.push($crate::common::RunUpdate {
                    id: &job.run_id,
                    tenant_id: &job.tenant_id,
                    context: &record.context,
                    actions: record.actions,
                    status: status.as_str(),
                    error: record.error.as_deref(),
                    finished_at: status.is_final().then_some(now),
                    subject_ticket_id: record.subject_ticket_id.as_deref(),
                });
            }
            // Rows are matched one by one on (id, tenant) from the batch's own
            // rows. On PostgreSQL the updates also name their rows' keys (the
            // `key_hint` fragments), so it seeks them by primary key whatever
            // its statistics say: a table that grew fast still looks small to
            // it, and a hash join would read all of it. SQLite plans these
            // joins from the batch's rows by itself; a key list would turn
            // its plan around (the batch scanned once per row).
            let mut moved = 0;
            if !moves.is_empty() {
                moved += sqlx::query(concat!(
                    "UPDATE jobs SET path = x.value ->> 2,
                        run_after = CASE WHEN x.value ->> 9 IS NOT NULL THEN CAST(x.value ->> 9 AS BIGINT)
                            WHEN x.value ->> 5 IS NULL
                            THEN ", $now, " + CAST(x.value ->> 3 AS BIGINT)
                            ELSE jobs.run_after END,
                        resume = NULLIF(x.value -> 10, 'null'),
                        attempts = CAST(x.value ->> 4 AS INTEGER),
                        claim_token = x.value ->> 5,
                        locked_by = CASE WHEN x.value ->> 5 IS NULL THEN NULL ELSE jobs.locked_by END,
                        locked_until = CASE WHEN x.value ->> 5 IS NULL THEN NULL
                            ELSE ", $now, " + CAST(x.value ->> 6 AS BIGINT) END,
                        held = CAST(x.value ->> 7 AS BOOLEAN),
                        queue_key = COALESCE(x.value ->> 8, jobs.queue_key)
                     FROM ", $rows1, "
                     WHERE jobs.id = CAST(x.value ->> 0 AS BIGINT)
                       AND jobs.tenant_id = x.value ->> 1 ", $key_hint_jobs2
                ))
                .bind(Json(&moves))
                .bind($list(moved_ids.iter().copied()))
                .execute(&mut **tx)
                .await?
                .rows_affected();
            }
            if !done.is_empty() {
                moved += sqlx::query(concat!(
                    "DELETE FROM jobs WHERE tenant_id ", $by_key_in1, " AND id ", $in2
                ))
                .bind($list(items.iter().map(|(job, _, _)| job.tenant_id.as_str())))
                .bind($list(done.iter().copied()))
                .execute(&mut **tx)
                .await?
                .rows_affected();
            }
            if moved != items.len() as u64 {
                // The caller's fence said every job was held: a job that
                // changed under it is a broken invariant, and nothing is kept.
                return Err(StoreError::Conflict(format!(
                    "{} of {} fenced jobs could be moved on",
                    moved,
                    items.len()
                )));
            }
            insert_steps(tx, &steps, now).await?;
            if !staying.is_empty() {
                sqlx::query(concat!(
                    "UPDATE runs SET context = x.value -> 2,
                        actions = CAST(x.value ->> 3 AS INTEGER),
                        error = x.value ->> 5
                     FROM ", $rows1, "
                     WHERE runs.id = x.value ->> 0 AND runs.tenant_id = x.value ->> 1 ",
                       $key_hint_runs2
                ))
                .bind(Json(&staying))
                .bind($list(staying.iter().map(|run| run.id.as_str())))
                .execute(&mut **tx)
                .await?;
            }
            if !runs.is_empty() {
                sqlx::query(concat!(
                    "UPDATE runs SET context = x.value -> 2,
                        actions = CAST(x.value ->> 3 AS INTEGER),
                        status = x.value ->> 4,
                        error = x.value ->> 5,
                        finished_at = COALESCE(CAST(x.value ->> 6 AS BIGINT), runs.finished_at),
                        subject_ticket_id = COALESCE(x.value ->> 7, runs.subject_ticket_id)
                     FROM ", $rows1, "
                     WHERE runs.id = x.value ->> 0 AND runs.tenant_id = x.value ->> 1 ",
                       $key_hint_runs2
                ))
                .bind(Json(&runs))
                .bind($list(runs.iter().map(|run| run.id.as_str())))
                .execute(&mut **tx)
                .await?;
            }
            Ok(continued)
        }

        fn step_from_row(r: &<$db as sqlx::Database>::Row) -> StepRow {
            StepRow {
                path: r.get("path"),
                step_id: r.get("step_id"),
                kind: r.get("type"),
                attempt: r.get("attempt"),
                status: r.get("status"),
                input: r.get::<Option<Json<Value>>, _>("input").map(|j| j.0),
                output: r.get::<Option<Json<Value>>, _>("output").map(|j| j.0),
                error: r.get("error"),
                log: r.get::<Json<Value>, _>("log").0,
                started_at: r.get("started_at"),
                finished_at: r.get("finished_at"),
            }
        }

        async fn steps_of<'c, E>(ex: E, tenant: &TenantId, run: &RunId) -> Result<Vec<StepRow>>
        where
            E: sqlx::Executor<'c, Database = $db>,
        {
            let rows = sqlx::query(
                "SELECT path, step_id, type, attempt, status, input, output, error, log,
                    started_at, finished_at
                 FROM run_steps WHERE tenant_id = $1 AND run_id = $2 ORDER BY id",
            )
            .bind(tenant.as_str())
            .bind(run.as_str())
            .fetch_all(ex)
            .await?;
            Ok(rows.iter().map(step_from_row).collect())
        }

        #[async_trait::async_trait]
        impl AdminStore for $store {
            async fn create_tenant(&self, name: &str, key_hash: &str) -> Result<Tenant> {
                let tenant = Tenant {
                    id: TenantId::from(new_id("ten")),
                    name: name.to_owned(),
                    created_at: now_ms(),
                };
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::query(
                    "INSERT INTO tenants (id, name, settings, created_at) VALUES ($1, $2, $3, $4)",
                )
                .bind(tenant.id.as_str())
                .bind(name)
                .bind(Json(serde_json::json!({})))
                .bind(tenant.created_at)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO api_keys (id, tenant_id, hash, created_at) VALUES ($1, $2, $3, $4)",
                )
                .bind(new_id("key"))
                .bind(tenant.id.as_str())
                .bind(key_hash)
                .bind(tenant.created_at)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(tenant)
            }

            async fn tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
                let row = sqlx::query("SELECT id, name, created_at FROM tenants WHERE id = $1")
                    .bind(id.as_str())
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.as_ref().map(tenant_from_row))
            }

            async fn tenant_ids(&self) -> Result<Vec<TenantId>> {
                let rows = sqlx::query("SELECT id FROM tenants ORDER BY id")
                    .fetch_all(self.reader())
                    .await?;
                Ok(rows.iter().map(|r| TenantId::from(r.get::<String, _>("id"))).collect())
            }

            async fn has_admin_key(&self) -> Result<bool> {
                let row = sqlx::query("SELECT 1 AS one FROM api_keys WHERE tenant_id IS NULL LIMIT 1")
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.is_some())
            }

            async fn add_admin_key(&self, key_hash: &str) -> Result<()> {
                sqlx::query(
                    "INSERT INTO api_keys (id, tenant_id, hash, created_at) VALUES ($1, NULL, $2, $3)
                     ON CONFLICT (hash) DO NOTHING",
                )
                .bind(new_id("key"))
                .bind(key_hash)
                .bind(now_ms())
                .execute(&*self.writer().await)
                .await?;
                Ok(())
            }

            async fn key_owner(&self, key_hash: &str) -> Result<Option<KeyOwner>> {
                let row = sqlx::query("SELECT tenant_id FROM api_keys WHERE hash = $1")
                    .bind(key_hash)
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.map(|r| match r.get::<Option<String>, _>("tenant_id") {
                    Some(t) => KeyOwner::Tenant(TenantId::from(t)),
                    None => KeyOwner::Platform,
                }))
            }
        }

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
                    created_at: now_ms(),
                };
                sqlx::query(
                    "INSERT INTO sources (id, tenant_id, name, token, params, critical, rate_limit,
                        secret, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(source.id.as_str())
                .bind(tenant.as_str())
                .bind(&source.name)
                .bind(&source.token)
                .bind(Json(&source.params))
                .bind(source.critical)
                .bind(source.rate_limit)
                .bind(source.secret.as_deref())
                .bind(source.created_at)
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
                Ok(row.as_ref().map(source_from_row))
            }

            async fn sources(&self, tenant: &TenantId) -> Result<Vec<Source>> {
                let rows = sqlx::query("SELECT * FROM sources WHERE tenant_id = $1 ORDER BY id")
                    .bind(tenant.as_str())
                    .fetch_all(self.reader())
                    .await?;
                Ok(rows.iter().map(source_from_row).collect())
            }

            async fn source_by_token(&self, token: &str) -> Result<Option<Source>> {
                let row = sqlx::query("SELECT * FROM sources WHERE token = $1")
                    .bind(token)
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.as_ref().map(source_from_row))
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
                     WHERE tenant_id = $1 AND id = $2",
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

            async fn automation_version(
                &self,
                tenant: &TenantId,
                id: &AutomationId,
                version: i32,
            ) -> Result<Option<Value>> {
                let row = sqlx::query(
                    "SELECT definition FROM automation_versions
                     WHERE tenant_id = $1 AND automation_id = $2 AND version = $3",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(version)
                .fetch_optional(self.reader())
                .await?;
                Ok(row.map(|r| r.get::<Json<Value>, _>("definition").0))
            }
        }

        #[async_trait::async_trait]
        impl InboxStore for $store {
            async fn accept_event(
                &self,
                tenant: &TenantId,
                event: NewEvent,
            ) -> Result<(EventId, Accepted)> {
                self.events.submit((tenant.clone(), event)).await
            }

            async fn dispatch_handing_off(
                &self,
                tenants: &[TenantId],
                limit: u32,
                planner: Planner<'_>,
                mut handoff: Option<Handoff<'_>>,
                lane: Lane,
            ) -> Result<Dispatched> {
                if tenants.is_empty() {
                    return Ok(Dispatched::default());
                }
                let writer = self.writer_in(lane).await;
                let mut tx = writer.begin().await?;
                if !$plan_prelude.is_empty() {
                    sqlx::Executor::execute(&mut *tx, $plan_prelude).await?;
                }
                // Fair between tenants like the claim: each tenant's oldest
                // events first, round robin (any tenant may fill the batch
                // when the others have nothing), so a tenant with a backlog
                // of thousands does not hold back another tenant's event.
                let per_tenant = i64::from(limit);
                let rows = sqlx::query($dispatch_select)
                    .bind($list(tenants.iter().map(|t| t.as_str())))
                    .bind(i64::from(limit))
                    .bind(per_tenant)
                    .fetch_all(&mut *tx)
                    .await?;
                // Others first: when one tenant has `DISPATCH_CROWDING` or
                // more of the batch's events and other tenants have some too,
                // this dispatch takes only the others' (a short transaction,
                // so their runs do not wait behind the crowd's); the next one
                // takes its batch in order, so the crowding tenant waits for
                // at most one. (Rolled back, it leaves the flag set: the next
                // dispatch then goes in order, which is always safe.)
                let selected = rows.len();
                let went_first = self.others_went_first.load(std::sync::atomic::Ordering::Relaxed);
                let owners: Vec<String> = rows.iter().map(|row| row.get("tenant_id")).collect();
                // A full batch mostly of one tenant's events: it has more waiting.
                let backlog = match selected as u64 == u64::from(limit) {
                    true => $crate::batch::filling(&owners).map(|t| TenantId::from(t.clone())),
                    false => None,
                };
                let rows = match $crate::batch::crowding(&owners, $crate::common::DISPATCH_CROWDING) {
                    Some(crowd) if !went_first => rows
                        .into_iter()
                        .zip(&owners)
                        .filter(|(_, owner)| *owner != crowd)
                        .map(|(row, _)| row)
                        .collect(),
                    _ => rows,
                };
                if lane == Lane::Bulk {
                    // An urgent dispatch takes other tenants' events out of
                    // turn; the alternation is the bulk dispatches'.
                    self.others_went_first
                        .store(rows.len() < selected, std::sync::atomic::Ordering::Relaxed);
                }
                let now = now_ms();
                // Events of one batch mostly share their automations: each
                // trigger is looked up once per batch.
                let mut matching: std::collections::HashMap<(String, Option<String>, Option<String>, String), Vec<Candidate>> =
                    std::collections::HashMap::new();
                // Runs planned earlier in this batch count for the loop
                // protection like runs already written.
                let mut planned_on_ticket: std::collections::HashMap<(String, String, String), i64> =
                    std::collections::HashMap::new();
                let mut runs = Vec::new();
                let mut dispatched = Vec::with_capacity(rows.len());
                let mut received_at = Vec::with_capacity(rows.len());
                for row in &rows {
                    received_at.push(row.get::<i64, _>("received_at"));
                    // Webhooks are found by source, internal events by type.
                    let tenant: String = row.get("tenant_id");
                    let target: Option<String> = row.get("target_automation_id");
                    let source_kind: String = row.get("source_kind");
                    let key = row
                        .get::<Option<String>, _>("event_type")
                        .or_else(|| row.get::<Option<String>, _>("source_id"));
                    let lookup = (tenant, target, key, source_kind);
                    if !matching.contains_key(&lookup) {
                        let (tenant, target, key, source_kind) = &lookup;
                        let found = match target {
                            Some(target) => {
                                let sql = format!(
                                    "{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND a.id = $2
                                       AND a.status = 'active'"
                                );
                                sqlx::query(&sql)
                                    .bind(tenant)
                                    .bind(target)
                                    .fetch_all(&mut *tx)
                                    .await?
                            }
                            None => {
                                let sql = format!(
                                    "{AUTOMATION_SELECT} WHERE a.tenant_id = $1 AND a.trigger_kind = $2
                                       AND a.trigger_key = $3 AND a.status = 'active'
                                     ORDER BY a.id"
                                );
                                sqlx::query(&sql)
                                    .bind(tenant)
                                    .bind(source_kind)
                                    .bind(key.as_deref())
                                    .fetch_all(&mut *tx)
                                    .await?
                            }
                        };
                        let found = found
                            .iter()
                            .map(|r| Candidate {
                                automation_id: AutomationId::from(r.get::<String, _>("id")),
                                name: r.get("name"),
                                version: r.get("current_version"),
                                definition: r.get::<Json<Value>, _>("definition").0,
                                recent_runs_on_ticket: 0,
                            })
                            .collect();
                        matching.insert(lookup.clone(), found);
                    }
                    let cached = &matching[&lookup];
                    let id: String = row.get("id");
                    if cached.is_empty() {
                        // No automation listens: nothing to plan, and the
                        // payload is never read.
                        dispatched.push(id);
                        continue;
                    }
                    let event = event_from_row(row);
                    let plan = match &event.subject_ticket_id {
                        None => planner(&event, cached),
                        Some(ticket) => {
                            let mut found = cached.clone();
                            for candidate in &mut found {
                                let written = recent_runs(
                                    &mut tx,
                                    &event.tenant_id,
                                    &candidate.automation_id,
                                    ticket,
                                    now,
                                )
                                .await?;
                                let planned = planned_on_ticket
                                    .get(&(
                                        event.tenant_id.to_string(),
                                        candidate.automation_id.to_string(),
                                        ticket.clone(),
                                    ))
                                    .copied()
                                    .unwrap_or(0);
                                candidate.recent_runs_on_ticket = written + planned;
                            }
                            let plan = planner(&event, &found);
                            for run in &plan.runs {
                                *planned_on_ticket
                                    .entry((
                                        event.tenant_id.to_string(),
                                        run.automation_id.to_string(),
                                        ticket.clone(),
                                    ))
                                    .or_default() += 1;
                            }
                            plan
                        }
                    };
                    for note in &plan.notes {
                        let cause = $crate::desk::Cause {
                            automation_id: Some(note.automation_id.clone()),
                            ..Default::default()
                        };
                        trace_in(&mut tx, &event.tenant_id, &note.ticket_id, &note.kind, &note.message, &cause)
                            .await?;
                    }
                    for run in plan.runs {
                        runs.push((event.tenant_id.clone(), event.id.clone(), run));
                    }
                    dispatched.push(id);
                }
                // The runs the dispatching node starts itself: their first
                // step is due now, and no queue key orders them behind
                // another run's job.
                let token = random_token();
                let mut taken = std::collections::HashSet::new();
                if let Some(handoff) = handoff.as_mut() {
                    for (tenant, _, run) in &runs {
                        if run.first_path.is_some() && run.queue_key.is_none() && (handoff.take)(tenant) {
                            taken.insert(run.id.as_str());
                        }
                    }
                }
                let handed = handoff.as_ref().map(|h| $crate::common::HandedOff {
                    node: h.node,
                    lease_ms: h.lease_ms,
                    token: &token,
                    runs: &taken,
                });
                let (written, claimed) = insert_runs(&mut tx, &runs, handed.as_ref()).await?;
                if written.len() > claimed.len() && !$notify_work.is_empty() {
                    // Workers in other processes hear of the new jobs at commit.
                    sqlx::query($notify_work).execute(&mut *tx).await?;
                }
                sqlx::query(concat!(
                    "UPDATE event_inbox SET status = 'dispatched', dispatched_at = $3
                     WHERE tenant_id ", $by_key_in1, " AND id ", $in2
                ))
                .bind($list(tenants.iter().map(|t| t.as_str())))
                .bind($list(dispatched.iter().map(|e| e.as_str())))
                .bind(now)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(Dispatched {
                    left: selected - rows.len(),
                    received_at,
                    claimed,
                    backlog,
                })
            }

            async fn start_run(
                &self,
                tenant: &TenantId,
                event: NewEvent,
                run: NewRun,
            ) -> Result<RunId> {
                // The run's context holds the event's payload.
                $crate::storable::check_event(&event)?;
                if let Some(key) = &run.idempotency_key {
                    if let Some(existing) = run_by_key(self.reader(), tenant, &run.automation_id, key).await? {
                        return Ok(existing);
                    }
                }
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let event_id = insert_event(&mut tx, tenant, &event, "dispatched")
                    .await?
                    .ok_or_else(|| StoreError::Conflict("event idempotency key taken".into()))?;
                match insert_runs(&mut tx, &[(tenant.clone(), event_id, run.clone())], None).await {
                    Ok(_) => {
                        if !$notify_work.is_empty() {
                            sqlx::query($notify_work).execute(&mut *tx).await?;
                        }
                        tx.commit().await?;
                        Ok(run.id.clone())
                    }
                    Err(StoreError::Database(sqlx::Error::Database(e)))
                        if e.is_unique_violation() && run.idempotency_key.is_some() =>
                    {
                        drop(tx);
                        let key = run.idempotency_key.clone().unwrap_or_default();
                        run_by_key(self.reader(), tenant, &run.automation_id, &key)
                            .await?
                            .ok_or(StoreError::NotFound("run"))
                    }
                    Err(e) => Err(e),
                }
            }
        }

        #[async_trait::async_trait]
        impl RunStore for $store {
            async fn cancel_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let status = run_status(&mut tx, tenant, id).await?;
                if status.is_final() {
                    return Err(StoreError::Conflict(format!(
                        "the run is already {}; only an unfinished run can be cancelled",
                        status.as_str()
                    )));
                }
                for sql in [
                    "DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2",
                    "DELETE FROM waits WHERE tenant_id = $1 AND run_id = $2",
                ] {
                    for_run(&mut tx, sql, tenant, id).await?;
                }
                sqlx::query(
                    "UPDATE runs SET status = 'cancelled', finished_at = $3
                     WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
                let run = summary_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn pause_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let status = run_status(&mut tx, tenant, id).await?;
                if !matches!(status, RunStatus::Queued | RunStatus::Running | RunStatus::Waiting) {
                    return Err(StoreError::Conflict(format!(
                        "the run is {}; only a queued, running or waiting run can be paused",
                        status.as_str()
                    )));
                }
                for_run(&mut tx, "UPDATE jobs SET held = TRUE WHERE tenant_id = $1 AND run_id = $2", tenant, id).await?;
                for_run(&mut tx, "UPDATE runs SET status = 'paused' WHERE tenant_id = $1 AND id = $2", tenant, id).await?;
                let run = summary_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn resume_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let status = run_status(&mut tx, tenant, id).await?;
                if status != RunStatus::Paused {
                    return Err(StoreError::Conflict(format!(
                        "the run is {}; only a paused run can be resumed",
                        status.as_str()
                    )));
                }
                for_run(&mut tx, "UPDATE jobs SET held = FALSE WHERE tenant_id = $1 AND run_id = $2", tenant, id).await?;
                for_run(&mut tx, concat!(
                    "UPDATE runs SET status = CASE WHEN EXISTS (
                            SELECT 1 FROM jobs WHERE tenant_id = $1 AND run_id = $2
                              AND run_after > ", $now, ") THEN 'waiting' ELSE 'queued' END
                     WHERE tenant_id = $1 AND id = $2"
                ), tenant, id).await?;
                let run = summary_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn retry_run(&self, tenant: &TenantId, id: &RunId) -> Result<RunSummary> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let status = run_status(&mut tx, tenant, id).await?;
                if status != RunStatus::Failed {
                    return Err(StoreError::Conflict(format!(
                        "the run is {}; only a failed run can be retried",
                        status.as_str()
                    )));
                }
                let failed = sqlx::query(
                    "SELECT path FROM run_steps
                     WHERE tenant_id = $1 AND run_id = $2 AND status = 'failed'
                     ORDER BY id DESC LIMIT 1",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| {
                    StoreError::Conflict(
                        "the run failed before any step ran; start a new run instead".into(),
                    )
                })?;
                let path: String = failed.get("path");
                let run = summary_in(&mut tx, tenant, id).await?;
                sqlx::query(concat!(
                    "INSERT INTO jobs (run_id, tenant_id, path, run_after, attempts, queue_key,
                        priority, created_at)
                     VALUES ($1, $2, $3, ", $now, ", 0, $4, 0, $5)"
                ))
                .bind(id.as_str())
                .bind(tenant.as_str())
                .bind(&path)
                .bind(run.subject_ticket_id.as_ref().map(|t| format!("ticket:{t}")))
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE runs SET status = 'queued', error = NULL, finished_at = NULL
                     WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .execute(&mut *tx)
                .await?;
                let run = summary_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn runs(
                &self,
                tenant: &TenantId,
                filter: &RunFilter,
                limit: u32,
                cursor: Option<&str>,
            ) -> Result<Page<RunSummary>> {
                let sql = format!(
                    "SELECT {RUN_COLUMNS} FROM runs
                     WHERE tenant_id = $1
                       AND (CAST($2 AS TEXT) IS NULL OR status = $2)
                       AND (CAST($3 AS TEXT) IS NULL OR automation_id = $3)
                       AND (CAST($4 AS TEXT) IS NULL OR trigger_type = $4)
                       AND (CAST($5 AS TEXT) IS NULL OR id < $5)
                     ORDER BY id DESC
                     LIMIT $6"
                );
                let rows = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(filter.status.as_deref())
                    .bind(filter.automation_id.as_deref())
                    .bind(filter.trigger_type.as_deref())
                    .bind(cursor)
                    .bind(i64::from(limit) + 1)
                    .fetch_all(self.reader())
                    .await?;
                let mut items: Vec<RunSummary> = rows.iter().map(run_from_row).collect();
                let next_cursor = if items.len() > limit as usize {
                    items.truncate(limit as usize);
                    items.last().map(|r| r.id.to_string())
                } else {
                    None
                };
                Ok(Page { items, next_cursor })
            }

            async fn run(&self, tenant: &TenantId, id: &RunId) -> Result<Option<RunDetail>> {
                let sql = format!(
                    "SELECT {RUN_COLUMNS}, context FROM runs WHERE tenant_id = $1 AND id = $2"
                );
                let Some(row) = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(id.as_str())
                    .fetch_optional(self.reader())
                    .await?
                else {
                    return Ok(None);
                };
                let steps = steps_of(self.reader(), tenant, id).await?;
                let waits = waits_of(self.reader(), tenant, id).await?;
                Ok(Some(RunDetail {
                    run: run_from_row(&row),
                    context: row.get::<Json<Value>, _>("context").0,
                    steps,
                    waits,
                }))
            }
        }

        async fn run_status(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<RunStatus> {
            let row = sqlx::query(concat!(
                "SELECT status FROM runs WHERE tenant_id = $1 AND id = $2 ", $lock_row
            ))
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&mut **tx)
            .await?
            .ok_or(StoreError::NotFound("run"))?;
            let status: &str = row.get("status");
            RunStatus::parse(status)
                .ok_or_else(|| StoreError::Conflict(format!("the run has an unknown status `{status}`")))
        }

        /// Runs a statement whose `$1` is the tenant and `$2` the run.
        async fn for_run(
            tx: &mut sqlx::Transaction<'_, $db>,
            sql: &str,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<()> {
            sqlx::query(sql).bind(tenant.as_str()).bind(id.as_str()).execute(&mut **tx).await?;
            Ok(())
        }

        async fn summary_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &RunId,
        ) -> Result<RunSummary> {
            let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE tenant_id = $1 AND id = $2");
            let row = sqlx::query(&sql)
                .bind(tenant.as_str())
                .bind(id.as_str())
                .fetch_one(&mut **tx)
                .await?;
            Ok(run_from_row(&row))
        }

        #[async_trait::async_trait]
        impl QueueStore for $store {
            async fn claim(
                &self,
                tenants: &[TenantId],
                node: &str,
                limit: u32,
                lease_ms: i64,
            ) -> Result<Vec<ClaimedJob>> {
                if tenants.is_empty() || limit == 0 {
                    return Ok(Vec::new());
                }
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                sqlx::Executor::execute(&mut *tx, $claim_prelude).await?;
                // Candidates come fairly ordered (each tenant's first job,
                // then each tenant's second, …), over-fetched so that jobs
                // sharing a queue key can be dropped here.
                let candidates = sqlx::query($claim_candidates)
                    .bind($list(tenants.iter().map(|t| t.as_str())))
                    .bind(i64::from(limit))
                    .bind(i64::from(limit) * 2)
                    .fetch_all(&mut *tx)
                    .await?;
                let mut keys = std::collections::HashSet::new();
                let mut ids = Vec::with_capacity(limit as usize);
                for row in &candidates {
                    if ids.len() == limit as usize {
                        break;
                    }
                    let key: Option<String> = row.get("queue_key");
                    let tenant: String = row.get("tenant_id");
                    if let Some(key) = key {
                        if !keys.insert((tenant, key)) {
                            continue;
                        }
                    }
                    ids.push(row.get::<i64, _>("id"));
                }
                if ids.is_empty() {
                    tx.commit().await?;
                    return Ok(Vec::new());
                }
                let token = random_token();
                let jobs = sqlx::query(concat!(
                    "UPDATE jobs SET locked_by = $1, locked_until = ", $now, " + $2,
                        claim_token = $3, attempts = attempts + 1
                     WHERE id ", $in4, "
                       AND (locked_until IS NULL OR locked_until < ", $now, ")
                     RETURNING id, tenant_id, run_id, path, attempts, resume"
                ))
                .bind(node)
                .bind(lease_ms)
                .bind(&token)
                .bind($list(ids.iter().copied()))
                .fetch_all(&mut *tx)
                .await?;
                let run_ids: Vec<String> = jobs.iter().map(|j| j.get::<String, _>("run_id")).collect();
                sqlx::query(concat!(
                    "UPDATE runs SET status = 'running', started_at = COALESCE(started_at, $2)
                     WHERE tenant_id ", $by_key_in1, " AND id ", $in4, " AND status IN ('queued', 'waiting')"
                ))
                .bind($list(tenants.iter().map(|t| t.as_str())))
                .bind(now_ms())
                .bind(0_i64)
                .bind($list(run_ids.iter().map(|r| r.as_str())))
                .execute(&mut *tx)
                .await?;
                let runs = sqlx::query(concat!(
                    "SELECT id, automation_id, version, context, actions, depth, subject_ticket_id
                     FROM runs
                     WHERE tenant_id ", $by_key_in1, " AND id ", $in2
                ))
                .bind($list(tenants.iter().map(|t| t.as_str())))
                .bind($list(run_ids.iter().map(|r| r.as_str())))
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                let mut runs: std::collections::HashMap<String, _> = runs
                    .into_iter()
                    .map(|r| (r.get::<String, _>("id"), r))
                    .collect();
                Ok(jobs
                    .iter()
                    .filter_map(|job| {
                        let run_id: String = job.get("run_id");
                        let run = runs.remove(&run_id)?;
                        Some(ClaimedJob {
                            id: JobId(job.get("id")),
                            tenant_id: TenantId::from(job.get::<String, _>("tenant_id")),
                            run_id: RunId::from(run_id),
                            path: job.get("path"),
                            attempt: job.get("attempts"),
                            claim_token: token.clone(),
                            automation_id: AutomationId::from(run.get::<String, _>("automation_id")),
                            version: run.get("version"),
                            context: run.get::<Json<Value>, _>("context").0,
                            actions: run.get("actions"),
                            depth: run.get("depth"),
                            subject_ticket_id: run.get("subject_ticket_id"),
                            resume: resume_from_row(job),
                        })
                    })
                    .collect())
            }

            async fn heartbeat(&self, node: &str, jobs: &[JobId], lease_ms: i64) -> Result<u64> {
                if jobs.is_empty() {
                    return Ok(0);
                }
                // Rows are locked in id order, like a record batch's fence,
                // and a row a record holds right now is skipped (that record
                // moves the lease on itself): the heartbeat never deadlocks
                // with a record. Both updates go in one turn at the writer.
                let writer = self.writer().await;
                let done = sqlx::query(concat!(
                    "UPDATE jobs SET locked_until = ", $now, " + $3
                     WHERE id IN (SELECT id FROM jobs
                                  WHERE id ", $in2, " AND locked_by = $1
                                  ORDER BY id ", $skip_locked, ")"
                ))
                .bind(node)
                .bind($list(jobs.iter().map(|j| j.0)))
                .bind(lease_ms)
                .execute(&*writer)
                .await?;
                // Connection slots held by these jobs live as long as their leases.
                sqlx::query(concat!(
                    "UPDATE connection_slots SET expires_at = ", $now, " + $2
                     WHERE job_id ", $in1
                ))
                .bind($list(jobs.iter().map(|j| j.0)))
                .bind(lease_ms)
                .execute(&*writer)
                .await?;
                Ok(done.rows_affected())
            }

            async fn record(&self, job: &ClaimedJob, record: Record) -> Result<()> {
                self.records.submit((job.clone(), record)).await.map(|_| ())
            }

            async fn record_and_continue(&self, job: &ClaimedJob, record: Record) -> Result<bool> {
                self.records.submit((job.clone(), record)).await
            }

            async fn release_claims(&self, node: &str) -> Result<u64> {
                let done = sqlx::query(concat!(
                    "UPDATE jobs SET locked_by = NULL, locked_until = NULL, claim_token = NULL
                     WHERE ", $release_where
                ))
                .bind(node)
                .execute(&*self.writer().await)
                .await?;
                Ok(done.rows_affected())
            }

            async fn queue_stats(&self, tenants: &[TenantId]) -> Result<QueueStats> {
                if tenants.is_empty() {
                    return Ok(QueueStats::default());
                }
                let row = sqlx::query(concat!(
                    "SELECT
                        COALESCE(SUM(CASE WHEN run_after <= n AND (locked_until IS NULL OR locked_until < n) THEN 1 ELSE 0 END), 0) AS ready,
                        COALESCE(SUM(CASE WHEN run_after > n AND (locked_until IS NULL OR locked_until < n) THEN 1 ELSE 0 END), 0) AS scheduled,
                        COALESCE(SUM(CASE WHEN locked_until >= n THEN 1 ELSE 0 END), 0) AS running,
                        MIN(CASE WHEN run_after <= n AND (locked_until IS NULL OR locked_until < n) THEN n - run_after END) AS oldest
                     FROM jobs, (SELECT ", $now, " AS n) clock
                     WHERE tenant_id ", $in1
                ))
                .bind($list(tenants.iter().map(|t| t.as_str())))
                .fetch_one(self.reader())
                .await?;
                let pending = sqlx::query(concat!(
                    "SELECT COUNT(*) AS pending FROM event_inbox
                     WHERE status = 'pending' AND tenant_id ", $in1
                ))
                .bind($list(tenants.iter().map(|t| t.as_str())))
                .fetch_one(self.reader())
                .await?;
                Ok(QueueStats {
                    ready: row.get::<i64, _>("ready"),
                    scheduled: row.get::<i64, _>("scheduled"),
                    running: row.get::<i64, _>("running"),
                    oldest_ready_ms: row.get::<Option<i64>, _>("oldest"),
                    pending_events: pending.get::<i64, _>("pending"),
                })
            }
        }
    };
}

pub(crate) use impl_common;
