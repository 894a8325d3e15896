//! What a source's schema costs, weighed before it is kept and before each
//! body is checked against it, without expanding anything.
//!
//! The `jsonschema` crate compiles a `$ref` by compiling its target in
//! place the first time the target is met in a compilation, and as a lazy
//! node every time after; a lazy node compiles its target afresh (in place,
//! with lazy nodes of its own) the first time a body reaches it, and keeps
//! it. A schema whose `$defs` each refer twice to the one before
//! (`d_i = {"allOf": [{"$ref": d_(i-1)}, {"$ref": d_(i-1)}]}`) so compiles
//! at once, but its first check builds all `2^i` copies: 1.7 GB at 18
//! levels, out of memory at 20. A subschema with `unevaluatedProperties` or
//! `unevaluatedItems` compiles its subschemas once more, to learn what they
//! evaluated, and checks the body's parts under them twice.
//!
//! So a schema is read as a graph, [`Shape`]: one node per subschema, its
//! `$ref`s resolved by the resolver `jsonschema` uses (`referencing`), each
//! edge either *in place* (the subschema applies to the same value:
//! `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`,
//! `dependentSchemas`, a `$ref`) or *into the body* (it applies to a part
//! of the value: `properties`, `items`, `additionalProperties`, …). Then:
//!
//! - at save ([`Shape::of`]): the nesting, the number of `$ref`s and of
//!   patterns, and the schema's *expanded size* — each `$ref` counted as a
//!   copy of its target, by memoization and saturating arithmetic over the
//!   graph, never by expanding it — are bounded, and so is the longest
//!   chain of subschemas applied one within another; a `$ref` cycle that
//!   stays on one value (its check would never end) is refused. A refusal
//!   names the place in the schema and the limit.
//! - at ingest ([`Shape::check_cost`]): a `$ref` back to a schema that
//!   encloses it (a tree of comments) is legitimate, and what its check
//!   costs depends on the body: the body is walked with the graph first,
//!   each (subschema, value) pair the check could visit counted, and the
//!   count stops at a budget. A body over it is refused before any check
//!   runs. The count is an upper bound of the check's work: every subschema
//!   in place counts as tried (a check may stop at the first of an `anyOf`
//!   that holds), every `patternProperties` as matching.

use std::collections::HashMap;

use referencing::{Draft, Registry, Resolver};
use serde_json::Value;

/// Deepest nesting of subschemas in a schema.
pub(crate) const MAX_DEPTH: usize = 32;

/// Most `$ref`s (and `$dynamicRef`s) in a schema.
pub(crate) const MAX_REFS: usize = 256;

/// Most patterns (`pattern`, and the keys of `patternProperties`) in a
/// schema.
pub(crate) const MAX_PATTERNS: usize = 128;

/// Most units a schema expands to when each `$ref` counts as a copy of its
/// target: a unit is a subschema (about a kilobyte of the compiled
/// validator), and a pattern counts [`PATTERN_UNITS`], so the validator of
/// a schema kept stays within a few tens of megabytes.
pub(crate) const MAX_EXPANDED: u64 = 10_000;

/// What a pattern counts in the expanded size: a compiled regular
/// expression may hold up to [`super::MAX_PATTERN_BYTES`].
const PATTERN_UNITS: u64 = 32;

/// Longest chain of subschemas applied one within another, through
/// `$ref`s, in place or into the body: the check recurses along it.
pub(crate) const MAX_CHAIN: u64 = 128;

/// Most units of work one body's check may take: each (subschema, value)
/// pair visited is one, a pattern or format tried on a string one more per
/// 256 bytes of it, and a lazy node's compilation what it compiles.
pub(crate) const MAX_CHECK_UNITS: u64 = 1_000_000;

/// Why a schema is not kept: where in it, what, and the limit it passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// A JSON pointer into the schema (`""` for the whole of it).
    pub(crate) path: String,
    pub(crate) message: String,
    pub(crate) limit: Option<u64>,
    /// A reference that does not resolve, or an `$id` that does not: the
    /// compiler, which refuses it too, says it better.
    pub(crate) unreadable: bool,
}

