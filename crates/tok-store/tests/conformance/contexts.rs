//! A run's position and context kept in the rows its steps write anyway: a
//! job that goes on under its lease is found where its run's row says
//! after the lease is lost, and what its records changed of the context
//! (kept with their step rows) reads back as the run's context wherever a
//! context is read: a claim, the run's detail, search, a cancel's
//! compensation. The context is written whole when the run ends, when the
//! changes outgrow it, and before retention deletes the step rows that
//! keep them.
//!
//! Besides what the store answers, two tests read the stored `runs.context`
//! itself: that a step does not write it whole is what this part of the
//! store is for.

use super::*;
use tok_store::ContextChange;

backend_tests!(
    run_on_fresh_db;
    a_job_that_went_on_is_claimed_again_where_its_run_got_to,
    what_records_changed_reads_back_as_the_runs_context,
    a_change_that_outgrows_the_context_writes_it_whole,
    retention_writes_whole_the_context_of_a_run_whose_changes_are_old,
    a_cancel_undoes_what_steps_that_went_on_completed,
    a_cancel_while_a_job_goes_on_leaves_no_position_behind,
);

/// The run's `context` column as stored, without the changes kept in its
/// step rows.
async fn stored_context(db: &TestDb, run: &RunId) -> Value {
    let sql = "SELECT context FROM runs WHERE id = $1";
    match db.backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            let value: sqlx::types::Json<Value> = sqlx::query_scalar(sql)
                .bind(run.as_str())
                .fetch_one(&mut conn)
                .await
                .expect("stored context");
            value.0
        }
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("connect");
            let text: String = sqlx::query_scalar(sql)
                .bind(run.as_str())
                .fetch_one(&mut conn)
                .await
                .expect("stored context");
            serde_json::from_str(&text).expect("a JSON context")
        }
    }
}

/// The step at `job`'s path done with `outputs`, published as the decider
/// publishes them, and the run going on at `next` under the same lease.
fn went_on(job: &ClaimedJob, outputs: Value, next: &str) -> Record {
    let step_id = format!("st_{}", job.path.replace('.', "_"));
    let mut context = tok_core::context::Context::from_value(job.context.clone());
    context.publish(&step_id, outputs.as_object().expect("outputs"));
    let changed = ContextChange::Keys(context.changed());
    Record {
        steps: vec![step(&job.path, tok_store::StepStatus::Completed, outputs)],
        context: context.into_value().into(),
        changed,
        actions: job.actions + 1,
        status: RunStatus::Running,
        error: None,
        next: NextJob::Continue {
            path: next.into(),
            lease_ms: LONG_LEASE_MS,
        },
        subject_ticket_id: None,
    }
}

/// The job as the worker holds it after [`went_on`]: at `next`, its
/// step's first attempt, with the context the record ended with.
fn going_on(job: &ClaimedJob, record: &Record, next: &str) -> ClaimedJob {
    ClaimedJob {
        path: next.into(),
        attempt: 1,
        context: (*record.context).clone(),
        actions: record.actions,
        ..job.clone()
    }
}

async fn a_job_that_went_on_is_claimed_again_where_its_run_got_to(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let run = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];
    let first = store
        .claim(&tenants, "node-a", 1, SHORT_LEASE_MS)
        .await
        .expect("claim")
        .pop()
        .expect("the run's job");
    let record = went_on(&first, json!({ "n": 1 }), "1");
    assert!(
        store
            .record_and_continue(&first, record.clone())
            .await
            .expect("record")
    );
    let at_one = going_on(&first, &record, "1");
    let record = went_on(&at_one, json!({ "m": 2 }), "2");
    assert!(
        store
            .record_and_continue(&at_one, record.clone())
            .await
            .expect("record")
    );
    let at_two = going_on(&at_one, &record, "2");

    // The worker stops: no heartbeat, and its lease runs out.
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let again = store
        .claim(&tenants, "node-b", 10, LONG_LEASE_MS)
        .await
        .expect("claim")
        .pop()
        .expect("the job, its lease lost");
    assert_eq!(again.run_id, run, "{backend:?}");
    assert_eq!(
        (again.path.as_str(), again.attempt),
        ("2", 2),
        "{backend:?}: claimed again at the step the run went on to, as its second attempt"
    );
    assert_eq!(again.context["st_0"], json!({ "n": 1 }), "{backend:?}");
    assert_eq!(again.context["m"], json!(2), "{backend:?}");
    assert_eq!(again.actions, 2, "{backend:?}");

    // The first worker's record of that step is stale.
    assert!(
        matches!(
            store
                .record(&at_two, finish(&at_two, RunStatus::Completed))
                .await,
            Err(StoreError::LeaseLost(_))
        ),
        "{backend:?}"
    );
    store
        .record(&again, finish(&again, RunStatus::Completed))
        .await
        .expect("record");
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    assert_eq!(detail.run.status, "completed", "{backend:?}");
    let paths: Vec<(&str, i32)> = detail
        .steps
        .iter()
        .map(|s| (s.path.as_str(), s.attempt))
        .collect();
    assert_eq!(paths, [("0", 1), ("1", 1), ("2", 1)], "{backend:?}");
}

