//! The dispatcher's transaction (`InboxStore::begin_dispatch`,
//! `DispatchTx`): one run per (event, automation) however often and however
//! concurrently an event is dispatched, only the given tenants' events,
//! selected fair between tenants, a ticket's recent runs counted, and the
//! steps and claimed jobs written with the runs; one event taken alone, and
//! one set aside that no dispatch takes again. (What a dispatch decides
//! with these — crowding, loop protection, which event to set aside — is
//! the engine's, tested there.)

use super::*;

backend_tests!(
    run_on_fresh_db;
    dispatching_an_event_again_creates_no_second_run,
    concurrent_dispatchers_create_one_run_per_event_and_automation,
    dispatch_takes_only_the_given_tenants_events,
    an_event_no_automation_listens_to_is_dispatched_without_planning,
    pending_events_are_selected_round_robin_between_tenants,
    a_small_tenants_event_is_selected_with_a_large_backlog,
    an_urgent_dispatch_takes_only_its_tenants_events,
    a_dispatch_counts_a_tickets_recent_runs_and_writes_its_trace,
    a_dispatch_writes_the_steps_its_runs_already_ran,
    a_dispatch_hands_the_jobs_it_was_offered_to_its_node_already_claimed,
    one_event_is_taken_alone_and_one_set_aside_is_taken_no_more,
);

async fn dispatching_an_event_again_creates_no_second_run(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    let orders = webhook_automation(store, &t, "orders", &src).await;
    let audit = webhook_automation(store, &t, "audit", &src).await;
    let tenants = [t.clone()];

    let (event, _) = store
        .accept_event(&t, webhook_event(&src, "order-1"))
        .await
        .expect("accept");
    let taken = dispatch(store, &tenants, 10, &one_run_per_candidate)
        .await
        .expect("dispatch");
    assert_eq!(taken, 1, "{backend:?}");
    let first = all_runs(store, &t).await;
    let automations: HashSet<_> = first.iter().map(|r| r.automation_id.clone()).collect();
    assert_eq!(automations, HashSet::from([orders, audit]), "{backend:?}");
    assert!(first.iter().all(|r| r.event_id == event), "{backend:?}");
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!((stats.ready, stats.pending_events), (2, 0), "{backend:?}");

    // A crash after the runs were written but before the event's mark was
    // seen: the event is pending again and the dispatcher takes it again.
    let marked = raw_sql(
        db,
        &format!(
            "UPDATE event_inbox SET status = 'pending', dispatched_at = NULL WHERE id = '{event}'"
        ),
    )
    .await;
    assert_eq!(marked, 1, "{backend:?}");
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(stats.pending_events, 1, "{backend:?}");
    let taken = dispatch(store, &tenants, 10, &one_run_per_candidate)
        .await
        .expect("dispatch");
    assert_eq!(taken, 1, "{backend:?}");

    let second = all_runs(store, &t).await;
    let ids = |runs: &[RunSummary]| runs.iter().map(|r| r.id.clone()).collect::<HashSet<_>>();
    assert_eq!(
        ids(&second),
        ids(&first),
        "{backend:?}: the same two runs, no new ones"
    );
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.pending_events),
        (2, 0),
        "{backend:?}: no extra jobs"
    );
}

