//! The scheduler ("wake", docs/operations.md, "The scheduler"): one loop
//! per deployment that starts the runs of poll and schedule triggers when
//! they come due.
//!
//! Each tick the wake first takes or renews the lease row
//! (`scheduler_lease`): on PostgreSQL only the node holding it goes on, and
//! another node takes over once a dead holder's lease expired; on SQLite
//! the one process holds it. The holder then brings the schedule rows of
//! every tenant up to date with the saved automations and fires what is
//! due ([`triggers`]). The wake never calls a service: a poll's request is
//! its run's first step, executed by the worker pool like any other.
//!
//! Every [`SchedulerConfig::watch_every`] the holder also looks for stuck
//! runs and raises platform incidents for them, and says `unknown` of the
//! audit rows a stopped process left pending ([`watch`]); every tick, in
//! a task of its own, it erases the rows of the tenants being deleted
//! ([`offboarding`]); and every
//! [`SchedulerConfig::retention_every`], in a task of its own, expires
//! data past each tenant's retention ([`retention`]). Every node running
//! the engine, holder or not, samples the queue's gauges for `/metrics`
//! ([`sample`]), so a worker-only node reports them too; the holder alone
//! also keeps every tenant's queue as a sample row every
//! [`SchedulerConfig::queue_sample_every`], for the dashboard's charts.
//!
//! Time comes from a [`Clock`] the scheduler is given, so tests drive
//! polls, cron ticks and catch-up without sleeping. A tick is fired once
//! however many schedulers race for it (its run's idempotency key is the
//! automation's due time), so a holder that lost its lease mid-tick does
//! no harm.

pub mod offboarding;
pub mod retention;
pub mod sample;
mod triggers;
pub mod watch;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tok_core::ids::TenantId;
use tok_store::Store;

use crate::{DefinitionCache, Inner, Result};

pub use offboarding::ErasureReport;
pub use retention::ExpiryReport;
pub use triggers::sync_automation;

/// Where the scheduler reads the time (Unix milliseconds).
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> i64;
}

/// The process clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        tok_store::now_ms()
    }
}

/// A clock that moves only when told to: tests set it.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn at(ms: i64) -> Self {
        Self(AtomicI64::new(ms))
    }

    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// How often the wake runs and how long its lease lives.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Between two ticks. One second: a cron with seconds (`*/2 * * * * *`)
    /// fires on time, and a tick with nothing due is the lease's write and
    /// three small reads for every tenant together.
    pub tick: Duration,
    /// How long the lease lives without renewal: the longest a dead
    /// holder's schedules stay unfired before another node takes over.
    pub lease: Duration,
    /// How often the holder looks for stuck runs ([`watch`]): 30 s, well
    /// under the shortest threshold (a wait a minute overdue).
    pub watch_every: Duration,
    /// How often the holder expires data past its retention
    /// ([`retention`]): hourly, as retention is counted in days; sooner
    /// while a pass left work behind.
    pub retention_every: Duration,
    /// Rows one expiry transaction deletes at most: a thousand keeps each
    /// transaction (and SQLite's one writer) short.
    pub expiry_batch: u32,
    /// Batches per tenant and kind of row in one pass: with 1000 rows
    /// each, 100 k rows a pass, more than a busy tenant writes in an hour.
    pub expiry_batches: u32,
    /// How often every engine node samples the queue for its metrics.
    pub sample_every: Duration,
    /// How often the holder keeps a sample of every tenant's queue
    /// (`queue_samples`, the dashboard's charts of the last hour): 30 s,
    /// 120 points an hour, one statement for all tenants each time.
    pub queue_sample_every: Duration,
    /// Rows of one month the expiry moves out of a default partition in
    /// one transaction at most (PostgreSQL): 50,000 step rows of a few kB
    /// are a short transaction; a month with more is raised as an
    /// incident and moved by hand.
    pub partition_move_rows: u64,
    /// Rows one batch of a deleted tenant's erasure deletes at most, in
    /// one statement ([`offboarding`]): a thousand, as for expiry.
    pub erasure_batch: u32,
    /// Batches one erasure pass takes at most, a pass every tick: 100 k
    /// rows a second while a deletion goes on, each batch short enough
    /// that claims and webhooks pass between them.
    pub erasure_batches: u32,
    /// The platform's run timeout (`TOK_RUN_TIMEOUT`, off by default): a
    /// run of an automation without `settings.runTimeout` unfinished this
    /// long after it was made is failed like one past its own ([`watch`]).
    pub run_timeout: Option<Duration>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            tick: Duration::from_secs(1),
            lease: Duration::from_secs(15),
            watch_every: Duration::from_secs(30),
            retention_every: Duration::from_secs(3600),
            expiry_batch: 1000,
            expiry_batches: 100,
            sample_every: Duration::from_secs(5),
            queue_sample_every: Duration::from_secs(30),
            partition_move_rows: 50_000,
            erasure_batch: 1000,
            erasure_batches: 100,
            run_timeout: None,
        }
    }
}

