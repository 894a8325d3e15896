//! The step registry: every step type by name, and who runs it.
//!
//! Control steps (`condition`, `loop`, `set`, `flow/log`, `wait`,
//! `wait_for_event`, `wait_for_condition`, `wait_for_runs`, `parallel`, `repeat`, `end`) are decided by `tok-core`'s decider and are not
//! registered. Every other type is registered here once, as one of two
//! classes: a step that runs inside the record transaction (the service-desk
//! steps, [`TxStep`]), or a [`StepHandler`] that the worker runs with no
//! database connection held (`flow/pause`, the connectors, and the types a
//! Rust user registers). A new step type is one file and one line in
//! [`Registry::with_builtins`] (or one [`Registry::register`] call).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tok_core::advance::{StepClass, is_control};
use tok_core::error::StepError;
use tok_core::ids::{JobId, RunId, TenantId};
use tok_core::retry::RetryPolicy;

use crate::steps::{TxStep, in_transaction};

/// What a handler gets for one attempt of one step.
#[derive(Debug, Clone)]
pub struct StepCall {
    pub tenant_id: TenantId,
    pub run_id: RunId,
    /// The step's address in its tree (`2.then.0`).
    pub path: String,
    pub step_id: String,
    /// `run_id + ":" + path`: the same on every attempt of this step. Send it
    /// as `Idempotency-Key` to services that accept one.
    pub idempotency_key: String,
    /// 1 on the first attempt.
    pub attempt: u32,
    /// The job the step runs under (connection slots are held by it).
    pub job_id: JobId,
    /// How long the job's lease lasts between heartbeats.
    pub lease_ms: i64,
    /// The step's `config` with every template rendered against the context.
    pub config: Value,
    /// The context as this step sees it (loop variables included), shared
    /// with the run rather than copied for each step.
    pub context: Arc<Value>,
    /// Where [`StepCall::once`] keeps its results.
    pub effects: Effects,
    /// The W3C trace context of the step (`traceparent`): the `http` step
    /// sends it with its call. `None` outside a run.
    pub traceparent: Option<String>,
    /// This worker's hold on the step's job: check [`Lease::held`] right
    /// before a call out that must not happen twice.
    pub lease: Lease,
}

/// How long this worker's claim on a step's job is known to last: from
/// the claim, then from each heartbeat that extended it. A worker stalled
/// past it (stopped, or its heartbeats failing) may have lost the job to
/// another worker, which then runs the step again: a call out begun
/// after that would reach the service twice, once after the other
/// worker's record. The `http` and `mcp` steps check it right before they
/// send. [`Lease::default`] (outside the engine) is always held.
#[derive(Clone, Default)]
pub struct Lease(Option<Arc<std::sync::atomic::AtomicI64>>);

impl Lease {
    /// A lease known to last until `until_ms` (Unix ms, this machine's clock).
    pub(crate) fn until(until_ms: i64) -> Self {
        Lease(Some(Arc::new(std::sync::atomic::AtomicI64::new(until_ms))))
    }

    /// Until when a lease of `lease_ms` granted by the database when it
    /// was asked at `asked_at` (this machine's clock) is known to last: a
    /// tenth less, for the database's clock and the way there.
    pub(crate) fn known_until(asked_at: i64, lease_ms: i64) -> i64 {
        asked_at + lease_ms - lease_ms / 10
    }

