//! The rows of the start controls (`flow`, docs/workflows.md, "Shaping the
//! starts: debounce, throttle, batch, singleton") through the dispatcher's
//! transaction and the watch: a key's row decided on by one dispatch at a
//! time, a held first job that says what holds it and that an event may
//! join until a worker claims it, a run not begun by its `startTimeout`
//! expired (and a begun one not), `cancelOn` rows found by value and gone
//! with their run. (What the controls decide is `tok_core::start`'s and the
//! engine's, tested there.)

use std::sync::atomic::{AtomicBool, Ordering};

use tok_core::run::{CancelKey, Hold, Resume};
use tok_core::start::{KeyRun, KeyState};
use tok_store::now_ms;

use super::*;

backend_tests!(
    run_on_fresh_db;
    two_dispatches_deciding_on_one_key_decide_one_after_the_other,
    a_held_first_job_says_what_holds_it_and_takes_joins_until_it_is_claimed,
    a_run_not_begun_by_its_start_timeout_expires_and_a_begun_one_does_not,
    cancel_rows_are_found_by_value_and_go_with_their_run,
    a_queued_singleton_run_goes_when_the_keys_run_has_ended,
    a_released_singleton_run_on_a_ticket_waits_for_the_tickets_other_runs,
);

fn key(run: &RunId) -> KeyState {
    KeyState {
        run_id: run.to_string(),
        run: KeyRun::Open,
        opened_at: 1,
        count: 1,
        next_at: 0,
    }
}

/// A held run of `automation`, written by a dispatch of a fresh event.
async fn held_run(
    store: &dyn Store,
    tenant: &TenantId,
    source: &SourceId,
    automation: &AutomationId,
    n: &str,
    mut run: NewRun,
) -> RunId {
    let (event, _) = store
        .accept_event(tenant, webhook_event(source, n))
        .await
        .expect("accept");
    let mut tx = store
        .begin_dispatch(std::slice::from_ref(tenant), Lane::Bulk)
        .await
        .expect("begin");
    run.automation_id = automation.clone();
    let id = run.id.clone();
    tx.insert_runs(&[(tenant.clone(), event, run)], None)
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    id
}

fn held(delay_ms: i64) -> Hold {
    Hold {
        delay_ms,
        resume: Resume::Deferred {
            limit: "debounce".into(),
            reason: "debounced: starts 1m after the last event".into(),
        },
    }
}

async fn two_dispatches_deciding_on_one_key_decide_one_after_the_other(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    let aut = webhook_automation(store, &t, "orders", &src).await;
    let tenants = [t.clone()];
    let mut first = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
    let row = first.flow_key(&t, &aut, "debounce", "c-1").await.unwrap();
    assert_eq!(row, None, "{backend:?}: a new key");
    let committed = AtomicBool::new(false);
    let run = RunId::generate();
    let (seen, ()) = tokio::join!(
        async {
            let mut second = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
            let row = second.flow_key(&t, &aut, "debounce", "c-1").await.unwrap();
            let after = committed.load(Ordering::SeqCst);
            drop(second);
            (row, after)
        },
        async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            first
                .put_flow_key(&t, &aut, "debounce", "c-1", &key(&run))
                .await
                .unwrap();
            committed.store(true, Ordering::SeqCst);
            first.commit().await.unwrap();
        }
    );
    let (row, after) = seen;
    assert!(
        after,
        "{backend:?}: the second read waited for the first's commit"
    );
    let row = row.expect("the first's row");
    assert_eq!(row.run_id, run.as_str(), "{backend:?}");
    // Its run is not written: the row names a run that is gone.
    assert_eq!(row.run, KeyRun::Ended, "{backend:?}");
    // Another key is not held by this one.
    let mut tx = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
    assert_eq!(
        tx.flow_key(&t, &aut, "debounce", "c-2").await.unwrap(),
        None
    );
}

