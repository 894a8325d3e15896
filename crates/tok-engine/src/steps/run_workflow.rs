//! `run_workflow`: starts a run of another automation of the tenant, in the
//! record transaction of the step (docs/workflows.md, "`run_workflow`").
//! The child is a normal queued run with trigger type `parent`,
//! `parent_run_id` this run and the depth of this run plus one; its params
//! and body are `input`. The child exists exactly when this step's record
//! does, so a retried or crashed attempt never starts a second child.
//!
//! The step's outputs are `{runId}`; with `wait` (the default) the decider
//! then parks the run on the child (`tok_core::children`), and the child's
//! end resumes it with `{runId, status, output}`.
//!
//! `idempotencyKey` makes the start idempotent across runs: the same key on
//! the same automation answers the child it started first. Without one, the
//! key is this run and step's own (`<run id>:<path>`), so a step starts one
//! child however often its record is attempted.

use serde_json::{Map, Value, json};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::flow;
use tok_core::ids::RunId;
use tok_store::{AutomationStatus, NewEvent, NewRun};

use super::{TxContext, TxResult, string, terminal};

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["automation", "input", "wait", "idempotencyKey"];

/// Checks the step's config at save: `automation` names the child's
/// automation, `input` is an object, `wait` a boolean.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    super::need(
        config,
        "run_workflow",
        "automation",
        "the id or name of the automation to start",
    )?;
    match config.get("input") {
        None | Some(Value::Object(_)) => {}
        Some(other) => {
            return Err(format!(
                "run_workflow `input` must be an object of the child's params, not {other}"
            ));
        }
    }
    match config.get("wait") {
        None | Some(Value::Bool(_)) => Ok(()),
        Some(other) => Err(format!(
            "run_workflow `wait` must be true or false, not {other}"
        )),
    }
}

/// Why a child run of an automation with a start control is not started:
/// the child is its parent's step, which waits for that very run, so it is
/// never held, queued, skipped or joined to another run. Said at save for
/// a child named as it is, and by the step for one named by a template.
pub fn child_refused(step: &str, automation: &str, control: &str) -> String {
    format!(
        "step `{step}`: automation \u{201c}{automation}\u{201d} has a start control \
         (flow.{control}), which decides on events and manual and scheduled starts; a child \
         run is its parent's step and is never held, skipped or joined, so it cannot be one: \
         start it with an emit step (an event it triggers on), or remove flow.{control}"
    )
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let name = string(config, "automation").ok_or_else(|| {
        terminal(format!(
            "step `{}` needs `automation`: the id or name of the automation to start",
            cx.step_id
        ))
    })?;
    let row = cx.tx.automation_named(&name).await?.ok_or_else(|| {
        terminal(format!(
            "step `{}`: there is no automation `{name}` in this tenant",
            cx.step_id
        ))
    })?;
    match row.status {
        AutomationStatus::Active => {}
        AutomationStatus::Paused => {
            return Err(terminal(format!(
                "step `{}`: automation \u{201c}{}\u{201d} is paused; resume it to start runs of it",
                cx.step_id, row.name
            )));
        }
        AutomationStatus::Archived => {
            return Err(terminal(format!(
                "step `{}`: automation \u{201c}{}\u{201d} was deleted; it starts no run",
                cx.step_id, row.name
            )));
        }
    }
    let automation: Automation = serde_json::from_value(row.definition.clone()).map_err(|e| {
        terminal(format!(
            "step `{}`: automation `{}` version {} does not parse: {e}",
            cx.step_id, row.id, row.version
        ))
    })?;
    if let Some(control) = automation.flow.control() {
        return Err(terminal(child_refused(
            cx.step_id,
            &row.name,
            control.name(),
        )));
    }
    let input = match config.get("input") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::Object(map)) => Value::Object(map.clone()),
        Some(other) => {
            return Err(terminal(format!(
                "step `{}`: `input` must be an object of the child's params, not {other}",
                cx.step_id
            )));
        }
    };
    let parent = cx
        .cause
        .run_id
        .clone()
        .ok_or_else(|| terminal("run_workflow runs only inside a run"))?;
    let key = string(config, "idempotencyKey").unwrap_or_else(|| format!("{parent}:{}", cx.path));
    let depth = cx.cause.depth + 1;
    let run_id = RunId::generate();
    let params = match &input {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    let context = Context::new(
        params.clone(),
        input.clone(),
        json!({
            "type": "parent",
            "depth": depth,
            "runId": run_id,
            "parentRunId": parent,
            "parentStep": cx.step_id,
            "actor": { "kind": "parent", "runId": parent },
            "traceparent": cx.traceparent,
        }),
    );
    let event = NewEvent {
        source_kind: "parent".into(),
        idempotency_key: run_id.to_string(),
        payload: input,
        params: Value::Object(params),
        depth,
        cause_run_id: Some(parent.clone()),
        origin_automation_id: cx.cause.automation_id.clone(),
        target_automation_id: Some(row.id.clone()),
        ..NewEvent::default()
    };
    let context = context.into_value();
    let priority = crate::dispatch::plan::run_priority(&automation, &context, &row.id);
    let context_of_run = context.clone();
    let run = NewRun {
        id: run_id,
        automation_id: row.id.clone(),
        version: row.version,
        trigger_type: "parent".into(),
        context,
        depth,
        queue_key: None,
        priority,
        first_path: flow::first_path(&automation.steps).map(|path| path.to_string()),
        idempotency_key: Some(key),
        subject_ticket_id: None,
        steps: Vec::new(),
        actions: 0,
        refused: None,
        skipped: None,
        hold: None,
        start_by: crate::dispatch::plan::start_by(&automation),
        cancels: crate::dispatch::plan::cancel_keys(&automation, &context_of_run),
        cancelled: None,
    };
    let mut run = run;
    let own = automation.settings.limits.starts_per_minute;
    let per_minute = match own {
        Some(_) => own,
        None => cx.tx.tenant_limits().await?.starts_per_minute,
    };
    if let Some(per_minute) = per_minute {
        // Over the child's start limit, the child is written `refused`:
        // the parent that waits for it fails its step with `child_failed`.
        let now = tok_store::now_ms();
        let since = now - tok_core::limits::START_WINDOW_MS;
        let recent = cx.tx.recent_starts(&row.id, since, per_minute).await?;
        if tok_core::limits::start_allowed(&recent, per_minute, now).is_err() {
            run.refused = Some(tok_core::limits::start_rate_exceeded(per_minute));
            run.first_path = None;
        }
    }
    let started = cx.tx.start_child(event, run).await?;
    let mut out = Map::new();
    out.insert("runId".into(), json!(started.run_id));
    out.insert("automationId".into(), json!(row.id));
    if !started.created {
        out.insert("existing".into(), Value::Bool(true));
    }
    Ok(out)
}
