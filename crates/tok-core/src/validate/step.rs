//! The checks of one step where it stands in its tree: its id, its type,
//! which fields its type may have, and what its place allows (no `end` in a
//! parallel branch, no waiting inside a compensation). The walker brings
//! every step here with its path; nothing here descends into child lists.

use serde_json::Value;

use super::{Checker, check_retry, check_rule, configs, join};
use crate::condition::Condition;
use crate::control::is_control;
use crate::definition::{Operator, Rule, Step};
use crate::template::check_value;
use crate::waits::WAIT_FOR_EVENT;

/// Every check of the step at `at` (`steps.2.then.0`) that needs only the
/// step and its path; the ids seen so far are in `c`.
pub(super) fn check_step<'a>(c: &mut Checker<'a>, at: &str, step: &'a Step) {
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
    if let Some(keys) = super::control_config_keys(kind) {
        c.errors
            .extend(super::unknown_config_keys(at, kind, &step.config, keys));
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
        configs::check_loop(c, at, step);
    } else if kind == crate::repeat::REPEAT {
        configs::check_repeat(c, at, step);
    } else if kind == crate::for_each::FOR_EACH {
        configs::check_for_each(c, at, step);
    } else if !step.do_.is_empty() {
        c.error(
            format!("{at}.do"),
            format!(
                "only a loop, repeat or for_each step can have `do`; `{}` is a `{kind}` step",
                step.id
            ),
        );
    }
    match kind {
        "wait" => configs::check_wait(c, at, step),
        WAIT_FOR_EVENT => configs::check_wait_for_event(c, at, step),
        crate::condition_wait::WAIT_FOR_CONDITION => configs::check_wait_for_condition(c, at, step),
        crate::children::WAIT_FOR_RUNS => configs::check_wait_for_runs(c, at, step),
        "flow/pause" => configs::check_pause(c, at, step),
        "flow/log" => configs::check_log(c, at, step),
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
}

/// `escalations` only on a step that waits (a timer, a signal, runs, a
/// decision, or a registered type whose handler may wait: the engine
/// refuses its own types that never wait); each level `after` a duration,
/// later than the level before, with steps (no `end`: a side chain does
/// not end the run).
fn check_escalations(c: &mut Checker<'_>, at: &str, step: &Step) {
    if step.escalations.is_empty() {
        return;
    }
    let kind = step.kind.as_str();
    let waits = [
        crate::builtin::WAIT,
        WAIT_FOR_EVENT,
        crate::children::WAIT_FOR_RUNS,
        crate::approval::APPROVAL,
    ]
    .contains(&kind);
    if !waits && crate::control::is_control(kind) {
        c.error(
            format!("{at}.escalations"),
            crate::escalation::never_waits(step),
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
    }
}

/// `compensate` on any step, but not on a step of a compensation; inside
/// one, no step that would leave the run waiting on someone (a compensating
/// run cannot be cancelled), no `parallel` (a compensation runs as one
/// chain) and no `end`.
fn check_compensation(c: &mut Checker<'_>, at: &str, step: &Step) {
    let inside = at.contains(".compensate.");
    if !step.compensate.is_empty() && inside {
        c.error(
            format!("{at}.compensate"),
            format!(
                "step `{}` is itself part of a compensation and cannot have `compensate`: \
                 what undoes an undo is never run",
                step.id
            ),
        );
    }
    if !inside {
        return;
    }
    let kind = step.kind.as_str();
    let why = match kind {
        "end" => "it would end the run in the middle of undoing it",
        crate::parallel::PARALLEL | crate::for_each::FOR_EACH => {
            "a compensation runs as one chain, the last completed step first"
        }
        WAIT_FOR_EVENT
        | crate::condition_wait::WAIT_FOR_CONDITION
        | crate::approval::APPROVAL
        | crate::children::WAIT_FOR_RUNS => {
            "a compensating run cannot be cancelled, so it must not wait on a signal, a \
             ticket's condition, a decision or other runs"
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
