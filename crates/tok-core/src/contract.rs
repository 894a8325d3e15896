//! The params contract of a webhook source.
//!
//! A source declares which params it expects and where in the body each one
//! is (`errors.0.message`). Ingest calls [`extract`] on every body: a missing
//! required param or a param of the wrong type is a 400 naming the param and
//! the path; extra fields are fine. A `GET` on the webhook URL shows [`help`].
//! The source API checks declarations with [`validate_params`] before saving.

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::context::{Lookup, lookup};

/// One declared param.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Param {
    /// The name steps use (`{{orderId}}`).
    pub name: String,
    /// Where the sender puts it: a dot path with array indices.
    pub path: String,
    #[serde(rename = "type", default)]
    pub kind: ParamType,
    #[serde(default)]
    pub required: bool,
}

/// The JSON type a param must have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    String,
    /// Any JSON number, integers included.
    Number,
    /// A whole number (`5` or `5.0`).
    Integer,
    Boolean,
    Object,
    Array,
    /// No check.
    #[default]
    Any,
}

impl ParamType {
    /// The name as written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Number => "number",
            ParamType::Integer => "integer",
            ParamType::Boolean => "boolean",
            ParamType::Object => "object",
            ParamType::Array => "array",
            ParamType::Any => "any",
        }
    }

    fn accepts(self, v: &Value) -> bool {
        match self {
            ParamType::String => v.is_string(),
            ParamType::Number => v.is_number(),
            ParamType::Integer => {
                v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            ParamType::Boolean => v.is_boolean(),
            ParamType::Object => v.is_object(),
            ParamType::Array => v.is_array(),
            ParamType::Any => true,
        }
    }

    fn placeholder(self, name: &str) -> Value {
        match self {
            ParamType::String | ParamType::Any => Value::String(format!("<{name}>")),
            ParamType::Number => json!(1.5),
            ParamType::Integer => json!(1),
            ParamType::Boolean => json!(true),
            ParamType::Object => json!({}),
            ParamType::Array => json!([]),
        }
    }
}