async fn concurrent_dispatchers_create_one_run_per_event_and_automation(db: &TestDb) {
    let backend = db.backend;
    let store: Arc<dyn Store> = db.store().await;
    let t = tenant(&*store, "acme").await;
    let src = source(&*store, &t, "eshop").await;
    webhook_automation(&*store, &t, "orders", &src).await;
    webhook_automation(&*store, &t, "audit", &src).await;
    let mut events = HashSet::new();
    for i in 0..40 {
        let (id, _) = store
            .accept_event(&t, webhook_event(&src, &format!("o{i}")))
            .await
            .unwrap();
        events.insert(id);
    }

    let dispatchers: Vec<_> = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            let tenants = vec![t.clone()];
            tokio::spawn(async move {
                let mut taken = 0;
                loop {
                    match dispatch(&*store, &tenants, 3, &one_run_per_candidate).await {
                        Ok(0) => return Ok(taken),
                        Ok(n) => taken += n,
                        Err(e) => return Err(e),
                    }
                }
            })
        })
        .collect();
    let mut taken = 0;
    for d in dispatchers {
        taken += d.await.expect("dispatcher task").expect("dispatch");
    }
    assert!(taken >= 40, "{backend:?}: only {taken} of 40 events taken");

    let runs = all_runs(&*store, &t).await;
    let pairs: HashSet<(EventId, AutomationId)> = runs
        .iter()
        .map(|r| (r.event_id.clone(), r.automation_id.clone()))
        .collect();
    assert_eq!(runs.len(), 80, "{backend:?}: two automations x 40 events");
    assert_eq!(
        pairs.len(),
        80,
        "{backend:?}: a duplicate (event, automation) run"
    );
    let seen: HashSet<EventId> = pairs.iter().map(|(e, _)| e.clone()).collect();
    assert_eq!(seen, events, "{backend:?}");
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!((stats.ready, stats.pending_events), (80, 0), "{backend:?}");
}

async fn dispatch_takes_only_the_given_tenants_events(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let src_a = source(store, &a, "eshop").await;
    let src_b = source(store, &b, "eshop").await;
    webhook_automation(store, &a, "orders", &src_a).await;
    webhook_automation(store, &b, "orders", &src_b).await;
    store
        .accept_event(&a, webhook_event(&src_a, "same-key"))
        .await
        .expect("accept");
    store
        .accept_event(&b, webhook_event(&src_b, "same-key"))
        .await
        .expect("accept");

    let seen = std::sync::Mutex::new(Vec::new());
    let planner = |event: &PendingEvent, candidates: &[Candidate]| {
        seen.lock().unwrap().push(event.tenant_id.clone());
        one_run_per_candidate(event, candidates)
    };
    let taken = dispatch(store, std::slice::from_ref(&a), 10, &planner)
        .await
        .expect("dispatch");
    assert_eq!(taken, 1, "{backend:?}");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![a.clone()],
        "{backend:?}: planner saw other tenants"
    );
    assert_eq!(all_runs(store, &a).await.len(), 1, "{backend:?}");
    assert!(
        all_runs(store, &b).await.is_empty(),
        "{backend:?}: b's event was dispatched"
    );
    let b_stats = store
        .queue_stats(std::slice::from_ref(&b))
        .await
        .expect("stats");
    assert_eq!(
        (b_stats.pending_events, b_stats.ready),
        (1, 0),
        "{backend:?}"
    );

    let taken = dispatch(store, std::slice::from_ref(&b), 10, &planner)
        .await
        .expect("dispatch");
    assert_eq!(taken, 1, "{backend:?}");
    assert_eq!(all_runs(store, &b).await.len(), 1, "{backend:?}");
    assert_eq!(all_runs(store, &a).await.len(), 1, "{backend:?}");
}

async fn an_event_no_automation_listens_to_is_dispatched_without_planning(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "t").await;
    let quiet = source(store, &t, "quiet").await;
    let busy = source(store, &t, "busy").await;
    webhook_automation(store, &t, "orders", &busy).await;
    store
        .accept_event(&t, webhook_event(&quiet, "unheard"))
        .await
        .expect("accept");
    store
        .accept_event(&t, webhook_event(&busy, "heard"))
        .await
        .expect("accept");

    let planned = std::sync::Mutex::new(Vec::new());
    let planner = |event: &PendingEvent, candidates: &[Candidate]| {
        planned.lock().unwrap().push(event.source_id.clone());
        one_run_per_candidate(event, candidates)
    };
    let taken = dispatch(store, std::slice::from_ref(&t), 10, &planner)
        .await
        .expect("dispatch");
    assert_eq!(taken, 2, "{backend:?}: both events taken");
    assert_eq!(
        *planned.lock().unwrap(),
        vec![Some(busy.clone())],
        "{backend:?}: only the event with an automation is planned"
    );
    let stats = store
        .queue_stats(std::slice::from_ref(&t))
        .await
        .expect("stats");
    assert_eq!(
        stats.pending_events, 0,
        "{backend:?}: the unheard event stays pending"
    );
    assert_eq!(all_runs(store, &t).await.len(), 1, "{backend:?}");
}

