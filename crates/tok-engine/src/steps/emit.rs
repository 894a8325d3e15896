//! `emit`: raises a custom internal event (`event` triggers react to it)
//! and, with a `key`, signals the tenant's waits on that key with the same
//! payload (README.md, "Waiting for a signal") — with a `subject` (a ticket
//! id of the tenant, or `"ticket"`: the run's subject ticket), only the
//! waits about that ticket —, both written in the same transaction as the
//! step's record: the event exists and the waits are resumed (or the signal
//! is buffered) exactly when the step is recorded. An event deeper in a
//! chain of automations than allowed is not written; the run goes on and an
//! alert is raised.

use serde_json::{Map, Value, json};
use tok_store::{NewInternalEvent, NewSignal};

use tok_core::waits::{MAX_SUBJECT_BYTES, RUN_SUBJECT};

use super::{TxContext, TxError, TxResult, string, terminal};

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["event", "key", "subject", "payload"];

/// Checks the step's config at save: `event` raises an internal event,
/// `key` signals the waits on that key; a step may do both, and an event
/// name is not one of tok's own.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    if config.get("key").is_none() || config.get("event").is_some() {
        super::need(
            config,
            "emit",
            "event",
            "the event's name (or give `key` to only send a signal)",
        )?;
    }
    if config.get("key").is_some() {
        super::need(
            config,
            "emit",
            "key",
            "the signal key whose waits it resumes",
        )?;
    }
    match config.get("subject") {
        None | Some(Value::Null) => {}
        Some(_) if config.get("key").is_none() => {
            return Err(
                "emit's `subject` is the subject of its signal: give `key` too, or leave \
                 `subject` out"
                    .to_owned(),
            );
        }
        Some(Value::String(s)) if !s.trim().is_empty() => {}
        Some(other) => {
            return Err(format!(
                "emit's `subject` must be a ticket id or \"{RUN_SUBJECT}\" (the run's subject \
                 ticket), not {other}"
            ));
        }
    }
    match config.get("event").and_then(Value::as_str) {
        Some(name) if name.starts_with("ticket.") || name.starts_with("run.") => Err(format!(
            "emit cannot send `{name}`: `ticket.` and `run.` events are tok's own"
        )),
        _ => Ok(()),
    }
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let event_type = string(config, "event");
    let key = match config.get("key") {
        None | Some(Value::Null) => None,
        Some(_) => Some(string(config, "key").ok_or_else(|| {
            terminal(format!(
                "step `{}`: `key` is empty; it names the signal key whose waits the step resumes",
                cx.step_id
            ))
        })?),
    };
    if let Some(key) = key
        .as_deref()
        .filter(|k| tok_core::approval::is_decision_key(k))
    {
        return Err(terminal(format!(
            "step `{}`: `key` {key:?} is reserved for decisions on approvals",
            cx.step_id
        )));
    }
    if let Some(key) = key
        .as_deref()
        .filter(|k| tok_core::waits::is_reserved_key(k))
    {
        return Err(terminal(format!(
            "step `{}`: `key` {key:?} is reserved: keys beginning with `{}` are tok's own",
            cx.step_id,
            tok_core::waits::RESERVED_KEY_PREFIX
        )));
    }
    if event_type.is_none() && key.is_none() {
        return Err(terminal(format!(
            "step `{}`: `event` is empty and there is no `key`: nothing to emit",
            cx.step_id
        )));
    }
    let payload = config.get("payload").cloned().unwrap_or_else(|| json!({}));
    let mut out = Map::new();
    if let Some(key) = key {
        let subject = subject(cx, config).await?;
        let lookback_ms = i64::try_from(cx.signal_lookback.as_millis()).unwrap_or(i64::MAX);
        let sent = cx
            .tx
            .send_signal(NewSignal {
                key,
                subject,
                payload: payload.clone(),
                idempotency_key: None,
                lookback_ms,
                actor: cx
                    .cause
                    .run_id
                    .as_ref()
                    .map(|run| json!({ "kind": "run", "runId": run })),
            })
            .await?;
        out.insert("signalId".into(), json!(sent.signal_id));
        out.insert("resumed".into(), json!(sent.resumed));
        if let Some(subject) = sent.subject {
            out.insert("subject".into(), json!(subject));
        }
    }
    match event_type {
        Some(event_type) => {
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
            out.insert("eventId".into(), json!(written.event_id));
        }
        None => {
            out.insert("eventId".into(), Value::Null);
        }
    }
    Ok(out)
}

/// The ticket the step's signal is about: none without `subject`, the
/// run's subject ticket for `"ticket"`, else the ticket of that id, which
/// must be one of the tenant's (the record transaction reads only the
/// run's tenant's tickets, so another tenant's id is as unknown as a
/// made-up one).
async fn subject(cx: &mut TxContext<'_>, config: &Value) -> Result<Option<String>, TxError> {
    let id = match config.get("subject") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.trim() == RUN_SUBJECT => cx.subject.clone().ok_or_else(|| {
            terminal(format!(
                "step `{}` signals about the run's subject ticket (`\"subject\": \"{RUN_SUBJECT}\"`), \
                 but the run has no subject ticket: start it from a ticket's event or run \
                 `ticket/upsert` first",
                cx.step_id
            ))
        })?,
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_owned(),
        Some(other) => {
            return Err(terminal(format!(
                "step `{}`: `subject` must be a ticket id or \"{RUN_SUBJECT}\" (the run's subject \
                 ticket), not {other}",
                cx.step_id
            )));
        }
    };
    if id.len() > MAX_SUBJECT_BYTES {
        return Err(terminal(format!(
            "step `{}`: `subject` is {} bytes; a ticket id has at most {MAX_SUBJECT_BYTES}",
            cx.step_id,
            id.len()
        )));
    }
    if !cx.tx.ticket_exists(&id).await? {
        return Err(terminal(format!(
            "step `{}`: `subject` names ticket `{id}`, which does not exist",
            cx.step_id
        )));
    }
    Ok(Some(id))
}
