//! Retention, run by the scheduler with a driven clock on both backends: a
//! month of old rows (runs, steps, ticket log, events of two tenants) goes
//! by each tenant's retention — on PostgreSQL the monthly partitions
//! nobody keeps are dropped and the one a tenant with a longer retention
//! still needs stays, emptied of the other tenant's rows; on SQLite the
//! file's page count falls; the queue's samples go after a day. Rows in PostgreSQL's default partition are
//! moved into a partition of their month; a month that cannot be moved is
//! raised once and not tried again. The audit log goes by each tenant's
//! `auditDays`, and the platform's own rows by their own 365 days: a month
//! holding one is not dropped before it.

use std::sync::Arc;

use tok_core::ids::TenantId;
use tok_core::retention::{DAY_MS, Retention};
use tok_engine::scheduler::{ManualClock, Scheduler, SchedulerConfig};
use tok_store::testing::{TestDb, run_on_fresh_db};
use tok_store::{Backend, Store, backend_tests, now_ms};

backend_tests!(
    run_on_fresh_db;
    a_month_of_old_rows_expires_by_each_tenants_retention,
    rows_in_the_default_partition_move_to_a_month_of_their_own,
    the_audit_log_expires_by_each_tenants_audit_days,
);

/// The test's own connection, for what the API cannot do on purpose:
/// writing rows dated months ago.
enum Raw {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Raw {
    async fn open(db: &TestDb) -> Raw {
        match db.backend {
            Backend::Sqlite => Raw::Sqlite(sqlx::SqlitePool::connect(&db.url).await.unwrap()),
            Backend::Postgres => Raw::Postgres(sqlx::PgPool::connect(&db.url).await.unwrap()),
        }
    }

