//! The store conformance suite: the behaviour every backend must show, each
//! test generated once per backend (`name::sqlite`, `name::postgres`, by
//! `tok_store::backend_tests!`) on a fresh database of its own, which is
//! dropped even when the test fails. One module per part of the store:
//! `queue` (claims, leases, fencing), `record` (the record transaction),
//! `children` (child runs and waits on runs), `branches` (parallel branches' jobs),
//! `contexts` (a run's position and context in the rows its steps write),
//! `dispatch`, `flow` (the start controls' rows), `inbox` (events and manual starts), `runs` (the listing),
//! `schedule` (the scheduler's lease and schedule rows), `watch` (stuck runs),
//! `tenancy` (scoping across all of them), `tenant_caps` (a tenant's
//! concurrency cap across claims and dispatches), `widgets`, `connections`
//! (credentials sealed at rest, changed, deleted), `signing_secrets`
//! (webhook signing secrets sealed at rest), `desk` (ticket types,
//! groups and members changed and deleted), `queue_samples` (the queue's
//! health over time), `audit` (the audit log), `offboarding` (a tenant
//! deleted with every row of it), `outcomes` (a run's end in its ticket's
//! trace) and `migrations`; the setup helpers they share are here.
//!
//! Tests drive the store only through its public traits and assert on what a
//! caller gets back (claimed jobs, runs, pages, inbox answers). Raw SQL is
//! used in setup alone, to simulate what the API cannot do on purpose: an
//! event found pending again after its runs were written (a dispatcher that
//! crashed), the passing of the inbox's 24-hour idempotency window, and a
//! database that refuses a row; and, for a tenant's deletion (`offboarding`),
//! to give the tenant a row in every table and count what is left of it.
//!
//! Timing: waits for a lease or delay to expire sleep well past it, and
//! nothing asserts on how long an operation took.

/// `tok_store::backend_tests!` and one more backend: `name::sqlite`,
/// `name::postgres`, and `name::postgres_routed`, the same test on a
/// [`tok_store::RoutedStore`] whose tenants all live on a PostgreSQL
/// database beside the shared one ([`tok_store::testing::run_routed`]).
macro_rules! backend_tests {
    ($runner:path; $($name:ident),* $(,)?) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $runner(tok_store::Backend::Sqlite, super::$name).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $runner(tok_store::Backend::Postgres, super::$name).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_routed() {
                tok_store::testing::run_routed(super::$name).await;
            }
        }
    )*};
}

mod approvals;
mod audit;
mod branches;
mod children;
mod close;
mod compensation;
mod connections;
mod contexts;
mod desk;
mod dispatch;
mod effects;
mod flow;
mod inbox;
mod keys;
mod lifecycle;
mod migrations;
mod offboarding;
mod operations;
mod outcomes;
mod pages;
mod queue;
mod queue_samples;
mod record;
mod routing;
mod runs;
mod schedule;
mod signing_secrets;
mod tenancy;
mod tenant_caps;
mod watch;
mod widgets;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::Connection;
use tok_core::ids::{AutomationId, EventId, RunId, SourceId, TenantId};
use tok_store::testing::{TestDb, backends, run_on_fresh_db};
use tok_store::{
    Backend, Candidate, ClaimedJob, Lane, NewEvent, NewRun, NewSource, NewVersion, NextJob,
    PendingEvent, PgStore, Plan, QueueStore, Record, RunFilter, RunStatus, RunSummary, StepRecord,
    Store, StoreError,
};

/// A lease long enough that it never expires during a test.
const LONG_LEASE_MS: i64 = 60_000;

/// A lease a test waits out on purpose, and how long it waits.
const SHORT_LEASE_MS: i64 = 300;
const PAST_SHORT_LEASE: Duration = Duration::from_millis(1_500);

async fn tenant(store: &dyn Store, name: &str) -> TenantId {
    let key = tok_store::hash_secret(&tok_store::random_token());
    store
        .create_tenant(name, &key)
        .await
        .expect("create tenant")
        .id
}

async fn source(store: &dyn Store, tenant: &TenantId, name: &str) -> SourceId {
    let new = NewSource {
        name: name.into(),
        token: tok_store::random_token(),
        params: json!([]),
        critical: false,
        rate_limit: None,
        secret: None,
        verify_preset: None,
        schema: None,
    };
    store
        .create_source(tenant, new)
        .await
        .expect("create source")
        .id
}

fn version(name: &str, trigger_kind: &str, trigger_key: Option<&str>) -> NewVersion {
    let definition = json!({
        "name": name,
        "trigger": { "kind": trigger_kind, "source": trigger_key },
        "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "hi" } }],
    });
    NewVersion {
        name: name.into(),
        hash: tok_store::hash_secret(&definition.to_string()),
        definition,
        trigger_kind: trigger_kind.into(),
        trigger_key: trigger_key.map(str::to_owned),
    }
}