async fn what_records_changed_reads_back_as_the_runs_context(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, job) = claimed_run(store, &t).await;
    let before = job.context.clone();

    let record = went_on(&job, json!({ "status": 200, "order": "A-1" }), "1");
    assert!(
        store
            .record_and_continue(&job, record.clone())
            .await
            .expect("record")
    );
    let job = going_on(&job, &record, "1");
    // The next record sets a reserved entry and removes it in the one
    // after: a removal is a change too.
    let mut context = tok_core::context::Context::from_value(job.context.clone());
    context.set_reserved("_escalations", Some(json!({ "1": { "since": 5 } })));
    let record = Record {
        changed: ContextChange::Keys(context.changed()),
        context: context.into_value().into(),
        ..went_on(&job, json!({}), "2")
    };
    assert!(
        store
            .record_and_continue(&job, record.clone())
            .await
            .expect("record")
    );
    let job = going_on(&job, &record, "2");
    let mut context = tok_core::context::Context::from_value(job.context.clone());
    context.set_reserved("_escalations", None);
    context.publish(
        "st_2",
        &serde_json::Map::from_iter([("total".into(), json!(9))]),
    );
    let record = Record {
        changed: ContextChange::Keys(context.changed()),
        context: context.into_value().into(),
        ..went_on(&job, json!({}), "3")
    };
    assert!(
        store
            .record_and_continue(&job, record.clone())
            .await
            .expect("record")
    );
    let job = going_on(&job, &record, "3");
    let expected = job.context.clone();
    assert_eq!(expected["st_0"]["order"], json!("A-1"));
    assert!(expected.get("_escalations").is_none());

    assert_eq!(
        stored_context(db, &run).await,
        before,
        "{backend:?}: three steps went on and none wrote the context whole"
    );
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    assert_eq!(detail.context, expected, "{backend:?}: the run's detail");
    let contexts = store
        .run_contexts(&t, std::slice::from_ref(&run))
        .await
        .expect("contexts");
    assert_eq!(
        contexts,
        [(run.clone(), expected.clone())],
        "{backend:?}: search"
    );
    // What a search reads of it, before it is read: the context as the
    // dispatch wrote it (measured) and the changes since.
    let stored = serde_json::to_string(&before).unwrap().len() as i64;
    let sizes = store
        .run_context_sizes(&t, &[run.clone(), RunId::from("run_none")])
        .await
        .expect("sizes");
    assert_eq!(
        sizes.len(),
        1,
        "{backend:?}: only the runs it has: {sizes:?}"
    );
    assert_eq!(sizes[0].0, run);
    assert!(
        sizes[0].1 > stored,
        "{backend:?}: {sizes:?} > {stored} and the changes"
    );
    let other = tenant(store, "beta").await;
    assert_eq!(
        store
            .run_context_sizes(&other, std::slice::from_ref(&run))
            .await
            .unwrap(),
        [],
        "{backend:?}: another tenant's run"
    );

    // The run ends: its context is written whole, as it is.
    store
        .record(&job, finish(&job, RunStatus::Completed))
        .await
        .expect("record");
    assert_eq!(stored_context(db, &run).await, expected, "{backend:?}");
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    assert_eq!(detail.context, expected, "{backend:?}");
    let whole = serde_json::to_string(&expected).unwrap().len() as i64;
    assert_eq!(
        store
            .run_context_sizes(&t, std::slice::from_ref(&run))
            .await
            .unwrap(),
        [(run.clone(), whole)],
        "{backend:?}: the size it was written whole at"
    );
}

async fn a_change_that_outgrows_the_context_writes_it_whole(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, job) = claimed_run(store, &t).await;
    let small = went_on(&job, json!({ "n": 1 }), "1");
    assert!(
        store
            .record_and_continue(&job, small.clone())
            .await
            .expect("record")
    );
    let job = going_on(&job, &small, "1");
    assert!(
        stored_context(db, &run).await.get("st_0").is_none(),
        "{backend:?}"
    );
    // 100 kB of output: more than the changes a run keeps beside a small
    // context.
    let big = went_on(&job, json!({ "page": "x".repeat(100_000) }), "2");
    assert!(
        store
            .record_and_continue(&job, big.clone())
            .await
            .expect("record")
    );
    let stored = stored_context(db, &run).await;
    assert_eq!(
        stored, *big.context,
        "{backend:?}: written whole, the small change with it"
    );
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    assert_eq!(detail.context, *big.context, "{backend:?}");
}

