//! `bench/noop`: a step type that does nothing, registered as an external
//! handler so that each of its steps goes through its own claim and record
//! (the `steps-queued`, `fairness` and `workers` figures). `tok serve`
//! never registers it: the bench's servers are `tok bench-serve`
//! ([`SERVE_SUBCOMMAND`]), the same serve with a registry that has the
//! bench's step types too ([`register`]).

use async_trait::async_trait;
use serde_json::{Map, Value};
use tok_core::error::StepError;
use tok_engine::{Registry, StepCall, StepHandler};

/// The hidden subcommand of the `tok` binary that serves like `tok serve`
/// with the bench's step types registered: what `tok bench` starts, and
/// what a server for `tok bench --url` must be started with.
pub const SERVE_SUBCOMMAND: &str = "bench-serve";

/// The step type's name in automations.
pub const NOOP_STEP: &str = "bench/noop";

/// Adds the bench's step types to a server's registry.
pub fn register(registry: &mut Registry) {
    registry.register(NOOP_STEP, Noop);
}

/// Why an automation with the bench's step types was refused.
pub(crate) fn not_registered() -> String {
    format!(
        "`{NOOP_STEP}` is registered only by a server started with `tok {SERVE_SUBCOMMAND}` \
         (not `tok serve`)"
    )
}

/// Returns no outputs, at once.
pub struct Noop;

#[async_trait]
impl StepHandler for Noop {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        Ok(Map::new())
    }
}
