//! The job queue's claims and leases (`QueueStore::claim`, `heartbeat`,
//! `release_claims`): fair between tenants, one leased job per queue key
//! (also under concurrent claims), leases that keep other nodes away until
//! they expire or a heartbeat extends them, and the claim token that fences
//! a stale worker off.

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_small_tenant_is_not_starved_by_a_large_backlog,
    jobs_sharing_a_queue_key_are_never_leased_together,
    concurrent_claims_never_share_a_job_or_a_queue_key,
    released_claims_are_claimable_at_once_and_fence_their_old_holder,
    a_live_lease_keeps_other_nodes_away,
    an_expired_lease_is_taken_over_by_another_node,
    a_heartbeat_keeps_a_lease_alive_past_its_first_expiry,
    a_heartbeat_extends_only_the_claim_it_names,
    a_stale_worker_cannot_record_after_a_takeover,
    two_executions_of_one_job_in_one_record_batch_record_once,
    two_incarnations_of_one_node_keep_each_others_claims,
    a_process_stopped_inside_a_claim_holds_back_only_what_it_took,
    a_claim_passes_over_a_job_whose_run_another_transaction_holds,
    a_record_waits_for_its_run_before_it_locks_its_job,
    a_tenants_jobs_are_claimed_highest_priority_first_and_a_retry_keeps_its_run_priority,
    a_tenants_priority_orders_its_own_jobs_never_its_turn,
);