/// An automation started by hand.
async fn manual_automation(store: &dyn Store, tenant: &TenantId, name: &str) -> AutomationId {
    let def = version(name, "manual", None);
    store
        .create_automation(tenant, def)
        .await
        .expect("create automation")
        .id
}

/// An automation triggered by webhooks of `source`.
async fn webhook_automation(
    store: &dyn Store,
    tenant: &TenantId,
    name: &str,
    source: &SourceId,
) -> AutomationId {
    let def = version(name, "webhook", Some(source.as_str()));
    store
        .create_automation(tenant, def)
        .await
        .expect("create automation")
        .id
}

fn webhook_event(source: &SourceId, key: &str) -> NewEvent {
    NewEvent {
        event_type: None,
        subject_ticket_id: None,
        source_id: Some(source.clone()),
        source_kind: "webhook".into(),
        idempotency_key: key.into(),
        payload: json!({ "kind": "order.created", "key": key }),
        params: json!({}),
        depth: 0,
        cause_run_id: None,
        origin_automation_id: None,
        target_automation_id: None,
        traceparent: None,
    }
}

fn manual_event(automation: &AutomationId) -> NewEvent {
    NewEvent {
        event_type: None,
        subject_ticket_id: None,
        source_id: None,
        source_kind: "manual".into(),
        idempotency_key: tok_store::random_token(),
        payload: json!({}),
        params: json!({}),
        depth: 0,
        cause_run_id: None,
        origin_automation_id: None,
        target_automation_id: Some(automation.clone()),
        traceparent: None,
    }
}

fn new_run(automation: &AutomationId, trigger: &str, queue_key: Option<&str>) -> NewRun {
    NewRun {
        subject_ticket_id: None,
        steps: Vec::new(),
        actions: 0,
        refused: None,
        skipped: None,
        hold: None,
        start_by: None,
        cancels: Vec::new(),
        cancelled: None,
        id: RunId::generate(),
        automation_id: automation.clone(),
        version: 1,
        trigger_type: trigger.into(),
        context: json!({ "n": 0 }),
        depth: 0,
        queue_key: queue_key.map(str::to_owned),
        priority: 0,
        first_path: Some("0".into()),
        idempotency_key: None,
    }
}

/// Starts one run by hand; its first job (path `0`) is ready at once.
async fn start(
    store: &dyn Store,
    tenant: &TenantId,
    automation: &AutomationId,
    trigger: &str,
    queue_key: Option<&str>,
) -> RunId {
    let run = new_run(automation, trigger, queue_key);
    store
        .start_run(tenant, manual_event(automation), run)
        .await
        .expect("start run")
}

/// What the engine's dispatcher does, minus filters: one run per candidate.
fn one_run_per_candidate(event: &PendingEvent, candidates: &[Candidate]) -> Plan {
    Plan {
        notes: Vec::new(),
        flow: Vec::new(),
        runs: candidates
            .iter()
            .map(|c| NewRun {
                subject_ticket_id: None,
                steps: Vec::new(),
                actions: 0,
                refused: None,
                skipped: None,
                hold: None,
                start_by: None,
                cancels: Vec::new(),
                cancelled: None,
                id: RunId::generate(),
                automation_id: c.automation_id.clone(),
                version: c.version,
                trigger_type: event.source_kind.clone(),
                context: json!({ "event": event.id }),
                depth: event.depth,
                queue_key: None,
                priority: 0,
                first_path: Some("0".into()),
                idempotency_key: None,
            })
            .collect(),
    }
}

/// A planner: the runs an event starts, given the automations it triggers.
type Planner<'a> = &'a (dyn Fn(&PendingEvent, &[Candidate]) -> Plan + Sync);

/// One dispatch transaction made of the store's mechanisms as the engine's
/// dispatcher makes it, without its policy (every selected event is taken,
/// nobody's runs are counted): each event with automations planned by
/// `planner`, the runs written, the events marked dispatched. Returns the
/// number of events taken.
async fn dispatch(
    store: &dyn Store,
    tenants: &[TenantId],
    limit: u32,
    planner: Planner<'_>,
) -> tok_store::Result<usize> {
    let (taken, _) = dispatch_claiming(store, tenants, limit, planner, None).await?;
    Ok(taken)
}

/// Whether a dispatch's node takes a new run of a tenant.
type Take<'a> = &'a mut (dyn FnMut(&TenantId) -> bool + Send);