impl Refusal {
    fn new(path: &str, message: String, limit: Option<u64>) -> Self {
        Self {
            path: path.to_owned(),
            message,
            limit,
            unreadable: false,
        }
    }

    fn unreadable(path: &str, message: String) -> Self {
        Self {
            unreadable: true,
            ..Self::new(path, message, None)
        }
    }
}

/// One subschema and where it leads.
#[derive(Debug, Default)]
struct Node {
    /// Where it is in the schema, as a JSON pointer.
    pointer: String,
    /// What it counts by itself: one, and [`PATTERN_UNITS`] a pattern.
    units: u64,
    /// How many patterns and formats it tries on a string.
    string_rules: u64,
    /// Applied to the same value.
    in_place: Vec<Edge>,
    /// Applied to parts of the value.
    into: Parts,
    /// It has `unevaluatedProperties` or `unevaluatedItems`: its
    /// subschemas are compiled twice, and checked twice on each part.
    twice: bool,
}

/// An edge in place: to a subschema, or through a `$ref` to its target.
#[derive(Debug, Clone, Copy)]
struct Edge {
    to: usize,
    /// Through a `$ref`: a lazy node when its target is met again.
    reference: bool,
}

/// The edges of a node that lead into parts of the body's value.
#[derive(Debug, Default)]
struct Parts {
    /// `properties`: the member of that name.
    properties: HashMap<String, usize>,
    /// `patternProperties` (each counted as matching),
    /// `additionalProperties`, `unevaluatedProperties`: any member.
    members: Vec<usize>,
    /// `propertyNames`: each member's name.
    names: Vec<usize>,
    /// `prefixItems` (and the list form of `items`): the item at that
    /// index.
    prefix: Vec<usize>,
    /// `items`, `additionalItems`, `contains`, `unevaluatedItems`: any item.
    items: Vec<usize>,
}

impl Parts {
    fn all(&self) -> impl Iterator<Item = usize> + '_ {
        self.properties
            .values()
            .copied()
            .chain(self.members.iter().copied())
            .chain(self.names.iter().copied())
            .chain(self.prefix.iter().copied())
            .chain(self.items.iter().copied())
    }
}

/// A schema as a graph of its subschemas, weighed ([`Shape::of`]).
#[derive(Debug)]
pub(crate) struct Shape {
    nodes: Vec<Node>,
    /// What each node expands to through its `$ref`s, a `$ref` back to a
    /// schema that encloses it counted as one (the lazy node it compiles
    /// to).
    expanded: Vec<u64>,
    /// Whether a `$ref` leads back to a schema that encloses it: what a
    /// check of it compiles then depends on the body.
    recursive: bool,
    patterns: Vec<(String, String)>,
}

/// Keywords whose value is one subschema applied to the same value.
const IN_PLACE_ONE: &[&str] = &["not", "if", "then", "else"];
/// Keywords whose value is a list of subschemas applied to the same value.
const IN_PLACE_LIST: &[&str] = &["allOf", "anyOf", "oneOf"];
/// Keywords whose value maps names to subschemas applied to the same value.
const IN_PLACE_MAP: &[&str] = &["dependentSchemas", "dependencies"];
/// Keywords whose value is a reference.
const REFERENCES: &[&str] = &["$ref", "$dynamicRef", "$recursiveRef"];
/// Keywords whose value maps names to subschemas applied by no keyword of
/// their own (only through a `$ref`).
const DEFINITIONS: &[&str] = &["$defs", "definitions"];
/// Keywords whose value is one subschema applied to any member.
const MEMBERS: &[&str] = &["additionalProperties", "unevaluatedProperties"];
/// Keywords whose value is one subschema applied to any item.
const ITEMS: &[&str] = &["additionalItems", "contains", "unevaluatedItems"];

/// A subschema found, waiting to be read.
struct Found<'r> {
    value: &'r Value,
    depth: usize,
    resolver: Resolver<'r>,
}

