//! `emit`: raises a custom internal event (`event` triggers react to it),
//! written in the same transaction as the step's record. An event deeper in
//! a chain of automations than allowed is not written; the run goes on and
//! an alert is raised.

use serde_json::{Map, Value, json};
use tok_store::NewInternalEvent;

use super::{TxContext, TxResult, string, terminal};

/// Checks the step's config at save: an event name that is not one of
/// tok's own.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    super::need(config, "emit", "event", "the event's name")?;
    match config.get("event").and_then(Value::as_str) {
        Some(name) if name.starts_with("ticket.") || name.starts_with("run.") => Err(format!(
            "emit cannot send `{name}`: `ticket.` and `run.` events are tok's own"
        )),
        _ => Ok(()),
    }
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let event_type = string(config, "event")
        .ok_or_else(|| terminal(format!("step `{}`: `event` is empty", cx.step_id)))?;
    let payload = config.get("payload").cloned().unwrap_or_else(|| json!({}));
    let written = cx
        .tx
        .emit(
            NewInternalEvent {
                event_type,
                payload,
                subject_ticket_id: cx.subject.clone(),
            },
            cx.cause,
        )
        .await?;
    cx.too_deep |= written.too_deep;
    let mut out = Map::new();
    out.insert("eventId".into(), json!(written.event_id));
    Ok(out)
}
