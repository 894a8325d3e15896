//! `{{path}}` templates in step configs and rule values.
//!
//! Validation at save calls [`check`] on every config string; the engine calls
//! [`render_value`] on a step's config against the step's scope (see
//! [`crate::flow::scope`]) right before running it. A string that is exactly
//! one placeholder yields the referenced value with its JSON type (so
//! `"{{lines}}"` can pass an array); anything else yields a string.

use serde_json::Value;
use thiserror::Error;

use crate::context::{Lookup, lookup};

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

/// Renders one template against `scope`.
///
/// Exactly one placeholder and nothing else (whitespace inside the braces is
/// fine) gives the value itself, typed. Otherwise the result is a string with
/// each placeholder replaced: strings as they are, other values as compact
/// JSON. A path that is not in `scope` is an error rather than an empty string,
/// because a silently empty ticket title is worse than a failed step.
pub fn render(template: &str, scope: &Value) -> Result<Value, TemplateError> {
    let pieces = parse(template)?;
    let resolve = |path: &str| match lookup(scope, path) {
        Lookup::Found(v) => Ok(v),
        Lookup::Missing => Err(TemplateError::Missing {
            path: path.to_owned(),
        }),
    };
    if let [Piece::Placeholder(path)] = pieces.as_slice() {
        return resolve(path).cloned();
    }
    let mut out = String::with_capacity(template.len());
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Placeholder(path) => match resolve(path)? {
                Value::String(s) => out.push_str(s),
                other => out.push_str(&other.to_string()),
            },
        }
    }
    Ok(Value::String(out))
}

/// Renders every string inside `v` (in arrays and object values; object keys
/// stay as written). Non-string leaves are copied.
pub fn render_value(v: &Value, scope: &Value) -> Result<Value, TemplateError> {
    match v {
        Value::String(s) => render(s, scope),
        Value::Array(items) => items
            .iter()
            .map(|item| render_value(item, scope))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        Value::Object(map) => map
            .iter()
            .map(|(k, item)| Ok((k.clone(), render_value(item, scope)?)))
            .collect::<Result<serde_json::Map<_, _>, _>>()
            .map(Value::Object),
        other => Ok(other.clone()),
    }
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
