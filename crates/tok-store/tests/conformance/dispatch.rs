//! The dispatcher's transaction (`InboxStore::dispatch`,
//! `dispatch_handing_off`): one run per (event, automation) however often
//! and however concurrently an event is dispatched, only the given tenants'
//! events, fair between tenants, and the steps and claimed jobs written with
//! the runs.

use super::*;

backend_tests!(
    run_on_fresh_db;
    dispatching_an_event_again_creates_no_second_run,
    concurrent_dispatchers_create_one_run_per_event_and_automation,
    dispatch_takes_only_the_given_tenants_events,
    an_event_no_automation_listens_to_is_dispatched_without_planning,
    a_crowding_tenants_events_wait_for_one_dispatch_of_the_others,
    a_full_dispatch_names_the_tenant_whose_backlog_filled_it,
    dispatch_takes_a_small_tenants_event_before_a_large_backlog,
    a_dispatch_writes_the_steps_its_runs_already_ran,
    a_dispatch_hands_the_jobs_it_was_offered_to_its_node_already_claimed,
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
    let taken = store
        .dispatch(&tenants, 10, &one_run_per_candidate)
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
    let taken = store
        .dispatch(&tenants, 10, &one_run_per_candidate)
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
                    match store.dispatch(&tenants, 3, &one_run_per_candidate).await {
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
    let taken = store
        .dispatch(std::slice::from_ref(&a), 10, &planner)
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

    let taken = store
        .dispatch(std::slice::from_ref(&b), 10, &planner)
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
    let taken = store
        .dispatch(std::slice::from_ref(&t), 10, &planner)
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

async fn a_crowding_tenants_events_wait_for_one_dispatch_of_the_others(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let mut tenants = Vec::new();
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
        tenants.push((t, src));
    }
    let ids: Vec<TenantId> = tenants.iter().map(|(t, _)| t.clone()).collect();
    let runs_of = |i: usize| all_runs(store, &tenants[i].0);

    // Round robin picks 8 of big's events and all 4 of the others':
    // big crowds the batch, so the others go first, alone.
    let first = store
        .dispatch_handing_off(&ids, 12, &one_run_per_candidate, None, Lane::Bulk)
        .await
        .expect("dispatch");
    assert_eq!((first.events(), first.left), (4, 8), "{backend:?}");
    assert_eq!(runs_of(0).await.len(), 0, "{backend:?}: big waited");
    assert_eq!(runs_of(1).await.len(), 2, "{backend:?}");
    assert_eq!(runs_of(2).await.len(), 2, "{backend:?}");

    // The next dispatch takes the batch in order, another tenant's new
    // event with it: big waits for one dispatch at most.
    store
        .accept_event(&tenants[1].0, webhook_event(&tenants[1].1, "b-late"))
        .await
        .expect("accept");
    let second = store
        .dispatch_handing_off(&ids, 12, &one_run_per_candidate, None, Lane::Bulk)
        .await
        .expect("dispatch");
    assert_eq!((second.events(), second.left), (11, 0), "{backend:?}");
    assert_eq!(runs_of(0).await.len(), 10, "{backend:?}");
    assert_eq!(runs_of(1).await.len(), 3, "{backend:?}");
}

async fn a_full_dispatch_names_the_tenant_whose_backlog_filled_it(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let big = tenant(store, "big").await;
    let big_src = source(store, &big, "eshop").await;
    webhook_automation(store, &big, "orders", &big_src).await;
    for i in 0..10 {
        store
            .accept_event(&big, webhook_event(&big_src, &format!("big-{i}")))
            .await
            .expect("accept");
    }
    let small = tenant(store, "small").await;
    let small_src = source(store, &small, "eshop").await;
    webhook_automation(store, &small, "orders", &small_src).await;
    let both = [big.clone(), small.clone()];

    let first = store
        .dispatch_handing_off(&both, 4, &one_run_per_candidate, None, Lane::Bulk)
        .await
        .expect("dispatch");
    assert_eq!(first.events(), 4, "{backend:?}");
    assert_eq!(first.backlog.as_ref(), Some(&big), "{backend:?}");

    // The small tenant's new event is dispatched apart, urgently.
    store
        .accept_event(&small, webhook_event(&small_src, "small-0"))
        .await
        .expect("accept");
    let urgent = store
        .dispatch_handing_off(
            std::slice::from_ref(&small),
            4,
            &one_run_per_candidate,
            None,
            Lane::Urgent,
        )
        .await
        .expect("urgent dispatch");
    assert_eq!((urgent.events(), urgent.backlog), (1, None), "{backend:?}");
    assert_eq!(all_runs(store, &small).await.len(), 1, "{backend:?}");
    let stats = store.queue_stats(&both).await.expect("stats");
    assert_eq!(stats.pending_events, 6, "{backend:?}: big's backlog waits");

    // A batch that is not full leaves no backlog behind.
    let rest = store
        .dispatch_handing_off(&both, 10, &one_run_per_candidate, None, Lane::Bulk)
        .await
        .expect("dispatch");
    assert_eq!((rest.events(), rest.backlog), (6, None), "{backend:?}");
    assert_eq!(all_runs(store, &big).await.len(), 10, "{backend:?}");
}

async fn dispatch_takes_a_small_tenants_event_before_a_large_backlog(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let big = tenant(store, "big").await;
    let small = tenant(store, "small").await;
    let src_big = source(store, &big, "eshop").await;
    let src_small = source(store, &small, "eshop").await;
    webhook_automation(store, &big, "orders", &src_big).await;
    webhook_automation(store, &small, "orders", &src_small).await;
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

    let seen = std::sync::Mutex::new(Vec::new());
    let planner = |event: &PendingEvent, candidates: &[Candidate]| {
        seen.lock().unwrap().push(event.tenant_id.clone());
        one_run_per_candidate(event, candidates)
    };
    let tenants = [big.clone(), small.clone()];
    let taken = store
        .dispatch(&tenants, 8, &planner)
        .await
        .expect("dispatch");
    // The large tenant crowds the batch (7 of its 8 events), so the
    // small tenant's event is dispatched first, on its own.
    assert_eq!(taken, 1, "{backend:?}");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![small.clone()],
        "{backend:?}: the first dispatch did not take the small tenant's event alone"
    );
    assert_eq!(all_runs(store, &small).await.len(), 1, "{backend:?}");
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
    store
        .dispatch(std::slice::from_ref(&t), 10, &planner)
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
    let handoff = tok_store::Handoff {
        node: "node-1",
        lease_ms: LONG_LEASE_MS,
        take: &mut take,
    };
    let dispatched = store
        .dispatch_handing_off(
            std::slice::from_ref(&t),
            10,
            &one_run_per_candidate,
            Some(handoff),
            Lane::Bulk,
        )
        .await
        .expect("dispatch");
    assert_eq!(dispatched.events(), 3, "{backend:?}");
    assert_eq!(
        offered,
        vec![t.clone(); 3],
        "{backend:?}: asked once per new run"
    );
    let handed = dispatched.claimed;
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
