//! The automation definition as authors write it: a trigger and a tree of
//! steps, in the JSON shape of DESIGN §4.
//!
//! These types only describe; [`crate::validate`] decides whether a definition
//! may be saved, [`crate::flow`] walks the tree and [`crate::condition`] turns
//! condition steps and trigger filters into something that can be evaluated.
//! Serialization omits empty and absent parts, so a definition read and written
//! again stays compact and reads back equal.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::retry::RetryPolicy;

/// A definition that is not well-formed JSON or does not have the expected
/// shape. The message is serde's, with the position in the source text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DefinitionError {
    #[error("invalid automation definition at line {line}, column {column}: {message}")]
    Json {
        message: String,
        line: usize,
        column: usize,
    },
}

/// One saved version of an automation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Automation {
    pub name: String,
    pub trigger: Trigger,
    pub steps: Vec<Step>,
    #[serde(default, skip_serializing_if = "Settings::is_empty")]
    pub settings: Settings,
}

impl Automation {
    /// Parses a definition. Shape errors (an unknown step field such as
    /// `"thne"`, a wrong type) are reported with serde's message and position;
    /// semantic checks are [`crate::validate::validate`]'s job.
    pub fn from_json(json: &str) -> Result<Automation, DefinitionError> {
        serde_json::from_str(json).map_err(|e| {
            let full = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
            DefinitionError::Json {
                message,
                line: e.line(),
                column: e.column(),
            }
        })
    }

    /// The compact JSON form, as stored with each version.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a definition always serializes")
    }

    /// Number of steps in the whole tree, nested steps included.
    pub fn step_count(&self) -> usize {
        count_steps(&self.steps)
    }
}

/// Number of steps in `steps` and everything nested under them.
pub fn count_steps(steps: &[Step]) -> usize {
    steps
        .iter()
        .map(|s| {
            1 + count_steps(&s.then)
                + count_steps(&s.else_)
                + count_steps(&s.do_)
                + s.branches.iter().map(|b| count_steps(b)).sum::<usize>()
                + s.escalations
                    .iter()
                    .map(|e| count_steps(&e.steps))
                    .sum::<usize>()
                + count_steps(&s.compensate)
        })
        .sum()
}

/// What starts a run. A trigger's filter is evaluated by the dispatcher over
/// the context the run would start with, before the run is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Trigger {
    Webhook {
        source: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    Event {
        event: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    Poll {
        #[serde(
            rename = "intervalSec",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        interval_sec: Option<u64>,
        /// What is polled (`mail`, `messages`, …): picks the default
        /// interval when `intervalSec` is absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        service: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    Schedule {
        cron: String,
        /// An IANA time zone name (`Europe/Prague`); UTC when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    Manual {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
}

impl Trigger {
    /// The filter, whatever the kind of trigger.
    pub fn filter(&self) -> Option<&Filter> {
        match self {
            Trigger::Webhook { filter, .. }
            | Trigger::Event { filter, .. }
            | Trigger::Poll { filter, .. }
            | Trigger::Schedule { filter, .. }
            | Trigger::Manual { filter } => filter.as_ref(),
        }
    }

    /// The `kind` as written in JSON and stored in `runs.trigger_type`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Trigger::Webhook { .. } => "webhook",
            Trigger::Event { .. } => "event",
            Trigger::Poll { .. } => "poll",
            Trigger::Schedule { .. } => "schedule",
            Trigger::Manual { .. } => "manual",
        }
    }
}

/// Rules combined with `all` or `any`; one level, no parentheses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Filter {
    #[serde(rename = "match", default)]
    pub match_: Match,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// How the rules of a condition or filter combine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Match {
    /// Every rule must hold (true when there are none).
    #[default]
    All,
    /// At least one rule must hold (false when there are none).
    Any,
}

/// One comparison: the value at `field` (a dot path into the context) against
/// `value` (whose strings are templates, rendered before comparing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    pub field: String,
    pub operator: Operator,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub value: Value,
}

/// The comparison of a [`Rule`]; semantics are in [`crate::condition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Operator {
    Eq,
    Neq,
    Gt,
    Gte,
    Lt,
    Lte,
    Contains,
    NotContains,
    StartsWith,
    IsEmpty,
    IsNotEmpty,
    In,
}

impl Operator {
    /// The name as written in JSON (`notContains`), used in log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Eq => "eq",
            Operator::Neq => "neq",
            Operator::Gt => "gt",
            Operator::Gte => "gte",
            Operator::Lt => "lt",
            Operator::Lte => "lte",
            Operator::Contains => "contains",
            Operator::NotContains => "notContains",
            Operator::StartsWith => "startsWith",
            Operator::IsEmpty => "isEmpty",
            Operator::IsNotEmpty => "isNotEmpty",
            Operator::In => "in",
        }
    }

    /// Whether the operator looks only at the field (`isEmpty`, `isNotEmpty`)
    /// and ignores the rule's value.
    pub fn is_unary(self) -> bool {
        matches!(self, Operator::IsEmpty | Operator::IsNotEmpty)
    }
}

