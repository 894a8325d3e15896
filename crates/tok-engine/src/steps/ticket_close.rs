//! `ticket/close`: closes the subject ticket (queues and statistics count
//! open tickets). Its status stays what it was.

use serde_json::{Map, Value, json};
use tok_store::TicketWrite;

use super::{TxContext, TxResult, save, stamp, string, subject_ticket};

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["reason", "ticketId"];

/// Checks the step's config at save.
pub(crate) fn validate(_config: &Value) -> Result<(), String> {
    Ok(())
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let mut ticket = subject_ticket(cx, config).await?;
    if !ticket.closed {
        ticket.closed = true;
        ticket.updated_at = stamp(ticket.updated_at);
        let why = string(config, "reason")
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        let trace = vec![format!("Closed by {}{why}", cx.cause.actor)];
        save(
            cx,
            TicketWrite {
                ticket,
                created: false,
                changes: vec!["closed".into()],
                trace,
            },
        )
        .await?;
    }
    let mut out = Map::new();
    out.insert("closed".into(), json!(true));
    Ok(out)
}
