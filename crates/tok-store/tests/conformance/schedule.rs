//! The scheduler's rows (`ScheduleStore`): the wake's lease is held by one
//! holder at a time and taken over once expired; schedule rows follow the
//! automations' versions; a due time moves on only from the value it was
//! read at; and one tick's run, started twice with its key, is one run.
//! Times are the caller's clock: the tests pass them, nothing sleeps.

use tok_store::{AutomationStatus, DueTrigger};

use super::*;

backend_tests!(
    run_on_fresh_db;
    the_wake_lease_has_one_holder_until_it_expires,
    schedule_rows_follow_the_automations_versions,
    a_due_time_moves_on_once_from_the_value_read,
    due_rows_say_whether_the_automation_is_paused_and_its_last_run_done,
    one_ticks_run_started_twice_is_one_run,
    one_read_finds_the_rows_of_every_tenant_asked_for_and_no_other,
);

fn one(t: &TenantId) -> &[TenantId] {
    std::slice::from_ref(t)
}

/// The wake reads for every tenant at once: each row comes with its
/// tenant, a tenant not asked for is not read, and the due rows of all
/// come earliest first whoever their tenant.
async fn one_read_finds_the_rows_of_every_tenant_asked_for_and_no_other(db: &TestDb) {
    let store = db.store().await;
    let a = tenant(&*store, "a").await;
    let b = tenant(&*store, "b").await;
    let c = tenant(&*store, "c").await;
    let pa = poll_automation(&*store, &a, "pa").await;
    let pb = poll_automation(&*store, &b, "pb").await;
    let pc = poll_automation(&*store, &c, "pc").await;
    let asked = [a.clone(), b.clone()];

    let (stale, gone) = store.stale_schedules(&asked).await.unwrap();
    let mut stale: Vec<_> = stale
        .into_iter()
        .map(|s| (s.tenant_id, s.automation_id))
        .collect();
    stale.sort();
    let mut expected = vec![(a.clone(), pa.clone()), (b.clone(), pb.clone())];
    expected.sort();
    assert_eq!(stale, expected, "c was not asked for");
    assert!(gone.is_empty());

    store
        .set_schedule(&a, &pa, 1, "{}", Some(3_000), false)
        .await
        .unwrap();
    store
        .set_schedule(&b, &pb, 1, "{}", Some(1_000), false)
        .await
        .unwrap();
    store
        .set_schedule(&c, &pc, 1, "{}", Some(500), false)
        .await
        .unwrap();
    let due: Vec<_> = store
        .due(&asked, 5_000, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.tenant_id, d.automation_id, d.due_at))
        .collect();
    assert_eq!(
        due,
        [
            (b.clone(), pb.clone(), 1_000),
            (a.clone(), pa.clone(), 3_000)
        ],
        "earliest first across tenants; c's row is not read"
    );
    assert!(store.due(&[], 5_000, 10).await.unwrap().is_empty());

    // A row whose automation went is to be removed, under its own tenant.
    store
        .save_version(&b, &pb, version("pb", "manual", None))
        .await
        .unwrap();
    let (_, gone) = store.stale_schedules(&asked).await.unwrap();
    assert_eq!(gone, [(b.clone(), pb.clone())]);
}

const LEASE: i64 = 10_000;

async fn the_wake_lease_has_one_holder_until_it_expires(db: &TestDb) {
    let store = db.store().await;
    let t0 = 1_000_000;
    assert!(store.hold_wake("a", "a1", t0, LEASE).await.unwrap());
    assert!(!store.hold_wake("b", "b1", t0 + 1, LEASE).await.unwrap());
    // Renewed by its holder: still held past the first expiry.
    assert!(store.hold_wake("a", "a1", t0 + 5_000, LEASE).await.unwrap());
    assert!(
        !store
            .hold_wake("b", "b1", t0 + LEASE + 1, LEASE)
            .await
            .unwrap(),
        "renewed at +5 s, the lease lives until +15 s"
    );
    // The holder stops renewing: another node takes over once it expired.
    assert!(
        store
            .hold_wake("b", "b1", t0 + 5_000 + LEASE, LEASE)
            .await
            .unwrap()
    );
    assert!(
        !store
            .hold_wake("a", "a1", t0 + 5_001 + LEASE, LEASE)
            .await
            .unwrap(),
        "the old holder has lost it"
    );
    // A node restarted under the same id takes its own row over at once.
    assert!(
        store
            .hold_wake("b", "b2", t0 + 5_002 + LEASE, LEASE)
            .await
            .unwrap()
    );
    // Released by another incarnation: nothing happens.
    store.release_wake("b1").await.unwrap();
    assert!(
        !store
            .hold_wake("a", "a1", t0 + 5_003 + LEASE, LEASE)
            .await
            .unwrap()
    );
    // Released by its holder: free at once.
    store.release_wake("b2").await.unwrap();
    assert!(
        store
            .hold_wake("a", "a1", t0 + 5_004 + LEASE, LEASE)
            .await
            .unwrap()
    );
}

async fn poll_automation(store: &dyn Store, tenant: &TenantId, name: &str) -> AutomationId {
    store
        .create_automation(tenant, version(name, "poll", None))
        .await
        .expect("create automation")
        .id
}