/// [`dispatch`], the first jobs of the runs `claims` picks (by tenant,
/// asked once per new run) written claimed by `claims`' node; returns them
/// too.
async fn dispatch_claiming(
    store: &dyn Store,
    tenants: &[TenantId],
    limit: u32,
    planner: Planner<'_>,
    mut claims: Option<(&str, Take<'_>)>,
) -> tok_store::Result<(usize, Vec<ClaimedJob>)> {
    let mut tx = store.begin_dispatch(tenants, Lane::Bulk).await?;
    let events = tx.pending_events(limit).await?;
    let mut runs = Vec::new();
    for event in &events {
        let candidates = tx.candidates(event).await?;
        if candidates.is_empty() {
            continue;
        }
        for run in planner(event, &candidates).runs {
            runs.push((event.tenant_id.clone(), event.id.clone(), run));
        }
    }
    let mut taken = HashSet::new();
    if let Some((_, take)) = claims.as_mut() {
        for (tenant, _, run) in &runs {
            if take(tenant) {
                taken.insert(run.id.clone());
            }
        }
    }
    let claims = claims.map(|(node, _)| tok_store::Claims {
        node,
        lease_ms: LONG_LEASE_MS,
        runs: &taken,
    });
    let claimed = tx.insert_runs(&runs, claims).await?;
    let ids: Vec<EventId> = events.iter().map(|e| e.id.clone()).collect();
    tx.mark_dispatched(&ids).await?;
    tx.commit().await?;
    Ok((events.len(), claimed))
}

fn step(path: &str, status: tok_store::StepStatus, output: Value) -> StepRecord {
    StepRecord {
        path: path.into(),
        step_id: format!("st_{}", path.replace('.', "_")),
        kind: "flow/log".into(),
        attempt: 1,
        status,
        input: Some(json!({ "in": path })),
        output: Some(output),
        error: None,
        log: vec![format!("step {path}")],
        started_at: 1,
        finished_at: 2,
    }
}

/// A run of a new manual automation of `tenant`, started and claimed:
/// the run and its job, leased for [`LONG_LEASE_MS`].
async fn claimed_run(store: &dyn Store, tenant: &TenantId) -> (RunId, ClaimedJob) {
    let aut = manual_automation(store, tenant, "a").await;
    let run = start(store, tenant, &aut, "manual", None).await;
    let job = store
        .claim(std::slice::from_ref(tenant), "n", 1, LONG_LEASE_MS)
        .await
        .expect("claim")
        .pop()
        .expect("the run's job");
    (run, job)
}

/// A connection of its own with a transaction open on it (PostgreSQL), to
/// hold locks beside the store's transactions as another process would.
async fn transaction_beside(db: &TestDb) -> sqlx::PgConnection {
    let options = tok_store::PgStore::connect_options(&db.url).expect("options");
    let mut conn = sqlx::PgConnection::connect_with(&options)
        .await
        .expect("connect");
    sqlx::Executor::execute(&mut conn, "BEGIN")
        .await
        .expect("begin");
    conn
}

/// Ends the run: the job is deleted and the run takes `status`.
fn finish(job: &ClaimedJob, status: RunStatus) -> Record {
    Record {
        subject_ticket_id: None,
        steps: vec![step(&job.path, tok_store::StepStatus::Completed, json!({}))],
        context: job.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        actions: job.actions + 1,
        status,
        error: None,
        next: NextJob::Done,
    }
}

/// Runs `sql` on a connection of its own (test setup only).
async fn raw_sql(db: &TestDb, sql: &str) -> u64 {
    match db.backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&db.url)
                .await
                .expect("raw connection");
            let done = sqlx::query(sql).execute(&mut conn).await.expect("raw sql");
            conn.close().await.expect("close raw connection");
            done.rows_affected()
        }
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("raw connection");
            let done = sqlx::query(sql).execute(&mut conn).await.expect("raw sql");
            conn.close().await.expect("close raw connection");
            done.rows_affected()
        }
    }
}

async fn all_runs(store: &dyn Store, tenant: &TenantId) -> Vec<RunSummary> {
    let page = store
        .runs(tenant, &RunFilter::default(), 500, None)
        .await
        .expect("list runs");
    assert!(page.next_cursor.is_none(), "more than 500 runs in a test");
    page.items
}

fn run_ids(jobs: &[ClaimedJob]) -> HashSet<RunId> {
    jobs.iter().map(|j| j.run_id.clone()).collect()
}

/// Makes the database refuse, from now on, rows of `table` whose `column`
/// is `'poison'`: what any database may refuse in one row (here a check on
/// PostgreSQL, a trigger on SQLite), beyond what the store checks itself.
async fn refuse_poison(db: &TestDb, table: &str, column: &str) {
    let sql = match db.backend {
        Backend::Postgres => format!(
            "ALTER TABLE {table} ADD CONSTRAINT {table}_refuses_poison
             CHECK ({column} IS DISTINCT FROM 'poison')"
        ),
        Backend::Sqlite => format!(
            "CREATE TRIGGER {table}_refuses_poison BEFORE INSERT ON {table}
             WHEN NEW.{column} = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
        ),
    };
    raw_sql(db, &sql).await;
}
