//! Runs that start and wait for other runs (docs/workflows.md,
//! "`run_workflow`" and "`wait_for_runs`"): what the decider reads of
//! `run_workflow` and `wait_for_runs` steps, and what a step that waited on
//! runs publishes when they end.
//!
//! A `run_workflow` step runs in the record transaction: the engine's step
//! starts the child (a normal queued run, trigger `parent`) in the parent's
//! record, and the decider, given its `runId`, parks the parent on it
//! ([`crate::run::NextJob::WaitForRuns`]) unless the step says `wait:
//! false`. `wait_for_runs` parks on runs named in its config. A child that
//! ends resumes its parent in its own record transaction
//! ([`crate::advance::Effect::NotifyParent`]); the parent's job is claimed
//! again with [`Resume::Runs`](crate::run::Resume::Runs) and the decider
//! completes the step from the runs that ended ([`outcome`]).
//!
//! A child knows its parent from its context: `_event.parentRunId`, and its
//! depth is `_event.depth` (the parent's depth plus one).

use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::definition::Step;
use crate::duration::parse_duration;
use crate::error::StepError;
use crate::ids::RunId;
use crate::run::{RunEnded, RunStatus, RunsMode, RunsWait};
use crate::template;

/// The step type that starts a run of another automation.
pub const RUN_WORKFLOW: &str = "run_workflow";
/// The step type that parks a run until other runs end.
pub const WAIT_FOR_RUNS: &str = "wait_for_runs";

/// The run that started this one and may wait for it, from the context.
pub fn parent_of(context: &Value) -> Option<RunId> {
    context
        .get("_event")
        .and_then(|e| e.get("parentRunId"))
        .and_then(Value::as_str)
        .map(RunId::from)
}

/// How deep the run is in a chain of runs (0 for a run nobody started).
pub fn depth_of(context: &Value) -> i64 {
    context
        .get("_event")
        .and_then(|e| e.get("depth"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// The wait a finished `run_workflow` step parks on: its child, unless its
/// (rendered) config says `wait: false`.
pub fn awaited_child(
    step: &Step,
    config: Option<&Value>,
    outputs: &Map<String, Value>,
) -> Option<RunsWait> {
    if step.kind != RUN_WORKFLOW {
        return None;
    }
    let config = config.unwrap_or(&step.config);
    if config.get("wait") == Some(&Value::Bool(false)) {
        return None;
    }
    let run = outputs.get("runId")?.as_str()?;
    Some(RunsWait {
        runs: vec![run.to_owned()],
        mode: RunsMode::All,
        due_at: None,
    })
}

/// What a `wait_for_runs` step waits for, from its config rendered against
/// the scope: `runs` (a run id or a list of them, required), `mode` (`all`,
/// the default, or `any`) and `timeout` (a duration). Returns the rendered
/// config too, for the step's record.
pub fn runs_wait(
    step: &Step,
    scope: &Value,
    now: Timestamp,
) -> Result<(RunsWait, Value), StepError> {
    let config = template::render_config(&step.config, scope)
        .map_err(|e| StepError::terminal(format!("step `{}` {e}", step.id)))?;
    let bad = |what: String| StepError::terminal(format!("step `{}` config.{what}", step.id));
    let listed = match config.get("runs") {
        Some(Value::Array(items)) => items.clone(),
        Some(one @ Value::String(_)) => vec![one.clone()],
        _ => {
            return Err(bad(
                "runs is missing: list the run ids to wait for, like [\"{{st_a.runId}}\"]".into(),
            ));
        }
    };
    let mut runs = Vec::with_capacity(listed.len());
    for (i, item) in listed.iter().enumerate() {
        match item.as_str().map(str::trim) {
            Some(id) if !id.is_empty() => runs.push(id.to_owned()),
            _ => {
                return Err(bad(format!(
                    "runs.{i} must be a run id (a non-empty string), not {item}"
                )));
            }
        }
    }
    if runs.is_empty() {
        return Err(bad("runs is empty: there is no run to wait for".into()));
    }
    let mode = match config.get("mode") {
        None | Some(Value::Null) => RunsMode::All,
        Some(Value::String(m)) if m == "all" => RunsMode::All,
        Some(Value::String(m)) if m == "any" => RunsMode::Any,
        Some(other) => {
            return Err(bad(format!("mode must be \"all\" or \"any\", not {other}")));
        }
    };
    let due_at = match config.get("timeout") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            let timeout: Duration = parse_duration(s).map_err(|e| bad(format!("timeout: {e}")))?;
            Some(
                now.as_millisecond()
                    .saturating_add(timeout.as_millis() as i64),
            )
        }
        Some(other) => {
            return Err(bad(format!(
                "timeout must be a duration such as \"1h\", not {other}"
            )));
        }
    };
    Ok((RunsWait { runs, mode, due_at }, config))
}

/// What a step that waited on runs publishes, or why it fails: a run that
/// failed or was cancelled fails it (`child_failed`, terminal, with that
/// run's error). `run_workflow` publishes `{runId, status, output}` of its
/// child; `wait_for_runs` publishes `{runs: [{runId, status, output}],
/// timedOut}`, the runs in the order they ended.
pub fn outcome(
    step: &Step,
    ended: &[RunEnded],
    timed_out: bool,
) -> Result<(Map<String, Value>, Vec<String>), StepError> {
    if let Some(run) = ended.iter().find(|r| r.status != RunStatus::Completed) {
        return Err(StepError::terminal(format!(
            "child_failed: run `{}` {}: {}",
            run.run_id,
            run.status,
            run.error.as_deref().unwrap_or("it gave no error")
        )));
    }
    let mut outputs = Map::new();
    if step.kind == RUN_WORKFLOW {
        let Some(run) = ended.first() else {
            return Err(StepError::terminal(format!(
                "step `{}` was resumed before its child run ended",
                step.id
            )));
        };
        outputs.insert("runId".into(), json!(run.run_id));
        outputs.insert("status".into(), json!(run.status));
        outputs.insert("output".into(), run.output.clone());
        let log = vec![format!("child run {} completed", run.run_id)];
        return Ok((outputs, log));
    }
    let runs: Vec<Value> = ended
        .iter()
        .map(|r| json!({ "runId": r.run_id, "status": r.status, "output": r.output }))
        .collect();
    let log = match timed_out {
        true => format!("timed out with {} of the runs ended", runs.len()),
        false => format!("{} runs ended", runs.len()),
    };
    outputs.insert("runs".into(), Value::Array(runs));
    outputs.insert("timedOut".into(), Value::Bool(timed_out));
    Ok((outputs, vec![log]))
}

/// The log line of a step that parks on runs.
pub fn waiting_line(wait: &RunsWait) -> String {
    let runs = wait.runs.join(", ");
    let what = match (wait.runs.len(), wait.mode) {
        (1, _) => format!("waiting for run {runs} to end"),
        (_, RunsMode::All) => format!("waiting for all of runs {runs} to end"),
        (_, RunsMode::Any) => format!("waiting for any of runs {runs} to end"),
    };
    match wait
        .due_at
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
    {
        Some(due) => format!("{what}, until {due}"),
        None => what,
    }
}