/// Reads a schema's subschemas into nodes.
struct Reader<'r> {
    draft: Draft,
    pointers: HashMap<usize, String>,
    nodes: Vec<Node>,
    index: HashMap<usize, usize>,
    pending: Vec<Found<'r>>,
    refs: usize,
    /// Each pattern, with where it is.
    patterns: Vec<(String, String)>,
}

impl<'r> Reader<'r> {
    /// The node of `value`, added (and queued to be read) when it is new.
    fn node(&mut self, value: &'r Value, depth: usize, resolver: &Resolver<'r>) -> usize {
        let key = address(value);
        if let Some(&known) = self.index.get(&key) {
            return known;
        }
        let id = self.nodes.len();
        self.nodes.push(Node {
            pointer: self.pointer(value),
            units: 1,
            ..Node::default()
        });
        self.index.insert(key, id);
        self.pending.push(Found {
            value,
            depth,
            resolver: resolver.clone(),
        });
        id
    }

    fn pointer(&self, value: &Value) -> String {
        self.pointers
            .get(&address(value))
            .cloned()
            .unwrap_or_else(|| "?".to_owned())
    }

    /// Reads one subschema's keywords into its node's edges.
    fn read(&mut self, found: Found<'r>) -> Result<(), Refusal> {
        let at = self.index[&address(found.value)];
        let pointer = self.nodes[at].pointer.clone();
        if found.depth > MAX_DEPTH {
            return Err(Refusal::new(
                &pointer,
                format!(
                    "subschemas nest more than {MAX_DEPTH} deep here; flatten the schema (parts under `$defs`, used by `$ref`)"
                ),
                Some(MAX_DEPTH as u64),
            ));
        }
        let Value::Object(map) = found.value else {
            return Ok(());
        };
        let resolver = match map.get("$id") {
            Some(Value::String(_)) if at != 0 => found
                .resolver
                .in_subresource(self.draft.create_resource_ref(found.value))
                .map_err(|e| {
                    Refusal::unreadable(&pointer, format!("its `$id` does not resolve: {e}"))
                })?,
            _ => found.resolver,
        };
        let depth = found.depth + 1;
        let mut in_place = Vec::new();
        let mut into = Parts::default();
        let mut units = 1u64;
        let mut string_rules = 0u64;
        for (keyword, value) in map {
            let keyword = keyword.as_str();
            match value {
                Value::String(reference) if REFERENCES.contains(&keyword) => {
                    self.refs += 1;
                    if self.refs > MAX_REFS {
                        return Err(Refusal::new(
                            &format!("{pointer}/{keyword}"),
                            format!("the schema has more than {MAX_REFS} `$ref`s"),
                            Some(MAX_REFS as u64),
                        ));
                    }
                    let reference = if keyword == "$recursiveRef" {
                        "#"
                    } else {
                        reference.as_str()
                    };
                    let resolved = resolver.lookup(reference).map_err(|e| {
                        Refusal::unreadable(
                            &format!("{pointer}/{keyword}"),
                            format!("`{reference}` does not resolve: {e}"),
                        )
                    })?;
                    let (target, target_resolver, _) = resolved.into_inner();
                    let to = self.node(target, depth, &target_resolver);
                    in_place.push(Edge {
                        to,
                        reference: true,
                    });
                }
                _ if IN_PLACE_ONE.contains(&keyword) => {
                    let to = self.node(value, depth, &resolver);
                    in_place.push(Edge {
                        to,
                        reference: false,
                    });
                }
                Value::Array(list) if IN_PLACE_LIST.contains(&keyword) => {
                    for item in list {
                        let to = self.node(item, depth, &resolver);
                        in_place.push(Edge {
                            to,
                            reference: false,
                        });
                    }
                }
                Value::Object(named) if IN_PLACE_MAP.contains(&keyword) => {
                    // `dependencies` also takes lists of names: no subschema.
                    for item in named.values().filter(|v| v.is_object() || v.is_boolean()) {
                        let to = self.node(item, depth, &resolver);
                        in_place.push(Edge {
                            to,
                            reference: false,
                        });
                    }
                }
                Value::Object(named) if DEFINITIONS.contains(&keyword) => {
                    for item in named.values() {
                        self.node(item, depth, &resolver);
                    }
                }
                Value::Object(named) if keyword == "properties" => {
                    for (name, item) in named {
                        let to = self.node(item, depth, &resolver);
                        into.properties.insert(name.clone(), to);
                    }
                }
                Value::Object(named) if keyword == "patternProperties" => {
                    for (pattern, item) in named {
                        let key = pattern.replace('~', "~0").replace('/', "~1");
                        self.count_pattern(format!("{pointer}/patternProperties/{key}"), pattern)?;
                        units = units.saturating_add(PATTERN_UNITS);
                        let to = self.node(item, depth, &resolver);
                        into.members.push(to);
                    }
                }
                Value::String(pattern) if keyword == "pattern" => {
                    self.count_pattern(format!("{pointer}/pattern"), pattern)?;
                    units = units.saturating_add(PATTERN_UNITS);
                    string_rules += 1;
                }
                Value::String(_) if keyword == "format" => string_rules += 1,
                _ if MEMBERS.contains(&keyword) => {
                    let to = self.node(value, depth, &resolver);
                    into.members.push(to);
                }
                _ if keyword == "propertyNames" => {
                    let to = self.node(value, depth, &resolver);
                    into.names.push(to);
                }
                Value::Array(list) if keyword == "prefixItems" || keyword == "items" => {
                    for item in list {
                        let to = self.node(item, depth, &resolver);
                        into.prefix.push(to);
                    }
                }
                _ if keyword == "items" || ITEMS.contains(&keyword) => {
                    let to = self.node(value, depth, &resolver);
                    into.items.push(to);
                }
                _ => {}
            }
        }
        let node = &mut self.nodes[at];
        node.units = units;
        node.string_rules = string_rules;
        node.in_place = in_place;
        node.into = into;
        node.twice =
            map.contains_key("unevaluatedProperties") || map.contains_key("unevaluatedItems");
        Ok(())
    }

