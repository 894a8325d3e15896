//! `wait_for_condition` (docs/workflows.md, "Waiting for a ticket's
//! condition: `wait_for_condition`"): the run waits until a ticket — its
//! subject ticket unless the step names another — holds the step's rules,
//! checked over the ticket as its `ticket.*` events show it (`status`,
//! `closed`, `tags`, `fields.<name>`, `assigneeId`, …).
//!
//! The decider parks the run on a [`SignalWait`] on the reserved
//! [`CONDITION_KEY`] about that ticket, whose filter is the rules. The
//! store checks the rules as the wait parks (a condition that already
//! holds goes on at once) and in the record transaction of every write of
//! the ticket, and resumes the run with the ticket ([`Resume::Condition`]).
//! Without a change, the wait is due at its next `every` check or its
//! `timeout`, whichever is first: the decider parks it again until the
//! next one (the store checks again as it parks) or, at the deadline,
//! ends the step `{timedOut: true}`. The deadline and the check interval
//! are kept in the run's context ([`crate::waits::WAITING_KEY`]) while
//! it waits.
//!
//! [`Resume::Condition`]: crate::run::Resume::Condition

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::definition::{Filter, Step};
use crate::error::StepError;
use crate::limits::MIN_CONDITION_EVERY_MS;
use crate::run::SignalWait;
use crate::template;
use crate::waits::{CONDITION_KEY, duration_at, wait_subject};

/// The step type that parks a run until a ticket holds its rules.
pub const WAIT_FOR_CONDITION: &str = "wait_for_condition";

/// A condition wait as it stands while it waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionWait {
    /// The ticket the rules are about.
    pub ticket: String,
    pub rules: Filter,
    /// How often the rules are checked besides the ticket's changes (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<i64>,
    /// Unix ms when the wait gives up; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<i64>,
}

impl ConditionWait {
    /// Whether the wait gives up at `now`.
    pub fn is_over(&self, now: i64) -> bool {
        self.due_at.is_some_and(|due| now >= due)
    }

    /// What the run parks on at `now`: the ticket and its rules, due at
    /// the next check or the deadline, whichever is first.
    pub fn parked(&self, now: i64) -> SignalWait {
        let check = self.every_ms.map(|every| now.saturating_add(every));
        let due_at = match (check, self.due_at) {
            (Some(check), Some(deadline)) => Some(check.min(deadline)),
            (check, deadline) => check.or(deadline),
        };
        SignalWait {
            key: CONDITION_KEY.to_owned(),
            also: Vec::new(),
            subject: Some(self.ticket.clone()),
            filter: Some(self.rules.clone()),
            lookback: false,
            due_at,
            since: None,
        }
    }
}

/// What a `wait_for_condition` step waits for, from its config rendered
/// against the scope: `rules` (a list of `{field, operator, value}` over
/// the ticket) combined by `match` (`all`, the default, or `any`),
/// `subject` (absent or `"ticket"`: the run's subject ticket; else a
/// ticket id), `every` and `timeout` (durations). Returns the rendered
/// config too, for the step's record.
pub fn condition_wait(
    step: &Step,
    scope: &Value,
    run_subject: Option<&str>,
    now: Timestamp,
) -> Result<(ConditionWait, Value), StepError> {
    let id = &step.id;
    let config = template::render_config(&step.config, scope)
        .map_err(|e| StepError::terminal(format!("step `{id}` {e}")))?;
    let rules = rules_of(&config).map_err(|e| StepError::terminal(format!("step `{id}` {e}")))?;
    let Some(ticket) = wait_subject(step, &config, run_subject, true)? else {
        return Err(StepError::terminal(format!(
            "step `{id}` waits for a condition on the run's subject ticket, but the run has \
             no subject ticket: start it from a ticket's event, run `ticket/upsert` before \
             the wait, or name the ticket in `config.subject`"
        )));
    };
    let every_ms = match duration_at(step, &config, "every")? {
        Some(every) if (every.as_millis() as i64) < MIN_CONDITION_EVERY_MS => {
            return Err(StepError::terminal(format!(
                "step `{id}` config.every is {} ms; the rules are checked at most every \
                 {MIN_CONDITION_EVERY_MS} ms (and on every change of the ticket)",
                every.as_millis()
            )));
        }
        every => every.map(|d| d.as_millis() as i64),
    };
    let due_at = crate::waits::due_after(step, &config, "timeout", now)?;
    let wait = ConditionWait {
        ticket,
        rules,
        every_ms,
        due_at,
    };
    Ok((wait, config))
}

