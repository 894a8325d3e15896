//! Dashboard widgets through the API, against a local service that counts
//! the calls it gets: a fresh cache answers with no call, `refresh=true`
//! makes one, an expired cache makes one; the calls carry the connection's
//! credentials and are held back by its rate limit; a refresh that fails
//! or is held back serves the cached answer with its error; bad widgets
//! are refused with what was expected; and another tenant sees none of
//! them. A widget changes (checked as a create is; a new request or
//! connection drops its cache, a new time to live keeps it) and is
//! deleted. A widget reads: a `GET`, never another method (a `read` key
//! refreshes it), and its refreshes are limited per widget.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use serde_json::{Value, json};

use crate::helpers::{Tenant, TestApp, backend_tests};

backend_tests!(
    crate::helpers::run_with_service;
    a_fresh_cache_calls_nothing_and_a_refresh_or_an_expired_cache_calls_once,
    a_failed_refresh_serves_the_cached_answer_with_its_error,
    the_connections_rate_limit_holds_a_refresh_back,
    bad_widgets_are_refused_with_what_was_expected,
    another_tenants_widgets_are_invisible,
    a_new_request_drops_the_cache_and_a_new_ttl_keeps_it,
    an_answer_to_the_request_before_a_change_is_not_kept,
    bad_widget_changes_are_refused_and_a_deleted_widget_is_gone,
    a_widget_only_reads_even_one_saved_before_widgets_were_reads,
    refreshes_are_limited_per_widget_and_the_cache_still_answers,
);

const SECRET: &str = "sk_widget_secret";

/// The outside service: counts calls, answers the count as JSON, and
/// answers 500 while `failing`.
#[derive(Default)]
struct Service {
    calls: AtomicUsize,
    failing: AtomicBool,
    authorized: AtomicUsize,
    /// `/orders/slow` says it was reached, then answers once let go.
    reached: tokio::sync::Notify,
    let_go: tokio::sync::Notify,
}

impl Service {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn answer(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
) -> (StatusCode, axum::Json<Value>) {
    let n = service.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {SECRET}"))
    {
        service.authorized.fetch_add(1, Ordering::SeqCst);
    }
    if service.failing.load(Ordering::SeqCst) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({ "down": true })),
        );
    }
    (StatusCode::OK, axum::Json(json!({ "open_orders": n })))
}

async fn slow(State(service): State<Arc<Service>>) -> axum::Json<Value> {
    service.calls.fetch_add(1, Ordering::SeqCst);
    service.reached.notify_one();
    service.let_go.notified().await;
    axum::Json(json!({ "slow": true }))
}

