//! The inbox (`InboxStore::accept_event`, `start_run`): a repeated
//! idempotency key finds the first event within a day, webhooks sent
//! together share group commits and are each new or a duplicate once, a
//! manual start with a repeated key finds its first run, and an event that
//! cannot be stored is refused alone, its batch-mates accepted; group
//! commits holding the same duplicates in any order never deadlock.

use super::*;
use tok_store::{EventFilter, ReplayMode, Replayed};

backend_tests!(
    run_on_fresh_db;
    a_repeated_idempotency_key_finds_the_first_event_within_a_day,
    webhooks_sent_together_are_each_new_or_a_duplicate_once,
    a_manual_start_with_a_repeated_key_returns_the_first_run,
    an_event_with_nul_in_its_json_is_refused_and_its_batch_mates_are_accepted,
    an_event_the_database_refuses_fails_alone,
    a_key_repeated_across_a_partition_boundary_is_one_event,
    old_idempotency_keys_expire_and_recent_ones_stay,
    manual_starts_over_the_limit_are_refused_until_one_frees_up,
    refused_runs_are_written_without_a_job_and_are_no_starts,
    group_commits_of_the_same_duplicates_never_deadlock,
    an_events_traceparent_comes_back_to_its_dispatch,
    a_replay_if_no_runs_is_written_once_and_always_each_time,
);

/// A replay (`InboxStore::replay_event`) of an event that started no run:
/// `if_no_runs` writes one replay even when two are sent at once (the
/// other finds it pending), none once the family has a run, and `always`
/// one each time, each naming the first event; a filtered page takes the
/// source's events and not their replays; another tenant reaches none.
async fn a_replay_if_no_runs_is_written_once_and_always_each_time(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let other = tenant(store, "beta").await;
    let src = source(store, &t, "eshop").await;
    let tenants = [t.clone()];
    let (event, _) = store
        .accept_event(&t, webhook_event(&src, "before-its-automation"))
        .await
        .expect("accept");
    assert_eq!(
        store
            .replay_event(&t, &event, ReplayMode::IfNoRuns)
            .await
            .unwrap(),
        Some(Replayed::Pending(event.clone())),
        "{backend:?}: the dispatcher has not taken it yet"
    );
    dispatch(store, &tenants, 10, &one_run_per_candidate)
        .await
        .expect("dispatch");
    assert!(all_runs(store, &t).await.is_empty(), "{backend:?}");
    webhook_automation(store, &t, "orders", &src).await;

    let (a, b) = tokio::join!(
        store.replay_event(&t, &event, ReplayMode::IfNoRuns),
        store.replay_event(&t, &event, ReplayMode::IfNoRuns),
    );
    let (replay, pending) = match (a.unwrap().unwrap(), b.unwrap().unwrap()) {
        (Replayed::Accepted(r), Replayed::Pending(p))
        | (Replayed::Pending(p), Replayed::Accepted(r)) => (r, p),
        other => panic!("{backend:?}: one replay written and one pending, not {other:?}"),
    };
    assert_eq!(pending, replay, "{backend:?}");
    let written = store.event(&t, &replay).await.unwrap().expect("the replay");
    assert_eq!(
        (
            written.replay_of.as_ref(),
            written.source_id.as_ref(),
            written.status.as_str()
        ),
        (Some(&event), Some(&src), "pending"),
        "{backend:?}"
    );
    dispatch(store, &tenants, 10, &one_run_per_candidate)
        .await
        .expect("dispatch");
    let runs = all_runs(store, &t).await;
    assert_eq!(runs.len(), 1, "{backend:?}");
    assert_eq!(runs[0].event_id, replay, "{backend:?}");
    for member in [&event, &replay] {
        assert_eq!(
            store
                .replay_event(&t, member, ReplayMode::IfNoRuns)
                .await
                .unwrap(),
            Some(Replayed::HasRuns(vec![runs[0].id.clone()])),
            "{backend:?}: replaying {member}"
        );
    }
    let Some(Replayed::Accepted(again)) = store
        .replay_event(&t, &replay, ReplayMode::Always)
        .await
        .unwrap()
    else {
        panic!("{backend:?}: `always` writes a replay");
    };
    let again = store
        .event(&t, &again)
        .await
        .unwrap()
        .expect("the second replay");
    assert_eq!(
        again.replay_of,
        Some(event.clone()),
        "{backend:?}: named after the first"
    );

    let filter = EventFilter {
        source_id: Some(src.clone()),
        ..EventFilter::default()
    };
    let page = store.events(&t, &filter, 10, None).await.unwrap();
    let listed: Vec<_> = page.items.iter().map(|e| e.id.clone()).collect();
    assert_eq!(
        listed,
        std::slice::from_ref(&event),
        "{backend:?}: replays are not listed"
    );
    assert_eq!(
        store.count_events(&t, &filter).await.unwrap(),
        1,
        "{backend:?}"
    );

    assert_eq!(
        store.event(&other, &event).await.unwrap().map(|e| e.id),
        None
    );
    assert_eq!(
        store
            .replay_event(&other, &event, ReplayMode::Always)
            .await
            .unwrap(),
        None,
        "{backend:?}: another tenant's event"
    );
    assert_eq!(
        store
            .count_events(&other, &EventFilter::default())
            .await
            .unwrap(),
        0
    );
}