    fn count_pattern(&mut self, pointer: String, pattern: &str) -> Result<(), Refusal> {
        if self.patterns.len() == MAX_PATTERNS {
            return Err(Refusal::new(
                &pointer,
                format!(
                    "the schema has more than {MAX_PATTERNS} patterns (`pattern`, `patternProperties`)"
                ),
                Some(MAX_PATTERNS as u64),
            ));
        }
        self.patterns.push((pointer, pattern.to_owned()));
        Ok(())
    }
}

impl Shape {
    /// Reads and weighs `schema` (one that compiles), its references
    /// resolved as `jsonschema` resolves them (`retriever` answers those
    /// outside it), or says where it costs too much.
    pub(crate) fn of(
        schema: &Value,
        retriever: impl referencing::Retrieve + 'static,
    ) -> Result<Shape, Refusal> {
        let draft = Draft::Draft202012;
        let base = schema
            .get("$id")
            .and_then(Value::as_str)
            .unwrap_or("json-schema:///")
            .to_owned();
        let unresolved = |e: referencing::Error| {
            Refusal::unreadable("", format!("its references do not resolve: {e}"))
        };
        let registry = Registry::options()
            .draft(draft)
            .retriever(retriever)
            .build([(base.as_str(), draft.create_resource(schema.clone()))])
            .map_err(unresolved)?;
        let resolver = registry.try_resolver(&base).map_err(unresolved)?;
        let root = resolver.lookup("#").map_err(unresolved)?;
        let (document, root_resolver, _) = root.into_inner();
        let mut reader = Reader {
            draft,
            pointers: pointers_of(document),
            nodes: Vec::new(),
            index: HashMap::new(),
            pending: Vec::new(),
            refs: 0,
            patterns: Vec::new(),
        };
        reader.node(document, 0, &root_resolver);
        while let Some(found) = reader.pending.pop() {
            reader.read(found)?;
        }
        let nodes = reader.nodes;
        stays_on_no_value(&nodes)?;
        let (expanded, recursive) = expand(&nodes)?;
        Ok(Shape {
            nodes,
            expanded,
            recursive,
            patterns: reader.patterns,
        })
    }

