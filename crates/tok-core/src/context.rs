//! The run's context: one JSON object that every step reads from (through
//! templates and conditions) and that grows as steps publish their outputs.
//!
//! It starts with the trigger's params at the top level, the whole body under
//! `_body` and event information under `_event`. A step's outputs are published
//! under its id (`st_x.status`) and, where that does not shadow anything, under
//! their bare keys (`status`). Keys starting with `_` are reserved for tok.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Where a context keeps its run's output.
pub const OUTPUT_KEY: &str = "_output";
/// Where a context with `settings.pruneStateAfter` keeps the order in which
/// steps published ([`Context::keep_latest`]).
pub const PUBLISHED_KEY: &str = "_published";

/// The context of one run: always a JSON object, held as a [`Value`] so
/// templates and the flow read it in place ([`Context::as_value`]) instead
/// of from a copy.
///
/// It remembers which of its top-level entries changed since it was made
/// ([`Context::changed`]): a record stores only those ([`Changes`]), not
/// the whole context again, so a step of a long run costs what a step of a
/// short one does. And it is shared, not copied: a step's handler and a
/// record read the same value ([`Context::shared`]), and a change after
/// them copies it only if one of them still holds it. Two contexts are
/// equal when their values are.
#[derive(Debug, Clone)]
pub struct Context {
    value: Arc<Value>,
    changed: BTreeSet<String>,
}

impl PartialEq for Context {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Serialize for Context {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Context {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Context::from_value)
    }
}

impl Default for Context {
    fn default() -> Self {
        Context::of(Value::Object(Map::new()))
    }
}

impl Context {
    /// The context a run starts with. `_body` and `_event` win over params of
    /// the same name; such params are rejected at save anyway.
    pub fn new(params: Map<String, Value>, body: Value, event: Value) -> Context {
        let mut map = params;
        map.insert("_body".to_owned(), body);
        map.insert("_event".to_owned(), event);
        Context::of(Value::Object(map))
    }

    fn of(value: Value) -> Context {
        Context::of_shared(Arc::new(value))
    }

    /// A stored context shared with whoever else holds it; anything but an
    /// object is an empty context.
    pub fn from_shared(value: Arc<Value>) -> Context {
        match *value {
            Value::Object(_) => Context::of_shared(value),
            _ => Context::default(),
        }
    }

    fn of_shared(value: Arc<Value>) -> Context {
        Context {
            value,
            changed: BTreeSet::new(),
        }
    }

    /// A stored context; anything but an object is an empty context.
    pub fn from_value(value: Value) -> Context {
        match value {
            Value::Object(_) => Context::of(value),
            _ => Context::default(),
        }
    }