    /// The lease is known to last until `until_ms` now.
    pub(crate) fn extend_to(&self, until_ms: i64) {
        if let Some(deadline) = &self.0 {
            deadline.fetch_max(until_ms, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether the job is still this worker's as far as it knows: `false`
    /// once its lease ran out without being extended.
    pub fn held(&self) -> bool {
        self.0.as_ref().is_none_or(|deadline| {
            tok_store::now_ms() < deadline.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// The error of a step that did not begin its call because its lease
    /// ran out (retryable: the worker that holds the job now runs it).
    pub fn ran_out(step: &str) -> StepError {
        StepError::retryable(format!(
            "step `{step}` did not send its call: this worker's lease on its job ran out (the \
             worker was stalled), so another worker may run it now"
        ))
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(deadline) => write!(
                f,
                "Lease(until {})",
                deadline.load(std::sync::atomic::Ordering::Relaxed)
            ),
            None => f.write_str("Lease(always)"),
        }
    }
}

/// Where [`StepCall::once`] keeps the results of a step's effects: the
/// engine's store, or nowhere ([`Effects::none`], for a handler called
/// outside the engine, whose effects then run every time).
#[derive(Clone, Default)]
pub struct Effects(Option<Arc<dyn tok_store::EffectStore>>);

impl Effects {
    pub fn none() -> Self {
        Self(None)
    }

    pub fn in_store(store: Arc<dyn tok_store::EffectStore>) -> Self {
        Self(Some(store))
    }
}

impl std::fmt::Debug for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Some(_) => "Effects(store)",
            None => "Effects(none)",
        })
    }
}

impl StepCall {
    /// Runs `effect` at most once for this step, whatever its attempts:
    /// its result is stored under the step's idempotency key and `name`,
    /// and a later attempt (a retry after a failure further on) gets the
    /// stored result back without running `effect` again. Name each effect
    /// of a step apart (`"charge"`, `"receipt"`).
    ///
    /// No database connection is held while `effect` runs: the stored
    /// result is read, the connection released, the effect run, and its
    /// result written. An effect that fails stores nothing (the next
    /// attempt runs it again); so does one whose attempt dies between the
    /// effect and the write, which is why an effect should still send
    /// [`StepCall::idempotency_key`] to a service that accepts one.
    pub async fn once<T, F>(&self, name: &str, effect: F) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, StepError>>,
    {
        let Some(store) = &self.effects.0 else {
            return effect.await;
        };
        let unavailable = |what: &str, e: tok_store::StoreError| {
            StepError::retryable(format!(
                "could not {what} the result of effect `{name}` of step `{}`: {e}",
                self.step_id
            ))
        };
        let read = |value: Value| {
            serde_json::from_value(value).map_err(|e| {
                StepError::terminal(format!(
                    "the stored result of effect `{name}` of step `{}` does not read as the \
                     type the step asks for: {e}",
                    self.step_id
                ))
            })
        };
        let stored = store
            .effect_result(&self.tenant_id, &self.idempotency_key, name)
            .await
            .map_err(|e| unavailable("read", e))?;
        if let Some(value) = stored {
            tracing::debug!(step = %self.step_id, effect = name, "effect ran before; its stored result is used");
            return read(value);
        }
        let result = effect.await?;
        let value = serde_json::to_value(&result).map_err(|e| {
            StepError::terminal(format!(
                "the result of effect `{name}` of step `{}` cannot be stored as JSON: {e}",
                self.step_id
            ))
        })?;
        let kept = store
            .store_effect_result(
                &self.tenant_id,
                &self.run_id,
                &self.idempotency_key,
                name,
                &value,
            )
            .await
            .map_err(|e| unavailable("store", e))?;
        // Two attempts that raced agree on the result stored first.
        if kept == value {
            Ok(result)
        } else {
            read(kept)
        }
    }
}

/// A step type. Return the outputs to publish under the step's id, or a
/// [`StepError`] that says whether the attempt may be retried: only
/// `Retryable` and `RetryAfter` are; a `Terminal` error fails the run.
#[async_trait]
pub trait StepHandler: Send + Sync + 'static {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError>;

    /// Begins the step: its outputs, or a wait for a signal
    /// ([`StepOutcome::Wait`]) after which [`StepHandler::resume`] finishes
    /// it. The default runs [`StepHandler::run`]; a step that may wait
    /// overrides this one.
    async fn handle(&self, call: StepCall) -> Result<StepOutcome, StepError> {
        self.run(call).await.map(StepOutcome::Done)
    }

