//! What a `wait_for_event` step waits for (README.md, "Waiting for a
//! signal"; docs/workflows.md, "Signals about a ticket: `subject`"): the
//! decider parks a run on the [`SignalWait`] its config describes. A wait
//! with a `subject` is resumed only by signals about that ticket, and a
//! wait without one only by signals about none (the store matches them).
//!
//! A wait may have several keys (`keys`): in `any` mode the first signal
//! on one of them ends it; in `all` mode it ends when a signal has come on
//! every one. Such a wait parks on its keys still missing, and the
//! signals that came so far are kept in the run's context under
//! [`WAITING_KEY`], by the waiting step's path ([`AllWait`]), until it
//! ends. A `wait_for_condition` keeps its deadline there too
//! ([`crate::condition_wait`]).

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Map, Value, json};

use crate::context::Context;
use crate::definition::{Filter, Step};
use crate::duration::parse_duration;
use crate::error::StepError;
use crate::limits::MAX_WAIT_KEYS;
pub use crate::run::CONDITION_KEY;
use crate::run::SignalWait;
use crate::template;

/// The step type that parks a run until a signal or its timeout.
pub const WAIT_FOR_EVENT: &str = "wait_for_event";

/// The `subject` of a wait that means the run's own subject ticket.
pub const RUN_SUBJECT: &str = "ticket";

/// Longest subject (a ticket id) a signal or a wait may name, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 200;

/// Signal keys that begin with this are tok's own: no signal (`POST
/// /api/signals`, `emit`) and no `wait_for_event` may use them.
pub const RESERVED_KEY_PREFIX: &str = "tok:";

/// Where the context keeps what the run's waits need while they wait
/// (several signals: [`AllWait`]; a condition: its deadline), by path.
pub const WAITING_KEY: &str = "_waiting";

/// Whether a signal key is reserved for tok ([`RESERVED_KEY_PREFIX`]).
pub fn is_reserved_key(key: &str) -> bool {
    key.starts_with(RESERVED_KEY_PREFIX)
}

/// Whether a wait for several keys ends with the first signal on one of
/// them or once a signal has come on every one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WaitMode {
    #[default]
    Any,
    All,
}

/// The mode of a `wait_for_event` step: `all` only when its config says
/// so (the mode is no template: validation takes only `"any"` or `"all"`).
pub fn wait_mode(step: &Step) -> WaitMode {
    match step.config.get("mode").and_then(Value::as_str) {
        Some("all") => WaitMode::All,
        _ => WaitMode::Any,
    }
}

/// Whether a `wait_for_event` step waits on a list of keys (`keys`)
/// rather than on one (`key`): its outputs name the key that came.
pub fn has_keys(step: &Step) -> bool {
    step.config.get("keys").is_some()
}

/// What a `wait_for_event` step waits for, from its config rendered against
/// the scope: `key` or `keys` (required, one of them), `mode` (with `keys`:
/// `any`, the default, or `all`), `subject` (a ticket id, or `"ticket"`:
/// the run's subject ticket, `run_subject`), `where` (rules over the
/// signal's payload), `timeout` (a duration) and `lookback` (default
/// true). Returns the rendered config too, for the step's record.
pub fn signal_wait(
    step: &Step,
    scope: &Value,
    run_subject: Option<&str>,
    now: Timestamp,
) -> Result<(SignalWait, Value), StepError> {
    let config = template::render_config(&step.config, scope)
        .map_err(|e| StepError::terminal(format!("step `{}` {e}", step.id)))?;
    let (key, also) = wait_keys(step, &config)?;
    let subject = wait_subject(step, &config, run_subject, false)?;
    let filter = match config.get("where") {
        None | Some(Value::Null) => None,
        Some(raw) => Some(serde_json::from_value::<Filter>(raw.clone()).map_err(|e| {
            StepError::terminal(format!(
                "step `{}` config.where: {e}; expected {{\"match\": \"all\"|\"any\", \"rules\": [...]}}",
                step.id
            ))
        })?),
    };
    let due_at = due_after(step, &config, "timeout", now)?;
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
        also,
        subject,
        filter,
        lookback,
        due_at,
        since: None,
    };
    Ok((wait, config))
}

