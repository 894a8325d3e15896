//! [`ApprovalStore`] on either database: the same SQL on both, but for the
//! row lock of a decision. Opening an approval in a record transaction and
//! reading its approvers are plain generic functions the record's queries
//! call; a decision resumes its run through [`DecisionIn`].

use std::future::Future;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tok_core::ids::{AutomationId, RunId, TenantId, new_id};

use super::{Approval, ApprovalStore, Decided, Decision, NewApproval};
use crate::rows::now_ms;
use crate::sql::{Conn, Driver, DriverOf, Route, Row, SqlStore, Tx, on};
use crate::{Cause, Member, NewSignal, Page, Result, SignalSent, StoreError};

/// What a decision needs of the signals' and the desk's queries, which are
/// still written once per backend (`signals_sql.rs`, `desk_sql.rs`): each
/// store forwards to its own (`postgres.rs` and `sqlite.rs` of this folder).
pub(crate) trait DecisionIn: SqlStore {
    /// Whether a wait on the signal's key is kept while its step's
    /// escalation runs (the signal then waits in the buffer).
    fn escalating_wait(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        signal: &NewSignal,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Sends a signal in the caller's transaction.
    fn send_signal_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        signal: &NewSignal,
    ) -> impl Future<Output = Result<SignalSent>> + Send;

    /// Writes a line in a ticket's trace.
    fn trace_in(
        tx: &mut Tx<Self>,
        tenant: &TenantId,
        ticket_id: &str,
        kind: &str,
        message: &str,
        cause: &Cause,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// The columns of an approval as shown: a pending one whose run no longer
/// waits on its key is `closed`.
const APPROVAL_SELECT: &str = "SELECT a.id, a.run_id, r.automation_id, a.step_id, a.path,
        a.prompt, a.approvers, a.decided_by, a.comment, a.created_at, a.decided_at,
        CASE WHEN a.status = 'pending' AND NOT EXISTS (
            SELECT 1 FROM waits w
            WHERE w.tenant_id = a.tenant_id AND w.run_id = a.run_id
              AND w.key = 'approval:' || a.id)
        THEN 'closed' ELSE a.status END AS shown_status
     FROM approvals a
     JOIN runs r ON r.tenant_id = a.tenant_id AND r.id = a.run_id";

fn approval<D: Driver>(row: &Row<D>) -> Result<Approval> {
    Ok(Approval {
        id: row.text("id")?,
        run_id: RunId::from(row.text("run_id")?),
        automation_id: row.text("automation_id")?,
        step_id: row.text("step_id")?,
        path: row.text("path")?,
        prompt: row.text("prompt")?,
        approvers: row.json("approvers")?,
        status: row.text("shown_status")?,
        decided_by: row.opt_json("decided_by")?,
        comment: row.opt_text("comment")?,
        created_at: row.int("created_at")?,
        decided_at: row.opt_int("decided_at")?,
    })
}

/// `value` as the JSON document bound for it (an error as binding it
/// would have failed).
fn document<T: Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value).map_err(|e| StoreError::Database(sqlx::Error::Encode(e.into())))
}

