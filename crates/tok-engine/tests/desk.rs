//! The service desk through the engine, on both backends: automations that
//! react to each other's ticket changes cannot loop (own changes, per-ticket
//! cap, depth limit), runs on one ticket never interleave, failures open one
//! incident per cause, and a failed run retried from its failed step does
//! not repeat the steps before it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use tok_core::error::StepError;
use tok_core::ids::{AutomationId, TenantId};
use tok_engine::definitions::prepare;
use tok_engine::{Engine, EngineConfig, Registry, Running, StepCall, StepHandler};
use tok_store::testing::{TestDb, backends};
use tok_store::{
    Backend, Cause, NewGroup, NewTicketType, RunFilter, RunSummary, Store, Ticket, TicketFilter,
    TicketWrite,
};

struct Desk {
    db: TestDb,
    store: Arc<dyn Store>,
    registry: Registry,
    tenant: TenantId,
}

impl Desk {
    async fn new(backend: Backend, registry: Registry) -> Self {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let tenant = store.create_tenant("Acme", "hash-of-key").await.unwrap().id;
        store
            .create_ticket_type(
                &tenant,
                NewTicketType {
                    name: "order".into(),
                    statuses: vec!["a".into(), "b".into(), "c".into()],
                    fields: json!([]),
                },
            )
            .await
            .unwrap();
        store
            .create_group(
                &tenant,
                NewGroup {
                    name: "warehouse".into(),
                    members: vec![("Eva".into(), 10), ("Jan".into(), 10)],
                },
            )
            .await
            .unwrap();
        Self {
            db,
            store,
            registry,
            tenant,
        }
    }

    async fn start(&self) -> (Engine, Running) {
        let engine = Engine::new(
            self.store.clone(),
            self.registry.clone(),
            EngineConfig {
                concurrency: 4,
                poll_interval: Duration::from_millis(30),
                ..EngineConfig::default()
            },
        );
        let running = engine.start(true).await.unwrap();
        (engine, running)
    }

    async fn automation(&self, definition: Value) -> AutomationId {
        let raw = serde_json::to_vec(&definition).unwrap();
        let (_, version) = prepare(&raw, &self.registry)
            .unwrap_or_else(|errors| panic!("definition rejected: {errors:?}"));
        self.store
            .create_automation(&self.tenant, version)
            .await
            .unwrap()
            .id
    }

    /// A person creates a ticket (through the store, as the API does).
    async fn person_creates(&self, external_id: &str, status: &str) -> Ticket {
        let types = self.store.ticket_types(&self.tenant).await.unwrap();
        let ticket = Ticket {
            id: tok_core::ids::new_id("tkt"),
            external_id: external_id.into(),
            type_id: Some(types[0].id.clone()),
            type_name: Some("order".into()),
            title: None,
            status: Some(status.into()),
            closed: false,
            tags: Vec::new(),
            fields: Map::new(),
            assignee_id: None,
            assignee_name: None,
            created_at: 1,
            updated_at: 1,
        };
        self.store
            .write_ticket(
                &self.tenant,
                TicketWrite {
                    ticket: ticket.clone(),
                    created: true,
                    changes: vec!["status".into()],
                    trace: vec!["Created by a person".into()],
                },
                None,
                &Cause {
                    actor: "a person".into(),
                    ..Cause::default()
                },
            )
            .await
            .unwrap();
        ticket
    }

    /// A person changes a ticket's title (an event every time).
    async fn person_retitles(&self, id: &str, title: &str) {
        let mut ticket = self.store.ticket(&self.tenant, id).await.unwrap().unwrap();
        let seen = ticket.updated_at;
        ticket.title = Some(title.into());
        ticket.updated_at = seen + 1;
        self.store
            .write_ticket(
                &self.tenant,
                TicketWrite {
                    ticket,
                    created: false,
                    changes: vec!["title".into()],
                    trace: vec![format!("Title set to {title} by a person")],
                },
                Some(seen),
                &Cause {
                    actor: "a person".into(),
                    ..Cause::default()
                },
            )
            .await
            .unwrap();
    }

