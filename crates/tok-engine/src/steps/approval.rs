//! `approval`: opens an approval for the run, in the record transaction,
//! for its approvers — the members of a group (`{"group": "<name or id>"}`)
//! or a list of members (`{"members": ["<id>", …]}`). No approver fails the
//! step with `no_approvers` (terminal): nobody could ever decide. The
//! step then waits for the decision, as any step may
//! ([`crate::StepOutcome::Wait`]), and the decider reads it
//! (`tok_core::approval`).

use serde_json::{Map, Value, json};
use tok_store::{Approver, NewApproval};

use super::{TxContext, TxError, string, terminal};
use crate::{StepOutcome, WaitFor};

const SHAPE: &str =
    "`approvers`: {\"group\": \"<group name or id>\"} or {\"members\": [\"<member id>\", …]}";

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["approvers", "prompt", "timeout"];

/// Checks the step's config at save.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    let approvers = config
        .get("approvers")
        .ok_or_else(|| format!("approval needs {SHAPE}"))?;
    match (approvers.get("group"), approvers.get("members")) {
        (Some(Value::String(g)), None) if !g.trim().is_empty() => {}
        (None, Some(Value::Array(m))) if !m.is_empty() => {}
        (None, Some(Value::String(_))) => {} // a template of a list
        _ => return Err(format!("approval needs {SHAPE}, not {approvers}")),
    }
    tok_core::approval::timeout(config)?;
    Ok(())
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> Result<StepOutcome, TxError> {
    let timeout = tok_core::approval::timeout(config)
        .map_err(|e| terminal(format!("step `{}`: {e}", cx.step_id)))?;
    let approvers = config.get("approvers").cloned().unwrap_or(Value::Null);
    let (members, from) = match (approvers.get("group"), approvers.get("members")) {
        (Some(Value::String(group)), _) => {
            let group = cx.tx.group(group.trim()).await?.ok_or_else(|| {
                terminal(format!(
                    "no_approvers: step `{}`: there is no group `{group}`",
                    cx.step_id
                ))
            })?;
            (group.members, format!("group `{}`", group.name))
        }
        (_, Some(Value::Array(ids))) => {
            let ids: Vec<String> = ids
                .iter()
                .filter_map(|id| id.as_str().map(str::to_owned))
                .collect();
            let members = cx.tx.members(&ids).await?;
            (members, "the listed members".to_owned())
        }
        _ => {
            return Err(terminal(format!(
                "step `{}` needs {SHAPE}, not {approvers}",
                cx.step_id
            )));
        }
    };
    if members.is_empty() {
        return Err(terminal(format!(
            "no_approvers: step `{}`: {from} has no members, so nobody could decide",
            cx.step_id
        )));
    }
    let approvers: Vec<Approver> = members
        .into_iter()
        .map(|m| Approver {
            id: m.id,
            name: m.name,
        })
        .collect();
    let prompt = string(config, "prompt").unwrap_or_else(|| format!("Approve {}?", cx.step_id));
    let id = cx
        .tx
        .open_approval(NewApproval {
            step_id: cx.step_id.to_owned(),
            path: cx.path.to_owned(),
            prompt: prompt.clone(),
            approvers: approvers.clone(),
        })
        .await?;
    let mut out = Map::new();
    out.insert("approvalId".into(), json!(id));
    out.insert("prompt".into(), json!(prompt));
    out.insert("approvers".into(), json!(approvers));
    let mut wait = WaitFor::signal(tok_core::approval::decision_key(&id))
        .only_new()
        .publishing(out)
        .described("a decision");
    wait.timeout = timeout;
    Ok(StepOutcome::Wait(wait))
}
