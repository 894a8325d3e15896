//! Bulk operations on runs (docs/operations.md, "Retrying and cancelling
//! many runs"): which runs a filter takes, and the loop that retries or
//! cancels them in pages.
//!
//! A filter is the runs listing's (status, automation, trigger, a time
//! range of `created_at`) and `where`, the rules of a condition over each
//! run's context. An operation takes the runs created before it was made,
//! newest first, one page of [`PAGE`] runs at a time; the page's last run
//! is kept in the operation's row, and each run is acted on in one
//! transaction with the row that says so (`OperationStore::apply`), so a
//! restart goes on from the page it was in and acts on no run twice.
//!
//! The loop runs on the node that holds the scheduler's lease, beside its
//! wake. Each pass takes the oldest running operation of every tenant and
//! does one page of it: a tenant with a bulk retry of 100,000 runs gets a
//! page a pass like a tenant with 20, and the runs it queues wait for the
//! claim's fair share like every other job (`tok_core::fairness`).
//!
//! Bulk work yields to live work. A retry queues its next page only once
//! fewer than a page of its tenant's jobs wait to be claimed, so it is
//! paced by what the workers take rather than by the clock; and a retried
//! run's first job ranks below every live job of its tenant
//! (`tok_core::fairness::BULK_BELOW`), so a live run that comes later
//! still goes first, and such jobs hold at most half of a process's slots
//! (`tok_core::fairness::bulk_room`), so it finds a slot free. The figure is `tok bench --only bulk`
//! (docs/performance.md).
//!
//! A retry on the `current` version moves the run to its automation's
//! current version when its failed step is at the same path there
//! (`tok_core::flow::resumes_at`); a run it cannot move is counted failed
//! with the reason, and left as it was.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Deserialize;
use serde_json::Value;
use tok_core::condition::Condition;
use tok_core::definition::{Automation, Filter};
use tok_core::ids::{RunId, TenantId};
use tok_store::{
    Applied, AutomationRow, Operation, OperationAction, RunAction, RunFilter, RunSummary, Store,
};

use crate::{Inner, Result};

/// Runs one pass of an operation looks at (and the page of a count).
pub const PAGE: u32 = 100;

/// Between two passes while an operation has pages left.
const PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// The most rules a filter's `where` may hold: each is evaluated on every
/// run a count or a page looks at.
pub const MAX_RULES: usize = 20;

/// The most runs a filter may take: a count stops there.
pub const MAX_RUNS: i64 = 100_000;

/// What started a run (`trigger_type`), as filters name it.
pub const TRIGGERS: &[&str] = &["webhook", "event", "poll", "schedule", "manual", "parent"];

/// Which runs a bulk operation takes, as `POST /api/runs/bulk` sends it.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    pub status: Option<String>,
    pub automation: Option<String>,
    pub trigger: Option<String>,
    /// RFC 3339: runs created at or after it.
    pub since: Option<String>,
    /// RFC 3339: runs created before it.
    pub until: Option<String>,
    /// Rules over the run's context (`_body.order`, a step's output, …).
    #[serde(rename = "where")]
    pub where_: Option<Filter>,
}

/// A [`BulkFilter`] ready to take runs.
#[derive(Debug, Clone)]
pub struct RunSelection {
    listing: RunFilter,
    condition: Option<Condition>,
}

impl BulkFilter {
    /// Reads the filter; the error names the field and what it must be.
    pub fn parse(value: &Value) -> std::result::Result<BulkFilter, String> {
        serde_json::from_value(value.clone()).map_err(|e| format!("`filter`: {e}"))
    }

    /// The selection, taking only runs created before `before` (ms) when
    /// given: an operation's runs are those that existed when it was made.
    pub fn selection(&self, before: Option<i64>) -> std::result::Result<RunSelection, String> {
        let time = |field: &str,
                    value: &Option<String>|
         -> std::result::Result<Option<i64>, String> {
            value
                .as_deref()
                .map(|v| tok_store::rfc3339::parse(v).map_err(|e| format!("`filter.{field}`: {e}")))
                .transpose()
        };
        if let Some(rules) = &self.where_
            && rules.rules.len() > MAX_RULES
        {
            return Err(format!(
                "`filter.where` has {} rules; it takes at most {MAX_RULES}",
                rules.rules.len()
            ));
        }
        if let Some(status) = &self.status
            && tok_core::run::RunStatus::parse(status).is_none()
        {
            return Err(format!(
                "`filter.status` is `{status}`, not one of {}",
                tok_core::run::RunStatus::names()
            ));
        }
        if let Some(trigger) = &self.trigger
            && !TRIGGERS.contains(&trigger.as_str())
        {
            return Err(format!(
                "`filter.trigger` is `{trigger}`, not one of {}",
                TRIGGERS.join(", ")
            ));
        }
        let condition = self.where_.as_ref().map(Condition::from_filter);
        let until = match (time("until", &self.until)?, before) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(RunSelection {
            listing: RunFilter {
                status: self.status.clone(),
                automation_id: self.automation.clone(),
                trigger_type: self.trigger.clone(),
                since: time("since", &self.since)?,
                until,
                body_contains: condition.as_ref().and_then(|c| c.containment("_body")),
                ..RunFilter::default()
            },
            condition,
        })
    }
}

