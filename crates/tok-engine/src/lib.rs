//! tok's engine: the phases that move runs forward, over any [`Store`].
//!
//! Data flows webhook → inbox row → [`dispatch`] (runs and first jobs, one
//! transaction; the control steps a run begins with are decided there too)
//! → job queue → `execute` (the worker pool: one claim, the decider's
//! transition, one record transaction). What happens next in a run is
//! decided in one place, `tok-core`'s `advance`; [`fairness`] holds every
//! rule that keeps one tenant from crowding out another; [`registry`] knows
//! every step type. Nothing here keeps progress in memory: every decision
//! is written before it matters, so a process may die at any line.
//! In-process wake-ups only shorten the wait; a slow poll is the fallback,
//! so several processes sharing one PostgreSQL need no other channel.
//!
//! This file starts and stops the phases.

pub mod authorize;
pub mod definitions;
pub mod dispatch;
mod execute;
mod failure;
pub mod fairness;
pub mod operations;
pub mod outbound;
pub mod recorded;
pub mod registry;
pub mod scheduler;
mod steps;
pub mod stream;
pub mod traces;
pub mod widgets;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::FutureExt as _;
use serde_json::{Map, Value, json};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::flow;
use tok_core::ids::{AutomationId, RunId, TenantId};
use tok_store::{AutomationStatus, NewEvent, NewRun, Store, StoreError};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// Describes every metric the engine records (and the store's), so that
/// each has its `# HELP` line in `/metrics`. Call it once the recorder is
/// installed; a metric added without a description fails
/// `crates/tok/tests/metrics_help.rs`.
pub fn describe_metrics() {
    tok_store::describe_metrics();
    scheduler::sample::describe();
    execute::runner::describe();
    dispatch::describe();
    steps::describe();
    metrics::describe_counter!(
        "tok_loop_panics_total",
        "Panics of an engine loop (by loop), each started again after a second"
    );
    metrics::describe_counter!(
        "tok_tenant_rows_erased_total",
        "Rows of deleted tenants erased by the scheduler, in bounded batches"
    );
}

pub use authorize::{StepAuthorizer, StepToAuthorize, SuspendedTenants, Verdict};
pub use definitions::DefinitionCache;
pub use fairness::Fairness;
pub use outbound::OutboundAllow;
pub use registry::{
    ConfigError, Effects, Lease, Registry, Resumed, StepCall, StepHandler, StepOutcome, WaitFor,
};
pub use steps::run_workflow::child_refused;
pub use steps::script::ScriptStep;
pub use stream::Stream;
pub use widgets::{WidgetData, WidgetError, Widgets};

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Definition(String),
    #[error("automation {0} not found")]
    AutomationNotFound(AutomationId),
    #[error("automation {0} is paused; resume it before starting runs")]
    AutomationPaused(AutomationId),
    #[error("automation {0} was deleted; its runs and versions are kept, but it starts no run")]
    AutomationArchived(AutomationId),
    /// A manual start over the automation's `settings.limits.startsPerMinute`.
    #[error(
        "start_rate_exceeded: automation {automation} may start {per_minute} runs per minute \
         (settings.limits.startsPerMinute of the automation, or else of its tenant); retry in {} s",
        whole_seconds(*.retry_after_ms)
    )]
    StartRateExceeded {
        automation: AutomationId,
        per_minute: u32,
        retry_after_ms: i64,
    },
}

impl EngineError {
    /// Whether this is a tenant's own database being away
    /// ([`StoreError::TenantDatabaseUnavailable`]).
    pub fn is_tenant_database_away(&self) -> bool {
        matches!(self, EngineError::Store(e) if e.is_tenant_database_away())
    }
}

/// Milliseconds as whole seconds, rounded up (at least 1), as `Retry-After`.
fn whole_seconds(ms: i64) -> u64 {
    (ms.max(1) as u64).div_ceil(1000)
}

// The defaults of [`EngineConfig`], written once: its `Default` and the
// binary's configuration (`TOK_*`, crates/tok/src/config.rs) both take them
// from here, and README.md and docs/operations.md document them.

/// Worker slots per process ([`EngineConfig::concurrency`]) unless
/// `TOK_CONCURRENCY` says otherwise. A slot is a task, not a thread, and
/// holds no database connection while its step runs; most steps wait on a
/// service, and each slot's records join the group commit, so more slots
/// than cores keeps both the services and the database busy.
pub const DEFAULT_CONCURRENCY: usize = 64;

