//! The start controls in a dispatch (`flow.debounce`, `throttle`, `batch`,
//! `singleton`): each planned run of an automation with one passes its
//! key's row through [`tok_core::start::decide`], and what the decision
//! says is written in the dispatch's transaction — the run held until it
//! is due, the event joined to the key's open run instead of a run of its
//! own, a `skipped` run, an active run cancelled.
//!
//! `flow.cancelOn` too: an event first cancels the runs whose rows it
//! matches ([`cancel_on`]), those already written and those this dispatch
//! planned before it, then starts its own.
//!
//! A key's row is read once per dispatch (locked: another dispatcher
//! deciding on the key waits for this one to commit) and kept here for the
//! dispatch's later events, with the run this dispatch planned for it: an
//! event joins that run before it is written like one already written.

use std::collections::HashMap;

use serde_json::{Value, json};
use tok_core::definition::Filter;
use tok_core::ids::{AutomationId, EventId, RunId, TenantId};
use tok_core::run::{FlowStart, Hold, Resume};
use tok_core::start::{Control, Gate, KeyRun, KeyState, MAX_BATCH_BYTES, cancels, decide};
use tok_store::{DispatchTx, NewRun, Result};

/// A key: its tenant, automation, control and rendered key.
type KeyId = (TenantId, AutomationId, &'static str, String);

/// A key's row as this dispatch has it.
struct Entry {
    state: Option<KeyState>,
    /// The run of this dispatch the row names, by its index in the runs
    /// to write, while it is not yet written.
    planned: Option<usize>,
    changed: bool,
}

/// The keys one dispatch decided on.
#[derive(Default)]
pub(crate) struct Keys(HashMap<KeyId, Entry>);

/// What an event's run became.
pub(crate) enum Gated {
    /// A run to write (held, or skipped), and the key whose row names it
    /// once it is written ([`Keys::planned`]).
    Run(Box<NewRun>, Option<KeyId>),
    /// The event joined its key's open run (this one): no run of its own.
    Joined(RunId),
}

impl Keys {
    /// Passes `run` through its start control `start` at `now`; `runs`
    /// are the runs this dispatch writes so far.
    pub(crate) async fn gate(
        &mut self,
        tx: &mut dyn DispatchTx,
        runs: &mut [(TenantId, EventId, NewRun)],
        tenant: &TenantId,
        start: &FlowStart,
        mut run: NewRun,
        now: i64,
    ) -> Result<Gated> {
        let Some(control) = start.flow.control() else {
            return Ok(Gated::Run(Box::new(run), None));
        };
        let id: KeyId = (
            tenant.clone(),
            run.automation_id.clone(),
            control.name(),
            start.key.clone(),
        );
        if !self.0.contains_key(&id) {
            let state = tx
                .flow_key(tenant, &run.automation_id, control.name(), &start.key)
                .await?;
            let entry = Entry {
                state,
                planned: None,
                changed: false,
            };
            self.0.insert(id.clone(), entry);
        }
        let entry = self.0.get_mut(&id).expect("inserted above");
        loop {
            match decide(control, entry.state.as_ref(), now) {
                Gate::Start {
                    due,
                    opened_at,
                    count,
                    next_at,
                } => {
                    if control.holds() && due > now && run.first_path.is_some() {
                        run.hold = Some(Hold {
                            delay_ms: due - now,
                            resume: Resume::Deferred {
                                limit: control.name().to_owned(),
                                reason: control.reason(&start.key),
                            },
                        });
                    }
                    entry.state = Some(KeyState {
                        run_id: run.id.to_string(),
                        run: KeyRun::Open,
                        opened_at,
                        count,
                        next_at,
                    });
                    entry.planned = None;
                    entry.changed = true;
                    return Ok(Gated::Run(Box::new(run), Some(id)));
                }
                Gate::Join { run_id, due, count } => {
                    let delay_ms = (due - now).max(0);
                    // A batch whose bodies would pass their bound is full:
                    // it goes now as it is, and the event opens the next.
                    let fits = |context: &Value| {
                        !matches!(control, Control::Batch(_))
                            || serde_json::to_vec(&context["_events"])
                                .is_ok_and(|b| b.len() <= MAX_BATCH_BYTES)
                    };
                    let joined = match entry.planned.and_then(|i| runs.get_mut(i)) {
                        Some((_, _, open)) if open.id.as_str() == run_id => {
                            let context = joined(control, &open.context, &run.context);
                            let fits = fits(&context);
                            if fits {
                                open.context = context;
                            }
                            if let Some(hold) = &mut open.hold {
                                hold.delay_ms = if fits { delay_ms } else { 0 };
                            }
                            fits
                        }
                        _ => {
                            let open = RunId::from(run_id.as_str());
                            match tx.run_context(tenant, &open).await? {
                                Some(context) => {
                                    let grown = joined(control, &context, &run.context);
                                    if fits(&grown) {
                                        tx.join_run(tenant, &open, &grown, delay_ms).await?
                                    } else {
                                        tx.join_run(tenant, &open, &context, 0).await?;
                                        false
                                    }
                                }
                                None => false,
                            }
                        }
                    };
                    let state = entry.state.as_mut().expect("a join has a row");
                    if joined {
                        tracing::debug!(run = %run_id, control = control.name(), "event joined an open run");
                        state.count = count;
                        entry.changed = true;
                        return Ok(Gated::Joined(RunId::from(run_id.as_str())));
                    }
                    // A worker claimed the open run meanwhile (it began), or
                    // the batch is full: the event starts a run of its own.
                    state.run = KeyRun::Active;
                }
                Gate::Queue { behind, waiting } => {
                    run.hold = Some(Hold {
                        delay_ms: tok_core::start::QUEUED_FOR_MS,
                        resume: Resume::Deferred {
                            limit: control.name().to_owned(),
                            reason: format!(
                                "queued behind run {behind} of the same singleton key{}: \
                                 one run at a time, in the order the events came",
                                shown(&start.key)
                            ),
                        },
                    });
                    // Its jobs carry the key's queue: how the scheduler
                    // finds the oldest queued run when the key's run ends.
                    run.queue_key = Some(tok_core::start::singleton_queue_key(
                        run.automation_id.as_str(),
                        &start.key,
                    ));
                    if let Some(state) = entry.state.as_mut() {
                        state.count = waiting;
                    }
                    entry.changed = true;
                    return Ok(Gated::Run(Box::new(run), None));
                }
                Gate::Skip { active } => {
                    run.skipped = Some(format!(
                        "skipped: run {active} of the same singleton key{} is not finished \
                         (flow.singleton mode skip)",
                        shown(&start.key)
                    ));
                    run.first_path = None;
                    run.steps.clear();
                    run.actions = 0;
                    return Ok(Gated::Run(Box::new(run), None));
                }
                Gate::Replace { active } => {
                    let reason = format!(
                        "cancelled: run {} of the same singleton key{} replaced it \
                         (flow.singleton mode cancel)",
                        run.id,
                        shown(&start.key)
                    );
                    match entry.planned.and_then(|i| runs.get_mut(i)) {
                        // Not written yet: it never starts.
                        Some((_, _, planned)) if planned.id.as_str() == active => {
                            planned.skipped = Some(reason);
                            planned.first_path = None;
                            planned.steps.clear();
                            planned.actions = 0;
                            planned.hold = None;
                        }
                        _ => tx.cancel_run(tenant, &RunId::from(active), &reason).await?,
                    }
                    if let Some(state) = entry.state.as_mut() {
                        state.run = KeyRun::Ended;
                    }
                }
            }
        }
    }

    /// The run `key`'s row names is the one at `index` of the runs to
    /// write (`None`: it was refused, and is no run of the key).
    pub(crate) fn planned(&mut self, key: &KeyId, index: Option<usize>) {
        if let Some(entry) = self.0.get_mut(key) {
            entry.planned = index;
            if index.is_none()
                && let Some(state) = entry.state.as_mut()
            {
                state.run = KeyRun::Ended;
            }
        }
    }

    /// Writes the rows this dispatch changed.
    pub(crate) async fn write(self, tx: &mut dyn DispatchTx) -> Result<()> {
        for ((tenant, automation, control, key), entry) in self.0 {
            if let (true, Some(state)) = (entry.changed, &entry.state) {
                tx.put_flow_key(&tenant, &automation, control, &key, state)
                    .await?;
            }
        }
        Ok(())
    }
}

/// The (source, path) pairs of cancel rows the tenant has for a set of
/// sources, read once per dispatch.
#[derive(Default)]
pub(crate) struct CancelPaths(HashMap<(TenantId, Vec<String>), Vec<SourcePath>>);

/// A cancel row's source and `match` path.
type SourcePath = (String, String);

/// Cancels the runs `event` cancels by their
/// automations' `flow.cancelOn`: written ones through `tx` (with their
/// compensation), ones this dispatch planned before it in `runs` (written
/// `cancelled`, never started). Returns how many.
pub(crate) async fn cancel_on(
    tx: &mut dyn DispatchTx,
    paths: &mut CancelPaths,
    runs: &mut [(TenantId, EventId, NewRun)],
    event: &tok_store::PendingEvent,
) -> Result<usize> {
    let sources: Vec<String> = [
        event.source_id.as_ref().map(|s| s.to_string()),
        event.event_type.clone(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let id = (event.tenant_id.clone(), sources);
    if !paths.0.contains_key(&id) {
        let asked: Vec<&str> = id.1.iter().map(String::as_str).collect();
        let found = tx.cancel_paths(&event.tenant_id, &asked).await?;
        paths.0.insert(id.clone(), found);
    }
    let found = &paths.0[&id];
    if found.is_empty() {
        return Ok(0);
    }
    // The event's context as a run of it would start with: its values
    // are read where the run's were.
    let context = &super::plan::initial_context(event).into_value();
    let reason = format!("cancelled by event {} (flow.cancelOn)", event.id);
    let mut cancelled = 0;
    for (source, path) in found.clone() {
        let value = match tok_core::context::lookup(context, &path) {
            tok_core::context::Lookup::Found(v) if !v.is_null() => v.to_string(),
            _ => continue,
        };
        for (tenant, _, run) in runs.iter_mut() {
            let matched = run.cancels.iter().any(|k| {
                k.source == source
                    && k.path == path
                    && cancels(&path, &k.value, k.filter.as_ref(), context)
            });
            if tenant == &event.tenant_id && matched && run.first_path.is_some() {
                run.cancelled = Some(format!("{reason} before it started"));
                run.first_path = None;
                run.steps.clear();
                run.actions = 0;
                run.hold = None;
                cancelled += 1;
            }
        }
        for (run, filter) in tx
            .cancel_matches(&event.tenant_id, &source, &path, &value)
            .await?
        {
            let filter: Option<Filter> = filter.and_then(|f| serde_json::from_value(f).ok());
            if cancels(&path, &value, filter.as_ref(), context) {
                tracing::info!(run = %run, event = %event.id, "run cancelled by flow.cancelOn");
                tx.cancel_run(&event.tenant_id, &run, &reason).await?;
                cancelled += 1;
            }
        }
    }
    Ok(cancelled)
}

/// The context of an open run after an event joins it: a debounce's is
/// the newer event's; a batch's gains the event's body in `_events`.
fn joined(control: Control<'_>, open: &Value, event: &Value) -> Value {
    match control {
        Control::Batch(_) => {
            let mut context = open.clone();
            let body = event.get("_body").cloned().unwrap_or(Value::Null);
            match context.get_mut("_events").and_then(Value::as_array_mut) {
                Some(events) => events.push(body),
                None => context["_events"] = json!([body]),
            }
            context
        }
        _ => event.clone(),
    }
}

fn shown(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!(" \u{201c}{key}\u{201d}")
    }
}
