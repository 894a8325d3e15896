//! Validation of a definition at save time.
//!
//! [`validate`] runs every check and returns all problems at once, each with
//! the path of the offending part of the definition (`steps.2.then.0.config.url`,
//! `trigger.intervalSec`), so an author can fix a definition in one round trip.
//! What can only be known at run time (whether a template's path will exist,
//! what a loop's items will render to) is checked by the engine and the
//! built-in steps instead.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::advance::{WAIT_FOR_EVENT, is_control};
use crate::condition::{Condition, parse_instant};
use crate::definition::{Automation, Filter, Operator, Rule, Step, Trigger};
use crate::duration::parse_duration;
use crate::limits::{
    MAX_ATTEMPTS_CAP, MAX_DEFINITION_BYTES, MAX_LOOP_ITEMS, MAX_PAUSE_SECS, MAX_STEPS,
};
use crate::retry::RetryPolicy;
use crate::template::{check_value, has_placeholder};

pub use crate::schedule::MIN_POLL_INTERVAL_SECS;

/// One problem in a definition. `path` is empty when the problem concerns the
/// definition as a whole (its size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct ValidationError {
    pub path: String,
    pub message: String,
}

struct Checker<'a> {
    errors: Vec<ValidationError>,
    ids: HashMap<&'a str, String>,
    is_known_type: &'a dyn Fn(&str) -> bool,
}

impl Checker<'_> {
    fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ValidationError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// Checks a definition whose JSON text was `raw_size` bytes. `is_known_type`
/// answers whether a step type other than the built-ins of
/// [`crate::builtin::INTERNAL_TYPES`] is registered (effects, connectors,
/// custom types); the built-ins are always known.
pub fn validate(
    def: &Automation,
    raw_size: usize,
    is_known_type: &dyn Fn(&str) -> bool,
) -> Result<(), Vec<ValidationError>> {
    let mut c = Checker {
        errors: Vec::new(),
        ids: HashMap::new(),
        is_known_type,
    };
    if def.name.trim().is_empty() {
        c.error("name", "the automation needs a name");
    }
    if raw_size > MAX_DEFINITION_BYTES {
        c.error(
            "",
            format!(
                "the definition is {raw_size} bytes; at most {MAX_DEFINITION_BYTES} are allowed"
            ),
        );
    }
    let count = def.step_count();
    if count > MAX_STEPS {
        c.error(
            "steps",
            format!("the tree has {count} steps; at most {MAX_STEPS} are allowed"),
        );
    }
    check_trigger(&mut c, &def.trigger);
    if let Some(retry) = &def.settings.retry {
        check_retry(&mut c, "settings.retry", retry);
    }
    if def.settings.limits.starts_per_minute == Some(0) {
        c.error(
            "settings.limits.startsPerMinute",
            "`startsPerMinute` must be at least 1 (leave it out for no limit)",
        );
    }
    check_steps(&mut c, "steps", &def.steps);
    if c.errors.is_empty() {
        Ok(())
    } else {
        Err(c.errors)
    }
}

fn check_trigger(c: &mut Checker<'_>, trigger: &Trigger) {
    match trigger {
        Trigger::Webhook { source, .. } if source.trim().is_empty() => {
            c.error("trigger.source", "a webhook trigger needs a source id");
        }
        Trigger::Event { event, .. } if event.trim().is_empty() => {
            c.error(
                "trigger.event",
                "an event trigger needs an event name, like `ticket.updated`",
            );
        }
        Trigger::Poll {
            interval_sec: Some(secs),
            ..
        } if *secs < MIN_POLL_INTERVAL_SECS => {
            c.error(
                "trigger.intervalSec",
                format!("the poll interval is {secs} s; the minimum is {MIN_POLL_INTERVAL_SECS} s"),
            );
        }
        Trigger::Schedule { cron, timezone, .. } => {
            if let Err(e) = crate::schedule::CronSchedule::parse(cron, timezone.as_deref()) {
                let at = match e {
                    crate::schedule::ScheduleError::TimeZone { .. } => "trigger.timezone",
                    _ => "trigger.cron",
                };
                c.error(at, e.to_string());
            }
        }
        _ => {}
    }
    if let Some(filter) = trigger.filter() {
        check_filter(c, "trigger.filter", filter);
    }
}

fn check_filter(c: &mut Checker<'_>, at: &str, filter: &Filter) {
    for (i, rule) in filter.rules.iter().enumerate() {
        let base = format!("{at}.rules.{i}");
        check_rule(c, &format!("{base}.field"), &format!("{base}.value"), rule);
    }
}