    /// The context's entries, to change `keys` of them: each is counted
    /// as changed.
    fn map_mut<'k>(&mut self, keys: impl IntoIterator<Item = &'k str>) -> &mut Map<String, Value> {
        for key in keys {
            if !self.changed.contains(key) {
                self.changed.insert(key.to_owned());
            }
        }
        let value = Arc::make_mut(&mut self.value);
        if !value.is_object() {
            *value = Value::Object(Map::new());
        }
        match value {
            Value::Object(map) => map,
            _ => unreachable!("the context was just made an object"),
        }
    }

    /// The top-level entries set or removed since the context was made
    /// (from a stored value, or new), in order: what a record of it must
    /// store ([`Changes`]).
    pub fn changed(&self) -> Vec<String> {
        self.changed.iter().cloned().collect()
    }

    /// Publishes a finished step's outputs: always as `ctx[step_id]`
    /// (replacing an earlier publication, e.g. the previous loop iteration),
    /// and each key under its bare name only if that name is not taken yet and
    /// does not start with `_`. So a tool returning `status` never overwrites
    /// the trigger's `status`, and a later step never overwrites an earlier one.
    /// Returns the bare names it took.
    pub fn publish(&mut self, step_id: &str, outputs: &Map<String, Value>) -> Vec<String> {
        let bare: Vec<&String> = match &*self.value {
            Value::Object(map) => outputs
                .keys()
                .filter(|key| {
                    !key.starts_with('_') && *key != step_id && !map.contains_key(key.as_str())
                })
                .collect(),
            _ => outputs
                .keys()
                .filter(|key| !key.starts_with('_') && *key != step_id)
                .collect(),
        };
        let keys = std::iter::once(step_id).chain(bare.iter().map(|key| key.as_str()));
        let map = self.map_mut(keys);
        map.insert(step_id.to_owned(), Value::Object(outputs.clone()));
        for key in &bare {
            if let Some(value) = outputs.get(key.as_str()) {
                map.insert((*key).clone(), value.clone());
            }
        }
        bare.into_iter().cloned().collect()
    }

    /// The steps that published, oldest first, with the bare names each
    /// took ([`Context::keep_latest`]).
    fn published_order(&self) -> Vec<(String, Vec<String>)> {
        self.reserved(PUBLISHED_KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

    /// How many bytes [`Context::keep_latest`] would remove after
    /// `step_id` published (what the oldest steps beyond `keep` hold).
    pub fn prunable(&self, step_id: &str, keep: usize) -> usize {
        let order: Vec<(String, Vec<String>)> = self
            .published_order()
            .into_iter()
            .filter(|(id, _)| id != step_id)
            .collect();
        // The step itself is the latest: `keep - 1` others stay.
        let going = (order.len() + 1).saturating_sub(keep.max(1));
        let map = self.value.as_object();
        order
            .iter()
            .take(going)
            .flat_map(|(id, bare)| std::iter::once(id).chain(bare))
            .filter_map(|key| Some((key, map?.get(key)?)))
            .map(|(key, value)| entry_bytes(key, value))
            .sum()
    }

    /// Keeps the outputs of the `keep` steps published last and removes the
    /// older ones (their entries under their ids and the bare names they
    /// took), after `step_id` published and took `bare`
    /// (`settings.pruneStateAfter`). The order of publication is kept under
    /// the reserved [`PUBLISHED_KEY`]. Returns about how many bytes left
    /// the context ([`Context::measure`]).
    pub fn keep_latest(&mut self, step_id: &str, bare: Vec<String>, keep: usize) -> usize {
        let mut order = self.published_order();
        let mut bare = bare;
        if let Some(at) = order.iter().position(|(id, _)| id == step_id) {
            bare.extend(order.remove(at).1);
        }
        order.push((step_id.to_owned(), bare));
        let gone: Vec<String> = order
            .drain(..order.len().saturating_sub(keep))
            .flat_map(|(id, bare)| std::iter::once(id).chain(bare))
            .collect();
        let map = self.map_mut(
            gone.iter()
                .map(String::as_str)
                .chain(std::iter::once(PUBLISHED_KEY)),
        );
        let mut removed = 0;
        for key in &gone {
            if let Some(value) = map.remove(key) {
                removed += entry_bytes(key, &value);
            }
        }
        map.insert(
            PUBLISHED_KEY.to_owned(),
            serde_json::to_value(&order).unwrap_or(Value::Null),
        );
        removed
    }

    /// A reserved entry of the context (a key starting with `_`).
    pub fn reserved(&self, key: &str) -> Option<&Value> {
        self.value.get(key)
    }

    /// Sets (or, with `None`, removes) a reserved entry of the context.
    pub fn set_reserved(&mut self, key: &str, value: Option<Value>) {
        let map = self.map_mut([key]);
        match value {
            Some(value) => map.insert(key.to_owned(), value),
            None => map.remove(key),
        };
    }

    /// Sets the run's output (the `output` of its `end` step), kept under
    /// the reserved `_output`.
    pub fn set_output(&mut self, output: Value) {
        self.map_mut([OUTPUT_KEY])
            .insert(OUTPUT_KEY.to_owned(), output);
    }

    /// The run's output; `null` when its `end` step gave none.
    pub fn output(&self) -> Value {
        self.value.get(OUTPUT_KEY).cloned().unwrap_or(Value::Null)
    }

    /// Looks a dot path up (see [`lookup`]).
    pub fn lookup(&self, path: &str) -> Lookup<'_> {
        lookup(&self.value, path)
    }

    /// The context as a JSON value, borrowed.
    pub fn as_value(&self) -> &Value {
        &self.value
    }

    /// The context as a JSON value (a copy).
    pub fn to_value(&self) -> Value {
        (*self.value).clone()
    }

    /// The context as a JSON value, copied only if someone else holds it.
    pub fn into_value(self) -> Value {
        Arc::try_unwrap(self.value).unwrap_or_else(|shared| (*shared).clone())
    }

    /// The context's value, shared: a handler's view of it, a record of it,
    /// without a copy.
    pub fn shared(&self) -> Arc<Value> {
        Arc::clone(&self.value)
    }

    /// [`Context::shared`], taking the context.
    pub fn into_shared(self) -> Arc<Value> {
        self.value
    }

    /// The size of the context serialized as JSON, in bytes (counted, not
    /// written).
    pub fn measure(&self) -> usize {
        json_bytes(&*self.value)
    }

    /// How many bytes [`Context::publish`] of `outputs` under `step_id`
    /// would add to [`Context::measure`] (negative when it replaces a larger
    /// entry): the entry under the step's id, and the bare keys it adds.
    /// Exact up to the separators between entries.
    pub fn published_growth(&self, step_id: &str, outputs: &Map<String, Value>) -> isize {
        let map = self.value.as_object();
        let mut growth = entry_bytes(step_id, outputs) as isize;
        if let Some(old) = map.and_then(|m| m.get(step_id)) {
            growth -= entry_bytes(step_id, old) as isize;
        }
        for (key, value) in outputs {
            let taken = map.is_some_and(|m| m.contains_key(key));
            if !key.starts_with('_') && key != step_id && !taken {
                growth += entry_bytes(key, value) as isize;
            }
        }
        growth
    }
}