/// How long a claim is valid without a heartbeat ([`EngineConfig::lease`])
/// unless `TOK_LEASE_SECS` says otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Heartbeats per lease: running steps extend their leases every third of
/// it ([`EngineConfig::heartbeat`]), so two heartbeats may be missed before
/// a lease expires.
pub const HEARTBEATS_PER_LEASE: u32 = 3;

/// How long a stopping worker waits for its steps in flight
/// ([`EngineConfig::shutdown_grace`]) unless `TOK_SHUTDOWN_GRACE` says
/// otherwise: within Kubernetes' default termination grace period.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// How long a signal that resumed no wait stays buffered
/// ([`EngineConfig::signal_lookback`]) unless `TOK_SIGNAL_LOOKBACK` says
/// otherwise.
pub const DEFAULT_SIGNAL_LOOKBACK: Duration = Duration::from_secs(10 * 60);

/// The share of successful steps stored whole ([`EngineConfig::step_sample`])
/// unless `TOK_STEP_SAMPLE` says otherwise.
pub const DEFAULT_STEP_SAMPLE: f64 = 0.01;

/// The node id ([`EngineConfig::node_id`]) when nothing names the node (the
/// binary uses the host name when `TOK_NODE_ID` is unset).
pub const DEFAULT_NODE_ID: &str = "local";

/// How a process runs its engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Stable per node (configuration or host name). Claims are held under
    /// it and this process's incarnation (`node:incarnation`, see
    /// [`Engine::holder`]), so two processes given one node id never take
    /// or release each other's claims.
    pub node_id: String,
    /// Worker slots: steps that may run at once in this process
    /// ([`DEFAULT_CONCURRENCY`]).
    pub concurrency: usize,
    /// How long a claim is valid without a heartbeat ([`DEFAULT_LEASE`]).
    pub lease: Duration,
    /// How often running steps extend their leases (well under `lease`: by
    /// default `lease / HEARTBEATS_PER_LEASE`, see [`HEARTBEATS_PER_LEASE`]).
    pub heartbeat: Duration,
    /// Longest sleep between looks at the queue when nothing wakes the worker
    /// (another process's work on a shared PostgreSQL).
    pub poll_interval: Duration,
    /// Events the dispatcher takes per transaction, or up to four times as
    /// many while as many worker slots are free to start their runs. Small
    /// while the slots are busy: a batch is taken round robin between
    /// tenants, so another tenant's event waits for the batch in progress
    /// and then rides in the next one; 16 gives the same throughput as 64
    /// with a shorter wait (docs/performance.md).
    pub dispatch_batch: u32,
    /// How long a stopping worker waits for the steps in flight
    /// ([`DEFAULT_SHUTDOWN_GRACE`]).
    pub shutdown_grace: Duration,
    /// How long runs may chain steps on one claim (see [`Fairness`]).
    pub fairness: Fairness,
    /// How long a signal that resumed no wait stays buffered for a
    /// `wait_for_event` that starts on its key (`POST /api/signals` and
    /// `emit` with a `key`). Ten minutes: a signal that arrives while the
    /// step before the wait still runs (or retries) is not lost, and one
    /// meant for a wait long gone does not linger for the next run.
    pub signal_lookback: Duration,
    /// The wake's tick and lease ([`scheduler`]).
    pub scheduler: scheduler::SchedulerConfig,
    /// The share of successful steps stored with their whole input and
    /// output (0 to 1; `TOK_STEP_SAMPLE`). One in a hundred: enough to see
    /// what a step's data look like, a hundredth of the volume
    /// (see [`tok_core::retention`]).
    pub step_sample: f64,
    /// What the outbound guard lets tenants' calls reach beyond public
    /// addresses (`TOK_OUTBOUND_ALLOW`, [`outbound`]). Closed by default:
    /// no loopback, private, link-local, CGNAT or other internal address.
    /// The connector steps and widgets are built from it
    /// ([`Registry::with_connectors`], [`Widgets::new`]).
    pub outbound: OutboundAllow,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            node_id: DEFAULT_NODE_ID.into(),
            concurrency: DEFAULT_CONCURRENCY,
            lease: DEFAULT_LEASE,
            heartbeat: DEFAULT_LEASE / HEARTBEATS_PER_LEASE,
            poll_interval: Duration::from_millis(250),
            dispatch_batch: 16,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            fairness: Fairness::default(),
            signal_lookback: DEFAULT_SIGNAL_LOOKBACK,
            scheduler: scheduler::SchedulerConfig::default(),
            step_sample: DEFAULT_STEP_SAMPLE,
            outbound: OutboundAllow::default(),
        }
    }
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Registry,
    pub(crate) config: EngineConfig,
    pub(crate) defs: DefinitionCache,
    /// Wakes the dispatcher: an event was accepted.
    pub(crate) inbox: Notify,
    /// Wakes the urgent dispatcher: a tenant has a new event while another
    /// tenant's backlog fills the dispatches.
    pub(crate) urgent: Notify,
    /// Whose backlog fills the dispatches, and the other tenants with new
    /// events for the urgent dispatcher.
    pub(crate) backlog: std::sync::Mutex<fairness::Backlog>,
    /// Whether the last bulk dispatch let other tenants' events go first.
    pub(crate) crowding: std::sync::Mutex<fairness::Crowding>,
    /// Wakes the worker pool: a job may be ready or a slot came free.
    pub(crate) work: Notify,
    /// Wakes the bulk operations' loop: an operation was made.
    pub(crate) operations: Notify,
    /// The worker pool's slots, which the dispatcher may fill directly.
    pub(crate) slots: std::sync::Mutex<fairness::Slots>,
    /// What committed, for the live stream.
    pub(crate) stream: Stream,
    /// Asked before every step with side effects ([`authorize`]).
    pub(crate) authorizer: Arc<dyn StepAuthorizer>,
    tenants: RwLock<Arc<Vec<TenantId>>>,
    /// Whom this process's claims name: `node:incarnation`.
    pub(crate) holder: String,
}