/// Most bytes of runs' contexts read at once by a selection with `where`
/// (as stored: [`tok_store::RunStore::run_context_sizes`]); a larger
/// context is read alone.
pub const BATCH_BYTES: i64 = 4 * 1024 * 1024;

/// Most bytes of runs' contexts one call reads: a search, a count, a page
/// of an operation. Past it the call stops at the last run it looked at,
/// and says where to go on.
pub const CALL_BYTES: i64 = 64 * 1024 * 1024;

/// What one call may still read of runs' contexts.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    bytes: i64,
    /// Whether a run was looked at: the first one always is, whatever its
    /// size, so that every call makes progress.
    looked: bool,
}

impl Budget {
    /// [`CALL_BYTES`].
    pub fn call() -> Self {
        Self::of(CALL_BYTES)
    }

    pub fn of(bytes: i64) -> Self {
        Self {
            bytes,
            looked: false,
        }
    }

    /// Whether `bytes` more may be read; spends them if so.
    fn take(&mut self, bytes: i64) -> bool {
        if self.looked && bytes > self.bytes {
            return false;
        }
        self.bytes -= bytes;
        self.looked = true;
        true
    }
}

/// What one page of a selection found.
#[derive(Debug, Default)]
pub struct Taken {
    /// The runs it takes, newest first.
    pub runs: Vec<RunSummary>,
    /// Where the next page starts: after the last run looked at. `None`
    /// when no run is left.
    pub next: Option<String>,
    /// The call's [`Budget`] ran out before the end of the page: `next` is
    /// the last run looked at.
    pub stopped: bool,
}

/// One page of the runs listing after `after`, and the runs of it the
/// selection takes. With `where`, the runs' contexts are read in batches
/// of at most [`BATCH_BYTES`], each decided and dropped before the next is
/// read, the task yielding between batches, and no more than `budget`
/// allows: past it the page stops at the last run looked at.
pub async fn page(
    store: &dyn Store,
    tenant: &TenantId,
    selection: &RunSelection,
    after: Option<&str>,
    limit: u32,
    budget: &mut Budget,
) -> Result<Taken> {
    let page = store.runs(tenant, &selection.listing, limit, after).await?;
    let Some(condition) = &selection.condition else {
        return Ok(Taken {
            runs: page.items,
            next: page.next_cursor,
            stopped: false,
        });
    };
    let ids: Vec<RunId> = page.items.iter().map(|r| r.id.clone()).collect();
    let sizes: HashMap<RunId, i64> = store
        .run_context_sizes(tenant, &ids)
        .await?
        .into_iter()
        .collect();
    let mut taken = Taken::default();
    let mut items = page.items.into_iter().peekable();
    let mut last: Option<RunId> = None;
    while items.peek().is_some() {
        // The next batch: runs in order, up to BATCH_BYTES (one at least).
        let mut batch = Vec::new();
        let mut bytes = 0i64;
        while let Some(run) = items.peek() {
            let size = sizes.get(&run.id).copied().unwrap_or(0).max(0);
            if !batch.is_empty() && bytes + size > BATCH_BYTES {
                break;
            }
            if !budget.take(size) {
                taken.stopped = true;
                break;
            }
            bytes += size;
            batch.extend(items.next());
        }
        if batch.is_empty() {
            break;
        }
        let batch_ids: Vec<RunId> = batch.iter().map(|r| r.id.clone()).collect();
        let mut contexts: HashMap<RunId, Value> = store
            .run_contexts(tenant, &batch_ids)
            .await?
            .into_iter()
            .collect();
        for run in batch {
            let context = contexts.remove(&run.id);
            last = Some(run.id.clone());
            if context.is_some_and(|context| condition.evaluate(&context).result) {
                taken.runs.push(run);
            }
        }
        drop(contexts);
        // Decided: let the runtime's other tasks go before the next batch.
        tokio::task::yield_now().await;
        if taken.stopped {
            break;
        }
    }
    taken.next = if taken.stopped {
        last.map(|id| id.to_string()).or(after.map(str::to_owned))
    } else {
        page.next_cursor
    };
    Ok(taken)
}

