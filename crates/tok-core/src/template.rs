//! `{{path}}` templates in step configs and rule values.
//!
//! Validation at save calls [`check`] on every config string; the engine calls
//! [`render_config`] on a step's config against the step's scope (see
//! [`crate::flow::scope`]) right before running it. A string that is exactly
//! one placeholder yields the referenced value with its JSON type (so
//! `"{{lines}}"` can pass an array); anything else yields a string.
//!
//! Rendering is bounded while it happens ([`Meter`]): each rendered value may
//! reach [`MAX_RENDERED_VALUE_BYTES`], a step's whole config
//! [`MAX_RENDERED_CONFIG_BYTES`], a log line [`MAX_LOG_LINE_BYTES`]. A lone
//! placeholder's typed value counts as its JSON. Rendering stops as soon as
//! it passes a budget, before anything past it is allocated, with
//! [`TemplateError::TooLarge`]; [`RenderError`] says where in the config.

use serde_json::Value;
use thiserror::Error;

use crate::budget::Capped;
use crate::context::{Lookup, lookup};
use crate::limits::{MAX_LOG_LINE_BYTES, MAX_RENDERED_CONFIG_BYTES, MAX_RENDERED_VALUE_BYTES};

/// A template that cannot be parsed or rendered.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TemplateError {
    #[error("template `{template}` opens `{{{{` at byte {at} but never closes it with `}}}}`")]
    Unclosed { template: String, at: usize },
    #[error(
        "template `{template}` has an empty placeholder `{{{{}}}}`; write a path inside, like `{{{{orderId}}}}`"
    )]
    EmptyPath { template: String },
    #[error(
        "template `{template}` refers to `{path}`, which is not a valid path; expected names and indices separated by dots, like `order.items.0.id`"
    )]
    BadPath { template: String, path: String },
    #[error("template refers to `{path}`, which is not in the context")]
    Missing { path: String },
    /// Rendering passed a budget and was stopped there: `reached` is the
    /// size it had come to (at least; the rest was never rendered).
    #[error(
        "{RENDER_BUDGET_EXCEEDED}: the rendering passed {} bytes, the budget of {}, at {reached} bytes (see docs/security.md, \"Rendering budgets\")",
        .budget.bytes(),
        .budget.what()
    )]
    TooLarge { budget: Budget, reached: usize },
}

/// The code that begins the error of a rendering past its budget.
pub const RENDER_BUDGET_EXCEEDED: &str = "render_budget_exceeded";

/// The byte budgets of rendering (their values and why: [`crate::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// One rendered value: [`MAX_RENDERED_VALUE_BYTES`].
    Value,
    /// A step's whole rendered config: [`MAX_RENDERED_CONFIG_BYTES`].
    Config,
    /// A log line: [`MAX_LOG_LINE_BYTES`].
    LogLine,
}

impl Budget {
    pub fn bytes(self) -> usize {
        match self {
            Budget::Value => MAX_RENDERED_VALUE_BYTES,
            Budget::Config => MAX_RENDERED_CONFIG_BYTES,
            Budget::LogLine => MAX_LOG_LINE_BYTES,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Budget::Value => "one rendered value",
            Budget::Config => "a step's rendered config",
            Budget::LogLine => "a log line",
        }
    }
}

/// What a rendering may still produce: each value within one budget, all
/// of them together within another. One meter goes through every string
/// of a config, so the config's total counts them all.
#[derive(Debug, Clone)]
pub struct Meter {
    value: Budget,
    total: Budget,
    used: usize,
}

impl Meter {
    /// A step's config: each value within [`Budget::Value`], all of them
    /// within [`Budget::Config`].
    pub fn config() -> Self {
        Self {
            value: Budget::Value,
            total: Budget::Config,
            used: 0,
        }
    }

    /// One value alone (a flow key, a priority): within [`Budget::Value`].
    pub fn value() -> Self {
        Self {
            value: Budget::Value,
            total: Budget::Value,
            used: 0,
        }
    }

    /// A log line's message: within [`Budget::LogLine`].
    pub fn log_line() -> Self {
        Self {
            value: Budget::LogLine,
            total: Budget::LogLine,
            used: 0,
        }
    }

    /// Bytes rendered so far.
    pub fn used(&self) -> usize {
        self.used
    }

