//! The built-in step types that need nothing but the scope and the time:
//! `condition`, `loop`, `set`, `flow/log`, `wait` and `end`.
//!
//! The engine hands such a step its scope (see [`crate::flow::scope`]) and the
//! current time, and gets back an [`Outcome`] as data: outputs to publish and
//! log lines, or a time to sleep until. Errors are always terminal: running
//! the same config against the same scope again would fail the same way.

use jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};

use crate::condition::{Condition, parse_instant};
use crate::definition::Step;
use crate::duration::parse_duration;
use crate::error::StepError;
use crate::limits::MAX_LOOP_ITEMS;
use crate::template::{self, Meter};

/// The step types [`evaluate`] handles.
pub const INTERNAL_TYPES: &[&str] = &["condition", "loop", "set", "flow/log", WAIT, "end"];

/// The timer step type.
pub const WAIT: &str = "wait";

/// Whether `kind` is one of [`INTERNAL_TYPES`].
pub fn is_internal(kind: &str) -> bool {
    INTERNAL_TYPES.contains(&kind)
}

/// What a built-in step did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Finished: publish `outputs` under the step's id and continue with
    /// [`crate::flow::next`].
    Done {
        outputs: Map<String, Value>,
        log: Vec<String>,
    },
    /// Sleep: the next job runs at `until`; publish [`Outcome::outputs`]
    /// (`{"until": "<RFC 3339>"}`) when continuing.
    WaitUntil { until: Timestamp, log: Vec<String> },
}

impl Outcome {
    /// The outputs to publish: the values of `Done`, `{"until": …}` for a wait.
    pub fn outputs(&self) -> Map<String, Value> {
        match self {
            Outcome::Done { outputs, .. } => outputs.clone(),
            Outcome::WaitUntil { until, .. } => {
                let mut m = Map::new();
                m.insert("until".to_owned(), Value::String(until.to_string()));
                m
            }
        }
    }

    /// The log lines for the step's record.
    pub fn log(&self) -> &[String] {
        match self {
            Outcome::Done { log, .. } | Outcome::WaitUntil { log, .. } => log,
        }
    }
}

/// Runs a built-in step against its scope at time `now`. Any kind outside
/// [`INTERNAL_TYPES`] is a terminal error: the caller routed it wrongly.
pub fn evaluate(step: &Step, scope: &Value, now: Timestamp) -> Result<Outcome, StepError> {
    match step.kind.as_str() {
        "condition" => condition(step, scope),
        "loop" => loop_(step, scope),
        "set" => set(step, scope),
        "flow/log" => log(step, scope),
        "wait" => wait(step, scope, now),
        "end" => end(step, scope),
        other => Err(StepError::terminal(format!(
            "step `{}` has type `{other}`, which is not a built-in step",
            step.id
        ))),
    }
}

/// `end`: completes the run; `config.output` (rendered) becomes the run's
/// output, which a parent waiting on the run receives.
fn end(step: &Step, scope: &Value) -> Result<Outcome, StepError> {
    let mut outputs = Map::new();
    if let Some(output) = rendered(step, "output", scope)? {
        outputs.insert("output".to_owned(), output);
    }
    Ok(done(outputs, vec!["End".to_owned()]))
}

fn done(outputs: Map<String, Value>, log: Vec<String>) -> Outcome {
    Outcome::Done { outputs, log }
}

/// Renders `config.<key>` within a step's budgets ([`Meter::config`]), or
/// `None` when the key is absent.
fn rendered(step: &Step, key: &str, scope: &Value) -> Result<Option<Value>, StepError> {
    rendered_within(step, key, scope, &mut Meter::config())
}

/// Renders `config.<key>` within what `meter` has left; an error names the
/// step and the string's path (`step `x` config.values.note: …`).
fn rendered_within(
    step: &Step,
    key: &str,
    scope: &Value,
    meter: &mut Meter,
) -> Result<Option<Value>, StepError> {
    match step.config.get(key) {
        None => Ok(None),
        Some(raw) => template::render_value_in(raw, scope, &format!("config.{key}"), meter)
            .map(Some)
            .map_err(|e| StepError::terminal(format!("step `{}` {e}", step.id))),
    }
}

/// JSON type name with an article, for messages.
fn describe(v: &Value) -> String {
    let mut text = v.to_string();
    if text.len() > 80 {
        let cut = (0..=80)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    format!("{} ({text})", json_kind(v))
}

/// What a JSON value is, as an error says it: `an array`, `null`.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn condition(step: &Step, scope: &Value) -> Result<Outcome, StepError> {
    let condition = Condition::from_step(step).map_err(StepError::Terminal)?;
    let evaluation = condition.evaluate(scope);
    let mut log = evaluation.lines;
    let branch = if evaluation.result { "then" } else { "else" };
    log.push(format!("Condition: {} → {branch}", evaluation.result));
    let mut outputs = Map::new();
    outputs.insert("result".to_owned(), Value::Bool(evaluation.result));
    Ok(done(outputs, log))
}

