//! Who may run a step (docs/workflows.md, "Authorization").
//!
//! Two questions, both asked of the engine's [`StepAuthorizer`]:
//!
//! - Whether a tenant's runs may go on at all
//!   ([`StepAuthorizer::authorize_tenant`]): asked before a claim decides
//!   or runs anything of a run, and before a dispatch begins a new run's
//!   leading control steps. Denied, the claim runs no step — control steps
//!   included — and fails the run at the step it is at; the dispatch begins
//!   nothing and leaves the run's first step to a claim, which fails it.
//! - Whether a step with side effects may run
//!   ([`StepAuthorizer::authorize`]): asked before every step that an
//!   executor runs (the steps of the record transaction and the external
//!   ones alike).
//!
//! Both fail closed: a denial, and an authorizer that could not answer,
//! fail the step with `authorization_denied`, which is never retried (the
//! run fails, with its incident). An embedder replaces the built-in
//! [`SuspendedTenants`] with [`crate::Engine::with_authorizer`].

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use tok_core::error::StepError;
use tok_core::ids::{AutomationId, RunId, TenantId};
use tok_store::Store;

/// Step types an executor runs that change nothing outside the run: no
/// authorization is asked for them.
const WITHOUT_EFFECTS: &[&str] = &["flow/pause"];

/// Whether a step type an executor runs has side effects to authorize.
pub fn has_effects(kind: &str) -> bool {
    !WITHOUT_EFFECTS.contains(&kind)
}

/// The step about to run, and whose run it is.
#[derive(Debug, Clone)]
pub struct StepToAuthorize<'a> {
    pub tenant_id: &'a TenantId,
    pub run_id: &'a RunId,
    pub automation_id: &'a AutomationId,
    pub step_id: &'a str,
    pub kind: &'a str,
    pub path: &'a str,
    pub attempt: u32,
    /// Who started the run (`{"kind": "key", "id"}`, `{"kind": "system", …}`,
    /// `{"kind": "parent", "runId"}`); `null` for runs older than actors.
    pub actor: &'a Value,
}

/// An authorizer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Denied, and why (for the step's error and the incident).
    Deny(String),
}

/// Decides whether a step may run. `Err` is an authorizer that could not
/// decide (its store is away…): the step is denied all the same.
#[async_trait]
pub trait StepAuthorizer: Send + Sync + 'static {
    async fn authorize(&self, step: &StepToAuthorize<'_>) -> Result<Verdict, String>;

    /// Whether `tenant`'s runs may go on at all, control steps included
    /// (see the module's doc). By default they may; [`SuspendedTenants`]
    /// denies a suspended tenant's.
    async fn authorize_tenant(&self, tenant: &TenantId) -> Result<Verdict, String> {
        let _ = tenant;
        Ok(Verdict::Allow)
    }

    /// The tenant's settings changed in this process (the admin's `PATCH`):
    /// an authorizer that keeps answers forgets the tenant's.
    fn tenant_changed(&self, tenant: &TenantId) {
        let _ = tenant;
    }
}

/// How long [`SuspendedTenants`] keeps a tenant's answer: a suspension made
/// through another process's API denies this process's steps at most this
/// late (through this process's API, at once).
const KEPT_FOR: Duration = Duration::from_secs(1);

/// The built-in authorizer: denies every step of a tenant that the
/// platform admin suspended (`PATCH /api/tenants/{id} {"suspended": true}`)
/// or is deleting (`DELETE /api/tenants/{id}`).
///
/// It keeps each tenant's answer for [`KEPT_FOR`], so a busy tenant's steps
/// cost one read of its row a second, not one each; an answer it could not
/// get (the store away) is not kept.
pub struct SuspendedTenants {
    store: Arc<dyn Store>,
    kept: RwLock<HashMap<TenantId, (Verdict, Instant)>>,
}

impl SuspendedTenants {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            kept: RwLock::default(),
        }
    }

    fn kept(&self, tenant: &TenantId) -> Option<Verdict> {
        let kept = self.kept.read().unwrap_or_else(|e| e.into_inner());
        let (verdict, at) = kept.get(tenant)?;
        (at.elapsed() < KEPT_FOR).then(|| verdict.clone())
    }
}