    /// How many bytes the next value may take, and the error of a value
    /// that came to `reached` bytes past them.
    fn room(&self) -> (usize, impl Fn(usize) -> TemplateError + use<>) {
        let left = self.total.bytes().saturating_sub(self.used);
        let (room, budget, before) = match self.value.bytes() <= left {
            true => (self.value.bytes(), self.value, 0),
            false => (left, self.total, self.used),
        };
        let over = move |reached: usize| TemplateError::TooLarge {
            budget,
            reached: before + reached,
        };
        (room, over)
    }

    /// Counts a literal value of `size` bytes (not a template), or fails
    /// when it does not fit.
    fn take(&mut self, size: usize) -> Result<(), TemplateError> {
        let (room, over) = self.room();
        if size > room {
            return Err(over(size));
        }
        self.used += size;
        Ok(())
    }
}

/// A rendering that failed, and where: `at` is the dot path of the string
/// in the rendered value (`config.message`, `config.values.note`; empty for
/// a value rendered alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderError {
    pub at: String,
    pub error: TemplateError,
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.at.is_empty() {
            true => write!(f, "{}", self.error),
            false => write!(f, "{}: {}", self.at, self.error),
        }
    }
}

impl std::error::Error for RenderError {}

impl RenderError {
    /// Whether rendering stopped at a budget.
    pub fn is_too_large(&self) -> bool {
        matches!(self.error, TemplateError::TooLarge { .. })
    }
}

enum Piece<'a> {
    Text(&'a str),
    Placeholder(&'a str),
}

fn parse(template: &str) -> Result<Vec<Piece<'_>>, TemplateError> {
    let mut pieces = Vec::new();
    let mut rest = template;
    let mut offset = 0;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            pieces.push(Piece::Text(&rest[..open]));
        }
        let inner_start = open + 2;
        let Some(close) = rest[inner_start..].find("}}") else {
            return Err(TemplateError::Unclosed {
                template: template.to_owned(),
                at: offset + open,
            });
        };
        let path = rest[inner_start..inner_start + close].trim();
        if path.is_empty() {
            return Err(TemplateError::EmptyPath {
                template: template.to_owned(),
            });
        }
        let valid = path.split('.').all(|segment| {
            !segment.is_empty()
                && !segment
                    .chars()
                    .any(|c| c.is_whitespace() || c == '{' || c == '}')
        });
        if !valid {
            return Err(TemplateError::BadPath {
                template: template.to_owned(),
                path: path.to_owned(),
            });
        }
        pieces.push(Piece::Placeholder(path));
        let consumed = inner_start + close + 2;
        offset += consumed;
        rest = &rest[consumed..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    Ok(pieces)
}

/// Checks the syntax only: every `{{` is closed and holds a well-formed path.
/// Whether the path will exist at run time cannot be known at save.
pub fn check(template: &str) -> Result<(), TemplateError> {
    parse(template).map(|_| ())
}

/// Whether the string contains a placeholder at all (a literal such as
/// `"10m"` can be checked further at save; a template cannot).
pub fn has_placeholder(template: &str) -> bool {
    template.contains("{{")
}

/// Renders one template against `scope`, within [`Meter::value`].
///
/// Exactly one placeholder and nothing else (whitespace inside the braces is
/// fine) gives the value itself, typed. Otherwise the result is a string with
/// each placeholder replaced: strings as they are, other values as compact
/// JSON. A path that is not in `scope` is an error rather than an empty string,
/// because a silently empty ticket title is worse than a failed step.
pub fn render(template: &str, scope: &Value) -> Result<Value, TemplateError> {
    render_in(template, scope, &mut Meter::value())
}

/// [`render`] within what `meter` has left, which it then counts.
pub fn render_in(template: &str, scope: &Value, meter: &mut Meter) -> Result<Value, TemplateError> {
    let pieces = parse(template)?;
    let resolve = |path: &str| match lookup(scope, path) {
        Lookup::Found(v) => Ok(v),
        Lookup::Missing => Err(TemplateError::Missing {
            path: path.to_owned(),
        }),
    };
    let (room, over) = meter.room();
    if let [Piece::Placeholder(path)] = pieces.as_slice() {
        let v = resolve(path)?;
        let size = match v {
            Value::String(s) if s.len() > room => return Err(over(s.len())),
            Value::String(s) => s.len(),
            other => crate::budget::json_size_within(other, room).map_err(&over)?,
        };
        meter.used += size;
        return Ok(v.clone());
    }
    let mut out: Vec<u8> = Vec::with_capacity(template.len().min(room));
    for piece in pieces {
        let text = match piece {
            Piece::Text(text) => text,
            Piece::Placeholder(path) => match resolve(path)? {
                Value::String(s) => s.as_str(),
                other => {
                    let cap = room - out.len();
                    let before = out.len();
                    Capped::into(&mut out, cap)
                        .json(other)
                        .map_err(|reached| over(before + reached))?;
                    continue;
                }
            },
        };
        if out.len() + text.len() > room {
            return Err(over(out.len() + text.len()));
        }
        out.extend_from_slice(text.as_bytes());
    }
    meter.used += out.len();
    // Only whole strings and whole JSON documents were appended.
    let out = String::from_utf8(out).unwrap_or_else(|e| {
        let valid = e.utf8_error().valid_up_to();
        let mut bytes = e.into_bytes();
        bytes.truncate(valid);
        String::from_utf8(bytes).unwrap_or_default()
    });
    Ok(Value::String(out))
}

