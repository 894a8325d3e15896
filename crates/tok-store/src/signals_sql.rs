//! The queries of signals and waits for both backends (see `rows.rs` for
//! why a macro): sending a signal, and parking a recorded job at its wait
//! (or resuming it at once from the buffer). Both run in the caller's
//! transaction: a send in its own or in a record transaction (an `emit`
//! step), a park in the record transaction that writes the wait step.

/// Names a signal key's lock: one per (tenant, key). Tenant ids hold no
/// `/`, so two pairs never share a name.
pub(crate) fn key_lock(tenant: &tok_core::ids::TenantId, key: &str) -> String {
    format!("key:{tenant}/{key}")
}

/// Names the lock of the `wait_for_condition` waits on a ticket: one per
/// (tenant, ticket). Signal keys never begin with `tok:`, so it is never
/// a signal key's lock.
pub(crate) fn condition_lock(tenant: &tok_core::ids::TenantId, ticket: &str) -> String {
    key_lock(
        tenant,
        &format!("{}/{ticket}", tok_core::waits::CONDITION_KEY),
    )
}

/// Names the lock of a start control's key (`flow_keys`): the dispatch
/// deciding on it and the scheduler releasing a queued singleton run take
/// it, one after the other.
pub(crate) fn flow_lock(
    tenant: &tok_core::ids::TenantId,
    automation: &str,
    control: &str,
    key: &str,
) -> String {
    key_lock(tenant, &format!("flow:{automation}/{control}/{key}"))
}

/// Names the lock that serializes sends repeating one idempotency key, so
/// that the second finds the first's row instead of resuming waits too.
pub(crate) fn idempotency_lock(tenant: &tok_core::ids::TenantId, key: &str) -> String {
    format!("idempotency:{tenant}/{key}")
}

/// How long a signal waits in the buffer for a wait whose step's
/// escalation runs (at least): the escalation's own steps may wait.
pub(crate) const ESCALATION_HOLD_MS: i64 = 7 * 24 * 3600 * 1000;

/// Whether a claimed job's record moves it from its waiting step into that
/// step's escalation (`<path>.escalations.…`).
pub(crate) fn into_escalation(job: &crate::ClaimedJob, next: &tok_core::run::NextJob) -> bool {
    use tok_core::run::NextJob;
    let to = match next {
        NextJob::Step { path, .. }
        | NextJob::Continue { path, .. }
        | NextJob::Retry { path, .. } => path,
        _ => return false,
    };
    to.strip_prefix(job.path.as_str())
        .is_some_and(|rest| rest.starts_with(".escalations."))
}

/// The waits on a signal's key (`$2`) about its subject, `$subject` the
/// condition on `w.subject` (`= $3`, or `IS NULL` for a signal about no
/// ticket: two statements, so that both find their waits by the index),
/// whose jobs no worker holds, locked.
macro_rules! waits_for_signal {
    ($subject:literal) => {
        concat!(
            "SELECT w.id, w.run_id, w.path, w.match, j.id AS job_id
             FROM waits w
             JOIN jobs j ON j.tenant_id = w.tenant_id AND j.run_id = w.run_id
                AND j.path = w.path
             WHERE w.tenant_id = $1 AND w.kind = 'event' AND w.key = $2
               AND w.subject ",
            $subject,
            "
               AND j.claim_token IS NULL
             ORDER BY j.id ",
            lock_rows_of!(j)
        )
    };
}
pub(crate) use waits_for_signal;

/// The `wait_for_condition` waits about a ticket (`$3`; `$2` their key),
/// whose jobs no worker holds, locked: found by the index of waits'
/// keys, so a write of a ticket nobody waits on costs this one lookup.
macro_rules! waits_on_ticket {
    () => {
        concat!(
            "SELECT w.id, w.run_id, w.path, w.match, j.id AS job_id
             FROM waits w
             JOIN jobs j ON j.tenant_id = w.tenant_id AND j.run_id = w.run_id
                AND j.path = w.path
             WHERE w.tenant_id = $1 AND w.kind = 'condition' AND w.key = $2
               AND w.subject = $3 AND j.claim_token IS NULL
             ORDER BY j.id ",
            lock_rows_of!(j)
        )
    };
}
pub(crate) use waits_on_ticket;

