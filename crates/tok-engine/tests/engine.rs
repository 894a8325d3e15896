//! The engine end to end on both backends: custom step types, retries by the
//! error's own classification, the per-run step cap, independent slots, and
//! heartbeats that keep a long step from running twice.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use tok_core::error::StepError;
use tok_core::ids::{RunId, TenantId};
use tok_engine::definitions::prepare;
use tok_engine::{Engine, EngineConfig, Registry, StepCall, StepHandler, StepOutcome, WaitFor};
use tok_store::testing::{TestDb, backends};
use tok_store::{Backend, RunDetail, Store};

/// What a test step saw on each call.
#[derive(Default)]
struct Calls {
    seen: Mutex<Vec<(u32, String)>>,
}

impl Calls {
    fn record(&self, call: &StepCall) -> usize {
        let mut seen = self.seen.lock().unwrap();
        seen.push((call.attempt, call.idempotency_key.clone()));
        seen.len()
    }

    fn all(&self) -> Vec<(u32, String)> {
        self.seen.lock().unwrap().clone()
    }
}

/// Fails with a retryable error `failures` times, then succeeds.
struct Flaky {
    calls: Arc<Calls>,
    failures: usize,
}

#[async_trait]
impl StepHandler for Flaky {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        let n = self.calls.record(&call);
        if n <= self.failures {
            return Err(StepError::retryable(format!(
                "service answered 503 (call {n})"
            )));
        }
        let mut out = Map::new();
        out.insert(
            "echo".into(),
            call.config.get("say").cloned().unwrap_or(Value::Null),
        );
        Ok(out)
    }
}

/// Always fails with a terminal error.
struct Rejecting {
    calls: Arc<Calls>,
}

#[async_trait]
impl StepHandler for Rejecting {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        self.calls.record(&call);
        Err(StepError::terminal(
            "service answered 400: orderId is not a number",
        ))
    }
}

/// Panics: a bug in a step must fail the run, not the worker.
struct Panicking;

#[async_trait]
impl StepHandler for Panicking {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        panic!("index out of bounds in a custom step")
    }
}

/// Blocks until released; counts how many times it started.
struct Gate {
    started: Arc<AtomicU32>,
    open: Arc<tokio::sync::Semaphore>,
}

#[async_trait]
impl StepHandler for Gate {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let _permit = self
            .open
            .acquire()
            .await
            .map_err(|_| StepError::terminal("closed"))?;
        Ok(Map::new())
    }
}

/// Sleeps for a while: longer than the lease, shorter than the test.
struct Slow {
    started: Arc<AtomicU32>,
    for_ms: u64,
}

#[async_trait]
impl StepHandler for Slow {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(self.for_ms)).await;
        Ok(Map::new())
    }
}

/// The built-in steps and `acme/gate`: how many gates started, and the
/// semaphore that opens them.
fn gated_registry() -> (Registry, Arc<AtomicU32>, Arc<tokio::sync::Semaphore>) {
    let started = Arc::new(AtomicU32::new(0));
    let open = Arc::new(tokio::sync::Semaphore::new(0));
    let mut registry = Registry::with_builtins();
    registry.register(
        "acme/gate",
        Gate {
            started: started.clone(),
            open: open.clone(),
        },
    );
    (registry, started, open)
}

struct Harness {
    db: TestDb,
    store: Arc<dyn Store>,
    registry: Registry,
    tenant: TenantId,
}

impl Harness {
    async fn new(backend: Backend, registry: Registry) -> Self {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let tenant = store.create_tenant("Acme", "hash-of-key").await.unwrap().id;
        Self {
            db,
            store,
            registry,
            tenant,
        }
    }

    fn engine(&self, node: &str, config: EngineConfig) -> Engine {
        Engine::new(
            self.store.clone(),
            self.registry.clone(),
            EngineConfig {
                node_id: node.into(),
                ..config
            },
        )
    }

    async fn automation(&self, definition: Value) -> tok_core::ids::AutomationId {
        let raw = serde_json::to_vec(&definition).unwrap();
        let (_, version) = prepare(&raw, &self.registry)
            .unwrap_or_else(|errors| panic!("definition rejected: {errors:?}"));
        self.store
            .create_automation(&self.tenant, version)
            .await
            .unwrap()
            .id
    }

    /// Polls until the run is final; panics after 60 s.
    async fn finished(&self, run: &RunId) -> RunDetail {
        self.until(run, "finish", |d| {
            matches!(d.run.status.as_str(), "completed" | "failed" | "cancelled")
        })
        .await
    }