/// The keys of a rendered `wait_for_event` config: `key`, or the list
/// `keys` (first, further), distinct, none reserved; `mode` only with
/// `keys`.
fn wait_keys(step: &Step, config: &Value) -> Result<(String, Vec<String>), StepError> {
    let id = &step.id;
    let one = |value: &Value| match value {
        Value::String(k) if !k.trim().is_empty() => Some(k.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let keys = match (config.get("key"), config.get("keys")) {
        (Some(_), Some(_)) => {
            return Err(StepError::terminal(format!(
                "step `{id}` has both `config.key` and `config.keys`; wait for one key with \
                 `key` or for several with `keys`"
            )));
        }
        (None, Some(Value::Array(items))) if !items.is_empty() => {
            if items.len() > MAX_WAIT_KEYS {
                return Err(StepError::terminal(format!(
                    "step `{id}` config.keys has {} keys; a wait has at most {MAX_WAIT_KEYS}",
                    items.len()
                )));
            }
            let mut keys: Vec<String> = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let Some(key) = one(item) else {
                    return Err(StepError::terminal(format!(
                        "step `{id}` config.keys.{i} is {item}; each key must be a non-empty string"
                    )));
                };
                if keys.contains(&key) {
                    return Err(StepError::terminal(format!(
                        "step `{id}` config.keys names `{key}` twice; the keys of one wait \
                         must differ"
                    )));
                }
                keys.push(key);
            }
            keys
        }
        (None, Some(other)) => {
            return Err(StepError::terminal(format!(
                "step `{id}` config.keys must be a non-empty list of signal keys, like \
                 [\"paid\", \"packed\"], not {other}"
            )));
        }
        (key, None) => {
            if config.get("mode").is_some() {
                return Err(StepError::terminal(format!(
                    "step `{id}` has `config.mode` without `config.keys`; a mode says how \
                     several keys end the wait"
                )));
            }
            match key.and_then(one) {
                Some(key) => vec![key],
                None => {
                    return Err(StepError::terminal(format!(
                        "step `{id}` needs `config.key`: the signal key to wait for, a \
                         non-empty string (or `config.keys`: a list of them)"
                    )));
                }
            }
        }
    };
    match config.get("mode") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == "any" || m == "all" => {}
        Some(other) => {
            return Err(StepError::terminal(format!(
                "step `{id}` config.mode must be \"any\" or \"all\", not {other}"
            )));
        }
    }
    if let Some(key) = keys.iter().find(|k| is_reserved_key(k)) {
        return Err(StepError::terminal(format!(
            "step `{id}` waits for `{key}`, but keys beginning with `{RESERVED_KEY_PREFIX}` \
             are reserved for tok"
        )));
    }
    let mut keys = keys.into_iter();
    let first = keys.next().unwrap_or_default();
    Ok((first, keys.collect()))
}

/// When a wait that begins at `now` gives up after the duration at
/// `config.<name>`: `None` without one.
pub(crate) fn due_after(
    step: &Step,
    config: &Value,
    name: &str,
    now: Timestamp,
) -> Result<Option<i64>, StepError> {
    Ok(duration_at(step, config, name)?
        .map(|d| now.as_millisecond().saturating_add(d.as_millis() as i64)))
}

/// The duration at `config.<name>`: `None` without one.
pub(crate) fn duration_at(
    step: &Step,
    config: &Value,
    name: &str,
) -> Result<Option<Duration>, StepError> {
    match config.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => parse_duration(s)
            .map(Some)
            .map_err(|e| StepError::terminal(format!("step `{}` config.{name}: {e}", step.id))),
        Some(other) => Err(StepError::terminal(format!(
            "step `{}` config.{name} must be a duration such as \"3d\", not {other}",
            step.id
        ))),
    }
}

/// A wait for every one of several keys, as it stands: what it waits
/// for, the signals that came so far (by key, and in the order they
/// came), when it times out and when it began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllWait {
    pub keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
    pub lookback: bool,
    /// Key → `{signalId, payload, actor?, subject?}`.
    #[serde(default)]
    pub arrived: Map<String, Value>,
    /// The keys that came, in the order they came.
    #[serde(default)]
    pub order: Vec<String>,
    /// Unix ms of the wait's timeout; `None`: for ever.
    pub due_at: Option<i64>,
    /// Unix ms when the wait began.
    pub since: i64,
}