/// What one tick did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WakeReport {
    /// This scheduler held the lease (and so looked for due triggers).
    pub held: bool,
    /// Poll runs started.
    pub polls: usize,
    /// Schedule runs started.
    pub schedules: usize,
    /// Due triggers passed over: a paused automation's tick, a poll whose
    /// last run has not finished, or a run the trigger's filter refused.
    pub skipped: usize,
    /// Stuck runs found by the watch (see [`watch`]).
    pub stuck: usize,
    /// Runs ended `expired`: not begun within their `flow.startTimeout`.
    pub expired: usize,
}

/// Whether a tenant's part of a pass over many failed because its own
/// database is away (`away`): the pass then skips it, its part waiting for
/// the next pass, and goes on with the other tenants.
fn skips(tenant: &TenantId, away: bool) -> bool {
    if away {
        tracing::debug!(%tenant, "skipped in this pass: the tenant's database is away");
    }
    away
}

/// One node's scheduler.
pub struct Scheduler {
    store: Arc<dyn Store>,
    defs: DefinitionCache,
    node: String,
    /// This process start: the lease row says which start of `node` holds it.
    incarnation: String,
    config: SchedulerConfig,
    clock: Arc<dyn Clock>,
    /// This node's free worker slots, when it runs workers (for
    /// `queue_stalled`: a queue that waits while workers are free).
    free_slots: Option<FreeSlots>,
    /// When the watch last looked.
    watched_at: AtomicI64,
    /// Partitions that could not be created: not tried again by this
    /// process (see [`retention`]).
    partitions_failed: Mutex<Vec<String>>,
}

/// Counts a node's free worker slots.
pub type FreeSlots = Arc<dyn Fn() -> usize + Send + Sync>;

impl Scheduler {
    pub fn new(
        store: Arc<dyn Store>,
        node: &str,
        config: SchedulerConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            store,
            defs: DefinitionCache::default(),
            node: node.to_owned(),
            incarnation: tok_store::random_token(),
            config,
            clock,
            free_slots: None,
            watched_at: AtomicI64::new(i64::MIN),
            partitions_failed: Mutex::default(),
        }
    }

    /// Tells the watch how many worker slots this node has free.
    pub fn with_free_slots(mut self, free: FreeSlots) -> Self {
        self.free_slots = Some(free);
        self
    }

    /// One tick: takes or renews the lease, and if this scheduler holds it,
    /// fires what is due for `tenants`.
    pub async fn wake(&self, tenants: &[TenantId]) -> Result<WakeReport> {
        let lease_ms = self.config.lease.as_millis() as i64;
        let held = self
            .store
            .hold_wake(&self.node, &self.incarnation, self.clock.now_ms(), lease_ms)
            .await?;
        if !held {
            return Ok(WakeReport::default());
        }
        let mut report = self.fire_due(tenants).await?;
        report.expired = watch::expire_unstarted(self, tenants).await?;
        watch::release_singletons(self, tenants).await?;
        let now = self.clock.now_ms();
        let every = self.config.watch_every.as_millis() as i64;
        if now.saturating_sub(self.watched_at.load(Ordering::SeqCst)) >= every {
            self.watched_at.store(now, Ordering::SeqCst);
            watch::look(self, tenants, &mut report).await?;
        }
        report.held = true;
        Ok(report)
    }

    /// Looks for stuck runs now (the wake does every
    /// [`SchedulerConfig::watch_every`]).
    pub async fn watch(&self, tenants: &[TenantId]) -> Result<WakeReport> {
        let mut report = WakeReport::default();
        watch::look(self, tenants, &mut report).await?;
        Ok(report)
    }

    /// Brings the schedule rows of `tenants` up to date and fires what is
    /// due, lease or not (the wake calls it once it holds the lease). A
    /// tick with nothing to change or fire is three reads however many
    /// tenants there are (two for the rows to bring up to date, one for
    /// the due rows), each row read with its tenant.
    pub async fn fire_due(&self, tenants: &[TenantId]) -> Result<WakeReport> {
        let mut report = WakeReport::default();
        triggers::reconcile(self, tenants).await?;
        triggers::fire(self, tenants, &mut report).await?;
        Ok(report)
    }

    /// Expires data past each tenant's retention now, lease or not (the
    /// engine does every [`SchedulerConfig::retention_every`] on the
    /// holder). `tenants` must be every tenant: a partition is dropped only
    /// when none of them keeps its rows.
    pub async fn expire(&self, tenants: &[TenantId]) -> Result<ExpiryReport> {
        retention::pass(self, tenants).await
    }

    fn failed_partitions(&self) -> Vec<String> {
        self.partitions_failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn partition_failed(&self, partition: &str) {
        self.partitions_failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(partition.to_owned());
    }

    /// Keeps a sample of each of `tenants`' queue now, lease or not (the
    /// holder does every [`SchedulerConfig::queue_sample_every`]); returns
    /// how many rows it wrote.
    pub async fn sample_queues(&self, tenants: &[TenantId]) -> Result<u64> {
        sample::keep(&*self.store, tenants, self.clock.now_ms(), &self.config).await
    }

    /// Gives the lease up, so another node takes over at its next tick.
    pub async fn release(&self) -> Result<()> {
        Ok(self.store.release_wake(&self.incarnation).await?)
    }
}