async fn pending_events_are_selected_round_robin_between_tenants(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let mut ids = Vec::new();
    for (name, events) in [("big", 10), ("b", 2), ("c", 2)] {
        let t = tenant(store, name).await;
        let src = source(store, &t, "eshop").await;
        webhook_automation(store, &t, "orders", &src).await;
        for i in 0..events {
            store
                .accept_event(&t, webhook_event(&src, &format!("{name}-{i}")))
                .await
                .expect("accept");
        }
        ids.push(t);
    }
    let name = |t: &TenantId| ["big", "b", "c"][ids.iter().position(|i| i == t).unwrap()];

    // Every tenant's first event, then every tenant's second, …: big's
    // fill the rest of the batch, oldest first.
    let mut tx = store.begin_dispatch(&ids, Lane::Bulk).await.expect("begin");
    let events = tx.pending_events(12).await.expect("select");
    let owners: Vec<&str> = events.iter().map(|e| name(&e.tenant_id)).collect();
    assert_eq!(
        owners,
        [
            "big", "b", "c", "big", "b", "c", "big", "big", "big", "big", "big", "big"
        ],
        "{backend:?}"
    );
    let bigs: Vec<EventId> = events
        .iter()
        .filter(|e| name(&e.tenant_id) == "big")
        .map(|e| e.id.clone())
        .collect();

    // They were big's oldest eight.
    let all = tx.pending_events(100).await.expect("select again");
    let all: Vec<&PendingEvent> = all.iter().filter(|e| name(&e.tenant_id) == "big").collect();
    assert_eq!(all.len(), 10, "{backend:?}");
    assert!(
        all.windows(2).all(|w| w[0].received_at <= w[1].received_at),
        "{backend:?}: oldest first"
    );
    let oldest: Vec<EventId> = all.iter().take(8).map(|e| e.id.clone()).collect();
    assert_eq!(bigs, oldest, "{backend:?}");

    // Dropped, the transaction leaves every event pending.
    drop(tx);
    let stats = store.queue_stats(&ids).await.expect("stats");
    assert_eq!(stats.pending_events, 14, "{backend:?}");
}

async fn a_small_tenants_event_is_selected_with_a_large_backlog(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let big = tenant(store, "big").await;
    let small = tenant(store, "small").await;
    let src_big = source(store, &big, "eshop").await;
    let src_small = source(store, &small, "eshop").await;
    for n in 0..300 {
        store
            .accept_event(&big, webhook_event(&src_big, &format!("big-{n}")))
            .await
            .expect("accept");
    }
    // The small tenant's event arrives after the whole backlog.
    store
        .accept_event(&small, webhook_event(&src_small, "small-0"))
        .await
        .expect("accept");

    let mut tx = store
        .begin_dispatch(&[big.clone(), small.clone()], Lane::Bulk)
        .await
        .expect("begin");
    let events = tx.pending_events(8).await.expect("select");
    assert_eq!(events.len(), 8, "{backend:?}");
    let small_at: Vec<usize> = (0..8).filter(|i| events[*i].tenant_id == small).collect();
    assert!(
        small_at == [0] || small_at == [1],
        "{backend:?}: the small tenant's event is among the first: {small_at:?}"
    );
}

