//! The audit rows of the operator's own commands (`tok secrets rotate`,
//! `tok tenant move`, `tok tenant forget`; docs/security.md, "Audit"): the
//! platform's rows (no tenant), whose actor is the platform named by the
//! command, the operating-system user and the host, never a secret. A
//! command that changes rows in one transaction writes its row in it; one
//! that changes rows in many writes it ahead, `pending`, and ends it
//! `done` or `unknown` ([`ahead`]).

use std::future::Future;

use tok_store::{Actor, ActorKind, AuditEnd, AuditOutcome, AuditStore, NewAudit, Target};

/// The longest actor name kept, in characters.
const MAX_NAME_CHARS: usize = 200;

/// The platform, as `command` run by this process's user on this host.
pub(crate) fn actor(command: &str) -> Actor {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let user = var("USER")
        .or_else(|| var("LOGNAME"))
        .unwrap_or_else(|| "an unknown user".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| var("HOSTNAME"))
        .unwrap_or_else(|| "an unknown host".into());
    let name: String = format!("`{command}` run by {user} on {host}")
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME_CHARS)
        .collect();
    Actor {
        kind: ActorKind::Platform,
        id: None,
        name: Some(name),
    }
}

/// A platform row of `action` on `target` by `command`.
pub(crate) fn row(command: &str, action: &str, target: Target, summary: String) -> NewAudit {
    NewAudit {
        tenant_id: None,
        actor: actor(command),
        action: action.to_owned(),
        target,
        summary: Some(summary),
    }
}

/// Runs `change` with its row written ahead in `log`: nothing is changed
/// when the row cannot be written; the row ends `done` with `summary` of
/// what the change answered, or `unknown` when it failed (it may have
/// changed part of what it was to).
pub(crate) async fn ahead<T, E>(
    log: &dyn AuditStore,
    row: NewAudit,
    change: impl Future<Output = Result<T, E>>,
    summary: impl FnOnce(&T) -> String,
) -> anyhow::Result<Result<T, E>> {
    let pending = log.begin_audit(row).await.map_err(|e| {
        anyhow::anyhow!("nothing was changed: the audit row could not be written first: {e}")
    })?;
    let done = change.await;
    let end = AuditEnd {
        outcome: if done.is_ok() {
            AuditOutcome::Done
        } else {
            AuditOutcome::Unknown
        },
        tenant_id: None,
        target_id: pending.target.id.clone(),
        summary: Some(match &done {
            Ok(value) => summary(value),
            Err(_) => "failed part-way: some of it may have been changed; run it again".into(),
        }),
    };
    if let Err(e) = log.end_audit(&pending, end).await {
        tracing::error!(action = %pending.action, error = %e, "the command's audit row stays pending: the scheduler will say its outcome is unknown");
    }
    Ok(done)
}
