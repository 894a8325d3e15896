//! The queries of approvals ([`ApprovalStore`](crate::ApprovalStore)) for
//! both backends (see `rows.rs` for why a macro per file): opening one in
//! a record transaction, listing them, and deciding one in the transaction
//! that resumes its run.

macro_rules! impl_approvals {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// The columns of an approval as shown: a pending one whose run no
        /// longer waits on its key is `closed`.
        const APPROVAL_SELECT: &str = "SELECT a.id, a.run_id, r.automation_id, a.step_id, a.path,
                a.prompt, a.approvers, a.decided_by, a.comment, a.created_at, a.decided_at,
                CASE WHEN a.status = 'pending' AND NOT EXISTS (
                    SELECT 1 FROM waits w
                    WHERE w.tenant_id = a.tenant_id AND w.run_id = a.run_id
                      AND w.key = 'approval:' || a.id)
                THEN 'closed' ELSE a.status END AS shown_status
             FROM approvals a
             JOIN runs r ON r.tenant_id = a.tenant_id AND r.id = a.run_id";

        fn approval_from_row(row: &<$db as sqlx::Database>::Row) -> Result<Approval> {
            Ok(Approval {
                id: row.get("id"),
                run_id: RunId::from(row.get::<String, _>("run_id")),
                automation_id: row.get("automation_id"),
                step_id: row.get("step_id"),
                path: row.get("path"),
                prompt: row.get("prompt"),
                approvers: row.try_get::<Json<Vec<Approver>>, _>("approvers")?.0,
                status: row.get("shown_status"),
                decided_by: row
                    .try_get::<Option<Json<Approver>>, _>("decided_by")?
                    .map(|j| j.0),
                comment: row.get("comment"),
                created_at: row.get("created_at"),
                decided_at: row.get("decided_at"),
            })
        }

        /// Opens an approval for the run of a record transaction.
        async fn open_approval_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            run: &RunId,
            approval: &NewApproval,
        ) -> Result<String> {
            let id = new_id("apr");
            sqlx::query(
                "INSERT INTO approvals (id, tenant_id, run_id, step_id, path, prompt, approvers,
                    created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(&id)
            .bind(tenant.as_str())
            .bind(run.as_str())
            .bind(&approval.step_id)
            .bind(&approval.path)
            .bind(&approval.prompt)
            .bind(Json(&approval.approvers))
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
            Ok(id)
        }

        /// The tenant's members with these ids, in the order asked.
        async fn members_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &TenantId,
            ids: &[String],
        ) -> Result<Vec<Member>> {
            let rows = sqlx::query(concat!(
                "SELECT id, name, capacity FROM members WHERE tenant_id = $1 AND id ",
                any_of!(2)
            ))
            .bind(tenant.as_str())
            .bind(list(ids.to_vec()))
            .fetch_all(&mut **tx)
            .await?;
            let mut members: Vec<Member> = rows
                .iter()
                .map(|m| Member { id: m.get("id"), name: m.get("name"), capacity: m.get("capacity") })
                .collect();
            members.sort_by_key(|m| ids.iter().position(|id| *id == m.id));
            Ok(members)
        }

        #[async_trait::async_trait]
        impl ApprovalStore for $store {
            async fn approvals(
                &self,
                tenant: &TenantId,
                pending_only: bool,
                limit: u32,
                before: Option<&str>,
            ) -> Result<$crate::Page<Approval>> {
                let sql = format!(
                    "SELECT * FROM ({APPROVAL_SELECT} WHERE a.tenant_id = $1) x
                     WHERE (CAST($2 AS INTEGER) = 0 OR x.shown_status = 'pending')
                       AND (CAST($3 AS TEXT) IS NULL OR x.id < $3)
                     ORDER BY x.id DESC LIMIT $4"
                );
                let rows = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(i32::from(pending_only))
                    .bind(before)
                    .bind(i64::from(limit) + 1)
                    .fetch_all(self.reader())
                    .await?;
                let items = rows.iter().map(approval_from_row).collect::<Result<Vec<_>>>()?;
                Ok($crate::Page::of(items, limit, |a: &Approval| a.id.clone()))
            }

            async fn approval(&self, tenant: &TenantId, id: &str) -> Result<Option<Approval>> {
                let sql = format!("{APPROVAL_SELECT} WHERE a.tenant_id = $1 AND a.id = $2");
                let row = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(id)
                    .fetch_optional(self.reader())
                    .await?;
                row.as_ref().map(approval_from_row).transpose()
            }

            async fn decide_approval(
                &self,
                tenant: &TenantId,
                id: &str,
                decision: Decision,
            ) -> Result<Decided> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                // The approval's row is held until the decision commits: a
                // second decision waits for it, then finds it decided.
                let locked = sqlx::query(concat!(
                    "SELECT id FROM approvals WHERE tenant_id = $1 AND id = $2 ",
                    lock_rows!()
                ))
                .bind(tenant.as_str())
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
                if locked.is_none() {
                    return Ok(Decided::NotFound);
                }
                let sql = format!("{APPROVAL_SELECT} WHERE a.tenant_id = $1 AND a.id = $2");
                let row = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
                let mut approval = approval_from_row(&row)?;
                if approval.status != "pending" {
                    return Ok(Decided::AlreadyDecided(approval));
                }
                let Some(by) = approval.approvers.iter().find(|a| a.id == decision.member).cloned()
                else {
                    return Ok(Decided::NotAnApprover(approval));
                };
                let status = match decision.decision.as_str() {
                    "approve" => "approved",
                    _ => "rejected",
                };
                let now = now_ms();
                sqlx::query(
                    "UPDATE approvals SET status = $3, decided_by = $4, comment = $5, actor = $6,
                        decided_at = $7
                     WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(status)
                .bind(Json(&by))
                .bind(decision.comment.as_deref())
                .bind(Json(&decision.actor))
                .bind(now)
                .execute(&mut *tx)
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
                // While the step's escalation runs, the decision waits in
                // the buffer for the step to park again, which takes it.
                let escalating = escalating_wait(&mut tx, tenant, &signal).await?;
                let sent = send_signal_in(&mut tx, tenant, &signal).await?;
                if sent.resumed.is_empty() && !escalating {
                    // Its job was claimed for the timeout meanwhile: the
                    // timeout won. Nothing of the decision is kept.
                    approval.status = "closed".into();
                    return Ok(Decided::AlreadyDecided(approval));
                }
                let ticket = sqlx::query(
                    "SELECT subject_ticket_id FROM runs WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(approval.run_id.as_str())
                .fetch_optional(&mut *tx)
                .await?
                .and_then(|r| r.get::<Option<String>, _>("subject_ticket_id"));
                if let Some(ticket) = ticket {
                    let verb = if status == "approved" { "Approved" } else { "Rejected" };
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
                    trace_in(&mut tx, tenant, &ticket, "approval", &message, &cause).await?;
                }
                tx.commit().await?;
                approval.status = status.into();
                approval.decided_by = Some(by);
                approval.comment = decision.comment;
                approval.decided_at = Some(now);
                Ok(Decided::Done(approval))
            }
        }
    };
}

pub(crate) use impl_approvals;