/// The trace context a webhook was sent with is kept with its event, alone
/// or in a group commit, and read back by the dispatch that starts its
/// runs; an event sent without one has none.
async fn an_events_traceparent_comes_back_to_its_dispatch(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let shop = source(&*store, &t, "shop").await;
    let traced = |key: &str, n: u32| NewEvent {
        traceparent: Some(format!(
            "00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01"
        )),
        ..webhook_event(&shop, key)
    };
    store.accept_event(&t, traced("alone", 1)).await.unwrap();
    store
        .accept_event(&t, webhook_event(&shop, "untraced"))
        .await
        .unwrap();
    let together = (2..8)
        .map(|n| (t.clone(), traced(&format!("together-{n}"), n)))
        .collect();
    for answer in accept_together(&store, together).await {
        answer.expect("accepted");
    }
    let mut tx = store
        .begin_dispatch(std::slice::from_ref(&t), Lane::Bulk)
        .await
        .expect("begin");
    let events = tx.pending_events(100).await.expect("select");
    assert_eq!(events.len(), 8, "{backend:?}");
    for event in &events {
        let key = event.payload["key"].as_str().unwrap();
        let wanted = match key {
            "alone" => Some(1),
            "untraced" => None,
            _ => Some(key.trim_start_matches("together-").parse::<u32>().unwrap()),
        }
        .map(|n| format!("00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01"));
        assert_eq!(event.traceparent, wanted, "{backend:?}: event {key}");
    }
}

