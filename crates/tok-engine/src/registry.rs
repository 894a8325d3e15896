//! The step handler registry: which step types exist beyond the pure built-in
//! ones, and how to run them.
//!
//! Built-in control steps (`condition`, `loop`, `set`, `flow/log`, `wait`,
//! `end`) are decided by `tok-core`, and the service-desk steps (`ticket/*`,
//! `incident/create`, `emit`) run inside the record transaction; neither
//! reaches a handler. Everything else — `flow/pause`, connectors, and the step
//! types a Rust user registers — is a [`StepHandler`] that the worker runs
//! with no database connection held.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tok_core::builtin::INTERNAL_TYPES;
use tok_core::error::StepError;
use tok_core::ids::{JobId, RunId, TenantId};

use crate::steps::TX_TYPES;

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
    /// The context as this step sees it (loop variables included).
    pub context: Value,
}

/// A step type. Return the outputs to publish under the step's id, or a
/// [`StepError`] that says whether the attempt may be retried: only
/// `Retryable` and `RetryAfter` are; a `Terminal` error fails the run.
#[async_trait]
pub trait StepHandler: Send + Sync + 'static {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError>;

    /// Checks a step's `config` when an automation is saved; the message
    /// says what is wrong and what was expected.
    fn validate(&self, _config: &Value) -> Result<(), String> {
        Ok(())
    }
}

/// Step types by name.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn StepHandler>>,
}

impl Registry {
    /// The built-in handlers (`flow/pause`); add your own with [`Registry::register`].
    pub fn with_builtins() -> Self {
        let mut registry = Self::default();
        registry.register("flow/pause", crate::steps::pause::Pause);
        registry
    }

    /// The built-ins plus the connector steps (`http`, `mcp`), which need the
    /// store for their connections' limits.
    pub fn with_connectors(store: Arc<dyn tok_store::Store>) -> Self {
        let mut registry = Self::with_builtins();
        registry.add_connectors(store);
        registry
    }

    /// Adds the connector steps (`http`, `mcp`) where no handler of that
    /// name was registered already.
    pub fn add_connectors(&mut self, store: Arc<dyn tok_store::Store>) -> &mut Self {
        if !self.handlers.contains_key("http") {
            self.register("http", crate::steps::http::Http::new(store.clone()));
        }
        if !self.handlers.contains_key("mcp") {
            self.register("mcp", crate::steps::mcp::Mcp::new(store));
        }
        self
    }

    /// Registers (or replaces) the handler of a step type. The names of the
    /// pure built-in types cannot be taken.
    pub fn register(&mut self, kind: impl Into<String>, handler: impl StepHandler) -> &mut Self {
        let kind = kind.into();
        assert!(
            !INTERNAL_TYPES.contains(&kind.as_str()) && !TX_TYPES.contains(&kind.as_str()),
            "`{kind}` is a built-in step type and cannot be replaced"
        );
        self.handlers.insert(kind, Arc::new(handler));
        self
    }

    pub fn handler(&self, kind: &str) -> Option<Arc<dyn StepHandler>> {
        self.handlers.get(kind).cloned()
    }

    /// Whether an automation may use this step type.
    pub fn is_known(&self, kind: &str) -> bool {
        INTERNAL_TYPES.contains(&kind)
            || TX_TYPES.contains(&kind)
            || self.handlers.contains_key(kind)
    }

    /// Every known type name, sorted: for error messages that list them.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = INTERNAL_TYPES
            .iter()
            .chain(TX_TYPES)
            .map(|k| (*k).to_owned())
            .chain(self.handlers.keys().cloned())
            .collect();
        kinds.sort();
        kinds
    }
}
