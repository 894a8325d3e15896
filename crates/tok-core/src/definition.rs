//! The automation definition as authors write it: a trigger and a tree of
//! steps, as JSON: `{"name", "trigger", "flow"?, "steps", "settings"?}`.
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

mod flow_control;

pub use flow_control::{
    Batch, CancelOn, Debounce, FlowControl, Singleton, SingletonMode, Throttle,
};

/// A definition that is not well-formed JSON or does not have the expected
/// shape: serde's message, the path of the part it concerns
/// (`steps.2.then.0.thne` for an unknown field, `trigger.kind` for a wrong
/// value; empty for the definition as a whole) and the position in the
/// source text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DefinitionError {
    #[error("invalid automation definition at line {line}, column {column}: {}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
    Json {
        path: String,
        message: String,
        line: usize,
        column: usize,
    },
}

/// One saved version of an automation. Unknown fields are refused here and
/// in every part below (trigger, filter, rules, settings, steps), so a
/// misspelt or misplaced key (`"flow": {"debounse": …}`, `"thne"`) fails at save
/// instead of being dropped; a stored version was written from these types,
/// so it always reads back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Automation {
    pub name: String,
    pub trigger: Trigger,
    /// `flow`: how its runs start (priority; see [`crate::start`]).
    #[serde(default, skip_serializing_if = "FlowControl::is_empty")]
    pub flow: FlowControl,
    pub steps: Vec<Step>,
    #[serde(default, skip_serializing_if = "Settings::is_empty")]
    pub settings: Settings,
}

impl Automation {
    /// Parses a definition. Shape errors (an unknown field such as
    /// `"thne"`, a wrong type) are reported with serde's message, the path
    /// of the part they concern and the position; semantic checks are
    /// [`crate::validate::validate`]'s job.
    pub fn from_json(json: &str) -> Result<Automation, DefinitionError> {
        let refused = |path: String, e: serde_json::Error| {
            let full = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
            DefinitionError::Json {
                path: with_unknown_field(path, &message),
                message,
                line: e.line(),
                column: e.column(),
            }
        };
        let mut de = serde_json::Deserializer::from_str(json);
        let automation = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = dotted(e.path());
            refused(path, e.into_inner())
        })?;
        de.end().map_err(|e| refused(String::new(), e))?;
        Ok(automation)
    }

    /// The compact JSON form, as stored with each version.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a definition always serializes")
    }
}