/// A wait on a key (`$2`) about a subject (`$subject` as in
/// [`waits_for_signal`]) kept while its step's escalation runs.
macro_rules! escalating_wait_about {
    ($subject:literal) => {
        concat!(
            "SELECT w.id FROM waits w
             WHERE w.tenant_id = $1 AND w.kind = 'event' AND w.key = $2
               AND w.subject ",
            $subject,
            "
               AND NOT EXISTS (SELECT 1 FROM jobs j
                   JOIN runs r ON r.tenant_id = j.tenant_id AND r.id = j.run_id
                   WHERE j.tenant_id = w.tenant_id AND j.run_id = w.run_id
                     AND CASE WHEN r.cursor_job = j.id THEN r.cursor_path ELSE j.path END
                         = w.path)
             LIMIT 1"
        )
    };
}
pub(crate) use escalating_wait_about;

/// The waits on a signal's key (`$2`) about its subject whose job a worker
/// holds at the wait's own path, for the time they were due at: for an
/// escalation level or for the timeout, as the run's context tells.
macro_rules! claimed_wait_about {
    ($subject:literal) => {
        concat!(
            "SELECT w.run_id, w.path, w.due_at FROM waits w
             JOIN jobs j ON j.tenant_id = w.tenant_id AND j.run_id = w.run_id
                AND j.path = w.path
             WHERE w.tenant_id = $1 AND w.kind = 'event' AND w.key = $2
               AND w.subject ",
            $subject,
            "
               AND w.due_at IS NOT NULL AND j.claim_token IS NOT NULL"
        )
    };
}
pub(crate) use claimed_wait_about;

/// A page of the signals buffered on a wait's key (`$2`) about its subject
/// (`subject = $7` or `subject IS NULL`), unexpired (`$3`), after
/// (`$4`, `$5`), oldest first.
macro_rules! buffered_signals {
    ($subject:literal) => {
        concat!(
            "SELECT id, payload, received_at, actor, subject FROM signals
             WHERE tenant_id = $1 AND key = $2 AND subject ",
            $subject,
            "
               AND consumed_at IS NULL AND expires_at > $3
               AND (CAST($4 AS BIGINT) IS NULL OR received_at > $4
                    OR (received_at = $4 AND id > $5))
             ORDER BY received_at, id LIMIT $6"
        )
    };
}
pub(crate) use buffered_signals;