impl AllWait {
    /// The wait `wait` (its timeout included) begins at `now`.
    pub fn begin(wait: &SignalWait, now: i64) -> Self {
        AllWait {
            keys: wait.keys().map(str::to_owned).collect(),
            subject: wait.subject.clone(),
            filter: wait.filter.clone(),
            lookback: wait.lookback,
            arrived: Map::new(),
            order: Vec::new(),
            due_at: wait.due_at,
            since: now,
        }
    }

    /// The keys no signal has come on yet, in the config's order.
    pub fn missing(&self) -> Vec<String> {
        self.keys
            .iter()
            .filter(|k| !self.arrived.contains_key(*k))
            .cloned()
            .collect()
    }

    /// A signal came on `key`: `false` when the wait was not waiting for
    /// it (not one of its keys, or one that came already).
    pub fn arrive(&mut self, key: &str, signal: Value) -> bool {
        if !self.keys.iter().any(|k| k == key) || self.arrived.contains_key(key) {
            return false;
        }
        self.arrived.insert(key.to_owned(), signal);
        self.order.push(key.to_owned());
        true
    }

    /// What the wait parks on while keys are missing: those keys, until
    /// its timeout; without lookback, the signals buffered since it began
    /// still count. `None` when none is missing.
    pub fn remaining(&self) -> Option<SignalWait> {
        let mut missing = self.missing().into_iter();
        let key = missing.next()?;
        Some(SignalWait {
            key,
            also: missing.collect(),
            subject: self.subject.clone(),
            filter: self.filter.clone(),
            lookback: self.lookback,
            due_at: self.due_at,
            since: (!self.lookback).then_some(self.since),
        })
    }
}

/// What a signal that resumed a wait brings to its step's outputs:
/// `{signalId, payload, actor?, subject?}`.
pub fn arrival(
    signal_id: &str,
    payload: Value,
    actor: Option<Value>,
    subject: Option<String>,
) -> Value {
    let mut signal = json!({ "signalId": signal_id, "payload": payload });
    if let Some(actor) = actor {
        signal["actor"] = actor;
    }
    if let Some(subject) = subject {
        signal["subject"] = json!(subject);
    }
    signal
}

/// The entry of the wait at `path` under [`WAITING_KEY`], when there is
/// one of this shape.
pub fn waiting<T: DeserializeOwned>(context: &Context, path: &str) -> Option<T> {
    let entry = context.reserved(WAITING_KEY)?.get(path)?;
    serde_json::from_value(entry.clone()).ok()
}

/// Sets (or, with `None`, removes) the entry of the wait at `path`.
pub fn set_waiting<T: Serialize>(context: &mut Context, path: &str, entry: Option<&T>) {
    let value = entry.and_then(|e| serde_json::to_value(e).ok());
    if value.is_none()
        && context
            .reserved(WAITING_KEY)
            .is_none_or(|all| all.get(path).is_none())
    {
        return;
    }
    let mut all = match context.reserved(WAITING_KEY) {
        Some(Value::Object(map)) => map.clone(),
        _ => Map::new(),
    };
    match value {
        Some(value) => all.insert(path.to_owned(), value),
        None => all.remove(path),
    };
    context.set_reserved(WAITING_KEY, (!all.is_empty()).then_some(Value::Object(all)));
}

/// Removes the entry of the wait at `path`, whatever its shape.
pub fn end_waiting(context: &mut Context, path: &str) {
    set_waiting::<Value>(context, path, None);
}

/// The ticket a wait's signals must be about: none without `subject`
/// (the run's subject ticket with `default_to_run`), the run's subject ticket for `"ticket"` as written in the step (a
/// template that renders to `ticket` names a ticket of that id), else the
/// rendered ticket id.
pub(crate) fn wait_subject(
    step: &Step,
    config: &Value,
    run_subject: Option<&str>,
    default_to_run: bool,
) -> Result<Option<String>, StepError> {
    let subject = match config.get("subject") {
        None | Some(Value::Null) if default_to_run => return Ok(run_subject.map(str::to_owned)),
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
                "step `{}` waits on the run's subject ticket \
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
