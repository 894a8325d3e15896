//! The checks of a built-in step's `config` by its type (`loop`,
//! `for_each`, `wait`, `wait_for_event`, `wait_for_condition`,
//! `wait_for_runs`, `repeat`, `flow/pause`, `flow/log`).
//! A template is accepted wherever a value is only known at run time.

use serde_json::Value;

use super::Checker;
use crate::condition::parse_instant;
use crate::definition::Step;
use crate::duration::parse_duration;
use crate::limits::{
    MAX_FOR_EACH_CONCURRENCY, MAX_LOOP_ITEMS, MAX_PAUSE_SECS, MAX_WAIT_KEYS, MIN_CONDITION_EVERY_MS,
};
use crate::template::has_placeholder;

pub(super) fn check_loop(c: &mut Checker<'_>, at: &str, step: &Step) {
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

/// `for_each`: `items` as a loop's, `maxItems` and `concurrency` whole
/// numbers in their ranges (or templates), `complete` `"all"`, `"any"` or
/// `{"atLeast": n}`, and a `do` list without an `end` (it would end the
/// run while other items still run).
pub(super) fn check_for_each(c: &mut Checker<'_>, at: &str, step: &Step) {
    match step.config.get("items") {
        Some(Value::Array(_)) => {}
        Some(Value::String(s)) if has_placeholder(s) => {}
        Some(other) => c.error(
            format!("{at}.config.items"),
            format!(
                "a for_each needs `items` as an array or a template like \"{{{{order.lines}}}}\", got {other}"
            ),
        ),
        None => c.error(
            format!("{at}.config.items"),
            "a for_each needs `items`: an array or a template like \"{{order.lines}}\"",
        ),
    }
    for (key, most) in [
        ("maxItems", MAX_LOOP_ITEMS),
        ("concurrency", MAX_FOR_EACH_CONCURRENCY),
    ] {
        let Some(value) = step.config.get(key) else {
            continue;
        };
        let ok = match value {
            Value::String(s) => has_placeholder(s),
            other => other.as_u64().is_some_and(|n| n >= 1 && n <= most as u64),
        };
        if !ok {
            c.error(
                format!("{at}.config.{key}"),
                format!("{key} is {value}; it must be a whole number from 1 to {most}"),
            );
        }
    }
    if let Err(found) = crate::for_each::complete_of(step.config.get("complete")) {
        c.error(
            format!("{at}.config.complete"),
            format!(
                "complete is {found}; it must be \"all\" (the default), \"any\" or {{\"atLeast\": n}} with n ≥ 1"
            ),
        );
    }
    if step.do_.is_empty() {
        c.error(
            format!("{at}.do"),
            format!(
                "for_each `{}` has nothing to do; add at least one step to `do`",
                step.id
            ),
        );
    }
    fn ends(steps: &[Step], at: &str, found: &mut Vec<String>) {
        for (i, step) in steps.iter().enumerate() {
            let here = format!("{at}.{i}");
            if step.kind == "end" {
                found.push(format!("{here}.type"));
            }
            ends(&step.then, &format!("{here}.then"), found);
            ends(&step.else_, &format!("{here}.else"), found);
            ends(&step.do_, &format!("{here}.do"), found);
            for (b, branch) in step.branches.iter().enumerate() {
                ends(branch, &format!("{here}.branches.{b}"), found);
            }
        }
    }
    let mut found = Vec::new();
    ends(&step.do_, &format!("{at}.do"), &mut found);
    for path in found {
        c.error(
            path,
            "an `end` step cannot be inside a for_each: it would end the run while other \
             items still run; put it after the for_each step",
        );
    }
}

/// `wait_for_event`: a key, or a list of distinct keys with a `mode`
/// (`any` or `all`), and where given, a `subject` string, `where` rules, a
/// `timeout` duration and a boolean `lookback` (templates are checked
/// when they run). No key begins with `tok:`.
pub(super) fn check_wait_for_event(c: &mut Checker<'_>, at: &str, step: &Step) {
    let reserved = |c: &mut Checker<'_>, path: String, key: &str| {
        if crate::waits::is_reserved_key(key) {
            c.error(
                path,
                format!(
                    "signal keys beginning with `{}` are reserved for tok; `{key}` cannot be \
                     waited for",
                    crate::waits::RESERVED_KEY_PREFIX
                ),
            );
        }
    };
    match (step.config.get("key"), step.config.get("keys")) {
        (Some(_), Some(_)) => c.error(
            format!("{at}.config"),
            "wait_for_event takes `key` (one signal key) or `keys` (a list of them), not both",
        ),
        (Some(Value::String(k)), None) if !k.trim().is_empty() => {
            reserved(c, format!("{at}.config.key"), k);
        }
        (None, Some(Value::Array(keys))) if !keys.is_empty() => {
            if keys.len() > MAX_WAIT_KEYS {
                c.error(
                    format!("{at}.config.keys"),
                    format!(
                        "keys lists {} keys; a wait has at most {MAX_WAIT_KEYS}",
                        keys.len()
                    ),
                );
            }
            let mut seen = std::collections::HashSet::new();
            for (i, key) in keys.iter().enumerate() {
                let key_at = format!("{at}.config.keys.{i}");
                match key {
                    Value::String(k) if !k.trim().is_empty() => {
                        if !seen.insert(k.as_str()) {
                            c.error(
                                key_at,
                                format!("`{k}` is listed twice; the keys of one wait must differ"),
                            );
                        } else {
                            reserved(c, key_at, k);
                        }
                    }
                    other => c.error(
                        key_at,
                        format!("each key must be a non-empty string (a template), got {other}"),
                    ),
                }
            }
        }
        (None, Some(other)) => c.error(
            format!("{at}.config.keys"),
            format!(
                "keys must be a non-empty list of signal keys, like [\"paid-{{{{orderId}}}}\", \
                 \"packed-{{{{orderId}}}}\"], got {other}"
            ),
        ),
        _ => c.error(
            format!("{at}.config.key"),
            "wait_for_event needs `key`: the signal key to wait for, like \"order-{{orderId}}\" \
             (or `keys`: a list of them, with `mode` \"any\" or \"all\")",
        ),
    }
    match step.config.get("mode") {
        None => {}
        Some(_) if step.config.get("keys").is_none() => c.error(
            format!("{at}.config.mode"),
            "mode goes with `keys`: it says whether any one of them or all of them end the \
             wait; a wait on one `key` has no mode",
        ),
        Some(Value::String(m)) if m == "all" || m == "any" => {}
        Some(other) => c.error(
            format!("{at}.config.mode"),
            format!("mode must be \"any\" (the first signal ends the wait) or \"all\" (one on every key), got {other}"),
        ),
    }
    check_subject(c, at, step, "");
    if let Some(filter) = step.config.get("where")
        && let Err(e) = serde_json::from_value::<crate::definition::Filter>(filter.clone())
    {
        c.error(
                format!("{at}.config.where"),
                format!("{e}; expected {{\"match\": \"all\"|\"any\", \"rules\": [{{\"field\", \"operator\", \"value\"}}]}} over the signal's payload"),
            );
    }
    check_duration(c, at, step, "timeout", "3d");
    if let Some(lookback) = step.config.get("lookback")
        && !lookback.is_boolean()
    {
        c.error(
            format!("{at}.config.lookback"),
            format!("lookback must be true or false, got {lookback}"),
        );
    }
}

