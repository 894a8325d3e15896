//! A run's end in its ticket's trace, on every backend alike: every way a
//! run of a ticket ends — its record (group commit or record transaction),
//! a cancel, a failure from outside the decider — writes one line naming
//! its automation and how it ended, with the run and automation it came
//! from, in the transaction that ends it; a run without a ticket writes
//! none, and a record that does not end the run writes none.

use tok_store::{RunFailure, TraceLine, now_ms};

use super::*;

backend_tests!(
    run_on_fresh_db;
    each_way_a_run_of_a_ticket_ends_is_in_its_trace,
);

/// A run of a new manual automation named `name`, about ticket `ticket`.
async fn run_of(store: &dyn Store, tenant: &TenantId, name: &str, ticket: &str) -> RunId {
    let automation = manual_automation(store, tenant, name).await;
    let mut run = new_run(&automation, "manual", None);
    run.subject_ticket_id = Some(ticket.into());
    store
        .start_run(tenant, manual_event(&automation), run)
        .await
        .expect("start run")
}

async fn claim_of(store: &dyn Store, tenant: &TenantId, run: &RunId) -> ClaimedJob {
    let jobs = store
        .claim(std::slice::from_ref(tenant), "n", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    jobs.into_iter()
        .find(|j| &j.run_id == run)
        .expect("the run's job")
}

fn ended(trace: &[TraceLine]) -> Vec<(&str, &str, Option<&str>)> {
    trace
        .iter()
        .filter(|l| l.kind.starts_with("run_"))
        .map(|l| (l.kind.as_str(), l.message.as_str(), l.run_id.as_deref()))
        .collect()
}

async fn each_way_a_run_of_a_ticket_ends_is_in_its_trace(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;

    // Completed by a record of the group commit; a record that does not
    // end the run writes nothing.
    let done = run_of(store, &t, "Done", "tkt_done").await;
    let job = claim_of(store, &t, &done).await;
    let mut step_on = finish(&job, RunStatus::Running);
    step_on.next = NextJob::Step {
        path: "1".into(),
        delay_ms: 0,
    };
    store.record(&job, step_on).await.unwrap();
    assert!(ended(&store.ticket_trace(&t, "tkt_done").await.unwrap()).is_empty());
    let job = claim_of(store, &t, &done).await;
    store
        .record(&job, finish(&job, RunStatus::Completed))
        .await
        .unwrap();
    let trace = store.ticket_trace(&t, "tkt_done").await.unwrap();
    assert_eq!(
        ended(&trace),
        [(
            "run_completed",
            "Automation \u{201c}Done\u{201d} completed",
            Some(done.as_str())
        )],
        "{backend:?}"
    );
    assert_eq!(
        trace[0].automation_id.as_deref(),
        Some(job.automation_id.as_str())
    );

    // Failed by a record transaction's commit, with its error.
    let failed = run_of(store, &t, "Broken", "tkt_failed").await;
    let job = claim_of(store, &t, &failed).await;
    let tx = store.begin_record(&job).await.unwrap();
    let mut record = finish(&job, RunStatus::Failed);
    record.error = Some("step `st_x` failed: boom".into());
    tx.commit(record).await.unwrap();
    let trace = store.ticket_trace(&t, "tkt_failed").await.unwrap();
    assert_eq!(
        ended(&trace),
        [(
            "run_failed",
            "Automation \u{201c}Broken\u{201d} failed: step `st_x` failed: boom",
            Some(failed.as_str())
        )],
        "{backend:?}"
    );

    // Cancelled while queued.
    let cancelled = run_of(store, &t, "Stopped", "tkt_cancelled").await;
    store.cancel_run(&t, &cancelled).await.unwrap();
    let trace = store.ticket_trace(&t, "tkt_cancelled").await.unwrap();
    assert_eq!(
        ended(&trace),
        [(
            "run_cancelled",
            "Automation \u{201c}Stopped\u{201d} was cancelled",
            Some(cancelled.as_str())
        )],
        "{backend:?}"
    );

    // Failed from outside the decider (a timeout).
    let timed_out = run_of(store, &t, "Slow", "tkt_timed_out").await;
    let failure = RunFailure {
        error: "run_timeout: ran past 1h".into(),
        incident: None,
        event: None,
        cause: Default::default(),
    };
    assert!(
        store
            .fail_run(&t, &timed_out, failure, now_ms())
            .await
            .unwrap()
    );
    let trace = store.ticket_trace(&t, "tkt_timed_out").await.unwrap();
    assert_eq!(
        ended(&trace),
        [(
            "run_failed",
            "Automation \u{201c}Slow\u{201d} failed: run_timeout: ran past 1h",
            Some(timed_out.as_str())
        )],
        "{backend:?}"
    );

    // A run without a ticket writes no line anywhere.
    let (_, job) = claimed_run(store, &t).await;
    store
        .record(&job, finish(&job, RunStatus::Completed))
        .await
        .unwrap();
    for ticket in ["tkt_done", "tkt_failed", "tkt_cancelled", "tkt_timed_out"] {
        let lines = store.ticket_trace(&t, ticket).await.unwrap();
        assert_eq!(ended(&lines).len(), 1, "{backend:?}: {ticket}: {lines:?}");
    }
}