impl std::fmt::Display for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Automation-wide settings. Unknown keys are accepted and dropped, so settings
/// added by a newer version do not make older definitions unreadable.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// `runTimeout` (`"1h"`): a run unfinished this long after it was
    /// created is failed by the scheduler, with a platform incident.
    #[serde(
        rename = "runTimeout",
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::duration::serde_optional_duration"
    )]
    pub run_timeout: Option<std::time::Duration>,
    /// `keepStepData: true`: every step of this automation's runs is stored
    /// with its whole input and output, not only the failed ones
    /// (see [`crate::retention`]).
    #[serde(
        rename = "keepStepData",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub keep_step_data: bool,
    /// `limits`: how often the automation may start (DESIGN §5a, "Start
    /// limits").
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// `compensateOnFailure: true`: a run that fails runs the `compensate`
    /// steps of its completed steps before it ends `failed`, as a
    /// cancelled run always does ([`crate::compensation`]).
    #[serde(
        rename = "compensateOnFailure",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub compensate_on_failure: bool,
}

impl Settings {
    fn is_empty(&self) -> bool {
        self.retry.is_none()
            && self.run_timeout.is_none()
            && !self.keep_step_data
            && self.limits.is_empty()
            && !self.compensate_on_failure
    }
}

/// `settings.limits`; an absent limit is no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// `startsPerMinute`: at most this many runs start in any 60 seconds.
    /// A manual start over it is refused (`429`, `Retry-After`); an event
    /// over it creates a `refused` run with `start_rate_exceeded`.
    #[serde(
        rename = "startsPerMinute",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub starts_per_minute: Option<u32>,
}

impl Limits {
    fn is_empty(&self) -> bool {
        self.starts_per_minute.is_none()
    }
}

/// One node of the step tree. `kind` is the step type (`"http"`,
/// `"condition"`); `then`/`else` belong to conditions and `do` to loops.
///
/// A condition is written either with `match` + `rules` or, in the legacy form,
/// with one rule spread over `fieldId`/`operator`/`value`; read both through
/// [`crate::condition::Condition::from_step`]. Unknown fields are rejected so a
/// typo such as `"thne"` fails at save instead of silently dropping a branch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// `Null` when absent.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub config: Value,
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub match_: Option<Match>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<Rule>>,
    #[serde(rename = "fieldId", default, skip_serializing_if = "Option::is_none")]
    pub field_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<Operator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub then: Vec<Step>,
    #[serde(rename = "else", default, skip_serializing_if = "Vec::is_empty")]
    pub else_: Vec<Step>,
    /// The loop body, run once per item.
    #[serde(rename = "do", default, skip_serializing_if = "Vec::is_empty")]
    pub do_: Vec<Step>,
    /// The branches of a `parallel` step, each a list of steps run as a
    /// chain of its own, at the same time as the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<Vec<Step>>,
    /// Overrides the automation's retry policy for this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// What happens while a waiting step (`wait_for_event`, `approval`)
    /// still waits: each level's steps run once, `after` the wait began,
    /// without resuming the wait.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalations: Vec<Escalation>,
    /// What undoes this step: run when the run is cancelled (or fails,
    /// with `settings.compensateOnFailure`) after this step completed,
    /// most recently completed first ([`crate::compensation`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compensate: Vec<Step>,
}

/// One level of a waiting step's escalations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Escalation {
    /// A duration (`"10m"`, `"4h"`) after the wait began.
    pub after: String,
    pub steps: Vec<Step>,
}

impl Step {
    /// A step of type `kind` with the given config and nothing else; handy for
    /// building trees in code and tests.
    pub fn new(id: impl Into<String>, kind: impl Into<String>, config: Value) -> Step {
        Step {
            id: id.into(),
            kind: kind.into(),
            config,
            match_: None,
            rules: None,
            field_id: None,
            operator: None,
            value: None,
            then: Vec::new(),
            else_: Vec::new(),
            do_: Vec::new(),
            branches: Vec::new(),
            escalations: Vec::new(),
            compensate: Vec::new(),
            retry: None,
        }
    }

