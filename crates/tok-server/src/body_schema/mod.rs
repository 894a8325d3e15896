//! A source's JSON Schema (`schema`, draft 2020-12): compiled once when the
//! source is saved (a schema that does not compile is a 400 naming where)
//! and again when the webhook caches the source, then checked against each
//! body at ingest, after the signature and before the params contract. A
//! body that fails is a 400 listing each failing place and rule.
//!
//! A tenant writes the schema and anyone with the URL writes the bodies,
//! so both are bounded: the schema's size, no `$ref` fetched from outside
//! it (nothing is read from the network or the disk), patterns compiled
//! by the `regex` engine (linear in the body, no backtracking) within a
//! size, and at most [`MAX_LISTED`] failures listed. What a schema costs
//! through its `$ref`s is weighed before it is kept, and what a body's
//! check costs before it runs ([`cost`]); a check that may take more than
//! a moment runs on a blocking thread, at most one per core at once, never
//! on the threads that serve requests.

mod cost;

use std::sync::{Arc, OnceLock};

use jsonschema::{PatternOptions, Retrieve, Uri, Validator};
use serde_json::{Value, json};

use crate::error::ApiError;
use cost::MAX_CHECK_UNITS;
use cost::Shape;

/// Largest schema a source keeps, as compact JSON.
pub(crate) const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// Most failures one answer lists; the count of the rest is given.
pub(crate) const MAX_LISTED: usize = 20;

/// Largest compiled pattern of a schema, in bytes, and largest cache of
/// the lazy automaton that runs it.
pub(crate) const MAX_PATTERN_BYTES: usize = 128 * 1024;

/// Longest message of one failure (it may quote the body).
const MAX_MESSAGE_CHARS: usize = 300;

/// A check that may take more units than this ([`cost`]), counting what
/// its first check may compile of the schema's lazy `$ref`s, runs on a
/// blocking thread; a cheaper one (about a millisecond at most) where the
/// request is.
const INLINE_UNITS: u64 = 5_000;

/// Refuses every `$ref` outside the schema: a tenant's schema must not
/// make tok fetch a URL or read a file.
struct Whole;

impl Retrieve for Whole {
    fn retrieve(
        &self,
        uri: &Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!(
            "`{}` is not fetched: a source's schema must be whole, its parts under `$defs`",
            uri.as_str()
        )
        .into())
    }
}

/// A source's schema ready to check bodies: compiled and weighed.
pub(crate) struct Checker {
    schema: Value,
    validator: Validator,
    shape: Shape,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("schema", &self.schema)
            .finish()
    }
}

fn invalid(path: &str, message: String) -> ApiError {
    ApiError::bad_request("invalid_schema", message)
        .with("field", "schema")
        .with("path", path)
}

/// The validator of `schema`, with the options every source's schema is
/// compiled with; else where in it (a JSON pointer) it does not compile,
/// and why.
fn build(schema: &Value) -> Result<Validator, (String, String)> {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .with_retriever(Whole)
        .with_pattern_options(
            PatternOptions::regex()
                .size_limit(MAX_PATTERN_BYTES)
                .dfa_size_limit(MAX_PATTERN_BYTES),
        )
        .build(schema)
        .map_err(|e| (e.instance_path.as_str().to_owned(), clipped(&e.to_string())))
}

fn compiled(schema: &Value) -> Result<Validator, ApiError> {
    build(schema).map_err(|(at, why)| {
        invalid(
            &at,
            format!(
                "`schema` is not a JSON Schema (draft 2020-12) that compiles: at `{}`: {why}",
                cost::display(&at),
            ),
        )
    })
}