    /// Finishes a step that waited, with what ended its wait: the signal
    /// that came, or its timeout. A retried resume gets the same
    /// [`Resumed`] again; the step never waits twice.
    async fn resume(
        &self,
        call: StepCall,
        resumed: Resumed,
    ) -> Result<Map<String, Value>, StepError> {
        let _ = resumed;
        Err(StepError::terminal(format!(
            "step `{}` waited, but its type has no `resume`",
            call.step_id
        )))
    }

    /// Called when the step's run is cancelled while the step is live:
    /// while it waits (by the claim that takes the cancel, before the
    /// run's compensations; a worker that dies before the cancel is
    /// recorded calls it again, so make it idempotent with
    /// [`StepCall::idempotency_key`]), or while it runs (by the worker that
    /// ran it, once its answer finds the run cancelled; that answer is
    /// discarded). A worker that dies mid-call calls nothing. What it
    /// returns is logged.
    async fn cancel(&self, call: StepCall) -> Result<(), StepError> {
        let _ = call;
        Ok(())
    }

    /// The retry policy of this type's steps, when a step sets none of its
    /// own; the automation's `settings.retry` comes after it.
    fn retry_policy(&self) -> Option<RetryPolicy> {
        None
    }

    /// Checks a step's `config` when an automation is saved; the message
    /// says what is wrong and what was expected.
    fn validate(&self, _config: &Value) -> Result<(), String> {
        Ok(())
    }

    /// [`StepHandler::validate`], naming the key of `config` the problem
    /// concerns, so the save's 400 points at it (`steps.2.config.source`).
    /// A handler whose problems each concern one key overrides this one.
    fn check_config(&self, config: &Value) -> Result<(), ConfigError> {
        self.validate(config).map_err(|message| ConfigError {
            key: String::new(),
            message,
        })
    }

    /// The keys a step's `config` may have: a save that gives any other
    /// is refused, naming the key and these. `None` (the default) takes
    /// any key, for a handler that reads a config of its own shape.
    fn config_keys(&self) -> Option<&'static [&'static str]> {
        None
    }
}

/// What a handler's [`StepHandler::handle`] answers.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// The step is done: its outputs.
    Done(Map<String, Value>),
    /// The step waits for a signal (sent by `POST /api/signals` or an
    /// `emit` step) as [`WaitFor`] says, then [`StepHandler::resume`]
    /// finishes it.
    Wait(WaitFor),
}

/// What a custom step waits for: whatever a `wait_for_event` step may
/// wait for. A signal on any of `keys` (one at least, at most 20), or on
/// each of them ([`WaitFor::all`]), about the ticket `subject` (without
/// one: only signals about no ticket), whose payload satisfies `filter`
/// (the rules of a `where`), `timeout` at most; `outputs` are published
/// while it waits, and `what` is how the run page says what it waits for
/// (by default its keys). A signal buffered on a key before the wait
/// began (within the lookback) resumes it at once, unless
/// [`WaitFor::only_new`]. The step's `escalations` fire while it waits,
/// as on a `wait_for_event`.
///
/// ```
/// # use tok_engine::WaitFor;
/// let wait = WaitFor::signal("delivery.confirmed")
///     .or("delivery.failed")
///     .about("tk_42")
///     .timeout(std::time::Duration::from_secs(3600));
/// assert_eq!(wait.keys, ["delivery.confirmed", "delivery.failed"]);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WaitFor {
    pub keys: Vec<String>,
    pub mode: tok_core::waits::WaitMode,
    pub subject: Option<String>,
    pub filter: Option<tok_core::definition::Filter>,
    pub timeout: Option<std::time::Duration>,
    pub only_new: bool,
    pub outputs: Map<String, Value>,
    pub what: Option<String>,
}