/// At most `limit` runs the selection takes after `after`, newest first,
/// looking at no more than `budget` runs and reading no more of their
/// contexts than `bytes` allows ([`Budget::call`]): a search over a large
/// tenant, or over large contexts, answers in bounded time and memory, and
/// its cursor (the last run looked at) goes on from there. The cursor is
/// `None` once no run is left.
pub async fn search(
    store: &dyn Store,
    tenant: &TenantId,
    selection: &RunSelection,
    after: Option<String>,
    limit: usize,
    budget: u32,
    bytes: &mut Budget,
) -> Result<(Vec<RunSummary>, Option<String>)> {
    let mut found = Vec::new();
    let mut after = after;
    let mut looked = 0u32;
    while looked < budget {
        let size = PAGE.min(budget - looked);
        let taken = page(store, tenant, selection, after.as_deref(), size, bytes).await?;
        looked += size;
        for run in taken.runs {
            if found.len() == limit {
                // The page holds more than the answer takes: go on after
                // the last run answered.
                let last = found.last().map(|r: &RunSummary| r.id.to_string());
                return Ok((found, last));
            }
            found.push(run);
        }
        match taken.next {
            Some(next) if taken.stopped => return Ok((found, Some(next))),
            Some(next) => after = Some(next),
            None => return Ok((found, None)),
        }
    }
    Ok((found, after))
}

/// How many runs a selection takes, as far as one call counted them.
#[derive(Debug)]
pub struct Count {
    /// The runs counted.
    pub total: i64,
    /// The first runs counted (at most the number asked).
    pub first: Vec<RunSummary>,
    /// The call's [`Budget`] of contexts ran out: the count goes on after
    /// this run. `None` when every run was counted.
    pub after: Option<String>,
}

/// How many runs the selection takes after `after` (all, with `None`),
/// and the first `first` of them; `None` past [`MAX_RUNS`] counted in all
/// (`counted` before this call). Stops where `budget` runs out
/// ([`Count::after`]).
pub async fn count(
    store: &dyn Store,
    tenant: &TenantId,
    selection: &RunSelection,
    first: usize,
    after: Option<String>,
    counted: i64,
    budget: &mut Budget,
) -> Result<Option<Count>> {
    let mut total = 0i64;
    let mut shown = Vec::new();
    let mut after = after;
    loop {
        let taken = page(store, tenant, selection, after.as_deref(), 500, budget).await?;
        total += taken.runs.len() as i64;
        if counted + total > MAX_RUNS {
            return Ok(None);
        }
        shown.extend(
            taken
                .runs
                .into_iter()
                .take(first.saturating_sub(shown.len())),
        );
        match taken.next {
            Some(next) if taken.stopped => {
                return Ok(Some(Count {
                    total,
                    first: shown,
                    after: Some(next),
                }));
            }
            Some(next) => after = Some(next),
            None => {
                return Ok(Some(Count {
                    total,
                    first: shown,
                    after: None,
                }));
            }
        }
    }
}

/// The longest a retry's next page waits for its tenant's queue to go
/// under a page: past it the page goes anyway, so a queue that never
/// drains (jobs held by a connection's limit, a tenant's cap) slows the
/// operation and never stops it.
const MOST_YIELD: std::time::Duration = std::time::Duration::from_secs(10);

/// What one pass did of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Its last page is done.
    Done,
    /// A page is done and more are left.
    More,
    /// Nothing: its tenant's queue holds a page already.
    Yielded,
}

