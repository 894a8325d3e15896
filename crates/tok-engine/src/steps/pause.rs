//! `flow/pause`: waits a few seconds (at most 60, fractions allowed) while
//! holding its worker slot. Longer waits belong to `wait`, which holds
//! nothing but a row.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tok_core::error::StepError;
use tok_core::limits::MAX_PAUSE_SECS;

use crate::registry::{StepCall, StepHandler};

pub(crate) struct Pause;

fn seconds(config: &Value) -> Result<f64, String> {
    let seconds = config
        .get("seconds")
        .and_then(Value::as_f64)
        .ok_or_else(|| "flow/pause needs `seconds`: a number of seconds, at most 60".to_owned())?;
    if !(seconds > 0.0 && seconds <= MAX_PAUSE_SECS) {
        return Err(format!(
            "flow/pause `seconds` is {seconds}; it must be more than 0 and at most {MAX_PAUSE_SECS}"
        ));
    }
    Ok(seconds)
}

#[async_trait]
impl StepHandler for Pause {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        let seconds = seconds(&call.config).map_err(StepError::terminal)?;
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        Ok(Map::new())
    }

    fn config_keys(&self) -> Option<&'static [&'static str]> {
        Some(&["seconds"])
    }

    fn validate(&self, config: &Value) -> Result<(), String> {
        seconds(config).map(|_| ())
    }
}
