//! What a `wait_for_event` step waits for (DESIGN §5a, signals): the
//! decider parks a run on the [`SignalWait`] its config describes. A wait
//! with a `subject` is resumed only by signals about that ticket, and a
//! wait without one only by signals about none (the store matches them).

use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;

use crate::definition::{Filter, Step};
use crate::duration::parse_duration;
use crate::error::StepError;
use crate::run::SignalWait;
use crate::template;

/// The `subject` of a wait that means the run's own subject ticket.
pub const RUN_SUBJECT: &str = "ticket";

/// Longest subject (a ticket id) a signal or a wait may name, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 200;

/// What a `wait_for_event` step waits for, from its config rendered against
/// the scope: `key` (required), `subject` (a ticket id, or `"ticket"`: the
/// run's subject ticket, `run_subject`), `where` (rules over the signal's
/// payload), `timeout` (a duration) and `lookback` (default true). Returns
/// the rendered config too, for the step's record.
pub fn signal_wait(
    step: &Step,
    scope: &Value,
    run_subject: Option<&str>,
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
    let subject = wait_subject(step, &config, run_subject)?;
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
        subject,
        filter,
        lookback,
        due_at,
    };
    Ok((wait, config))
}

/// The ticket a wait's signals must be about: none without `subject`,
/// the run's subject ticket for `"ticket"` as written in the step (a
/// template that renders to `ticket` names a ticket of that id), else the
/// rendered ticket id.
fn wait_subject(
    step: &Step,
    config: &Value,
    run_subject: Option<&str>,
) -> Result<Option<String>, StepError> {
    let subject = match config.get("subject") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.trim(),
        Some(other) => {
            return Err(StepError::terminal(format!(
                "step `{}` config.subject must be a ticket id or \"{RUN_SUBJECT}\" (the run's \
                 subject ticket), not {other}",
                step.id
            )));
        }
    };
    let written = step.config.get("subject").and_then(Value::as_str);
    if written.map(str::trim) == Some(RUN_SUBJECT) {
        return match run_subject {
            Some(ticket) => Ok(Some(ticket.to_owned())),
            None => Err(StepError::terminal(format!(
                "step `{}` waits for signals about the run's subject ticket \
                 (`\"subject\": \"{RUN_SUBJECT}\"`), but the run has no subject ticket: start \
                 it from a ticket's event or run `ticket/upsert` before the wait",
                step.id
            ))),
        };
    }
    if subject.is_empty() {
        return Err(StepError::terminal(format!(
            "step `{}` config.subject is empty; expected a ticket id or \"{RUN_SUBJECT}\" \
             (the run's subject ticket)",
            step.id
        )));
    }
    if subject.len() > MAX_SUBJECT_BYTES {
        return Err(StepError::terminal(format!(
            "step `{}` config.subject is {} bytes; a ticket id has at most {MAX_SUBJECT_BYTES}",
            step.id,
            subject.len()
        )));
    }
    Ok(Some(subject.to_owned()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn wait_step(config: Value) -> Step {
        serde_json::from_value(
            json!({ "id": "st_wait", "type": "wait_for_event", "config": config }),
        )
        .expect("a step")
    }

    fn subject_of(config: Value, run_subject: Option<&str>) -> Result<Option<String>, String> {
        let scope = json!({ "order": { "ticket": "tk_7" }, "empty": "" });
        signal_wait(
            &wait_step(config),
            &scope,
            run_subject,
            Timestamp::UNIX_EPOCH,
        )
        .map(|(wait, _)| wait.subject)
        .map_err(|e| {
            assert!(!e.is_retryable(), "a config error is terminal: {e:?}");
            e.message().to_owned()
        })
    }

    #[test]
    fn a_wait_is_about_no_ticket_a_rendered_one_or_the_runs() {
        let cases = [
            (json!({ "key": "k" }), None, Some(None)),
            (
                json!({ "key": "k", "subject": null }),
                Some("tk_1"),
                Some(None),
            ),
            (
                json!({ "key": "k", "subject": "tk_2" }),
                Some("tk_1"),
                Some(Some("tk_2")),
            ),
            (
                json!({ "key": "k", "subject": " tk_2 " }),
                None,
                Some(Some("tk_2")),
            ),
            (
                json!({ "key": "k", "subject": "{{order.ticket}}" }),
                None,
                Some(Some("tk_7")),
            ),
            (
                json!({ "key": "k", "subject": "ticket" }),
                Some("tk_1"),
                Some(Some("tk_1")),
            ),
        ];
        for (config, run_subject, expected) in cases {
            let got = subject_of(config.clone(), run_subject);
            assert_eq!(
                got.as_ref().ok().map(Option::as_deref),
                expected,
                "{config} with run subject {run_subject:?}: {got:?}"
            );
        }
    }

    #[test]
    fn a_subject_that_names_no_ticket_is_a_clear_terminal_error() {
        let long = "t".repeat(MAX_SUBJECT_BYTES + 1);
        let cases = [
            (
                json!({ "key": "k", "subject": "ticket" }),
                "the run has no subject ticket",
            ),
            (
                json!({ "key": "k", "subject": 42 }),
                "config.subject must be a ticket id or \"ticket\" (the run's subject ticket), not 42",
            ),
            (
                json!({ "key": "k", "subject": ["tk_1"] }),
                "config.subject must be a ticket id",
            ),
            (
                json!({ "key": "k", "subject": "  " }),
                "config.subject is empty",
            ),
            (
                json!({ "key": "k", "subject": "{{empty}}" }),
                "config.subject is empty",
            ),
            (json!({ "key": "k", "subject": long }), "at most 200"),
        ];
        for (config, expected) in cases {
            let error = subject_of(config.clone(), None).expect_err(&config.to_string());
            assert!(
                error.starts_with("step `st_wait`") && error.contains(expected),
                "{config}: expected `{expected}` in {error:?}"
            );
        }
    }
}
