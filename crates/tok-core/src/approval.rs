//! The `approval` step (DESIGN §5a, approvals): a run waits for a person's
//! decision.
//!
//! The step runs in two parts, both through the one decider. First the
//! engine's executor runs it in the record transaction: it resolves the
//! approvers (a group's members or a list of members; none fails the step
//! with `no_approvers`, terminal) and opens the approval, whose id it
//! returns. Then the decider parks the run on a wait for the decision —
//! a signal wait on the approval's own key ([`decision_key`]), which only
//! `POST /api/approvals/{id}` sends — with the step's `timeout`. The
//! decision resumes the wait and becomes the step's outputs
//! ([`decided`]); a timeout completes it with `{timedOut: true}`.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::definition::Step;
use crate::duration::parse_duration;
use crate::run::SignalWait;

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

/// The wait a finished `approval` step parks on: the decision on the
/// approval it opened (`outputs.approvalId`), until its `timeout`.
pub fn awaited_decision(
    step: &Step,
    config: Option<&Value>,
    outputs: &Map<String, Value>,
    now: Timestamp,
) -> Option<SignalWait> {
    if step.kind != APPROVAL {
        return None;
    }
    let id = outputs.get("approvalId")?.as_str()?;
    let due_at = timeout(config.unwrap_or(&step.config))
        .ok()
        .flatten()
        .map(|t| now.as_millisecond().saturating_add(t.as_millis() as i64));
    Some(SignalWait {
        key: decision_key(id),
        lookback: false,
        due_at,
        ..SignalWait::default()
    })
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