/// The rules of a `wait_for_condition` config: `rules` (a non-empty
/// list) and `match`; `Err` says what is wrong, after the step's name.
pub fn rules_of(config: &Value) -> Result<Filter, String> {
    let rules = match config.get("rules") {
        Some(Value::Array(rules)) if !rules.is_empty() => rules,
        Some(other) => {
            return Err(format!(
                "config.rules must be a non-empty list of rules like [{{\"field\": \"status\", \
                 \"operator\": \"eq\", \"value\": \"shipped\"}}], not {other}"
            ));
        }
        None => {
            return Err(
                "needs `config.rules`: the rules the ticket must hold, like [{\"field\": \
                 \"status\", \"operator\": \"eq\", \"value\": \"shipped\"}]"
                    .to_owned(),
            );
        }
    };
    let mut filter = serde_json::json!({ "rules": rules });
    match config.get("match") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == "all" || m == "any" => {
            filter["match"] = Value::from(m.as_str())
        }
        Some(other) => {
            return Err(format!(
                "config.match must be \"all\" or \"any\", not {other}"
            ));
        }
    }
    serde_json::from_value::<Filter>(filter).map_err(|e| {
        format!("config.rules: {e}; each rule is {{\"field\", \"operator\", \"value\"}}")
    })
}

/// The log line of a wait that parks on `wait` (its first park).
pub fn waiting_line(wait: &ConditionWait) -> String {
    let mut line = format!("waiting until ticket {} holds the rules", wait.ticket);
    line.push_str(" (checked on each change of the ticket");
    if let Some(every) = wait.every_ms {
        let every = std::time::Duration::from_millis(every.max(0) as u64);
        line.push_str(&format!(" and every {}", crate::duration::humanize(every)));
    }
    line.push(')');
    if let Some(due) = wait
        .due_at
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
    {
        line.push_str(&format!(" until {due}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn step(config: Value) -> Step {
        serde_json::from_value(
            json!({ "id": "st_cond", "type": WAIT_FOR_CONDITION, "config": config }),
        )
        .expect("a step")
    }

    const NOW: i64 = 1_000_000;

    fn wait_of(config: Value, run_subject: Option<&str>) -> Result<ConditionWait, String> {
        let now = Timestamp::from_millisecond(NOW).expect("a time");
        condition_wait(
            &step(config),
            &json!({ "target": "shipped" }),
            run_subject,
            now,
        )
        .map(|(wait, _)| wait)
        .map_err(|e| {
            assert!(!e.is_retryable(), "a config error is terminal: {e:?}");
            e.message().to_owned()
        })
    }

    #[test]
    fn a_condition_is_about_the_runs_subject_with_its_rendered_rules() {
        let wait = wait_of(
            json!({ "rules": [{ "field": "status", "operator": "eq", "value": "{{target}}" }],
                    "every": "1m", "timeout": "1h" }),
            Some("tk_1"),
        )
        .expect("a wait");
        assert_eq!(wait.ticket, "tk_1");
        assert_eq!(wait.rules.rules[0].value, json!("shipped"));
        assert_eq!(wait.every_ms, Some(60_000));
        assert_eq!(wait.due_at, Some(NOW + 3_600_000));
        // Due at the next check; the last check is the deadline.
        assert_eq!(wait.parked(NOW).due_at, Some(NOW + 60_000));
        assert_eq!(wait.parked(NOW + 3_590_000).due_at, Some(NOW + 3_600_000));
        assert_eq!(wait.parked(NOW).subject.as_deref(), Some("tk_1"));
        assert!(wait.parked(NOW).is_condition());
        assert!(!wait.is_over(NOW + 3_599_999) && wait.is_over(NOW + 3_600_000));
        let named = wait_of(
            json!({ "rules": [{ "field": "closed", "operator": "eq", "value": true }],
                    "subject": "tk_9", "match": "any" }),
            None,
        )
        .expect("a wait");
        assert_eq!(
            (named.ticket.as_str(), named.every_ms, named.due_at),
            ("tk_9", None, None)
        );
        assert_eq!(named.parked(NOW).due_at, None);
    }

    #[test]
    fn a_condition_without_a_ticket_or_rules_is_a_clear_terminal_error() {
        let rule = json!([{ "field": "status", "operator": "eq", "value": "shipped" }]);
        let cases = [
            (
                json!({ "rules": rule }),
                None,
                "the run has no subject ticket",
            ),
            (
                json!({ "rules": [] }),
                Some("tk_1"),
                "config.rules must be a non-empty list",
            ),
            (json!({}), Some("tk_1"), "needs `config.rules`"),
            (
                json!({ "rules": [{ "field": "status", "op": "eq" }] }),
                Some("tk_1"),
                "config.rules: unknown field `op`",
            ),
            (
                json!({ "rules": rule, "match": "most" }),
                Some("tk_1"),
                "config.match must be \"all\" or \"any\"",
            ),
            (
                json!({ "rules": rule, "every": "10ms" }),
                Some("tk_1"),
                "checked at most every 1000 ms",
            ),
            (
                json!({ "rules": rule, "timeout": 5 }),
                Some("tk_1"),
                "config.timeout must be a duration",
            ),
        ];
        for (config, subject, expected) in cases {
            let error = wait_of(config.clone(), subject).expect_err(&config.to_string());
            assert!(
                error.starts_with("step `st_cond`") && error.contains(expected),
                "{config}: expected `{expected}` in {error:?}"
            );
        }
    }
}