/// `priority` orders a tenant's own jobs (docs/workflows.md, "Priority":
/// "within the tenant's share"): a tenant whose every run has priority 100
/// does not go before another tenant's older run of priority 0, and takes
/// one job per round.
async fn a_tenants_priority_orders_its_own_jobs_never_its_turn(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let quiet = tenant(store, "quiet").await;
    let loud = tenant(store, "loud").await;
    let quiet_aut = manual_automation(store, &quiet, "q").await;
    let loud_aut = manual_automation(store, &loud, "l").await;
    let quiet_first = start(store, &quiet, &quiet_aut, "manual", None).await;
    let quiet_second = start(store, &quiet, &quiet_aut, "manual", None).await;
    let mut loud_runs = Vec::new();
    for _ in 0..3 {
        let run = NewRun {
            priority: 100,
            ..new_run(&loud_aut, "manual", None)
        };
        loud_runs.push(
            store
                .start_run(&loud, manual_event(&loud_aut), run)
                .await
                .expect("start"),
        );
    }
    let both = [quiet.clone(), loud.clone()];
    let first = store
        .claim(&both, "n", 1, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(
        first.iter().map(|j| &j.run_id).collect::<Vec<_>>(),
        [&quiet_first],
        "{backend:?}: the older run goes first, priority 100 or not"
    );
    let mut next: Vec<RunId> = store
        .claim(&both, "n", 2, LONG_LEASE_MS)
        .await
        .expect("claim")
        .into_iter()
        .map(|j| j.run_id)
        .collect();
    next.sort();
    let mut wanted = vec![quiet_second, loud_runs[0].clone()];
    wanted.sort();
    assert_eq!(
        next, wanted,
        "{backend:?}: one job of each tenant per round"
    );
}

/// A run's priority is its first job's and that of every job written for
/// it later (here a retry): a tenant's jobs are claimed highest priority
/// first, then oldest first.
async fn a_tenants_jobs_are_claimed_highest_priority_first_and_a_retry_keeps_its_run_priority(
    db: &TestDb,
) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let mut ids = Vec::new();
    for priority in [0, 50, -20, 50, 100] {
        let run = NewRun {
            priority,
            ..new_run(&aut, "manual", None)
        };
        ids.push(
            store
                .start_run(&t, manual_event(&aut), run)
                .await
                .expect("start"),
        );
    }
    let next = async || {
        let mut jobs = store
            .claim(std::slice::from_ref(&t), "n", 1, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(jobs.len(), 1, "{backend:?}");
        jobs.pop().unwrap()
    };
    let first = next().await;
    assert_eq!(first.run_id, ids[4], "{backend:?}: priority 100 first");
    let mut failed = step(&first.path, tok_store::StepStatus::Failed, json!({}));
    failed.error = Some("HTTP 500".into());
    let record = Record {
        steps: vec![failed],
        status: RunStatus::Failed,
        error: Some("step failed: HTTP 500".into()),
        ..finish(&first, RunStatus::Failed)
    };
    store.record(&first, record).await.expect("record");
    assert_eq!(next().await.run_id, ids[1], "{backend:?}: the older 50");
    // The retry's job is the newest, and still goes before every other.
    store.retry_run(&t, &ids[4]).await.expect("retry");
    let order = [next().await, next().await, next().await, next().await];
    let order: Vec<&RunId> = order.iter().map(|j| &j.run_id).collect();
    assert_eq!(
        order,
        [&ids[4], &ids[3], &ids[0], &ids[2]],
        "{backend:?}: 100 (retried), 50, 0, -20"
    );
    let shown: std::collections::HashMap<RunId, i32> = all_runs(store, &t)
        .await
        .into_iter()
        .map(|r| (r.id, r.priority))
        .collect();
    let wanted: std::collections::HashMap<RunId, i32> =
        ids.iter().cloned().zip([0, 50, -20, 50, 100]).collect();
    assert_eq!(shown, wanted, "{backend:?}: each run shows its priority");
}

async fn a_small_tenant_is_not_starved_by_a_large_backlog(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let big = tenant(store, "big").await;
    let small = tenant(store, "small").await;

    // 10,000 runs for `big`, fast: 100 webhook automations on one source and
    // 100 events, each event starting one run per automation.
    let src = source(store, &big, "flood").await;
    for i in 0..100 {
        webhook_automation(store, &big, &format!("flood {i}"), &src).await;
    }
    for i in 0..100 {
        store
            .accept_event(&big, webhook_event(&src, &format!("e{i}")))
            .await
            .expect("accept");
    }
    let mut taken = 0;
    loop {
        let n = dispatch(
            store,
            std::slice::from_ref(&big),
            25,
            &one_run_per_candidate,
        )
        .await;
        match n.expect("dispatch") {
            0 => break,
            n => taken += n,
        }
    }
    assert_eq!(taken, 100, "{backend:?}");

    // Then 10 runs for `small`, queued after all of big's.
    let small_aut = manual_automation(store, &small, "small").await;
    let mut small_runs = HashSet::new();
    for _ in 0..10 {
        small_runs.insert(start(store, &small, &small_aut, "manual", None).await);
    }

    let both = [big.clone(), small.clone()];
    let stats = store.queue_stats(&both).await.expect("stats");
    assert_eq!(
        stats.ready, 10_010,
        "{backend:?}: jobs ready before claiming"
    );

    let mut small_done = 0;
    let mut batches = 0;
    while small_done < 10 {
        batches += 1;
        assert!(
            batches <= 3,
            "{backend:?}: small tenant still waiting after {batches} batches"
        );
        let jobs = store
            .claim(&both, "node-1", 8, LONG_LEASE_MS)
            .await
            .expect("claim");
        assert_eq!(jobs.len(), 8, "{backend:?}: a full batch is available");
        let small_in_batch = jobs.iter().filter(|j| j.tenant_id == small).count();
        let big_in_batch = jobs.iter().filter(|j| j.tenant_id == big).count();
        if batches == 1 {
            // Round robin: each tenant gets an equal share of the first batch.
            assert_eq!(
                small_in_batch, 4,
                "{backend:?}: small's share of the first batch"
            );
            assert_eq!(
                big_in_batch, 4,
                "{backend:?}: big's share of the first batch"
            );
        }
        for job in &jobs {
            if job.tenant_id == small {
                assert!(
                    small_runs.contains(&job.run_id),
                    "{backend:?}: a job of an unknown run"
                );
                small_done += 1;
            }
            store
                .record(job, finish(job, RunStatus::Completed))
                .await
                .expect("record");
        }
    }
    assert_eq!(
        batches, 3,
        "{backend:?}: 10 jobs at 4 per batch take 3 batches"
    );

    let small_stats = store
        .queue_stats(std::slice::from_ref(&small))
        .await
        .expect("stats");
    assert_eq!(
        (small_stats.ready, small_stats.running),
        (0, 0),
        "{backend:?}"
    );
    let big_stats = store
        .queue_stats(std::slice::from_ref(&big))
        .await
        .expect("stats");
    assert_eq!(
        big_stats.ready,
        10_000 - 14,
        "{backend:?}: big's backlog is mostly left"
    );
    for run in all_runs(store, &small).await {
        assert_eq!(
            run.status, "completed",
            "{backend:?}: small's run {}",
            run.id
        );
    }
}

async fn jobs_sharing_a_queue_key_are_never_leased_together(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "tickets").await;
    let first = start(store, &t, &aut, "manual", Some("ticket:1")).await;
    let second = start(store, &t, &aut, "manual", Some("ticket:1")).await;
    let third = start(store, &t, &aut, "manual", Some("ticket:1")).await;
    let other_key = start(store, &t, &aut, "manual", Some("ticket:2")).await;
    let no_key_a = start(store, &t, &aut, "manual", None).await;
    let no_key_b = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    // One batch with room for all: only one of ticket:1's jobs is in it.
    let batch = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    let claimed = run_ids(&batch);
    assert_eq!(batch.len(), 4, "{backend:?}: {claimed:?}");
    let keyed: Vec<_> = [&first, &second, &third]
        .into_iter()
        .filter(|r| claimed.contains(*r))
        .collect();
    assert_eq!(
        keyed,
        vec![&first],
        "{backend:?}: the oldest job of ticket:1, alone"
    );
    for run in [&other_key, &no_key_a, &no_key_b] {
        assert!(
            claimed.contains(run),
            "{backend:?}: {run} (other key or no key) is claimed too"
        );
    }

    // While ticket:1's job is leased, its other jobs stay put, for any node.
    let again = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        again.is_empty(),
        "{backend:?}: claimed {:?}",
        run_ids(&again)
    );

    // Recording the holder's outcome frees the key for the next job.
    let holder = batch.iter().find(|j| j.run_id == first).unwrap();
    store
        .record(holder, finish(holder, RunStatus::Completed))
        .await
        .expect("record");
    let next = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(next.len(), 1, "{backend:?}: {:?}", run_ids(&next));
    assert!(
        next[0].run_id == second || next[0].run_id == third,
        "{backend:?}"
    );
    let blocked = store
        .claim(&tenants, "node-3", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        blocked.is_empty(),
        "{backend:?}: the third ticket:1 job waits its turn"
    );
}