async fn serve(app: &TestApp, service: Arc<Service>) -> SocketAddr {
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/orders/open", get(answer).delete(answer).post(answer))
        .route("/orders/slow", get(slow))
        .with_state(service);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A tenant with a connection `stats` to the service at `addr`.
async fn tenant_with_connection(app: &TestApp, addr: SocketAddr) -> Tenant {
    let tenant = app.create_tenant("Acme").await;
    app.post(
        &tenant.key,
        "/api/connections",
        &json!({
            "name": "stats",
            "service": "http",
            "base_url": format!("http://{addr}"),
            "credentials": { "bearer": SECRET },
        }),
    )
    .await
    .expect(StatusCode::CREATED);
    tenant
}

async fn widget(app: &TestApp, tenant: &Tenant, name: &str, ttl_sec: i64) -> String {
    let created = app
        .post(
            &tenant.key,
            "/api/widgets",
            &json!({
                "name": name,
                "connection": "stats",
                "request": { "url": "/orders/open" },
                "ttlSec": ttl_sec,
            }),
        )
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(created["name"], name);
    assert_eq!(created["ttl_sec"], ttl_sec);
    assert_eq!(created["fetched_at"], Value::Null);
    created["id"].as_str().unwrap().to_owned()
}

async fn data(app: &TestApp, tenant: &Tenant, id: &str, query: &str) -> Value {
    app.get(&tenant.key, &format!("/api/widgets/{id}/data{query}"))
        .await
        .expect(StatusCode::OK)
}

async fn a_fresh_cache_calls_nothing_and_a_refresh_or_an_expired_cache_calls_once(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = tenant_with_connection(app, addr).await;
    let hourly = widget(app, &tenant, "Open orders", 3600).await;

    let first = data(app, &tenant, &hourly, "").await;
    assert_eq!(first["data"], json!({ "open_orders": 1 }));
    assert_eq!(first["cached"], false);
    assert_eq!(service.calls(), 1);
    assert_eq!(
        service.authorized.load(Ordering::SeqCst),
        1,
        "the connection's credentials"
    );
    let fetched_at = first["fetched_at"].as_str().unwrap().to_owned();
    assert!(
        fetched_at.parse::<jiff::Timestamp>().is_ok(),
        "RFC 3339: {fetched_at}"
    );

    for _ in 0..3 {
        let again = data(app, &tenant, &hourly, "").await;
        assert_eq!(again["cached"], true);
        assert_eq!(again["data"], json!({ "open_orders": 1 }));
        assert_eq!(again["fetched_at"], fetched_at);
        assert!(
            again["age_s"].as_i64().is_some_and(|age| age >= 0),
            "{again}"
        );
    }
    assert_eq!(service.calls(), 1, "a fresh cache calls nothing");

    let refreshed = data(app, &tenant, &hourly, "?refresh=true").await;
    assert_eq!(refreshed["cached"], false);
    assert_eq!(refreshed["data"], json!({ "open_orders": 2 }));
    assert_eq!(service.calls(), 2, "a refresh calls once");
    let after = data(app, &tenant, &hourly, "?refresh=false").await;
    assert_eq!(
        (after["cached"].clone(), after["data"].clone()),
        (json!(true), json!({ "open_orders": 2 }))
    );
    assert_eq!(service.calls(), 2);

    let brief = widget(app, &tenant, "Open orders, brief", 1).await;
    assert_eq!(data(app, &tenant, &brief, "").await["cached"], false);
    assert_eq!(service.calls(), 3);
    // Well past its one second of life.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let expired = data(app, &tenant, &brief, "").await;
    assert_eq!(expired["cached"], false);
    assert_eq!(expired["data"], json!({ "open_orders": 4 }));
    assert_eq!(service.calls(), 4, "an expired cache calls once");
    assert_eq!(data(app, &tenant, &brief, "").await["cached"], true);
    assert_eq!(service.calls(), 4);

    let list = app
        .get(&tenant.key, "/api/widgets")
        .await
        .expect(StatusCode::OK);
    let items = list["items"].as_array().unwrap();
    let names: Vec<&str> = items.iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Open orders", "Open orders, brief"]);
    assert!(items.iter().all(|w| w["fetched_at"].is_string()), "{list}");
    assert!(!list.to_string().contains(SECRET));
    assert_eq!(service.calls(), 4, "listing widgets calls nothing");
}

async fn a_failed_refresh_serves_the_cached_answer_with_its_error(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = tenant_with_connection(app, addr).await;
    let id = widget(app, &tenant, "Open orders", 3600).await;
    let first = data(app, &tenant, &id, "").await;

    service.failing.store(true, Ordering::SeqCst);
    let failed = data(app, &tenant, &id, "?refresh=true").await;
    assert_eq!(failed["cached"], true);
    assert_eq!(
        failed["data"], first["data"],
        "the last answer stays on the tile"
    );
    assert_eq!(failed["fetched_at"], first["fetched_at"]);
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("500"),
        "the error says what the service answered: {error}"
    );

    let never = widget(app, &tenant, "Never answered", 3600).await;
    let error = app
        .get(&tenant.key, &format!("/api/widgets/{never}/data"))
        .await
        .expect_error(StatusCode::BAD_GATEWAY, "widget_fetch_failed");
    assert!(
        error["message"].as_str().unwrap().contains("/orders/open"),
        "{error}"
    );
}

