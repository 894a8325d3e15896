//! A source's JSON Schema (`schema`, draft 2020-12): compiled once when the
//! source is saved (a schema that does not compile is a 400 naming where)
//! and again when the webhook caches the source, then checked against each
//! body at ingest, after the signature and before the params contract. A
//! body that fails is a 400 listing each failing place and rule.
//!
//! A tenant writes the schema and anyone with the URL writes the bodies,
//! so both are bounded: the schema's size, no `$ref` fetched from outside
//! it (nothing is read from the network or the disk), patterns compiled
//! by the `regex` engine (linear in the body, no backtracking), and at
//! most [`MAX_LISTED`] failures listed.

use jsonschema::{PatternOptions, Retrieve, Uri, Validator};
use serde_json::{Value, json};

use crate::error::ApiError;

/// Largest schema a source keeps, as compact JSON.
pub(crate) const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// Most failures one answer lists; the count of the rest is given.
pub(crate) const MAX_LISTED: usize = 20;

/// Largest compiled pattern of a schema, in bytes.
const MAX_PATTERN_BYTES: usize = 1 << 20;

/// Longest message of one failure (it may quote the body).
const MAX_MESSAGE_CHARS: usize = 300;

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

/// Compiles `schema`, or answers 400 `invalid_schema` naming the place in
/// it that does not compile (`field`: `schema`, `path`: a JSON pointer).
pub(crate) fn compile(schema: &Value) -> Result<Validator, ApiError> {
    let size = serde_json::to_vec(schema).map(|v| v.len()).unwrap_or(0);
    if size > MAX_SCHEMA_BYTES {
        return Err(ApiError::bad_request(
            "invalid_schema",
            format!("`schema` is {size} bytes; at most {MAX_SCHEMA_BYTES} are kept"),
        )
        .with("field", "schema"));
    }
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .with_retriever(Whole)
        .with_pattern_options(PatternOptions::regex().size_limit(MAX_PATTERN_BYTES))
        .build(schema)
        .map_err(|e| {
            let at = e.instance_path.as_str();
            ApiError::bad_request(
                "invalid_schema",
                format!(
                    "`schema` is not a JSON Schema (draft 2020-12) that compiles: at `{}`: {}",
                    if at.is_empty() { "/" } else { at },
                    clipped(&e.to_string())
                ),
            )
            .with("field", "schema")
            .with("path", at)
        })
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
        let schema = compile(&order_schema()).unwrap();
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
        let schema = compile(&json!({ "additionalProperties": { "type": "string" } })).unwrap();
        let body: serde_json::Map<String, Value> =
            (0..100).map(|i| (format!("k{i}"), json!(i))).collect();
        let error = check(&schema, &Value::Object(body)).unwrap_err();
        assert_eq!(error.extra["errors"].as_array().unwrap().len(), MAX_LISTED);
        assert_eq!(error.extra["more"], 100 - MAX_LISTED);
    }
}