/// A wait's `subject`, where given: a ticket id (or a template of one), or
/// `"ticket"` for the run's subject ticket (`default` says whether that is
/// the default).
fn check_subject(c: &mut Checker<'_>, at: &str, step: &Step, default: &str) {
    match step.config.get("subject") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if !s.trim().is_empty() => {}
        Some(other) => c.error(
            format!("{at}.config.subject"),
            format!(
                "subject must be a ticket id (a template such as \"{{{{order.ticketId}}}}\") or \
                 \"ticket\" for the run's subject ticket{default}, got {other}"
            ),
        ),
    }
}

/// `wait_for_condition`: `rules` (a non-empty list of rules over the
/// ticket) with an optional `match`, and where given a `subject` string,
/// an `every` duration (at least [`MIN_CONDITION_EVERY_MS`]) and a
/// `timeout` duration.
pub(super) fn check_wait_for_condition(c: &mut Checker<'_>, at: &str, step: &Step) {
    if let Err(e) = crate::condition_wait::rules_of(&step.config) {
        let key = match e.starts_with("config.match") {
            true => "match",
            false => "rules",
        };
        c.error(
            format!("{at}.config.{key}"),
            format!("wait_for_condition {e}"),
        );
    }
    check_subject(c, at, step, " (the default)");
    check_duration(c, at, step, "every", "5m");
    if let Some(Value::String(every)) = step.config.get("every")
        && let Ok(every) = parse_duration(every)
        && (every.as_millis() as i64) < MIN_CONDITION_EVERY_MS
    {
        c.error(
            format!("{at}.config.every"),
            format!(
                "every is {} ms; the rules are checked at most every {MIN_CONDITION_EVERY_MS} ms \
                 (and on every change of the ticket)",
                every.as_millis()
            ),
        );
    }
    check_duration(c, at, step, "timeout", "3d");
}

/// `wait_for_runs`: `runs` (a run id or a non-empty list of them), a
/// `mode` of `all` or `any`, a `timeout` duration.
pub(super) fn check_wait_for_runs(c: &mut Checker<'_>, at: &str, step: &Step) {
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
    check_duration(c, at, step, "timeout", "1h");
}

/// `repeat`: steps in `do`, `until` or `while` rules (a repeat with
/// neither could only end at its limit, failing), `maxIterations` from 1 to
/// `MAX_ACTIONS`, an `every` duration.
pub(super) fn check_repeat(c: &mut Checker<'_>, at: &str, step: &Step) {
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
    check_duration(c, at, step, "every", "30s");
}

pub(super) fn check_wait(c: &mut Checker<'_>, at: &str, step: &Step) {
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

pub(super) fn check_pause(c: &mut Checker<'_>, at: &str, step: &Step) {
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

pub(super) fn check_log(c: &mut Checker<'_>, at: &str, step: &Step) {
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

/// An optional `config.<key>` that is a duration like `example` (`"3d"`)
/// or a template.
fn check_duration(c: &mut Checker<'_>, at: &str, step: &Step, key: &str, example: &str) {
    match step.config.get(key) {
        None => {}
        Some(Value::String(s)) if has_placeholder(s) => {}
        Some(Value::String(s)) => {
            if let Err(e) = parse_duration(s) {
                c.error(format!("{at}.config.{key}"), e.to_string());
            }
        }
        Some(other) => c.error(
            format!("{at}.config.{key}"),
            format!("{key} must be a duration like \"{example}\", got {other}"),
        ),
    }
}