    /// Polls until the run's detail satisfies `done` (`what` names it
    /// for the panic after 60 s).
    async fn until(&self, run: &RunId, what: &str, done: impl Fn(&RunDetail) -> bool) -> RunDetail {
        for _ in 0..1200 {
            let detail = self
                .store
                .run(&self.tenant, run)
                .await
                .unwrap()
                .expect("run exists");
            if done(&detail) {
                return detail;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("run {run} did not {what} within 60 s");
    }

    async fn cleanup(self) {
        drop(self.store);
        self.db.cleanup().await;
    }
}

fn quick() -> EngineConfig {
    EngineConfig {
        concurrency: 4,
        poll_interval: Duration::from_millis(50),
        ..EngineConfig::default()
    }
}

fn manual(steps: Value) -> Value {
    json!({
        "name": "test",
        "trigger": { "kind": "manual" },
        "steps": steps,
        "settings": { "retry": { "max_attempts": 3, "backoff": ["50ms"] } }
    })
}

#[tokio::test]
async fn custom_step_is_retried_with_the_same_idempotency_key() {
    for backend in backends() {
        let calls = Arc::new(Calls::default());
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/flaky",
            Flaky {
                calls: calls.clone(),
                failures: 2,
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([
                { "id": "st_call", "type": "acme/flaky", "config": { "say": "order {{orderId}}" } },
                { "id": "st_after", "type": "set", "config": { "values": { "got": "{{st_call.echo}}" } } }
            ])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({ "orderId": "5001" }), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running.shutdown().await;

        assert_eq!(
            detail.run.status, "completed",
            "{backend:?}: {:?}",
            detail.run.error
        );
        let key = format!("{run}:0");
        assert_eq!(
            calls.all(),
            vec![(1, key.clone()), (2, key.clone()), (3, key)],
            "{backend:?}"
        );
        let statuses: Vec<(i32, &str)> = detail
            .steps
            .iter()
            .map(|s| (s.attempt, s.status.as_str()))
            .collect();
        assert_eq!(
            statuses,
            vec![
                (1, "retrying"),
                (2, "retrying"),
                (3, "completed"),
                (1, "completed")
            ],
            "{backend:?}"
        );
        assert_eq!(
            detail.context["st_after"]["got"], "order 5001",
            "{backend:?}"
        );
        h.cleanup().await;
    }
}

#[tokio::test]
async fn retryable_failure_gives_up_after_max_attempts() {
    for backend in backends() {
        let calls = Arc::new(Calls::default());
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/flaky",
            Flaky {
                calls: calls.clone(),
                failures: usize::MAX,
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([{ "id": "st_call", "type": "acme/flaky" }])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({}), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running.shutdown().await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        assert_eq!(calls.all().len(), 3, "{backend:?}: max_attempts is 3");
        let error = detail.run.error.unwrap();
        assert!(
            error.contains("st_call") && error.contains("503"),
            "{backend:?}: {error}"
        );
        let last = detail.steps.last().unwrap();
        assert_eq!(
            (last.attempt, last.status.as_str()),
            (3, "failed"),
            "{backend:?}"
        );
        assert!(
            last.log.to_string().contains("gave up after 3 attempts"),
            "{backend:?}: {}",
            last.log
        );
        h.cleanup().await;
    }
}

#[tokio::test]
async fn terminal_failure_is_not_retried() {
    for backend in backends() {
        let calls = Arc::new(Calls::default());
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/reject",
            Rejecting {
                calls: calls.clone(),
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([
                { "id": "st_call", "type": "acme/reject" },
                { "id": "st_never", "type": "flow/log", "config": { "message": "unreachable" } }
            ])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({}), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running.shutdown().await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        assert_eq!(
            calls.all().len(),
            1,
            "{backend:?}: a terminal error is not retried"
        );
        assert_eq!(
            detail.steps.len(),
            1,
            "{backend:?}: no step after the failure ran"
        );
        assert!(
            detail
                .run
                .error
                .unwrap()
                .contains("orderId is not a number"),
            "{backend:?}"
        );
        h.cleanup().await;
    }
}

#[tokio::test]
async fn a_panicking_step_fails_its_run_and_the_worker_goes_on() {
    for backend in backends() {
        let mut registry = Registry::with_builtins();
        registry.register("acme/panic", Panicking);
        let h = Harness::new(backend, registry).await;
        let broken = h
            .automation(manual(json!([{ "id": "st_bug", "type": "acme/panic" }])))
            .await;
        let fine = h
            .automation(manual(json!([
                { "id": "st_ok", "type": "set", "config": { "values": { "ok": true } } }
            ])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let bad_run = engine
            .start_run(&h.tenant, &broken, json!({}), None)
            .await
            .unwrap();
        let bad = h.finished(&bad_run).await;
        let good_run = engine
            .start_run(&h.tenant, &fine, json!({}), None)
            .await
            .unwrap();
        let good = h.finished(&good_run).await;
        running.shutdown().await;

        assert_eq!(bad.run.status, "failed", "{backend:?}");
        assert!(bad.run.error.unwrap().contains("panicked"), "{backend:?}");
        assert_eq!(good.run.status, "completed", "{backend:?}");
        h.cleanup().await;
    }
}

#[tokio::test]
async fn a_run_stops_at_max_actions_and_says_so() {
    for backend in backends() {
        let h = Harness::new(backend, Registry::with_builtins()).await;
        let automation = h
            .automation(manual(json!([
                { "id": "st_each", "type": "loop", "config": { "items": "{{lines}}" },
                  "do": [{ "id": "st_line", "type": "set", "config": { "values": { "line": "{{item}}" } } }] }
            ])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let lines: Vec<u32> = (0..1000).collect();
        let run = engine
            .start_run(&h.tenant, &automation, json!({ "lines": lines }), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running.shutdown().await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        assert_eq!(detail.run.actions, 1000, "{backend:?}");
        let error = detail.run.error.unwrap();
        assert!(
            error.contains("1000") && error.contains("st_line"),
            "{backend:?}: {error}"
        );
        assert_eq!(
            detail.steps.len(),
            1000,
            "{backend:?}: every executed step is recorded"
        );
        h.cleanup().await;
    }
}

#[tokio::test]
async fn a_blocked_step_does_not_keep_free_slots_idle() {
    for backend in backends() {
        let (registry, started, open) = gated_registry();
        let h = Harness::new(backend, registry).await;
        let blocked = h
            .automation(manual(json!([{ "id": "st_gate", "type": "acme/gate" }])))
            .await;
        let quick_one = h
            .automation(manual(json!([
                { "id": "st_pause", "type": "flow/pause", "config": { "seconds": 0.01 } }
            ])))
            .await;
        let engine = h.engine(
            "node-a",
            EngineConfig {
                concurrency: 2,
                ..quick()
            },
        );
        let running = engine.start(true).await.unwrap();
        let gate_run = engine
            .start_run(&h.tenant, &blocked, json!({}), None)
            .await
            .unwrap();
        // The quick runs complete one after another in the one slot left,
        // while the gate holds the other.
        let mut quick_runs = Vec::new();
        for _ in 0..6 {
            quick_runs.push(
                engine
                    .start_run(&h.tenant, &quick_one, json!({}), None)
                    .await
                    .unwrap(),
            );
        }
        for run in &quick_runs {
            assert_eq!(h.finished(run).await.run.status, "completed", "{backend:?}");
        }
        let gate = h.store.run(&h.tenant, &gate_run).await.unwrap().unwrap();
        assert_eq!(
            gate.run.status, "running",
            "{backend:?}: the gate still holds its slot"
        );
        assert_eq!(started.load(Ordering::SeqCst), 1, "{backend:?}");
        open.add_permits(1);
        assert_eq!(
            h.finished(&gate_run).await.run.status,
            "completed",
            "{backend:?}"
        );
        running.shutdown().await;
        h.cleanup().await;
    }
}

#[tokio::test]
async fn heartbeats_keep_a_long_step_from_running_twice() {
    for backend in backends() {
        let started = Arc::new(AtomicU32::new(0));
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/slow",
            Slow {
                started: started.clone(),
                for_ms: 2500,
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([{ "id": "st_slow", "type": "acme/slow" }])))
            .await;
        // Leases far shorter than the step: only the heartbeat keeps it.
        let short = EngineConfig {
            lease: Duration::from_millis(600),
            heartbeat: Duration::from_millis(150),
            ..quick()
        };
        let a = h.engine("node-a", short.clone());
        let b = h.engine("node-b", short);
        // Both nodes poll the queue before the run exists (a SQLite node
        // releases every claim when it starts, being the only node).
        let running_a = a.start(true).await.unwrap();
        let running_b = b.start(true).await.unwrap();
        let run = a
            .start_run(&h.tenant, &automation, json!({}), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running_a.shutdown().await;
        running_b.shutdown().await;

        assert_eq!(detail.run.status, "completed", "{backend:?}");
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "{backend:?}: the step ran once"
        );
        assert_eq!(detail.steps.len(), 1, "{backend:?}");
        h.cleanup().await;
    }
}

/// The same after a step that went on under its lease: a job that goes on
/// to its next step keeps its claim, and the heartbeats keep that step too.
#[tokio::test]
async fn heartbeats_keep_a_long_step_after_a_continued_one_from_running_twice() {
    for backend in backends() {
        let started = Arc::new(AtomicU32::new(0));
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/quick",
            Slow {
                started: Arc::new(AtomicU32::new(0)),
                for_ms: 0,
            },
        );
        registry.register(
            "acme/slow",
            Slow {
                started: started.clone(),
                for_ms: 2500,
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([
                { "id": "st_quick", "type": "acme/quick" },
                { "id": "st_slow", "type": "acme/slow" }
            ])))
            .await;
        let short = EngineConfig {
            lease: Duration::from_millis(600),
            heartbeat: Duration::from_millis(150),
            ..quick()
        };
        let a = h.engine("node-a", short.clone());
        let b = h.engine("node-b", short);
        let running_a = a.start(true).await.unwrap();
        let running_b = b.start(true).await.unwrap();
        let run = a
            .start_run(&h.tenant, &automation, json!({}), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running_a.shutdown().await;
        running_b.shutdown().await;

        assert_eq!(detail.run.status, "completed", "{backend:?}");
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "{backend:?}: the long step ran once"
        );
        let steps: Vec<(&str, i32)> = detail
            .steps
            .iter()
            .map(|s| (s.step_id.as_str(), s.attempt))
            .collect();
        assert_eq!(steps, [("st_quick", 1), ("st_slow", 1)], "{backend:?}");
        h.cleanup().await;
    }
}

/// A process whose heartbeats did not reach the database for a whole lease
/// (here: none is sent before the step ends) finds its own job claimable
/// again while it still runs it. It must not claim it a second time: the
/// step runs once, and its record, the only claim there is, is written.
#[tokio::test]
async fn a_process_never_claims_a_job_it_is_still_running() {
    for backend in backends() {
        let started = Arc::new(AtomicU32::new(0));
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/slow",
            Slow {
                started: started.clone(),
                for_ms: 2000,
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([{ "id": "st_slow", "type": "acme/slow" }])))
            .await;
        // The lease expires several times over while the step runs, and
        // the pool polls the queue all along.
        let no_heartbeat = EngineConfig {
            lease: Duration::from_millis(300),
            heartbeat: Duration::from_secs(3600),
            ..quick()
        };
        let engine = h.engine("node-a", no_heartbeat);
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({}), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running.shutdown().await;

        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "{backend:?}: the step ran once in the process that held it"
        );
        assert_eq!(
            detail.run.status, "completed",
            "{backend:?}: {:?}",
            detail.run.error
        );
        assert_eq!(detail.steps.len(), 1, "{backend:?}");
        h.cleanup().await;
    }
}

/// PostgreSQL serves several processes: a worker whose poll is an hour away
/// still takes a job another process made ready, woken by LISTEN/NOTIFY.
/// (SQLite serves one process, whose own wake-ups are in-process.)
#[tokio::test]
async fn a_worker_elsewhere_hears_of_new_jobs_without_waiting_for_its_poll() {
    let h = Harness::new(Backend::Postgres, Registry::with_builtins()).await;
    let automation = h
        .automation(manual(json!([
            { "id": "st_set", "type": "set", "config": { "values": { "seen": "{{orderId}}" } } }
        ])))
        .await;
    let api = h.engine("api", quick());
    let api_running = api.start(false).await.unwrap();
    let worker = h.engine(
        "worker",
        EngineConfig {
            poll_interval: Duration::from_secs(3600),
            ..quick()
        },
    );
    let worker_running = worker.start(true).await.unwrap();
    // The worker's first look at the queue is behind it: only a wake-up
    // from the database brings it back before its hour-long poll.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let run = api
        .start_run(&h.tenant, &automation, json!({ "orderId": "7" }), None)
        .await
        .unwrap();
    let detail = h.finished(&run).await;
    worker_running.shutdown().await;
    api_running.shutdown().await;
    assert_eq!(detail.run.status, "completed", "{:?}", detail.run.error);
    assert_eq!(detail.context["st_set"]["seen"], "7");
    h.cleanup().await;
}

/// One tenant's burst holds every general slot with steps that do not end;
/// another tenant's run still goes through, in a slot kept for tenants
/// holding none of the others.
#[tokio::test]
async fn a_tenant_holding_every_slot_does_not_keep_another_tenant_waiting() {
    for backend in backends() {
        let (registry, started, open) = gated_registry();
        let h = Harness::new(backend, registry).await;
        let busy_tenant = h.tenant.clone();
        let gated = h
            .automation(manual(json!([{ "id": "st_gate", "type": "acme/gate" }])))
            .await;
        let other_tenant = h
            .store
            .create_tenant("Small shop", "hash-of-other-key")
            .await
            .unwrap()
            .id;
        let raw = serde_json::to_vec(&manual(json!([
            { "id": "st_set", "type": "set", "config": { "values": { "done": "yes" } } }
        ])))
        .unwrap();
        let (_, version) = prepare(&raw, &h.registry).unwrap();
        let quick_one = h
            .store
            .create_automation(&other_tenant, version)
            .await
            .unwrap()
            .id;
        let engine = h.engine(
            "node-a",
            EngineConfig {
                concurrency: 8,
                ..quick()
            },
        );
        let running = engine.start(true).await.unwrap();
        let mut gated_runs = Vec::new();
        for _ in 0..12 {
            gated_runs.push(
                engine
                    .start_run(&busy_tenant, &gated, json!({}), None)
                    .await
                    .unwrap(),
            );
        }
        // Seven of the eight slots are the busy tenant's, and stay held.
        while started.load(Ordering::SeqCst) < 7 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let run = engine
            .start_run(&other_tenant, &quick_one, json!({}), None)
            .await
            .unwrap();
        let mut detail = None;
        for _ in 0..1200 {
            let d = h.store.run(&other_tenant, &run).await.unwrap().unwrap();
            if d.run.status == "completed" {
                detail = Some(d);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let detail = detail.unwrap_or_else(|| {
            panic!("{backend:?}: the other tenant's run waited behind the busy tenant")
        });
        assert_eq!(detail.context["st_set"]["done"], "yes", "{backend:?}");
        assert_eq!(
            started.load(Ordering::SeqCst),
            7,
            "{backend:?}: the reserved slot is not the busy tenant's"
        );
        open.add_permits(12);
        for run in &gated_runs {
            assert_eq!(h.finished(run).await.run.status, "completed", "{backend:?}");
        }
        running.shutdown().await;
        h.cleanup().await;
    }
}

/// Two processes given one node id (a copied configuration, a host name
/// shared by two containers) on PostgreSQL: the second one's start does
/// not release the first one's claim, so a step in flight runs once.
#[tokio::test]
async fn a_second_process_with_the_same_node_id_leaves_the_first_ones_claims() {
    for backend in backends() {
        if backend != Backend::Postgres {
            // On SQLite a second `tok serve` on one file refuses to start.
            continue;
        }
        let (registry, started, open) = gated_registry();
        let h = Harness::new(backend, registry).await;
        let gated = h
            .automation(manual(json!([{ "id": "st_gate", "type": "acme/gate" }])))
            .await;
        let first = h.engine("same-host", quick());
        let first_running = first.start(true).await.unwrap();
        let run = first
            .start_run(&h.tenant, &gated, json!({}), None)
            .await
            .unwrap();
        while started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let second = h.engine("same-host", quick());
        assert_ne!(first.holder(), second.holder(), "{backend:?}");
        let second_running = second.start(true).await.unwrap();
        // Were the claim released, the second process would take the job
        // at its next poll and start the step again.
        for _ in 0..10 {
            second.job_ready();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        open.add_permits(10);
        let detail = h.finished(&run).await;
        second_running.shutdown().await;
        first_running.shutdown().await;

        assert_eq!(detail.run.status, "completed", "{backend:?}");
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "{backend:?}: the step ran once"
        );
        h.cleanup().await;
    }
}

/// Charges once through `call.once("charge", …)`, then fails retryably on
/// its first attempt: the charge must not run again on the second.
struct Charging {
    charges: Arc<AtomicU32>,
    results: Arc<Mutex<Vec<(u32, Value)>>>,
}

#[async_trait]
impl StepHandler for Charging {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        let charges = self.charges.clone();
        let charge: Value = call
            .once("charge", async move {
                let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(json!({ "chargeId": format!("ch_{n}"), "amount": 120 }))
            })
            .await?;
        self.results
            .lock()
            .unwrap()
            .push((call.attempt, charge.clone()));
        if call.attempt == 1 {
            return Err(StepError::retryable("the receipt service answered 503"));
        }
        Ok(Map::from_iter([("charge".to_owned(), charge)]))
    }
}

#[tokio::test]
async fn an_effect_in_once_runs_once_and_a_retry_gets_its_stored_result() {
    for backend in backends() {
        let charges = Arc::new(AtomicU32::new(0));
        let results = Arc::new(Mutex::new(Vec::new()));
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/charge",
            Charging {
                charges: charges.clone(),
                results: results.clone(),
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(
                json!([{ "id": "st_charge", "type": "acme/charge" }]),
            ))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({}), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running.shutdown().await;

        assert_eq!(
            detail.run.status, "completed",
            "{backend:?}: {:?}",
            detail.run.error
        );
        assert_eq!(
            charges.load(Ordering::SeqCst),
            1,
            "{backend:?}: charged once"
        );
        let charged = json!({ "chargeId": "ch_1", "amount": 120 });
        assert_eq!(
            *results.lock().unwrap(),
            vec![(1, charged.clone()), (2, charged.clone())],
            "{backend:?}: the second attempt got the first one's charge back"
        );
        assert_eq!(
            detail.context["st_charge"]["charge"], charged,
            "{backend:?}"
        );
        h.cleanup().await;
    }
}

/// Waits for its delivery's signal (or its loss's) about the order's
/// ticket, then publishes what the signal said; its first resume fails (a
/// retried resume gets the same signal back).
struct Courier {
    resumes: Arc<Mutex<Vec<tok_engine::Resumed>>>,
}

#[async_trait]
impl StepHandler for Courier {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        unreachable!("the engine calls `handle`")
    }

    async fn handle(&self, call: StepCall) -> Result<StepOutcome, StepError> {
        let key = call.config["key"].as_str().unwrap_or_default().to_owned();
        let ticket = call.config["ticket"].as_str().unwrap_or_default();
        let outputs = Map::from_iter([("tracking".to_owned(), json!("TR-7"))]);
        let wait = WaitFor::signal(format!("{key}.lost"))
            .or(key)
            .about(ticket)
            .publishing(outputs);
        Ok(StepOutcome::Wait(wait))
    }

    async fn resume(
        &self,
        _call: StepCall,
        resumed: tok_engine::Resumed,
    ) -> Result<Map<String, Value>, StepError> {
        let first = {
            let mut resumes = self.resumes.lock().unwrap();
            resumes.push(resumed.clone());
            resumes.len() == 1
        };
        if first {
            return Err(StepError::retryable("the courier's API answered 503"));
        }
        Ok(Map::from_iter([
            ("deliveredAt".to_owned(), resumed.payload["at"].clone()),
            ("signal".to_owned(), json!(resumed.signal_id)),
        ]))
    }
}

/// Holds a booking while it waits for a confirmation that never comes;
/// releases it when its run is cancelled.
struct Hold {
    released: Arc<AtomicU32>,
}

#[async_trait]
impl StepHandler for Hold {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        unreachable!("the engine calls `handle`")
    }

    async fn handle(&self, _call: StepCall) -> Result<StepOutcome, StepError> {
        let wait = WaitFor::signal("confirmed").timeout(Duration::from_secs(3600));
        Ok(StepOutcome::Wait(wait))
    }

    async fn cancel(&self, call: StepCall) -> Result<(), StepError> {
        assert_eq!(
            call.config["booking"], "B-5001",
            "the hook reads its config rendered"
        );
        self.released.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Fails retryably; its type allows one attempt only.
struct OneShot {
    calls: Arc<Calls>,
}

#[async_trait]
impl StepHandler for OneShot {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        self.calls.record(&call);
        Err(StepError::retryable("the payment service answered 503"))
    }

    fn retry_policy(&self) -> Option<tok_core::retry::RetryPolicy> {
        Some(tok_core::retry::RetryPolicy {
            max_attempts: 1,
            backoff: Vec::new(),
        })
    }
}

impl Harness {
    /// Polls until the run has status `status`; panics after 60 s.
    async fn reaches(&self, run: &RunId, status: &str) -> RunDetail {
        self.until(run, &format!("become {status}"), |d| d.run.status == status)
            .await
    }
}

#[tokio::test]
async fn a_custom_step_waits_for_its_signal_and_its_resume_finishes_it() {
    for backend in backends() {
        let resumes = Arc::new(Mutex::new(Vec::new()));
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/courier",
            Courier {
                resumes: resumes.clone(),
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([
                { "id": "st_ship", "type": "acme/courier",
                  "config": { "key": "delivered-{{orderId}}", "ticket": "tk_{{orderId}}" } },
                { "id": "st_after", "type": "set", "config": { "values": { "at": "{{st_ship.deliveredAt}}" } } }
            ])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({ "orderId": "5001" }), None)
            .await
            .unwrap();
        let waiting = h.reaches(&run, "waiting").await;
        assert_eq!(
            waiting.context["st_ship"]["tracking"], "TR-7",
            "{backend:?}: what it published as it began waiting"
        );
        assert_eq!(waiting.waits.len(), 2, "{backend:?}: one per key");
        assert!(resumes.lock().unwrap().is_empty(), "{backend:?}");

        let about_none = h
            .store
            .send_signal(
                &h.tenant,
                tok_store::NewSignal {
                    key: "delivered-5001".into(),
                    payload: json!({ "at": "too early" }),
                    idempotency_key: None,
                    lookback_ms: 0,
                    actor: None,
                    subject: None,
                },
            )
            .await
            .unwrap();
        assert!(
            about_none.resumed.is_empty(),
            "{backend:?}: a signal about no ticket resumes a wait about one"
        );
        let sent = h
            .store
            .send_signal(
                &h.tenant,
                tok_store::NewSignal {
                    key: "delivered-5001".into(),
                    payload: json!({ "at": "2026-12-07T10:00:00Z" }),
                    idempotency_key: None,
                    lookback_ms: 0,
                    actor: None,
                    subject: Some("tk_5001".into()),
                },
            )
            .await
            .unwrap();
        assert_eq!(sent.resumed, vec![run.clone()], "{backend:?}");
        engine.job_ready();
        let detail = h.finished(&run).await;
        running.shutdown().await;

        assert_eq!(
            detail.run.status, "completed",
            "{backend:?}: {:?}",
            detail.run.error
        );
        assert_eq!(detail.context["st_after"]["at"], "2026-12-07T10:00:00Z");
        assert_eq!(detail.context["st_ship"]["signal"], json!(sent.signal_id));
        let resumes = resumes.lock().unwrap().clone();
        assert_eq!(resumes.len(), 2, "{backend:?}: a resume, and its retry");
        assert_eq!(
            resumes[0], resumes[1],
            "{backend:?}: the retry got the same signal"
        );
        assert_eq!(
            resumes[0].signal_id.as_deref(),
            Some(sent.signal_id.as_str())
        );
        assert_eq!(resumes[0].key.as_deref(), Some("delivered-5001"));
        assert_eq!(resumes[0].subject.as_deref(), Some("tk_5001"));
        assert!(!resumes[0].timed_out);
        let statuses: Vec<(&str, &str)> = detail
            .steps
            .iter()
            .map(|s| (s.step_id.as_str(), s.status.as_str()))
            .collect();
        assert_eq!(
            statuses,
            // The waiting row became its first resume's attempt.
            vec![
                ("st_ship", "retrying"),
                ("st_ship", "completed"),
                ("st_after", "completed")
            ],
            "{backend:?}"
        );
        assert_eq!(
            detail.run.actions, 2,
            "{backend:?}: a resume is no second action"
        );
        h.cleanup().await;
    }
}

#[tokio::test]
async fn a_cancelled_run_calls_its_waiting_steps_cancel_hook_once() {
    for backend in backends() {
        let released = Arc::new(AtomicU32::new(0));
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/hold",
            Hold {
                released: released.clone(),
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([
                { "id": "st_hold", "type": "acme/hold", "config": { "booking": "B-{{orderId}}" } }
            ])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({ "orderId": "5001" }), None)
            .await
            .unwrap();
        h.reaches(&run, "waiting").await;
        assert_eq!(released.load(Ordering::SeqCst), 0, "{backend:?}");
        h.store.cancel_run(&h.tenant, &run).await.unwrap();
        engine.job_ready();
        let detail = h.finished(&run).await;
        // A later cancel of the ended run is refused and calls nothing.
        assert!(h.store.cancel_run(&h.tenant, &run).await.is_err());
        tokio::time::sleep(Duration::from_millis(300)).await;
        running.shutdown().await;

        assert_eq!(detail.run.status, "cancelled", "{backend:?}");
        assert_eq!(released.load(Ordering::SeqCst), 1, "{backend:?}: once");
        assert!(
            detail.context.get("_live").is_none(),
            "{backend:?}: {:#}",
            detail.context
        );
        h.cleanup().await;
    }
}

#[tokio::test]
async fn a_step_types_own_retry_policy_comes_before_its_automations() {
    for backend in backends() {
        let calls = Arc::new(Calls::default());
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/charge",
            OneShot {
                calls: calls.clone(),
            },
        );
        let h = Harness::new(backend, registry).await;
        // The automation retries 3 times; the type says once.
        let automation = h
            .automation(manual(json!([
                { "id": "st_charge", "type": "acme/charge", "config": {} },
            ])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({}), None)
            .await
            .unwrap();
        let detail = h.finished(&run).await;
        running.shutdown().await;
        assert_eq!(detail.run.status, "failed", "{backend:?}");
        assert_eq!(calls.all().len(), 1, "{backend:?}");
        h.cleanup().await;
    }
}

/// Waits for its order to be both paid and packed (signals sent before
/// it began do not count), then publishes what each said.
struct Pair {
    resumes: Arc<Mutex<Vec<tok_engine::Resumed>>>,
}

#[async_trait]
impl StepHandler for Pair {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        unreachable!("the engine calls `handle`")
    }

    async fn handle(&self, call: StepCall) -> Result<StepOutcome, StepError> {
        let order = call.config["order"].as_str().unwrap_or_default().to_owned();
        let wait = WaitFor::signal(format!("paid-{order}"))
            .or(format!("packed-{order}"))
            .all()
            .only_new()
            .timeout(Duration::from_secs(3600))
            .described(format!("order {order} to be paid and packed"));
        Ok(StepOutcome::Wait(wait))
    }

    async fn resume(
        &self,
        _call: StepCall,
        resumed: tok_engine::Resumed,
    ) -> Result<Map<String, Value>, StepError> {
        self.resumes.lock().unwrap().push(resumed.clone());
        Ok(Map::from_iter([
            ("came".to_owned(), json!(resumed.keys)),
            (
                "by".to_owned(),
                resumed.signals["paid-5001"]["payload"]["by"].clone(),
            ),
        ]))
    }
}

#[tokio::test]
async fn a_custom_step_waits_for_each_of_two_signals_and_escalates_meanwhile() {
    for backend in backends() {
        let resumes = Arc::new(Mutex::new(Vec::new()));
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/pair",
            Pair {
                resumes: resumes.clone(),
            },
        );
        let h = Harness::new(backend, registry).await;
        // A built-in step that never waits has no escalations.
        let refused = prepare(
            &serde_json::to_vec(&manual(json!([
                { "id": "st_tag", "type": "ticket/add-tags", "config": { "tags": ["x"] },
                  "escalations": [{ "after": "1h", "steps": [
                      { "id": "st_l", "type": "flow/log", "config": { "message": "late" } }] }] }
            ])))
            .unwrap(),
            &h.registry,
        )
        .expect_err("escalations on a step that never waits");
        assert_eq!(refused[0].path, "steps.0.escalations", "{refused:?}");
        assert!(refused[0].message.contains("never waits"), "{refused:?}");

        let automation = h
            .automation(manual(json!([
                { "id": "st_pair", "type": "acme/pair", "config": { "order": "{{orderId}}" },
                  "escalations": [{ "after": "100ms", "steps": [
                      { "id": "st_nudge", "type": "set", "config": { "values": { "nudged": true } } }
                  ] }] }
            ])))
            .await;
        let signal = |key: &str, by: &str| tok_store::NewSignal {
            key: key.into(),
            payload: json!({ "by": by }),
            idempotency_key: None,
            lookback_ms: 600_000,
            actor: None,
            subject: None,
        };
        // Buffered before the run: it does not count.
        h.store
            .send_signal(&h.tenant, signal("paid-5001", "too early"))
            .await
            .unwrap();
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({ "orderId": "5001" }), None)
            .await
            .unwrap();
        let escalated = h
            .until(&run, "escalate and wait again", |d| {
                // The run is `running` for a moment after its escalation
                // wrote the context and before the step parks again.
                d.context["st_nudge"]["nudged"] == true
                    && d.waits.len() == 2
                    && d.run.status == "waiting"
            })
            .await;
        assert_eq!(escalated.run.status, "waiting", "{backend:?}");
        let waiting = escalated
            .steps
            .iter()
            .find(|s| s.step_id == "st_pair")
            .expect("the step's record");
        assert!(
            waiting
                .log
                .to_string()
                .contains("waiting for order 5001 to be paid and packed until"),
            "{backend:?}: {:?}",
            waiting.log
        );

        h.store
            .send_signal(&h.tenant, signal("paid-5001", "Ann"))
            .await
            .unwrap();
        engine.job_ready();
        let one_left = h
            .until(&run, "park again on the key missing", |d| {
                d.run.status == "waiting" && d.waits.len() == 1
            })
            .await;
        assert_eq!(one_left.waits[0].key, "packed-5001", "{backend:?}");
        assert!(resumes.lock().unwrap().is_empty(), "{backend:?}");

        h.store
            .send_signal(&h.tenant, signal("packed-5001", "Bob"))
            .await
            .unwrap();
        engine.job_ready();
        let detail = h.finished(&run).await;
        running.shutdown().await;
        assert_eq!(
            detail.run.status, "completed",
            "{backend:?}: {:?}",
            detail.run.error
        );
        assert_eq!(
            detail.context["st_pair"]["came"],
            json!(["paid-5001", "packed-5001"])
        );
        assert_eq!(detail.context["st_pair"]["by"], "Ann", "{backend:?}");
        let resumes = resumes.lock().unwrap().clone();
        assert_eq!(resumes.len(), 1, "{backend:?}");
        assert!(!resumes[0].timed_out && resumes[0].missing.is_empty());
        h.cleanup().await;
    }
}

/// Books a slot at a service that answers slowly; its `cancel` hook
/// releases the booking.
struct SlowBooking {
    started: Arc<tokio::sync::Notify>,
    answer: Arc<tokio::sync::Notify>,
    released: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl StepHandler for SlowBooking {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        self.started.notify_one();
        self.answer.notified().await;
        Ok(Map::from_iter([("slot".to_owned(), json!("S-1"))]))
    }

    async fn cancel(&self, call: StepCall) -> Result<(), StepError> {
        let booking = call.config["booking"].as_str().unwrap_or_default();
        self.released.lock().unwrap().push(booking.to_owned());
        Ok(())
    }
}

#[tokio::test]
async fn a_run_cancelled_while_its_step_runs_calls_that_steps_cancel_hook_once() {
    for backend in backends() {
        let started = Arc::new(tokio::sync::Notify::new());
        let answer = Arc::new(tokio::sync::Notify::new());
        let released = Arc::new(Mutex::new(Vec::new()));
        let mut registry = Registry::with_builtins();
        registry.register(
            "acme/book",
            SlowBooking {
                started: started.clone(),
                answer: answer.clone(),
                released: released.clone(),
            },
        );
        let h = Harness::new(backend, registry).await;
        let automation = h
            .automation(manual(json!([
                { "id": "st_book", "type": "acme/book", "config": { "booking": "B-{{orderId}}" } },
                { "id": "st_after", "type": "set", "config": { "values": { "x": 1 } } }
            ])))
            .await;
        let engine = h.engine("node-a", quick());
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&h.tenant, &automation, json!({ "orderId": "5001" }), None)
            .await
            .unwrap();
        started.notified().await;
        h.store.cancel_run(&h.tenant, &run).await.unwrap();
        answer.notify_one();
        for _ in 0..200 {
            if !released.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Time for a second call, which must not come.
        tokio::time::sleep(Duration::from_millis(300)).await;
        running.shutdown().await;
        let detail = h.store.run(&h.tenant, &run).await.unwrap().unwrap();
        assert_eq!(detail.run.status, "cancelled", "{backend:?}");
        assert_eq!(
            *released.lock().unwrap(),
            ["B-5001"],
            "{backend:?}: the hook ran once, with its config rendered"
        );
        assert!(
            detail.context.get("st_book").is_none(),
            "{backend:?}: the answer that came after the cancel is not recorded"
        );
        h.cleanup().await;
    }
}
