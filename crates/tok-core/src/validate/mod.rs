//! Validation of a definition at save time.
//!
//! [`validate`] runs every check and returns all problems at once, each with
//! the path of the offending part of the definition (`steps.2.then.0.config.url`,
//! `trigger.intervalSec`), so an author can fix a definition in one round trip.
//! What can only be known at run time (whether a template's path will exist,
//! what a loop's items will render to) is checked by the engine and the
//! built-in steps instead.
//!
//! The steps are visited through [`crate::walk::each_step`], every child
//! list included; each step is checked where it stands ([`step`]), its
//! config by its type ([`configs`]) and against the keys its type has
//! ([`keys`]).

mod configs;
mod keys;
mod step;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::definition::{Automation, Filter, Operator, Rule, Trigger};
use crate::limits::{
    MAX_ACTIONS, MAX_ATTEMPTS_CAP, MAX_DEFINITION_BYTES, MAX_STATE_BYTES, MAX_STEPS,
};
use crate::retry::RetryPolicy;
use crate::template::{check_value, has_placeholder};
use crate::walk::each_step;

pub use crate::schedule::MIN_POLL_INTERVAL_SECS;
pub use keys::{control_config_keys, unknown_config_keys};

/// One problem in a definition. `path` is empty when the problem concerns the
/// definition as a whole (its size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct ValidationError {
    pub path: String,
    pub message: String,
}

pub(super) struct Checker<'a> {
    errors: Vec<ValidationError>,
    pub(super) ids: HashMap<&'a str, String>,
    pub(super) is_known_type: &'a dyn Fn(&str) -> bool,
}

impl Checker<'_> {
    pub(super) fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
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
    check_limits(&mut c, &def.settings.limits, count);
    if def.settings.prune_state_after == Some(0) {
        c.error(
            "settings.pruneStateAfter",
            "`pruneStateAfter` must be at least 1: the outputs of that many steps stay in the \
             context (leave it out to keep them all)",
        );
    }
    for (path, message) in crate::start::check(&def.flow) {
        c.error(&path, message);
    }
    for (i, entry) in def.flow.cancel_on.iter().enumerate() {
        if let Some(filter) = &entry.where_ {
            check_filter(&mut c, &format!("flow.cancelOn.{i}.where"), filter);
        }
    }
    each_step(&def.steps, "steps", &mut |at, s| {
        step::check_step(&mut c, at, s)
    });
    if c.errors.is_empty() {
        Ok(())
    } else {
        Err(c.errors)
    }
}

/// An automation's own limits: each at least 1 and at most the platform's,
/// and `maxSteps` held by the tree as saved (`count` steps).
fn check_limits(c: &mut Checker, limits: &crate::definition::Limits, count: usize) {
    let bounded = [
        (
            "maxSteps",
            limits.max_steps.map(u64::from),
            MAX_STEPS as u64,
            "steps in the tree",
        ),
        (
            "maxActions",
            limits.max_actions.map(u64::from),
            u64::from(MAX_ACTIONS),
            "steps one run executes",
        ),
        (
            "maxStateBytes",
            limits.max_state_bytes,
            MAX_STATE_BYTES as u64,
            "bytes of a run's context",
        ),
    ];
    for (key, value, platform, what) in bounded {
        match value {
            Some(0) => c.error(
                format!("settings.limits.{key}"),
                format!("`{key}` must be at least 1 (leave it out for the platform's {platform})"),
            ),
            Some(n) if n > platform => c.error(
                format!("settings.limits.{key}"),
                format!(
                    "`{key}` is {n}; the platform allows at most {platform} {what}, and an \
                     automation may only set a lower limit"
                ),
            ),
            _ => {}
        }
    }
    if let Some(max) = limits.max_steps
        && (1..=MAX_STEPS as u32).contains(&max)
        && count > max as usize
    {
        c.error(
            "steps",
            format!("the tree has {count} steps; its `settings.limits.maxSteps` allows {max}"),
        );
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

pub(super) fn check_rule(c: &mut Checker<'_>, field_at: &str, value_at: &str, rule: &Rule) {
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

pub(super) fn check_retry(c: &mut Checker<'_>, at: &str, retry: &RetryPolicy) {
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

pub(super) fn join(base: &str, inner: &str) -> String {
    if inner.is_empty() {
        base.to_owned()
    } else {
        format!("{base}.{inner}")
    }
}

#[cfg(test)]
mod tests;
