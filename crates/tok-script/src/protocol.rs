//! The wire format between a [`ScriptPool`](crate::ScriptPool) and its
//! sandbox children: one JSON object per line, a request on the child's
//! stdin and exactly one response on its stdout.
//!
//! Lines keep framing trivial (JSON never contains a raw newline), and
//! serde keeps both sides of the pipe in one place so they cannot drift.
//! The input travels as JSON *text* so that the child hands it to QuickJS's
//! own parser without first building (and depth-limiting) a Rust value.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One script to run, as the child reads it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Request {
    /// JavaScript defining `function main(input)`.
    pub(crate) source: String,
    /// The input as JSON text.
    pub(crate) input: String,
    /// When the interrupt handler stops the script.
    pub(crate) timeout_ms: u64,
    /// QuickJS heap limit for this script, in bytes.
    pub(crate) memory_limit: usize,
    /// Compiled `main` functions (and their contexts) are reused by key;
    /// the key names one tenant's source, so no two tenants share a context.
    pub(crate) cache_key: String,
    /// A context is dropped and the source compiled again after this many
    /// runs, so state a script leaves on `globalThis` cannot grow forever.
    pub(crate) recycle_after: u32,
    /// Largest serialized output accepted.
    pub(crate) max_output_bytes: usize,
}

/// The child's answer to one [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Response {
    #[serde(flatten)]
    pub(crate) outcome: Outcome,
    /// Lines the script passed to `console.log`, capped.
    #[serde(default)]
    pub(crate) logs: Vec<String>,
}

/// `{"ok": {...}}` or `{"error": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    Ok(Map<String, Value>),
    Error(Failure),
}

/// Why a script produced no output, as the child saw it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Failure {
    pub(crate) kind: FailureKind,
    pub(crate) message: String,
    /// Line in the script's source, when the error carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) line: Option<u32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FailureKind {
    /// The script threw, did not compile, or does not define `main`.
    Script,
    /// The interrupt handler stopped it at its deadline.
    Timeout,
    /// It reached the memory limit.
    Memory,
    /// `main` returned something that is not a JSON object.
    InvalidOutput,
    /// The request itself could not be read (a bug on the pool's side).
    Protocol,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn responses_have_the_documented_shape() {
        let ok = Response {
            outcome: Outcome::Ok(json!({"total": 3}).as_object().unwrap().clone()),
            logs: vec!["hello".into()],
        };
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            json!({"ok": {"total": 3}, "logs": ["hello"]})
        );
        let error = Response {
            outcome: Outcome::Error(Failure {
                kind: FailureKind::InvalidOutput,
                message: "m".into(),
                line: Some(3),
            }),
            logs: vec![],
        };
        let text = serde_json::to_string(&error).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({"error": {"kind": "invalid_output", "message": "m", "line": 3}, "logs": []})
        );
        assert_eq!(serde_json::from_str::<Response>(&text).unwrap(), error);
    }
}