/// Does one page of the operation, unless it is a retry whose tenant has
/// a page of jobs waiting already and `may_yield`.
pub(crate) async fn step(inner: &Inner, operation: &Operation, may_yield: bool) -> Result<Pass> {
    let store = &*inner.store;
    let tenant = &operation.tenant_id;
    let filter = BulkFilter::parse(&operation.filter).map_err(crate::EngineError::Definition)?;
    let selection = filter
        .selection(Some(operation.created_at))
        .map_err(crate::EngineError::Definition)?;
    let action = OperationAction::parse(&operation.action).ok_or_else(|| {
        crate::EngineError::Definition(format!(
            "operation {} has the action `{}`, neither retry nor cancel",
            operation.id, operation.action
        ))
    })?;
    if action == OperationAction::Retry
        && may_yield
        && store.queue_stats(std::slice::from_ref(tenant)).await?.ready >= i64::from(PAGE)
    {
        // The last page (or live work) still waits for the workers: the
        // next page waits for them too.
        return Ok(Pass::Yielded);
    }
    let Taken {
        runs,
        next,
        stopped: _,
    } = page(
        store,
        tenant,
        &selection,
        operation.after.as_deref(),
        PAGE,
        &mut Budget::call(),
    )
    .await?;
    let mut queued = false;
    // A page's runs are mostly of a few automations: each is read once.
    let mut automations = HashMap::new();
    for run in &runs {
        let what = match action {
            OperationAction::Cancel => RunAction::Cancel,
            OperationAction::Retry if operation.version == "current" => {
                let automation = match automations.entry(run.automation_id.clone()) {
                    Entry::Occupied(known) => known.into_mut(),
                    Entry::Vacant(slot) => {
                        slot.insert(store.automation(tenant, &run.automation_id).await?)
                    }
                };
                current_version(inner, automation.as_ref(), tenant, run).await?
            }
            OperationAction::Retry => RunAction::Retry { version: None },
        };
        let applied = store.apply(tenant, &operation.id, &run.id, what).await?;
        match applied {
            Applied::Done(status) => {
                queued |= action == OperationAction::Retry;
                // As a retry or a cancel by hand tells the live stream.
                inner.stream.publish(
                    tenant,
                    crate::stream::Kind::RunUpdated,
                    crate::stream::run_update(&run.id, &run.automation_id, status),
                );
                if status == tok_core::run::RunStatus::Cancelled {
                    crate::traces::run_ended(inner.store.clone(), tenant.clone(), run.id.clone());
                }
            }
            Applied::Stopped => return Ok(Pass::Done),
            Applied::Failed(_) | Applied::Already => {}
        }
    }
    if queued {
        inner.work.notify_one();
    }
    store
        .advance_operation(tenant, &operation.id, next.as_deref(), next.is_none())
        .await?;
    Ok(match next {
        None => Pass::Done,
        Some(_) => Pass::More,
    })
}

/// A retry of `run` on its automation's current version (`row`), or why
/// it cannot move there.
async fn current_version(
    inner: &Inner,
    row: Option<&AutomationRow>,
    tenant: &TenantId,
    run: &RunSummary,
) -> Result<RunAction> {
    let store = &*inner.store;
    let Some(row) = row else {
        return Ok(RunAction::Refuse("its automation is gone".into()));
    };
    if row.version == run.version {
        return Ok(RunAction::Retry { version: None });
    }
    let Some(detail) = store.run(tenant, &run.id).await? else {
        return Ok(RunAction::Refuse("the run is gone".into()));
    };
    let Some(failed) = detail.steps.iter().rev().find(|s| s.status == "failed") else {
        // Not failed (or failed before a step ran): the store says why.
        return Ok(RunAction::Retry { version: None });
    };
    let current: Arc<Automation> =
        inner
            .defs
            .parse(&row.tenant_id, &row.id, row.version, &row.definition)?;
    Ok(
        match tok_core::flow::resumes_at(&current.steps, &failed.path, &failed.step_id) {
            Ok(()) => RunAction::Retry {
                version: Some(row.version),
            },
            Err(why) => RunAction::Refuse(format!(
                "not moved to version {}: {why}; retry it on its version {} instead",
                row.version, run.version
            )),
        },
    )
}

/// The holder's bulk operations, beside the wake loop: a page of each
/// tenant's oldest running operation a pass, a pass a tick (after [`PAUSE`]
/// while pages remain).
pub(crate) async fn operations_loop(
    inner: Arc<Inner>,
    holds: Arc<AtomicBool>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let tick = inner.config.scheduler.tick;
    let mut wait = tick;
    // Since when each operation has yielded, page after page.
    let mut yielding: HashMap<String, std::time::Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = inner.operations.notified() => {}
            _ = shutdown.changed() => {}
        }
        if crate::stopping(&shutdown) {
            return;
        }
        wait = tick;
        if !holds.load(Ordering::SeqCst) {
            continue;
        }
        let running = match inner.store.running_operations(&inner.tenants()).await {
            Ok(running) => running,
            Err(e) => {
                tracing::warn!(error = %e, "bulk operations could not be read; trying again");
                continue;
            }
        };
        yielding.retain(|id, _| running.iter().any(|o| &o.id == id));
        for operation in &running {
            let may_yield = yielding
                .get(&operation.id)
                .is_none_or(|since| since.elapsed() < MOST_YIELD);
            match step(&inner, operation, may_yield).await {
                // More pages: the next soon, with a pause for live traffic.
                Ok(Pass::More) => {
                    yielding.remove(&operation.id);
                    wait = PAUSE;
                }
                Ok(Pass::Yielded) => {
                    yielding
                        .entry(operation.id.clone())
                        .or_insert_with(std::time::Instant::now);
                    wait = PAUSE;
                }
                Ok(Pass::Done) => {
                    yielding.remove(&operation.id);
                }
                Err(e) => tracing::warn!(
                    error = %e, operation = %operation.id, tenant = %operation.tenant_id,
                    "a page of a bulk operation failed; it is done again at the next pass"
                ),
            }
        }
    }
}