impl fmt::Display for ParamType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A body that does not satisfy the contract.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ContractError {
    #[error("required param `{param}` is missing: looked for it at `{path}`")]
    Missing { param: String, path: String },
    #[error("param `{param}` at `{path}` must be of type {expected}, but is {found}")]
    WrongType {
        param: String,
        path: String,
        expected: ParamType,
        found: &'static str,
    },
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a decimal number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The params found in `body`, by name. `null` counts as missing; an optional
/// param that is missing is left out of the map. Types are checked strictly
/// (a string `"5001"` is not a number), except that a number param accepts
/// integers. Stops at the first violation.
pub fn extract(params: &[Param], body: &Value) -> Result<Map<String, Value>, ContractError> {
    let mut found = Map::new();
    for param in params {
        let value = match lookup(body, &param.path) {
            Lookup::Found(v) if !v.is_null() => v,
            _ if param.required => {
                return Err(ContractError::Missing {
                    param: param.name.clone(),
                    path: param.path.clone(),
                });
            }
            _ => continue,
        };
        if !param.kind.accepts(value) {
            return Err(ContractError::WrongType {
                param: param.name.clone(),
                path: param.path.clone(),
                expected: param.kind,
                found: type_name(value),
            });
        }
        found.insert(param.name.clone(), value.clone());
    }
    Ok(found)
}

/// What a `GET` on the webhook URL answers: method, content type, the params
/// and an example body with a placeholder of the right type at every path.
pub fn help(params: &[Param]) -> Value {
    let mut example = Value::Object(Map::new());
    for param in params {
        let segments: Vec<&str> = param.path.split('.').collect();
        insert_at(&mut example, &segments, param.kind.placeholder(&param.name));
    }
    let described: Vec<Value> = params
        .iter()
        .map(|p| json!({"name": p.name, "path": p.path, "type": p.kind, "required": p.required}))
        .collect();
    json!({
        "method": "POST",
        "content_type": "application/json",
        "params": described,
        "example": example,
    })
}

/// Puts `value` at `segments` under `node`, creating objects (or arrays, for
/// numeric segments) on the way. An earlier param at the same place wins.
fn insert_at(node: &mut Value, segments: &[&str], value: Value) {
    let Some((head, rest)) = segments.split_first() else {
        return;
    };
    let index = head.parse::<usize>().ok();
    if node.is_null() {
        *node = if index.is_some() {
            Value::Array(Vec::new())
        } else {
            Value::Object(Map::new())
        };
    }
    let child = match (node, index) {
        (Value::Array(items), Some(i)) => {
            if items.len() <= i {
                items.resize(i + 1, Value::Null);
            }
            &mut items[i]
        }
        (Value::Object(map), _) => map.entry((*head).to_owned()).or_insert(Value::Null),
        _ => return,
    };
    if rest.is_empty() {
        if child.is_null() {
            *child = value;
        }
    } else {
        insert_at(child, rest, value);
    }
}

/// Checks a source's declarations: names non-empty, unique and not starting
/// with `_` (reserved for `_body`, `_event` and `_sender`), paths made of non-empty
/// segments. All problems are reported, separated by `; `.
pub fn validate_params(params: &[Param]) -> Result<(), String> {
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    for (i, param) in params.iter().enumerate() {
        let name = &param.name;
        if name.trim().is_empty() {
            problems.push(format!("param {i} has an empty name"));
        } else if name.starts_with('_') {
            problems.push(format!(
                "param `{name}` starts with `_`, which is reserved for `_body`, `_event` and `_sender`"
            ));
        } else if !seen.insert(name.as_str()) {
            problems.push(format!("param `{name}` is declared more than once"));
        }
        if param.path.split('.').any(|s| s.trim().is_empty()) {
            problems.push(format!(
                "param `{name}` has path `{}`; expected names and indices separated by dots, like `data.order.id`",
                param.path
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str, path: &str, kind: ParamType, required: bool) -> Param {
        Param {
            name: name.into(),
            path: path.into(),
            kind,
            required,
        }
    }

    #[test]
    fn extracts_params_from_their_paths() {
        let params = [
            param("orderId", "data.order.id", ParamType::String, true),
            param("first", "errors.0.message", ParamType::Any, false),
            param("total", "data.total", ParamType::Number, false),
            param("note", "data.note", ParamType::String, false),
        ];
        let body = json!({"data": {"order": {"id": "A1"}, "total": 10, "note": null, "extra": 1},
                          "errors": [{"message": "late"}]});
        let found = extract(&params, &body).unwrap();
        assert_eq!(
            Value::Object(found),
            json!({"orderId": "A1", "first": "late", "total": 10})
        );
    }

    #[test]
    fn missing_or_null_required_param_names_param_and_path() {
        let params = [param("orderId", "data.order.id", ParamType::Any, true)];
        for body in [json!({}), json!({"data": {"order": {"id": null}}})] {
            let err = extract(&params, &body).unwrap_err();
            assert_eq!(
                err.to_string(),
                "required param `orderId` is missing: looked for it at `data.order.id`"
            );
        }
    }

    #[test]
    fn types_are_strict_except_number_accepts_integers() {
        let p = |kind| [param("x", "x", kind, true)];
        assert!(extract(&p(ParamType::Number), &json!({"x": 5})).is_ok());
        assert!(extract(&p(ParamType::Integer), &json!({"x": 5.0})).is_ok());
        assert!(extract(&p(ParamType::Boolean), &json!({"x": false})).is_ok());
        assert!(extract(&p(ParamType::Array), &json!({"x": []})).is_ok());
        let err = extract(&p(ParamType::Number), &json!({"x": "5001"})).unwrap_err();
        assert_eq!(
            err,
            ContractError::WrongType {
                param: "x".into(),
                path: "x".into(),
                expected: ParamType::Number,
                found: "a string"
            }
        );
        assert_eq!(
            err.to_string(),
            "param `x` at `x` must be of type number, but is a string"
        );
        let err = extract(&p(ParamType::Integer), &json!({"x": 1.5})).unwrap_err();
        assert!(
            err.to_string().ends_with("but is a decimal number"),
            "{err}"
        );
        assert!(extract(&p(ParamType::Object), &json!({"x": [1]})).is_err());
    }

    #[test]
    fn help_describes_params_and_builds_an_example() {
        let params = [
            param("orderId", "data.order.id", ParamType::String, true),
            param("qty", "data.order.qty", ParamType::Integer, false),
            param("err", "errors.1.message", ParamType::String, false),
        ];
        let h = help(&params);
        assert_eq!(h["method"], "POST");
        assert_eq!(h["content_type"], "application/json");
        assert_eq!(
            h["params"][0],
            json!({"name": "orderId", "path": "data.order.id", "type": "string", "required": true})
        );
        assert_eq!(
            h["example"],
            json!({"data": {"order": {"id": "<orderId>", "qty": 1}},
                   "errors": [null, {"message": "<err>"}]})
        );
        let example_params = extract(&params, &h["example"]).unwrap();
        assert_eq!(example_params.len(), 3);
    }

    #[test]
    fn validate_params_reports_every_problem() {
        assert!(validate_params(&[param("a", "x.0.y", ParamType::Any, true)]).is_ok());
        let err = validate_params(&[
            param("", "a", ParamType::Any, false),
            param("_body", "a", ParamType::Any, false),
            param("a", "a..b", ParamType::Any, false),
            param("a", "", ParamType::Any, false),
        ])
        .unwrap_err();
        assert!(err.contains("param 0 has an empty name"), "{err}");
        assert!(err.contains("`_body` starts with `_`"), "{err}");
        assert!(err.contains("`a` is declared more than once"), "{err}");
        assert!(err.contains("path `a..b`"), "{err}");
        assert!(err.contains("path ``"), "{err}");
    }

    #[test]
    fn param_serde_defaults() {
        let p: Param = serde_json::from_value(json!({"name": "a", "path": "b"})).unwrap();
        assert_eq!(p, param("a", "b", ParamType::Any, false));
        let p: Param = serde_json::from_value(
            json!({"name": "a", "path": "b", "type": "integer", "required": true}),
        )
        .unwrap();
        assert_eq!(p.kind, ParamType::Integer);
    }
}