    async fn exec(&self, sql: &str) {
        match self {
            Raw::Sqlite(pool) => sqlx::raw_sql(sql).execute(pool).await.map(|_| ()),
            Raw::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(|_| ()),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn number(&self, sql: &str) -> i64 {
        match self {
            Raw::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Raw::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn count(&self, table: &str, tenant: &TenantId) -> i64 {
        self.number(&format!(
            "SELECT COUNT(*) FROM {table} WHERE tenant_id = '{tenant}'"
        ))
        .await
    }

    async fn partitions(&self, table: &str) -> Vec<String> {
        let Raw::Postgres(pool) = self else {
            return Vec::new();
        };
        sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = $1 ORDER BY 1",
        )
        .bind(table)
        .fetch_all(pool)
        .await
        .unwrap()
    }
}

/// One day's rows of a tenant at `at`: a finished run with 10 steps of
/// 2 kB each, a ticket log line and a dispatched event.
fn day(tenant: &TenantId, n: usize, at: i64) -> String {
    let run = format!("run_{tenant}_{n}");
    let body = "x".repeat(2000);
    let steps: Vec<String> = (0..10)
        .map(|i| {
            format!(
                "('{run}', '{tenant}', '{i}', 's{i}', 'http', 1, 'completed', '{{}}', \
                 '{{\"body\": \"{body}\"}}', {at}, {at}, {at})"
            )
        })
        .collect();
    format!(
        "INSERT INTO runs (id, tenant_id, automation_id, version, event_id, trigger_type, status,
             context, created_at, started_at, finished_at)
         VALUES ('{run}', '{tenant}', 'aut_x', 1, 'evt_{run}', 'manual', 'completed', '{{}}',
             {at}, {at}, {at});
         INSERT INTO run_steps (run_id, tenant_id, path, step_id, type, attempt, status, input,
             output, started_at, finished_at, created_at) VALUES {};
         INSERT INTO ticket_trace (tenant_id, ticket_id, at, kind, message)
         VALUES ('{tenant}', 'tkt_1', {at}, 'note', 'a line');
         INSERT INTO event_inbox (id, tenant_id, source_kind, idempotency_key, payload,
             received_at, status, dispatched_at)
         VALUES ('evt_{run}', '{tenant}', 'webhook', 'k_{run}', '{{}}', {at}, 'dispatched', {at});",
        steps.join(", ")
    )
}

async fn tenant(store: &dyn Store, name: &str) -> TenantId {
    let key = tok_store::hash_secret(&tok_store::random_token());
    store.create_tenant(name, &key).await.unwrap().id
}

async fn a_month_of_old_rows_expires_by_each_tenants_retention(db: &TestDb) {
    let store: Arc<dyn Store> = db.store().await;
    let raw = Raw::open(db).await;
    let now = now_ms();
    let short = tenant(&*store, "short").await;
    let long = tenant(&*store, "long").await;
    // `short` keeps the defaults but runs for 100 days; `long` keeps step
    // data 200 days.
    let short_retention = Retention {
        runs_days: 100,
        ..Retention::default()
    };
    let long_retention = Retention {
        step_data_days: 200,
        ..Retention::default()
    };
    assert!(store.set_retention(&short, &short_retention).await.unwrap());
    assert!(store.set_retention(&long, &long_retention).await.unwrap());
    assert_eq!(store.retention(&long).await.unwrap(), Some(long_retention));

    // A month of rows 160 to 132 days ago, in monthly partitions of their
    // own on PostgreSQL, and one row of each a day ago.
    let first = now - 160 * DAY_MS;
    assert!(
        store
            .create_partitions(first, 2, &[])
            .await
            .unwrap()
            .is_empty()
    );
    for n in 0..28 {
        let at = first + n as i64 * DAY_MS;
        raw.exec(&day(&short, n, at)).await;
        raw.exec(&day(&long, n, at)).await;
    }
    // An event of `long` from then still pending: it never expires.
    raw.exec(&format!(
        "INSERT INTO event_inbox (id, tenant_id, source_kind, idempotency_key, payload,
             received_at, status)
         VALUES ('evt_pending', '{long}', 'webhook', 'k_pending', '{{}}', {first}, 'pending')"
    ))
    .await;
    raw.exec(&day(&short, 100, now - DAY_MS)).await;
    raw.exec(&day(&long, 100, now - DAY_MS)).await;
    // Past `short`'s 30 days of step data, but in the month its cutoff
    // falls in: PostgreSQL expires partitioned data by whole months.
    let cutoff_month = jiff::Timestamp::from_millisecond(now - 30 * DAY_MS)
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .first_of_month()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .unwrap()
        .timestamp()
        .as_millisecond();
    raw.exec(&day(&short, 200, cutoff_month + 1)).await;
    let old_months = |table: &str| {
        let table = table.to_owned();
        (0..6).map(move |m| {
            let month = jiff::Timestamp::from_millisecond(first + m * 5 * DAY_MS)
                .unwrap()
                .to_zoned(jiff::tz::TimeZone::UTC);
            format!("{table}_{:04}_{:02}", month.year(), month.month())
        })
    };
    let old_trace: std::collections::BTreeSet<String> = old_months("ticket_trace").collect();
    let old_inbox: std::collections::BTreeSet<String> = old_months("event_inbox").collect();
    let old_steps: std::collections::BTreeSet<String> = old_months("run_steps").collect();
    if db.backend == Backend::Postgres {
        let trace = raw.partitions("ticket_trace").await;
        assert!(old_trace.iter().all(|p| trace.contains(p)), "{trace:?}");
    }
    let pages_before = match db.backend {
        Backend::Sqlite => raw.number("PRAGMA page_count").await,
        Backend::Postgres => 0,
    };

    let clock = Arc::new(ManualClock::at(now));
    let config = SchedulerConfig {
        expiry_batch: 50,
        ..SchedulerConfig::default()
    };
    let scheduler = Scheduler::new(store.clone(), "n1", config, clock.clone());
    // The queue's samples of two days ago and of now: kept a day, whatever
    // the tenant's retention.
    let both = [short.clone(), long.clone()];
    clock.set(now - 2 * DAY_MS);
    assert_eq!(scheduler.sample_queues(&both).await.unwrap(), 2);
    clock.set(now);
    assert_eq!(scheduler.sample_queues(&both).await.unwrap(), 2);
    let report = scheduler
        .expire(&[short.clone(), long.clone()])
        .await
        .unwrap();
    assert!(!report.more, "{report:?}");
    assert_eq!(report.deleted("queue_samples"), 2);
    for tenant in &both {
        let kept = store.queue_samples(tenant, 0, 10).await.unwrap();
        assert_eq!(kept.iter().map(|s| s.at).collect::<Vec<_>>(), [now]);
    }

    // Step data: `short`'s 30 days took its old steps (on PostgreSQL by
    // whole months: the month its cutoff falls in stays); `long` keeps 200.
    let cutoff_month_steps = match db.backend {
        Backend::Postgres => 10,
        Backend::Sqlite => 0,
    };
    assert_eq!(
        raw.count("run_steps", &short).await,
        10 + cutoff_month_steps
    );
    assert_eq!(raw.count("run_steps", &long).await, 29 * 10);
    // Runs: `short` keeps 100 days, `long` a year.
    assert_eq!(raw.count("runs", &short).await, 2);
    assert_eq!(raw.count("runs", &long).await, 29);
    // The ticket log (90 days) and events (30 days) of both.
    assert_eq!(raw.count("ticket_trace", &short).await, 2);
    assert_eq!(raw.count("ticket_trace", &long).await, 1);
    // Events by whole months on PostgreSQL too: `short`'s event in the
    // month its cutoff falls in stays there.
    assert_eq!(
        raw.count("event_inbox", &short).await,
        1 + cutoff_month_steps / 10
    );
    assert_eq!(
        raw.count("event_inbox", &long).await,
        2,
        "the pending one stays"
    );

    match db.backend {
        Backend::Postgres => {
            // The old ticket-log months went whole; the old step months
            // stay for `long`, emptied of `short`'s rows by batches.
            let trace = raw.partitions("ticket_trace").await;
            assert!(old_trace.iter().all(|p| !trace.contains(p)), "{trace:?}");
            assert!(old_trace.iter().all(|p| report.dropped.contains(p)));
            // So did the old inbox months, but the one with a pending
            // event: it stays, emptied of the dispatched ones by batches.
            let pending_month = old_months("event_inbox").next().unwrap();
            let inbox = raw.partitions("event_inbox").await;
            assert!(inbox.contains(&pending_month), "{inbox:?}");
            assert!(
                old_inbox
                    .iter()
                    .filter(|p| **p != pending_month)
                    .all(|p| !inbox.contains(p) && report.dropped.contains(p)),
                "{inbox:?}"
            );
            assert!(report.deleted("event_inbox") > 0);
            let steps = raw.partitions("run_steps").await;
            assert!(old_steps.iter().all(|p| steps.contains(p)), "{steps:?}");
            assert_eq!(report.deleted("run_steps"), 28 * 10);
            assert_eq!(report.deleted("ticket_trace"), 0, "dropped, not deleted");
            assert_eq!(report.pages, None);
        }
        Backend::Sqlite => {
            assert_eq!(report.deleted("run_steps"), 29 * 10);
            assert_eq!(report.deleted("ticket_trace"), 2 * 28);
            let pages_after = raw.number("PRAGMA page_count").await;
            assert!(
                pages_after < pages_before,
                "the file gave pages back: {pages_before} -> {pages_after}"
            );
            assert_eq!(report.pages, Some(pages_after));
        }
    }

    // Nothing is left to expire: a second pass deletes nothing.
    let again = scheduler
        .expire(&[short.clone(), long.clone()])
        .await
        .unwrap();
    assert!(again.deleted.values().all(|n| *n == 0), "{again:?}");
    assert!(again.dropped.is_empty());
}

/// A row of a month whose partition is missing goes to the default
/// partition. A scheduler allowed to move no rows at once raises the month
/// once and does not try again; after a restart with the default bound the
/// expiry moves the row into a partition of its month, and it reads as
/// before.
async fn rows_in_the_default_partition_move_to_a_month_of_their_own(db: &TestDb) {
    let store: Arc<dyn Store> = db.store().await;
    let raw = Raw::open(db).await;
    let t = tenant(&*store, "acme").await;
    let now = now_ms();
    // The month after next, as PostgreSQL's migration made it; its
    // partition is gone and a row of that month went to the default one
    // (a clock that ran ahead of the partitions).
    let ahead = jiff::Timestamp::from_millisecond(now)
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .first_of_month()
        .checked_add(jiff::ToSpan::months(2))
        .unwrap();
    let partition = format!("ticket_trace_{:04}_{:02}", ahead.year(), ahead.month());
    let at = ahead
        .to_zoned(jiff::tz::TimeZone::UTC)
        .unwrap()
        .timestamp()
        .as_millisecond()
        + DAY_MS;
    if db.backend == Backend::Postgres {
        raw.exec(&format!("DROP TABLE {partition}")).await;
    }
    raw.exec(&format!(
        "INSERT INTO ticket_trace (tenant_id, ticket_id, at, kind, message)
         VALUES ('{t}', 'tkt_1', {at}, 'note', 'from the future')"
    ))
    .await;

    let clock = Arc::new(ManualClock::at(now));
    let bounded = SchedulerConfig {
        partition_move_rows: 0,
        ..SchedulerConfig::default()
    };
    let scheduler = Scheduler::new(store.clone(), "n1", bounded, clock.clone());
    let first = scheduler.expire(std::slice::from_ref(&t)).await.unwrap();
    let incidents = store
        .platform_incidents(Some("open"), 100, None)
        .await
        .unwrap()
        .items;
    match db.backend {
        Backend::Postgres => {
            let problems: Vec<_> = first.problems.iter().map(|p| &p.partition).collect();
            assert_eq!(problems, [&partition]);
            assert!(
                first.problems[0].error.contains("more than the 0 moved"),
                "{}",
                first.problems[0].error
            );
            assert_eq!(incidents.len(), 1, "{incidents:?}");
            assert_eq!(incidents[0].reason, "partition_not_created");
            assert!(
                incidents[0].title.contains(&partition),
                "{}",
                incidents[0].title
            );
            assert_eq!(
                raw.number("SELECT COUNT(*) FROM ticket_trace_default")
                    .await,
                1
            );
        }
        Backend::Sqlite => {
            assert!(first.problems.is_empty());
            assert!(first.moved.is_empty());
            assert!(incidents.is_empty());
        }
    }
    // Not tried again by this process; the row stays where it is and is readable.
    let second = scheduler.expire(std::slice::from_ref(&t)).await.unwrap();
    assert!(second.problems.is_empty(), "{second:?}");
    assert!(second.moved.is_empty(), "{second:?}");
    assert_eq!(raw.count("ticket_trace", &t).await, 1);

    // Restarted with the default bound: the row moves to its month.
    let restarted = Scheduler::new(store.clone(), "n1", SchedulerConfig::default(), clock);
    let third = restarted.expire(std::slice::from_ref(&t)).await.unwrap();
    assert!(third.problems.is_empty(), "{third:?}");
    assert_eq!(raw.count("ticket_trace", &t).await, 1);
    if db.backend == Backend::Postgres {
        let moved: Vec<_> = third
            .moved
            .iter()
            .map(|m| (m.partition.as_str(), m.rows))
            .collect();
        assert_eq!(moved, [(partition.as_str(), 1)]);
        assert!(raw.partitions("ticket_trace").await.contains(&partition));
        assert_eq!(
            raw.number(&format!("SELECT COUNT(*) FROM {partition}"))
                .await,
            1
        );
        assert_eq!(
            raw.number("SELECT COUNT(*) FROM ticket_trace_default")
                .await,
            0
        );
        // New rows of that month go to its partition from now on.
        raw.exec(&format!(
            "INSERT INTO ticket_trace (tenant_id, ticket_id, at, kind, message)
             VALUES ('{t}', 'tkt_1', {}, 'note', 'later')",
            at + 1
        ))
        .await;
        assert_eq!(
            raw.number(&format!("SELECT COUNT(*) FROM {partition}"))
                .await,
            2
        );
        // Nothing is left to move.
        let fourth = restarted.expire(std::slice::from_ref(&t)).await.unwrap();
        assert!(fourth.moved.is_empty(), "{fourth:?}");
    }
}

/// An audit row of `tenant` (or the platform's own, `NULL`) at `at`.
fn audit_row(tenant: &str, n: usize, at: i64) -> String {
    format!(
        "INSERT INTO audit (id, tenant_id, at, actor_kind, actor_id, action, target_kind, target_id)
         VALUES ('aud_{n}_{at}', {tenant}, {at}, 'key', 'key_1', 'source.created', 'source', 'src_1')"
    )
}

/// A month of audit rows 160 to 133 days ago for two tenants that keep
/// theirs 100 days, and one row of the platform's own at its start: the
/// tenants' rows go; the platform's stays (kept 365 days), and so does its
/// month on PostgreSQL, while the other months go whole. A year later the
/// platform's row goes too.
async fn the_audit_log_expires_by_each_tenants_audit_days(db: &TestDb) {
    let store: Arc<dyn Store> = db.store().await;
    let raw = Raw::open(db).await;
    let now = now_ms();
    let a = tenant(&*store, "a").await;
    let b = tenant(&*store, "b").await;
    let retention = Retention {
        audit_days: 100,
        ..Retention::default()
    };
    for t in [&a, &b] {
        assert!(store.set_retention(t, &retention).await.unwrap());
    }
    let first = now - 160 * DAY_MS;
    assert!(
        store
            .create_partitions(first, 2, &[])
            .await
            .unwrap()
            .is_empty()
    );
    for n in 0..28 {
        let at = first + n as i64 * DAY_MS;
        for t in [&a, &b] {
            raw.exec(&audit_row(&format!("'{t}'"), n, at)).await;
        }
    }
    raw.exec(&audit_row("NULL", 0, first)).await;
    raw.exec(&audit_row(&format!("'{a}'"), 100, now - DAY_MS))
        .await;
    let month_of = |ms: i64| {
        let month = jiff::Timestamp::from_millisecond(ms)
            .unwrap()
            .to_zoned(jiff::tz::TimeZone::UTC);
        format!("audit_{:04}_{:02}", month.year(), month.month())
    };
    let kept_month = month_of(first);
    let other_months: std::collections::BTreeSet<String> = (0..28)
        .map(|n| month_of(first + n * DAY_MS))
        .filter(|m| *m != kept_month)
        .collect();
    let platform_rows = "SELECT COUNT(*) FROM audit WHERE tenant_id IS NULL";

    let clock = Arc::new(ManualClock::at(now));
    let config = SchedulerConfig {
        expiry_batch: 10,
        ..SchedulerConfig::default()
    };
    let scheduler = Scheduler::new(store.clone(), "n1", config, clock.clone());
    let report = scheduler.expire(&[a.clone(), b.clone()]).await.unwrap();
    assert!(!report.more, "{report:?}");
    assert_eq!(raw.count("audit", &a).await, 1, "the recent row stays");
    assert_eq!(raw.count("audit", &b).await, 0);
    assert_eq!(
        raw.number(platform_rows).await,
        1,
        "the platform keeps its own"
    );
    if db.backend == Backend::Postgres {
        let partitions = raw.partitions("audit").await;
        assert!(partitions.contains(&kept_month), "{partitions:?}");
        assert!(
            other_months
                .iter()
                .all(|p| !partitions.contains(p) && report.dropped.contains(p)),
            "{partitions:?} {report:?}"
        );
    }

    // A year on, the platform's own row has had its 365 days.
    clock.set(now + 366 * DAY_MS);
    let later = scheduler.expire(&[a.clone(), b.clone()]).await.unwrap();
    assert_eq!(raw.number(platform_rows).await, 0, "{later:?}");
    assert_eq!(raw.count("audit", &a).await, 0);
    if db.backend == Backend::Postgres {
        // Emptied by batches; its month goes whole at a later pass.
        let again = scheduler.expire(&[a.clone(), b.clone()]).await.unwrap();
        assert!(again.dropped.contains(&kept_month), "{again:?}");
    }
}
