//! Pages: every listing of the API reads keyset pages in its own order
//! (configuration by name or oldest first, incidents newest first), a page
//! starts after the key its cursor names, the last page has no cursor, and
//! no page shows another tenant's rows. The runs, tickets and incidents
//! listings are paged in their own modules and the API tests.

use tok_store::{NewConnection, NewGroup, NewPlatformIncident, NewTicketType, NewWidget, Page};

use super::*;

backend_tests!(
    run_on_fresh_db;
    every_listing_pages_by_its_key_within_its_tenant,
    platform_incidents_and_tenants_page_newest_and_oldest_first,
);

/// Every page of a listing, as the keys `$key` makes of its rows: `$call`
/// reads one page of at most two rows after `$after` (`None`: the first).
macro_rules! pages {
    (|$after:ident| $call:expr, $key:expr) => {{
        let mut pages: Vec<Vec<String>> = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let $after = cursor.as_deref();
            let page = $call.await.expect("a page");
            pages.push(page.items.iter().map($key).collect());
            cursor = page.next_cursor;
            if cursor.is_none() || pages.len() > 5 {
                break;
            }
        }
        pages
    }};
}

fn connection(name: &str) -> NewConnection {
    NewConnection {
        name: name.into(),
        service: "http".into(),
        base_url: Some("https://api.test".into()),
        credentials: json!({}),
        rate: None,
        burst: 1,
        max_concurrency: None,
        breaker_threshold: 5,
        breaker_cooldown_ms: 30_000,
    }
}

/// Pages of two of three rows, and the keys of all of them in order.
fn two_then_one(pages: &[Vec<String>]) -> Vec<String> {
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        [2, 1],
        "{pages:?}"
    );
    pages.concat()
}

async fn every_listing_pages_by_its_key_within_its_tenant(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let a = tenant(&*store, "acme").await;
    let b = tenant(&*store, "other").await;
    for (t, names) in [(&a, &["c", "a", "b"][..]), (&b, &["a", "d"][..])] {
        for name in names {
            source(&*store, t, name).await;
            manual_automation(&*store, t, name).await;
            store.create_connection(t, connection(name)).await.unwrap();
            let group = NewGroup {
                name: (*name).into(),
                members: vec![("Eva".into(), 3)],
            };
            store.create_group(t, group).await.unwrap();
            let kind = NewTicketType {
                name: (*name).into(),
                statuses: vec!["new".into()],
                fields: json!([]),
            };
            store.create_ticket_type(t, kind).await.unwrap();
            let widget = NewWidget {
                name: (*name).into(),
                connection: None,
                request: json!({ "url": "https://api.test/x" }),
                ttl_ms: 60_000,
            };
            store.create_widget(t, widget).await.unwrap();
        }
    }
    let by_name = ["a", "b", "c"];

    let connections = pages!(|after| store.connections(&a, 2, after), |c| c.name.clone());
    assert_eq!(
        two_then_one(&connections),
        by_name,
        "{backend:?}: connections"
    );
    let groups = pages!(|after| store.groups_page(&a, 2, after), |g| g.name.clone());
    assert_eq!(two_then_one(&groups), by_name, "{backend:?}: groups");
    let members: Vec<usize> = store
        .groups_page(&a, 2, None)
        .await
        .unwrap()
        .items
        .iter()
        .map(|g| g.members.len())
        .collect();
    assert_eq!(members, [1, 1], "{backend:?}: a group's members");
    let types = pages!(|after| store.ticket_types_page(&a, 2, after), |t| t
        .name
        .clone());
    assert_eq!(two_then_one(&types), by_name, "{backend:?}: ticket types");
    let widgets = pages!(|after| store.widgets(&a, 2, after), |w| w.name.clone());
    assert_eq!(two_then_one(&widgets), by_name, "{backend:?}: widgets");

    // Oldest first: by id, which sorts by creation time.
    let sources = pages!(|after| store.sources_page(&a, 2, after), |s| s
        .id
        .to_string());
    let ids = two_then_one(&sources);
    assert!(ids.is_sorted() && ids[0] < ids[1], "{backend:?}: {ids:?}");
    let mut names: Vec<String> = Vec::new();
    for id in &ids {
        let source = store
            .source(&a, &SourceId::from(id.as_str()))
            .await
            .unwrap();
        names.push(source.expect("a's source").name);
    }
    names.sort();
    assert_eq!(names, by_name, "{backend:?}: sources");
    let automations = pages!(|after| store.automations_page(&a, 2, after), |r| r
        .id
        .to_string());
    let ids = two_then_one(&automations);
    assert!(ids.is_sorted() && ids[0] < ids[1], "{backend:?}: {ids:?}");

    // The other tenant's listings hold only its own two rows, in one page.
    let theirs: Page<String> = {
        let page = store.widgets(&b, 2, None).await.unwrap();
        Page {
            items: page.items.into_iter().map(|w| w.name).collect(),
            next_cursor: page.next_cursor,
        }
    };
    assert_eq!(theirs.items, ["a", "d"], "{backend:?}");
    assert_eq!(
        theirs.next_cursor, None,
        "{backend:?}: two rows fill no second page"
    );
    let after_a = store.connections(&b, 50, Some("a")).await.unwrap();
    let names: Vec<&str> = after_a.items.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["d"], "{backend:?}: b's rows after `a`, none of a's");
}

async fn platform_incidents_and_tenants_page_newest_and_oldest_first(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let first = tenant(&*store, "acme").await;
    let second = tenant(&*store, "other").await;
    let tenants = pages!(|after| store.tenants(1, after), |t| t.id.to_string());
    let mut ids = [first.to_string(), second.to_string()];
    ids.sort();
    assert_eq!(
        tenants,
        [vec![ids[0].clone()], vec![ids[1].clone()]],
        "{backend:?}: tenants, one a page, by id (oldest first)"
    );

    let mut opened = Vec::new();
    for n in 0..3 {
        let incident = NewPlatformIncident {
            reason: "wait_overdue",
            source: format!("wait_overdue:run_{n}"),
            tenant_id: None,
            run_id: None,
            title: "stuck".into(),
            detail: json!({ "n": n }),
        };
        let (id, new) = store
            .open_platform_incident(incident, 1_000 + n)
            .await
            .unwrap();
        assert!(new);
        opened.push(id);
    }
    opened.sort();
    opened.reverse();
    let pages = pages!(
        |after| store.platform_incidents(Some("open"), 2, after),
        |i| i.id.clone()
    );
    assert_eq!(two_then_one(&pages), opened, "{backend:?}: newest first");
    let resolved = store
        .platform_incidents(Some("resolved"), 2, None)
        .await
        .unwrap();
    assert!(resolved.items.is_empty() && resolved.next_cursor.is_none());
}