/// Opens an approval for the run of a record transaction.
pub(crate) async fn open_approval_in<D: Driver>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    run: &RunId,
    approval: &NewApproval,
) -> Result<String> {
    let id = new_id("apr");
    let approvers = document(&approval.approvers)?;
    on(
        "approvals",
        "INSERT INTO approvals (id, tenant_id, run_id, step_id, path, prompt, approvers,
            created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .text(&id)
    .text(tenant.as_str())
    .text(run.as_str())
    .text(&approval.step_id)
    .text(&approval.path)
    .text(&approval.prompt)
    .json(&approvers)
    .int(now_ms())
    .execute::<D>(conn)
    .await?;
    Ok(id)
}

/// The tenant's members with these ids, in the order asked.
pub(crate) async fn members_in<D: Driver>(
    conn: &mut Conn<D>,
    tenant: &TenantId,
    ids: &[String],
) -> Result<Vec<Member>> {
    let sql = format!(
        "SELECT id, name, capacity FROM members WHERE tenant_id = $1 AND id {}",
        D::any_of(2)
    );
    let rows = on("members", &sql)
        .text(tenant.as_str())
        .texts(ids.iter().map(String::as_str))
        .fetch_all::<D>(conn)
        .await?;
    let mut members = rows
        .iter()
        .map(|m| {
            Ok(Member {
                id: m.text("id")?,
                name: m.text("name")?,
                capacity: m.int32("capacity")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    members.sort_by_key(|m| ids.iter().position(|id| *id == m.id));
    Ok(members)
}

#[async_trait]
impl<R: Route> ApprovalStore for R
where
    R::Store: DecisionIn,
{
    async fn approvals(
        &self,
        tenant: &TenantId,
        pending_only: bool,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Page<Approval>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let sql = format!(
                "SELECT * FROM ({APPROVAL_SELECT} WHERE a.tenant_id = $1) x
                 WHERE (CAST($2 AS INTEGER) = 0 OR x.shown_status = 'pending')
                   AND (CAST($3 AS TEXT) IS NULL OR x.id < $3)
                 ORDER BY x.id DESC LIMIT $4"
            );
            let mut conn = db.reader().acquire().await?;
            let rows = on("approvals", &sql)
                .text(tenant.as_str())
                .int32(i32::from(pending_only))
                .opt_text(before)
                .int(i64::from(limit) + 1)
                .fetch_all::<DriverOf<R>>(&mut conn)
                .await?;
            let items = rows.iter().map(approval).collect::<Result<Vec<_>>>()?;
            Ok(Page::of(items, limit, |a: &Approval| a.id.clone()))
        })
        .await
    }

    async fn approval(&self, tenant: &TenantId, id: &str) -> Result<Option<Approval>> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let sql = format!("{APPROVAL_SELECT} WHERE a.tenant_id = $1 AND a.id = $2");
            let mut conn = db.reader().acquire().await?;
            let row = on("approvals", &sql)
                .text(tenant.as_str())
                .text(id)
                .fetch_optional::<DriverOf<R>>(&mut conn)
                .await?;
            row.as_ref().map(approval).transpose()
        })
        .await
    }

    async fn decide_approval(
        &self,
        tenant: &TenantId,
        id: &str,
        decision: Decision,
    ) -> Result<Decided> {
        let db = self.db_for(tenant).await?;
        db.call(async {
            let writer = db.writer().await;
            let mut tx = writer.begin().await?;
            // The approval's row is held until the decision commits: a second
            // decision waits for it, then finds it decided.
            let lock = format!(
                "SELECT id FROM approvals WHERE tenant_id = $1 AND id = $2 {}",
                DriverOf::<R>::LOCK_ROWS
            );
            let locked = on("approvals", &lock)
                .text(tenant.as_str())
                .text(id)
                .fetch_optional::<DriverOf<R>>(&mut tx)
                .await?;
            if locked.is_none() {
                return Ok(Decided::NotFound);
            }
            let sql = format!("{APPROVAL_SELECT} WHERE a.tenant_id = $1 AND a.id = $2");
            let row = on("approvals", &sql)
                .text(tenant.as_str())
                .text(id)
                .fetch_one::<DriverOf<R>>(&mut tx)
                .await?;
            let mut approval = approval(&row)?;
            if approval.status != "pending" {
                return Ok(Decided::AlreadyDecided(approval));
            }
            let Some(by) = approval
                .approvers
                .iter()
                .find(|a| a.id == decision.member)
                .cloned()
            else {
                return Ok(Decided::NotAnApprover(approval));
            };
            let status = match decision.decision.as_str() {
                "approve" => "approved",
                _ => "rejected",
            };
            let now = now_ms();
            let decided_by = document(&by)?;
            on(
                "approvals",
                "UPDATE approvals SET status = $3, decided_by = $4, comment = $5, actor = $6,
                    decided_at = $7
                 WHERE tenant_id = $1 AND id = $2",
            )
            .text(tenant.as_str())
            .text(id)
            .text(status)
            .json(&decided_by)
            .opt_text(decision.comment.as_deref())
            .json(&decision.actor)
            .int(now)
            .execute::<DriverOf<R>>(&mut tx)
            .await?;
            let payload = serde_json::json!({
                "decision": decision.decision,
                "by": by,
                "comment": decision.comment,
                "approvalId": id,
            });
            let signal = NewSignal {
                key: tok_core::approval::decision_key(id),
                subject: None,
                payload,
                idempotency_key: None,
                lookback_ms: 0,
                actor: Some(decision.actor.clone()),
            };
            // While the step's escalation runs, the decision waits in the
            // buffer for the step to park again, which takes it.
            let escalating = R::Store::escalating_wait(&mut tx, tenant, &signal).await?;
            let sent = R::Store::send_signal_in(&mut tx, tenant, &signal).await?;
            if sent.resumed.is_empty() && !escalating {
                // Its job was claimed for the timeout meanwhile: the timeout
                // won. Nothing of the decision is kept.
                approval.status = "closed".into();
                return Ok(Decided::AlreadyDecided(approval));
            }
            let ticket = on(
                "runs",
                "SELECT subject_ticket_id FROM runs WHERE tenant_id = $1 AND id = $2",
            )
            .text(tenant.as_str())
            .text(approval.run_id.as_str())
            .fetch_optional::<DriverOf<R>>(&mut tx)
            .await?
            .map(|r| r.opt_text("subject_ticket_id"))
            .transpose()?
            .flatten();
            if let Some(ticket) = ticket {
                let verb = if status == "approved" {
                    "Approved"
                } else {
                    "Rejected"
                };
                let mut message = format!("{verb} by {} (step {})", by.name, approval.step_id);
                if let Some(comment) = decision.comment.as_deref().filter(|c| !c.is_empty()) {
                    message.push_str(&format!(": {comment}"));
                }
                let cause = Cause {
                    run_id: Some(approval.run_id.clone()),
                    automation_id: Some(AutomationId::from(approval.automation_id.clone())),
                    depth: 0,
                    actor: by.name.clone(),
                };
                R::Store::trace_in(&mut tx, tenant, &ticket, "approval", &message, &cause).await?;
            }
            tx.commit().await?;
            approval.status = status.into();
            approval.decided_by = Some(by);
            approval.comment = decision.comment;
            approval.decided_at = Some(now);
            Ok(Decided::Done(approval))
        })
        .await
    }
}
