//! `incident/create`: opens an incident for the tenant, or counts another
//! occurrence of the open one with the same `source` (by default the
//! automation and step).

use serde_json::{Map, Value, json};
use tok_store::NewIncident;

use super::{TxContext, TxResult, string, terminal};

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["title", "source", "impact", "detail"];

/// Checks the step's config at save.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    super::need(
        config,
        "incident/create",
        "title",
        "what happened, for the tenant",
    )
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let title = string(config, "title")
        .ok_or_else(|| terminal(format!("step `{}`: `title` is empty", cx.step_id)))?;
    let source = string(config, "source").unwrap_or_else(|| {
        let automation = cx
            .cause
            .automation_id
            .as_ref()
            .map(|a| a.as_str())
            .unwrap_or("");
        format!("{automation}:{}", cx.step_id)
    });
    // What every incident carries for the admin, whatever the step adds.
    let mut detail = Map::from_iter([
        (
            "automation".to_owned(),
            json!({ "id": cx.cause.automation_id }),
        ),
        ("run_id".to_owned(), json!(cx.cause.run_id)),
        (
            "step".to_owned(),
            json!({ "id": cx.step_id, "path": cx.path, "type": "incident/create" }),
        ),
        ("attempt".to_owned(), json!(cx.attempt)),
        ("error".to_owned(), Value::Null),
        (
            "input".to_owned(),
            cx.run_input.cloned().unwrap_or(Value::Null),
        ),
    ]);
    let base: Vec<String> = detail.keys().filter(|k| *k != "error").cloned().collect();
    match config.get("detail") {
        Some(Value::Null) | None => {}
        Some(Value::Object(map)) => {
            for (key, value) in map {
                if !base.contains(key) {
                    detail.insert(key.clone(), value.clone());
                }
            }
        }
        Some(other) => {
            detail.insert("message".into(), other.clone());
        }
    }
    let detail = Value::Object(detail);
    let (id, created) = cx
        .tx
        .open_incident(NewIncident {
            source,
            impact: string(config, "impact").unwrap_or_else(|| title.clone()),
            title,
            detail,
            run_id: cx.cause.run_id.clone(),
            ticket_id: cx.subject.clone(),
        })
        .await?;
    let mut out = Map::new();
    out.insert("incidentId".into(), json!(id));
    out.insert("created".into(), json!(created));
    Ok(out)
}