    /// Each pattern of the schema (`pattern`, the keys of
    /// `patternProperties`) with where it is, to be compiled on its own.
    pub(crate) fn patterns(&self) -> &[(String, String)] {
        &self.patterns
    }

    /// What the whole schema expands to through its `$ref`s (at most
    /// [`MAX_EXPANDED`]).
    pub(crate) fn expanded_size(&self) -> u64 {
        self.expanded.first().copied().unwrap_or(0)
    }

    /// Whether a `$ref` leads back to a schema enclosing it: the validator
    /// then compiles, as bodies reach them, parts that depend on the body,
    /// so it is compiled for each body rather than kept.
    pub(crate) fn is_recursive(&self) -> bool {
        self.recursive
    }

    /// The units of work checking `body` takes, counted up to `budget`:
    /// `Err` with the count so far once it is passed (the walk stops
    /// there, so it costs at most about `budget` steps itself).
    pub(crate) fn check_cost(&self, body: &Value, budget: u64) -> Result<u64, u64> {
        let mut walk = Walk {
            spent: 0,
            budget,
            stack: Vec::new(),
        };
        walk.visit(0, body)?;
        while let Some((at, value)) = walk.stack.pop() {
            let node = &self.nodes[at];
            if let Value::String(text) = value {
                walk.spend(node.string_rules * (text.len() as u64 / 256))?;
            }
            for edge in &node.in_place {
                if edge.reference && self.recursive {
                    // A lazy node compiles its target the first time a
                    // body reaches it: counted every time, to be sure.
                    walk.spend(self.expanded[edge.to])?;
                }
                walk.visit(edge.to, value)?;
            }
            let times = if node.twice { 2 } else { 1 };
            for _ in 0..times {
                match value {
                    Value::Object(members) => {
                        for (name, member) in members {
                            if let Some(&to) = node.into.properties.get(name) {
                                walk.visit(to, member)?;
                            }
                            for &to in &node.into.members {
                                walk.visit(to, member)?;
                            }
                            for &to in &node.into.names {
                                // A name is a string, checked by the
                                // subschema and all it applies in place.
                                let rules = self.nodes[to].string_rules;
                                walk.spend(self.expanded[to] + rules * (name.len() as u64 / 256))?;
                            }
                        }
                    }
                    Value::Array(items) => {
                        for (i, item) in items.iter().enumerate() {
                            if let Some(&to) = node.into.prefix.get(i) {
                                walk.visit(to, item)?;
                            }
                            for &to in &node.into.items {
                                walk.visit(to, item)?;
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(walk.spent)
    }
}

/// A body's walk by [`Shape::check_cost`]: the pairs still to visit and
/// the units spent, each pair counted as it is queued.
struct Walk<'b> {
    spent: u64,
    budget: u64,
    stack: Vec<(usize, &'b Value)>,
}

impl<'b> Walk<'b> {
    fn spend(&mut self, units: u64) -> Result<(), u64> {
        self.spent = self.spent.saturating_add(units);
        if self.spent > self.budget {
            return Err(self.spent);
        }
        Ok(())
    }

    fn visit(&mut self, node: usize, value: &'b Value) -> Result<(), u64> {
        self.spend(1)?;
        self.stack.push((node, value));
        Ok(())
    }
}

/// Refuses a cycle of subschemas in place: a `$ref` that leads back to a
/// schema applied to the same value, whose check would never end.
fn stays_on_no_value(nodes: &[Node]) -> Result<(), Refusal> {
    // Depth-first over the edges in place, without recursion: 0 unseen, 1
    // on the path, 2 done.
    let mut state = vec![0u8; nodes.len()];
    for start in 0..nodes.len() {
        if state[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        state[start] = 1;
        while let Some((at, next)) = path.last_mut() {
            let at = *at;
            match nodes[at].in_place.get(*next) {
                Some(edge) => {
                    *next += 1;
                    match state[edge.to] {
                        0 => {
                            state[edge.to] = 1;
                            path.push((edge.to, 0));
                        }
                        1 => {
                            return Err(Refusal::new(
                                &nodes[at].pointer,
                                format!(
                                    "this subschema leads back to `{}` through `$ref`s applied to the same value, so checking a body would never end; a `$ref` back to an enclosing schema must go through a part of the body (`properties`, `items`, …)",
                                    display(&nodes[edge.to].pointer)
                                ),
                                None,
                            ));
                        }
                        _ => {}
                    }
                }
                None => {
                    state[at] = 2;
                    path.pop();
                }
            }
        }
    }
    Ok(())
}

/// Each node's expanded size and the longest chain below it, by memoized
/// depth-first search over every edge (saturating, expanding nothing); an
/// edge back to a node on the path (a `$ref` to an enclosing schema, which
/// compiles to a lazy node) counts one. Refuses the first node, deepest
/// first, whose expansion or chain passes its limit.
fn expand(nodes: &[Node]) -> Result<(Vec<u64>, bool), Refusal> {
    let mut size = vec![0u64; nodes.len()];
    let mut chain = vec![0u64; nodes.len()];
    let mut state = vec![0u8; nodes.len()];
    let mut recursive = false;
    let edges = |node: &Node| -> Vec<usize> {
        let into: Vec<usize> = node.into.all().collect();
        let mut all: Vec<usize> = node.in_place.iter().map(|e| e.to).collect();
        all.extend(&into);
        if node.twice {
            // Compiled once more by `unevaluated*`.
            all.extend(node.in_place.iter().map(|e| e.to));
            all.extend(&into);
        }
        all
    };
    let mut path: Vec<(usize, Vec<usize>, usize)> = vec![(0, edges(&nodes[0]), 0)];
    state[0] = 1;
    while let Some((at, children, next)) = path.last_mut() {
        let at = *at;
        if let Some(&to) = children.get(*next) {
            *next += 1;
            match state[to] {
                0 => {
                    state[to] = 1;
                    path.push((to, edges(&nodes[to]), 0));
                }
                1 => recursive = true,
                _ => {}
            }
            continue;
        }
        let children = std::mem::take(children);
        path.pop();
        let node = &nodes[at];
        let mut total = node.units;
        let mut longest = 0u64;
        for to in children {
            let (s, c) = if state[to] == 1 {
                (1, 1)
            } else {
                (size[to], chain[to])
            };
            total = total.saturating_add(s);
            longest = longest.max(c);
        }
        state[at] = 2;
        size[at] = total;
        chain[at] = longest.saturating_add(1);
        if total > MAX_EXPANDED {
            return Err(Refusal::new(
                &node.pointer,
                format!(
                    "this subschema expands to {} units through its `$ref`s (each counts as a copy of what it names; a subschema is one unit, a pattern {PATTERN_UNITS}); a schema may expand to at most {MAX_EXPANDED}",
                    shown(total)
                ),
                Some(MAX_EXPANDED),
            ));
        }
        if chain[at] > MAX_CHAIN {
            return Err(Refusal::new(
                &node.pointer,
                format!(
                    "subschemas apply here one within another more than {MAX_CHAIN} deep through `$ref`s; flatten the schema"
                ),
                Some(MAX_CHAIN),
            ));
        }
    }
    Ok((size, recursive))
}

fn shown(n: u64) -> String {
    if n == u64::MAX {
        "more than 18 quintillion".to_owned()
    } else {
        n.to_string()
    }
}

/// A JSON pointer as a message shows it: `/` for the whole schema.
pub(crate) fn display(pointer: &str) -> &str {
    if pointer.is_empty() { "/" } else { pointer }
}

/// The identity of a value of the registry's document: its address, stable
/// while the registry holds the document.
fn address(value: &Value) -> usize {
    std::ptr::from_ref(value) as usize
}

/// Every value of `document` by its address, with its JSON pointer.
fn pointers_of(document: &Value) -> HashMap<usize, String> {
    let mut found = HashMap::new();
    let mut stack = vec![(document, String::new())];
    while let Some((value, pointer)) = stack.pop() {
        match value {
            Value::Object(map) => {
                for (key, item) in map {
                    let key = key.replace('~', "~0").replace('/', "~1");
                    stack.push((item, format!("{pointer}/{key}")));
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    stack.push((item, format!("{pointer}/{i}")));
                }
            }
            _ => {}
        }
        found.insert(address(value), pointer);
    }
    found
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    fn shape(schema: &Value) -> Result<Shape, Refusal> {
        Shape::of(schema, super::super::Whole)
    }

    /// A hostile schema: each of `levels` definitions refers twice to the
    /// one before, so the root expands to about `2^levels` subschemas.
    pub(crate) fn doubling(levels: usize) -> Value {
        let mut defs = serde_json::Map::new();
        defs.insert("d_0".into(), json!({ "type": "object" }));
        for i in 1..=levels {
            let before = format!("#/$defs/d_{}", i - 1);
            defs.insert(
                format!("d_{i}"),
                json!({ "allOf": [{ "$ref": before }, { "$ref": before }] }),
            );
        }
        json!({ "$defs": defs, "$ref": format!("#/$defs/d_{levels}") })
    }

    #[test]
    fn doubling_definitions_are_refused_at_the_first_that_passes_the_limit() {
        let schema = doubling(20);
        assert!(
            serde_json::to_vec(&schema).unwrap().len() < 2048,
            "a small schema"
        );
        let refused = shape(&schema).unwrap_err();
        assert_eq!(refused.limit, Some(MAX_EXPANDED));
        // d_i is itself and two subschemas naming d_(i-1): 4·2^i - 3
        // units. d_12 (16,381) is the first past the limit.
        assert_eq!(refused.path, "/$defs/d_12", "{refused:?}");
        assert!(refused.message.contains("16381"), "{}", refused.message);
        assert!(refused.message.contains("10000"), "{}", refused.message);
        // Eleven levels are within it.
        let kept = shape(&doubling(11)).unwrap();
        assert!(!kept.is_recursive());
        // 120 levels (2^120 copies): saturating, and still named at d_12;
        // past 128 levels, its `$ref`s are too many before anything else.
        assert_eq!(shape(&doubling(120)).unwrap_err().path, "/$defs/d_12");
        assert_eq!(
            shape(&doubling(200)).unwrap_err().limit,
            Some(MAX_REFS as u64)
        );
    }

    #[test]
    fn a_tree_by_a_reference_to_the_root_is_kept_and_its_cost_follows_the_body() {
        let tree = json!({
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": { "type": "string" },
                "children": { "type": "array", "items": { "$ref": "#" } }
            }
        });
        let shape = shape(&tree).unwrap();
        assert!(shape.is_recursive());
        let leaf = json!({ "name": "leaf" });
        let mut body = leaf.clone();
        for _ in 0..20 {
            body = json!({ "name": "n", "children": [body, leaf] });
        }
        let small = shape.check_cost(&leaf, MAX_CHECK_UNITS).unwrap();
        let deep = shape.check_cost(&body, MAX_CHECK_UNITS).unwrap();
        assert!(small < deep && deep < 10_000, "{small} {deep}");
    }

    #[test]
    fn a_recursion_that_doubles_at_each_level_of_the_body_is_stopped_at_the_budget() {
        // Two ways into each item, back to the root: 2^depth pairs.
        let schema = json!({ "allOf": [
            { "items": { "$ref": "#" } },
            { "items": { "$ref": "#" } }
        ] });
        let shape = shape(&schema).unwrap();
        let mut body = json!([]);
        for _ in 0..40 {
            body = json!([body]);
        }
        let spent = shape.check_cost(&body, MAX_CHECK_UNITS).unwrap_err();
        assert!(
            spent > MAX_CHECK_UNITS && spent < 2 * MAX_CHECK_UNITS,
            "{spent}"
        );
        let mut shallow = json!([]);
        for _ in 0..5 {
            shallow = json!([shallow]);
        }
        assert!(shape.check_cost(&shallow, MAX_CHECK_UNITS).is_ok());
    }

    #[test]
    fn a_cycle_on_one_value_is_refused_naming_where() {
        let schema = json!({
            "$defs": {
                "a": { "allOf": [{ "$ref": "#/$defs/b" }] },
                "b": { "anyOf": [{ "type": "string" }, { "$ref": "#/$defs/a" }] }
            },
            "$ref": "#/$defs/a"
        });
        let refused = shape(&schema).unwrap_err();
        assert!(refused.message.contains("never end"), "{}", refused.message);
        assert!(refused.path.starts_with("/$defs/"), "{refused:?}");
    }

    #[test]
    fn nested_unevaluated_properties_count_twice_at_each_level() {
        let mut schema = json!({ "type": "string" });
        for _ in 0..16 {
            schema = json!({
                "properties": { "a": schema },
                "allOf": [{ "properties": { "b": { "type": "string" } } }],
                "unevaluatedProperties": false
            });
        }
        let refused = shape(&schema).unwrap_err();
        assert_eq!(refused.limit, Some(MAX_EXPANDED), "{refused:?}");
    }

    #[test]
    fn depth_references_and_patterns_are_bounded() {
        let mut deep = json!({});
        for _ in 0..40 {
            deep = json!({ "properties": { "a": deep } });
        }
        assert_eq!(shape(&deep).unwrap_err().limit, Some(MAX_DEPTH as u64));

        let refs: serde_json::Map<String, Value> = (0..300)
            .map(|i| (format!("p{i}"), json!({ "$ref": "#/$defs/x" })))
            .collect();
        let many = json!({ "$defs": { "x": { "type": "string" } }, "properties": refs });
        assert_eq!(shape(&many).unwrap_err().limit, Some(MAX_REFS as u64));

        let patterns: serde_json::Map<String, Value> = (0..200)
            .map(|i| (format!("p{i}"), json!({ "pattern": format!("^{i}") })))
            .collect();
        let many = json!({ "properties": patterns });
        assert_eq!(shape(&many).unwrap_err().limit, Some(MAX_PATTERNS as u64));
    }

    #[test]
    fn a_chain_of_references_is_bounded() {
        let mut defs = serde_json::Map::new();
        defs.insert("d_0".into(), json!({ "type": "string" }));
        for i in 1..200 {
            defs.insert(
                format!("d_{i}"),
                json!({ "$ref": format!("#/$defs/d_{}", i - 1) }),
            );
        }
        let schema = json!({ "$defs": defs, "$ref": "#/$defs/d_199" });
        let refused = shape(&schema).unwrap_err();
        assert_eq!(refused.limit, Some(MAX_CHAIN), "{refused:?}");
    }

    #[test]
    fn properties_items_and_names_are_walked_only_where_the_body_has_them() {
        let schema = json!({
            "properties": { "a": { "type": "string" } },
            "patternProperties": { "^x": { "type": "integer" } },
            "items": { "type": "integer" },
            "propertyNames": { "maxLength": 3 }
        });
        let shape = shape(&schema).unwrap();
        let cost = |body: Value| shape.check_cost(&body, MAX_CHECK_UNITS).unwrap();
        assert_eq!(cost(json!(1)), 1);
        // The root, `a`, the pattern's subschema for each member.
        let object = cost(json!({ "a": "x", "b": 1 }));
        assert!(object > cost(json!({ "a": "x" })), "{object}");
        let array: Vec<Value> = (0..1000).map(|i| json!(i)).collect();
        assert_eq!(cost(Value::Array(array)), 1001);
    }
}