async fn an_urgent_dispatch_takes_only_its_tenants_events(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let big = tenant(store, "big").await;
    let big_src = source(store, &big, "eshop").await;
    webhook_automation(store, &big, "orders", &big_src).await;
    for i in 0..6 {
        store
            .accept_event(&big, webhook_event(&big_src, &format!("big-{i}")))
            .await
            .expect("accept");
    }
    let small = tenant(store, "small").await;
    let small_src = source(store, &small, "eshop").await;
    webhook_automation(store, &small, "orders", &small_src).await;
    store
        .accept_event(&small, webhook_event(&small_src, "small-0"))
        .await
        .expect("accept");

    let mut tx = store
        .begin_dispatch(std::slice::from_ref(&small), Lane::Urgent)
        .await
        .expect("begin");
    let events = tx.pending_events(4).await.expect("select");
    assert_eq!(events.len(), 1, "{backend:?}");
    let candidates = tx.candidates(&events[0]).await.expect("candidates");
    let runs: Vec<_> = one_run_per_candidate(&events[0], &candidates)
        .runs
        .into_iter()
        .map(|run| (small.clone(), events[0].id.clone(), run))
        .collect();
    tx.insert_runs(&runs, None).await.expect("insert");
    tx.mark_dispatched(&[events[0].id.clone()])
        .await
        .expect("mark");
    tx.commit().await.expect("commit");
    assert_eq!(all_runs(store, &small).await.len(), 1, "{backend:?}");
    let stats = store
        .queue_stats(&[big.clone(), small.clone()])
        .await
        .expect("stats");
    assert_eq!(stats.pending_events, 6, "{backend:?}: big's events wait");
}

async fn a_dispatch_counts_a_tickets_recent_runs_and_writes_its_trace(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let other = tenant(store, "other").await;
    let src = source(store, &t, "eshop").await;
    let orders = webhook_automation(store, &t, "orders", &src).await;
    let audit = webhook_automation(store, &t, "audit", &src).await;
    // The trace has no need of the ticket's row.
    let ticket_id = "tk_1".to_string();
    // Two runs of `orders` on the ticket, one of `audit` on another ticket.
    for (automation, on) in [(&orders, "mine"), (&orders, "mine"), (&audit, "elsewhere")] {
        let mut run = new_run(automation, "webhook", None);
        run.subject_ticket_id = Some(match on {
            "mine" => ticket_id.clone(),
            _ => "another".into(),
        });
        store
            .start_run(&t, manual_event(automation), run)
            .await
            .expect("start");
    }

    let mut tx = store
        .begin_dispatch(&[t.clone(), other.clone()], Lane::Bulk)
        .await
        .expect("begin");
    let since = tok_store::now_ms() - 60_000;
    let count = |a: &AutomationId| (t.clone(), a.clone());
    let mut counts = Vec::new();
    for (tenant, automation) in [
        count(&orders),
        count(&audit),
        (other.clone(), orders.clone()),
    ] {
        counts.push(
            tx.runs_on_ticket(&tenant, &automation, &ticket_id, since)
                .await
                .expect("count"),
        );
    }
    assert_eq!(
        counts,
        [2, 0, 0],
        "{backend:?}: by automation, ticket and tenant"
    );
    let later = tx
        .runs_on_ticket(&t, &orders, &ticket_id, tok_store::now_ms() + 1_000)
        .await
        .expect("count");
    assert_eq!(later, 0, "{backend:?}: only runs created after `since`");
    let cause = tok_store::Cause {
        automation_id: Some(orders.clone()),
        ..Default::default()
    };
    tx.trace(&t, &ticket_id, "loop_protection", "not started", &cause)
        .await
        .expect("trace");
    tx.commit().await.expect("commit");
    let trace = store.ticket_trace(&t, &ticket_id).await.expect("trace");
    let line = trace.last().expect("a line");
    assert_eq!(
        (
            line.kind.as_str(),
            line.message.as_str(),
            line.automation_id.as_deref()
        ),
        ("loop_protection", "not started", Some(orders.as_str())),
        "{backend:?}"
    );
}