/// Renders like [`render`], except that text past `max` bytes is cut (at a
/// character boundary) instead of failing, and never rendered: a lone
/// placeholder's value whose JSON passes `max` gives its JSON cut, as a
/// string. For text that is cut anyway, like a flow key.
pub fn render_cut(template: &str, scope: &Value, max: usize) -> Result<Value, TemplateError> {
    let pieces = parse(template)?;
    let resolve = |path: &str| match lookup(scope, path) {
        Lookup::Found(v) => Ok(v),
        Lookup::Missing => Err(TemplateError::Missing {
            path: path.to_owned(),
        }),
    };
    if let [Piece::Placeholder(path)] = pieces.as_slice() {
        match resolve(path)? {
            Value::String(s) => return Ok(Value::String(prefix_of(s.as_bytes(), max))),
            other if crate::budget::json_size_within(other, max).is_ok() => {
                return Ok(other.clone());
            }
            _ => {}
        }
    }
    let mut out: Vec<u8> = Vec::with_capacity(max.min(1024));
    for piece in pieces {
        let left = max.saturating_sub(out.len());
        match piece {
            Piece::Text(text) => out.extend_from_slice(&text.as_bytes()[..text.len().min(left)]),
            // Every path is still looked up: a missing one fails as in `render`.
            Piece::Placeholder(path) => match resolve(path)? {
                Value::String(s) => out.extend_from_slice(&s.as_bytes()[..s.len().min(left)]),
                _ if left == 0 => {}
                other => {
                    let _ = Capped::into(&mut out, left).json(other);
                }
            },
        }
    }
    Ok(Value::String(prefix_of(&out, max)))
}

/// The longest valid UTF-8 text at the start of `bytes`, at most `max`
/// bytes long.
fn prefix_of(bytes: &[u8], max: usize) -> String {
    let bytes = &bytes[..bytes.len().min(max)];
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(e) => String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned(),
    }
}

/// Renders every string inside `v` (in arrays and object values; object keys
/// stay as written) within [`Meter::config`]; non-string leaves are copied
/// (and counted). An error names the string's path relative to `v`.
pub fn render_value(v: &Value, scope: &Value) -> Result<Value, RenderError> {
    render_value_in(v, scope, "", &mut Meter::config())
}

/// Renders a step's `config` ([`render_value`] within [`Meter::config`]);
/// an error names the string as `config.<path>`.
pub fn render_config(config: &Value, scope: &Value) -> Result<Value, RenderError> {
    render_value_in(config, scope, "config", &mut Meter::config())
}

/// Renders every string inside `v` within what `meter` has left; an error
/// names the string's path, `at` and the path inside `v` joined by dots.
pub fn render_value_in(
    v: &Value,
    scope: &Value,
    at: &str,
    meter: &mut Meter,
) -> Result<Value, RenderError> {
    fn walk(
        v: &Value,
        scope: &Value,
        at: &mut Vec<String>,
        meter: &mut Meter,
    ) -> Result<Value, RenderError> {
        let failed = |at: &[String], error: TemplateError| RenderError {
            at: at.join("."),
            error,
        };
        match v {
            Value::String(s) => render_in(s, scope, meter).map_err(|e| failed(at, e)),
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    at.push(i.to_string());
                    let rendered = walk(item, scope, at, meter);
                    at.pop();
                    out.push(rendered?);
                }
                Ok(Value::Array(out))
            }
            Value::Object(map) => {
                let mut out = serde_json::Map::new();
                for (key, item) in map {
                    at.push(key.clone());
                    let rendered = walk(item, scope, at, meter);
                    at.pop();
                    out.insert(key.clone(), rendered?);
                }
                Ok(Value::Object(out))
            }
            other => {
                let size = crate::budget::json_size_within(other, usize::MAX).unwrap_or(0);
                meter.take(size).map_err(|e| failed(at, e))?;
                Ok(other.clone())
            }
        }
    }
    let mut path = Vec::new();
    if !at.is_empty() {
        path.push(at.to_owned());
    }
    walk(v, scope, &mut path, meter)
}