fn check_rule(c: &mut Checker<'_>, field_at: &str, value_at: &str, rule: &Rule) {
    if rule.field.trim().is_empty() {
        c.error(field_at, "a rule needs a field to look at");
    }
    if rule.operator.is_unary() {
        return;
    }
    if let Err((inner, e)) = check_value(&rule.value) {
        c.error(join(value_at, &inner), e.to_string());
    }
    if rule.operator == Operator::In {
        let ok = match &rule.value {
            Value::Array(_) => true,
            Value::String(s) => has_placeholder(s),
            _ => false,
        };
        if !ok {
            c.error(
                value_at,
                format!(
                    "operator `in` needs an array of allowed values, got {}",
                    rule.value
                ),
            );
        }
    }
}

fn check_retry(c: &mut Checker<'_>, at: &str, retry: &RetryPolicy) {
    if !(1..=MAX_ATTEMPTS_CAP).contains(&retry.max_attempts) {
        c.error(
            format!("{at}.max_attempts"),
            format!(
                "max_attempts is {}; it must be between 1 and {MAX_ATTEMPTS_CAP}",
                retry.max_attempts
            ),
        );
    }
    if retry.max_attempts > 1 && retry.backoff.is_empty() {
        c.error(
            format!("{at}.backoff"),
            "backoff is empty; give at least one wait, like [\"30s\"]",
        );
    }
}

fn join(base: &str, inner: &str) -> String {
    if inner.is_empty() {
        base.to_owned()
    } else {
        format!("{base}.{inner}")
    }
}

fn check_steps<'a>(c: &mut Checker<'a>, at: &str, steps: &'a [Step]) {
    for (i, step) in steps.iter().enumerate() {
        check_step(c, &format!("{at}.{i}"), step);
    }
}

fn check_step<'a>(c: &mut Checker<'a>, at: &str, step: &'a Step) {
    check_id(c, at, step);
    let kind = step.kind.as_str();
    if !is_control(kind) && !(c.is_known_type)(kind) {
        c.error(format!("{at}.type"), format!("unknown step type `{kind}`"));
    }
    match &step.config {
        Value::Null => {}
        Value::Object(_) => {
            if let Err((inner, e)) = check_value(&step.config) {
                c.error(join(&format!("{at}.config"), &inner), e.to_string());
            }
        }
        other => c.error(
            format!("{at}.config"),
            format!("config must be a JSON object, got {other}"),
        ),
    }
    if let Some(retry) = &step.retry {
        check_retry(c, &format!("{at}.retry"), retry);
    }

    if kind == "condition" {
        check_condition(c, at, step);
    } else {
        for (present, key) in [
            (step.match_.is_some(), "match"),
            (step.rules.is_some(), "rules"),
            (step.field_id.is_some(), "fieldId"),
            (step.operator.is_some(), "operator"),
            (step.value.is_some(), "value"),
            (!step.then.is_empty(), "then"),
            (!step.else_.is_empty(), "else"),
        ] {
            if present {
                c.error(
                    format!("{at}.{key}"),
                    format!(
                        "only a condition step can have `{key}`; `{}` is a `{kind}` step",
                        step.id
                    ),
                );
            }
        }
    }
    if kind == "loop" {
        check_loop(c, at, step);
    } else if kind == crate::repeat::REPEAT {
        check_repeat(c, at, step);
    } else if !step.do_.is_empty() {
        c.error(
            format!("{at}.do"),
            format!(
                "only a loop or repeat step can have `do`; `{}` is a `{kind}` step",
                step.id
            ),
        );
    }
    match kind {
        "wait" => check_wait(c, at, step),
        WAIT_FOR_EVENT => check_wait_for_event(c, at, step),
        crate::children::WAIT_FOR_RUNS => check_wait_for_runs(c, at, step),
        "flow/pause" => check_pause(c, at, step),
        "flow/log" => check_log(c, at, step),
        "set" if !step.config.get("values").is_some_and(Value::is_object) => {
            c.error(
                format!("{at}.config.values"),
                "a set step needs `values`: an object of the fields to set",
            );
        }
        _ => {}
    }

    if kind == crate::parallel::PARALLEL {
        if step.branches.is_empty() {
            c.error(
                format!("{at}.branches"),
                "a parallel step needs `branches`: a list of step lists, like [[{…}], [{…}]]",
            );
        }
    } else if !step.branches.is_empty() {
        c.error(
            format!("{at}.branches"),
            format!(
                "only a parallel step can have `branches`; `{}` is a `{kind}` step",
                step.id
            ),
        );
    }
    if kind == "end" && at.contains(".branches.") {
        c.error(
            format!("{at}.type"),
            "an `end` step cannot be inside a parallel branch: it would end the run while \
             the other branches still run; put it after the parallel step",
        );
    }

    check_escalations(c, at, step);
    check_compensation(c, at, step);
    check_steps(c, &format!("{at}.then"), &step.then);
    check_steps(c, &format!("{at}.else"), &step.else_);
    check_steps(c, &format!("{at}.do"), &step.do_);
    for (b, branch) in step.branches.iter().enumerate() {
        check_steps(c, &format!("{at}.branches.{b}"), branch);
    }
}

