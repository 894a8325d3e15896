//! The dashboard's widget tiles in a real headless Chromium, against a real
//! `tok serve` and a local service that counts its calls: a tile shows the
//! service's answer and its age, opening the page again while the cache is
//! fresh calls nothing, and Refresh calls once and shows the new answer.
//!
//! `TOK_DASHBOARD_SCREENSHOTS=<dir>` also saves the page as `widgets.png`.

mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};
use webdriver::Browser;

/// A shop's statistics service: answers how many calls it has had.
async fn stats_stub() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let app = axum::Router::new()
        .route(
            "/orders/open",
            axum::routing::get(move || {
                let counter = counter.clone();
                async move {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    axum::Json(json!({ "open_orders": n * 10 }))
                }
            }),
        )
        .route(
            "/shipping",
            axum::routing::get(|| async {
                axum::Json(json!({ "waiting": 4, "late": 1, "carrier": "PPL" }))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, calls)
}

const TILE_VALUE: &str = "const t = document.querySelector(`[data-widget=\"${arguments[0]}\"]`); \
     const v = t && t.querySelector('.widget-body .value'); \
     return v && t.dataset.cached === arguments[2] && v.textContent === arguments[1]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_widget_tile_shows_its_cached_data_and_its_age_and_refresh_calls_once() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let (stats, calls) = stats_stub().await;
        let _server = Server::start(
            &db.url,
            port,
            &[],
            &[("TOK_OUTBOUND_ALLOW", &support::allow(&stats))],
        );
        api.wait_ready().await;
        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
            .await;
        let key = tenant["api_key"].as_str().unwrap().to_owned();
        api.post(
            "/api/connections",
            &key,
            json!({ "name": "stats", "service": "http", "base_url": stats }),
        )
        .await;
        let widget = api
            .post(
                "/api/widgets",
                &key,
                json!({ "name": "Open orders", "connection": "stats",
                        "request": { "url": "/orders/open" }, "ttlSec": 3600 }),
            )
            .await;
        let id = widget["id"].as_str().unwrap().to_owned();
        api.post(
            "/api/widgets",
            &key,
            json!({ "name": "Shipping", "connection": "stats",
                    "request": { "url": "/shipping" }, "ttlSec": 600 }),
        )
        .await;

        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.open(&format!("{base}/#/widgets")).await;
        browser.find("#signin-key").await.type_text(&key).await;
        browser.click("#signin-submit").await;
        browser
            .wait_for(
                "the first answer, fetched",
                TILE_VALUE,
                json!([id, "10", "false"]),
            )
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let meta = browser
            .text(&format!("[data-widget=\"{id}\"] .widget-meta"))
            .await;
        assert!(meta.contains("fetched just now"), "{meta}");

        // Opened again while the cache is fresh: the same answer, no call.
        browser.open(&format!("{base}/?again#/widgets")).await;
        browser
            .wait_for("the cached answer", TILE_VALUE, json!([id, "10", "true"]))
            .await;
        let meta = browser
            .text(&format!("[data-widget=\"{id}\"] .widget-meta"))
            .await;
        assert!(meta.contains("from the cache"), "{meta}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "a fresh cache calls nothing"
        );
        let fields = browser
            .wait_for(
                "the shipping tile's fields",
                "const f = [...document.querySelectorAll('.widget-fields dt, .widget-fields dd')]; \
                 return f.length === 6 && f.map(d => d.textContent).join(' ')",
                json!([]),
            )
            .await;
        assert_eq!(fields, json!("carrier PPL late 1 waiting 4"));
        if let Ok(dir) = std::env::var("TOK_DASHBOARD_SCREENSHOTS") {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(format!("{dir}/widgets.png"), browser.screenshot().await).unwrap();
        }

        // Refresh: one call, and its answer on the tile.
        browser
            .click(&format!("[data-widget=\"{id}\"] .widget-refresh"))
            .await;
        browser
            .wait_for(
                "the refreshed answer",
                TILE_VALUE,
                json!([id, "20", "false"]),
            )
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), 2, "Refresh calls once");
    })
    .await;
}