impl Inner {
    pub(crate) fn backlog(&self) -> std::sync::MutexGuard<'_, fairness::Backlog> {
        self.backlog.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn tenants(&self) -> Arc<Vec<TenantId>> {
        self.tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn lease_ms(&self) -> i64 {
        self.config.lease.as_millis() as i64
    }
}

/// A handle on the engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// The running background tasks; stop them with [`Running::shutdown`].
pub struct Running {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops claiming and dispatching, lets the steps in flight finish (up to
    /// the grace period), and returns when every task has ended.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

impl Engine {
    /// An engine with the built-in authorizer ([`SuspendedTenants`]).
    pub fn new(store: Arc<dyn Store>, registry: Registry, config: EngineConfig) -> Self {
        let authorizer = Arc::new(SuspendedTenants::new(store.clone()));
        Self::with_authorizer(store, registry, config, authorizer)
    }

    /// An engine whose steps with side effects `authorizer` allows or denies.
    pub fn with_authorizer(
        store: Arc<dyn Store>,
        registry: Registry,
        config: EngineConfig,
        authorizer: Arc<dyn StepAuthorizer>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                registry,
                defs: DefinitionCache::default(),
                inbox: Notify::new(),
                urgent: Notify::new(),
                backlog: Default::default(),
                crowding: Default::default(),
                work: Notify::new(),
                operations: Notify::new(),
                slots: Default::default(),
                stream: Stream::default(),
                authorizer,
                tenants: RwLock::default(),
                holder: format!("{}:{}", config.node_id, &tok_store::random_token()[..12]),
                config,
            }),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// A saved version of one of the tenant's automations, parsed (and
    /// cached: a version never changes).
    pub async fn definition(
        &self,
        tenant: &TenantId,
        automation: &AutomationId,
        version: i32,
    ) -> Result<Arc<Automation>> {
        let store: &dyn tok_store::DefinitionStore = self.inner.store.as_ref();
        self.inner
            .defs
            .get(store, tenant, automation, version)
            .await
    }

    /// The admin changed a tenant through this process: what the engine
    /// keeps of its settings (the authorizer's answer) is read again.
    pub fn tenant_changed(&self, tenant: &TenantId) {
        self.inner.authorizer.tenant_changed(tenant);
    }

    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Whom this process's claims name in `jobs.locked_by`: the node id
    /// and a random incarnation, new at each [`Engine::new`].
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// The live stream of this process: publish after a commit, subscribe
    /// for `GET /api/stream`.
    pub fn stream(&self) -> &Stream {
        &self.inner.stream
    }

    /// Tells the dispatcher an event of `tenant` is waiting.
    pub fn event_accepted(&self, tenant: &TenantId) {
        if self.inner.backlog().note(tenant) {
            self.inner.urgent.notify_one();
        }
        self.inner.inbox.notify_one();
    }

    /// Tells the worker pool a job may be ready now (a retried or resumed run).
    pub fn job_ready(&self) {
        self.inner.work.notify_one();
    }

    /// Tells the bulk operations' loop an operation was made (on this node;
    /// another node's loop finds it at its next tick).
    pub fn operation_started(&self) {
        self.inner.operations.notify_one();
    }

    /// Whether this process's worker pool claims work: it runs (started,
    /// not stopping) and its last claim reached the queue. What a worker
    /// node's `/readyz` answers; the error says why not.
    pub fn claims_work(&self) -> std::result::Result<(), String> {
        let slots = execute::pool::slots(&self.inner);
        match (&slots.claim_failing, slots.open) {
            (_, false) => Err("the worker pool is not running".into()),
            (Some(e), true) => Err(format!("claims fail: {e}")),
            (None, true) => Ok(()),
        }
    }

    /// Re-reads the list of tenants the queue serves (after one is created).
    pub async fn refresh_tenants(&self) -> Result<()> {
        let ids = self.inner.store.tenant_ids().await?;
        *self
            .inner
            .tenants
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(ids);
        Ok(())
    }

    /// Starts the dispatcher and the worker pool (`workers`), or only the
    /// dispatcher. Releases this node's earlier claims first.
    pub async fn start(&self, workers: bool) -> Result<Running> {
        self.refresh_tenants().await?;
        // Only claims no live process holds are released: on SQLite every
        // claim (one process serves a file; `tok serve` refuses a second),
        // on PostgreSQL this incarnation's (none yet): another process's
        // claims, of this node id or not, end with its lease.
        let released = self.inner.store.release_claims(&self.inner.holder).await?;
        if released > 0 {
            tracing::info!(released, holder = %self.inner.holder, "released claims of an earlier start");
        }
        if workers {
            // Weak: the listener ends with the engine, not the other way round.
            let inner = Arc::downgrade(&self.inner);
            self.inner
                .store
                .listen_for_work(Arc::new(move || match inner.upgrade() {
                    Some(inner) => {
                        inner.work.notify_one();
                        true
                    }
                    None => false,
                }))
                .await?;
        }
        let (stop, shutdown) = watch::channel(false);
        let inner = &self.inner;
        let mut tasks = vec![
            supervise("dispatch", &shutdown, {
                let (inner, shutdown) = (inner.clone(), shutdown.clone());
                move || dispatch::dispatch_loop(inner.clone(), shutdown.clone())
            }),
            supervise("urgent dispatch", &shutdown, {
                let (inner, shutdown) = (inner.clone(), shutdown.clone());
                move || dispatch::urgent_dispatch_loop(inner.clone(), shutdown.clone())
            }),
            supervise("upkeep", &shutdown, {
                let (engine, shutdown) = (self.clone(), shutdown.clone());
                move || upkeep(engine.clone(), shutdown.clone())
            }),
            supervise("scheduler", &shutdown, {
                let (inner, shutdown) = (inner.clone(), shutdown.clone());
                move || scheduler::wake_loop(inner.clone(), workers, shutdown.clone())
            }),
        ];
        if workers {
            tasks.push(supervise("worker pool", &shutdown, {
                let (inner, shutdown) = (inner.clone(), shutdown.clone());
                move || execute::pool::run_pool(inner.clone(), shutdown.clone())
            }));
        }
        Ok(Running { stop, tasks })
    }

    /// Starts a run of an automation by hand, with `input` as its params and
    /// body. A repeated `idempotency_key` returns the run the first call
    /// started.
    pub async fn start_run(
        &self,
        tenant: &TenantId,
        automation_id: &AutomationId,
        input: Value,
        idempotency_key: Option<String>,
    ) -> Result<RunId> {
        let actor = json!({ "kind": "system", "source": "manual" });
        self.start_run_as(tenant, automation_id, input, idempotency_key, actor, None)
            .await
    }

    /// [`Engine::start_run`] on behalf of `actor` (`{"kind": "key", "id"}`
    /// for a start through the API), which the run records as its `actor`;
    /// `traceparent` (checked by [`traces::valid_traceparent`]) is the
    /// trace the run continues.
    pub async fn start_run_as(
        &self,
        tenant: &TenantId,
        automation_id: &AutomationId,
        input: Value,
        idempotency_key: Option<String>,
        actor: Value,
        traceparent: Option<String>,
    ) -> Result<RunId> {
        let store = &self.inner.store;
        let row = store
            .automation(tenant, automation_id)
            .await?
            .ok_or_else(|| EngineError::AutomationNotFound(automation_id.clone()))?;
        match row.status {
            AutomationStatus::Active => {}
            AutomationStatus::Paused => {
                return Err(EngineError::AutomationPaused(automation_id.clone()));
            }
            AutomationStatus::Archived => {
                return Err(EngineError::AutomationArchived(automation_id.clone()));
            }
        }
        let automation =
            self.inner
                .defs
                .parse(&row.tenant_id, &row.id, row.version, &row.definition)?;
        let params = match &input {
            Value::Object(map) => map.clone(),
            _ => Map::new(),
        };
        let event_key = idempotency_key
            .clone()
            .unwrap_or_else(tok_store::random_token);
        let run_id = RunId::generate();
        let context = Context::new(
            params.clone(),
            input.clone(),
            json!({ "type": "manual", "depth": 0, "runId": run_id, "actor": actor,
                    "traceparent": traceparent }),
        );
        let event = NewEvent {
            source_id: None,
            source_kind: "manual".into(),
            idempotency_key: event_key,
            payload: input,
            params: Value::Object(params),
            depth: 0,
            cause_run_id: None,
            origin_automation_id: None,
            target_automation_id: Some(automation_id.clone()),
            traceparent,
            ..NewEvent::default()
        };
        let context = context.into_value();
        let priority = dispatch::plan::run_priority(&automation, &context, automation_id);
        let cancels = dispatch::plan::cancel_keys(&automation, &context);
        let run = NewRun {
            id: run_id,
            automation_id: automation_id.clone(),
            version: row.version,
            trigger_type: "manual".into(),
            context,
            depth: 0,
            queue_key: None,
            priority,
            first_path: flow::first_path(&automation.steps).map(|path| path.to_string()),
            idempotency_key,
            subject_ticket_id: None,
            steps: Vec::new(),
            actions: 0,
            refused: None,
            skipped: None,
            hold: None,
            start_by: dispatch::plan::start_by(&automation),
            cancels,
            cancelled: None,
        };
        if automation.flow.control().is_some() {
            // Its start control decides, as for an event of a source (a
            // start over the start limit is then written `refused`).
            let planned = stream::Planned::default();
            let gated = dispatch::start::through_controls(
                &**store,
                tenant,
                event,
                run,
                &automation,
                Some(&planned),
            )
            .await?;
            let Some(id) = gated.run().cloned() else {
                return Err(EngineError::AutomationPaused(automation_id.clone()));
            };
            // The run as it was written (queued, held or skipped); a
            // joined run was told when it was made.
            planned.publish(&self.inner.stream);
            self.inner.work.notify_one();
            return Ok(id);
        }
        // An automation without a start limit of its own has its tenant's.
        let per_minute = match automation.settings.limits.starts_per_minute {
            Some(own) => Some(own),
            None => store
                .tenant(tenant)
                .await?
                .and_then(|t| t.limits.starts_per_minute),
        };
        let id = match store
            .start_run_limited(tenant, event, run, per_minute)
            .await?
        {
            tok_store::Started::Run(id) => id,
            tok_store::Started::Limited { retry_after_ms } => {
                return Err(EngineError::StartRateExceeded {
                    automation: automation_id.clone(),
                    per_minute: per_minute.unwrap_or_default(),
                    retry_after_ms,
                });
            }
        };
        let data = stream::run_update(&id, automation_id, tok_store::RunStatus::Queued);
        self.inner
            .stream
            .publish(tenant, stream::Kind::RunUpdated, data);
        self.inner.work.notify_one();
        Ok(id)
    }
}

/// Whether a background loop should end: shutdown was asked for, or the
/// [`Running`] handle was dropped.
pub(crate) fn stopping(shutdown: &watch::Receiver<bool>) -> bool {
    *shutdown.borrow() || shutdown.has_changed().is_err()
}

/// Runs one of the engine's loops in a task of its own; a loop that
/// panics is logged and started again a second later, so a bug in one
/// round never leaves a server that accepts events and dispatches nothing.
/// (Its progress is in rows, so a fresh start loses nothing.)
fn supervise<F, Fut>(
    name: &'static str,
    shutdown: &watch::Receiver<bool>,
    mut start: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        loop {
            let Err(panic) = AssertUnwindSafe(start()).catch_unwind().await else {
                return;
            };
            let panic = panic_message(&*panic);
            tracing::error!(engine_loop = name, %panic, "an engine loop panicked; it starts again");
            metrics::counter!("tok_loop_panics_total", "loop" => name).increment(1);
            if stopping(&shutdown) {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// The words of a panic's payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_owned(),
    }
}

/// Keeps the tenant list fresh for tenants created by other processes.
/// (Partitions are created ahead by the scheduler's retention pass, on the
/// node that holds the wake: see [`scheduler::retention`].)
async fn upkeep(engine: Engine, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = shutdown.changed() => {}
        }
        if stopping(&shutdown) {
            return;
        }
        if let Err(e) = engine.refresh_tenants().await {
            tracing::warn!(error = %e, "could not refresh the tenant list");
        }
    }
}