/// Counts the bytes written to it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The size of `value` serialized as JSON.
fn json_bytes(value: &impl Serialize) -> usize {
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// The size of one entry of an object with other entries: `"key":value,`.
fn entry_bytes(key: &str, value: &impl Serialize) -> usize {
    json_bytes(&key) + 1 + json_bytes(value) + 1
}

impl From<Map<String, Value>> for Context {
    fn from(map: Map<String, Value>) -> Self {
        Context::of(Value::Object(map))
    }
}

/// What a record changed of its run's context, as it is stored: the
/// top-level entries it set, with their values, and those it removed.
/// Serialized from the context in place (`{"set": {…}, "unset": […]}`),
/// never copied first; read back as a [`ContextDelta`].
pub struct Changes<'a> {
    context: &'a Value,
    keys: &'a [String],
}

impl<'a> Changes<'a> {
    /// The entries `keys` of `context` (the keys a [`Context`] reported
    /// [`changed`](Context::changed)), as they are now.
    pub fn of(context: &'a Value, keys: &'a [String]) -> Self {
        Changes { context, keys }
    }
}

impl Serialize for Changes<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Set<'a>(&'a Value, &'a [String]);
        impl Serialize for Set<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(None)?;
                for key in self.1 {
                    if let Some(value) = self.0.get(key) {
                        map.serialize_entry(key, value)?;
                    }
                }
                map.end()
            }
        }
        let unset: Vec<&String> = self
            .keys
            .iter()
            .filter(|key| self.context.get(key.as_str()).is_none())
            .collect();
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("set", &Set(self.context, self.keys))?;
        if !unset.is_empty() {
            map.serialize_entry("unset", &unset)?;
        }
        map.end()
    }
}

/// A record's change of its run's context, read back ([`Changes`] wrote
/// it): folded over the context before it in the order the records were
/// written, it gives the context after.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ContextDelta {
    #[serde(default)]
    pub set: Map<String, Value>,
    #[serde(default)]
    pub unset: Vec<String>,
}

