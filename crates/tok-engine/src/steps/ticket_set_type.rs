//! `ticket/set-type`: gives the subject ticket a type. A status the new type
//! does not have becomes the new type's first status.

use serde_json::{Map, Value, json};
use tok_store::TicketWrite;

use super::{TxContext, TxResult, save, stamp, string, subject_ticket, terminal};

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["type", "ticketId"];

/// Checks the step's config at save.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    super::need(config, "ticket/set-type", "type", "a ticket type's name")
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let name = string(config, "type")
        .ok_or_else(|| terminal(format!("step `{}`: `type` is empty", cx.step_id)))?;
    let new_type = cx.tx.ticket_type(&name).await?.ok_or_else(|| {
        terminal(format!(
            "step `{}`: ticket type `{name}` does not exist",
            cx.step_id
        ))
    })?;
    let mut ticket = subject_ticket(cx, config).await?;
    let mut out = Map::new();
    out.insert("type".into(), json!(new_type.name));
    if ticket.type_id.as_deref() == Some(new_type.id.as_str()) {
        return Ok(out);
    }
    let mut changes = vec!["type".to_owned()];
    let mut trace = vec![format!(
        "Type set to {} by {}",
        new_type.name, cx.cause.actor
    )];
    ticket.type_id = Some(new_type.id.clone());
    ticket.type_name = Some(new_type.name.clone());
    if !ticket
        .status
        .as_ref()
        .is_some_and(|s| new_type.statuses.contains(s))
    {
        ticket.status = new_type.statuses.first().cloned();
        changes.push("status".into());
        if let Some(status) = &ticket.status {
            trace.push(format!(
                "Status set to {status} (the first of type {})",
                new_type.name
            ));
        }
    }
    ticket.updated_at = stamp(ticket.updated_at);
    save(
        cx,
        TicketWrite {
            ticket,
            created: false,
            changes,
            trace,
        },
    )
    .await?;
    Ok(out)
}