impl WaitFor {
    /// A wait for a signal on `key`.
    pub fn signal(key: impl Into<String>) -> Self {
        WaitFor {
            keys: vec![key.into()],
            ..WaitFor::default()
        }
    }

    /// Also resumed by a signal on `key` (the first that comes ends the
    /// wait; [`Resumed::key`] says which), or, with [`WaitFor::all`],
    /// waits for a signal on `key` too.
    pub fn or(mut self, key: impl Into<String>) -> Self {
        self.keys.push(key.into());
        self
    }

    /// Waits until a signal has come on each of its keys (in any order):
    /// [`Resumed::signals`] has them all by key.
    pub fn all(mut self) -> Self {
        self.mode = tok_core::waits::WaitMode::All;
        self
    }

    /// Only for signals about the ticket `ticket`.
    pub fn about(mut self, ticket: impl Into<String>) -> Self {
        self.subject = Some(ticket.into());
        self
    }

    /// Only for signals whose payload satisfies `filter`.
    pub fn matching(mut self, filter: tok_core::definition::Filter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Gives up after `timeout` ([`Resumed::timed_out`]).
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Only for signals sent after the wait began: one buffered before
    /// does not count (a `wait_for_event`'s `lookback: false`).
    pub fn only_new(mut self) -> Self {
        self.only_new = true;
        self
    }

    /// Publishes `outputs` while it waits.
    pub fn publishing(mut self, outputs: Map<String, Value>) -> Self {
        self.outputs = outputs;
        self
    }

    /// Says on the run page what it waits for ("waiting for `what` until
    /// …"), in place of its keys (at most 200 bytes, not empty).
    pub fn described(mut self, what: impl Into<String>) -> Self {
        self.what = Some(what.into());
        self
    }
}

impl From<Map<String, Value>> for StepOutcome {
    fn from(outputs: Map<String, Value>) -> Self {
        StepOutcome::Done(outputs)
    }
}

/// What ended a custom step's wait, for [`StepHandler::resume`].
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resumed {
    /// The signal that came; `None` when the wait timed out.
    #[serde(default)]
    pub signal_id: Option<String>,
    /// The key it came on (one of [`WaitFor::keys`]).
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub payload: Value,
    /// Who sent the signal (`{"kind": "key", "id"}`, `{"kind": "run",
    /// "runId"}`).
    #[serde(default)]
    pub actor: Option<Value>,
    /// The ticket the signal was about (`subject`), when it named one.
    #[serde(default)]
    pub subject: Option<String>,
    pub timed_out: bool,
    /// A wait for each of several keys ([`WaitFor::all`]): the signals
    /// that came, by key (`{signalId, payload, actor?, subject?}`); the
    /// fields above are then the last one's.
    #[serde(default)]
    pub signals: Map<String, Value>,
    /// The keys of [`Resumed::signals`], in the order they came.
    #[serde(default)]
    pub keys: Vec<String>,
    /// A wait for each of several keys that timed out: the keys no
    /// signal came on.
    #[serde(default)]
    pub missing: Vec<String>,
}

/// A step's `config` refused at save: the key it concerns (a dot path
/// inside `config`; empty for the config as a whole) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

/// A registered step type.
#[derive(Clone)]
enum Entry {
    InTransaction(Arc<dyn TxStep>),
    External(Arc<dyn StepHandler>),
}

/// Step types by name.
#[derive(Clone, Default)]
pub struct Registry {
    steps: HashMap<String, Entry>,
    /// tok's own registered types that never wait (all but `approval`).
    never_wait: std::collections::HashSet<String>,
}

impl Registry {
    /// The built-in step types: the service-desk steps that run in the
    /// record transaction, and `flow/pause`. Add your own with
    /// [`Registry::register`].
    pub fn with_builtins() -> Self {
        let mut registry = Self::default();
        for (kind, step) in [
            (
                "ticket/upsert",
                in_transaction!(ticket_upsert) as Arc<dyn TxStep>,
            ),
            ("ticket/assign-least-busy", in_transaction!(ticket_assign)),
            ("ticket/set-type", in_transaction!(ticket_set_type)),
            ("ticket/add-tags", in_transaction!(ticket_add_tags)),
            ("ticket/set-status", in_transaction!(ticket_set_status)),
            ("ticket/close", in_transaction!(ticket_close)),
            ("incident/create", in_transaction!(incident_create)),
            ("emit", in_transaction!(emit)),
            ("run_workflow", in_transaction!(run_workflow)),
            ("approval", in_transaction!(approval)),
        ] {
            registry
                .steps
                .insert(kind.to_owned(), Entry::InTransaction(step));
            if kind != tok_core::approval::APPROVAL {
                registry.never_wait.insert(kind.to_owned());
            }
        }
        registry.register("flow/pause", crate::steps::pause::Pause);
        registry.never_wait.insert("flow/pause".to_owned());
        registry
    }