/// Checks every string inside `v` like [`check`]; on failure, returns the dot
/// path (relative to `v`) of the bad string with the error.
pub fn check_value(v: &Value) -> Result<(), (String, TemplateError)> {
    fn walk(v: &Value, at: &mut Vec<String>) -> Result<(), (String, TemplateError)> {
        match v {
            Value::String(s) => check(s).map_err(|e| (at.join("."), e)),
            Value::Array(items) => items.iter().enumerate().try_for_each(|(i, item)| {
                at.push(i.to_string());
                let r = walk(item, at);
                at.pop();
                r
            }),
            Value::Object(map) => map.iter().try_for_each(|(k, item)| {
                at.push(k.clone());
                let r = walk(item, at);
                at.pop();
                r
            }),
            _ => Ok(()),
        }
    }
    walk(v, &mut Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope() -> Value {
        json!({
            "orderId": "A1",
            "lines": [{"sku": "x"}, {"sku": "y"}],
            "count": 2,
            "nothing": null,
            "st_x": {"items": [{"id": 9}]}
        })
    }

    #[test]
    fn single_placeholder_keeps_the_type() {
        assert_eq!(render("{{lines}}", &scope()).unwrap(), scope()["lines"]);
        assert_eq!(render("{{ count }}", &scope()).unwrap(), json!(2));
        assert_eq!(render("{{st_x.items.0.id}}", &scope()).unwrap(), json!(9));
        assert_eq!(render("{{nothing}}", &scope()).unwrap(), Value::Null);
    }

    #[test]
    fn mixed_text_becomes_a_string() {
        assert_eq!(
            render("Order {{orderId}} has {{count}} lines", &scope()).unwrap(),
            json!("Order A1 has 2 lines")
        );
        assert_eq!(
            render(" {{lines.0}}", &scope()).unwrap(),
            json!(" {\"sku\":\"x\"}")
        );
        assert_eq!(
            render("{{orderId}}{{orderId}}", &scope()).unwrap(),
            json!("A1A1")
        );
        assert_eq!(
            render("no placeholders }}", &scope()).unwrap(),
            json!("no placeholders }}")
        );
        assert_eq!(render("", &scope()).unwrap(), json!(""));
    }

    #[test]
    fn missing_path_is_an_error_with_the_documented_message() {
        let err = render("Order {{orderID}}", &scope()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "template refers to `orderID`, which is not in the context"
        );
    }

    #[test]
    fn syntax_errors() {
        assert_eq!(
            check("ab {{x"),
            Err(TemplateError::Unclosed {
                template: "ab {{x".into(),
                at: 3
            })
        );
        assert_eq!(
            check("{{a}} {{b"),
            Err(TemplateError::Unclosed {
                template: "{{a}} {{b".into(),
                at: 6
            })
        );
        assert!(matches!(
            check("{{  }}"),
            Err(TemplateError::EmptyPath { .. })
        ));
        assert!(matches!(
            check("{{a..b}}"),
            Err(TemplateError::BadPath { .. })
        ));
        assert!(matches!(
            check("{{a b}}"),
            Err(TemplateError::BadPath { .. })
        ));
        let msg = check("x {{ }}").unwrap_err().to_string();
        assert!(msg.contains("`x {{ }}`"), "{msg}");
        assert!(check("plain").is_ok());
        assert!(check("{{a.b.0}} and {{c}}").is_ok());
    }

    #[test]
    fn render_value_renders_nested_strings_but_not_keys() {
        let v = json!({"{{orderId}}": ["{{count}}", "id {{orderId}}", 5, true], "n": null});
        assert_eq!(
            render_value(&v, &scope()).unwrap(),
            json!({"{{orderId}}": [2, "id A1", 5, true], "n": null})
        );
        assert!(render_value(&json!({"a": ["{{zzz}}"]}), &scope()).is_err());
    }

    #[test]
    fn check_value_names_where_the_bad_string_is() {
        let v = json!({"headers": {"X": "ok"}, "tags": ["a", "{{b"]});
        let (at, err) = check_value(&v).unwrap_err();
        assert_eq!(at, "tags.1");
        assert!(matches!(err, TemplateError::Unclosed { .. }));
        assert!(check_value(&json!({"a": "{{b}}"})).is_ok());
    }
}
