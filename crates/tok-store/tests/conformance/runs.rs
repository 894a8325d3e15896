//! The runs listing (`RunStore::runs`): newest first, filtered by status,
//! automation and trigger, in cursor pages.

use super::*;

backend_tests!(
    run_on_fresh_db;
    runs_are_listed_newest_first_with_filters_and_cursor_pages,
);

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