    /// The built-ins plus the connector steps (`http`, `mcp`), which need the
    /// store for their connections' limits and call out through the
    /// outbound guard with `allow`'s exceptions (the engine's
    /// [`EngineConfig::outbound`](crate::EngineConfig::outbound)).
    pub fn with_connectors(
        store: Arc<dyn tok_store::ConnectionStore>,
        allow: &crate::outbound::OutboundAllow,
    ) -> Self {
        let mut registry = Self::with_builtins();
        registry.add_connectors(store, allow);
        registry
    }

    /// Adds the connector steps (`http`, `mcp`) where no handler of that
    /// name was registered already; see [`Registry::with_connectors`].
    pub fn add_connectors(
        &mut self,
        store: Arc<dyn tok_store::ConnectionStore>,
        allow: &crate::outbound::OutboundAllow,
    ) -> &mut Self {
        if !self.steps.contains_key("http") {
            self.register("http", crate::steps::http::Http::new(store.clone(), allow));
            self.never_wait.insert("http".to_owned());
        }
        if !self.steps.contains_key("mcp") {
            self.register("mcp", crate::steps::mcp::Mcp::new(store, allow));
            self.never_wait.insert("mcp".to_owned());
        }
        self
    }

    /// Adds the connector steps (`http`, `mcp`) answered as `answers` says
    /// (`tok test`: from a recorded file, or the services into one;
    /// [`crate::recorded`]), in place of any registered before.
    pub fn add_answered_connectors(
        &mut self,
        store: Arc<dyn tok_store::ConnectionStore>,
        allow: &crate::outbound::OutboundAllow,
        answers: crate::recorded::Answers,
    ) -> &mut Self {
        self.register(
            "http",
            crate::steps::http::Http::answered(store.clone(), allow, answers.clone()),
        );
        self.register(
            "mcp",
            crate::steps::mcp::Mcp::answered(store, allow, answers),
        );
        self.never_wait
            .extend(["http".to_owned(), "mcp".to_owned()]);
        self
    }

    /// Registers (or replaces) the handler of a step type. The names of the
    /// control and in-transaction built-in types cannot be taken.
    pub fn register(&mut self, kind: impl Into<String>, handler: impl StepHandler) -> &mut Self {
        let kind = kind.into();
        assert!(
            !is_control(&kind) && !matches!(self.steps.get(&kind), Some(Entry::InTransaction(_))),
            "`{kind}` is a built-in step type and cannot be replaced"
        );
        self.never_wait.remove(&kind);
        self.steps.insert(kind, Entry::External(Arc::new(handler)));
        self
    }

    /// Whether a step of this type may wait, so may have `escalations`:
    /// every type but tok's own that never wait (`http`, the `ticket/*`
    /// steps, …); a control type's are checked by `tok-core`.
    pub fn may_wait(&self, kind: &str) -> bool {
        !self.never_wait.contains(kind)
    }