fn loop_(step: &Step, scope: &Value) -> Result<Outcome, StepError> {
    let items = rendered(step, "items", scope)?.ok_or_else(|| {
        StepError::terminal(format!(
            "loop `{}` has no config.items; give an array or a template like `{{{{st_x.items}}}}`",
            step.id
        ))
    })?;
    let Value::Array(items) = items else {
        return Err(StepError::terminal(format!(
            "loop `{}` needs config.items to be an array, but got {}",
            step.id,
            describe(&items)
        )));
    };
    let limit = match rendered(step, "maxItems", scope)? {
        None => MAX_LOOP_ITEMS,
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .and_then(|n| usize::try_from(n).ok())
            .map(|n| n.min(MAX_LOOP_ITEMS))
            .ok_or_else(|| {
                StepError::terminal(format!(
                    "loop `{}` needs config.maxItems to be a non-negative integer, but got {}",
                    step.id,
                    describe(&v)
                ))
            })?,
    };
    if items.len() > limit {
        return Err(StepError::terminal(format!(
            "loop `{}` got {} items, more than its limit of {limit}",
            step.id,
            items.len()
        )));
    }
    let count = items.len();
    let mut outputs = Map::new();
    outputs.insert("count".to_owned(), json!(count));
    outputs.insert("items".to_owned(), Value::Array(items));
    Ok(done(outputs, vec![format!("Loop over {count} items")]))
}

fn set(step: &Step, scope: &Value) -> Result<Outcome, StepError> {
    match rendered(step, "values", scope)? {
        Some(Value::Object(values)) => {
            let keys: Vec<&str> = values.keys().map(String::as_str).collect();
            let line = format!("Set {}", keys.join(", "));
            Ok(done(values, vec![line]))
        }
        Some(other) => Err(StepError::terminal(format!(
            "step `{}` needs config.values to be an object, but got {}",
            step.id,
            describe(&other)
        ))),
        None => Err(StepError::terminal(format!(
            "step `{}` has no config.values; give an object of the fields to set",
            step.id
        ))),
    }
}

