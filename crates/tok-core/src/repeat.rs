//! `repeat` (docs/workflows.md, "`repeat`"): runs its `do` steps again and
//! again, until `until` holds after an iteration (or while `while` holds
//! before one), at most `maxIterations` times, `every` apart.
//!
//! Iterations are addressed like a loop's (`<path>.do.<iteration>.<i>`),
//! and every step of every iteration counts toward the run's actions
//! (`MAX_ACTIONS`). The decider decides a repeat at two moments: when it
//! reaches the step ([`enters`]: a `while` that does not hold skips it),
//! and when an iteration's last step is done
//! ([`crate::flow::Next::IterationDone`], then [`after_iteration`]): the
//! repeat is over, or the next iteration starts (after `every`, a durable
//! wait: the job is due then, holding no slot), or the iteration limit is
//! reached and the step fails with `repeat_limit_exceeded`. Only the end of
//! a repeat is recorded as the repeat step's record, with `{iterations}`.

use std::time::Duration;

use serde_json::Value;

use crate::condition::Condition;
use crate::definition::{Filter, Step};
use crate::duration::parse_duration;
use crate::error::StepError;
use crate::limits::MAX_ACTIONS;
use crate::template;

/// The step type that repeats its `do` steps.
pub const REPEAT: &str = "repeat";

/// Iterations of a repeat that gives no `maxIterations`.
pub const DEFAULT_MAX_ITERATIONS: usize = 100;

/// A repeat's config, rendered.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub until: Option<Filter>,
    pub while_: Option<Filter>,
    pub max_iterations: usize,
    pub every: Option<Duration>,
}

/// What happens after an iteration.
#[derive(Debug, Clone, PartialEq)]
pub enum Again {
    /// The repeat is over after this many iterations.
    Over(usize),
    /// Iteration `n` (0-based) starts, after `delay`.
    Next { iteration: usize, delay: Duration },
}

/// The repeat's config rendered against the scope.
pub fn spec(step: &Step, scope: &Value) -> Result<Spec, StepError> {
    let bad = |what: String| StepError::terminal(format!("step `{}` config.{what}", step.id));
    let config = template::render_config(&step.config, scope)
        .map_err(|e| StepError::terminal(format!("step `{}` {e}", step.id)))?;
    let filter = |key: &str| -> Result<Option<Filter>, StepError> {
        match config.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(raw) => serde_json::from_value(raw.clone()).map(Some).map_err(|e| {
                bad(format!(
                    "{key}: {e}; expected {{\"match\": \"all\"|\"any\", \"rules\": [...]}}"
                ))
            }),
        }
    };
    let max_iterations = match config.get("maxIterations") {
        None | Some(Value::Null) => DEFAULT_MAX_ITERATIONS,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u64::from(MAX_ACTIONS)).contains(&n) => n as usize,
            _ => {
                return Err(bad(format!(
                    "maxIterations must be a whole number from 1 to {MAX_ACTIONS}, not {v}"
                )));
            }
        },
    };
    let every = match config.get("every") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(parse_duration(s).map_err(|e| bad(format!("every: {e}")))?),
        Some(other) => {
            return Err(bad(format!(
                "every must be a duration such as \"30s\", not {other}"
            )));
        }
    };
    Ok(Spec {
        until: filter("until")?,
        while_: filter("while")?,
        max_iterations,
        every,
    })
}

fn holds(filter: &Filter, scope: &Value) -> bool {
    Condition::from_filter(filter).evaluate(scope).result
}

/// Whether the repeat runs its first iteration: unless `while` does not
/// hold (or there is nothing to repeat).
pub fn enters(step: &Step, spec: &Spec, scope: &Value) -> bool {
    !step.do_.is_empty() && spec.while_.as_ref().is_none_or(|w| holds(w, scope))
}

/// After iteration `iteration` (0-based): over when `until` holds or
/// `while` no longer does; the next iteration while below the limit; past
/// it, `repeat_limit_exceeded` (terminal: a repeat that never ends is a
/// broken automation, not a success).
pub fn after_iteration(
    step: &Step,
    spec: &Spec,
    scope: &Value,
    iteration: usize,
) -> Result<Again, StepError> {
    let done = iteration + 1;
    let over = spec.until.as_ref().is_some_and(|u| holds(u, scope))
        || spec.while_.as_ref().is_some_and(|w| !holds(w, scope));
    if over {
        return Ok(Again::Over(done));
    }
    if done >= spec.max_iterations {
        return Err(StepError::terminal(format!(
            "repeat_limit_exceeded: step `{}` repeated {done} times (its maxIterations) \
             and its condition still asked for more",
            step.id
        )));
    }
    Ok(Again::Next {
        iteration: done,
        delay: spec.every.unwrap_or(Duration::ZERO),
    })
}