    /// Registers a step type that runs in the record transaction (the
    /// engine's own tests add one that misbehaves).
    #[cfg(test)]
    pub(crate) fn register_in_transaction(&mut self, kind: &str, step: Arc<dyn TxStep>) {
        self.steps
            .insert(kind.to_owned(), Entry::InTransaction(step));
    }

    pub fn handler(&self, kind: &str) -> Option<Arc<dyn StepHandler>> {
        match self.steps.get(kind) {
            Some(Entry::External(handler)) => Some(handler.clone()),
            _ => None,
        }
    }

    pub(crate) fn in_transaction(&self, kind: &str) -> Option<Arc<dyn TxStep>> {
        match self.steps.get(kind) {
            Some(Entry::InTransaction(step)) => Some(step.clone()),
            _ => None,
        }
    }

    /// Who runs a step type; an unknown one is `External` (its missing
    /// handler then fails the step).
    pub fn class(&self, kind: &str) -> StepClass {
        if is_control(kind) {
            return StepClass::Control;
        }
        match self.steps.get(kind) {
            Some(Entry::InTransaction(_)) => StepClass::InTransaction,
            _ => StepClass::External,
        }
    }

    /// The retry policy a registered handler gives its type's steps.
    pub fn retry_policy(&self, kind: &str) -> Option<RetryPolicy> {
        self.handler(kind)?.retry_policy()
    }

    /// Whether an automation may use this step type.
    pub fn is_known(&self, kind: &str) -> bool {
        is_control(kind) || self.steps.contains_key(kind)
    }

    /// Checks a registered step's `config` at save (control steps are
    /// checked by `tok-core`'s validation).
    pub fn validate(&self, kind: &str, config: &Value) -> Result<(), String> {
        self.check_config(kind, config).map_err(|e| e.message)
    }

    /// [`Registry::validate`], with the key of `config` the problem concerns.
    pub fn check_config(&self, kind: &str, config: &Value) -> Result<(), ConfigError> {
        match self.steps.get(kind) {
            Some(Entry::InTransaction(step)) => {
                step.validate(config).map_err(|message| ConfigError {
                    key: String::new(),
                    message,
                })
            }
            Some(Entry::External(handler)) => handler.check_config(config),
            None => Ok(()),
        }
    }

    /// The keys a registered step type's `config` may have; `None` for a
    /// type that takes any key, a control type (`tok-core` checks those)
    /// and an unknown one.
    pub fn config_keys(&self, kind: &str) -> Option<&'static [&'static str]> {
        match self.steps.get(kind) {
            Some(Entry::InTransaction(step)) => Some(step.config_keys()),
            Some(Entry::External(handler)) => handler.config_keys(),
            None => None,
        }
    }

    /// Every known type name, sorted: for error messages that list them.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = tok_core::builtin::INTERNAL_TYPES
            .iter()
            .chain([
                &tok_core::advance::WAIT_FOR_EVENT,
                &tok_core::condition_wait::WAIT_FOR_CONDITION,
                &tok_core::children::WAIT_FOR_RUNS,
                &tok_core::parallel::PARALLEL,
                &tok_core::for_each::FOR_EACH,
                &tok_core::repeat::REPEAT,
            ])
            .map(|k| (*k).to_owned())
            .chain(self.steps.keys().cloned())
            .collect();
        kinds.sort();
        kinds
    }
}

#[cfg(test)]
mod tests {
    use super::Lease;

    #[test]
    fn a_lease_holds_until_its_deadline_and_a_heartbeat_moves_it_on() {
        let now = tok_store::now_ms();
        assert!(Lease::default().held(), "outside the engine: always held");
        let lease = Lease::until(now - 1);
        assert!(!lease.held(), "ran out");
        let shared = lease.clone();
        shared.extend_to(now + 60_000);
        assert!(lease.held(), "a heartbeat through a clone moves it on");
        lease.extend_to(now - 5);
        assert!(lease.held(), "an older answer never moves it back");
    }
}
