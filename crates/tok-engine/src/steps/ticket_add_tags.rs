//! `ticket/add-tags`: adds tags to the subject ticket; existing tags stay.
//! Adding only tags it already has changes nothing and raises no event.

use serde_json::{Map, Value, json};
use tok_store::TicketWrite;

use super::{TxContext, TxResult, save, stamp, subject_ticket, terminal};

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["tags", "ticketId"];

/// Checks the step's config at save.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    super::need(config, "ticket/add-tags", "tags", "a list of tags")
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let wanted: Vec<String> = match config.get("tags") {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|t| t.as_str().map(str::trim))
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect(),
        Some(Value::String(one)) if !one.trim().is_empty() => vec![one.trim().to_owned()],
        _ => {
            return Err(terminal(format!(
                "step `{}`: `tags` must be a list of tags",
                cx.step_id
            )));
        }
    };
    let mut ticket = subject_ticket(cx, config).await?;
    let added: Vec<String> = wanted
        .into_iter()
        .filter(|t| !ticket.tags.contains(t))
        .fold(Vec::new(), |mut acc, t| {
            if !acc.contains(&t) {
                acc.push(t);
            }
            acc
        });
    if !added.is_empty() {
        ticket.tags.extend(added.iter().cloned());
        ticket.updated_at = stamp(ticket.updated_at);
        let trace = vec![format!(
            "Tags added: {} by {}",
            added.join(", "),
            cx.cause.actor
        )];
        let write = TicketWrite {
            ticket: ticket.clone(),
            created: false,
            changes: vec!["tags".into()],
            trace,
        };
        save(cx, write).await?;
    }
    let mut out = Map::new();
    out.insert("tags".into(), json!(ticket.tags));
    Ok(out)
}
