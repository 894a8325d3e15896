//! `POST /webhook/{token}?dry_run=true`: a webhook checked like a real one
//! (signature, JSON, schema, contract), answered 200 with what would
//! happen instead of an event: the params the runs would start with and,
//! for each automation the source triggers, whether its filter holds and
//! why (one line per rule, as `tok_core::condition` logs them). Nothing is
//! written and nothing starts.
//!
//! The filter is evaluated over the context the dispatcher would give the
//! run ([`tok_engine::dispatch::plan::initial_context`]), so what the dry
//! run says is what the dispatch would decide for the filter; the start
//! controls (`flow`) decide later, over other events, and are named, not
//! played.

use serde_json::{Map, Value, json};
use tok_core::condition::Condition;
use tok_core::definition::{Automation, Match};
use tok_core::ids::EventId;
use tok_store::{AutomationStatus, PendingEvent};

use super::Signature;
use crate::AppState;
use crate::error::ApiResult;
use crate::intake::WebhookSource;

/// Most automations a dry run looks at: one source rarely triggers more.
const MAX_AUTOMATIONS: usize = 100;

/// How the signature was taken, as the answer says it.
fn signature_view(signature: &Signature) -> Value {
    match signature {
        Signature::Unsigned => json!({
            "preset": null,
            "checked": false,
            "note": "the source checks no sender's signature",
        }),
        Signature::Verified(preset, _) => json!({
            "preset": preset.as_str(),
            "checked": true,
            "note": "the sender's signature holds",
        }),
        Signature::NotChecked(preset) => json!({
            "preset": preset.as_str(),
            "checked": false,
            "note": format!(
                "asked with an API key of the source's tenant and without the sender's headers, so the {} signature was not checked; a sender's request always is",
                preset.as_str()
            ),
        }),
    }
}

/// The dry run of Slack's `url_verification`: the challenge a real one
/// answers, and no automation.
pub(super) fn challenged(cached: &WebhookSource, signature: &Signature, challenge: &str) -> Value {
    json!({
        "dry_run": true,
        "source": cached.source.name,
        "signature": signature_view(signature),
        "answer": { "challenge": challenge },
        "params": {},
        "automations": [],
        "would_start": 0,
        "note": "Slack's url_verification is answered with its challenge and starts nothing",
    })
}

/// What a webhook with `payload` would do: its params, its key, and each
/// automation of the source with whether it would start.
pub(super) async fn answer(
    state: &AppState,
    cached: &WebhookSource,
    signature: &Signature,
    payload: &Value,
    params: Map<String, Value>,
    idempotency_key: &str,
) -> ApiResult<Value> {
    let source = &cached.source;
    let event = PendingEvent {
        id: EventId::from("evt_dry_run"),
        tenant_id: source.tenant_id.clone(),
        source_id: Some(source.id.clone()),
        source_kind: "webhook".into(),
        payload: payload.clone(),
        params: Value::Object(params.clone()),
        depth: 0,
        cause_run_id: None,
        origin_automation_id: None,
        target_automation_id: None,
        event_type: None,
        subject_ticket_id: None,
        received_at: tok_store::now_ms(),
        traceparent: None,
    };
    let context = tok_engine::dispatch::plan::initial_context(&event).into_value();
    let rows = state.engine.store().automations(&source.tenant_id).await?;
    let mut automations = Vec::new();
    let mut would_start = 0;
    for row in rows
        .iter()
        .filter(|row| row.status != AutomationStatus::Archived)
        .filter(|row| triggered_by(&row.definition, source.id.as_str()))
        .take(MAX_AUTOMATIONS)
    {
        let Ok(automation) = serde_json::from_value::<Automation>(row.definition.clone()) else {
            automations.push(json!({
                "id": row.id, "name": row.name, "status": row.status.as_str(),
                "would_start": false, "filter": null,
                "why": "its definition does not parse; its run would fail with definition_invalid",
            }));
            continue;
        };
        let filter = automation.trigger.filter().map(|filter| {
            let evaluation = Condition::from_filter(filter).evaluate(&context);
            json!({
                "match": match filter.match_ { Match::All => "all", Match::Any => "any" },
                "holds": evaluation.result,
                "lines": evaluation.lines,
            })
        });
        let holds = filter
            .as_ref()
            .is_none_or(|f| f["holds"].as_bool() == Some(true));
        let active = row.status == AutomationStatus::Active;
        let why = match (active, &filter, holds) {
            (false, _, _) => "paused: it starts no run until it is resumed".to_owned(),
            (true, None, _) => "it has no filter: every event of the source starts it".to_owned(),
            (true, Some(_), true) => "its filter holds".to_owned(),
            (true, Some(_), false) => "its filter does not hold".to_owned(),
        };
        let mut shown = json!({
            "id": row.id,
            "name": row.name,
            "status": row.status.as_str(),
            "would_start": active && holds,
            "filter": filter,
            "why": why,
        });
        if let Some(control) = automation.flow.control() {
            shown["flow"] = json!(format!(
                "flow.{} decides when the run starts, by the events before and after it; the dry run does not play it",
                control.name()
            ));
        }
        would_start += usize::from(active && holds);
        automations.push(shown);
    }
    Ok(json!({
        "dry_run": true,
        "source": source.name,
        "signature": signature_view(signature),
        "idempotency_key": idempotency_key,
        "params": params,
        "automations": automations,
        "would_start": would_start,
    }))
}

/// Whether `definition`'s trigger is the webhook of `source`, read from
/// the JSON before anything is parsed (most of a tenant's automations are
/// another source's or another kind).
fn triggered_by(definition: &Value, source: &str) -> bool {
    let trigger = &definition["trigger"];
    trigger["kind"] == "webhook" && trigger["source"] == source
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sources_webhook_triggers_are_read() {
        let ours = json!({ "trigger": { "kind": "webhook", "source": "src_1" } });
        let theirs = json!({ "trigger": { "kind": "webhook", "source": "src_2" } });
        let event = json!({ "trigger": { "kind": "event", "event": "src_1" } });
        assert!(triggered_by(&ours, "src_1"));
        assert!(!triggered_by(&theirs, "src_1"));
        assert!(!triggered_by(&event, "src_1"));
    }
}