/// `escalations` only on a step that waits (a timer, a signal, runs, a
/// decision);
/// each level `after` a duration, later than the level before, with steps
/// (no `end`: a side chain does not end the run).
fn check_escalations<'a>(c: &mut Checker<'a>, at: &str, step: &'a Step) {
    if step.escalations.is_empty() {
        return;
    }
    let kind = step.kind.as_str();
    if ![
        crate::builtin::WAIT,
        WAIT_FOR_EVENT,
        crate::children::WAIT_FOR_RUNS,
        crate::approval::APPROVAL,
    ]
    .contains(&kind)
    {
        c.error(
            format!("{at}.escalations"),
            format!(
                "only a wait, wait_for_event, wait_for_runs or approval step can have `escalations`; `{}` is a `{kind}` step",
                step.id
            ),
        );
    }
    let mut previous = None;
    for (l, level) in step.escalations.iter().enumerate() {
        let level_at = format!("{at}.escalations.{l}");
        match crate::duration::parse_duration(&level.after) {
            Ok(after) if previous.is_some_and(|p| after <= p) => c.error(
                format!("{level_at}.after"),
                "each escalation level must come later than the one before it",
            ),
            Ok(after) => previous = Some(after),
            Err(e) => c.error(
                format!("{level_at}.after"),
                format!("`after` must be a duration such as \"4h\": {e}"),
            ),
        }
        if level.steps.is_empty() {
            c.error(
                format!("{level_at}.steps"),
                "an escalation level needs `steps`: what to do when it fires",
            );
        }
        if level.steps.iter().any(|s| s.kind == "end") {
            c.error(
                format!("{level_at}.steps"),
                "an escalation cannot hold an `end` step: it runs beside the wait, not instead of it",
            );
        }
        check_steps(c, &format!("{level_at}.steps"), &level.steps);
    }
}

/// `compensate` on any step, but not on a step of a compensation; inside
/// one, no step that would leave the run waiting on someone (a compensating
/// run cannot be cancelled), no `parallel` (a compensation runs as one
/// chain) and no `end`.
fn check_compensation<'a>(c: &mut Checker<'a>, at: &str, step: &'a Step) {
    let inside = at.contains(".compensate.");
    if !step.compensate.is_empty() {
        if inside {
            c.error(
                format!("{at}.compensate"),
                format!(
                    "step `{}` is itself part of a compensation and cannot have `compensate`:                      what undoes an undo is never run",
                    step.id
                ),
            );
        }
        check_steps(c, &format!("{at}.compensate"), &step.compensate);
    }
    if !inside {
        return;
    }
    let kind = step.kind.as_str();
    let why = match kind {
        "end" => "it would end the run in the middle of undoing it",
        crate::parallel::PARALLEL => {
            "a compensation runs as one chain, the last completed step first"
        }
        WAIT_FOR_EVENT | crate::approval::APPROVAL | crate::children::WAIT_FOR_RUNS => {
            "a compensating run cannot be cancelled, so it must not wait on a signal, a              decision or other runs"
        }
        _ => return,
    };
    c.error(
        format!("{at}.type"),
        format!("a compensation cannot hold a `{kind}` step: {why}"),
    );
}

fn check_id<'a>(c: &mut Checker<'a>, at: &str, step: &'a Step) {
    let id = step.id.as_str();
    let id_at = format!("{at}.id");
    if id.is_empty() {
        c.error(id_at, "a step needs an id");
        return;
    }
    if id.starts_with('_') {
        c.error(
            id_at.clone(),
            format!("step id `{id}` starts with `_`, which is reserved"),
        );
    }
    if !id
        .chars()
        .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
    {
        c.error(
            id_at.clone(),
            format!("step id `{id}` may only contain letters, digits, `_` and `-`"),
        );
    }
    if let Some(first) = c.ids.get(id) {
        let message = format!("step id `{id}` is already used at {first}");
        c.error(id_at, message);
    } else {
        c.ids.insert(id, at.to_owned());
    }
}