impl SuspendedTenants {
    /// The tenant's answer, kept or read.
    async fn verdict(&self, tenant: &TenantId) -> Result<Verdict, String> {
        if let Some(verdict) = self.kept(tenant) {
            return Ok(verdict);
        }
        let verdict = match self.store.tenant(tenant).await {
            Ok(Some(row)) if row.deleting() => {
                Verdict::Deny(format!("tenant {tenant} is being deleted"))
            }
            Ok(Some(row)) if row.suspended => {
                Verdict::Deny(format!("tenant {tenant} is suspended"))
            }
            Ok(Some(_)) => Verdict::Allow,
            Ok(None) => Verdict::Deny(format!("tenant {tenant} does not exist")),
            Err(e) => return Err(format!("could not read tenant {tenant}: {e}")),
        };
        self.kept
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tenant.clone(), (verdict.clone(), Instant::now()));
        Ok(verdict)
    }
}

#[async_trait]
impl StepAuthorizer for SuspendedTenants {
    async fn authorize(&self, step: &StepToAuthorize<'_>) -> Result<Verdict, String> {
        self.verdict(step.tenant_id).await
    }

    async fn authorize_tenant(&self, tenant: &TenantId) -> Result<Verdict, String> {
        self.verdict(tenant).await
    }

    fn tenant_changed(&self, tenant: &TenantId) {
        self.kept
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tenant);
    }
}

/// Asks `authorizer` about `step`: `Ok` when it may run, otherwise the
/// terminal `authorization_denied` error that fails it.
pub async fn check(
    authorizer: &dyn StepAuthorizer,
    step: &StepToAuthorize<'_>,
) -> Result<(), StepError> {
    if !has_effects(step.kind) {
        return Ok(());
    }
    let why = match authorizer.authorize(step).await {
        Ok(Verdict::Allow) => return Ok(()),
        Ok(Verdict::Deny(why)) => why,
        Err(e) => format!("the authorizer could not decide, so the step is denied: {e}"),
    };
    Err(denied(step.step_id, step.kind, &why))
}

/// Asks `authorizer` whether `tenant`'s runs may go on at all: `Ok`, or
/// why not (a denial, or an authorizer that could not answer: the run may
/// not go on either way).
pub async fn check_tenant(
    authorizer: &dyn StepAuthorizer,
    tenant: &TenantId,
) -> Result<(), String> {
    match authorizer.authorize_tenant(tenant).await {
        Ok(Verdict::Allow) => Ok(()),
        Ok(Verdict::Deny(why)) => Err(why),
        Err(e) => Err(format!(
            "the authorizer could not decide, so the step is denied: {e}"
        )),
    }
}

/// The error of step `step_id` (of type `kind`) that may not run: terminal.
pub fn denied(step_id: &str, kind: &str, why: &str) -> StepError {
    StepError::terminal(format!(
        "authorization_denied: step `{step_id}` ({kind}) may not run: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Answers(Result<Verdict, String>);

    #[async_trait]
    impl StepAuthorizer for Answers {
        async fn authorize(&self, _: &StepToAuthorize<'_>) -> Result<Verdict, String> {
            self.0.clone()
        }
    }

    async fn asked(authorizer: Answers, kind: &str) -> Result<(), StepError> {
        let (tenant, run, automation) = (
            TenantId::from("ten_a"),
            RunId::from("run_a"),
            AutomationId::from("aut_a"),
        );
        let step = StepToAuthorize {
            tenant_id: &tenant,
            run_id: &run,
            automation_id: &automation,
            step_id: "st_call",
            kind,
            path: "0",
            attempt: 1,
            actor: &Value::Null,
        };
        check(&authorizer, &step).await
    }

    #[tokio::test]
    async fn a_denial_and_an_authorizer_error_both_deny_for_good() {
        assert_eq!(asked(Answers(Ok(Verdict::Allow)), "http").await, Ok(()));
        for answer in [Ok(Verdict::Deny("no".into())), Err("store away".into())] {
            let error = asked(Answers(answer), "http").await.unwrap_err();
            assert!(!error.is_retryable(), "{error:?}");
            assert!(
                error
                    .message()
                    .starts_with("authorization_denied: step `st_call` (http)"),
                "{error:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_tenant_is_allowed_unless_the_authorizer_says_otherwise() {
        let tenant = TenantId::from("ten_a");
        assert_eq!(
            check_tenant(&Answers(Err("only steps are asked".into())), &tenant).await,
            Ok(()),
            "an authorizer without a tenant rule allows"
        );
    }

    #[tokio::test]
    async fn a_step_without_effects_is_not_asked_about() {
        let denying = Answers(Err("never asked".into()));
        assert_eq!(asked(denying, "flow/pause").await, Ok(()));
    }
}
