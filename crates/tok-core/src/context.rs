//! The run's context: one JSON object that every step reads from (through
//! templates and conditions) and that grows as steps publish their outputs.
//!
//! It starts with the trigger's params at the top level, the whole body under
//! `_body` and event information under `_event`. A step's outputs are published
//! under its id (`st_x.status`) and, where that does not shadow anything, under
//! their bare keys (`status`). Keys starting with `_` are reserved for tok.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Where a context keeps its run's output.
pub const OUTPUT_KEY: &str = "_output";

/// The context of one run: always a JSON object, held as a [`Value`] so
/// templates and the flow read it in place ([`Context::as_value`]) instead
/// of from a copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Context(Value);

impl Default for Context {
    fn default() -> Self {
        Context(Value::Object(Map::new()))
    }
}

impl Context {
    /// The context a run starts with. `_body` and `_event` win over params of
    /// the same name; such params are rejected at save anyway.
    pub fn new(params: Map<String, Value>, body: Value, event: Value) -> Context {
        let mut map = params;
        map.insert("_body".to_owned(), body);
        map.insert("_event".to_owned(), event);
        Context(Value::Object(map))
    }

    /// A stored context; anything but an object is an empty context.
    pub fn from_value(value: Value) -> Context {
        match value {
            Value::Object(_) => Context(value),
            _ => Context::default(),
        }
    }

    fn map_mut(&mut self) -> &mut Map<String, Value> {
        if !self.0.is_object() {
            self.0 = Value::Object(Map::new());
        }
        match &mut self.0 {
            Value::Object(map) => map,
            _ => unreachable!("the context was just made an object"),
        }
    }

    /// Publishes a finished step's outputs: always as `ctx[step_id]`
    /// (replacing an earlier publication, e.g. the previous loop iteration),
    /// and each key under its bare name only if that name is not taken yet and
    /// does not start with `_`. So a tool returning `status` never overwrites
    /// the trigger's `status`, and a later step never overwrites an earlier one.
    pub fn publish(&mut self, step_id: &str, outputs: &Map<String, Value>) {
        let map = self.map_mut();
        map.insert(step_id.to_owned(), Value::Object(outputs.clone()));
        for (key, value) in outputs {
            if !key.starts_with('_') && !map.contains_key(key) {
                map.insert(key.clone(), value.clone());
            }
        }
    }

    /// A reserved entry of the context (a key starting with `_`).
    pub fn reserved(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    /// Sets (or, with `None`, removes) a reserved entry of the context.
    pub fn set_reserved(&mut self, key: &str, value: Option<Value>) {
        let map = self.map_mut();
        match value {
            Some(value) => map.insert(key.to_owned(), value),
            None => map.remove(key),
        };
    }

    /// Sets the run's output (the `output` of its `end` step), kept under
    /// the reserved `_output`.
    pub fn set_output(&mut self, output: Value) {
        self.map_mut().insert(OUTPUT_KEY.to_owned(), output);
    }

    /// The run's output; `null` when its `end` step gave none.
    pub fn output(&self) -> Value {
        self.0.get(OUTPUT_KEY).cloned().unwrap_or(Value::Null)
    }

    /// Looks a dot path up (see [`lookup`]).
    pub fn lookup(&self, path: &str) -> Lookup<'_> {
        lookup(&self.0, path)
    }

    /// The context as a JSON value, borrowed.
    pub fn as_value(&self) -> &Value {
        &self.0
    }

    /// The context as a JSON value (a copy).
    pub fn to_value(&self) -> Value {
        self.0.clone()
    }

    /// The context as a JSON value, without copying.
    pub fn into_value(self) -> Value {
        self.0
    }
}

impl From<Map<String, Value>> for Context {
    fn from(map: Map<String, Value>) -> Self {
        Context(Value::Object(map))
    }
}

/// The result of looking a path up. A path that leads nowhere is `Missing`;
/// a present `null` is `Found(Null)`: conditions treat "has not arrived"
/// differently from "arrived empty".
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lookup<'a> {
    Missing,
    Found(&'a Value),
}