async fn concurrent_claims_never_share_a_job_or_a_queue_key(db: &TestDb) {
    let backend = db.backend;
    let store: Arc<dyn Store> = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    // 30 jobs without a key and 4 keys with 5 jobs each; a key's jobs lie
    // close together, so one batch's candidates hold several of them.
    let mut key_of = std::collections::HashMap::new();
    for i in 0..50 {
        let key = (i % 2 == 0 && i < 40).then(|| format!("ticket:{}", i / 10));
        let run = start(&*store, &t, &aut, "manual", key.as_deref()).await;
        key_of.insert(run, key);
    }
    let keyed = key_of.values().filter(|k| k.is_some()).count();
    let keys: HashSet<_> = key_of.values().flatten().cloned().collect();
    assert_eq!((keyed, keys.len()), (20, 4));
    let claimable = key_of.len() - keyed + keys.len();

    let claimers: Vec<_> = (0..6)
        .map(|i| {
            let store = Arc::clone(&store);
            let tenants = vec![t.clone()];
            tokio::spawn(async move {
                store
                    .claim(&tenants, &format!("node-{i}"), 8, LONG_LEASE_MS)
                    .await
            })
        })
        .collect();
    let mut claimed: Vec<ClaimedJob> = Vec::new();
    for c in claimers {
        claimed.extend(c.await.expect("claimer task").expect("claim"));
    }
    // Then one node claims what is left, batch after batch, while every
    // lease is still held.
    loop {
        let more = store
            .claim(std::slice::from_ref(&t), "node-x", 8, LONG_LEASE_MS)
            .await;
        let more = more.expect("claim");
        if more.is_empty() {
            break;
        }
        claimed.extend(more);
    }

    let ids: HashSet<_> = claimed.iter().map(|j| j.id).collect();
    assert_eq!(
        ids.len(),
        claimed.len(),
        "{backend:?}: a job was leased twice"
    );
    let mut held_keys = HashSet::new();
    for job in &claimed {
        if let Some(key) = &key_of[&job.run_id] {
            assert!(
                held_keys.insert(key.clone()),
                "{backend:?}: two leased jobs on {key}"
            );
        }
    }
    assert_eq!(held_keys, keys, "{backend:?}: every key got one job");
    assert_eq!(
        claimed.len(),
        claimable,
        "{backend:?}: every claimable job was claimed"
    );
}