    /// Waits until nothing is pending, queued or running, twice in a row.
    async fn settle(&self) {
        let mut quiet = 0;
        for _ in 0..2000 {
            let stats = self
                .store
                .queue_stats(std::slice::from_ref(&self.tenant))
                .await
                .unwrap();
            if stats.pending_events + stats.ready + stats.running + stats.scheduled == 0 {
                quiet += 1;
                if quiet == 3 {
                    return;
                }
            } else {
                quiet = 0;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        panic!("the engine did not settle within a minute");
    }

    async fn runs_of(&self, automation: &AutomationId) -> Vec<RunSummary> {
        let filter = RunFilter {
            automation_id: Some(automation.to_string()),
            ..RunFilter::default()
        };
        self.store
            .runs(&self.tenant, &filter, 500, None)
            .await
            .unwrap()
            .items
    }

    async fn trace_text(&self, ticket: &str) -> String {
        let lines = self.store.ticket_trace(&self.tenant, ticket).await.unwrap();
        lines
            .iter()
            .map(|l| format!("{}: {}", l.kind, l.message))
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn cleanup(self) {
        drop(self.store);
        self.db.cleanup().await;
    }
}

/// Flips the ticket's status between a and b on every ticket change.
fn flipper(name: &str, from: &str, to: &str) -> Value {
    json!({
        "name": name,
        "trigger": { "kind": "event", "event": "ticket.updated",
                     "filter": { "rules": [{ "field": "ticket.status", "operator": "eq", "value": from }] } },
        "steps": [{ "id": "st_flip", "type": "ticket/set-status", "config": { "status": to } }]
    })
}

#[tokio::test]
async fn an_automation_is_not_triggered_by_its_own_change() {
    for backend in backends() {
        let desk = Desk::new(backend, Registry::with_builtins()).await;
        // Every change makes it change the ticket again: only the origin rule stops it.
        let toggler = desk
            .automation(json!({
                "name": "Toggler",
                "trigger": { "kind": "event", "event": "ticket.updated" },
                "steps": [{ "id": "st_check", "type": "condition",
                            "rules": [{ "field": "ticket.status", "operator": "eq", "value": "a" }],
                            "then": [{ "id": "st_to_b", "type": "ticket/set-status", "config": { "status": "b" } }],
                            "else": [{ "id": "st_to_a", "type": "ticket/set-status", "config": { "status": "a" } }] }]
            }))
            .await;
        let (_engine, running) = desk.start().await;
        let ticket = desk.person_creates("T-1", "a").await;
        desk.person_retitles(&ticket.id, "first").await;
        desk.settle().await;
        running.shutdown().await;

        let runs = desk.runs_of(&toggler).await;
        assert_eq!(runs.len(), 1, "{backend:?}: {runs:?}");
        assert_eq!(runs[0].status, "completed", "{backend:?}");
        let after = desk
            .store
            .ticket(&desk.tenant, &ticket.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(after.status.as_deref(), Some("b"), "{backend:?}");
        desk.cleanup().await;
    }
}

#[tokio::test]
async fn two_automations_ping_ponging_stop_at_the_depth_limit_with_an_alert() {
    for backend in backends() {
        let desk = Desk::new(backend, Registry::with_builtins()).await;
        let ping = desk.automation(flipper("Ping", "a", "b")).await;
        let pong = desk.automation(flipper("Pong", "b", "a")).await;
        let (_engine, running) = desk.start().await;
        let ticket = desk.person_creates("T-2", "a").await;
        desk.person_retitles(&ticket.id, "go").await;
        desk.settle().await;
        running.shutdown().await;

        // depth 1 (Ping) → 2 (Pong) → 3 (Ping) → 4 (Pong) → 5 (Ping); the
        // sixth level is not raised.
        let (pings, pongs) = (desk.runs_of(&ping).await, desk.runs_of(&pong).await);
        assert_eq!((pings.len(), pongs.len()), (3, 2), "{backend:?}");
        let mut depths: Vec<i32> = pings.iter().chain(&pongs).map(|r| r.depth).collect();
        depths.sort();
        assert_eq!(depths, vec![1, 2, 3, 4, 5], "{backend:?}");
        assert!(
            pings.iter().chain(&pongs).all(|r| r.status == "completed"),
            "{backend:?}"
        );
        let trace = desk.trace_text(&ticket.id).await;
        assert!(
            trace.contains("loop_protection: No automation was triggered"),
            "{backend:?}: {trace}"
        );
        let incidents = desk
            .store
            .incidents(&desk.tenant, Some("open"), 50, None)
            .await
            .unwrap()
            .items;
        assert_eq!(incidents.len(), 1, "{backend:?}: {incidents:?}");
        assert!(
            incidents[0].title.contains("keep triggering each other"),
            "{backend:?}"
        );
        desk.cleanup().await;
    }
}

/// A stored definition that no longer parses (changed in the database by
/// hand here) does not make its automation vanish from dispatch: each event
/// still starts a run, which fails with `definition_invalid` and the parse
/// error, and the tenant gets one incident.
#[tokio::test]
async fn an_automation_whose_stored_definition_no_longer_parses_fails_its_runs_visibly() {
    for backend in backends() {
        let desk = Desk::new(backend, Registry::with_builtins()).await;
        let broken = desk
            .automation(json!({
                "name": "Watcher",
                "trigger": { "kind": "event", "event": "ticket.updated" },
                "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "saw {{ticket.title}}" } }]
            }))
            .await;
        let sql = format!(
            "UPDATE automation_versions SET definition = '{{\"name\": \"Watcher\", \"steps\": \"none\"}}' \
             WHERE automation_id = '{broken}'"
        );
        match backend {
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&desk.db.url).await.unwrap();
                sqlx::raw_sql(&sql).execute(&pool).await.map(|_| ())
            }
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&desk.db.url).await.unwrap();
                sqlx::raw_sql(&sql).execute(&pool).await.map(|_| ())
            }
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let (_engine, running) = desk.start().await;
        let ticket = desk.person_creates("T-9", "a").await;
        desk.person_retitles(&ticket.id, "first").await;
        desk.person_retitles(&ticket.id, "second").await;
        desk.settle().await;
        running.shutdown().await;

        let runs = desk.runs_of(&broken).await;
        assert_eq!(runs.len(), 2, "{backend:?}: one run per event: {runs:?}");
        for run in &runs {
            assert_eq!(run.status, "failed", "{backend:?}");
            let error = run.error.as_deref().unwrap_or_default();
            assert!(
                error.starts_with("definition_invalid: ")
                    && error.contains("does not parse: invalid type"),
                "{backend:?}: the error names the code and the parse error: {error}"
            );
        }
        let incidents = desk
            .store
            .incidents(&desk.tenant, None, 50, None)
            .await
            .unwrap()
            .items;
        assert_eq!(incidents.len(), 1, "{backend:?}: {incidents:?}");
        assert_eq!(incidents[0].occurrences, 2, "{backend:?}");
        assert!(
            incidents[0]
                .title
                .contains("saved definition cannot be read"),
            "{backend:?}: {}",
            incidents[0].title
        );
        assert_eq!(
            incidents[0].detail["code"], "definition_invalid",
            "{backend:?}"
        );
        desk.cleanup().await;
    }
}

#[tokio::test]
async fn one_automation_runs_at_most_five_times_per_ticket_per_minute() {
    for backend in backends() {
        let desk = Desk::new(backend, Registry::with_builtins()).await;
        let watcher = desk
            .automation(json!({
                "name": "Watcher",
                "trigger": { "kind": "event", "event": "ticket.updated" },
                "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "saw {{ticket.title}}" } }]
            }))
            .await;
        let (_engine, running) = desk.start().await;
        let ticket = desk.person_creates("T-3", "a").await;
        for n in 0..7 {
            desk.person_retitles(&ticket.id, &format!("title {n}"))
                .await;
        }
        desk.settle().await;
        running.shutdown().await;

        assert_eq!(desk.runs_of(&watcher).await.len(), 5, "{backend:?}");
        let trace = desk.trace_text(&ticket.id).await;
        let skipped = trace
            .matches("Automation \u{201c}Watcher\u{201d} was not started")
            .count();
        assert_eq!(skipped, 2, "{backend:?}: {trace}");
        assert!(
            trace.contains("ran 5 times on this ticket in the last minute"),
            "{backend:?}"
        );
        desk.cleanup().await;
    }
}

#[tokio::test]
async fn runs_on_one_ticket_never_interleave() {
    for backend in backends() {
        let desk = Desk::new(backend, Registry::with_builtins()).await;
        let slow = |name: &str, tag: &str| {
            json!({
                "name": name,
                "trigger": { "kind": "event", "event": "ticket.updated" },
                "steps": [
                    { "id": "st_pause", "type": "flow/pause", "config": { "seconds": 0.3 } },
                    { "id": "st_tag", "type": "ticket/add-tags", "config": { "tags": [tag] } },
                    { "id": "st_pause_again", "type": "flow/pause", "config": { "seconds": 0.3 } }
                ]
            })
        };
        let first = desk.automation(slow("First", "one")).await;
        let second = desk.automation(slow("Second", "two")).await;
        let (_engine, running) = desk.start().await;
        let ticket = desk.person_creates("T-4", "a").await;
        desk.person_retitles(&ticket.id, "go").await;
        desk.settle().await;
        running.shutdown().await;

        let runs_first = desk.runs_of(&first).await;
        let runs_second = desk.runs_of(&second).await;
        // Each reacted to the person's change (the other's tag change is its
        // own event, and may start more runs: all of them on this ticket).
        let mut all: Vec<&RunSummary> = runs_first.iter().chain(&runs_second).collect();
        assert!(all.len() >= 2, "{backend:?}");
        all.sort_by_key(|r| r.started_at);
        for pair in all.windows(2) {
            assert!(
                pair[1].started_at.unwrap() >= pair[0].finished_at.unwrap(),
                "{backend:?}: runs on one ticket overlapped: {pair:?}"
            );
        }
        let after = desk
            .store
            .ticket(&desk.tenant, &ticket.id)
            .await
            .unwrap()
            .unwrap();
        assert!(
            after.tags.contains(&"one".into()) && after.tags.contains(&"two".into()),
            "{backend:?}"
        );
        desk.cleanup().await;
    }
}

/// Fails with a terminal error until switched to succeed.
struct Switch {
    works: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
}

#[async_trait]
impl StepHandler for Switch {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.works.load(Ordering::SeqCst) == 0 {
            return Err(StepError::terminal(
                "invoicing service answered 400: unknown customer",
            ));
        }
        Ok(Map::new())
    }
}

