//! The runs listing (`RunStore::runs`): newest first, filtered by status,
//! automation and trigger, in cursor pages.

use super::*;

backend_tests!(
    run_on_fresh_db;
    runs_are_listed_newest_first_with_filters_and_cursor_pages,
    runs_are_found_by_what_their_body_contains,
);

/// `RunFilter::body_contains`: the runs whose body (their context's
/// `_body`, kept as it was when they started) holds every string and
/// boolean of the document at its place, and of the tenant only.
async fn runs_are_found_by_what_their_body_contains(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let other = tenant(store, "beta").await;
    let x = manual_automation(store, &t, "x").await;
    let theirs = manual_automation(store, &other, "x").await;
    let bodies = [
        json!({ "order": { "id": "A-1", "paid": true }, "shop": "cz" }),
        json!({ "order": { "id": "A-2", "paid": false }, "shop": "cz" }),
        json!({ "order": { "id": "A-2", "paid": "true" }, "shop": "sk" }),
        json!({ "order": [{ "id": "A-2" }], "shop": "cz" }),
        json!({ "order": { "id": 2 } }),
    ];
    let mut ids = Vec::new();
    for body in &bodies {
        let mut run = new_run(&x, "manual", None);
        run.context = json!({ "_body": body, "st_a": { "id": "A-2" } });
        ids.push(store.start_run(&t, manual_event(&x), run).await.unwrap());
    }
    let mut run = new_run(&theirs, "manual", None);
    run.context = json!({ "_body": bodies[1] });
    store
        .start_run(&other, manual_event(&theirs), run)
        .await
        .unwrap();
    let found = |doc: Value| {
        let filter = RunFilter {
            body_contains: Some(doc),
            ..RunFilter::default()
        };
        let t = &t;
        async move {
            let mut got: Vec<RunId> = store
                .runs(t, &filter, 50, None)
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|r| r.id)
                .collect();
            got.sort();
            got
        }
    };
    let of = |i: &[usize]| {
        let mut v: Vec<RunId> = i.iter().map(|&i| ids[i].clone()).collect();
        v.sort();
        v
    };
    assert_eq!(
        found(json!({ "order": { "id": "A-2" } })).await,
        of(&[1, 2]),
        "{backend:?}"
    );
    assert_eq!(
        found(json!({ "order": { "paid": true } })).await,
        of(&[0]),
        "{backend:?}"
    );
    assert_eq!(
        found(json!({ "order": { "id": "A-2" }, "shop": "cz" })).await,
        of(&[1]),
        "{backend:?}"
    );
    assert_eq!(found(json!({ "shop": "pl" })).await, of(&[]), "{backend:?}");
}

async fn runs_are_listed_newest_first_with_filters_and_cursor_pages(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let t = tenant(store, "acme").await;
    let x = manual_automation(store, &t, "x").await;
    let y = manual_automation(store, &t, "y").await;
    // r1..r5, oldest first: (automation, trigger). Run ids order by creation
    // time to the millisecond, so the runs are created a few ms apart.
    let plan = [
        (&x, "manual"),
        (&x, "webhook"),
        (&x, "manual"),
        (&y, "webhook"),
        (&y, "manual"),
    ];
    let mut r = Vec::new();
    for (aut, trigger) in plan {
        r.push(start(store, &t, aut, trigger, None).await);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    // r2 and r4 complete, r5 fails, r1 and r3 stay running.
    let jobs = store
        .claim(std::slice::from_ref(&t), "node-1", 10, LONG_LEASE_MS)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 5, "{backend:?}");
    for job in &jobs {
        let status = if job.run_id == r[1] || job.run_id == r[3] {
            RunStatus::Completed
        } else if job.run_id == r[4] {
            RunStatus::Failed
        } else {
            continue;
        };
        store.record(job, finish(job, status)).await.unwrap();
    }

    let tenant = &t;
    let list = |filter: RunFilter| async move {
        let page = store.runs(tenant, &filter, 50, None).await.unwrap();
        assert!(
            page.next_cursor.is_none(),
            "{backend:?}: one page holds them all"
        );
        page.items.into_iter().map(|s| s.id).collect::<Vec<_>>()
    };
    let status = |s: &str| RunFilter {
        status: Some(s.into()),
        ..RunFilter::default()
    };
    let newest_first = |idx: &[usize]| idx.iter().map(|&i| r[i].clone()).collect::<Vec<_>>();
    assert_eq!(
        list(RunFilter::default()).await,
        newest_first(&[4, 3, 2, 1, 0]),
        "{backend:?}"
    );
    assert_eq!(
        list(status("completed")).await,
        newest_first(&[3, 1]),
        "{backend:?}"
    );
    assert_eq!(
        list(status("failed")).await,
        newest_first(&[4]),
        "{backend:?}"
    );
    assert_eq!(
        list(status("running")).await,
        newest_first(&[2, 0]),
        "{backend:?}"
    );
    assert_eq!(
        list(status("queued")).await,
        newest_first(&[]),
        "{backend:?}"
    );
    let by_aut = RunFilter {
        automation_id: Some(y.to_string()),
        ..RunFilter::default()
    };
    assert_eq!(list(by_aut).await, newest_first(&[4, 3]), "{backend:?}");
    let by_trigger = RunFilter {
        trigger_type: Some("webhook".into()),
        ..RunFilter::default()
    };
    assert_eq!(list(by_trigger).await, newest_first(&[3, 1]), "{backend:?}");
    let combined = RunFilter {
        status: Some("running".into()),
        automation_id: Some(x.to_string()),
        trigger_type: Some("manual".into()),
        ..RunFilter::default()
    };
    assert_eq!(list(combined).await, newest_first(&[2, 0]), "{backend:?}");

    // Pages of 2 over 5 runs: 2, 2, 1, the last without a cursor.
    let pages = pages_of(store, &t, &RunFilter::default(), 2).await;
    let sizes: Vec<usize> = pages.iter().map(|(items, _)| items.len()).collect();
    assert_eq!(sizes, vec![2, 2, 1], "{backend:?}");
    let cursors: Vec<bool> = pages.iter().map(|(_, more)| *more).collect();
    assert_eq!(cursors, vec![true, true, false], "{backend:?}");
    let walked: Vec<RunId> = pages.into_iter().flat_map(|(items, _)| items).collect();
    assert_eq!(
        walked,
        newest_first(&[4, 3, 2, 1, 0]),
        "{backend:?}: no duplicates, no gaps"
    );

    // A limit equal to the count: one page, no cursor. And pages under a filter.
    let pages = pages_of(store, &t, &RunFilter::default(), 5).await;
    assert_eq!(pages.len(), 1, "{backend:?}");
    assert!(!pages[0].1, "{backend:?}");
    let by_x = RunFilter {
        automation_id: Some(x.to_string()),
        ..RunFilter::default()
    };
    let pages = pages_of(store, &t, &by_x, 2).await;
    let walked: Vec<RunId> = pages.into_iter().flat_map(|(items, _)| items).collect();
    assert_eq!(walked, newest_first(&[2, 1, 0]), "{backend:?}");
}

/// Every page of a listing, following `next_cursor`: (ids, had a cursor).
async fn pages_of(
    store: &dyn Store,
    tenant: &TenantId,
    filter: &RunFilter,
    limit: u32,
) -> Vec<(Vec<RunId>, bool)> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .runs(tenant, filter, limit, cursor.as_deref())
            .await
            .unwrap();
        let ids = page.items.into_iter().map(|s| s.id).collect();
        pages.push((ids, page.next_cursor.is_some()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return pages,
        }
        assert!(pages.len() <= 10, "the cursor never ends");
    }
}