/// On PostgreSQL the inbox is kept in monthly partitions, and no unique
/// index spans two of them: here the current month is split so that the
/// first event is in one partition and its retry lands in the next, as at
/// midnight on a month's last day. The retry is still the first event.
async fn a_key_repeated_across_a_partition_boundary_is_one_event(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let eshop = source(&*store, &t, "eshop").await;
    let (first, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k-boundary"))
        .await
        .unwrap();
    assert!(!accepted.duplicate);
    if backend == Backend::Postgres {
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let (partition, start, end): (String, i64, i64) = sqlx::query_as(
            "SELECT c.relname::text, e.received_at,
                    (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \\(''?(\\d+)'))[1]::bigint
               FROM event_inbox e JOIN pg_class c ON c.oid = e.tableoid WHERE e.id = $1",
        )
        .bind(first.as_str())
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let (boundary, month_start): (i64, i64) = (start + 1, month_start_of(start));
        for sql in [
            format!("ALTER TABLE event_inbox DETACH PARTITION {partition}"),
            format!(
                "ALTER TABLE event_inbox ATTACH PARTITION {partition}
                 FOR VALUES FROM ({month_start}) TO ({boundary})"
            ),
            format!(
                "CREATE TABLE event_inbox_after PARTITION OF event_inbox
                 FOR VALUES FROM ({boundary}) TO ({end})"
            ),
        ] {
            sqlx::raw_sql(&sql).execute(&mut conn).await.expect(&sql);
        }
        conn.close().await.unwrap();
    }
    let (again, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k-boundary"))
        .await
        .unwrap();
    assert_eq!(
        (again, accepted.duplicate),
        (first.clone(), true),
        "{backend:?}"
    );
    // A new key after the boundary is written to the next partition.
    let (other, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k-after"))
        .await
        .unwrap();
    assert!(!accepted.duplicate);
    if backend == Backend::Postgres {
        let sql = format!(
            "UPDATE event_inbox_after SET status = status WHERE id IN ('{first}', '{other}')"
        );
        assert_eq!(
            raw_sql(db, &sql).await,
            1,
            "only the new event is after the boundary"
        );
    }
    let stats = store.queue_stats(std::slice::from_ref(&t)).await.unwrap();
    assert_eq!(
        stats.pending_events, 2,
        "{backend:?}: the retry wrote no row"
    );
}

fn month_start_of(ms: i64) -> i64 {
    jiff::Timestamp::from_millisecond(ms)
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .first_of_month()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .unwrap()
        .timestamp()
        .as_millisecond()
}

/// The expiry deletes idempotency keys older than the window (a day):
/// they no longer deduplicate anything; keys within it stay.
async fn old_idempotency_keys_expire_and_recent_ones_stay(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let eshop = source(&*store, &t, "eshop").await;
    let theirs = source(&*store, &other, "eshop").await;
    let (old, _) = store
        .accept_event(&t, webhook_event(&eshop, "old"))
        .await
        .unwrap();
    store
        .accept_event(&t, webhook_event(&eshop, "new"))
        .await
        .unwrap();
    let (their_old, _) = store
        .accept_event(&other, webhook_event(&theirs, "old"))
        .await
        .unwrap();
    let two_days = 2 * 24 * 60 * 60 * 1000;
    let sql = format!(
        "UPDATE event_keys SET received_at = received_at - {two_days}
         WHERE event_id IN ('{old}', '{their_old}')"
    );
    assert_eq!(raw_sql(db, &sql).await, 2);
    let before = tok_store::now_ms() - 24 * 60 * 60 * 1000;
    assert_eq!(store.expire_keys(&t, before, 10).await.unwrap(), 1);
    assert_eq!(store.expire_keys(&t, before, 10).await.unwrap(), 0);
    let left = raw_sql(db, "UPDATE event_keys SET received_at = received_at").await;
    assert_eq!(
        left, 2,
        "t's recent key and the other tenant's old one stay"
    );
    // The expired key is a new event now.
    let (again, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "old"))
        .await
        .unwrap();
    assert!(!accepted.duplicate);
    assert_ne!(again, old);
}

async fn manual_starts_over_the_limit_are_refused_until_one_frees_up(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let a = manual_automation(&*store, &t, "a").await;
    let b = manual_automation(&*store, &t, "b").await;
    let limited = |aut: &AutomationId, key: Option<&str>| {
        let mut run = new_run(aut, "manual", None);
        run.idempotency_key = key.map(str::to_owned);
        store.start_run_limited(&t, manual_event(aut), run, Some(2))
    };
    let first = match limited(&a, Some("k1")).await.unwrap() {
        tok_store::Started::Run(id) => id,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        limited(&a, None).await.unwrap(),
        tok_store::Started::Run(_)
    ));
    match limited(&a, None).await.unwrap() {
        tok_store::Started::Limited { retry_after_ms } => assert!(
            (1..=60_000).contains(&retry_after_ms),
            "a start frees up within the minute: {retry_after_ms}"
        ),
        other => panic!("the third start in a minute: {other:?}"),
    }
    assert_eq!(
        limited(&a, Some("k1")).await.unwrap(),
        tok_store::Started::Run(first),
        "a repeated key answers its run, over the limit or not"
    );
    assert!(
        matches!(limited(&b, None).await.unwrap(), tok_store::Started::Run(_)),
        "another automation's starts are its own"
    );
    let listed = store
        .runs(&t, &RunFilter::default(), 10, None)
        .await
        .unwrap()
        .items;
    assert_eq!(listed.len(), 3, "nothing was written for the refused start");
}

async fn refused_runs_are_written_without_a_job_and_are_no_starts(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let a = manual_automation(&*store, &t, "a").await;
    let mut refused = new_run(&a, "manual", None);
    refused.refused = Some("start_rate_exceeded: over the limit".into());
    let id = store
        .start_run(&t, manual_event(&a), refused)
        .await
        .unwrap();
    let run = store.run(&t, &id).await.unwrap().unwrap();
    assert_eq!(run.run.status, "refused");
    assert_eq!(
        run.run.error.as_deref(),
        Some("start_rate_exceeded: over the limit")
    );
    assert!(run.run.finished_at.is_some());
    assert!(
        store
            .claim(std::slice::from_ref(&t), "n", 10, LONG_LEASE_MS)
            .await
            .unwrap()
            .is_empty(),
        "a refused run has no job"
    );
    assert!(
        matches!(
            store
                .start_run_limited(&t, manual_event(&a), new_run(&a, "manual", None), Some(1))
                .await
                .unwrap(),
            tok_store::Started::Run(_)
        ),
        "a refused run is no start"
    );
}

async fn a_repeated_idempotency_key_finds_the_first_event_within_a_day(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let eshop = source(store, &t, "eshop").await;
    let converter = source(store, &t, "converter").await;

    let (first, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k1"))
        .await
        .unwrap();
    assert!(!accepted.duplicate, "{backend:?}");
    let (again, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k1"))
        .await
        .unwrap();
    assert_eq!(
        (again.clone(), accepted.duplicate),
        (first.clone(), true),
        "{backend:?}"
    );

    let (other_key, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k2"))
        .await
        .unwrap();
    assert!(
        !accepted.duplicate && other_key != first,
        "{backend:?}: a new key is a new event"
    );
    let (other_source, accepted) = store
        .accept_event(&t, webhook_event(&converter, "k1"))
        .await
        .unwrap();
    assert!(
        !accepted.duplicate,
        "{backend:?}: the key belongs to its source"
    );
    assert!(
        other_source != first && other_source != other_key,
        "{backend:?}"
    );
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!(
        stats.pending_events, 3,
        "{backend:?}: the duplicate wrote no row"
    );

    // A day and an hour later, the same key is a new event (and is itself
    // deduplicated from then on).
    let day_and_hour = 25 * 60 * 60 * 1000;
    let sql = format!(
        "UPDATE event_inbox SET received_at = received_at - {day_and_hour} WHERE id = '{first}'"
    );
    assert_eq!(raw_sql(db, &sql).await, 1, "{backend:?}");
    let sql = format!(
        "UPDATE event_keys SET received_at = received_at - {day_and_hour} WHERE event_id = '{first}'"
    );
    assert_eq!(raw_sql(db, &sql).await, 1, "{backend:?}");
    let (late, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k1"))
        .await
        .unwrap();
    assert!(!accepted.duplicate, "{backend:?}: outside the window");
    assert_ne!(late, first, "{backend:?}");
    let (late_again, accepted) = store
        .accept_event(&t, webhook_event(&eshop, "k1"))
        .await
        .unwrap();
    assert_eq!(
        (late_again, accepted.duplicate),
        (late, true),
        "{backend:?}"
    );
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!(
        stats.pending_events, 4,
        "{backend:?}: the old event is kept"
    );
}

/// Webhooks sent at once share group commits, where new keys, keys already
/// taken, and one new key sent ten times in the same moment mix.
async fn webhooks_sent_together_are_each_new_or_a_duplicate_once(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let eshop = source(&*store, &t, "eshop").await;
    let mut first = std::collections::HashMap::new();
    for key in ["old-1", "old-2", "old-3"] {
        let (id, _) = store
            .accept_event(&t, webhook_event(&eshop, key))
            .await
            .unwrap();
        first.insert(key.to_string(), id);
    }

    let keys: Vec<String> = (0..30)
        .map(|i| match i % 3 {
            0 => format!("old-{}", i % 9 / 3 + 1),
            1 => format!("new-{i}"),
            _ => "repeated".to_string(),
        })
        .collect();
    let sent: Vec<_> = keys
        .iter()
        .map(|key| {
            let (store, t, event) = (store.clone(), t.clone(), webhook_event(&eshop, key));
            tokio::spawn(async move { store.accept_event(&t, event).await })
        })
        .collect();
    let mut new_by_key: std::collections::HashMap<String, Vec<_>> = Default::default();
    let mut ids_by_key: std::collections::HashMap<String, std::collections::HashSet<_>> =
        Default::default();
    for (key, sent) in keys.iter().zip(sent) {
        let (id, accepted) = sent.await.unwrap().expect("accepted");
        if !accepted.duplicate {
            new_by_key.entry(key.clone()).or_default().push(id.clone());
        }
        ids_by_key.entry(key.clone()).or_default().insert(id);
    }
    for (key, ids) in &ids_by_key {
        assert_eq!(
            ids.len(),
            1,
            "{backend:?}: every webhook with {key} names one event"
        );
        match first.get(key) {
            Some(id) => {
                assert!(ids.contains(id), "{backend:?}: {key} finds its first event");
                assert!(
                    !new_by_key.contains_key(key),
                    "{backend:?}: {key} was taken before"
                );
            }
            None => assert_eq!(
                new_by_key.get(key).map(Vec::len),
                Some(1),
                "{backend:?}: {key} is new exactly once"
            ),
        }
    }
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!(
        stats.pending_events,
        3 + 10 + 1,
        "{backend:?}: one row per key"
    );
}

async fn a_manual_start_with_a_repeated_key_returns_the_first_run(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let other = manual_automation(store, &t, "b").await;
    let keyed = |aut: &AutomationId| NewRun {
        subject_ticket_id: None,
        idempotency_key: Some("order-5001".into()),
        ..new_run(aut, "manual", None)
    };

    let first = store
        .start_run(&t, manual_event(&aut), keyed(&aut))
        .await
        .unwrap();
    let again = store
        .start_run(&t, manual_event(&aut), keyed(&aut))
        .await
        .unwrap();
    assert_eq!(again, first, "{backend:?}");
    let elsewhere = store
        .start_run(&t, manual_event(&other), keyed(&other))
        .await
        .unwrap();
    assert_ne!(elsewhere, first, "{backend:?}: the key is per automation");
    assert_eq!(all_runs(store, &t).await.len(), 2, "{backend:?}");
    let stats = store.queue_stats(std::slice::from_ref(&t)).await.unwrap();
    assert_eq!(stats.ready, 2, "{backend:?}: one job per run");

    // A run of an empty tree completes at once and leaves no job.
    let empty = NewRun {
        subject_ticket_id: None,
        first_path: None,
        ..new_run(&aut, "manual", None)
    };
    let empty = store
        .start_run(&t, manual_event(&aut), empty)
        .await
        .unwrap();
    let detail = store.run(&t, &empty).await.unwrap().expect("run exists");
    assert_eq!(detail.run.status, "completed", "{backend:?}");
    assert!(detail.run.finished_at.is_some(), "{backend:?}");
    let stats = store.queue_stats(std::slice::from_ref(&t)).await.unwrap();
    assert_eq!(stats.ready, 2, "{backend:?}");
}

/// Group commits lock the key of every duplicate they hold (the key's row,
/// even though it stays as it is). Sixteen senders send the same twenty
/// keys again, each in its own order, so that the batches in flight at once
/// hold the same duplicates in different places: every answer names the
/// first event, and on PostgreSQL the database saw no deadlock (a batch
/// failed by one is written again, so the answers alone would not show it;
/// the 1,000,000-case fuzz run once saw it surface as a 503).
async fn group_commits_of_the_same_duplicates_never_deadlock(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let eshop = source(&*store, &t, "eshop").await;
    let mut first = std::collections::HashMap::new();
    for k in 0..20 {
        let key = format!("dup-{k}");
        let (id, _) = store
            .accept_event(&t, webhook_event(&eshop, &key))
            .await
            .unwrap();
        first.insert(key, id);
    }
    let first = Arc::new(first);

    let senders: Vec<_> = (0..16_u64)
        .map(|sender| {
            let (store, t, eshop, first) = (store.clone(), t.clone(), eshop.clone(), first.clone());
            tokio::spawn(async move {
                let mut dice = sender * 7_919 + 1;
                for _ in 0..60 {
                    dice = dice
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let key = format!("dup-{}", (dice >> 33) % 20);
                    let (id, accepted) = store
                        .accept_event(&t, webhook_event(&eshop, &key))
                        .await
                        .unwrap_or_else(|e| panic!("{backend:?}: {key} was not accepted: {e}"));
                    assert!(accepted.duplicate, "{backend:?}: {key} is a duplicate");
                    assert_eq!(id, first[&key], "{backend:?}: {key} names its first event");
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.expect("sender");
    }

    if backend == Backend::Postgres {
        // A backend reports its statistics when it ends: end the store's.
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        for _ in 0..100 {
            let (left,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .fetch_one(&mut conn)
            .await
            .unwrap();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (deadlocks,): (i64,) = sqlx::query_as(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(deadlocks, 0, "{backend:?}: group commits deadlocked");
    }
}

/// Sends `events` at once (so that they share group commits) and returns
/// each answer, in order.
async fn accept_together(
    store: &Arc<dyn Store>,
    events: Vec<(TenantId, NewEvent)>,
) -> Vec<tok_store::Result<(EventId, tok_store::Accepted)>> {
    let sent: Vec<_> = events
        .into_iter()
        .map(|(t, event)| {
            let store = store.clone();
            tokio::spawn(async move { store.accept_event(&t, event).await })
        })
        .collect();
    let mut answers = Vec::new();
    for sent in sent {
        answers.push(sent.await.expect("accept task"));
    }
    answers
}

/// Three tenants' webhooks, twenty each, with `bad` among them (in the
/// middle of the second tenant's); returns the tenants and the events.
async fn many_webhooks(
    store: &dyn Store,
    bad: impl Fn(&SourceId) -> NewEvent,
) -> (Vec<TenantId>, Vec<(TenantId, NewEvent)>) {
    let mut tenants = Vec::new();
    let mut events = Vec::new();
    for name in ["acme", "globex", "initech"] {
        let t = tenant(store, name).await;
        let src = source(store, &t, "shop").await;
        for i in 0..20 {
            if name == "globex" && i == 10 {
                events.push((t.clone(), bad(&src)));
            }
            events.push((t.clone(), webhook_event(&src, &format!("{name}-{i}"))));
        }
        tenants.push(t);
    }
    (tenants, events)
}

async fn an_event_with_nul_in_its_json_is_refused_and_its_batch_mates_are_accepted(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let (tenants, events) = many_webhooks(&*store, |src| NewEvent {
        payload: json!({ "customer": { "name": "Ann\u{0}" } }),
        ..webhook_event(src, "with-nul")
    })
    .await;
    let answers = accept_together(&store, events).await;
    let mut refused = Vec::new();
    for answer in answers {
        match answer {
            Ok((_, accepted)) => assert!(!accepted.duplicate, "{backend:?}"),
            Err(e) => refused.push(e),
        }
    }
    assert_eq!(refused.len(), 1, "{backend:?}: {refused:?}");
    match &refused[0] {
        StoreError::Refused(message) => {
            assert!(
                message.contains("U+0000") && message.contains("/customer/name"),
                "{backend:?}: the refusal says what and where: {message}"
            );
        }
        other => panic!("{backend:?}: refused as {other:?}"),
    }
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(
        stats.pending_events, 60,
        "{backend:?}: every other webhook is in the inbox, and not the refused one"
    );
    // A manual start with such input is refused alike.
    let aut = manual_automation(&*store, &tenants[0], "by hand").await;
    let err = store
        .start_run(
            &tenants[0],
            NewEvent {
                payload: json!({ "note": "\u{0}" }),
                ..manual_event(&aut)
            },
            new_run(&aut, "manual", None),
        )
        .await
        .expect_err("a start with U+0000 in its input");
    assert!(
        matches!(&err, StoreError::Refused(m) if m.contains("/note")),
        "{backend:?}: {err:?}"
    );
}

async fn an_event_the_database_refuses_fails_alone(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    refuse_poison(db, "event_inbox", "idempotency_key").await;
    let (tenants, events) = many_webhooks(&*store, |src| webhook_event(src, "poison")).await;
    let answers = accept_together(&store, events).await;
    let refused: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
    assert_eq!(refused.len(), 1, "{backend:?}: {refused:?}");
    assert!(
        matches!(refused[0], Err(StoreError::Refused(m)) if m.contains("refused to store this event")),
        "{backend:?}: {:?}",
        refused[0]
    );
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(stats.pending_events, 60, "{backend:?}");
}