async fn a_dispatch_writes_the_steps_its_runs_already_ran(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    webhook_automation(store, &t, "orders", &src).await;
    for key in ["done", "goes-on"] {
        store
            .accept_event(&t, webhook_event(&src, key))
            .await
            .expect("accept");
    }
    // The first event's run ran all of its (two) steps at dispatch; the
    // second's ran one and goes on at `1` in a worker.
    let planner = |event: &PendingEvent, candidates: &[Candidate]| {
        let mut plan = one_run_per_candidate(event, candidates);
        let done = event.payload["key"] == "done";
        for run in &mut plan.runs {
            run.steps = if done {
                vec![
                    step("0", tok_store::StepStatus::Completed, json!({ "a": 1 })),
                    step("1", tok_store::StepStatus::Completed, json!({})),
                ]
            } else {
                vec![step(
                    "0",
                    tok_store::StepStatus::Completed,
                    json!({ "a": 1 }),
                )]
            };
            run.actions = run.steps.len() as i32;
            run.first_path = (!done).then(|| "1".to_string());
        }
        plan
    };
    dispatch(store, std::slice::from_ref(&t), 10, &planner)
        .await
        .expect("dispatch");
    let runs = all_runs(store, &t).await;
    assert_eq!(runs.len(), 2, "{backend:?}");
    for run in &runs {
        let detail = store.run(&t, &run.id).await.unwrap().expect("run");
        let paths: Vec<&str> = detail.steps.iter().map(|s| s.path.as_str()).collect();
        assert!(run.started_at.is_some(), "{backend:?}: the run has started");
        match run.status.as_str() {
            "completed" => {
                assert_eq!(paths, ["0", "1"], "{backend:?}");
                assert_eq!(run.actions, 2, "{backend:?}");
                assert!(run.finished_at.is_some(), "{backend:?}");
            }
            "running" => {
                assert_eq!(paths, ["0"], "{backend:?}");
                assert_eq!(run.actions, 1, "{backend:?}");
            }
            other => panic!("{backend:?}: a run {other}"),
        }
    }
    let mut statuses: Vec<&str> = runs.iter().map(|r| r.status.as_str()).collect();
    statuses.sort();
    assert_eq!(statuses, ["completed", "running"], "{backend:?}");
    // One job, for the run that goes on, at its next step.
    let jobs = store
        .claim(std::slice::from_ref(&t), "node", 10, 30_000)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1, "{backend:?}");
    assert_eq!(
        (jobs[0].path.as_str(), jobs[0].actions),
        ("1", 1),
        "{backend:?}"
    );
}