fn check_condition(c: &mut Checker<'_>, at: &str, step: &Step) {
    match Condition::from_step(step) {
        Err(message) => c.error(at, message),
        Ok(_) => match &step.rules {
            Some(rules) => {
                for (i, rule) in rules.iter().enumerate() {
                    let base = format!("{at}.rules.{i}");
                    check_rule(c, &format!("{base}.field"), &format!("{base}.value"), rule);
                }
            }
            None => {
                let legacy = Rule {
                    field: step.field_id.clone().unwrap_or_default(),
                    operator: step.operator.unwrap_or(Operator::Eq),
                    value: step.value.clone().unwrap_or(Value::Null),
                };
                check_rule(c, &format!("{at}.fieldId"), &format!("{at}.value"), &legacy);
            }
        },
    }
}

fn check_loop(c: &mut Checker<'_>, at: &str, step: &Step) {
    match step.config.get("items") {
        Some(Value::Array(_)) => {}
        Some(Value::String(s)) if has_placeholder(s) => {}
        Some(other) => c.error(
            format!("{at}.config.items"),
            format!(
                "a loop needs `items` as an array or a template like \"{{{{st_x.items}}}}\", got {other}"
            ),
        ),
        None => c.error(
            format!("{at}.config.items"),
            "a loop needs `items`: an array or a template like \"{{st_x.items}}\"",
        ),
    }
    if let Some(max) = step.config.get("maxItems") {
        let ok = match max {
            Value::String(s) => has_placeholder(s),
            other => other
                .as_u64()
                .is_some_and(|n| n >= 1 && n <= MAX_LOOP_ITEMS as u64),
        };
        if !ok {
            c.error(
                format!("{at}.config.maxItems"),
                format!("maxItems is {max}; it must be a whole number from 1 to {MAX_LOOP_ITEMS}"),
            );
        }
    }
    if step.do_.is_empty() {
        c.error(
            format!("{at}.do"),
            format!(
                "loop `{}` has nothing to do; add at least one step to `do`",
                step.id
            ),
        );
    }
}

/// `wait_for_event`: a key, and where given, `where` rules, a `timeout`
/// duration and a boolean `lookback` (templates are checked when they run).
fn check_wait_for_event(c: &mut Checker<'_>, at: &str, step: &Step) {
    match step.config.get("key") {
        Some(Value::String(k)) if !k.trim().is_empty() => {}
        _ => c.error(
            format!("{at}.config.key"),
            "wait_for_event needs `key`: the signal key to wait for, like \"order-{{orderId}}\"",
        ),
    }
    if let Some(filter) = step.config.get("where")
        && let Err(e) = serde_json::from_value::<crate::definition::Filter>(filter.clone())
    {
        c.error(
                format!("{at}.config.where"),
                format!("{e}; expected {{\"match\": \"all\"|\"any\", \"rules\": [{{\"field\", \"operator\", \"value\"}}]}} over the signal's payload"),
            );
    }
    match step.config.get("timeout") {
        None => {}
        Some(Value::String(s)) if has_placeholder(s) => {}
        Some(Value::String(s)) => {
            if let Err(e) = parse_duration(s) {
                c.error(format!("{at}.config.timeout"), e.to_string());
            }
        }
        Some(other) => c.error(
            format!("{at}.config.timeout"),
            format!("timeout must be a duration like \"3d\", got {other}"),
        ),
    }
    if let Some(lookback) = step.config.get("lookback")
        && !lookback.is_boolean()
    {
        c.error(
            format!("{at}.config.lookback"),
            format!("lookback must be true or false, got {lookback}"),
        );
    }
}

/// `wait_for_runs`: `runs` (a run id or a non-empty list of them), a
/// `mode` of `all` or `any`, a `timeout` duration.
fn check_wait_for_runs(c: &mut Checker<'_>, at: &str, step: &Step) {
    match step.config.get("runs") {
        Some(Value::String(s)) if !s.trim().is_empty() => {}
        Some(Value::Array(items)) if !items.is_empty() => {}
        _ => c.error(
            format!("{at}.config.runs"),
            "wait_for_runs needs `runs`: the run ids to wait for, like [\"{{st_child.runId}}\"]",
        ),
    }
    match step.config.get("mode") {
        None => {}
        Some(Value::String(m)) if m == "all" || m == "any" => {}
        Some(other) => c.error(
            format!("{at}.config.mode"),
            format!("mode must be \"all\" or \"any\", got {other}"),
        ),
    }
    match step.config.get("timeout") {
        None => {}
        Some(Value::String(s)) if has_placeholder(s) => {}
        Some(Value::String(s)) => {
            if let Err(e) = parse_duration(s) {
                c.error(format!("{at}.config.timeout"), e.to_string());
            }
        }
        Some(other) => c.error(
            format!("{at}.config.timeout"),
            format!("timeout must be a duration like \"1h\", got {other}"),
        ),
    }
}

