//! What a `wait_for_event` step waits for (DESIGN §5a, signals): the
//! decider parks a run on the [`SignalWait`] its config describes.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;

use crate::definition::{Filter, Step};
use crate::duration::parse_duration;
use crate::error::StepError;
use crate::run::SignalWait;
use crate::template;

/// What a `wait_for_event` step waits for, from its config rendered against
/// the scope: `key` (required), `where` (rules over the signal's payload),
/// `timeout` (a duration) and `lookback` (default true). Returns the
/// rendered config too, for the step's record.
pub fn signal_wait(
    step: &Step,
    scope: &Value,
    now: Timestamp,
) -> Result<(SignalWait, Value), StepError> {
    let config = template::render_value(&step.config, scope)
        .map_err(|e| StepError::terminal(format!("step `{}` config: {e}", step.id)))?;
    let key = match config.get("key") {
        Some(Value::String(k)) if !k.trim().is_empty() => k.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => {
            return Err(StepError::terminal(format!(
                "step `{}` needs `config.key`: the signal key to wait for, a non-empty string",
                step.id
            )));
        }
    };
    let filter = match config.get("where") {
        None | Some(Value::Null) => None,
        Some(raw) => Some(serde_json::from_value::<Filter>(raw.clone()).map_err(|e| {
            StepError::terminal(format!(
                "step `{}` config.where: {e}; expected {{\"match\": \"all\"|\"any\", \"rules\": [...]}}",
                step.id
            ))
        })?),
    };
    let due_at = match config.get("timeout") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            let timeout: Duration = parse_duration(s).map_err(|e| {
                StepError::terminal(format!("step `{}` config.timeout: {e}", step.id))
            })?;
            Some(
                now.as_millisecond()
                    .saturating_add(timeout.as_millis() as i64),
            )
        }
        Some(other) => {
            return Err(StepError::terminal(format!(
                "step `{}` config.timeout must be a duration such as \"3d\", not {other}",
                step.id
            )));
        }
    };
    let lookback = match config.get("lookback") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(StepError::terminal(format!(
                "step `{}` config.lookback must be true or false, not {other}",
                step.id
            )));
        }
    };
    let wait = SignalWait {
        key,
        filter,
        lookback,
        due_at,
    };
    Ok((wait, config))
}