/// The engine's wake loop: a tick every [`SchedulerConfig::tick`] until
/// shutdown, then the lease is released.
pub(crate) async fn wake_loop(
    inner: Arc<Inner>,
    workers: bool,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut scheduler = Scheduler::new(
        inner.store.clone(),
        &inner.config.node_id,
        inner.config.scheduler.clone(),
        Arc::new(SystemClock),
    );
    if workers {
        let weak = Arc::downgrade(&inner);
        scheduler = scheduler.with_free_slots(Arc::new(move || {
            weak.upgrade().map_or(0, |inner| {
                let (general, reserved) = crate::execute::pool::slots(&inner).busy();
                inner.config.concurrency.saturating_sub(general + reserved)
            })
        }));
    }
    let scheduler = Arc::new(scheduler);
    let holds = Arc::new(AtomicBool::new(false));
    let expiry = tokio::spawn(retention_loop(
        scheduler.clone(),
        inner.clone(),
        holds.clone(),
        shutdown.clone(),
    ));
    let sampling = tokio::spawn(sample::sample_loop(inner.clone(), shutdown.clone()));
    let erasure = tokio::spawn(offboarding::offboarding_loop(
        scheduler.clone(),
        inner.clone(),
        holds.clone(),
        shutdown.clone(),
    ));
    let operations = tokio::spawn(crate::operations::operations_loop(
        inner.clone(),
        holds.clone(),
        shutdown.clone(),
    ));
    let history = tokio::spawn(sample::history_loop(
        inner.clone(),
        holds.clone(),
        shutdown.clone(),
    ));
    let mut holding = false;
    loop {
        if crate::stopping(&shutdown) {
            break;
        }
        match scheduler.wake(&inner.tenants()).await {
            Ok(report) => {
                if report.held != holding {
                    holding = report.held;
                    holds.store(holding, Ordering::SeqCst);
                    if holding {
                        tracing::info!(node = %inner.config.node_id, "this node runs the scheduler");
                    } else {
                        tracing::info!(node = %inner.config.node_id, "another node runs the scheduler");
                    }
                }
                if report.polls + report.schedules + report.stuck > 0 {
                    tracing::debug!(
                        polls = report.polls,
                        schedules = report.schedules,
                        "scheduler started runs"
                    );
                    inner.work.notify_one();
                }
            }
            Err(e) => tracing::warn!(error = %e, "scheduler tick failed; trying again next tick"),
        }
        tokio::select! {
            _ = tokio::time::sleep(inner.config.scheduler.tick) => {}
            _ = shutdown.changed() => {}
        }
    }
    holds.store(false, Ordering::SeqCst);
    // A pass in progress is cut short: each batch is its own transaction,
    // and the next holder's pass goes on from where this one stopped.
    expiry.abort();
    erasure.abort();
    sampling.abort();
    history.abort();
    // A page in progress is cut short: each run is its own transaction,
    // and the next holder goes on from the page's start.
    operations.abort();
    if holding && let Err(e) = scheduler.release().await {
        tracing::warn!(error = %e, "could not release the scheduler lease; it expires by itself");
    }
}

/// The holder's expiry, beside the wake loop so that a long pass never
/// delays a tick: every [`SchedulerConfig::retention_every`] while this
/// node holds the lease, or a tick after a pass that left work behind.
async fn retention_loop(
    scheduler: Arc<Scheduler>,
    inner: Arc<Inner>,
    holds: Arc<AtomicBool>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let config = inner.config.scheduler.clone();
    // The first pass comes soon after this node takes the lease.
    let mut wait = config.tick;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
        if crate::stopping(&shutdown) {
            return;
        }
        if !holds.load(Ordering::SeqCst) {
            wait = config.tick;
            continue;
        }
        wait = match scheduler.expire(&inner.tenants()).await {
            Ok(report) if report.more => config.tick,
            Ok(_) => config.retention_every,
            Err(e) => {
                tracing::warn!(error = %e, "expiry failed; trying again at the next pass");
                config.retention_every
            }
        };
    }
}
