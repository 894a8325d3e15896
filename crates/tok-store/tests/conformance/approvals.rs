//! Approvals: one opened in a record transaction is pending while its run
//! waits on its decision key; a decision by one of its approvers resumes
//! that wait with the decision and who made it, once; a member who is not
//! an approver changes nothing; an approval whose run no longer waits is
//! closed and takes no decision; another tenant never sees it.

use tok_store::{Approver, Decided, Decision, NewApproval, NewGroup, Resume, SignalWait};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_decision_resumes_the_wait_once_and_only_from_an_approver,
    an_approval_whose_run_no_longer_waits_is_closed,
);

fn decision(decision: &str, member: &str) -> Decision {
    Decision {
        decision: decision.into(),
        member: member.into(),
        comment: Some("ok".into()),
        actor: json!({ "kind": "key", "id": "key_1" }),
    }
}

/// A run parked at an approval step (path `0`) for the group's members;
/// returns the run, the approval's id and the approvers.
async fn waiting(store: &dyn Store, t: &TenantId) -> (RunId, String, Vec<Approver>) {
    let group = store
        .create_group(
            t,
            NewGroup {
                name: "Finance".into(),
                members: vec![("Alice".into(), 5), ("Bob".into(), 5)],
            },
        )
        .await
        .expect("group");
    let automation = manual_automation(store, t, "refund").await;
    let run = start(store, t, &automation, "manual", None).await;
    let job = store
        .claim(std::slice::from_ref(t), "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim")
        .into_iter()
        .find(|j| j.run_id == run)
        .expect("the run's job");
    let mut tx = store.begin_record(&job).await.expect("record");
    let ids: Vec<String> = group.members.iter().map(|m| m.id.clone()).collect();
    let members = tx.members(&ids).await.expect("members");
    assert_eq!(members.len(), 2);
    let approvers: Vec<Approver> = members
        .into_iter()
        .map(|m| Approver {
            id: m.id,
            name: m.name,
        })
        .collect();
    let id = tx
        .open_approval(NewApproval {
            step_id: "st_ok".into(),
            path: "0".into(),
            prompt: "Refund?".into(),
            approvers: approvers.clone(),
        })
        .await
        .expect("open");
    let wait = SignalWait {
        key: tok_core::approval::decision_key(&id),
        subject: None,
        filter: None,
        lookback: false,
        due_at: None,
        ..Default::default()
    };
    let record = Record {
        subject_ticket_id: None,
        steps: vec![step("0", tok_store::StepStatus::Waiting, json!({}))],
        context: job.context.clone().into(),
        changed: tok_store::ContextChange::Whole,
        actions: 1,
        status: RunStatus::Waiting,
        error: None,
        next: NextJob::Wait {
            path: "0".into(),
            wait,
        },
    };
    tx.commit(record).await.expect("commit");
    (run, id, approvers)
}

async fn a_decision_resumes_the_wait_once_and_only_from_an_approver(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let other = tenant(store, "other").await;
    let (run, id, approvers) = waiting(store, &t).await;
    let pending = store.approvals(&t, true, 50, None).await.unwrap().items;
    assert_eq!(pending.len(), 1, "{backend:?}");
    assert_eq!(pending[0].status, "pending");
    assert_eq!(pending[0].approvers, approvers);
    assert!(
        store
            .approvals(&other, false, 50, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert_eq!(
        store
            .decide_approval(&other, &id, decision("approve", &approvers[0].id))
            .await
            .unwrap(),
        Decided::NotFound,
        "{backend:?}"
    );
    assert!(matches!(
        store
            .decide_approval(&t, &id, decision("approve", "mem_stranger"))
            .await
            .unwrap(),
        Decided::NotAnApprover(_)
    ));
    let Decided::Done(done) = store
        .decide_approval(&t, &id, decision("reject", &approvers[1].id))
        .await
        .unwrap()
    else {
        panic!("{backend:?}: the decision was not taken")
    };
    assert_eq!(done.status, "rejected");
    assert_eq!(done.decided_by.as_ref(), Some(&approvers[1]));
    let Decided::AlreadyDecided(again) = store
        .decide_approval(&t, &id, decision("approve", &approvers[0].id))
        .await
        .unwrap()
    else {
        panic!("{backend:?}: a second decision was taken")
    };
    assert_eq!(again.status, "rejected", "{backend:?}");
    assert!(
        store
            .approvals(&t, true, 50, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let resumed = store
        .claim(std::slice::from_ref(&t), "node-1", 10, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(resumed.len(), 1, "{backend:?}");
    assert_eq!(resumed[0].run_id, run);
    let Some(Resume::Signal { payload, .. }) = &resumed[0].resume else {
        panic!("{backend:?}: {:?}", resumed[0].resume)
    };
    assert_eq!(payload["decision"], "reject");
    assert_eq!(payload["by"]["name"], "Bob");
    assert_eq!(payload["comment"], "ok");
}

async fn an_approval_whose_run_no_longer_waits_is_closed(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, id, approvers) = waiting(store, &t).await;
    store.cancel_run(&t, &run).await.expect("cancel");
    assert!(
        store
            .approvals(&t, true, 50, None)
            .await
            .unwrap()
            .items
            .is_empty(),
        "{backend:?}"
    );
    let all = store.approvals(&t, false, 50, None).await.unwrap().items;
    assert_eq!(all[0].status, "closed", "{backend:?}");
    assert!(matches!(
        store.decide_approval(&t, &id, decision("approve", &approvers[0].id)).await.unwrap(),
        Decided::AlreadyDecided(a) if a.status == "closed"
    ));
}
