//! The event inbox ([`InboxStore`](crate::InboxStore)) for both backends:
//! accepting events one by one and in group commits, and starting a run
//! directly. Its dispatch is in `dispatch_sql.rs` (see `rows.rs` for why a
//! macro per file).

macro_rules! impl_inbox {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// Claims an event's idempotency key for `id` (`event_keys`, see
        /// `InboxStore`): true when the key was free, or last taken outside
        /// the window (its earlier event stays, a new one is written).
        async fn claim_key(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            event: &NewEvent,
            source: &str,
            id: &str,
            now: i64,
        ) -> Result<bool> {
            let claimed = sqlx::query(
                "INSERT INTO event_keys (tenant_id, source_kind, source_id, idempotency_key,
                    event_id, received_at)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (tenant_id, source_kind, source_id, idempotency_key) DO UPDATE SET
                    event_id = excluded.event_id, received_at = excluded.received_at
                 WHERE event_keys.received_at < $7
                 RETURNING event_id",
            )
            .bind(tenant.as_str())
            .bind(&event.source_kind)
            .bind(source)
            .bind(&event.idempotency_key)
            .bind(id)
            .bind(now)
            .bind(now - IDEMPOTENCY_WINDOW_MS)
            .fetch_optional(&mut **tx)
            .await?;
            Ok(claimed.is_some())
        }

        /// Writes an event, unless its source's idempotency key is taken
        /// within the window (`None`). An event of no source (internal)
        /// has no key to deduplicate by.
        async fn insert_event(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            event: &NewEvent,
            status: &str,
        ) -> Result<Option<EventId>> {
            let id = new_id("evt");
            let now = now_ms();
            if let Some(source) = &event.source_id
                && !claim_key(tx, tenant, event, source.as_str(), &id, now).await?
            {
                return Ok(None);
            }
            sqlx::query(
                "INSERT INTO event_inbox (id, tenant_id, source_id, source_kind, idempotency_key,
                    payload, params, received_at, status, dispatched_at, cause_run_id, depth,
                    origin_automation_id, target_automation_id, event_type, subject_ticket_id,
                    traceparent)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
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
            .bind(event.traceparent.as_deref())
            .execute(&mut **tx)
            .await?;
            Ok(Some(EventId::from(id)))
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
            let existing: String = sqlx::query(
                "SELECT event_id FROM event_keys
                 WHERE tenant_id = $1 AND source_kind = $2 AND source_id = $3
                   AND idempotency_key = $4",
            )
            .bind(tenant.as_str())
            .bind(&event.source_kind)
            .bind(event.source_id.as_ref().map(|s| s.as_str()))
            .bind(&event.idempotency_key)
            .fetch_one(&mut **tx)
            .await?
            .get("event_id");
            Ok((EventId::from(existing), Accepted { duplicate: true }))
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
                        Err(StoreError::Invariant("an event of the batch was not answered".into()))
                    }),
                    Err(refused) => Err(refused),
                })
                .collect())
        }

        /// Tries of an inbox batch the database failed to break a deadlock.
        const DEADLOCK_TRIES: u32 = 5;

        /// One try at [`accept_storable`]'s transaction.
        async fn write_batch(
            pool: &sqlx::Pool<$db>,
            items: &[(&TenantId, &NewEvent)],
            ids: &[String],
            rows: &[$crate::rows::EventRow<'_>],
            now: i64,
        ) -> Result<Vec<Result<(EventId, Accepted)>>> {
            let mut tx = pool.begin().await?;
            let claimed: std::collections::HashSet<String> = sqlx::query(concat!(
                "INSERT INTO event_keys (tenant_id, source_kind, source_id, idempotency_key,
                    event_id, received_at)
                 SELECT x.value ->> 'tenant_id', x.value ->> 'source_kind',
                    x.value ->> 'source_id', x.value ->> 'idempotency_key',
                    x.value ->> 'id', $2
                 FROM ", batch_rows!(1), "
                 WHERE x.value ->> 'source_id' IS NOT NULL
                 ORDER BY x.value ->> 'tenant_id', x.value ->> 'source_kind',
                    x.value ->> 'source_id', x.value ->> 'idempotency_key'
                 ON CONFLICT (tenant_id, source_kind, source_id, idempotency_key) DO NOTHING
                 RETURNING event_id"
            ))
            .bind(Json(&rows))
            .bind(now)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.get::<String, _>("event_id"))
            .collect();
            let new: Vec<&str> = items
                .iter()
                .zip(ids)
                .filter(|((_, event), id)| event.source_id.is_none() || claimed.contains(*id))
                .map(|(_, id)| id.as_str())
                .collect();
            sqlx::query(concat!(
                "INSERT INTO event_inbox (id, tenant_id, source_id, source_kind, idempotency_key,
                    payload, params, received_at, status, cause_run_id, depth,
                    origin_automation_id, target_automation_id, event_type, subject_ticket_id,
                    traceparent)
                 SELECT x.value ->> 'id', x.value ->> 'tenant_id', x.value ->> 'source_id',
                    x.value ->> 'source_kind', x.value ->> 'idempotency_key',
                    x.value -> 'payload', x.value -> 'params', $2, 'pending',
                    x.value ->> 'cause_run_id', CAST(x.value ->> 'depth' AS INTEGER),
                    x.value ->> 'origin_automation_id', x.value ->> 'target_automation_id',
                    x.value ->> 'event_type', x.value ->> 'subject_ticket_id',
                    x.value ->> 'traceparent'
                 FROM ", batch_rows!(1), "
                 WHERE x.value ->> 'id' ", any_of!(3), "
                 ORDER BY x.key"
            ))
            .bind(Json(&rows))
            .bind(now)
            .bind(list(new.iter().copied()))
            .execute(&mut *tx)
            .await?;
            let mut out: Vec<Option<Result<(EventId, Accepted)>>> = items
                .iter()
                .zip(ids)
                .map(|((_, event), id)| {
                    (event.source_id.is_none() || claimed.contains(id))
                        .then(|| Ok((EventId::from(id.clone()), Accepted { duplicate: false })))
                })
                .collect();
            // The rest one by one, in key order too: a key's row is locked
            // here even when it stays as it is (a duplicate), so two
            // batches holding the same duplicates in opposite places would
            // otherwise wait for each other in a circle.
            let mut rest: Vec<usize> = (0..items.len()).filter(|&i| out[i].is_none()).collect();
            rest.sort_by_key(|&i| {
                let event = items[i].1;
                (items[i].0.as_str(), &event.source_kind, event.source_id.as_ref().map(|s| s.as_str()), &event.idempotency_key)
            });
            for i in rest {
                let (tenant, event) = items[i];
                out[i] = Some(Ok(accept_in(&mut tx, tenant, event).await?));
            }
            tx.commit().await?;
            Ok(out.into_iter().flatten().collect())
        }

        /// [`accept_batch`] for events that passed its check.
        async fn accept_storable(
            pool: &sqlx::Pool<$db>,
            items: &[(&TenantId, &NewEvent)],
        ) -> Result<Vec<Result<(EventId, Accepted)>>> {
            if items.is_empty() {
                return Ok(Vec::new());
            }
            // One transaction writes the batch: one statement claims the
            // keys that are free, one writes the events of those keys and
            // of no source, and each of the rest (a duplicate, a key last
            // taken outside the window, a key sent twice in the batch)
            // goes the one-by-one way. Nobody is answered before it
            // committed; a crash before loses nothing answered, and the
            // retried webhooks write their events then.
            let ids: Vec<String> = items.iter().map(|_| new_id("evt")).collect();
            let now = now_ms();
            let rows: Vec<$crate::rows::EventRow> = items
                .iter()
                .zip(&ids)
                .map(|(&(tenant_id, event), id)| $crate::rows::EventRow::new(id, tenant_id, event))
                .collect();
            // Two batches in flight at once (see `batch.rs`) may wait for
            // each other's keys: a key the one wrote is a duplicate the
            // other reads one by one, and the other way round. The database
            // breaks such a deadlock by failing one of them, which wrote
            // nothing and goes again; the keys are claimed in one order
            // (by key, not by place in the batch) so that the claims
            // themselves never wait in a circle.
            let mut tries = 0;
            let together = loop {
                tries += 1;
                let written = write_batch(pool, items, &ids, &rows, now).await;
                match written {
                    Err(e) if tries < DEADLOCK_TRIES && $crate::storable::deadlocked(&e) => {
                        tracing::debug!(error = %e, tries, "an inbox batch deadlocked; writing it again");
                    }
                    written => break written,
                }
            };
            match together {
                Ok(out) => Ok(out),
                // The database refused one row's data: each event alone, so
                // that only the one at fault is refused.
                Err(e) if $crate::storable::refused_row(&e) => {
                    let mut out = Vec::with_capacity(items.len());
                    for (tenant, event) in items {
                        out.push(accept_alone(pool, tenant, event).await?);
                    }
                    Ok(out)
                }
                Err(e) => Err(e),
            }
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

        /// An inbox row as [`StoredEvent`].
        fn stored_event(row: &<$db as sqlx::Database>::Row) -> StoredEvent {
            StoredEvent {
                id: EventId::from(row.get::<String, _>("id")),
                source_id: row.get::<Option<String>, _>("source_id").map(SourceId::from),
                source_kind: row.get("source_kind"),
                event_type: row.get("event_type"),
                status: row.get("status"),
                replay_of: row.get::<Option<String>, _>("replay_of").map(EventId::from),
                received_at: row.get("received_at"),
                error: row.get("error"),
            }
        }

        /// The events a filtered replay takes (`EventFilter`), in SQL:
        /// `$1` the tenant, `$2` the source, `$3` since, `$4` until.
        const REPLAYABLE: &str = "tenant_id = $1 AND source_id IS NOT NULL AND replay_of IS NULL
               AND (CAST($2 AS TEXT) IS NULL OR source_id = $2)
               AND (CAST($3 AS BIGINT) IS NULL OR received_at >= $3)
               AND (CAST($4 AS BIGINT) IS NULL OR received_at < $4)";

        /// Decides and writes one replay in the caller's transaction
        /// ([`InboxStore::replay_event`]).
        async fn replay_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            id: &EventId,
            mode: ReplayMode,
        ) -> Result<Option<Replayed>> {
            let Some(row) = sqlx::query(
                "SELECT id, tenant_id, source_id, source_kind, payload, params, depth,
                    cause_run_id, origin_automation_id, target_automation_id, event_type,
                    subject_ticket_id, received_at, traceparent, replay_of
                 FROM event_inbox WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&mut **tx)
            .await?
            else {
                return Ok(None);
            };
            // Replays hang off the first event, so "its runs" are the
            // runs of the whole family whichever member is replayed.
            let root: String = row
                .get::<Option<String>, _>("replay_of")
                .unwrap_or_else(|| id.to_string());
            lock_names(tx, vec![key_lock(tenant, &format!("replay:{root}"))]).await?;
            if mode == ReplayMode::IfNoRuns {
                let runs: Vec<String> = sqlx::query_scalar(
                    "SELECT r.id FROM runs r
                     WHERE r.tenant_id = $1 AND r.event_id IN (
                        SELECT e.id FROM event_inbox e
                        WHERE e.tenant_id = $1 AND (e.id = $2 OR e.replay_of = $2))
                     ORDER BY r.id LIMIT 100",
                )
                .bind(tenant.as_str())
                .bind(&root)
                .fetch_all(&mut **tx)
                .await?;
                if !runs.is_empty() {
                    return Ok(Some(Replayed::HasRuns(runs.into_iter().map(RunId::from).collect())));
                }
                let pending: Option<String> = sqlx::query_scalar(
                    "SELECT id FROM event_inbox
                     WHERE tenant_id = $1 AND (id = $2 OR replay_of = $2) AND status = 'pending'
                     ORDER BY id LIMIT 1",
                )
                .bind(tenant.as_str())
                .bind(&root)
                .fetch_optional(&mut **tx)
                .await?;
                if let Some(pending) = pending {
                    return Ok(Some(Replayed::Pending(EventId::from(pending))));
                }
            }
            // The inbox row as the dispatcher reads it (`dispatch_sql.rs`).
            let first = event_from_row(&row);
            let event = NewEvent {
                source_id: first.source_id,
                source_kind: first.source_kind,
                // Its own key: a replay is never taken for a repeat of the
                // sender's event, nor a later repeat for a repeat of it.
                idempotency_key: format!("replay:{root}:{}", new_id("rpl")),
                payload: first.payload,
                params: first.params,
                depth: first.depth,
                cause_run_id: first.cause_run_id,
                origin_automation_id: first.origin_automation_id,
                target_automation_id: first.target_automation_id,
                event_type: first.event_type,
                subject_ticket_id: first.subject_ticket_id,
                traceparent: first.traceparent,
            };
            let replay = insert_event(tx, tenant, &event, "pending")
                .await?
                .ok_or_else(|| StoreError::Taken("a replay's own key was taken".into()))?;
            sqlx::query("UPDATE event_inbox SET replay_of = $3 WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.as_str())
                .bind(replay.as_str())
                .bind(&root)
                .execute(&mut **tx)
                .await?;
            Ok(Some(Replayed::Accepted(replay)))
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

            async fn begin_dispatch(
                &self,
                tenants: &[TenantId],
                lane: Lane,
            ) -> Result<Box<dyn DispatchTx>> {
                begin_dispatch_in(self, tenants, lane).await
            }

            async fn start_run(
                &self,
                tenant: &TenantId,
                event: NewEvent,
                run: NewRun,
            ) -> Result<RunId> {
                match self.start_run_limited(tenant, event, run, None).await? {
                    Started::Run(id) => Ok(id),
                    Started::Limited { .. } => Err(StoreError::Invariant("a start without a limit was limited".into())),
                }
            }

            async fn start_run_limited(
                &self,
                tenant: &TenantId,
                event: NewEvent,
                run: NewRun,
                starts_per_minute: Option<u32>,
            ) -> Result<Started> {
                // The run's context holds the event's payload.
                $crate::storable::check_event(&event)?;
                if let Some(key) = &run.idempotency_key {
                    if let Some(existing) = run_by_key(self.reader(), tenant, &run.automation_id, key).await? {
                        return Ok(Started::Run(existing));
                    }
                }
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                if let Some(per_minute) = starts_per_minute {
                    let now = now_ms();
                    let since = now - tok_core::limits::START_WINDOW_MS;
                    let recent =
                        recent_starts_in(&mut tx, tenant, &run.automation_id, since, per_minute).await?;
                    if let Err(retry_after_ms) =
                        tok_core::limits::start_allowed(&recent, per_minute, now)
                    {
                        return Ok(Started::Limited { retry_after_ms });
                    }
                }
                let event_id = insert_event(&mut tx, tenant, &event, "dispatched")
                    .await?
                    .ok_or_else(|| StoreError::Taken("event idempotency key taken".into()))?;
                match insert_runs(&mut tx, &[(tenant.clone(), event_id, run.clone())], None).await {
                    Ok(_) => {
                        if !notify_work!().is_empty() {
                            sqlx::query(notify_work!()).execute(&mut *tx).await?;
                        }
                        tx.commit().await?;
                        Ok(Started::Run(run.id.clone()))
                    }
                    Err(StoreError::Database(sqlx::Error::Database(e)))
                        if e.is_unique_violation() && run.idempotency_key.is_some() =>
                    {
                        drop(tx);
                        let key = run.idempotency_key.clone().unwrap_or_default();
                        run_by_key(self.reader(), tenant, &run.automation_id, &key)
                            .await?
                            .map(Started::Run)
                            .ok_or(StoreError::NotFound("run"))
                    }
                    Err(e) => Err(e),
                }
            }

            async fn run_by_idempotency_key(
                &self,
                tenant: &TenantId,
                automation: &AutomationId,
                key: &str,
            ) -> Result<Option<RunId>> {
                run_by_key(self.reader(), tenant, automation, key).await
            }

            async fn event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<StoredEvent>> {
                let row = sqlx::query(
                    "SELECT id, source_id, source_kind, event_type, status, replay_of, received_at, error
                     FROM event_inbox WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .fetch_optional(self.reader())
                .await?;
                Ok(row.as_ref().map(stored_event))
            }

            async fn set_aside(&self, tenant: &TenantId, id: &EventId, error: &str) -> Result<bool> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let done = sqlx::query(
                    "UPDATE event_inbox SET status = 'failed', error = $3
                     WHERE tenant_id = $1 AND id = $2 AND status = 'pending'",
                )
                .bind(tenant.as_str())
                .bind(id.as_str())
                .bind(error)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(done.rows_affected() > 0)
            }

            async fn replay_event(
                &self,
                tenant: &TenantId,
                id: &EventId,
                mode: ReplayMode,
            ) -> Result<Option<Replayed>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let replayed = replay_in(&mut tx, tenant, id, mode).await?;
                tx.commit().await?;
                Ok(replayed)
            }

            async fn events(
                &self,
                tenant: &TenantId,
                filter: &EventFilter,
                limit: u32,
                after: Option<&str>,
            ) -> Result<Page<StoredEvent>> {
                let sql = format!(
                    "SELECT id, source_id, source_kind, event_type, status, replay_of, received_at, error
                     FROM event_inbox
                     WHERE {REPLAYABLE} AND (CAST($5 AS TEXT) IS NULL OR id > $5)
                     ORDER BY id LIMIT $6"
                );
                let rows = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(filter.source_id.as_ref().map(|s| s.as_str()))
                    .bind(filter.since)
                    .bind(filter.until)
                    .bind(after)
                    .bind(i64::from(limit) + 1)
                    .fetch_all(self.reader())
                    .await?;
                let items = rows.iter().map(stored_event).collect();
                Ok(Page::of(items, limit, |e: &StoredEvent| e.id.to_string()))
            }

            async fn count_events(&self, tenant: &TenantId, filter: &EventFilter) -> Result<i64> {
                let sql = format!("SELECT COUNT(*) FROM event_inbox WHERE {REPLAYABLE}");
                Ok(sqlx::query_scalar(&sql)
                    .bind(tenant.as_str())
                    .bind(filter.source_id.as_ref().map(|s| s.as_str()))
                    .bind(filter.since)
                    .bind(filter.until)
                    .fetch_one(self.reader())
                    .await?)
            }
        }
    };
}

pub(crate) use impl_inbox;