impl ContextDelta {
    /// Writes this change over `context` (a stored context, before it).
    pub fn apply(self, context: &mut Value) {
        if !context.is_object() {
            *context = Value::Object(Map::new());
        }
        if let Value::Object(map) = context {
            for key in &self.unset {
                map.remove(key);
            }
            for (key, value) in self.set {
                map.insert(key, value);
            }
        }
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
    fn a_publish_grows_the_measure_by_what_it_adds_and_replaces() {
        let mut ctx = Context::new(obj(json!({"status": "new"})), json!({"a": 1}), json!({}));
        for outputs in [
            json!({"status": 200, "body": "ok"}),
            json!({"status": 500}),
            json!({"items": [1, 2, 3], "more": {"x": "y"}}),
        ] {
            let outputs = obj(outputs);
            let before = ctx.measure() as isize;
            let growth = ctx.published_growth("st_http", &outputs);
            ctx.publish("st_http", &outputs);
            assert_eq!(before + growth, ctx.measure() as isize, "{outputs:?}");
        }
    }

    #[test]
    fn pruning_keeps_the_latest_steps_outputs() {
        let mut ctx = Context::new(obj(json!({"order": 7})), json!({}), json!({}));
        let publish = |ctx: &mut Context, id: &str, outputs: Value| {
            let outputs = obj(outputs);
            let bare = ctx.publish(id, &outputs);
            let before = ctx.measure();
            let removed = ctx.keep_latest(id, bare, 2);
            (before, removed)
        };
        publish(&mut ctx, "a", json!({"x": 1}));
        publish(&mut ctx, "b", json!({"y": 2}));
        assert_eq!(ctx.lookup("a.x"), Lookup::Found(&json!(1)));
        let (_, removed) = publish(&mut ctx, "c", json!({"z": 3, "order": 0}));
        assert!(ctx.lookup("a").is_missing() && ctx.lookup("x").is_missing());
        assert!(removed > 0);
        assert_eq!(ctx.lookup("b.y"), Lookup::Found(&json!(2)));
        assert_eq!(ctx.lookup("z"), Lookup::Found(&json!(3)));
        // The trigger's params are no step's: they stay.
        assert_eq!(ctx.lookup("order"), Lookup::Found(&json!(7)));
        // A step published again counts as the latest.
        publish(&mut ctx, "b", json!({"y": 4}));
        publish(&mut ctx, "d", json!({}));
        assert!(ctx.lookup("c").is_missing() && ctx.lookup("z").is_missing());
        assert_eq!(ctx.lookup("b.y"), Lookup::Found(&json!(4)));
        assert_eq!(ctx.lookup("y"), Lookup::Found(&json!(2)));
        assert!(ctx.changed().contains(&"c".to_owned()));
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

    /// The change a record stores, folded over the context its claim
    /// read, gives the context the record ends with.
    fn folded(before: &Value, after: &Context) -> Value {
        let keys = after.changed();
        let stored = serde_json::to_value(Changes::of(after.as_value(), &keys)).unwrap();
        let delta: ContextDelta = serde_json::from_value(stored).unwrap();
        let mut context = before.clone();
        delta.apply(&mut context);
        context
    }

    #[test]
    fn a_context_knows_what_changed_and_its_changes_fold_into_it() {
        let before = json!({"orderId": "A1", "_body": {"big": [1, 2, 3]},
                            "_compensable": ["0"], "old": 1});
        let mut ctx = Context::from_value(before.clone());
        assert!(ctx.changed().is_empty());
        ctx.publish(
            "st_a",
            &obj(json!({"orderId": "B2", "status": 200, "_x": 1})),
        );
        ctx.set_reserved("_compensable", None);
        ctx.set_output(json!({"done": true}));
        assert_eq!(
            ctx.changed(),
            vec!["_compensable", "_output", "st_a", "status"],
            "the step, its new bare key, the removed and the set reserved entries; \
             not `orderId` (taken) nor `_body` (untouched)"
        );
        assert_eq!(folded(&before, &ctx), *ctx.as_value());
        let stored = serde_json::to_value(Changes::of(ctx.as_value(), &ctx.changed())).unwrap();
        assert_eq!(stored["unset"], json!(["_compensable"]));
        assert!(
            stored["set"].get("_body").is_none(),
            "an untouched entry is not stored again"
        );
    }

    #[test]
    fn a_step_named_like_its_output_keeps_its_publication() {
        let mut ctx = Context::default();
        ctx.publish("status", &obj(json!({"status": 200})));
        assert_eq!(ctx.lookup("status.status"), Lookup::Found(&json!(200)));
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