/// Compiles and weighs `schema`, or answers 400 `invalid_schema` naming
/// the place in it that does not compile or costs too much (`field`:
/// `schema`, `path`: a JSON pointer into it, `limit` when one is passed).
pub(crate) fn compile(schema: &Value) -> Result<Checker, ApiError> {
    let size = serde_json::to_vec(schema).map(|v| v.len()).unwrap_or(0);
    if size > MAX_SCHEMA_BYTES {
        return Err(ApiError::bad_request(
            "invalid_schema",
            format!("`schema` is {size} bytes; at most {MAX_SCHEMA_BYTES} are kept"),
        )
        .with("field", "schema")
        .with("path", "")
        .with("limit", MAX_SCHEMA_BYTES));
    }
    // Weighed before it is compiled: compiling some schemas (nested
    // `unevaluatedProperties`) already costs what they expand to.
    let shape = match Shape::of(schema, Whole) {
        Ok(shape) => shape,
        Err(refused) if refused.unreadable => {
            // The compiler refuses it too, and says better where.
            compiled(schema)?;
            return Err(invalid(
                &refused.path,
                format!(
                    "`schema` cannot be read at `{}`: {}",
                    cost::display(&refused.path),
                    refused.message
                ),
            ));
        }
        Err(refused) => {
            let mut error = invalid(
                &refused.path,
                format!(
                    "`schema` at `{}`: {}",
                    cost::display(&refused.path),
                    refused.message
                ),
            );
            if let Some(limit) = refused.limit {
                error = error.with("limit", limit);
            }
            return Err(error);
        }
    };
    // Each pattern on its own: one met only through a `$ref` compiled
    // lazily would otherwise first compile when a body reaches it.
    for (at, pattern) in shape.patterns() {
        build(&json!({ "pattern": pattern })).map_err(|(_, why)| {
            invalid(
                at,
                format!(
                    "`schema` has a pattern at `{at}` that does not compile within {MAX_PATTERN_BYTES} bytes \
                     (the `regex` crate's syntax: no look-around, no backreferences): {why}"
                ),
            )
        })?;
    }
    let validator = compiled(schema)?;
    Ok(Checker {
        schema: schema.clone(),
        validator,
        shape,
    })
}

/// At most one check per core at once on the blocking threads.
fn checks() -> &'static tokio::sync::Semaphore {
    static CHECKS: OnceLock<tokio::sync::Semaphore> = OnceLock::new();
    CHECKS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        tokio::sync::Semaphore::new(cores)
    })
}

impl Checker {
    /// Checks `body` ([`check`]) after weighing what it costs: a body whose
    /// check could take more than [`MAX_CHECK_UNITS`] is 400
    /// `schema_too_costly` without being checked. A check of more than a
    /// moment runs on a blocking thread (one per core at most), so request
    /// handling goes on meanwhile. Gives `body` back.
    pub(crate) async fn check(self: Arc<Self>, body: Value) -> (Value, Result<(), ApiError>) {
        let units = match self.shape.check_cost(&body, MAX_CHECK_UNITS) {
            Ok(units) => units,
            Err(_) => return (body, Err(too_costly())),
        };
        // A validator compiles its lazy `$ref`s at its first check: that
        // may be this one.
        if units.saturating_add(self.shape.expanded_size()) <= INLINE_UNITS
            && !self.shape.is_recursive()
        {
            let checked = check(&self.validator, &body);
            return (body, checked);
        }
        let Ok(_permit) = checks().acquire().await else {
            return (body, Err(too_costly()));
        };
        let work = tokio::task::spawn_blocking(move || {
            let checked = self.check_now(&body);
            (body, checked)
        });
        match work.await {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(error = %e, "a schema check panicked");
                let failed = ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "schema_check_failed",
                    "the body could not be checked against the source's schema; nothing was accepted",
                );
                (Value::Null, Err(failed))
            }
        }
    }

    /// The check itself. A schema with a `$ref` back to an enclosing
    /// schema compiles, as a body reaches them, parts that depend on the
    /// body: it is compiled afresh for each body, so that what one body
    /// made it compile is dropped with it rather than kept.
    pub(crate) fn check_now(&self, body: &Value) -> Result<(), ApiError> {
        if self.shape.is_recursive() {
            let fresh = compiled(&self.schema)?;
            return check(&fresh, body);
        }
        check(&self.validator, body)
    }
}

fn too_costly() -> ApiError {
    ApiError::bad_request(
        "schema_too_costly",
        format!(
            "checking the body against the source's schema could take more than {MAX_CHECK_UNITS} steps \
             (each value of the body, times the parts of the schema that apply to it), so it is not checked \
             and nothing is accepted; send a smaller body, or simplify the schema"
        ),
    )
    .with("limit", MAX_CHECK_UNITS)
}

/// Checks `body` against `schema`: `Ok` when it is valid, else 400
/// `schema_violation` with `errors: [{path, rule, schema_path, message}]`
/// (`path`: a JSON pointer into the body, `""` for the whole of it;
/// `rule`: the keyword that failed).
pub(crate) fn check(schema: &Validator, body: &Value) -> Result<(), ApiError> {
    let mut listed = Vec::new();
    let mut more = 0usize;
    for error in schema.iter_errors(body) {
        if listed.len() == MAX_LISTED {
            more += 1;
            continue;
        }
        let schema_path = error.schema_path.as_str().to_owned();
        let rule = schema_path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        listed.push(json!({
            "path": error.instance_path.as_str(),
            "rule": rule,
            "schema_path": schema_path,
            "message": clipped(&error.to_string()),
        }));
    }
    if listed.is_empty() {
        return Ok(());
    }
    let first = &listed[0];
    let place = match first["path"].as_str() {
        Some("") | None => "the body".to_owned(),
        Some(path) => format!("`{path}`"),
    };
    let total = listed.len() + more;
    Err(ApiError::bad_request(
        "schema_violation",
        format!(
            "the body does not meet the source's schema: {place} fails `{}` ({}){}",
            first["rule"].as_str().unwrap_or_default(),
            first["message"].as_str().unwrap_or_default(),
            if total > 1 {
                format!("; {total} failures in all, listed in `errors`")
            } else {
                String::new()
            }
        ),
    )
    .with("errors", Value::Array(listed))
    .with("more", more))
}

