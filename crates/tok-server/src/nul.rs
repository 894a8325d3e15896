//! U+0000 in what a client sends, refused in one place with a 400 that
//! names where it is.
//!
//! PostgreSQL cannot hold U+0000 in `text` or in a `jsonb` string (it fails
//! the statement, and a lookup by such a value fails rather than finding
//! nothing), while SQLite can: so that both backends answer alike and no
//! value of tok ever holds it, a request that sends it is refused before
//! any handler reads it:
//!
//! - in the query string, by [`refuse_in_query`], a layer around the whole
//!   router: `400 nul_in_query` naming the parameter (`param`), for every
//!   route, a route added later included;
//! - in a JSON body, by the body extractors every route takes its body
//!   through (`crate::routes::JsonBody`, `crate::routes::JsonBytes`), and by
//!   the webhook for its body: `400 nul_in_json` with the JSON pointer of
//!   the string or key (`path`);
//! - in a path segment, by the path extractor (`crate::routes::Path`): no
//!   id has it, so it is a 404 like an id that does not exist.
//!
//! A webhook's body is the sender's, not tok's, and could be stored on
//! SQLite; it is refused all the same (400, nothing stored), so that one
//! event is accepted on one backend exactly when it is on the other, and
//! an event once accepted is never altered: its sender is told and can
//! send the bytes encoded (base64).

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::error::ApiError;

/// Refuses a request whose query string has U+0000 (`%00`) in a
/// parameter's name or value: `400 nul_in_query`, `param` naming it.
pub(crate) async fn refuse_in_query(request: Request, next: Next) -> Response {
    if let Some(query) = request.uri().query()
        && let Some(param) = nul_param(query)
    {
        return ApiError::bad_request(
            "nul_in_query",
            format!(
                "the query parameter `{param}` has the character U+0000 (%00); no value tok keeps or looks for can hold it: remove it"
            ),
        )
        .with("param", param)
        .into_response();
    }
    next.run(request).await
}

/// The name of the first parameter of `query` whose name or value decodes
/// to text with U+0000. Only `%00` decodes to it: no other escape ends
/// in a `%` followed by `00`, and a raw NUL cannot be in a URI.
fn nul_param(query: &str) -> Option<String> {
    query
        .split('&')
        .find(|pair| pair.contains("%00"))
        .map(|pair| {
            let name = pair.split_once('=').map_or(pair, |(name, _)| name);
            shown(&decoded(name))
        })
}

/// A query string's part decoded (`+` is a space, `%XX` a byte), bytes
/// that are not UTF-8 shown as U+FFFD.
fn decoded(part: &str) -> String {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A parameter's name as a message shows it: without U+0000 and control
/// characters, and at most 64 characters.
fn shown(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
        .take(64)
        .collect();
    clean
}

/// Refuses JSON text (`what`: "the body") with U+0000 in a string or a
/// key: `400 nul_in_json`, `path` the JSON pointer of where. A JSON string
/// holds U+0000 only as the escape `\u0000`, so only a text that has one is
/// parsed to say where (`\\u0000`, an escaped backslash, is no such
/// character); a text that does not parse is left to the caller's parser
/// and its error.
pub(crate) fn refuse_in_json_text(what: &str, text: &[u8]) -> Result<(), ApiError> {
    const ESCAPE: &[u8] = b"\\u0000";
    if !text.windows(ESCAPE.len()).any(|w| w == ESCAPE) {
        return Ok(());
    }
    match serde_json::from_slice::<Value>(text) {
        Ok(value) => refuse_in_json(what, &value),
        Err(_) => Ok(()),
    }
}

/// Refuses a JSON value (`what`: "the body", "`input`") with U+0000 in a
/// string or a key: `400 nul_in_json` naming where (`path`).
pub(crate) fn refuse_in_json(what: &str, value: &Value) -> Result<(), ApiError> {
    match tok_store::storable::nul_at(value) {
        None => Ok(()),
        Some(pointer) => Err(ApiError::bad_request(
            "nul_in_json",
            tok_store::storable::nul_refused(what, &pointer).to_string(),
        )
        .with("path", pointer)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_with_nul_is_named() {
        assert_eq!(nul_param("action=%00"), Some("action".into()));
        assert_eq!(
            nul_param("limit=5&automation=a%00b"),
            Some("automation".into())
        );
        assert_eq!(nul_param("a%00b=1"), Some("a\u{FFFD}b".into()));
        assert_eq!(nul_param("event%5Bid%5D=%00"), Some("event[id]".into()));
        assert_eq!(
            nul_param("q=%2500&x=%0A0"),
            None,
            "a `%00` as text is not U+0000"
        );
        assert_eq!(nul_param("limit=5"), None);
    }

    #[test]
    fn json_text_is_refused_only_for_the_character_itself() {
        let refused = refuse_in_json_text("the body", br#"{"a": ["x", "b\u0000"]}"#).unwrap_err();
        assert_eq!(refused.code, "nul_in_json");
        assert_eq!(refused.extra["path"], "/a/1");
        assert!(refuse_in_json_text("the body", br#"{"a": "\\u0000 as text"}"#).is_ok());
        assert!(refuse_in_json_text("the body", br#"{"a": "plain"}"#).is_ok());
        // Not JSON: the caller's parser says why.
        assert!(refuse_in_json_text("the body", br#"{"a": "\u0000"#).is_ok());
        let key = refuse_in_json_text("the body", br#"{"k\u0000": 1}"#).unwrap_err();
        assert_eq!(key.extra["path"], "/k\u{0}");
    }
}