/// `repeat`: steps in `do`, `until` or `while` rules (a repeat with
/// neither could only end at its limit, failing), `maxIterations` from 1 to
/// `MAX_ACTIONS`, an `every` duration.
fn check_repeat(c: &mut Checker<'_>, at: &str, step: &Step) {
    if step.do_.is_empty() {
        c.error(
            format!("{at}.do"),
            "a repeat step needs `do`: the steps to repeat",
        );
    }
    let (until, while_) = (step.config.get("until"), step.config.get("while"));
    if until.is_none() && while_.is_none() {
        c.error(
            format!("{at}.config"),
            "a repeat step needs `until` (rules that end it once they hold) or `while` \
             (rules that keep it going while they hold)",
        );
    }
    for (key, rules) in [("until", until), ("while", while_)] {
        if let Some(rules) = rules
            && let Err(e) = serde_json::from_value::<crate::definition::Filter>(rules.clone())
        {
            c.error(
                format!("{at}.config.{key}"),
                format!("{e}; expected {{\"match\": \"all\"|\"any\", \"rules\": [...]}}"),
            );
        }
    }
    if let Some(max) = step.config.get("maxIterations")
        && !max
            .as_u64()
            .is_some_and(|n| (1..=u64::from(crate::limits::MAX_ACTIONS)).contains(&n))
    {
        c.error(
            format!("{at}.config.maxIterations"),
            format!(
                "maxIterations must be a whole number from 1 to {}, got {max}",
                crate::limits::MAX_ACTIONS
            ),
        );
    }
    match step.config.get("every") {
        None => {}
        Some(Value::String(s)) if has_placeholder(s) => {}
        Some(Value::String(s)) => {
            if let Err(e) = parse_duration(s) {
                c.error(format!("{at}.config.every"), e.to_string());
            }
        }
        Some(other) => c.error(
            format!("{at}.config.every"),
            format!("every must be a duration like \"30s\", got {other}"),
        ),
    }
}

fn check_wait(c: &mut Checker<'_>, at: &str, step: &Step) {
    let duration = step.config.get("duration");
    let until = step.config.get("until");
    match (duration, until) {
        (Some(d), None) => match d {
            Value::String(s) if has_placeholder(s) => {}
            Value::String(s) => {
                if let Err(e) = parse_duration(s) {
                    c.error(format!("{at}.config.duration"), e.to_string());
                }
            }
            other => c.error(
                format!("{at}.config.duration"),
                format!("duration must be a string like \"10m\", got {other}"),
            ),
        },
        (None, Some(u)) => match u {
            Value::String(s) if has_placeholder(s) => {}
            Value::String(s) if parse_instant(s).is_some() => {}
            other => c.error(
                format!("{at}.config.until"),
                format!(
                    "until must be an RFC 3339 time like \"2025-01-31T08:00:00Z\", a date like \"2025-01-31\" or a template, got {other}"
                ),
            ),
        },
        (Some(_), Some(_)) => c.error(
            format!("{at}.config"),
            "a wait takes either `duration` or `until`, not both",
        ),
        (None, None) => c.error(
            format!("{at}.config"),
            "a wait needs `duration` (like \"10m\") or `until` (a time)",
        ),
    }
}

fn check_pause(c: &mut Checker<'_>, at: &str, step: &Step) {
    let seconds = step.config.get("seconds");
    let ok = seconds
        .and_then(Value::as_f64)
        .is_some_and(|s| s > 0.0 && s <= MAX_PAUSE_SECS);
    if !ok {
        let got = seconds.map_or_else(|| "nothing".to_owned(), Value::to_string);
        c.error(
            format!("{at}.config.seconds"),
            format!(
                "flow/pause needs `seconds`, a number above 0 and at most {MAX_PAUSE_SECS}, got {got}"
            ),
        );
    }
}