async fn released_claims_are_claimable_at_once_and_fence_their_old_holder(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let run = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let old = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(old.len(), 1, "{backend:?}");
    // node-1 restarts: it gives back what it held, without waiting a lease out.
    let released = store.release_claims("node-1").await.expect("release");
    assert_eq!(released, 1, "{backend:?}");
    let new = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(
        new.len(),
        1,
        "{backend:?}: the released job is claimable at once"
    );
    assert_eq!(
        (new[0].run_id.clone(), new[0].attempt),
        (run, 2),
        "{backend:?}"
    );
    // The claim from before the restart can no longer record.
    let err = store
        .record(&old[0], finish(&old[0], RunStatus::Completed))
        .await
        .expect_err("record under a released claim");
    assert!(
        matches!(err, StoreError::LeaseLost(_)),
        "{backend:?}: {err}"
    );
    store
        .record(&new[0], finish(&new[0], RunStatus::Completed))
        .await
        .expect("record");
}

async fn a_live_lease_keeps_other_nodes_away(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    start(&*store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let held = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(held.len(), 1, "{backend:?}");
    let other = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        other.is_empty(),
        "{backend:?}: a leased job was claimed again"
    );
    let stats = store.queue_stats(&tenants).await.expect("stats");
    assert_eq!((stats.ready, stats.running), (0, 1), "{backend:?}");
    drop(store);
}