impl<'a> Lookup<'a> {
    /// The value, if found.
    pub fn value(self) -> Option<&'a Value> {
        match self {
            Lookup::Missing => None,
            Lookup::Found(v) => Some(v),
        }
    }

    /// Whether nothing was found at the path.
    pub fn is_missing(self) -> bool {
        matches!(self, Lookup::Missing)
    }
}

/// Follows a dot path through `root`: object keys by name, array elements by
/// numeric segment (`st_x.items.0.id`). An empty path or an empty segment
/// (`a..b`) finds nothing.
pub fn lookup<'a>(root: &'a Value, path: &str) -> Lookup<'a> {
    if path.is_empty() {
        return Lookup::Missing;
    }
    let mut current = root;
    for segment in path.split('.') {
        let next = match current {
            Value::Object(map) if !segment.is_empty() => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(v) => current = v,
            None => return Lookup::Missing,
        }
    }
    Lookup::Found(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn new_puts_params_at_top_and_body_and_event_reserved() {
        let ctx = Context::new(
            obj(json!({"orderId": "A1", "_body": "spoofed"})),
            json!({"order": {"id": "A1"}}),
            json!({"id": "evt_1"}),
        );
        assert_eq!(ctx.lookup("orderId"), Lookup::Found(&json!("A1")));
        assert_eq!(ctx.lookup("_body.order.id"), Lookup::Found(&json!("A1")));
        assert_eq!(ctx.lookup("_event.id"), Lookup::Found(&json!("evt_1")));
    }

    #[test]
    fn publish_never_overwrites_bare_keys_or_reserved_ones() {
        let mut ctx = Context::new(obj(json!({"status": "new"})), json!({}), json!({}));
        ctx.publish(
            "st_http",
            &obj(json!({"status": 200, "body": "ok", "_secret": 1})),
        );
        assert_eq!(ctx.lookup("status"), Lookup::Found(&json!("new")));
        assert_eq!(ctx.lookup("st_http.status"), Lookup::Found(&json!(200)));
        assert_eq!(ctx.lookup("body"), Lookup::Found(&json!("ok")));
        assert_eq!(ctx.lookup("st_http._secret"), Lookup::Found(&json!(1)));
        assert_eq!(ctx.lookup("_secret"), Lookup::Missing);

        ctx.publish("st_http", &obj(json!({"status": 500})));
        assert_eq!(ctx.lookup("st_http.status"), Lookup::Found(&json!(500)));
        assert_eq!(ctx.lookup("st_http.body"), Lookup::Missing);
        assert_eq!(ctx.lookup("body"), Lookup::Found(&json!("ok")));
    }

    #[test]
    fn lookup_distinguishes_missing_from_null_and_indexes_arrays() {
        let root = json!({"a": {"items": [{"id": 7}, null]}, "n": null});
        assert_eq!(lookup(&root, "a.items.0.id"), Lookup::Found(&json!(7)));
        assert_eq!(lookup(&root, "a.items.1"), Lookup::Found(&Value::Null));
        assert_eq!(lookup(&root, "n"), Lookup::Found(&Value::Null));
        assert!(lookup(&root, "a.items.2").is_missing());
        assert!(lookup(&root, "a.items.x").is_missing());
        assert!(lookup(&root, "n.deeper").is_missing());
        assert!(lookup(&root, "").is_missing());
        assert!(lookup(&root, "a..items").is_missing());
        assert_eq!(lookup(&root, "a.items.0").value(), Some(&json!({"id": 7})));
    }

    #[test]
    fn context_serializes_as_a_plain_object() {
        let ctx = Context::new(Map::new(), json!(1), json!(2));
        assert_eq!(
            serde_json::to_value(&ctx).unwrap(),
            json!({"_body": 1, "_event": 2})
        );
        let copied = ctx.to_value();
        assert_eq!(ctx.into_value(), copied);
    }
}