    /// A string in `config` by key, if present and a string.
    pub fn config_str(&self, key: &str) -> Option<&str> {
        self.config.get(key).and_then(Value::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    const DESIGN_EXAMPLE: &str = r#"{
      "name": "New order",
      "trigger": { "kind": "webhook", "source": "src_eshop",
                   "filter": { "match": "all", "rules": [{ "field": "kind", "operator": "eq", "value": "order.created" }] } },
      "steps": [
        { "id": "st_ticket", "type": "ticket/upsert", "config": { "externalId": "{{orderId}}", "type": "order" } },
        { "id": "st_check", "type": "condition", "match": "all",
          "rules": [{ "field": "st_ticket.created", "operator": "eq", "value": true }],
          "then": [{ "id": "st_tag", "type": "ticket/add-tags", "config": { "tags": ["awaiting packing"] } }],
          "else": [] }
      ],
      "settings": { "retry": { "max_attempts": 5, "backoff": ["30s", "2m", "10m", "1h"] } }
    }"#;

    #[test]
    fn reads_the_design_example() {
        let a = Automation::from_json(DESIGN_EXAMPLE).unwrap();
        assert_eq!(a.name, "New order");
        assert_eq!(a.trigger.kind_name(), "webhook");
        let filter = a.trigger.filter().unwrap();
        assert_eq!(filter.match_, Match::All);
        assert_eq!(filter.rules[0].operator, Operator::Eq);
        assert_eq!(a.steps.len(), 2);
        assert_eq!(a.steps[0].kind, "ticket/upsert");
        assert_eq!(a.steps[1].then[0].id, "st_tag");
        assert!(a.steps[1].else_.is_empty());
        assert_eq!(a.step_count(), 3);
        let retry = a.settings.retry.as_ref().unwrap();
        assert_eq!(retry.max_attempts, 5);
        assert_eq!(retry.backoff[1], Duration::from_secs(120));
    }

    #[test]
    fn round_trips_to_compact_json() {
        let a = Automation::from_json(DESIGN_EXAMPLE).unwrap();
        let json = a.to_json();
        assert!(
            !json.contains("\"else\""),
            "empty else must be omitted: {json}"
        );
        assert!(
            !json.contains("null"),
            "absent fields must be omitted: {json}"
        );
        assert!(
            json.contains(r#""backoff":["30s","2m","10m","1h"]"#),
            "{json}"
        );
        assert_eq!(Automation::from_json(&json).unwrap(), a);
    }

    #[test]
    fn all_trigger_shapes_parse() {
        let cases = [
            (json!({"kind":"webhook","source":"src_a"}), "webhook"),
            (json!({"kind":"event","event":"ticket.updated"}), "event"),
            (json!({"kind":"poll","intervalSec":60}), "poll"),
            (json!({"kind":"schedule","cron":"0 8 * * 1-5"}), "schedule"),
            (json!({"kind":"manual"}), "manual"),
        ];
        for (value, kind) in cases {
            let t: Trigger = serde_json::from_value(value.clone()).unwrap();
            assert_eq!(t.kind_name(), kind);
            assert!(t.filter().is_none());
            assert_eq!(serde_json::to_value(&t).unwrap(), value);
        }
        let poll: Trigger =
            serde_json::from_value(json!({"kind":"poll","intervalSec":30})).unwrap();
        assert_eq!(
            poll,
            Trigger::Poll {
                interval_sec: Some(30),
                service: None,
                filter: None
            }
        );
    }

    #[test]
    fn operators_use_camel_case() {
        let ops: Vec<Operator> = serde_json::from_value(json!([
            "notContains",
            "startsWith",
            "isEmpty",
            "isNotEmpty",
            "in"
        ]))
        .unwrap();
        assert_eq!(
            ops,
            vec![
                Operator::NotContains,
                Operator::StartsWith,
                Operator::IsEmpty,
                Operator::IsNotEmpty,
                Operator::In
            ]
        );
        assert_eq!(Operator::NotContains.to_string(), "notContains");
        assert_eq!(
            serde_json::to_value(Operator::IsNotEmpty).unwrap(),
            json!("isNotEmpty")
        );
    }

    #[test]
    fn unknown_step_field_is_rejected_with_position() {
        let json = r#"{"name":"x","trigger":{"kind":"manual"},"steps":[
            {"id":"a","type":"condition","thne":[]}]}"#;
        let err = Automation::from_json(json).unwrap_err();
        let DefinitionError::Json {
            message,
            line,
            column,
        } = &err;
        assert!(message.contains("unknown field `thne`"), "{message}");
        assert!(!message.contains(" at line "), "{message}");
        assert_eq!(*line, 2);
        assert!(*column > 0);
        assert!(
            err.to_string()
                .starts_with("invalid automation definition at line 2")
        );
    }

    #[test]
    fn legacy_condition_fields_and_defaults() {
        let step: Step = serde_json::from_value(json!({
            "id": "c", "type": "condition", "fieldId": "status", "operator": "neq", "value": "done"
        }))
        .unwrap();
        assert_eq!(step.field_id.as_deref(), Some("status"));
        assert_eq!(step.operator, Some(Operator::Neq));
        assert_eq!(step.value, Some(json!("done")));
        assert_eq!(step.config, Value::Null);
        assert!(step.rules.is_none());
    }

    #[test]
    fn unknown_settings_keys_are_accepted() {
        let a = Automation::from_json(
            r#"{"name":"x","trigger":{"kind":"manual"},"steps":[],"settings":{"timezone":"UTC"}}"#,
        )
        .unwrap();
        assert_eq!(a.settings, Settings::default());
    }

    #[test]
    fn count_steps_counts_every_branch() {
        let mut cond = Step::new("c", "condition", Value::Null);
        cond.then = vec![Step::new("a", "set", Value::Null)];
        let mut lp = Step::new("l", "loop", Value::Null);
        lp.do_ = vec![
            Step::new("b", "set", Value::Null),
            Step::new("d", "end", Value::Null),
        ];
        cond.else_ = vec![lp];
        assert_eq!(count_steps(&[cond, Step::new("e", "end", Value::Null)]), 6);
    }
}
