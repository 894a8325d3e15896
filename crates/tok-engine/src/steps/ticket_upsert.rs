//! `ticket/upsert`: creates the ticket with this external id, or attaches
//! the run to the existing one. Either way it becomes the run's subject.

use serde_json::{Map, Value, json};
use tok_core::ids::new_id;
use tok_store::{Ticket, TicketWrite};

use tok_store::now_ms;

use super::{TxContext, TxResult, save, string, terminal};

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["externalId", "type", "status", "title", "tags", "fields"];

/// Checks the step's config at save.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    super::need(
        config,
        "ticket/upsert",
        "externalId",
        "the id the sender knows the ticket by",
    )
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let external_id = string(config, "externalId")
        .ok_or_else(|| terminal(format!("step `{}`: `externalId` is empty", cx.step_id)))?;
    if let Some(existing) = cx.tx.ticket_by_external_id(&external_id).await? {
        cx.tx
            .trace(
                &existing.id,
                "attached",
                &format!("Event handled by {}", cx.cause.actor),
                cx.cause,
            )
            .await?;
        *cx.subject = Some(existing.id.clone());
        return Ok(outputs(&existing.id, false));
    }
    let ticket_type = match string(config, "type") {
        Some(name) => Some(cx.tx.ticket_type(&name).await?.ok_or_else(|| {
            terminal(format!(
                "step `{}`: ticket type `{name}` does not exist",
                cx.step_id
            ))
        })?),
        None => None,
    };
    let status = match (string(config, "status"), &ticket_type) {
        (Some(status), Some(t)) if !t.statuses.contains(&status) => {
            return Err(terminal(format!(
                "step `{}`: status `{status}` is not one of type `{}`'s statuses: {}",
                cx.step_id,
                t.name,
                t.statuses.join(", ")
            )));
        }
        (Some(status), _) => Some(status),
        (None, Some(t)) => t.statuses.first().cloned(),
        (None, None) => None,
    };
    let tags: Vec<String> = match config.get("tags") {
        Some(Value::Array(items)) => {
            let mut tags = Vec::new();
            for tag in items.iter().filter_map(Value::as_str) {
                if !tags.iter().any(|t| t == tag) {
                    tags.push(tag.to_owned());
                }
            }
            tags
        }
        _ => Vec::new(),
    };
    let fields = match config.get("fields") {
        Some(Value::Object(map)) => map.clone(),
        _ => Map::new(),
    };
    let now = now_ms();
    let ticket = Ticket {
        id: new_id("tkt"),
        external_id,
        type_id: ticket_type.as_ref().map(|t| t.id.clone()),
        type_name: ticket_type.as_ref().map(|t| t.name.clone()),
        title: string(config, "title"),
        status,
        closed: false,
        tags,
        fields,
        assignee_id: None,
        assignee_name: None,
        created_at: now,
        updated_at: now,
    };
    let id = ticket.id.clone();
    let trace = vec![format!("Created by {}", cx.cause.actor)];
    let changes = ["type", "status", "tags", "fields", "title"]
        .map(String::from)
        .to_vec();
    save(
        cx,
        TicketWrite {
            ticket,
            created: true,
            changes,
            trace,
        },
    )
    .await?;
    *cx.subject = Some(id.clone());
    Ok(outputs(&id, true))
}

fn outputs(id: &str, created: bool) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("ticketId".into(), json!(id));
    out.insert("created".into(), json!(created));
    out
}