async fn a_held_first_job_says_what_holds_it_and_takes_joins_until_it_is_claimed(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    let aut = webhook_automation(store, &t, "orders", &src).await;
    let tenants = [t.clone()];
    let mut run = new_run(&aut, "webhook", None);
    run.hold = Some(held(60_000));
    let id = held_run(store, &t, &src, &aut, "e1", run).await;

    let detail = store.run(&t, &id).await.unwrap().expect("the run");
    assert_eq!(detail.run.status, "queued", "{backend:?}");
    let blocked = detail.run.blocked_by.expect("held");
    assert_eq!(blocked.kind, "debounce", "{backend:?}");
    let until = blocked.until.expect("until");
    assert!(until > now_ms() + 50_000, "{backend:?}: due in a minute");
    let claimed = store.claim(&tenants, "n", 10, LONG_LEASE_MS).await.unwrap();
    assert!(claimed.is_empty(), "{backend:?}: not due yet");

    // The key's row names it open; an event joins it and makes it due now.
    let mut tx = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
    tx.put_flow_key(&t, &aut, "debounce", "", &key(&id))
        .await
        .unwrap();
    let row = tx
        .flow_key(&t, &aut, "debounce", "")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.run, KeyRun::Open, "{backend:?}");
    let joined = tx.join_run(&t, &id, &json!({ "n": 2 }), 0).await.unwrap();
    assert!(joined, "{backend:?}");
    tx.commit().await.unwrap();
    let job = store
        .claim(&tenants, "n", 10, LONG_LEASE_MS)
        .await
        .unwrap()
        .pop()
        .expect("due now");
    assert_eq!(job.run_id, id, "{backend:?}");
    assert_eq!(
        job.context,
        json!({ "n": 2 }),
        "{backend:?}: the joined context"
    );

    // Claimed, it has begun: a join is refused and the row says so.
    let mut tx = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
    let row = tx
        .flow_key(&t, &aut, "debounce", "")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.run, KeyRun::Active, "{backend:?}");
    let joined = tx.join_run(&t, &id, &json!({ "n": 3 }), 0).await.unwrap();
    assert!(!joined, "{backend:?}");
    tx.commit().await.unwrap();
    let detail = store.run(&t, &id).await.unwrap().unwrap();
    assert_eq!(detail.context, json!({ "n": 2 }), "{backend:?}: unchanged");
}