/// A deserialization path as the API names places in a definition
/// (`steps.2.then.0`): serde_path_to_error writes indexes as `[2]`.
fn dotted(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    path.iter()
        .map(|segment| match segment {
            Segment::Seq { index } => index.to_string(),
            Segment::Map { key } => key.clone(),
            Segment::Enum { variant } => variant.clone(),
            Segment::Unknown => "?".to_owned(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The path of an unknown field is the field's own (`settings.timezone`).
/// The tracker ends the path at the field's key for a plain struct; a
/// [`Trigger`] refuses a field of another kind after reading them all, so
/// the path stops at `trigger` and the field is taken from serde's message
/// (`` unknown field `cron`, expected … ``), whose form serde fixes.
fn with_unknown_field(path: String, message: &str) -> String {
    let field = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(field, _)| field);
    match field {
        Some(field) if path.rsplit('.').next() != Some(field) => {
            if path.is_empty() {
                field.to_owned()
            } else {
                format!("{path}.{field}")
            }
        }
        _ => path,
    }
}

/// What starts a run. A trigger's filter is evaluated by the dispatcher over
/// the context the run would start with, before the run is created.
///
/// Read through [`TriggerFields`] rather than serde's internally tagged
/// enum: that one buffers the object before picking the variant, so its
/// errors lose their path and, with `deny_unknown_fields`, a field of
/// another kind (`cron` on a `manual` trigger) could not be told from a
/// field of this one.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Trigger {
    Webhook {
        source: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    Event {
        event: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    Poll {
        #[serde(rename = "intervalSec", skip_serializing_if = "Option::is_none")]
        interval_sec: Option<u64>,
        /// What is polled (`mail`, `messages`, …): picks the default
        /// interval when `intervalSec` is absent.
        #[serde(skip_serializing_if = "Option::is_none")]
        service: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    Schedule {
        cron: String,
        /// An IANA time zone name (`Europe/Prague`); UTC when absent.
        #[serde(skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
    Manual {
        #[serde(skip_serializing_if = "Option::is_none")]
        filter: Option<Filter>,
    },
}

/// The kinds of [`Trigger`], as `kind` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum TriggerKind {
    Webhook,
    Event,
    Poll,
    Schedule,
    Manual,
}

/// Every field any trigger has, read as a plain struct (so the path of an
/// error inside, `trigger.filter.rules.0.oprator`, is kept), then checked
/// against the fields of its `kind`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TriggerFields {
    kind: TriggerKind,
    source: Option<String>,
    event: Option<String>,
    #[serde(rename = "intervalSec")]
    interval_sec: Option<u64>,
    service: Option<String>,
    cron: Option<String>,
    timezone: Option<String>,
    filter: Option<Filter>,
}

impl TriggerFields {
    fn into_trigger(self) -> Result<Trigger, String> {
        let (name, allowed): (&str, &[&str]) = match self.kind {
            TriggerKind::Webhook => ("webhook", &["source", "filter"]),
            TriggerKind::Event => ("event", &["event", "filter"]),
            TriggerKind::Poll => ("poll", &["intervalSec", "service", "filter"]),
            TriggerKind::Schedule => ("schedule", &["cron", "timezone", "filter"]),
            TriggerKind::Manual => ("manual", &["filter"]),
        };
        let present = [
            ("source", self.source.is_some()),
            ("event", self.event.is_some()),
            ("intervalSec", self.interval_sec.is_some()),
            ("service", self.service.is_some()),
            ("cron", self.cron.is_some()),
            ("timezone", self.timezone.is_some()),
        ];
        if let Some((field, _)) = present
            .iter()
            .find(|(field, is)| *is && !allowed.contains(field))
        {
            let expected: Vec<String> = allowed.iter().map(|f| format!("`{f}`")).collect();
            return Err(format!(
                "unknown field `{field}` for a `{name}` trigger, expected {}",
                expected.join(", ")
            ));
        }
        let missing =
            |field: &str| format!("missing field `{field}` (a `{name}` trigger needs it)");
        let filter = self.filter;
        Ok(match self.kind {
            TriggerKind::Webhook => Trigger::Webhook {
                source: self.source.ok_or_else(|| missing("source"))?,
                filter,
            },
            TriggerKind::Event => Trigger::Event {
                event: self.event.ok_or_else(|| missing("event"))?,
                filter,
            },
            TriggerKind::Poll => Trigger::Poll {
                interval_sec: self.interval_sec,
                service: self.service,
                filter,
            },
            TriggerKind::Schedule => Trigger::Schedule {
                cron: self.cron.ok_or_else(|| missing("cron"))?,
                timezone: self.timezone,
                filter,
            },
            TriggerKind::Manual => Trigger::Manual { filter },
        })
    }
}

impl<'de> Deserialize<'de> for Trigger {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        TriggerFields::deserialize(deserializer)?
            .into_trigger()
            .map_err(serde::de::Error::custom)
    }
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

/// Rules combined with `all` or `any`; one level, no parentheses. Also the
/// shape of a `wait_for_event`'s `where` and a repeat's `until`/`while`,
/// so an unknown key there (`"rule"`) is refused too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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

/// Automation-wide settings. An unknown key is refused like anywhere else
/// in a definition: a misspelt setting (`"runTimeOut"`) would otherwise be
/// dropped and the automation run without it. Stored versions were written
/// from this type, so they hold no unknown key and always read back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// `limits`: how often the automation may start (docs/workflows.md,
    /// "Start limits").
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
    /// `pruneStateAfter: N`: only the outputs of the N steps that finished
    /// last stay in the run's context; older ones leave it (their entries
    /// and the bare names they took) and stay in their step rows, which
    /// then keep their outputs whole as with `keepStepData`.
    #[serde(
        rename = "pruneStateAfter",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prune_state_after: Option<u32>,
}

impl Settings {
    fn is_empty(&self) -> bool {
        self.retry.is_none()
            && self.run_timeout.is_none()
            && !self.keep_step_data
            && self.limits.is_empty()
            && !self.compensate_on_failure
            && self.prune_state_after.is_none()
    }

    /// Whether every step of the automation's runs is stored with its
    /// whole input and output: `keepStepData`, or `pruneStateAfter` (a
    /// pruned output is read back from its step row).
    pub fn keeps_step_data(&self) -> bool {
        self.keep_step_data || self.prune_state_after.is_some()
    }
}

/// `settings.limits`; an absent limit is no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// `maxSteps`: the most steps the automation's tree may hold, below
    /// the platform's [`crate::limits::MAX_STEPS`] (checked at save).
    #[serde(rename = "maxSteps", default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// `maxActions`: the most steps one run may execute, loop iterations
    /// included, below the platform's [`crate::limits::MAX_ACTIONS`]; a run
    /// that would execute one more fails with `action_limit_exceeded`.
    #[serde(
        rename = "maxActions",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_actions: Option<u32>,
    /// `maxStateBytes`: the most bytes a run's context may hold, below the
    /// platform's [`crate::limits::MAX_STATE_BYTES`]; the step whose
    /// outputs would pass it fails with `state_too_large`.
    #[serde(
        rename = "maxStateBytes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_state_bytes: Option<u64>,
}

impl Limits {
    fn is_empty(&self) -> bool {
        self.starts_per_minute.is_none()
            && self.max_steps.is_none()
            && self.max_actions.is_none()
            && self.max_state_bytes.is_none()
    }

    /// The most steps a run of the automation may execute.
    pub fn actions(&self) -> u32 {
        self.max_actions.map_or(crate::limits::MAX_ACTIONS, |n| {
            n.min(crate::limits::MAX_ACTIONS)
        })
    }

    /// The most bytes a run's context may hold.
    pub fn state_bytes(&self) -> usize {
        self.max_state_bytes
            .map_or(crate::limits::MAX_STATE_BYTES, |n| {
                (n.min(crate::limits::MAX_STATE_BYTES as u64)) as usize
            })
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
#[serde(deny_unknown_fields)]
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

    const NEW_ORDER_EXAMPLE: &str = r#"{
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
    fn reads_the_new_order_example() {
        let a = Automation::from_json(NEW_ORDER_EXAMPLE).unwrap();
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
        let a = Automation::from_json(NEW_ORDER_EXAMPLE).unwrap();
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
    fn unknown_step_field_is_rejected_with_its_path_and_position() {
        let json = r#"{"name":"x","trigger":{"kind":"manual"},"steps":[
            {"id":"a","type":"condition","thne":[]}]}"#;
        let err = Automation::from_json(json).unwrap_err();
        let DefinitionError::Json {
            path,
            message,
            line,
            column,
        } = &err;
        assert_eq!(path, "steps.0.thne");
        assert!(
            message.starts_with("unknown field `thne`, expected one of `id`"),
            "{message}"
        );
        assert!(!message.contains(" at line "), "{message}");
        assert_eq!(*line, 2);
        assert!(*column > 0);
        assert!(
            err.to_string()
                .starts_with("invalid automation definition at line 2, column 47: steps.0.thne: unknown field `thne`"),
            "{err}"
        );
    }

    /// The path and message of what `definition` is refused for.
    fn refused(definition: Value) -> (String, String) {
        match Automation::from_json(&definition.to_string()) {
            Ok(a) => panic!("accepted: {a:?}"),
            Err(DefinitionError::Json { path, message, .. }) => (path, message),
        }
    }

    fn manual_with(key: &str, value: Value) -> Value {
        let mut def = json!({"name": "x", "trigger": {"kind": "manual"}, "steps": []});
        def[key] = value;
        def
    }

    #[test]
    fn unknown_fields_are_refused_everywhere_with_their_path() {
        let step = |extra: Value| {
            let mut s = json!({"id": "w", "type": "wait_for_event", "config": {"key": "k"}});
            s.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            manual_with("steps", json!([s]))
        };
        let cases = [
            (
                manual_with("flow", json!({"debounse": {"period": "5m"}})),
                "flow.debounse",
            ),
            (
                manual_with("settings", json!({"timezone": "UTC"})),
                "settings.timezone",
            ),
            (
                manual_with(
                    "settings",
                    json!({"retry": {"max_attempts": 2, "jitter": true}}),
                ),
                "settings.retry.jitter",
            ),
            (
                manual_with("settings", json!({"limits": {"startsPerHour": 2}})),
                "settings.limits.startsPerHour",
            ),
            (
                manual_with("trigger", json!({"kind": "manual", "filtr": {}})),
                "trigger.filtr",
            ),
            (
                manual_with(
                    "trigger",
                    json!({"kind": "webhook", "source": "s", "intervalSec": 60}),
                ),
                "trigger.intervalSec",
            ),
            (
                manual_with("trigger", json!({"kind": "manual", "cron": "* * * * *"})),
                "trigger.cron",
            ),
            (
                manual_with(
                    "trigger",
                    json!({"kind": "schedule", "cron": "* * * * *",
                    "filter": {"rules": [], "mach": "any"}}),
                ),
                "trigger.filter.mach",
            ),
            (
                manual_with(
                    "trigger",
                    json!({"kind": "event", "event": "e",
                    "filter": {"rules": [{"field": "a", "operator": "eq", "value": 1, "vlaue": 2}]}}),
                ),
                "trigger.filter.rules.0.vlaue",
            ),
            (
                step(json!({"escalations": [{"after": "1h", "steps": [], "then": []}]})),
                "steps.0.escalations.0.then",
            ),
            (
                step(json!({"retry": {"max_attempts": 2, "backof": []}})),
                "steps.0.retry.backof",
            ),
            (
                step(json!({"rules": [{"field": "a", "operator": "isEmpty", "op": 1}]})),
                "steps.0.rules.0.op",
            ),
            (
                step(json!({"compensate": [{"id": "u", "type": "flow/log", "confg": {}}]})),
                "steps.0.compensate.0.confg",
            ),
            (
                step(json!({"branches": [[{"id": "b", "type": "flow/log", "tpye": "x"}]]})),
                "steps.0.branches.0.0.tpye",
            ),
        ];
        for (definition, expected) in cases {
            let (path, message) = refused(definition.clone());
            assert_eq!(path, expected, "{message}; {definition}");
            let field = expected.rsplit('.').next().unwrap();
            assert!(
                message.starts_with(&format!("unknown field `{field}`")),
                "{message}"
            );
            assert!(message.contains("expected"), "{message}");
        }
    }

    #[test]
    fn trigger_kinds_are_checked_for_their_own_fields() {
        let (path, message) = refused(manual_with("trigger", json!({"kind": "cronjob"})));
        assert_eq!(path, "trigger.kind");
        assert!(
            message.starts_with("unknown variant `cronjob`"),
            "{message}"
        );
        let (path, message) = refused(manual_with("trigger", json!({"kind": "webhook"})));
        assert_eq!(path, "trigger");
        assert_eq!(
            message,
            "missing field `source` (a `webhook` trigger needs it)"
        );
        let (path, message) = refused(manual_with("trigger", json!({"source": "s"})));
        assert_eq!(path, "trigger");
        assert_eq!(message, "missing field `kind`");
        let (_, message) = refused(manual_with(
            "trigger",
            json!({"kind": "manual", "cron": "x"}),
        ));
        assert_eq!(
            message,
            "unknown field `cron` for a `manual` trigger, expected `filter`"
        );
    }

    #[test]
    fn a_stored_definition_reads_back_whatever_it_holds() {
        let def = Automation {
            name: "n".into(),
            trigger: Trigger::Poll {
                interval_sec: Some(60),
                service: Some("mail".into()),
                filter: Some(Filter {
                    match_: Match::Any,
                    rules: vec![Rule {
                        field: "a".into(),
                        operator: Operator::In,
                        value: json!([1]),
                    }],
                }),
            },
            flow: FlowControl {
                priority: Some(json!("{{_body.tier}}")),
                debounce: Some(Debounce {
                    key: Some("{{_body.customer}}".into()),
                    period: std::time::Duration::from_secs(30),
                    max_wait: None,
                }),
                ..Default::default()
            },
            steps: vec![Step::new("s", "flow/log", json!({"message": "m"}))],
            settings: Settings {
                retry: Some(RetryPolicy {
                    max_attempts: 2,
                    backoff: vec![Duration::from_secs(1)],
                }),
                run_timeout: Some(Duration::from_secs(3600)),
                keep_step_data: true,
                limits: Limits {
                    starts_per_minute: Some(5),
                    max_steps: Some(20),
                    max_actions: Some(200),
                    max_state_bytes: Some(100_000),
                },
                compensate_on_failure: true,
                prune_state_after: Some(5),
            },
        };
        let stored = serde_json::to_value(&def).unwrap();
        assert_eq!(
            serde_json::from_value::<Automation>(stored.clone()).unwrap(),
            def
        );
        assert_eq!(Automation::from_json(&stored.to_string()).unwrap(), def);
    }

    #[test]
    fn a_shape_error_names_where_it_is() {
        let (path, message) = refused(manual_with("steps", json!([{"id": "a", "type": 3}])));
        assert_eq!(path, "steps.0.type");
        assert!(
            message.starts_with("invalid type: integer `3`"),
            "{message}"
        );
        let err = Automation::from_json(r#"{"name":"x","trigger":{"kind":"manual"},"steps":[]} x"#)
            .unwrap_err();
        let DefinitionError::Json { path, message, .. } = err;
        assert_eq!(path, "");
        assert_eq!(message, "trailing characters");
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
}
