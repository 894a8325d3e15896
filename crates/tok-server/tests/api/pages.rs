//! Listings as a client pages them (docs/api.md, "Conventions every route
//! follows"): every listing takes `limit` (default 50, at most 500) and
//! `cursor`, and answers `{items, next_cursor}`; following the cursors with
//! `limit=1` reads every item once and ends with a null cursor. A cursor
//! the API did not give out, one another listing gave out, and a bad limit
//! are 400s that say which.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests, ids, manual, plain_source, run};

backend_tests!(
    run;
    every_listing_pages_with_one_shape,
    a_bad_cursor_or_limit_is_a_400_on_every_listing,
);

/// The listings of a tenant's key, and how many items [`two_of_each`] made.
const LISTINGS: &[(&str, usize)] = &[
    ("/api/sources", 2),
    ("/api/automations", 2),
    ("/api/runs", 2),
    ("/api/dashboard/runs", 2),
    ("/api/connections", 2),
    ("/api/groups", 2),
    ("/api/ticket-types", 2),
    ("/api/tickets", 2),
    ("/api/widgets", 2),
    ("/api/incidents", 0),
    ("/api/approvals", 0),
];

/// Two of every kind of thing a tenant lists.
async fn two_of_each(app: &TestApp, tenant: &Tenant) {
    for n in 1..=2 {
        app.create_source(tenant, &plain_source(&format!("shop-{n}")))
            .await;
        let automation = app
            .create_automation(tenant, &manual(&format!("flow-{n}"), &json!([])))
            .await;
        app.start_run(tenant, &automation, &json!({ "input": {} }))
            .await;
        let connection = json!({
            "name": format!("api-{n}"), "service": "http", "base_url": "https://api.test",
        });
        app.post(&tenant.key, "/api/connections", &connection)
            .await
            .expect(StatusCode::CREATED);
        app.create_group(tenant, &format!("team-{n}"), &["Eva"])
            .await;
        app.create_ticket_type(tenant, &format!("kind-{n}"), &["new"])
            .await;
        app.create_ticket(tenant, &json!({ "external_id": format!("t-{n}") }))
            .await;
        let widget = json!({
            "name": format!("tile-{n}"), "request": { "url": "https://api.test/x" }, "ttlSec": 60,
        });
        app.post(&tenant.key, "/api/widgets", &widget)
            .await
            .expect(StatusCode::CREATED);
    }
}

/// Every page of `uri` with `limit=1`: the items, one a page.
async fn walk(app: &TestApp, key: &str, uri: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut next = format!("{uri}?limit=1");
    loop {
        let page = app.get(key, &next).await.expect(StatusCode::OK);
        let got = page["items"].as_array().expect("items").clone();
        assert!(got.len() <= 1, "{uri}: more than the limit: {page:#}");
        items.extend(got);
        match &page["next_cursor"] {
            Value::Null => break,
            Value::String(cursor) => next = format!("{uri}?limit=1&cursor={cursor}"),
            other => panic!("{uri}: next_cursor is {other}"),
        }
        assert!(items.len() < 20, "{uri}: the cursor never ends");
    }
    items
}

async fn every_listing_pages_with_one_shape(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    two_of_each(app, &acme).await;
    let other = app.create_tenant("Other").await;
    two_of_each(app, &other).await;
    for (uri, count) in LISTINGS {
        let items = walk(app, &acme.key, uri).await;
        assert_eq!(items.len(), *count, "{uri}: {items:#?}");
        let mut seen = ids(&items);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), *count, "{uri}: an item on two pages");
        let all = app.get(&acme.key, uri).await.expect(StatusCode::OK);
        assert_eq!(
            ids(all["items"].as_array().expect("items")),
            ids(&items),
            "{uri}: one page of all, in the same order"
        );
        assert!(all["next_cursor"].is_null(), "{uri}: {all:#}");
    }
    let tenants = walk(app, &app.admin_key, "/api/tenants").await;
    let names: Vec<&str> = tenants.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["Acme", "Other"], "oldest first");
    let platform = app
        .get(&app.admin_key, "/api/platform/incidents?limit=1")
        .await
        .expect(StatusCode::OK);
    assert!(platform["items"].is_array() && platform["next_cursor"].is_null());
}

async fn a_bad_cursor_or_limit_is_a_400_on_every_listing(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    two_of_each(app, &acme).await;
    let first = app
        .get(&acme.key, "/api/sources?limit=1")
        .await
        .expect(StatusCode::OK);
    let sources_cursor = first["next_cursor"].as_str().expect("a second page");
    let mut listings: Vec<(&str, &str)> = LISTINGS
        .iter()
        .map(|(uri, _)| (*uri, acme.key.as_str()))
        .collect();
    listings.push(("/api/tenants", &app.admin_key));
    listings.push(("/api/platform/incidents", &app.admin_key));
    for (uri, key) in listings {
        // U+0000 is refused before any listing reads its cursor.
        let error = app
            .get(key, &format!("{uri}?cursor=%00"))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "nul_in_query");
        assert_eq!(error["param"], "cursor", "{uri}: {error:#}");
        for cursor in ["not-a-cursor!", "bm9uc2Vuc2U"] {
            let error = app
                .get(key, &format!("{uri}?cursor={cursor}"))
                .await
                .expect_error(StatusCode::BAD_REQUEST, "bad_cursor");
            assert_eq!(error["param"], "cursor", "{uri}: {error:#}");
            assert!(
                error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("is not a cursor this API gave out")),
                "{uri}: {error:#}"
            );
        }
        if uri != "/api/sources" {
            let error = app
                .get(key, &format!("{uri}?cursor={sources_cursor}"))
                .await
                .expect_error(StatusCode::BAD_REQUEST, "bad_cursor");
            assert!(
                error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("is from the sources listing")),
                "{uri}: {error:#}"
            );
        }
        for limit in ["0", "501"] {
            let error = app
                .get(key, &format!("{uri}?limit={limit}"))
                .await
                .expect_error(StatusCode::BAD_REQUEST, "bad_limit");
            assert_eq!(
                error["message"],
                format!("limit is {limit}; it must be between 1 and 500"),
                "{uri}"
            );
        }
        for query in ["limit=many", "colour=red"] {
            app.get(key, &format!("{uri}?{query}"))
                .await
                .expect_error(StatusCode::BAD_REQUEST, "bad_query");
        }
        app.get(key, &format!("{uri}?limit=500"))
            .await
            .expect(StatusCode::OK);
    }
}