async fn a_run_not_begun_by_its_start_timeout_expires_and_a_begun_one_does_not(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    let aut = webhook_automation(store, &t, "orders", &src).await;
    let tenants = [t.clone()];
    let past = now_ms() - 1_000;
    let mut waiting = new_run(&aut, "webhook", None);
    waiting.hold = Some(held(60_000));
    waiting.start_by = Some(past);
    let waiting = held_run(store, &t, &src, &aut, "e1", waiting).await;
    let mut begun = new_run(&aut, "webhook", None);
    begun.start_by = Some(past);
    let begun = held_run(store, &t, &src, &aut, "e2", begun).await;
    let mut later = new_run(&aut, "webhook", None);
    later.hold = Some(held(60_000));
    later.start_by = Some(now_ms() + 600_000);
    held_run(store, &t, &src, &aut, "e3", later).await;
    let claimed = store.claim(&tenants, "n", 10, LONG_LEASE_MS).await.unwrap();
    assert_eq!(
        run_ids(&claimed),
        HashSet::from([begun.clone()]),
        "{backend:?}"
    );

    let due = store.unstarted_past(&tenants, now_ms(), 10).await.unwrap();
    let due: HashSet<RunId> = due.into_iter().map(|r| r.run_id).collect();
    // The begun one is `running` now: not queued, not listed.
    assert_eq!(due, HashSet::from([waiting.clone()]), "{backend:?}");
    assert!(
        store
            .expire_run(&t, &waiting, "expired: x", now_ms())
            .await
            .unwrap()
    );
    assert!(
        !store
            .expire_run(&t, &begun, "expired: x", now_ms())
            .await
            .unwrap(),
        "{backend:?}: a claimed run has begun"
    );
    let detail = store.run(&t, &waiting).await.unwrap().unwrap();
    assert_eq!(detail.run.status, "expired", "{backend:?}");
    assert_eq!(detail.run.error.as_deref(), Some("expired: x"));
    let stats = store.queue_stats(&tenants).await.unwrap();
    assert_eq!(stats.ready, 0, "{backend:?}: its job went with it");
    assert!(
        store
            .unstarted_past(&tenants, now_ms(), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let begun = store.run(&t, &begun).await.unwrap().unwrap();
    assert_eq!(begun.run.status, "running", "{backend:?}");
}

async fn cancel_rows_are_found_by_value_and_go_with_their_run(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    let aut = webhook_automation(store, &t, "orders", &src).await;
    let tenants = [t.clone()];
    let cancel = |value: &str| CancelKey {
        source: "src_cancels".into(),
        path: "_body.orderId".into(),
        value: value.into(),
        filter: None,
    };
    let mut ids = Vec::new();
    for (n, order) in ["o-1", "o-2"].into_iter().enumerate() {
        let mut run = new_run(&aut, "webhook", None);
        run.cancels = vec![cancel(&format!("\"{order}\""))];
        ids.push(held_run(store, &t, &src, &aut, &format!("e{n}"), run).await);
    }
    let other = tenant(store, "globex").await;
    let mut theirs = store
        .begin_dispatch(std::slice::from_ref(&other), Lane::Bulk)
        .await
        .unwrap();
    let paths = theirs.cancel_paths(&other, &["src_cancels"]).await.unwrap();
    assert!(paths.is_empty(), "{backend:?}: another tenant's rows");
    theirs.commit().await.unwrap();
    let mut tx = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
    let paths = tx
        .cancel_paths(&t, &["src_cancels", "ticket.closed"])
        .await
        .unwrap();
    assert_eq!(
        paths,
        [("src_cancels".to_owned(), "_body.orderId".to_owned())]
    );
    assert!(
        tx.cancel_paths(&t, &["src_other"])
            .await
            .unwrap()
            .is_empty()
    );
    let found = tx
        .cancel_matches(&t, "src_cancels", "_body.orderId", "\"o-1\"")
        .await
        .unwrap();
    assert_eq!(found, [(ids[0].clone(), None)], "{backend:?}");
    tx.cancel_run(&t, &ids[0], "cancelled by event e9 (flow.cancelOn)")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let detail = store.run(&t, &ids[0]).await.unwrap().unwrap();
    assert_eq!(detail.run.status, "cancelled", "{backend:?}");
    assert!(detail.run.error.unwrap().contains("flow.cancelOn"));
    let mut tx = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
    let found = tx
        .cancel_matches(&t, "src_cancels", "_body.orderId", "\"o-1\"")
        .await
        .unwrap();
    assert!(found.is_empty(), "{backend:?}: its rows went with it");
    let found = tx
        .cancel_matches(&t, "src_cancels", "_body.orderId", "\"o-2\"")
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{backend:?}: the other's stay");
}

async fn a_queued_singleton_run_goes_when_the_keys_run_has_ended(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    let aut = webhook_automation(store, &t, "orders", &src).await;
    let tenants = [t.clone()];
    let first = held_run(store, &t, &src, &aut, "e1", new_run(&aut, "webhook", None)).await;
    let queue = tok_core::start::singleton_queue_key(aut.as_str(), "o-1");
    let mut queued = Vec::new();
    for n in ["e2", "e3"] {
        let mut run = new_run(&aut, "webhook", Some(&queue));
        run.hold = Some(Hold {
            delay_ms: tok_core::start::QUEUED_FOR_MS,
            resume: Resume::Deferred {
                limit: "singleton".into(),
                reason: "queued".into(),
            },
        });
        queued.push(held_run(store, &t, &src, &aut, n, run).await);
    }
    let mut tx = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
    let mut row = key(&first);
    row.count = 2;
    tx.put_flow_key(&t, &aut, "singleton", "o-1", &row)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let detail = store.run(&t, &queued[0]).await.unwrap().unwrap();
    let blocked = detail.run.blocked_by.expect("held");
    assert_eq!(
        (blocked.kind.as_str(), blocked.until),
        ("singleton", None),
        "{backend:?}"
    );

    // The key's run is unfinished: nothing goes.
    assert!(
        store
            .singletons_to_release(&tenants, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let job = store.claim(&tenants, "n", 10, LONG_LEASE_MS).await.unwrap();
    assert_eq!(run_ids(&job), HashSet::from([first.clone()]), "{backend:?}");
    store
        .record(&job[0], finish(&job[0], RunStatus::Completed))
        .await
        .unwrap();
    let keys = store.singletons_to_release(&tenants, 10).await.unwrap();
    assert_eq!(keys.len(), 1, "{backend:?}");
    let went = store.release_singleton(&keys[0]).await.unwrap();
    assert_eq!(
        went.as_ref(),
        Some(&queued[0]),
        "{backend:?}: the oldest first"
    );
    assert!(
        store
            .singletons_to_release(&tenants, 10)
            .await
            .unwrap()
            .is_empty(),
        "{backend:?}: its run is the key's now, unfinished"
    );
    let job = store.claim(&tenants, "n", 10, LONG_LEASE_MS).await.unwrap();
    assert_eq!(
        run_ids(&job),
        HashSet::from([queued[0].clone()]),
        "{backend:?}"
    );
    store
        .record(&job[0], finish(&job[0], RunStatus::Completed))
        .await
        .unwrap();
    let keys = store.singletons_to_release(&tenants, 10).await.unwrap();
    assert_eq!(
        store.release_singleton(&keys[0]).await.unwrap().as_ref(),
        Some(&queued[1])
    );
}

async fn a_released_singleton_run_on_a_ticket_waits_for_the_tickets_other_runs(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    let aut = webhook_automation(store, &t, "orders", &src).await;
    let tenants = [t.clone()];
    let on_ticket = |queue: &str| {
        let mut run = new_run(&aut, "ticket", Some(queue));
        run.subject_ticket_id = Some("tk_1".into());
        run
    };
    // The key's run, and a run of another automation on the same ticket.
    let first = held_run(store, &t, &src, &aut, "e1", on_ticket("ticket:tk_1")).await;
    let job = store.claim(&tenants, "n", 10, LONG_LEASE_MS).await.unwrap();
    assert_eq!(run_ids(&job), HashSet::from([first.clone()]), "{backend:?}");
    store
        .record(&job[0], finish(&job[0], RunStatus::Completed))
        .await
        .unwrap();
    let other = held_run(store, &t, &src, &aut, "e2", on_ticket("ticket:tk_1")).await;
    let mut run = on_ticket(&tok_core::start::singleton_queue_key(aut.as_str(), "o-1"));
    run.hold = Some(Hold {
        delay_ms: tok_core::start::QUEUED_FOR_MS,
        resume: Resume::Deferred {
            limit: "singleton".into(),
            reason: "queued".into(),
        },
    });
    let queued = held_run(store, &t, &src, &aut, "e3", run).await;
    let mut tx = store.begin_dispatch(&tenants, Lane::Bulk).await.unwrap();
    tx.put_flow_key(&t, &aut, "singleton", "o-1", &key(&first))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let busy = store.claim(&tenants, "n", 10, LONG_LEASE_MS).await.unwrap();
    assert_eq!(
        run_ids(&busy),
        HashSet::from([other.clone()]),
        "{backend:?}"
    );

    let keys = store.singletons_to_release(&tenants, 10).await.unwrap();
    assert_eq!(keys.len(), 1, "{backend:?}");
    assert_eq!(
        store.release_singleton(&keys[0]).await.unwrap().as_ref(),
        Some(&queued),
        "{backend:?}"
    );
    assert!(
        store
            .claim(&tenants, "n", 10, LONG_LEASE_MS)
            .await
            .unwrap()
            .is_empty(),
        "{backend:?}: the released run waits while another run holds its ticket"
    );
    store
        .record(&busy[0], finish(&busy[0], RunStatus::Completed))
        .await
        .unwrap();
    let job = store.claim(&tenants, "n", 10, LONG_LEASE_MS).await.unwrap();
    assert_eq!(
        run_ids(&job),
        HashSet::from([queued.clone()]),
        "{backend:?}: then it goes"
    );
}