fn check_log(c: &mut Checker<'_>, at: &str, step: &Step) {
    if let Some(level) = step.config.get("level")
        && !matches!(level.as_str(), Some("info" | "warn" | "error"))
    {
        c.error(
            format!("{at}.config.level"),
            format!("level is {level}; expected \"info\", \"warn\" or \"error\""),
        );
    }
    if step.config.get("message").is_some_and(|m| !m.is_string()) {
        c.error(
            format!("{at}.config.message"),
            "message must be a string (a template)",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn known(kind: &str) -> bool {
        matches!(kind, "http" | "flow/pause" | "ticket/upsert")
    }

    fn errors(def: Value) -> Vec<ValidationError> {
        let def: Automation = serde_json::from_value(def).unwrap();
        match validate(&def, 100, &known) {
            Ok(()) => Vec::new(),
            Err(errors) => errors,
        }
    }

    fn with_steps(steps: &Value) -> Value {
        json!({"name": "n", "trigger": {"kind": "manual"}, "steps": steps})
    }

    fn paths(errors: &[ValidationError]) -> Vec<&str> {
        errors.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn a_good_definition_passes() {
        let def = json!({
            "name": "New order",
            "trigger": {"kind": "webhook", "source": "src_eshop",
                        "filter": {"match": "all", "rules": [{"field": "kind", "operator": "eq", "value": "order.created"}]}},
            "steps": [
                {"id": "st_ticket", "type": "ticket/upsert", "config": {"externalId": "{{orderId}}"}},
                {"id": "st_check", "type": "condition",
                 "rules": [{"field": "st_ticket.created", "operator": "eq", "value": true}],
                 "then": [{"id": "st_log", "type": "flow/log", "config": {"message": "new {{orderId}}", "level": "info"}}]},
                {"id": "st_legacy", "type": "condition", "fieldId": "kind", "operator": "isNotEmpty"},
                {"id": "st_each", "type": "loop", "config": {"items": "{{lines}}", "maxItems": 10},
                 "do": [{"id": "st_set", "type": "set", "config": {"values": {"sku": "{{item.sku}}"}}}]},
                {"id": "st_wait", "type": "wait", "config": {"duration": "10m"}},
                {"id": "st_pause", "type": "flow/pause", "config": {"seconds": 1.5}},
                {"id": "st_end", "type": "end"}
            ],
            "settings": {"retry": {"max_attempts": 3, "backoff": ["1s"]}}
        });
        assert_eq!(errors(def), Vec::new());
    }

    #[test]
    fn collects_every_error_with_its_path() {
        let errs = errors(json!({
            "name": " ",
            "trigger": {"kind": "poll", "intervalSec": 5},
            "steps": [
                {"id": "a", "type": "htp"},
                {"id": "a", "type": "http", "config": {"url": "https://x/{{id"}},
                {"id": "_b", "type": "set", "config": {"values": {}}},
                {"id": "c d", "type": "set", "config": {"values": {}}}
            ]
        }));
        assert_eq!(
            paths(&errs),
            [
                "name",
                "trigger.intervalSec",
                "steps.0.type",
                "steps.1.id",
                "steps.1.config.url",
                "steps.2.id",
                "steps.3.id"
            ]
        );
        assert_eq!(errs[2].message, "unknown step type `htp`");
        assert_eq!(errs[3].message, "step id `a` is already used at steps.0");
        assert_eq!(
            errs[1].to_string(),
            "trigger.intervalSec: the poll interval is 5 s; the minimum is 10 s"
        );
    }

    #[test]
    fn parallel_branches_are_checked_and_counted() {
        let branch = |n: usize, tag: &str| -> Vec<Value> {
            (0..n)
                .map(|i| json!({"id": format!("{tag}{i}"), "type": "flow/log", "config": {"message": "x"}}))
                .collect()
        };
        let errs = errors(with_steps(&json!([
            {"id": "p", "type": "parallel", "branches": [branch(30, "a"), branch(30, "b")]}
        ])));
        assert_eq!(paths(&errs), ["steps"], "{errs:?}");
        assert_eq!(
            errs[0].message,
            "the tree has 61 steps; at most 50 are allowed"
        );

        let errs = errors(with_steps(&json!([
            {"id": "p", "type": "parallel"},
            {"id": "q", "type": "parallel", "branches": [[
                {"id": "stop", "type": "end"},
                {"id": "w", "type": "wait_for_runs", "config": {"runs": [], "mode": "some"}}
            ]]},
            {"id": "s", "type": "set", "config": {"values": {}}, "branches": [[]]}
        ])));
        assert_eq!(
            paths(&errs),
            [
                "steps.0.branches",
                "steps.1.branches.0.0.type",
                "steps.1.branches.0.1.config.runs",
                "steps.1.branches.0.1.config.mode",
                "steps.2.branches"
            ],
            "{errs:?}"
        );
    }

    #[test]
    fn too_many_steps_and_too_many_bytes() {
        let steps: Vec<Value> = (0..61)
            .map(|i| json!({"id": format!("s{i}"), "type": "end"}))
            .collect();
        let def: Automation = serde_json::from_value(with_steps(&json!(steps))).unwrap();
        let errs = validate(&def, MAX_DEFINITION_BYTES + 1, &known).unwrap_err();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].path, "");
        assert!(
            errs[0]
                .message
                .starts_with("the definition is 262145 bytes")
        );
        assert_eq!(errs[0].to_string(), errs[0].message);
        assert_eq!(errs[1].path, "steps");
        assert_eq!(
            errs[1].message,
            "the tree has 61 steps; at most 50 are allowed"
        );
    }

    #[test]
    fn nested_steps_are_counted_and_checked_with_nested_paths() {
        let errs = errors(with_steps(&json!([
            {"id": "c", "type": "condition", "rules": [{"field": "x", "operator": "eq", "value": 1}],
             "else": [{"id": "h", "type": "http", "config": {"headers": {"X": "{{ }}"}}}]},
            {"id": "l", "type": "loop", "config": {"items": [1]},
             "do": [{"id": "c", "type": "http"}]}
        ])));
        assert_eq!(
            paths(&errs),
            ["steps.0.else.0.config.headers.X", "steps.1.do.0.id"]
        );
    }

    #[test]
    fn branches_only_where_they_belong() {
        let errs = errors(with_steps(&json!([
            {"id": "h", "type": "http", "then": [{"id": "x", "type": "end"}], "fieldId": "a"},
            {"id": "s", "type": "set", "config": {"values": {}}, "do": [{"id": "y", "type": "end"}]}
        ])));
        assert_eq!(
            paths(&errs),
            ["steps.0.fieldId", "steps.0.then", "steps.1.do"]
        );
        assert_eq!(
            errs[1].message,
            "only a condition step can have `then`; `h` is a `http` step"
        );
    }

    #[test]
    fn escalations_only_on_waits_in_order_with_steps() {
        let log = json!({"id": "l", "type": "flow/log", "config": {"message": "late"}});
        let errs = errors(with_steps(&json!([
            {"id": "w", "type": "wait_for_event", "config": {"key": "k"}, "escalations": [
                {"after": "10m", "steps": [log]},
                {"after": "5m", "steps": [{"id": "e", "type": "end"}]},
                {"after": "soon", "steps": []}
            ]},
            {"id": "s", "type": "set", "config": {"values": {}},
             "escalations": [{"after": "1h", "steps": [{"id": "m", "type": "flow/log", "config": {"message": "x"}}]}]}
        ])));
        assert_eq!(
            paths(&errs),
            [
                "steps.0.escalations.1.after",
                "steps.0.escalations.1.steps",
                "steps.0.escalations.2.after",
                "steps.0.escalations.2.steps",
                "steps.1.escalations"
            ],
            "{errs:?}"
        );
    }

    #[test]
    fn compensations_are_checked_counted_and_kept_to_one_chain() {
        let undo = json!({"id": "u", "type": "flow/log", "config": {"message": "undo"}});
        let errs = errors(with_steps(&json!([
            {"id": "a", "type": "flow/log", "config": {"message": "x"}, "compensate": [
                undo,
                {"id": "u2", "type": "nope"},
                {"id": "u3", "type": "flow/log", "config": {"message": "y"},
                 "compensate": [{"id": "u4", "type": "flow/log", "config": {"message": "z"}}]},
                {"id": "u5", "type": "wait_for_event", "config": {"key": "k"}},
                {"id": "u6", "type": "parallel", "branches": [[]]},
                {"id": "u7", "type": "end"}
            ]},
            {"id": "l", "type": "loop", "config": {"items": "{{list}}"}, "do": [
                {"id": "b", "type": "flow/log", "config": {"message": "x"},
                 "compensate": [{"id": "a", "type": "flow/log", "config": {"message": "again"}}]}
            ]}
        ])));
        assert_eq!(
            paths(&errs),
            [
                "steps.0.compensate.1.type",
                "steps.0.compensate.2.compensate",
                "steps.0.compensate.3.type",
                "steps.0.compensate.4.type",
                "steps.0.compensate.5.type",
                "steps.1.do.0.compensate.0.id"
            ],
            "{errs:#?}"
        );
        let nested = &errs[1].message;
        assert!(nested.contains("`u3`") && nested.contains("cannot have `compensate`"));
        assert!(errs[2].message.contains("cannot be cancelled"), "{errs:#?}");
        assert!(
            errs[5].message.contains("already used at steps.0"),
            "{errs:#?}"
        );

        // Compensation steps count toward MAX_STEPS.
        let many: Vec<Value> = (0..MAX_STEPS)
            .map(|i| json!({"id": format!("u{i}"), "type": "flow/log", "config": {"message": "x"}}))
            .collect();
        let errs = errors(with_steps(&json!([
            {"id": "a", "type": "flow/log", "config": {"message": "x"}, "compensate": many}
        ])));
        assert_eq!(paths(&errs), ["steps"], "{errs:#?}");
        assert!(
            errs[0]
                .message
                .contains(&format!("{} steps", MAX_STEPS + 1))
        );
    }

    #[test]
    fn condition_and_loop_requirements() {
        let errs = errors(with_steps(&json!([
            {"id": "c1", "type": "condition"},
            {"id": "c2", "type": "condition", "rules": [{"field": "", "operator": "in", "value": 3}]},
            {"id": "l1", "type": "loop"},
            {"id": "l2", "type": "loop", "config": {"items": "plain", "maxItems": 5000}, "do": [{"id": "e", "type": "end"}]}
        ])));
        assert_eq!(
            paths(&errs),
            [
                "steps.0",
                "steps.1.rules.0.field",
                "steps.1.rules.0.value",
                "steps.2.config.items",
                "steps.2.do",
                "steps.3.config.items",
                "steps.3.config.maxItems"
            ]
        );
        assert!(
            errs[0].message.contains("has no rules"),
            "{}",
            errs[0].message
        );
    }

    #[test]
    fn wait_pause_log_and_set_configs() {
        let errs = errors(with_steps(&json!([
            {"id": "w1", "type": "wait", "config": {"duration": "ten minutes"}},
            {"id": "w2", "type": "wait"},
            {"id": "w3", "type": "wait", "config": {"until": "{{due}}"}},
            {"id": "w4", "type": "wait", "config": {"until": "next week"}},
            {"id": "p1", "type": "flow/pause", "config": {"seconds": 61}},
            {"id": "p2", "type": "flow/pause", "config": {"seconds": 0}},
            {"id": "g", "type": "flow/log", "config": {"message": "m", "level": "debug"}},
            {"id": "s", "type": "set", "config": {"values": [1]}}
        ])));
        assert_eq!(
            paths(&errs),
            [
                "steps.0.config.duration",
                "steps.1.config",
                "steps.3.config.until",
                "steps.4.config.seconds",
                "steps.5.config.seconds",
                "steps.6.config.level",
                "steps.7.config.values"
            ]
        );
        assert!(errs[0].message.contains("`ten minutes`"));
    }

    #[test]
    fn retry_trigger_and_filter_checks() {
        let errs = errors(json!({
            "name": "n",
            "trigger": {"kind": "schedule", "cron": "0 8 * *",
                        "filter": {"rules": [{"field": "a", "operator": "eq", "value": "{{b"}]}},
            "steps": [{"id": "h", "type": "http", "retry": {"max_attempts": 11}}],
            "settings": {"retry": {"max_attempts": 3, "backoff": []}}
        }));
        assert_eq!(
            paths(&errs),
            [
                "trigger.cron",
                "trigger.filter.rules.0.value",
                "settings.retry.backoff",
                "steps.0.retry.max_attempts"
            ]
        );
        assert!(errs[0].message.contains("has 4 fields"));
        assert!(errors(json!({"name": "n", "trigger": {"kind": "schedule", "cron": "0 0 8 * * 1-5"}, "steps": []})).is_empty());
        let errs = errors(json!({"name": "n", "trigger": {"kind": "schedule",
            "cron": "0 8 * * 1-5", "timezone": "Europe/Praha"}, "steps": []}));
        assert_eq!(paths(&errs), ["trigger.timezone"]);
        assert!(
            errs[0]
                .message
                .contains("`Europe/Praha` is not a known time zone")
        );
        let errs = errors(json!({"name": "n", "trigger": {"kind": "schedule",
            "cron": "61 8 * * *"}, "steps": []}));
        assert_eq!(paths(&errs), ["trigger.cron"]);
        assert!(
            errs[0]
                .message
                .starts_with("cron `61 8 * * *` is not valid"),
            "{}",
            errs[0].message
        );
        assert_eq!(
            paths(&errors(
                json!({"name": "n", "trigger": {"kind": "webhook", "source": ""}, "steps": []})
            )),
            ["trigger.source"]
        );
    }

    #[test]
    fn a_start_limit_is_at_least_one_start_per_minute() {
        let limited = |n: u32| {
            errors(
                json!({"name": "n", "trigger": {"kind": "manual"}, "steps": [],
                "settings": {"limits": {"startsPerMinute": n}}}),
            )
        };
        let errs = limited(0);
        assert_eq!(paths(&errs), ["settings.limits.startsPerMinute"]);
        assert!(
            errs[0].message.contains("at least 1"),
            "{}",
            errs[0].message
        );
        assert!(limited(5).is_empty());
    }
}
