//! How an automation's runs start (`"flow": {…}` beside `trigger`, DESIGN
//! §16): the controls the dispatch applies to the runs an event starts.
//!
//! `priority`: an integer from [`MIN_PRIORITY`] to [`MAX_PRIORITY`], or a
//! template over the run's first context rendering one (`"{{_body.tier}}"`).
//! A run's jobs are claimed in their tenant's share highest priority first
//! (then oldest first); the share itself is the tenant's whatever the
//! priority, so a tenant cannot take another's slots by raising its own.
//! A written priority is checked at save; a rendered one that is not an
//! integer, or that a template cannot render, is 0 (said in the dispatch's
//! log), and one outside the range is held to it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::template;

pub const MIN_PRIORITY: i64 = -100;
pub const MAX_PRIORITY: i64 = 100;

/// `flow`: the start controls of an automation. Unknown keys are refused
/// like everywhere in a definition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowControl {
    /// `priority`: a number, or a template string (checked by
    /// [`check_priority`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Value>,
}

impl FlowControl {
    pub fn is_empty(&self) -> bool {
        self.priority.is_none()
    }

    /// The priority of a run that starts with `context`, and why it is 0
    /// when its template did not give one.
    pub fn priority(&self, context: &Value) -> (i32, Option<String>) {
        let Some(priority) = &self.priority else {
            return (0, None);
        };
        let rendered = match priority {
            Value::String(t) => match template::render(t, context) {
                Ok(v) => v,
                Err(e) => {
                    return (
                        0,
                        Some(format!("flow.priority: {e}; the run has priority 0")),
                    );
                }
            },
            other => other.clone(),
        };
        match integer(&rendered) {
            Some(n) => (n.clamp(MIN_PRIORITY, MAX_PRIORITY) as i32, None),
            None => (
                0,
                Some(format!(
                    "flow.priority rendered {rendered}, not an integer; the run has priority 0"
                )),
            ),
        }
    }
}

/// An integer as JSON writes it, or a string of one (a rendered template
/// with text around its placeholder is a string).
fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// What is wrong with a written `flow.priority`, if anything.
pub fn check_priority(priority: &Value) -> Option<String> {
    let range = format!("an integer from {MIN_PRIORITY} to {MAX_PRIORITY}");
    match priority {
        Value::String(t) if template::has_placeholder(t) => template::check(t)
            .err()
            .map(|e| format!("the priority template does not parse: {e}")),
        Value::Number(_) | Value::String(_) => match integer(priority) {
            Some(n) if (MIN_PRIORITY..=MAX_PRIORITY).contains(&n) => None,
            _ => Some(format!(
                "`priority` is {priority}; it must be {range} (higher is claimed first), \
                 or a template rendering one"
            )),
        },
        other => Some(format!(
            "`priority` is {other}; it must be {range}, or a template rendering one"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn flow(priority: Value) -> FlowControl {
        FlowControl {
            priority: Some(priority),
        }
    }

    #[test]
    fn a_written_priority_is_checked_at_save() {
        for ok in [
            json!(0),
            json!(-100),
            json!(100),
            json!("7"),
            json!("{{_body.tier}}"),
        ] {
            assert_eq!(check_priority(&ok), None, "{ok}");
        }
        for bad in [
            json!(101),
            json!(-101),
            json!(1.5),
            json!("high"),
            json!(true),
            json!([1]),
        ] {
            let message = check_priority(&bad).unwrap_or_else(|| panic!("{bad} passed"));
            assert!(message.contains("-100 to 100"), "{message}");
        }
        assert!(
            check_priority(&json!("{{ _body.tier"))
                .unwrap()
                .contains("does not parse")
        );
    }

    #[test]
    fn a_rendered_priority_is_an_integer_held_to_the_range_or_0_with_the_reason() {
        let context = json!({ "_body": { "tier": 50, "big": 1000, "name": "gold", "text": "20" } });
        assert_eq!(flow(json!(30)).priority(&context), (30, None));
        assert_eq!(FlowControl::default().priority(&context), (0, None));
        assert_eq!(flow(json!("{{_body.tier}}")).priority(&context), (50, None));
        assert_eq!(flow(json!("{{_body.text}}")).priority(&context), (20, None));
        assert_eq!(flow(json!("{{_body.big}}")).priority(&context), (100, None));
        let (n, why) = flow(json!("{{_body.name}}")).priority(&context);
        assert_eq!(n, 0);
        assert!(why.unwrap().contains("\"gold\", not an integer"));
        let (n, why) = flow(json!("{{_body.missing}}")).priority(&context);
        assert_eq!(n, 0);
        assert!(why.unwrap().contains("_body.missing"));
    }
}