async fn retention_writes_whole_the_context_of_a_run_whose_changes_are_old(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, job) = claimed_run(store, &t).await;
    let record = went_on(&job, json!({ "order": "A-7" }), "1");
    assert!(
        store
            .record_and_continue(&job, record.clone())
            .await
            .expect("record")
    );
    let job = going_on(&job, &record, "1");
    // The run then waits a long time at its next step.
    let waits = Record {
        next: NextJob::Step {
            path: "2".into(),
            delay_ms: 30 * 24 * 3600 * 1000,
        },
        ..went_on(&job, json!({ "more": true }), "2")
    };
    store.record(&job, waits.clone()).await.expect("record");
    assert!(
        stored_context(db, &run).await.get("st_0").is_none(),
        "{backend:?}"
    );

    // Retention expires step rows from before a day from now.
    let later = tok_store::now_ms() + 24 * 3600 * 1000;
    let kept = store
        .keep_contexts_whole(&t, later, 100)
        .await
        .expect("keep");
    assert_eq!(kept, 1, "{backend:?}");
    assert_eq!(
        stored_context(db, &run).await,
        *waits.context,
        "{backend:?}"
    );
    assert_eq!(
        store
            .keep_contexts_whole(&t, later, 100)
            .await
            .expect("keep"),
        0,
        "{backend:?}: written whole once"
    );
    let deleted = store
        .expire(&t, tok_store::retention::Expiring::StepData, later, 100)
        .await
        .expect("expire");
    assert_eq!(deleted, 2, "{backend:?}");
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    assert!(detail.steps.is_empty(), "{backend:?}");
    assert_eq!(
        detail.context, *waits.context,
        "{backend:?}: the context outlives its steps"
    );
}

async fn a_cancel_undoes_what_steps_that_went_on_completed(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, job) = claimed_run(store, &t).await;
    // Step 0 completed, and it has compensations: the decider put it on
    // the list of steps to undo.
    let mut context = tok_core::context::Context::from_value(job.context.clone());
    context.set_reserved(tok_core::compensation::COMPENSABLE_KEY, Some(json!(["0"])));
    let record = Record {
        changed: ContextChange::Keys(context.changed()),
        context: context.into_value().into(),
        next: NextJob::Step {
            path: "1".into(),
            delay_ms: 3_600_000,
        },
        ..went_on(&job, json!({}), "1")
    };
    store.record(&job, record).await.expect("record");
    store.cancel_run(&t, &run).await.expect("cancel");
    let undo = store
        .claim(std::slice::from_ref(&t), "n", 10, LONG_LEASE_MS)
        .await
        .expect("claim")
        .pop()
        .expect("the compensation's job");
    assert_eq!(undo.path, "0", "{backend:?}: the completed step is undone");
    assert!(
        matches!(undo.resume, Some(tok_store::Resume::Cancel { .. })),
        "{backend:?}"
    );
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    assert_eq!(detail.run.status, "compensating", "{backend:?}");
}

/// A cancel deletes the jobs of a run whose job went on under its lease:
/// the compensation's job (which SQLite may give the same id) starts where
/// it is written, not where the gone job had got to, and a run cancelled
/// with nothing to undo keeps its context whole.
async fn a_cancel_while_a_job_goes_on_leaves_no_position_behind(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let (run, job) = claimed_run(store, &t).await;
    let mut context = tok_core::context::Context::from_value(job.context.clone());
    context.set_reserved(tok_core::compensation::COMPENSABLE_KEY, Some(json!(["0"])));
    let record = Record {
        changed: ContextChange::Keys(context.changed()),
        context: context.into_value().into(),
        ..went_on(&job, json!({}), "1")
    };
    assert!(
        store
            .record_and_continue(&job, record)
            .await
            .expect("record")
    );
    store.cancel_run(&t, &run).await.expect("cancel");
    let undo = store
        .claim(std::slice::from_ref(&t), "n", 10, LONG_LEASE_MS)
        .await
        .expect("claim")
        .pop()
        .expect("the compensation's job");
    assert_eq!(
        (undo.path.as_str(), undo.attempt),
        ("0", 1),
        "{backend:?}: the compensation's own job, job {} before {}",
        job.id.0,
        undo.id.0
    );

    // Nothing to undo: the run ends at the cancel, its context whole.
    let (run, job) = claimed_run(store, &t).await;
    let record = went_on(&job, json!({ "order": "A-9" }), "1");
    assert!(
        store
            .record_and_continue(&job, record.clone())
            .await
            .expect("record")
    );
    store.cancel_run(&t, &run).await.expect("cancel");
    let detail = store.run(&t, &run).await.unwrap().unwrap();
    assert_eq!(detail.run.status, "cancelled", "{backend:?}");
    assert_eq!(
        stored_context(db, &run).await,
        *record.context,
        "{backend:?}"
    );
}
