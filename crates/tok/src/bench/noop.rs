//! `bench/noop`: a step type that does nothing, registered as an external
//! handler so that each of its steps goes through its own claim and record
//! (the `steps-queued` figure). `tok serve` registers it only when
//! `TOK_BENCH_STEPS=1`, which `tok bench` sets on the servers it starts.

use async_trait::async_trait;
use serde_json::{Map, Value};
use tok_core::error::StepError;
use tok_engine::{StepCall, StepHandler};

/// The environment variable that makes `tok serve` register [`Noop`].
pub const BENCH_STEPS_ENV: &str = "TOK_BENCH_STEPS";

/// The step type's name in automations.
pub const NOOP_STEP: &str = "bench/noop";

/// Whether this process was asked to register the bench's step types.
pub fn steps_enabled() -> bool {
    std::env::var(BENCH_STEPS_ENV).is_ok_and(|v| v == "1")
}

/// Returns no outputs, at once.
pub struct Noop;

#[async_trait]
impl StepHandler for Noop {
    async fn run(&self, _call: StepCall) -> Result<Map<String, Value>, StepError> {
        Ok(Map::new())
    }
}