/// Counts its calls.
struct Counter(Arc<AtomicU32>);

#[async_trait]
impl StepHandler for Counter {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let mut out = Map::new();
        out.insert("counted".into(), json!(true));
        Ok(out)
    }
}

#[tokio::test]
async fn a_failed_run_opens_one_incident_per_cause_and_retries_from_its_failed_step() {
    for backend in backends() {
        let (works, calls, before) = (
            Arc::new(AtomicU32::new(0)),
            Arc::new(AtomicU32::new(0)),
            Arc::new(AtomicU32::new(0)),
        );
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/invoice",
            Switch {
                works: works.clone(),
                calls: calls.clone(),
            },
        );
        registry.register("acme/count", Counter(before.clone()));
        let desk = Desk::new(backend, registry).await;
        let automation = desk
            .automation(json!({
                "name": "Invoice order",
                "trigger": { "kind": "manual" },
                "steps": [
                    { "id": "st_ticket", "type": "ticket/upsert", "config": { "externalId": "{{orderId}}", "type": "order" } },
                    { "id": "st_count", "type": "acme/count" },
                    { "id": "st_invoice", "type": "acme/invoice" },
                    { "id": "st_done", "type": "ticket/set-status", "config": { "status": "c" } }
                ]
            }))
            .await;
        let (engine, running) = desk.start().await;
        let wait_final = |run: tok_core::ids::RunId| {
            let store = desk.store.clone();
            let tenant = desk.tenant.clone();
            async move {
                for _ in 0..1200 {
                    let r = store.run(&tenant, &run).await.unwrap().unwrap();
                    if matches!(r.run.status.as_str(), "completed" | "failed" | "cancelled") {
                        return r;
                    }
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                panic!("run did not finish");
            }
        };
        let first = engine
            .start_run(
                &desk.tenant,
                &automation,
                json!({ "orderId": "5001" }),
                None,
            )
            .await
            .unwrap();
        let failed = wait_final(first.clone()).await;
        assert_eq!(failed.run.status, "failed", "{backend:?}");
        let second = engine
            .start_run(
                &desk.tenant,
                &automation,
                json!({ "orderId": "5002" }),
                None,
            )
            .await
            .unwrap();
        assert_eq!(wait_final(second).await.run.status, "failed", "{backend:?}");

        let incidents = desk
            .store
            .incidents(&desk.tenant, None, 50, None)
            .await
            .unwrap()
            .items;
        assert_eq!(
            incidents.len(),
            1,
            "{backend:?}: the same cause opens one incident"
        );
        let incident = &incidents[0];
        assert_eq!(incident.occurrences, 2, "{backend:?}");
        assert!(
            incident.title.contains("Invoice order") && incident.title.contains("5001"),
            "{backend:?}: {}",
            incident.title
        );
        for text in [&incident.title, &incident.impact] {
            assert!(
                !text.contains("st_") && !text.contains("run_"),
                "{backend:?}: tenant text names internals: {text}"
            );
        }
        assert_eq!(
            incident.detail["failed_step"]["id"], "st_invoice",
            "{backend:?}"
        );
        assert!(
            incident.detail["message"]
                .as_str()
                .unwrap()
                .contains("unknown customer"),
            "{backend:?}"
        );
        let ticket = desk
            .store
            .tickets(
                &desk.tenant,
                &TicketFilter {
                    external_id: Some("5001".into()),
                    ..TicketFilter::default()
                },
                1,
                None,
            )
            .await
            .unwrap()
            .items
            .remove(0);
        let trace = desk.trace_text(&ticket.id).await;
        assert!(
            trace.contains("failed: step `st_invoice` failed: ")
                && trace.contains("unknown customer"),
            "{backend:?}: {trace}"
        );

        // Fix the cause and retry the first run from where it stopped.
        works.store(1, Ordering::SeqCst);
        let counted_before = before.load(Ordering::SeqCst);
        desk.store.retry_run(&desk.tenant, &first).await.unwrap();
        let retried = wait_final(first.clone()).await;
        running.shutdown().await;

        assert_eq!(
            retried.run.status, "completed",
            "{backend:?}: {:?}",
            retried.run.error
        );
        assert_eq!(
            before.load(Ordering::SeqCst),
            counted_before,
            "{backend:?}: steps before the failure ran again"
        );
        let ids: Vec<(&str, &str)> = retried
            .steps
            .iter()
            .map(|s| (s.step_id.as_str(), s.status.as_str()))
            .collect();
        assert_eq!(
            ids,
            vec![
                ("st_ticket", "completed"),
                ("st_count", "completed"),
                ("st_invoice", "failed"),
                ("st_invoice", "completed"),
                ("st_done", "completed")
            ],
            "{backend:?}"
        );
        assert_eq!(
            retried.context["st_ticket"]["created"], true,
            "{backend:?}: the context was kept"
        );
        desk.cleanup().await;
    }
}