macro_rules! impl_signals {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        use $crate::signals::{BUFFER_PAGE, NEVER_DUE_MS};
        use $crate::signals_sql::{condition_lock, idempotency_lock, key_lock};

        /// Whether a payload satisfies a wait's `where` (none: any payload).
        fn satisfies(filter: Option<&tok_core::definition::Filter>, payload: &Value) -> bool {
            filter.is_none_or(|f| {
                tok_core::condition::Condition::from_filter(f)
                    .evaluate(payload)
                    .result
            })
        }

        /// Takes the named locks until the transaction ends, in one order
        /// for every transaction (by the lock's hash), so that two
        /// transactions taking several never wait for each other in a
        /// circle. SQLite's one writer is lock enough: no statement.
        async fn lock_names(tx: &mut sqlx::Transaction<'_, $db>, names: Vec<String>) -> Result<()> {
            lock_names_on(&mut **tx, names).await
        }

        /// [`lock_names`] on a connection (in its transaction).
        async fn lock_names_on(
            conn: &mut <$db as sqlx::Database>::Connection,
            names: Vec<String>,
        ) -> Result<()> {
            if lock_names!(1).is_empty() || names.is_empty() {
                return Ok(());
            }
            sqlx::query(lock_names!(1)).bind(list(names)).execute(&mut *conn).await?;
            Ok(())
        }

        /// Takes the matched waits, each `(wait row id, run, path)`:
        /// deletes every wait row at their paths (a wait on several keys
        /// has one per key), in one statement. Returns the matched waits
        /// this deleted; one whose row was gone already was resumed first
        /// by another transaction (a signal on another of its keys, a
        /// change of its ticket), which wrote its job's resume: that must
        /// not be overwritten.
        async fn take_waits(
            conn: &mut <$db as sqlx::Database>::Connection,
            tenant: &TenantId,
            matched: Vec<(String, String, String)>,
        ) -> Result<Vec<(String, String, String)>> {
            if matched.is_empty() {
                return Ok(matched);
            }
            let at: Vec<[&str; 3]> = matched
                .iter()
                .map(|(_, run, path)| [tenant.as_str(), run.as_str(), path.as_str()])
                .collect();
            let gone: std::collections::HashSet<String> = sqlx::query(concat!(
                "DELETE FROM waits WHERE id IN (SELECT w.id FROM ", batch_rows!(1), "
                 JOIN waits w ON w.tenant_id = x.value ->> 0 AND w.run_id = x.value ->> 1
                    AND w.path = x.value ->> 2)
                 RETURNING id"
            ))
            .bind(Json(&at))
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|row| row.get::<String, _>("id"))
            .collect();
            Ok(matched.into_iter().filter(|(wait, _, _)| gone.contains(wait)).collect())
        }

        /// A ticket was written (`write_ticket_in`, in the same
        /// transaction): the `wait_for_condition` waits about it whose
        /// jobs no worker holds and whose rules its new state holds are
        /// taken and their jobs resumed with it ([`Resume::Condition`]).
        /// Returns the runs resumed.
        ///
        /// No wake-up is lost to a wait parking meanwhile: both take the
        /// ticket's [`condition_lock`], the park before it reads the
        /// ticket, this after the ticket's row is written and before it
        /// looks for waits. If the park has the lock first, its wait row
        /// is committed when this gets the lock, and this finds it (each
        /// statement reads what was committed before it began). If this
        /// has it first, the new ticket is committed when the park gets
        /// the lock, and the park reads it and resumes at once. A wait
        /// whose job a worker holds (claimed for its next check or its
        /// deadline) is left: that claim parks it again, and the park
        /// reads the ticket as it is then.
        async fn resume_condition_waits_in(
            conn: &mut <$db as sqlx::Database>::Connection,
            tenant: &TenantId,
            ticket: &Ticket,
        ) -> Result<Vec<RunId>> {
            lock_names_on(conn, vec![condition_lock(tenant, &ticket.id)]).await?;
            let waits = sqlx::query($crate::signals_sql::waits_on_ticket!())
                .bind(tenant.as_str())
                .bind(tok_core::waits::CONDITION_KEY)
                .bind(&ticket.id)
                .fetch_all(&mut *conn)
                .await?;
            if waits.is_empty() {
                return Ok(Vec::new());
            }
            let view = ticket.event_view();
            let mut matched = Vec::new();
            let mut job_of = std::collections::HashMap::new();
            for row in &waits {
                let filter = row.try_get::<Option<Json<tok_core::definition::Filter>>, _>("match")?;
                if satisfies(filter.as_ref().map(|f| &f.0), &view) {
                    let wait: String = row.get("id");
                    job_of.insert(wait.clone(), row.get::<i64, _>("job_id"));
                    matched.push((wait, row.get("run_id"), row.get("path")));
                }
            }
            let taken = take_waits(conn, tenant, matched).await?;
            if taken.is_empty() {
                return Ok(Vec::new());
            }
            let jobs: Vec<i64> = taken.iter().map(|(wait, _, _)| job_of[wait]).collect();
            let resumed = taken.into_iter().map(|(_, run, _)| RunId::from(run)).collect();
            sqlx::query(concat!(
                "UPDATE jobs SET resume = $3, run_after = ", db_now!(), "
                 WHERE tenant_id = $1 AND id ", any_of!(2)
            ))
            .bind(tenant.as_str())
            .bind(list(jobs))
            .bind(Json(&Resume::Condition { ticket: view }))
            .execute(&mut *conn)
            .await?;
            if !notify_work!().is_empty() {
                sqlx::query(notify_work!()).execute(&mut *conn).await?;
            }
            Ok(resumed)
        }

        /// The condition of a `wait_for_condition` that parks, checked at
        /// once under its ticket's [`condition_lock`] (taken by the
        /// caller): the ticket of the run's tenant as it is now, when it
        /// holds the rules.
        async fn condition_holds_now(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            wait: &SignalWait,
        ) -> Result<Option<Resume>> {
            let Some(id) = wait.subject.as_deref() else {
                return Ok(None);
            };
            let Some(ticket) = ticket_where(&mut **tx, tenant, "id", id, false).await? else {
                return Ok(None);
            };
            let view = ticket.event_view();
            Ok(satisfies(wait.filter.as_ref(), &view).then_some(Resume::Condition { ticket: view }))
        }

        /// Sends a signal in the caller's transaction: resumes the matching
        /// waits on its key whose jobs no worker holds, or buffers it.
        pub(crate) async fn send_signal_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            signal: &NewSignal,
        ) -> Result<SignalSent> {
            let mut locks = vec![key_lock(tenant, &signal.key)];
            locks.extend(signal.idempotency_key.as_deref().map(|k| idempotency_lock(tenant, k)));
            lock_names(tx, locks).await?;
            if let Some(idempotency_key) = &signal.idempotency_key {
                let first = sqlx::query(
                    "SELECT id, key, resumed, subject FROM signals
                     WHERE tenant_id = $1 AND idempotency_key = $2",
                )
                .bind(tenant.as_str())
                .bind(idempotency_key)
                .fetch_optional(&mut **tx)
                .await?;
                if let Some(first) = first {
                    let resumed = first.try_get::<Json<Vec<RunId>>, _>("resumed")?.0;
                    return Ok(SignalSent {
                        signal_id: first.get("id"),
                        key: first.get("key"),
                        subject: first.get("subject"),
                        buffered: resumed.is_empty(),
                        resumed,
                        duplicate: true,
                    });
                }
            }
            // A job with a claim token is held by a worker: one claimed for
            // its timeout (the timeout won), or one whose record is being
            // written right now (and holds its row, perhaps waiting for this
            // key's lock: never wait for such a row).
            // Only the waits about the signal's subject (or, for a signal
            // about none, about none).
            let waits = match &signal.subject {
                Some(subject) => sqlx::query($crate::signals_sql::waits_for_signal!("= $3"))
                    .bind(tenant.as_str())
                    .bind(&signal.key)
                    .bind(subject),
                None => sqlx::query($crate::signals_sql::waits_for_signal!("IS NULL"))
                    .bind(tenant.as_str())
                    .bind(&signal.key),
            }
            .fetch_all(&mut **tx)
            .await?;
            let mut matched = Vec::new();
            let mut job_of = std::collections::HashMap::new();
            for row in &waits {
                let filter = row.try_get::<Option<Json<tok_core::definition::Filter>>, _>("match")?;
                if satisfies(filter.as_ref().map(|f| &f.0), &signal.payload) {
                    let wait: String = row.get("id");
                    job_of.insert(wait.clone(), row.get::<i64, _>("job_id"));
                    matched.push((wait, row.get("run_id"), row.get("path")));
                }
            }
            // A wait on several keys resumed by a signal on another of its
            // keys a moment ago (its rows gone since they were read) is
            // not this signal's: the signal is buffered for it instead.
            let mut matched: Vec<(String, String, i64)> = take_waits(&mut **tx, tenant, matched)
                .await?
                .into_iter()
                .map(|(wait, run, _)| {
                    let job = job_of[&wait];
                    (wait, run, job)
                })
                .collect();
            // Wait ids sort by when the wait began.
            matched.sort();
            let id = new_id("sig");
            let now = now_ms();
            if !matched.is_empty() {
                let resume = Resume::Signal {
                    signal_id: id.clone(),
                    payload: signal.payload.clone(),
                    actor: signal.actor.clone(),
                    subject: signal.subject.clone(),
                    key: Some(signal.key.clone()),
                };
                sqlx::query(concat!(
                    "UPDATE jobs SET resume = $3, run_after = ", db_now!(), "
                     WHERE tenant_id = $1 AND id ", any_of!(2)
                ))
                .bind(tenant.as_str())
                .bind(list(matched.iter().map(|(_, _, job)| *job)))
                .bind(Json(&resume))
                .execute(&mut **tx)
                .await?;
                if !notify_work!().is_empty() {
                    sqlx::query(notify_work!()).execute(&mut **tx).await?;
                }
            }
            let resumed: Vec<RunId> = matched.into_iter().map(|(_, run, _)| RunId::from(run)).collect();
            let buffered = resumed.is_empty();
            // A wait on the key whose step's escalation runs takes it when
            // it parks again: until then it stays in the buffer.
            let escalating = buffered && escalating_wait(tx, tenant, signal).await?;
            let lookback_ms = match escalating {
                true => signal.lookback_ms.max(ESCALATION_HOLD_MS),
                false => signal.lookback_ms.max(0),
            };
            sqlx::query(
                "INSERT INTO signals (id, tenant_id, key, payload, idempotency_key, received_at,
                    expires_at, resumed, consumed_at, actor, subject)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(&id)
            .bind(tenant.as_str())
            .bind(&signal.key)
            .bind(Json(&signal.payload))
            .bind(signal.idempotency_key.as_deref())
            .bind(now)
            .bind(if buffered { now.saturating_add(lookback_ms) } else { now })
            .bind(Json(&resumed))
            .bind((!buffered).then_some(now))
            .bind(signal.actor.as_ref().map(Json))
            .bind(signal.subject.as_deref())
            .execute(&mut **tx)
            .await?;
            Ok(SignalSent {
                signal_id: id,
                key: signal.key.clone(),
                subject: signal.subject.clone(),
                resumed,
                buffered,
                duplicate: false,
            })
        }

        /// Whether a wait on the signal's key about its subject is kept
        /// while its step's escalation runs: its row is there, its run's
        /// job is elsewhere (where its run's row says, for a job that went
        /// on under its lease: at the escalation's steps), or a worker holds
        /// it where the wait is for a level's time, not the timeout's, and
        /// is about to run the level's first step. The signal then
        /// waits in the buffer for the wait to park again
        /// ([`ESCALATION_HOLD_MS`] at least).
        pub(crate) async fn escalating_wait(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            signal: &NewSignal,
        ) -> Result<bool> {
            let found = match &signal.subject {
                Some(subject) => sqlx::query($crate::signals_sql::escalating_wait_about!("= $3"))
                    .bind(tenant.as_str())
                    .bind(&signal.key)
                    .bind(subject),
                None => sqlx::query($crate::signals_sql::escalating_wait_about!("IS NULL"))
                    .bind(tenant.as_str())
                    .bind(&signal.key),
            }
            .fetch_optional(&mut **tx)
            .await?;
            if found.is_some() {
                return Ok(true);
            }
            // Its job claimed at the wait's path for the time it was due:
            // an escalation level about to run its steps when that time
            // was before the wait's timeout (the timeout ends the wait).
            let claimed = match &signal.subject {
                Some(subject) => sqlx::query($crate::signals_sql::claimed_wait_about!("= $3"))
                    .bind(tenant.as_str())
                    .bind(&signal.key)
                    .bind(subject),
                None => sqlx::query($crate::signals_sql::claimed_wait_about!("IS NULL"))
                    .bind(tenant.as_str())
                    .bind(&signal.key),
            }
            .fetch_all(&mut **tx)
            .await?;
            for row in claimed {
                let run = RunId::from(row.get::<String, _>("run_id"));
                let due_at: i64 = row.get("due_at");
                let Ok(path) = row.get::<String, _>("path").parse::<tok_core::path::FlowPath>() else {
                    continue;
                };
                let Some(context) = context_in(tx, tenant, &run).await? else {
                    continue;
                };
                let context = tok_core::context::Context::from_shared(std::sync::Arc::new(context));
                if let Some((_, timeout_at)) = tok_core::escalation::began(&path, &context)
                    && timeout_at.is_none_or(|timeout_at| due_at < timeout_at)
                {
                    return Ok(true);
                }
            }
            Ok(false)
        }

        /// Takes the oldest signal buffered on `key` (one of the wait's)
        /// about the wait's subject, unexpired, whose payload satisfies its `where`, for
        /// `run`. The buffer is
        /// read a page of [`BUFFER_PAGE`] at a time, oldest first, never
        /// the whole key at once: a record batch holds the writer while it
        /// reads, and a key may buffer what the tenant's signal rate lets
        /// in over the lookback.
        async fn take_buffered(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            run: &RunId,
            wait: &SignalWait,
            key: &str,
            since: Option<i64>,
            now: i64,
        ) -> Result<Option<Resume>> {
            // Where the last page ended: (received_at, id); from `since`
            // on when it is given.
            let since = since.map(|at| (at, String::new()));
            let mut after: Option<(i64, String)> = since;
            loop {
                let (after_at, after_id) = match &after {
                    Some((at, id)) => (Some(*at), Some(id.as_str())),
                    None => (None, None),
                };
                let query = match &wait.subject {
                    Some(_) => sqlx::query($crate::signals_sql::buffered_signals!("= $7")),
                    None => sqlx::query($crate::signals_sql::buffered_signals!("IS NULL")),
                };
                let query = query
                    .bind(tenant.as_str())
                    .bind(key)
                    .bind(now)
                    .bind(after_at)
                    .bind(after_id)
                    .bind(BUFFER_PAGE);
                let page = match &wait.subject {
                    Some(subject) => query.bind(subject),
                    None => query,
                }
                .fetch_all(&mut **tx)
                .await?;
                for row in &page {
                    let payload = row.try_get::<Json<Value>, _>("payload")?.0;
                    if !satisfies(wait.filter.as_ref(), &payload) {
                        continue;
                    }
                    let signal_id: String = row.get("id");
                    sqlx::query(
                        "UPDATE signals SET consumed_by_run = $3, consumed_at = $4
                         WHERE tenant_id = $1 AND id = $2",
                    )
                    .bind(tenant.as_str())
                    .bind(&signal_id)
                    .bind(run.as_str())
                    .bind(now)
                    .execute(&mut **tx)
                    .await?;
                    let actor = row.try_get::<Option<Json<Value>>, _>("actor")?.map(|a| a.0);
                    let subject = row.try_get::<Option<String>, _>("subject")?;
                    let key = Some(key.to_owned());
                    return Ok(Some(Resume::Signal { signal_id, payload, actor, subject, key }));
                }
                let (Some(last), true) = (page.last(), page.len() as i64 == BUFFER_PAGE) else {
                    return Ok(None);
                };
                after = Some((last.get("received_at"), last.get("id")));
            }
        }

        /// A `waits` row of `kind` (`event` or `condition`) on `key` for the
        /// job parked at `path`, with the wait's rules, due time and subject.
        async fn insert_wait(
            tx: &mut sqlx::Transaction<'_, $db>,
            job: &ClaimedJob,
            path: &str,
            kind: &str,
            key: &str,
            wait: &SignalWait,
        ) -> Result<()> {
            sqlx::query(
                "INSERT INTO waits (id, run_id, tenant_id, path, kind, key, match, due_at, subject)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(new_id("wai"))
            .bind(job.run_id.as_str())
            .bind(job.tenant_id.as_str())
            .bind(path)
            .bind(kind)
            .bind(key)
            .bind(wait.filter.as_ref().map(Json))
            .bind(wait.due_at)
            .bind(wait.subject.as_deref())
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        /// The waits part of a record batch, before its jobs move: the waits
        /// of runs whose jobs were handed out again (by a signal or a
        /// timeout) go, and each job recorded as [`NextJob::Wait`] takes a
        /// buffered signal (ready now, carrying it) or parks (a `waits` row,
        /// due at its timeout). Returns, by job id, what each parked job's
        /// row becomes.
        async fn settle_waits(
            tx: &mut sqlx::Transaction<'_, $db>,
            items: &[(ClaimedJob, Record, $crate::rows::Fenced)],
        ) -> Result<std::collections::HashMap<i64, $crate::rows::Parked>> {
            let mut parked = std::collections::HashMap::new();
            let parking: Vec<(&ClaimedJob, &str, &SignalWait)> = items
                .iter()
                .filter_map(|(job, record, _)| match &record.next {
                    NextJob::Wait { path, wait } => Some((job, path.as_str(), wait)),
                    _ => None,
                })
                .collect();
            let on_runs: Vec<(&ClaimedJob, &str, &RunsWait)> = items
                .iter()
                .filter_map(|(job, record, _)| match &record.next {
                    NextJob::WaitForRuns { path, wait } => Some((job, path.as_str(), wait)),
                    _ => None,
                })
                .collect();
            // A job that forks parallel branches parks until they join
            // (`record/branches.rs` counts them).
            for (job, record, _) in items {
                if let NextJob::Fork { branches, items, .. } = &record.next {
                    let total = items.as_ref().map_or(branches.len(), |items| items.total);
                    let resume = Resume::Branches {
                        total,
                        done: Vec::new(),
                        failed: None,
                        items: items.clone(),
                    };
                    parked.insert(job.id.0, $crate::rows::Parked { run_at: Some(NEVER_DUE_MS), resume });
                }
            }
            let settled: Vec<&ClaimedJob> = items
                .iter()
                .map(|(job, _, _)| job)
                .filter(|job| {
                    job.resume.is_some()
                        || parking.iter().any(|(p, _, _)| p.id == job.id)
                        || on_runs.iter().any(|(p, _, _)| p.id == job.id)
                })
                .collect();
            // A run that ends (or undoes its steps) waits for nothing any
            // more: a wait kept through an escalation whose step failed the
            // run goes with it.
            let ended: Vec<[&str; 2]> = items
                .iter()
                .filter(|(_, record, _)| {
                    record.status.is_final() || record.status == RunStatus::Compensating
                })
                .map(|(job, _, _)| [job.tenant_id.as_str(), job.run_id.as_str()])
                .collect();
            if !ended.is_empty() {
                sqlx::query(concat!(
                    "DELETE FROM waits WHERE id IN (SELECT w.id FROM ", batch_rows!(1), "
                     JOIN waits w ON w.tenant_id = x.value ->> 0 AND w.run_id = x.value ->> 1)"
                ))
                .bind(Json(&ended))
                .execute(&mut **tx)
                .await?;
            }
            if settled.is_empty() {
                return Ok(parked);
            }
            // A job that leaves its wait for the step's escalation keeps the
            // wait's row (a decision, a signal still reach it: they wait in
            // the buffer until it parks again), due at no time meanwhile;
            // one that parks again after its escalation replaces that row.
            let escalating: Vec<&ClaimedJob> = items
                .iter()
                .filter(|(job, record, _)| job.resume.is_some() && into_escalation(job, &record.next))
                .map(|(job, _, _)| job)
                .collect();
            for job in &escalating {
                sqlx::query(
                    "UPDATE waits SET due_at = NULL WHERE tenant_id = $1 AND run_id = $2 AND path = $3",
                )
                .bind(job.tenant_id.as_str())
                .bind(job.run_id.as_str())
                .bind(&job.path)
                .execute(&mut **tx)
                .await?;
            }
            // A run's jobs (its parallel branches) each wait at their own path.
            let keys: Vec<[&str; 3]> = settled
                .iter()
                .filter(|job| !escalating.iter().any(|e| e.id == job.id))
                .map(|job| [job.tenant_id.as_str(), job.run_id.as_str(), job.path.as_str()])
                .chain(parking.iter().map(|(job, path, _)| {
                    [job.tenant_id.as_str(), job.run_id.as_str(), *path]
                }))
                .collect();
            sqlx::query(concat!(
                "DELETE FROM waits WHERE id IN (SELECT w.id FROM ", batch_rows!(1), "
                 JOIN waits w ON w.tenant_id = x.value ->> 0 AND w.run_id = x.value ->> 1
                    AND w.path = x.value ->> 2)"
            ))
            .bind(Json(&keys))
            .execute(&mut **tx)
            .await?;
            let mut took = false;
            for (job, path, wait) in on_runs {
                let on = park_on_runs(tx, job, path, wait).await?;
                took |= on.run_at.is_none();
                parked.insert(job.id.0, on);
            }
            if parking.is_empty() {
                if took && !notify_work!().is_empty() {
                    sqlx::query(notify_work!()).execute(&mut **tx).await?;
                }
                return Ok(parked);
            }
            // A wait takes its keys' locks (a condition: its ticket's).
            let keys = parking.iter().flat_map(|(job, _, wait)| match wait.is_condition() {
                true => vec![condition_lock(&job.tenant_id, wait.subject.as_deref().unwrap_or_default())],
                false => wait.keys().map(|key| key_lock(&job.tenant_id, key)).collect(),
            });
            lock_names(tx, keys.collect()).await?;
            let now = now_ms();
            for (job, path, wait) in parking {
                if wait.is_condition() {
                    // A condition looks at its ticket, not at the buffer.
                    if let Some(resume) = condition_holds_now(tx, &job.tenant_id, wait).await? {
                        took = true;
                        parked.insert(job.id.0, $crate::rows::Parked { run_at: None, resume });
                        continue;
                    }
                    insert_wait(tx, job, path, "condition", &wait.key, wait).await?;
                    let run_at = Some(wait.due_at.unwrap_or(NEVER_DUE_MS));
                    parked.insert(job.id.0, $crate::rows::Parked { run_at, resume: Resume::TimedOut });
                    continue;
                }
                // Parked again after its escalation: what came since the
                // wait began and resumed nothing was for it. A wait for
                // every one of several keys parked again on the keys still
                // missing says since when itself.
                // (The level's steps ran on a job of their own, or on the
                // wait's job claimed for the level's time, which parks it
                // again where it was.)
                let since = wait.since.or_else(|| job
                    .path
                    .strip_prefix(path)
                    .filter(|rest| {
                        rest.starts_with(".escalations.")
                            || (rest.is_empty() && job.resume.is_some())
                    })
                    .and_then(|_| {
                        let record = items.iter().find(|(j, _, _)| j.id == job.id)?;
                        let at: tok_core::path::FlowPath = path.parse().ok()?;
                        let context = tok_core::context::Context::from_shared(record.1.context.clone());
                        tok_core::escalation::began(&at, &context).map(|(since, _)| since)
                    }));
                // The first key (in the wait's order) with a signal in the
                // buffer resumes it.
                // From when the buffer counts: all of it with `lookback`,
                // else what came since the wait began (nothing when new).
                let from = match (wait.lookback, since) {
                    (true, _) => Some(None),
                    (false, since) => since.map(Some),
                };
                let mut taken = None;
                if let Some(from) = from {
                    for key in wait.keys() {
                        taken = take_buffered(tx, &job.tenant_id, &job.run_id, wait, key, from, now).await?;
                        if taken.is_some() {
                            break;
                        }
                    }
                }
                let Some(resume) = taken else {
                    // One row per key, all at the wait's path: a signal on
                    // any of them takes them all (`take_wait`).
                    for key in wait.keys() {
                        insert_wait(tx, job, path, "event", key, wait).await?;
                    }
                    let run_at = Some(wait.due_at.unwrap_or(NEVER_DUE_MS));
                    parked.insert(job.id.0, $crate::rows::Parked { run_at, resume: Resume::TimedOut });
                    continue;
                };
                took = true;
                parked.insert(job.id.0, $crate::rows::Parked { run_at: None, resume });
            }
            if took && !notify_work!().is_empty() {
                sqlx::query(notify_work!()).execute(&mut **tx).await?;
            }
            Ok(parked)
        }

        /// The waits of a run, for its detail.
        async fn waits_of(
            pool: &sqlx::Pool<$db>,
            tenant: &TenantId,
            run: &RunId,
        ) -> Result<Vec<WaitRow>> {
            let rows = sqlx::query(
                "SELECT path, kind, key, subject, due_at FROM waits
                 WHERE tenant_id = $1 AND run_id = $2 ORDER BY id",
            )
            .bind(tenant.as_str())
            .bind(run.as_str())
            .fetch_all(pool)
            .await?;
            Ok(rows
                .iter()
                .map(|r| WaitRow {
                    path: r.get("path"),
                    kind: r.get("kind"),
                    key: r.get::<Option<String>, _>("key").unwrap_or_default(),
                    subject: r.get("subject"),
                    due_at: r.get("due_at"),
                })
                .collect())
        }

        #[async_trait::async_trait]
        impl SignalStore for $store {
            async fn send_signal(&self, tenant: &TenantId, signal: NewSignal) -> Result<SignalSent> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let sent = send_signal_in(&mut tx, tenant, &signal).await?;
                tx.commit().await?;
                Ok(sent)
            }
        }
    };
}

pub(crate) use impl_signals;