async fn an_expired_lease_is_taken_over_by_another_node(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    let run = start(&*store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let first = store
        .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(first.len(), 1, "{backend:?}");
    assert_eq!(
        (first[0].run_id.clone(), first[0].attempt),
        (run.clone(), 1),
        "{backend:?}"
    );

    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let second = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(second.len(), 1, "{backend:?}: the expired job is claimable");
    assert_eq!(second[0].id, first[0].id, "{backend:?}: the same job");
    assert_eq!(second[0].run_id, run, "{backend:?}");
    assert_eq!(
        second[0].attempt, 2,
        "{backend:?}: the takeover is the second attempt"
    );
    assert_ne!(
        second[0].claim_token, first[0].claim_token,
        "{backend:?}: a new token"
    );

    // The original node no longer holds anything to extend, and the new
    // holder's lease keeps a third node away.
    let extended = store
        .heartbeat("node-1", &[lease(&first[0])], LONG_LEASE_MS)
        .await
        .expect("hb");
    assert!(
        extended.is_empty(),
        "{backend:?}: node-1 extended node-2's lease"
    );
    let third = store
        .claim(&tenants, "node-3", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(third.is_empty(), "{backend:?}");
    drop(store);
}

/// The lease a heartbeat names: the job and its claim token.
fn lease(job: &ClaimedJob) -> (tok_core::ids::JobId, String) {
    (job.id, job.claim_token.clone())
}

async fn a_heartbeat_extends_only_the_claim_it_names(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    start(&*store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    // One process claims the job, loses its lease (its heartbeats failed
    // for longer than a lease), and claims the same job again: a second
    // execution under a new token.
    let first = store
        .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(first.len(), 1, "{backend:?}");
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let second = store
        .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
        .await
        .expect("claim again");
    assert_eq!(second.len(), 1, "{backend:?}: the expired job is claimable");
    assert_eq!(second[0].id, first[0].id, "{backend:?}: the same job");

    // The first execution's heartbeat extends nothing: the job's lease is
    // the second's, and it still expires when the second's does.
    let stale = store
        .heartbeat("node-1", &[lease(&first[0])], LONG_LEASE_MS)
        .await
        .expect("hb");
    assert!(
        stale.is_empty(),
        "{backend:?}: a stale claim's heartbeat extended the new lease"
    );
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let third = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(
        third.len(),
        1,
        "{backend:?}: the lease nobody extended under its own token expired"
    );
    // The second execution's token no longer holds it either.
    let current = store
        .heartbeat("node-1", &[lease(&second[0])], LONG_LEASE_MS)
        .await
        .expect("hb");
    assert!(current.is_empty(), "{backend:?}");
    assert_eq!(
        store
            .heartbeat("node-2", &[lease(&third[0])], LONG_LEASE_MS)
            .await
            .expect("hb"),
        [third[0].id],
        "{backend:?}: the holder's heartbeat under its token extends its lease"
    );
}

async fn a_heartbeat_keeps_a_lease_alive_past_its_first_expiry(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    start(&*store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let held = store
        .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(held.len(), 1, "{backend:?}");
    // Another node cannot extend a lease it does not hold.
    let foreign = store
        .heartbeat("node-2", &[lease(&held[0])], LONG_LEASE_MS)
        .await
        .expect("hb");
    assert!(foreign.is_empty(), "{backend:?}");
    let extended = store
        .heartbeat("node-1", &[lease(&held[0])], LONG_LEASE_MS)
        .await
        .expect("hb");
    assert_eq!(extended, [held[0].id], "{backend:?}");

    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let other = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        other.is_empty(),
        "{backend:?}: a heartbeated job was taken over"
    );
    store
        .record(&held[0], finish(&held[0], RunStatus::Completed))
        .await
        .expect("record");
    drop(store);
}

async fn a_stale_worker_cannot_record_after_a_takeover(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let run = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let stale = store
        .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(stale.len(), 1, "{backend:?}");
    let stale = &stale[0];
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let fresh = store
        .claim(&tenants, "node-2", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(fresh.len(), 1, "{backend:?}");
    let fresh = &fresh[0];
    let before = store.run(&t, &run).await.expect("run").expect("run exists");

    // The paused worker wakes up and tries to finish the step: rejected.
    let stale_record = Record {
        subject_ticket_id: None,
        steps: vec![step(
            "0",
            tok_store::StepStatus::Completed,
            json!({ "by": "node-1" }),
        )],
        context: json!({ "n": 1, "by": "node-1" }).into(),
        changed: tok_store::ContextChange::Whole,
        actions: 1,
        status: RunStatus::Running,
        error: None,
        next: NextJob::Step {
            path: "1".into(),
            delay_ms: 0,
        },
    };
    let err = store
        .record(stale, stale_record.clone())
        .await
        .expect_err("stale record");
    assert!(
        matches!(err, StoreError::LeaseLost(id) if id == stale.id),
        "{backend:?}: {err}"
    );

    // Nothing of it was written, and the new holder still holds the job.
    let after = store.run(&t, &run).await.expect("run").expect("run exists");
    assert!(after.steps.is_empty(), "{backend:?}: {:?}", after.steps);
    assert_eq!(after.context, before.context, "{backend:?}");
    assert_eq!(
        (after.run.status.as_str(), after.run.actions),
        ("running", 0),
        "{backend:?}"
    );
    let nobody = store
        .claim(&tenants, "node-3", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert!(
        nobody.is_empty(),
        "{backend:?}: the rejected record released the job"
    );

    // The new holder's record succeeds.
    let fresh_record = Record {
        subject_ticket_id: None,
        steps: vec![step(
            "0",
            tok_store::StepStatus::Completed,
            json!({ "by": "node-2" }),
        )],
        context: json!({ "n": 1, "by": "node-2" }).into(),
        changed: tok_store::ContextChange::Whole,
        actions: 1,
        status: RunStatus::Completed,
        error: None,
        next: NextJob::Done,
    };
    store
        .record(fresh, fresh_record)
        .await
        .expect("the holder's record");
    let done = store.run(&t, &run).await.expect("run").expect("run exists");
    assert_eq!(done.run.status, "completed", "{backend:?}");
    assert_eq!(
        done.context,
        json!({ "n": 1, "by": "node-2" }),
        "{backend:?}"
    );
    assert_eq!(done.steps.len(), 1, "{backend:?}");
    assert_eq!(
        done.steps[0].output,
        Some(json!({ "by": "node-2" })),
        "{backend:?}"
    );

    // A stale record arriving after the job is gone is rejected as well.
    let err = store
        .record(stale, stale_record)
        .await
        .expect_err("stale record");
    assert!(
        matches!(err, StoreError::LeaseLost(_)),
        "{backend:?}: {err}"
    );
    let still = store.run(&t, &run).await.expect("run").expect("run exists");
    assert_eq!(
        (still.run.status.as_str(), still.steps.len()),
        ("completed", 1),
        "{backend:?}"
    );
}

/// Two processes given one node id hold their claims under
/// `node:incarnation`: neither's heartbeat extends the other's lease, and a
/// start releases on PostgreSQL only its own incarnation's claims. On
/// SQLite one process serves a file (a second `tok serve` refuses to
/// start), so at a start every claim is a dead process's and is released.
async fn two_incarnations_of_one_node_keep_each_others_claims(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    start(&*store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let held = store
        .claim(&tenants, "host:first", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(held.len(), 1, "{backend:?}");
    let ids: Vec<_> = held.iter().map(lease).collect();
    let extended = store
        .heartbeat("host:second", &ids, LONG_LEASE_MS)
        .await
        .expect("heartbeat");
    assert!(
        extended.is_empty(),
        "{backend:?}: a heartbeat extends only its holder's leases"
    );
    assert_eq!(
        store
            .heartbeat("host:first", &ids, LONG_LEASE_MS)
            .await
            .expect("heartbeat"),
        [held[0].id],
        "{backend:?}"
    );

    let released = store.release_claims("host:second").await.expect("release");
    let again = store
        .claim(&tenants, "host:second", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    match backend {
        Backend::Postgres => {
            assert_eq!(
                released, 0,
                "{backend:?}: another incarnation's claim is kept"
            );
            assert!(again.is_empty(), "{backend:?}: the live claim is not taken");
            store
                .record(&held[0], finish(&held[0], RunStatus::Completed))
                .await
                .expect("the first incarnation records");
        }
        Backend::Sqlite => {
            assert_eq!(released, 1, "{backend:?}: one process per file");
            assert_eq!(again.len(), 1, "{backend:?}");
        }
    }
}

/// PostgreSQL: claims share no lock. A process stopped (SIGSTOP) inside a
/// claim's transaction holds only what that claim took: the row of the job
/// it leased and the lock of that job's queue key. Another claim, at once
/// and without waiting, takes every other claimable job, and leaves those
/// two (the key's other jobs too). The lock every claim once took is held
/// here as well, and stops nothing. The server cuts the stopped
/// transaction off, and what it held is claimed again. (SQLite: one
/// writer, nothing to share.)
async fn a_process_stopped_inside_a_claim_holds_back_only_what_it_took(db: &TestDb) {
    if db.backend != Backend::Postgres {
        return;
    }
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    let taken = start(&*store, &t, &aut, "manual", None).await;
    let keyed = start(&*store, &t, &aut, "manual", Some("ticket:1")).await;
    let behind = start(&*store, &t, &aut, "manual", Some("ticket:1")).await;
    let mut free = HashSet::new();
    for _ in 0..3 {
        free.insert(start(&*store, &t, &aut, "manual", None).await);
    }
    free.insert(start(&*store, &t, &aut, "manual", Some("ticket:2")).await);

    let mut stopped = transaction_beside(db).await;
    sqlx::query("SELECT id FROM jobs WHERE tenant_id = $1 AND run_id = $2 FOR UPDATE")
        .bind(t.as_str())
        .bind(taken.as_str())
        .execute(&mut stopped)
        .await
        .expect("lock the taken job's row");
    sqlx::query("SELECT pg_advisory_xact_lock(9, hashtext($1)), pg_advisory_xact_lock(1953459970)")
        .bind(format!("{}:ticket:1", t.as_str()))
        .execute(&mut stopped)
        .await
        .expect("hold the key's lock and the old global one");

    let claimed = store
        .claim(std::slice::from_ref(&t), "host:live", 10, LONG_LEASE_MS)
        .await
        .expect("a claim beside the stopped one neither waits nor fails");
    let runs: HashSet<RunId> = claimed.iter().map(|j| j.run_id.clone()).collect();
    assert_eq!(
        runs, free,
        "the claim takes every job the stopped one holds nothing of"
    );
    for held in [&taken, &keyed, &behind] {
        assert!(
            !runs.contains(held),
            "{held} was taken past the stopped claim's locks"
        );
    }

    // The stopped process never ends its transaction: the server cuts it
    // off once it has sat idle for `IDLE_IN_TRANSACTION` (10 s, set by
    // `PgStore::connect_options`), and what it held is claimable again (it
    // leased nothing: it never committed): the taken job and the key's
    // oldest job.
    let later = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let jobs = store
                .claim(std::slice::from_ref(&t), "host:live", 10, LONG_LEASE_MS)
                .await
                .expect("claim");
            if !jobs.is_empty() {
                return jobs;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await
    .expect("the server cuts the stopped transaction off within a minute");
    let later: HashSet<RunId> = later.iter().map(|j| j.run_id.clone()).collect();
    assert_eq!(later, HashSet::from([taken, keyed]));
    let cut = sqlx::Executor::execute(&mut stopped, "SELECT 1").await;
    assert!(
        cut.is_err(),
        "the stopped connection was cut off by the server"
    );
}

/// A process whose heartbeats failed for a lease (the database away) may
/// still be running a job when it is claimed again; both executions may
/// then finish together and their records share a group commit. The fence
/// is by claim (job and token), not by job: only the current claim is
/// written, the stale one is told it lost its lease, and a third record in
/// the same batch is written as usual.
async fn two_executions_of_one_job_in_one_record_batch_record_once(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let aut = manual_automation(store, &t, "a").await;
    let run = start(store, &t, &aut, "manual", None).await;
    let other_run = start(store, &t, &aut, "manual", None).await;
    let tenants = [t.clone()];

    let first = store
        .claim(&tenants, "node-1", 10, SHORT_LEASE_MS)
        .await
        .expect("claim");
    assert_eq!(first.len(), 2, "{backend:?}");
    let stale = first
        .iter()
        .find(|j| j.run_id == run)
        .expect("the run's job")
        .clone();
    let other = first
        .iter()
        .find(|j| j.run_id == other_run)
        .expect("the other job")
        .clone();
    store
        .heartbeat("node-1", &[lease(&other)], LONG_LEASE_MS)
        .await
        .expect("heartbeat");
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let current = store
        .claim(&tenants, "node-1", 10, LONG_LEASE_MS)
        .await
        .expect("claim again");
    assert_eq!(
        current.len(),
        1,
        "{backend:?}: only the expired lease is claimable"
    );
    let current = current[0].clone();
    assert_eq!((current.id, current.attempt), (stale.id, 2), "{backend:?}");

    // All three records are submitted before the group commit takes any.
    let (stale_answer, current_answer, other_answer) = tokio::join!(
        store.record(&stale, finish(&stale, RunStatus::Failed)),
        store.record(&current, finish(&current, RunStatus::Completed)),
        store.record(&other, finish(&other, RunStatus::Completed)),
    );
    assert!(
        matches!(stale_answer, Err(StoreError::LeaseLost(id)) if id == stale.id),
        "{backend:?}: the stale execution is rejected: {stale_answer:?}"
    );
    current_answer.expect("the current claim records");
    other_answer.expect("a batch-mate records");
    for id in [&run, &other_run] {
        let detail = store.run(&t, id).await.expect("run").expect("run exists");
        assert_eq!(detail.run.status, "completed", "{backend:?}: run {id}");
        assert_eq!(
            detail.steps.len(),
            1,
            "{backend:?}: run {id} has one step row"
        );
    }
}

/// Opens a transaction on a connection of its own that holds `run`'s row,
/// as a cancel, a pause or a retry does before it touches the run's jobs.
async fn hold_run(db: &TestDb, tenant: &TenantId, run: &RunId) -> sqlx::PgConnection {
    let mut conn = transaction_beside(db).await;
    sqlx::query("SELECT id FROM runs WHERE tenant_id = $1 AND id = $2 FOR UPDATE")
        .bind(tenant.as_str())
        .bind(run.as_str())
        .execute(&mut conn)
        .await
        .expect("lock the run's row");
    conn
}

/// A run's row held by another transaction (a cancel in progress) keeps
/// only that run's job from a claim: the claim neither waits for the row
/// while it holds the job (the cancel would then wait for the job, and the
/// two for each other) nor fails; the job is claimed once the row is free.
async fn a_claim_passes_over_a_job_whose_run_another_transaction_holds(db: &TestDb) {
    if db.backend != Backend::Postgres {
        return;
    }
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let aut = manual_automation(&*store, &t, "a").await;
    let held = start(&*store, &t, &aut, "manual", None).await;
    let mut free = HashSet::new();
    for _ in 0..2 {
        free.insert(start(&*store, &t, &aut, "manual", None).await);
    }
    let mut holder = hold_run(db, &t, &held).await;

    let claimed = store
        .claim(std::slice::from_ref(&t), "host:live", 10, LONG_LEASE_MS)
        .await
        .expect("a claim beside a held run neither waits for it nor fails");
    let runs: HashSet<RunId> = claimed.iter().map(|j| j.run_id.clone()).collect();
    assert_eq!(runs, free, "every job but the held run's is claimed");

    sqlx::Executor::execute(&mut holder, "ROLLBACK")
        .await
        .expect("rollback");
    let later = store
        .claim(std::slice::from_ref(&t), "host:live", 10, LONG_LEASE_MS)
        .await
        .expect("claim");
    let later: Vec<RunId> = later.iter().map(|j| j.run_id.clone()).collect();
    assert_eq!(later, vec![held], "the run's job once its row is free");
}

/// A cancel holds the run's row and then deletes its jobs; a record of the
/// run's step that arrives meanwhile waits for the run's row before it
/// locks the job, so the cancel's delete goes through (no deadlock, which
/// PostgreSQL would break by failing one of them) and the record finds its
/// job gone: its lease was lost, and nothing of it is written.
async fn a_record_waits_for_its_run_before_it_locks_its_job(db: &TestDb) {
    if db.backend != Backend::Postgres {
        return;
    }
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let (run, job) = claimed_run(&*store, &t).await;
    let mut cancel = hold_run(db, &t, &run).await;

    let record = store.record(&job, finish(&job, RunStatus::Completed));
    let cancelling = async {
        // The record is under way once it waits for a lock.
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&mut cancel)
                .await
                .expect("waiting backends");
                if waiting > 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the record waits for the run's row");
        let deleted = sqlx::query("DELETE FROM jobs WHERE tenant_id = $1 AND run_id = $2")
            .bind(t.as_str())
            .bind(run.as_str())
            .execute(&mut cancel)
            .await
            .expect("the cancel deletes the run's job beside the waiting record")
            .rows_affected();
        sqlx::query("UPDATE runs SET status = 'cancelled' WHERE tenant_id = $1 AND id = $2")
            .bind(t.as_str())
            .bind(run.as_str())
            .execute(&mut cancel)
            .await
            .expect("the run cancelled");
        sqlx::Executor::execute(&mut cancel, "COMMIT")
            .await
            .expect("commit");
        deleted
    };
    let (recorded, deleted) = tokio::join!(record, cancelling);
    assert_eq!(deleted, 1, "the cancel deleted the job");
    assert!(
        matches!(recorded, Err(StoreError::LeaseLost(id)) if id == job.id),
        "the record lost its lease to the cancel: {recorded:?}"
    );
    let after = store.run(&t, &run).await.expect("run").expect("run exists");
    assert_eq!(after.run.status, "cancelled");
    assert!(after.steps.is_empty(), "{:?}", after.steps);
}