async fn a_dispatch_hands_the_jobs_it_was_offered_to_its_node_already_claimed(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let src = source(store, &t, "eshop").await;
    webhook_automation(store, &t, "orders", &src).await;
    for key in ["a", "b", "c"] {
        store
            .accept_event(&t, webhook_event(&src, key))
            .await
            .expect("accept");
    }

    // The dispatching node has two free slots.
    let mut offered = Vec::new();
    let mut take = |tenant: &TenantId| {
        offered.push(tenant.clone());
        offered.len() <= 2
    };
    let (taken, handed) = dispatch_claiming(
        store,
        std::slice::from_ref(&t),
        10,
        &one_run_per_candidate,
        Some(("node-1", &mut take)),
    )
    .await
    .expect("dispatch");
    assert_eq!(taken, 3, "{backend:?}");
    assert_eq!(
        offered,
        vec![t.clone(); 3],
        "{backend:?}: asked once per new run"
    );
    assert_eq!(handed.len(), 2, "{backend:?}: the two runs it took");
    for job in &handed {
        assert_eq!((job.attempt, job.path.as_str()), (1, "0"), "{backend:?}");
        let detail = store
            .run(&t, &job.run_id)
            .await
            .expect("run")
            .expect("exists");
        assert_eq!(detail.run.status, "running", "{backend:?}");
        assert!(detail.run.started_at.is_some(), "{backend:?}");
        assert_eq!(job.context, detail.context, "{backend:?}");
    }

    // Another node finds only the run the dispatch did not take.
    let others = store
        .claim(std::slice::from_ref(&t), "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(others.len(), 1, "{backend:?}: the handed jobs are leased");
    assert!(
        !run_ids(&handed).contains(&others[0].run_id),
        "{backend:?}: a handed job was claimed again"
    );

    // The handed claim's token is the lease: its record is accepted.
    store
        .record(&handed[0], finish(&handed[0], RunStatus::Completed))
        .await
        .expect("record with the handed claim");
    let detail = store
        .run(&t, &handed[0].run_id)
        .await
        .expect("run")
        .expect("exists");
    assert_eq!(detail.run.status, "completed", "{backend:?}");
}

/// The dispatcher takes a failed batch apart with `pending_event` (one
/// event of the transaction's tenants, while it is pending) and sets the
/// event at fault aside (`set_aside`): `failed`, with its error, as
/// `event` shows it, and selected by no dispatch after.
async fn one_event_is_taken_alone_and_one_set_aside_is_taken_no_more(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let other = tenant(store, "beta").await;
    let src = source(store, &t, "eshop").await;
    let other_src = source(store, &other, "eshop").await;
    webhook_automation(store, &t, "orders", &src).await;
    let mut events = Vec::new();
    for key in ["at-fault", "fine"] {
        let (id, _) = store
            .accept_event(&t, webhook_event(&src, key))
            .await
            .expect("accept");
        events.push(id);
    }
    let (others, _) = store
        .accept_event(&other, webhook_event(&other_src, "theirs"))
        .await
        .expect("accept");
    let (at_fault, fine) = (&events[0], &events[1]);

    let mut tx = store
        .begin_dispatch(std::slice::from_ref(&t), Lane::Urgent)
        .await
        .expect("begin");
    let alone = tx.pending_event(&t, fine).await.expect("read");
    assert_eq!(alone.as_ref().map(|e| &e.id), Some(fine), "{backend:?}");
    assert!(
        tx.pending_event(&other, &others)
            .await
            .expect("read")
            .is_none(),
        "{backend:?}: not a tenant of this dispatch"
    );
    assert!(
        tx.pending_event(&t, &EventId::from("evt_nowhere".to_string()))
            .await
            .expect("read")
            .is_none(),
        "{backend:?}"
    );
    let event = alone.unwrap();
    let candidates = tx.candidates(&event).await.expect("candidates");
    let runs: Vec<_> = one_run_per_candidate(&event, &candidates)
        .runs
        .into_iter()
        .map(|run| (t.clone(), event.id.clone(), run))
        .collect();
    tx.insert_runs(&runs, None).await.expect("insert");
    tx.mark_dispatched(std::slice::from_ref(fine))
        .await
        .expect("mark");
    tx.commit().await.expect("commit");
    assert_eq!(all_runs(store, &t).await.len(), 1, "{backend:?}");
    let mut tx = store
        .begin_dispatch(std::slice::from_ref(&t), Lane::Urgent)
        .await
        .expect("begin");
    assert!(
        tx.pending_event(&t, fine).await.expect("read").is_none(),
        "{backend:?}: dispatched, no longer pending"
    );
    drop(tx);

    let why = "dispatch_failed: refused";
    assert!(
        !store.set_aside(&other, at_fault, why).await.unwrap(),
        "{backend:?}: not its event"
    );
    assert!(
        store.set_aside(&t, at_fault, why).await.unwrap(),
        "{backend:?}"
    );
    assert!(
        !store.set_aside(&t, at_fault, why).await.unwrap(),
        "{backend:?}: once"
    );
    assert!(
        !store.set_aside(&t, fine, why).await.unwrap(),
        "{backend:?}: a dispatched one stays"
    );
    let shown = store.event(&t, at_fault).await.unwrap().expect("the event");
    assert_eq!(
        (shown.status.as_str(), shown.error.as_deref()),
        ("failed", Some(why)),
        "{backend:?}"
    );
    let shown = store.event(&t, fine).await.unwrap().expect("the event");
    assert_eq!(
        (shown.status.as_str(), shown.error),
        ("dispatched", None),
        "{backend:?}"
    );
    let taken = dispatch(
        store,
        &[t.clone(), other.clone()],
        10,
        &one_run_per_candidate,
    )
    .await
    .expect("dispatch");
    assert_eq!(taken, 1, "{backend:?}: only the other tenant's event");
    assert_eq!(all_runs(store, &t).await.len(), 1, "{backend:?}");
}
