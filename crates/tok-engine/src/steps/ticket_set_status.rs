//! `ticket/set-status`: sets the subject ticket's status, which must be one
//! of its type's statuses.

use serde_json::{Map, Value, json};
use tok_store::TicketWrite;

use super::{TxContext, TxResult, save, stamp, string, subject_ticket, terminal};

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["status", "ticketId"];

/// Checks the step's config at save.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    super::need(
        config,
        "ticket/set-status",
        "status",
        "one of the ticket type's statuses",
    )
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let status = string(config, "status")
        .ok_or_else(|| terminal(format!("step `{}`: `status` is empty", cx.step_id)))?;
    let mut ticket = subject_ticket(cx, config).await?;
    let type_id = ticket.type_id.clone().ok_or_else(|| {
        terminal(format!(
            "step `{}`: ticket {} has no type, so it has no statuses; give it one with ticket/set-type",
            cx.step_id, ticket.external_id
        ))
    })?;
    let ticket_type = cx.tx.ticket_type(&type_id).await?.ok_or_else(|| {
        terminal(format!(
            "step `{}`: the ticket's type no longer exists",
            cx.step_id
        ))
    })?;
    if !ticket_type.statuses.contains(&status) {
        return Err(terminal(format!(
            "step `{}`: status `{status}` is not allowed for type `{}`; allowed: {}",
            cx.step_id,
            ticket_type.name,
            ticket_type.statuses.join(", ")
        )));
    }
    if ticket.status.as_deref() != Some(status.as_str()) {
        ticket.status = Some(status.clone());
        ticket.updated_at = stamp(ticket.updated_at);
        let trace = vec![format!("Status set to {status} by {}", cx.cause.actor)];
        save(
            cx,
            TicketWrite {
                ticket,
                created: false,
                changes: vec!["status".into()],
                trace,
            },
        )
        .await?;
    }
    let mut out = Map::new();
    out.insert("status".into(), json!(status));
    Ok(out)
}