fn clipped(text: &str) -> String {
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order_schema() -> Value {
        json!({
            "type": "object",
            "required": ["id", "amount"],
            "properties": {
                "id": { "type": "string", "pattern": "^evt_" },
                "amount": { "type": "integer", "minimum": 1 },
                "items": { "type": "array", "items": { "$ref": "#/$defs/item" } }
            },
            "$defs": { "item": { "type": "object", "required": ["sku"] } }
        })
    }

    #[test]
    fn every_failing_place_is_listed_with_its_rule() {
        let schema = compile(&order_schema()).unwrap().validator;
        assert!(check(&schema, &json!({ "id": "evt_1", "amount": 5 })).is_ok());
        let error = check(
            &schema,
            &json!({ "id": "ch_1", "amount": 0, "items": [{ "sku": "a" }, {}] }),
        )
        .unwrap_err();
        assert_eq!(error.code, "schema_violation");
        let errors = error.extra["errors"].as_array().unwrap();
        let mut places: Vec<(String, String)> = errors
            .iter()
            .map(|e| {
                (
                    e["path"].as_str().unwrap().to_owned(),
                    e["rule"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        places.sort();
        assert_eq!(
            places,
            [
                ("/amount".to_owned(), "minimum".to_owned()),
                ("/id".to_owned(), "pattern".to_owned()),
                ("/items/1".to_owned(), "required".to_owned()),
            ]
        );
        let missing = check(&schema, &json!({})).unwrap_err();
        assert!(
            missing.message.contains("the body fails `required`"),
            "{}",
            missing.message
        );
    }

    #[test]
    fn a_schema_that_does_not_compile_says_where() {
        let error = compile(&json!({ "properties": { "a": { "type": "text" } } })).unwrap_err();
        assert_eq!(error.code, "invalid_schema");
        assert_eq!(error.extra["path"], "/properties/a/type");
        // Nothing is fetched from outside the schema.
        let remote = compile(&json!({ "$ref": "https://example.com/order.json" })).unwrap_err();
        assert!(remote.message.contains("not fetched"), "{}", remote.message);
        let file = compile(&json!({ "$ref": "file:///etc/passwd" })).unwrap_err();
        assert_eq!(file.code, "invalid_schema");
    }

    #[test]
    fn a_body_failing_everywhere_lists_a_bounded_number() {
        let schema = compile(&json!({ "additionalProperties": { "type": "string" } }))
            .unwrap()
            .validator;
        let body: serde_json::Map<String, Value> =
            (0..100).map(|i| (format!("k{i}"), json!(i))).collect();
        let error = check(&schema, &Value::Object(body)).unwrap_err();
        assert_eq!(error.extra["errors"].as_array().unwrap().len(), MAX_LISTED);
        assert_eq!(error.extra["more"], 100 - MAX_LISTED);
    }

    /// Resident memory of this process now (`VmRSS`), in KiB.
    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// What the costliest schema of doubling `$defs` that is kept (11
    /// levels of doubling `$defs`, 8,190 units) costs at its first check,
    /// and how fast the 20-level one is refused. A measurement: run with
    /// `cargo test -p tok-server --lib -- --ignored --nocapture
    /// what_the_costliest_kept_schema_costs`.
    #[test]
    #[ignore = "a measurement: prints time and memory"]
    fn what_the_costliest_kept_schema_costs() {
        let at = std::time::Instant::now();
        let refused = compile(&cost::tests::doubling(20)).unwrap_err();
        let refusal = at.elapsed();
        assert_eq!(refused.code, "invalid_schema");
        let before = rss_kib();
        let at = std::time::Instant::now();
        let kept = compile(&cost::tests::doubling(11)).unwrap();
        let compiled = at.elapsed();
        let at = std::time::Instant::now();
        assert!(kept.check_now(&json!({ "a": 1 })).is_ok());
        let checked = at.elapsed();
        let after = rss_kib();
        println!(
            "body_schema: the 20-level schema refused in {refusal:?}; the 11-level one compiled in \
             {compiled:?}, its first check (every lazy $ref compiled) in {checked:?}, \
             +{} KiB resident",
            after.saturating_sub(before)
        );
    }
}