async fn schedule_rows_follow_the_automations_versions(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let poll = poll_automation(&*store, &t, "poll").await;
    manual_automation(&*store, &t, "manual").await;
    poll_automation(&*store, &other, "theirs").await;

    let (stale, gone) = store.stale_schedules(one(&t)).await.unwrap();
    assert_eq!(
        stale
            .iter()
            .map(|s| (&s.automation_id, s.version, s.spec.as_deref()))
            .collect::<Vec<_>>(),
        [(&poll, 1, None)],
        "only this tenant's poll automation, with no row yet"
    );
    assert!(gone.is_empty());

    store
        .set_schedule(&t, &poll, 1, "{\"kind\":\"poll\"}", Some(5_000), false)
        .await
        .unwrap();
    assert!(store.stale_schedules(one(&t)).await.unwrap().0.is_empty());
    assert_eq!(store.next_run_at(&t, &poll).await.unwrap(), Some(5_000));
    assert_eq!(store.next_run_at(&other, &poll).await.unwrap(), None);

    // A new version makes the row stale again, with the trigger it was made from.
    store
        .save_version(&t, &poll, version("poll", "poll", None))
        .await
        .unwrap();
    let (stale, _) = store.stale_schedules(one(&t)).await.unwrap();
    assert_eq!(stale[0].version, 2);
    assert_eq!(stale[0].spec.as_deref(), Some("{\"kind\":\"poll\"}"));
    // The trigger stayed: the due time too.
    store
        .set_schedule(&t, &poll, 2, "{\"kind\":\"poll\"}", Some(9_000), true)
        .await
        .unwrap();
    assert_eq!(store.next_run_at(&t, &poll).await.unwrap(), Some(5_000));

    // Saved with another kind of trigger: the row is to be removed.
    store
        .save_version(&t, &poll, version("poll", "manual", None))
        .await
        .unwrap();
    let (stale, gone) = store.stale_schedules(one(&t)).await.unwrap();
    assert!(stale.is_empty());
    assert_eq!(gone, [(t.clone(), poll.clone())]);
    store.remove_schedule(&t, &poll).await.unwrap();
    assert_eq!(store.stale_schedules(one(&t)).await.unwrap().1, []);
    assert_eq!(store.next_run_at(&t, &poll).await.unwrap(), None);
}

async fn a_due_time_moves_on_once_from_the_value_read(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let early = poll_automation(&*store, &t, "early").await;
    let late = poll_automation(&*store, &t, "late").await;
    store
        .set_schedule(&t, &early, 1, "{}", Some(1_000), false)
        .await
        .unwrap();
    store
        .set_schedule(&t, &late, 1, "{}", Some(3_000), false)
        .await
        .unwrap();

    let due_at = |due: Vec<DueTrigger>| {
        due.into_iter()
            .map(|d| (d.automation_id, d.due_at))
            .collect::<Vec<_>>()
    };
    assert_eq!(due_at(store.due(one(&t), 999, 10).await.unwrap()), []);
    assert_eq!(
        due_at(store.due(one(&t), 5_000, 10).await.unwrap()),
        [(early.clone(), 1_000), (late.clone(), 3_000)],
        "earliest first"
    );
    assert_eq!(due_at(store.due(one(&t), 5_000, 1).await.unwrap()).len(), 1);

    let run = start(&*store, &t, &early, "poll", None).await;
    assert!(
        store
            .advance(&t, &early, 1_000, Some(61_000), Some(&run), 1_200)
            .await
            .unwrap()
    );
    assert!(
        !store
            .advance(&t, &early, 1_000, Some(62_000), None, 1_300)
            .await
            .unwrap(),
        "a second scheduler firing the same tick moves nothing"
    );
    assert_eq!(store.next_run_at(&t, &early).await.unwrap(), Some(61_000));
    assert_eq!(
        due_at(store.due(one(&t), 5_000, 10).await.unwrap()),
        [(late, 3_000)]
    );
}

async fn due_rows_say_whether_the_automation_is_paused_and_its_last_run_done(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let poll = poll_automation(&*store, &t, "poll").await;
    store
        .set_schedule(&t, &poll, 1, "{}", Some(1_000), false)
        .await
        .unwrap();
    let due = store.due(one(&t), 1_000, 10).await.unwrap();
    assert_eq!(due[0].status, AutomationStatus::Active);
    assert_eq!(due[0].last_run_status, None);

    let run = start(&*store, &t, &poll, "poll", None).await;
    store
        .advance(&t, &poll, 1_000, Some(2_000), Some(&run), 1_000)
        .await
        .unwrap();
    store
        .set_automation_status(&t, &poll, AutomationStatus::Paused)
        .await
        .unwrap();
    let due = store.due(one(&t), 2_000, 10).await.unwrap();
    assert_eq!(due[0].status, AutomationStatus::Paused);
    assert_eq!(due[0].last_run_status, Some(RunStatus::Queued));

    store.cancel_run(&t, &run).await.unwrap();
    let due = store.due(one(&t), 2_000, 10).await.unwrap();
    assert_eq!(due[0].last_run_status, Some(RunStatus::Cancelled));
}

async fn one_ticks_run_started_twice_is_one_run(db: &TestDb) {
    let store = db.store().await;
    let t = tenant(&*store, "acme").await;
    let cron = store
        .create_automation(&t, version("cron", "schedule", None))
        .await
        .unwrap()
        .id;
    let tick = |store: Arc<dyn Store>, t: TenantId, cron: AutomationId| async move {
        let mut run = new_run(&cron, "schedule", None);
        run.idempotency_key = Some("schedule:60000".into());
        store.start_run(&t, manual_event(&cron), run).await
    };
    let (a, b) = tokio::join!(
        tick(store.clone(), t.clone(), cron.clone()),
        tick(store.clone(), t.clone(), cron.clone())
    );
    assert_eq!(a.unwrap(), b.unwrap());
    let runs = store
        .runs(&t, &RunFilter::default(), 10, None)
        .await
        .unwrap();
    assert_eq!(runs.items.len(), 1);
}