/// `flow/log`: one line, `<level>: <message>`. The message renders within
/// a log line's budget ([`Meter::log_line`]): past it the step fails,
/// naming `config.message`, rather than log a part of it.
fn log(step: &Step, scope: &Value) -> Result<Outcome, StepError> {
    let message = match rendered_within(step, "message", scope, &mut Meter::log_line())? {
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let level = match step.config.get("level") {
        None => "info",
        Some(Value::String(l)) if matches!(l.as_str(), "info" | "warn" | "error") => l.as_str(),
        Some(other) => {
            return Err(StepError::terminal(format!(
                "step `{}` has config.level {other}; expected \"info\", \"warn\" or \"error\"",
                step.id
            )));
        }
    };
    Ok(done(Map::new(), vec![format!("{level}: {message}")]))
}

fn wait(step: &Step, scope: &Value, now: Timestamp) -> Result<Outcome, StepError> {
    let duration = rendered(step, "duration", scope)?;
    let until = rendered(step, "until", scope)?;
    let until = match (duration, until) {
        (Some(Value::String(text)), None) => {
            let d = parse_duration(&text)
                .map_err(|e| StepError::terminal(format!("step `{}` config.duration: {e}", step.id)))?;
            SignedDuration::try_from(d)
                .ok()
                .and_then(|d| now.checked_add(d).ok())
                .ok_or_else(|| {
                    StepError::terminal(format!(
                        "step `{}` config.duration `{text}` reaches past the largest supported time",
                        step.id
                    ))
                })?
        }
        (None, Some(Value::String(text))) => parse_instant(&text).ok_or_else(|| {
            StepError::terminal(format!(
                "step `{}` config.until is `{text}`, which is not an RFC 3339 time like `2025-01-31T08:00:00Z` or a date like `2025-01-31`",
                step.id
            ))
        })?,
        (Some(other), None) => {
            return Err(StepError::terminal(format!(
                "step `{}` needs config.duration to be a string like \"10m\", but got {}",
                step.id,
                describe(&other)
            )));
        }
        (None, Some(other)) => {
            return Err(StepError::terminal(format!(
                "step `{}` needs config.until to be a time string, but got {}",
                step.id,
                describe(&other)
            )));
        }
        (Some(_), Some(_)) | (None, None) => {
            return Err(StepError::terminal(format!(
                "wait `{}` needs exactly one of config.duration or config.until",
                step.id
            )));
        }
    };
    Ok(Outcome::WaitUntil {
        until,
        log: vec![format!("Wait until {until}")],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    fn run(kind: &str, config: Value, scope: &Value) -> Result<Outcome, StepError> {
        evaluate(&Step::new("st_x", kind, config), scope, now())
    }

    fn outputs(outcome: &Outcome) -> Value {
        Value::Object(outcome.outputs())
    }

    #[test]
    fn condition_outputs_result_and_logs_the_branch() {
        let mut step = Step::new("st_c", "condition", Value::Null);
        step.rules = Some(vec![crate::definition::Rule {
            field: "total".into(),
            operator: crate::definition::Operator::Gt,
            value: json!(100),
        }]);
        let out = evaluate(&step, &json!({"total": 250}), now()).unwrap();
        assert_eq!(outputs(&out), json!({"result": true}));
        assert_eq!(
            out.log(),
            [
                "Condition: total gt 100 | total = 250, compared with 100",
                "Condition: true → then"
            ]
        );
        let out = evaluate(&step, &json!({}), now()).unwrap();
        assert_eq!(outputs(&out), json!({"result": false}));
        assert_eq!(out.log().last().unwrap(), "Condition: false → else");
        let no_rules = Step::new("st_c", "condition", Value::Null);
        assert!(
            !evaluate(&no_rules, &json!({}), now())
                .unwrap_err()
                .is_retryable()
        );
    }

    #[test]
    fn loop_renders_items_and_enforces_limits() {
        let scope = json!({"lines": [1, 2, 3], "name": "x"});
        let out = run("loop", json!({"items": "{{lines}}"}), &scope).unwrap();
        assert_eq!(outputs(&out), json!({"count": 3, "items": [1, 2, 3]}));
        let out = run("loop", json!({"items": ["{{name}}", 2]}), &scope).unwrap();
        assert_eq!(outputs(&out), json!({"count": 2, "items": ["x", 2]}));

        let err = run("loop", json!({"items": "{{name}}"}), &scope).unwrap_err();
        assert_eq!(
            err.message(),
            "loop `st_x` needs config.items to be an array, but got a string (\"x\")"
        );
        let err = run("loop", json!({"items": "{{lines}}", "maxItems": 2}), &scope).unwrap_err();
        assert_eq!(
            err.message(),
            "loop `st_x` got 3 items, more than its limit of 2"
        );
        let many = json!({ "big": vec![0; 1200] });
        let err = run("loop", json!({"items": "{{big}}", "maxItems": 5000}), &many).unwrap_err();
        assert_eq!(
            err.message(),
            "loop `st_x` got 1200 items, more than its limit of 1000"
        );
        let err = run("loop", json!({"items": "{{nope}}"}), &scope).unwrap_err();
        assert_eq!(
            err.message(),
            "step `st_x` config.items: template refers to `nope`, which is not in the context"
        );
        assert!(!err.is_retryable());
    }

    #[test]
    fn set_publishes_rendered_values() {
        let out = run(
            "set",
            json!({"values": {"greeting": "hi {{name}}", "n": "{{n}}"}}),
            &json!({"name": "Eva", "n": 4}),
        )
        .unwrap();
        assert_eq!(outputs(&out), json!({"greeting": "hi Eva", "n": 4}));
        assert!(run("set", json!({"values": [1]}), &json!({})).is_err());
        assert!(run("set", Value::Null, &json!({})).is_err());
    }

    #[test]
    fn flow_log_formats_level_and_message() {
        let out = run(
            "flow/log",
            json!({"message": "order {{id}}", "level": "warn"}),
            &json!({"id": 7}),
        )
        .unwrap();
        assert_eq!(out.log(), ["warn: order 7"]);
        assert_eq!(outputs(&out), json!({}));
        let out = run("flow/log", json!({"message": "hello"}), &json!({})).unwrap();
        assert_eq!(out.log(), ["info: hello"]);
        assert!(
            run(
                "flow/log",
                json!({"message": "x", "level": "debug"}),
                &json!({})
            )
            .is_err()
        );
    }

    #[test]
    fn wait_for_a_duration_or_until_a_time() {
        let out = run("wait", json!({"duration": "10m"}), &json!({})).unwrap();
        assert_eq!(
            out,
            Outcome::WaitUntil {
                until: "2025-01-01T12:10:00Z".parse().unwrap(),
                log: vec!["Wait until 2025-01-01T12:10:00Z".into()]
            }
        );
        assert_eq!(outputs(&out), json!({"until": "2025-01-01T12:10:00Z"}));
        let out = run(
            "wait",
            json!({"until": "{{due}}"}),
            &json!({"due": "2025-02-01T08:00:00+01:00"}),
        )
        .unwrap();
        assert_eq!(outputs(&out), json!({"until": "2025-02-01T07:00:00Z"}));
        assert!(run("wait", json!({}), &json!({})).is_err());
        assert!(
            run(
                "wait",
                json!({"duration": "1m", "until": "2025-01-02"}),
                &json!({})
            )
            .is_err()
        );
        let err = run("wait", json!({"duration": "soon"}), &json!({})).unwrap_err();
        assert!(err.message().contains("`soon`"), "{err}");
        assert!(run("wait", json!({"until": "tomorrow"}), &json!({})).is_err());
    }

    #[test]
    fn end_and_unknown_kinds() {
        let out = run("end", Value::Null, &json!({})).unwrap();
        assert_eq!(
            out,
            Outcome::Done {
                outputs: Map::new(),
                log: vec!["End".into()]
            }
        );
        let err = run("http", Value::Null, &json!({})).unwrap_err();
        assert_eq!(
            err,
            StepError::terminal("step `st_x` has type `http`, which is not a built-in step")
        );
        assert!(is_internal("flow/log") && !is_internal("flow/pause"));
    }
}
