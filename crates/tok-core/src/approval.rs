//! The `approval` step (docs/workflows.md, "`approval`"): a run waits for a
//! person's decision.
//!
//! The step runs in two parts, on the way every step that runs and then
//! waits takes ([`crate::advance::custom`]). First the engine's executor
//! runs it in the record transaction: it resolves the approvers (a
//! group's members or a list of members; none fails the step with
//! `no_approvers`, terminal), opens the approval, and asks to wait for the
//! decision — a signal on the approval's own key ([`decision_key`]),
//! which only `POST /api/approvals/{id}` sends, sent after the wait began
//! — until the step's `timeout`, publishing the approval's id. The
//! decision resumes the wait and becomes the step's outputs ([`decided`]);
//! a timeout completes it with `{timedOut: true}`; escalations fire while
//! it waits, as on any wait.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::duration::parse_duration;

/// The step type that waits for a person's decision.
pub const APPROVAL: &str = "approval";

/// Signal keys under this prefix are decisions: only a decision sends
/// them (`POST /api/signals` and `emit` refuse them).
pub const DECISION_KEY_PREFIX: &str = "approval:";

/// The key the decision on approval `id` is signalled on.
pub fn decision_key(approval_id: &str) -> String {
    format!("{DECISION_KEY_PREFIX}{approval_id}")
}

/// Whether a signal key is reserved for decisions.
pub fn is_decision_key(key: &str) -> bool {
    key.starts_with(DECISION_KEY_PREFIX)
}

/// A `timeout` of an approval's config: `Ok(None)` without one.
pub fn timeout(config: &Value) -> Result<Option<Duration>, String> {
    match config.get("timeout") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => parse_duration(s)
            .map(Some)
            .map_err(|e| format!("approval `timeout`: {e}")),
        Some(other) => Err(format!(
            "approval `timeout` must be a duration such as \"3d\", not {other}"
        )),
    }
}

/// The step's outputs from the decision's payload: `{decision, by,
/// comment}` (and the approval's id).
pub fn decided(payload: &Value, approval_id: Option<&Value>) -> Map<String, Value> {
    let mut outputs = Map::new();
    for key in ["decision", "by", "comment"] {
        outputs.insert(key.into(), payload.get(key).cloned().unwrap_or(Value::Null));
    }
    if let Some(id) = approval_id {
        outputs.insert("approvalId".into(), id.clone());
    }
    outputs.insert("timedOut".into(), json!(false));
    outputs
}

/// The log line of a decision.
pub fn decided_line(payload: &Value) -> String {
    let decision = payload["decision"].as_str().unwrap_or("decided");
    let by = payload["by"]["name"]
        .as_str()
        .or(payload["by"]["id"].as_str())
        .unwrap_or("someone");
    match decision {
        "approve" => format!("approved by {by}"),
        "reject" => format!("rejected by {by}"),
        other => format!("{other} by {by}"),
    }
}