async fn the_connections_rate_limit_holds_a_refresh_back(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = app.create_tenant("Acme").await;
    // One call now, then one per thousand seconds.
    app.post(
        &tenant.key,
        "/api/connections",
        &json!({ "name": "stats", "service": "http", "base_url": format!("http://{addr}"),
                 "rate": 0.001, "burst": 1 }),
    )
    .await
    .expect(StatusCode::CREATED);
    let id = widget(app, &tenant, "Open orders", 3600).await;
    let first = data(app, &tenant, &id, "").await;
    assert_eq!(first["cached"], false);

    let held = data(app, &tenant, &id, "?refresh=true").await;
    assert_eq!(held["cached"], true, "{held}");
    assert_eq!(held["data"], first["data"]);
    let error = held["error"].as_str().unwrap();
    assert!(
        error.contains("connection `stats`") && error.contains("rate limit"),
        "{error}"
    );

    let never = widget(app, &tenant, "Backlog", 3600).await;
    let error = app
        .get(&tenant.key, &format!("/api/widgets/{never}/data"))
        .await
        .expect_error(StatusCode::SERVICE_UNAVAILABLE, "widget_unavailable");
    assert!(
        error["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0),
        "{error}"
    );
    assert_eq!(service.calls(), 1, "the limit held both calls back");
}

async fn bad_widgets_are_refused_with_what_was_expected(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = tenant_with_connection(app, addr).await;
    let good = json!({ "name": "w", "connection": "stats", "request": { "url": "/orders/open" }, "ttlSec": 60 });
    let with = |field: &str, value: Value| {
        let mut body = good.clone();
        body[field] = value;
        body
    };
    let cases = [
        (
            with("connection", json!("nope")),
            "`nope` is not a connection of this tenant",
        ),
        (with("ttlSec", json!(0)), "between 1 and 604800"),
        (with("request", json!("GET /x")), "must be an object"),
        (
            with("request", json!({ "url": "/x/{{id}}" })),
            "sent as written",
        ),
        (
            with("request", json!({ "method": "NOT A METHOD", "url": "/x" })),
            "its `method` is GET (or left out), not `NOT A METHOD`",
        ),
        (
            with("request", json!({ "url": "/x", "connection": "stats" })),
            "widget's `connection`",
        ),
        (
            with("name", json!(" ")),
            "`name` must be 1 to 200 characters",
        ),
        (
            json!({ "name": "w", "request": { "url": "/relative" }, "ttlSec": 60 }),
            "must start with http:// or https://",
        ),
    ];
    for (body, expected) in cases {
        let error = app
            .post(&tenant.key, "/api/widgets", &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    app.post(&tenant.key, "/api/widgets", &good)
        .await
        .expect(StatusCode::CREATED);
    app.post(&tenant.key, "/api/widgets", &good)
        .await
        .expect_error(StatusCode::CONFLICT, "conflict");
    let id = app
        .get(&tenant.key, "/api/widgets")
        .await
        .expect(StatusCode::OK)["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    app.get(
        &tenant.key,
        &format!("/api/widgets/{id}/data?refresh=maybe"),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "bad_query");
    assert_eq!(
        service.calls(),
        0,
        "nothing was called for a refused request"
    );
}

async fn another_tenants_widgets_are_invisible(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let acme = tenant_with_connection(app, addr).await;
    let id = widget(app, &acme, "Open orders", 3600).await;
    data(app, &acme, &id, "").await;
    let other = app.create_tenant("Other").await;
    for uri in [
        format!("/api/widgets/{id}"),
        format!("/api/widgets/{id}/data"),
        format!("/api/widgets/{id}/data?refresh=true"),
    ] {
        app.get(&other.key, &uri)
            .await
            .expect_error(StatusCode::NOT_FOUND, "not_found");
    }
    let list = app
        .get(&other.key, "/api/widgets")
        .await
        .expect(StatusCode::OK);
    assert!(list["items"].as_array().unwrap().is_empty());
    // The other tenant cannot point a widget at Acme's connection either.
    app.post(
        &other.key,
        "/api/widgets",
        &json!({ "name": "w", "connection": "stats", "request": { "url": "/orders/open" }, "ttlSec": 60 }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert_eq!(service.calls(), 1);
}

async fn a_new_request_drops_the_cache_and_a_new_ttl_keeps_it(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = tenant_with_connection(app, addr).await;
    let id = widget(app, &tenant, "Open orders", 3600).await;
    let uri = format!("/api/widgets/{id}");
    assert_eq!(
        data(app, &tenant, &id, "").await["data"],
        json!({ "open_orders": 1 })
    );

    let changed = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "name": "Open orders", "ttlSec": 600 }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(changed["ttl_sec"], 600);
    assert!(changed["fetched_at"].is_string(), "{changed:#}: kept");
    let cached = data(app, &tenant, &id, "").await;
    assert_eq!(
        (cached["cached"].clone(), cached["data"].clone()),
        (json!(true), json!({ "open_orders": 1 }))
    );
    assert_eq!(service.calls(), 1, "a new time to live calls nothing");

    let changed = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "request": { "url": "/orders/open?state=late" } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        changed["request"],
        json!({ "url": "/orders/open?state=late" })
    );
    assert_eq!(
        (changed["connection"].clone(), changed["ttl_sec"].clone()),
        (json!("stats"), json!(600)),
        "what the change does not name stays"
    );
    assert_eq!(changed["fetched_at"], Value::Null, "{changed:#}");
    let fresh = data(app, &tenant, &id, "").await;
    assert_eq!(
        (fresh["cached"].clone(), fresh["data"].clone()),
        (json!(false), json!({ "open_orders": 2 }))
    );
    assert_eq!(service.calls(), 2, "the new request is called once");
    assert_eq!(
        app.get(&tenant.key, &uri).await.expect(StatusCode::OK)["request"],
        json!({ "url": "/orders/open?state=late" })
    );

    // Without its connection, the request calls its absolute URL directly.
    let direct = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "connection": null, "request": { "url": format!("http://{addr}/orders/open") } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(direct["connection"], Value::Null);
    let fresh = data(app, &tenant, &id, "").await;
    assert_eq!(fresh["cached"], false);
    assert_eq!(service.calls(), 3);
    assert_eq!(
        service.authorized.load(Ordering::SeqCst),
        2,
        "no credentials without the connection"
    );
}

async fn bad_widget_changes_are_refused_and_a_deleted_widget_is_gone(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = tenant_with_connection(app, addr).await;
    let other = app.create_tenant("Other").await;
    let id = widget(app, &tenant, "Open orders", 3600).await;
    let uri = format!("/api/widgets/{id}");
    let before = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
    let cases = [
        (json!({ "name": "Backlog" }), "`name` cannot change"),
        (
            json!({ "connection": "nope" }),
            "`nope` is not a connection of this tenant",
        ),
        (json!({ "ttlSec": 0 }), "between 1 and 604800"),
        (
            json!({ "request": { "url": "/x/{{id}}" } }),
            "sent as written",
        ),
        (
            json!({ "connection": null }),
            "must start with http:// or https://",
        ),
        (json!({ "colour": "red" }), "unknown field `colour`"),
    ];
    for (body, expected) in cases {
        let error = app
            .patch(&tenant.key, &uri, &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    assert_eq!(
        app.get(&tenant.key, &uri).await.expect(StatusCode::OK),
        before
    );

    for reply in [
        app.patch(&other.key, &uri, &json!({ "ttlSec": 5 })).await,
        app.delete(&other.key, &uri).await,
    ] {
        reply.expect_error(StatusCode::NOT_FOUND, "not_found");
    }
    app.delete(&tenant.key, &uri)
        .await
        .expect(StatusCode::NO_CONTENT);
    app.get(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.get(&tenant.key, &format!("{uri}/data"))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.delete(&tenant.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    assert_eq!(service.calls(), 0, "nothing was called");
}

async fn an_answer_to_the_request_before_a_change_is_not_kept(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = tenant_with_connection(app, addr).await;
    let created = app
        .post(
            &tenant.key,
            "/api/widgets",
            &json!({ "name": "Slow", "connection": "stats",
                     "request": { "url": "/orders/slow" }, "ttlSec": 3600 }),
        )
        .await
        .expect(StatusCode::CREATED);
    let id = created["id"].as_str().unwrap().to_owned();
    // The request changes while the call to the old one is out.
    let change = async {
        service.reached.notified().await;
        app.patch(
            &tenant.key,
            &format!("/api/widgets/{id}"),
            &json!({ "request": { "url": "/orders/open" } }),
        )
        .await
        .expect(StatusCode::OK);
        service.let_go.notify_one();
    };
    let (old, ()) = tokio::join!(data(app, &tenant, &id, "?refresh=true"), change);
    assert_eq!(old["data"], json!({ "slow": true }), "{old:#}");
    let new = data(app, &tenant, &id, "").await;
    assert_eq!(
        (new["cached"].clone(), new["data"].clone()),
        (json!(false), json!({ "open_orders": 2 })),
        "the old request's answer was not kept as the new one's"
    );
}

/// A key of the tenant's with the `read` scope only.
async fn read_key(app: &TestApp, tenant: &Tenant) -> String {
    app.post(
        &tenant.key,
        "/api/keys",
        &json!({ "name": "wall screen", "scopes": ["read"] }),
    )
    .await
    .expect(StatusCode::CREATED)["key"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn a_widget_only_reads_even_one_saved_before_widgets_were_reads(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = tenant_with_connection(app, addr).await;
    for (request, field) in [
        (
            json!({ "url": "/orders/open", "method": "DELETE" }),
            "request.method",
        ),
        (
            json!({ "url": "/orders/open", "method": "post" }),
            "request.method",
        ),
        (
            json!({ "url": "/orders/open", "method": "TRACE" }),
            "request.method",
        ),
        (
            json!({ "url": "/orders/open", "headers": { "X-HTTP-Method-Override": "DELETE" } }),
            "request.headers.X-HTTP-Method-Override",
        ),
        (
            json!({ "url": "/orders/open", "headers": { "Host": "other.example" } }),
            "request",
        ),
    ] {
        let refused = app
            .post(
                &tenant.key,
                "/api/widgets",
                &json!({ "name": "Wipe", "connection": "stats", "request": request, "ttlSec": 60 }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert_eq!(refused["field"], field, "{refused:#}");
    }
    let id = widget(app, &tenant, "Open orders", 3600).await;
    let refused = app
        .patch(
            &tenant.key,
            &format!("/api/widgets/{id}"),
            &json!({ "request": { "url": "/orders/open", "method": "DELETE" } }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert_eq!(refused["field"], "request.method");
    let get = app
        .post(
            &tenant.key,
            "/api/widgets",
            &json!({ "name": "Explicit", "connection": "stats",
                     "request": { "url": "/orders/open", "method": "get" }, "ttlSec": 60 }),
        )
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(get["request"]["method"], "get");

    // A widget saved by an older tok with `DELETE`: a read key's refresh
    // sends nothing.
    let tenant_id = tok_core::ids::TenantId::from(tenant.id.clone());
    app.state
        .engine
        .store()
        .update_widget(
            &tenant_id,
            &id,
            tok_store::WidgetPatch {
                request: Some(json!({ "url": "/orders/open", "method": "DELETE" })),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    let reader = read_key(app, &tenant).await;
    let before = service.calls();
    for query in ["", "?refresh=true"] {
        let error = app
            .get(&reader, &format!("/api/widgets/{id}/data{query}"))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "widget_not_a_read");
        assert!(
            error["message"].as_str().unwrap().contains("`DELETE`"),
            "{error}"
        );
    }
    assert_eq!(service.calls(), before, "no DELETE went out");
}

async fn refreshes_are_limited_per_widget_and_the_cache_still_answers(app: &TestApp) {
    let service = Arc::new(Service::default());
    let addr = serve(app, service.clone()).await;
    let tenant = tenant_with_connection(app, addr).await;
    let reader = read_key(app, &tenant).await;
    let id = widget(app, &tenant, "Open orders", 3600).await;
    let other = widget(app, &tenant, "Open orders again", 3600).await;
    for n in 1..=3 {
        let fresh = app
            .get(&reader, &format!("/api/widgets/{id}/data?refresh=true"))
            .await
            .expect(StatusCode::OK);
        assert_eq!(fresh["cached"], false, "refresh {n}");
    }
    assert_eq!(service.calls(), 3);
    let limited = app
        .get(&reader, &format!("/api/widgets/{id}/data?refresh=true"))
        .await;
    let retry_after = limited.headers.get("retry-after").cloned();
    let error = limited.expect_error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    assert!(
        retry_after.is_some_and(|s| s.to_str().unwrap().parse::<u64>().unwrap() >= 1),
        "{error}"
    );
    assert!(
        error["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0),
        "{error}"
    );
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("once every 10 seconds"), "{message}");
    // The tenant's own admin key is held back the same: the limit is the
    // widget's.
    app.get(&tenant.key, &format!("/api/widgets/{id}/data?refresh=true"))
        .await
        .expect_error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    assert_eq!(service.calls(), 3, "no call past the limit");
    // The cache still answers, and another widget has its own refreshes.
    let cached = data(app, &tenant, &id, "").await;
    assert_eq!(cached["cached"], true);
    assert_eq!(cached["data"], json!({ "open_orders": 3 }));
    let fresh = data(app, &tenant, &other, "?refresh=true").await;
    assert_eq!(fresh["cached"], false);
    // A widget that does not exist is 404, not limited.
    app.get(&reader, "/api/widgets/wid_nope/data?refresh=true")
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}
