//! The dashboard in a real headless Chromium, against a real `tok serve`:
//! an operator signs in, a webhook's run appears and completes without a
//! reload, a failed run shows what its condition compared and its error and
//! runs again on Retry, the webhook's full URL is copied, and one tenant's
//! session shows nothing of another's; the queue page charts the samples
//! the scheduler kept before it opened, and keeps adding points; the
//! "Try a body" box shows which automation a webhook would start.
//!
//! `TOK_DASHBOARD_SCREENSHOTS=<dir>` also saves the pages as PNG files
//! (the pictures in docs/dashboard.md are made so).

mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::StatusCode;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};
use webdriver::Browser;

/// An invoicing service that refuses the first invoice (422: terminal, the
/// run fails) and takes every one after it.
async fn invoicing_stub() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let app = axum::Router::new().route(
        "/invoices",
        axum::routing::post(move || {
            let counter = counter.clone();
            async move {
                match counter.fetch_add(1, Ordering::SeqCst) {
                    0 => (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        axum::Json(json!({ "error": "invoice period is locked" })),
                    ),
                    _ => (
                        StatusCode::CREATED,
                        axum::Json(json!({ "invoice": "INV-1" })),
                    ),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/invoices", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, calls)
}

/// A tenant with two webhook automations: "New order" (completes) and
/// "Invoice" (a condition, then a call to `invoicing`).
struct Shop {
    key: String,
    order_url: String,
    invoice_url: String,
    order_automation: String,
}

async fn shop(api: &Api, name: &str, invoicing: &str) -> Shop {
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": name }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let order_id =
        json!({ "name": "orderId", "path": "order.id", "type": "string", "required": true });
    let total =
        json!({ "name": "total", "path": "order.total", "type": "number", "required": false });
    let orders = api
        .post(
            "/api/sources",
            &key,
            json!({ "name": "eshop", "params": [order_id] }),
        )
        .await;
    let invoices = api
        .post(
            "/api/sources",
            &key,
            json!({ "name": "billing", "params": [order_id, total] }),
        )
        .await;
    let order_automation = api
        .post(
            "/api/automations",
            &key,
            json!({
                "name": format!("{name}: new order"),
                "trigger": { "kind": "webhook", "source": orders["id"] },
                "flow": { "priority": 10, "startTimeout": "1h" },
                "steps": [
                    { "id": "st_mark", "type": "set", "config": { "values": { "order": "{{orderId}}" } } },
                    { "id": "st_pause", "type": "flow/pause", "config": { "seconds": 0.3 } },
                    { "id": "st_done", "type": "flow/log", "config": { "message": "order {{order}} taken" } }
                ]
            }),
        )
        .await;
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": format!("{name}: invoice"),
            "trigger": { "kind": "webhook", "source": invoices["id"] },
            "steps": [
                { "id": "st_big", "type": "condition", "match": "all",
                  "rules": [{ "field": "total", "operator": "gt", "value": 100 }],
                  "then": [
                    { "id": "st_invoice", "type": "http",
                      "config": { "method": "POST", "url": invoicing, "body": { "order": "{{orderId}}" } } }
                  ],
                  "else": [] }
            ]
        }),
    )
    .await;
    Shop {
        key,
        order_url: orders["url"].as_str().unwrap().to_owned(),
        invoice_url: invoices["url"].as_str().unwrap().to_owned(),
        order_automation: order_automation["id"].as_str().unwrap().to_owned(),
    }
}

/// Sends a webhook as the shop's system would; returns the event id.
async fn send(api: &Api, url: &str, body: Value) -> String {
    let response = api.http.post(url).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 202, "{url}");
    let body: Value = response.json().await.unwrap();
    body["event_id"].as_str().unwrap().to_owned()
}

async fn run_of(api: &Api, key: &str, event: &str) -> String {
    for _ in 0..600 {
        let runs = api.get("/api/dashboard/runs", key).await;
        let found = runs["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["event_id"] == event);
        if let Some(run) = found {
            return run["id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("event {event} started no run");
}

/// Saves the window as `<dir>/<name>.png` when screenshots are asked for.
async fn picture(browser: &Browser, name: &str) {
    if let Ok(dir) = std::env::var("TOK_DASHBOARD_SCREENSHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(format!("{dir}/{name}.png"), browser.screenshot().await).unwrap();
    }
}

const ROW_STATUS: &str = "const row = document.querySelector(`tr[data-run=\"${arguments[0]}\"]`); \
     return row ? row.dataset.status : null";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_runs_live_opens_a_failed_one_and_retries_it() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let (invoicing, calls) = invoicing_stub().await;
        let _server = Server::start(
            &db.url,
            port,
            &[],
            &[("TOK_OUTBOUND_ALLOW", &support::allow(&invoicing))],
        );
        api.wait_ready().await;
        let shop = shop(&api, "Acme", &invoicing).await;
        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, &shop.key).await;
        browser.find("#runs, .empty").await;
        // A mark on the page: a reload would wipe it.
        browser.eval("window.notReloaded = true", json!([])).await;

        // A webhook arrives; its run shows up and completes, live.
        let event = send(&api, &shop.order_url, json!({ "order": { "id": "5001" } })).await;
        let run = run_of(&api, &shop.key, &event).await;
        browser
            .wait_for(
                "the order's run completed",
                &format!("{ROW_STATUS} === 'completed'"),
                json!([run]),
            )
            .await;
        for n in 2..=4 {
            send(&api, &shop.order_url, json!({ "order": { "id": format!("500{n}") } })).await;
        }

        // An invoice fails at the invoicing service.
        let event = send(
            &api,
            &shop.invoice_url,
            json!({ "order": { "id": "5001", "total": 250 } }),
        )
        .await;
        let failed = run_of(&api, &shop.key, &event).await;
        browser
            .wait_for("the invoice's run failed", &format!("{ROW_STATUS} === 'failed'"), json!([failed]))
            .await;
        assert_eq!(browser.eval("return window.notReloaded === true", json!([])).await, true);
        picture(&browser, "runs").await;

        // Its detail: what the condition compared, and the error.
        browser.click(&format!("tr[data-run=\"{failed}\"]")).await;
        assert_eq!(browser.text("#run-status").await, "failed");
        let lines = browser
            .wait_for(
                "the condition's log line",
                "return [...document.querySelectorAll('.log-line')].map(l => l.textContent).join('\\n')",
                json!([]),
            )
            .await;
        assert!(
            lines
                .as_str()
                .unwrap()
                .contains("Condition: total gt 100 | total = 250, compared with 100"),
            "{lines}"
        );
        let error = browser.text("#run-error").await;
        assert!(error.contains("422") && error.contains("invoice period is locked"), "{error}");
        picture(&browser, "run-failed").await;

        // Retry: it runs again, and completes.
        browser.click("#run-retry").await;
        browser
            .wait_for(
                "the retried run completed",
                "const s = document.querySelector('#run-status'); return s && s.textContent === 'completed'",
                json!([]),
            )
            .await;
        let attempts = browser
            .eval(
                "return [...document.querySelectorAll('.attempt[data-path=\"0.then.0\"]')].map(a => a.dataset.status)",
                json!([]),
            )
            .await;
        assert_eq!(attempts, json!(["failed", "completed"]));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the service was called again");
        assert_eq!(browser.eval("return window.notReloaded === true", json!([])).await, true);
        picture(&browser, "run-retried").await;

        // The automation's page: the full webhook URL, copied by its button.
        browser
            .open(&format!("{base}/#/automations/{}", shop.order_automation))
            .await;
        let shown = browser
            .wait_for(
                "the webhook URL",
                "const i = document.querySelector('#webhook-url'); return i && i.value",
                json!([]),
            )
            .await;
        assert_eq!(shown, json!(shop.order_url));
        let starts = browser
            .eval("return document.querySelector('#flow-control').textContent", json!([]))
            .await;
        assert_eq!(starts, json!("priority 10 · expires if not started within 1h"), "how its runs start");
        assert!(shop.order_url.starts_with(&format!("http://localhost:{port}/webhook/")));
        picture(&browser, "automation").await;
        browser
            .wait_for(
                "the webhook's GET help",
                "return document.querySelector('#webhook-help').textContent.includes('orderId')",
                json!([]),
            )
            .await;
        browser.click("#copy-url").await;
        browser
            .wait_for("`Copied`", "return document.querySelector('#copy-url').textContent === 'Copied'", json!([]))
            .await;
        browser
            .eval(
                "const i = document.createElement('input'); i.id = 'paste-here'; document.body.append(i); i.focus()",
                json!([]),
            )
            .await;
        browser.chord("v").await;
        let pasted = browser
            .wait_for("the pasted URL", "return document.querySelector('#paste-here').value", json!([]))
            .await;
        assert_eq!(pasted, json!(shop.order_url), "the clipboard holds the full URL");

        // Rotate the URL: the new one takes webhooks, the old one no more.
        browser.click("#rotate-url").await;
        let rotated = browser
            .wait_for(
                "the new webhook URL",
                "const i = document.querySelector('#webhook-url'); return i.value !== arguments[0] && i.value",
                json!([shop.order_url]),
            )
            .await;
        let rotated = rotated.as_str().unwrap().to_owned();
        let old = api
            .http
            .post(&shop.order_url)
            .json(&json!({ "order": { "id": "old" } }))
            .send()
            .await
            .unwrap();
        assert_eq!(old.status(), 404, "the old URL is closed");
        send(&api, &rotated, json!({ "order": { "id": "A-9" } })).await;

        // Delete it: the first click asks, the second deletes; it leaves the list.
        browser.click("#automation-delete").await;
        browser
            .wait_for(
                "the delete to ask",
                "return document.querySelector('#automation-delete').textContent.includes('again')",
                json!([]),
            )
            .await;
        browser.click("#automation-delete").await;
        browser.find("#automations").await;
        let listed = api.get("/api/automations", &shop.key).await;
        let ids: Vec<&str> = listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap())
            .collect();
        assert!(!ids.contains(&shop.order_automation.as_str()), "{listed:#}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_session_shows_nothing_of_another_tenant() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let _server = Server::start(&db.url, port, &[], &[]);
        api.wait_ready().await;
        let (invoicing, _) = invoicing_stub().await;
        let acme = shop(&api, "Acme", &invoicing).await;
        let globex = shop(&api, "Globex", &invoicing).await;
        let event = send(&api, &acme.order_url, json!({ "order": { "id": "A-1" } })).await;
        let acme_run = run_of(&api, &acme.key, &event).await;

        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, &globex.key).await;
        assert_eq!(browser.text("#who strong").await, "Globex");
        browser.find(".empty").await;
        // Acme's run comes and goes while Globex looks at its runs.
        let event = send(&api, &acme.order_url, json!({ "order": { "id": "A-2" } })).await;
        let second = run_of(&api, &acme.key, &event).await;
        let event = send(&api, &globex.order_url, json!({ "order": { "id": "G-1" } })).await;
        let globex_run = run_of(&api, &globex.key, &event).await;
        browser
            .wait_for(
                "Globex's own run",
                &format!("{ROW_STATUS} === 'completed'"),
                json!([globex_run]),
            )
            .await;
        let text = browser
            .eval("return document.body.innerText", json!([]))
            .await;
        let text = text.as_str().unwrap();
        assert!(!text.contains("Acme"), "{text}");
        let rows = browser
            .eval(
                "return [...document.querySelectorAll('tr[data-run]')].map(r => r.dataset.run)",
                json!([]),
            )
            .await;
        assert_eq!(rows, json!([globex_run]));
        let tail = |id: &str| id[id.len() - 8..].to_owned();
        assert!(!text.contains(&tail(&acme_run)) && !text.contains(&tail(&second)));

        // Acme's run by its id: not found, and nothing of it shown.
        browser.open(&format!("{base}/#/runs/{acme_run}")).await;
        // The flash is shown once the run's 404 arrives (it may be empty
        // before).
        let flash = browser
            .wait_for(
                "the flash saying the run is not found",
                "const f = document.querySelector('#flash'); \
                 return f && f.textContent.includes('not found') && f.textContent",
                json!([]),
            )
            .await;
        assert!(
            flash.as_str().unwrap_or_default().contains("not found"),
            "{flash}"
        );
        browser.open(&format!("{base}/#/automations")).await;
        browser.find("#automations").await;
        let text = browser
            .eval("return document.body.innerText", json!([]))
            .await;
        assert!(!text.as_str().unwrap().contains("Acme"), "{text}");

        // The admin picks a tenant and sees that tenant's runs.
        browser.click("#signout").await;
        sign_in_admin(&browser, &base).await;
        browser
            .eval(
                "const p = document.querySelector('#tenant-pick'); \
                 p.value = [...p.options].find(o => o.textContent === 'Acme').value; \
                 p.dispatchEvent(new Event('change'))",
                json!([]),
            )
            .await;
        browser
            .wait_for(
                "Acme's run for the admin",
                &format!("{ROW_STATUS} === 'completed'"),
                json!([acme_run]),
            )
            .await;
        let rows = browser
            .eval(
                "return document.querySelectorAll(`tr[data-run=\"${arguments[0]}\"]`).length",
                json!([globex_run]),
            )
            .await;
        assert_eq!(rows, 0);
    })
    .await;
}

/// The automation page's "Try a body" box: the body typed is sent to the
/// webhook as a dry run with the operator's key (the source is signed by
/// GitHub; the box sends no signature, and says it was not checked), and
/// the page shows which automation would start and what its filter
/// compared. Nothing is stored: the tenant has no event and no run after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_try_a_body_box_shows_what_a_webhook_would_start() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let _server = Server::start(&db.url, port, &[], &[]);
        api.wait_ready().await;
        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
            .await;
        let key = tenant["api_key"].as_str().unwrap().to_owned();
        let source = api
            .post(
                "/api/sources",
                &key,
                json!({ "name": "repository", "params": [
                    { "name": "ref", "path": "ref", "type": "string", "required": true }
                ], "verify": { "preset": "github", "secret": "a GitHub hook's secret" } }),
            )
            .await;
        let source_id = source["id"].as_str().unwrap();
        let on_main = |name: &str, branch: &str| {
            json!({
                "name": name,
                "trigger": { "kind": "webhook", "source": source_id, "filter": {
                    "match": "all",
                    "rules": [{ "field": "ref", "operator": "eq", "value": branch }]
                } },
                "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "pushed" } }]
            })
        };
        let deploy = api.post("/api/automations", &key, on_main("Deploy", "refs/heads/main")).await;
        let preview = api
            .post("/api/automations", &key, on_main("Preview", "refs/heads/preview"))
            .await;
        let (deploy, preview) = (
            deploy["id"].as_str().unwrap().to_owned(),
            preview["id"].as_str().unwrap().to_owned(),
        );

        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, &key).await;
        browser.open(&format!("{base}/#/automations/{deploy}")).await;
        browser
            .wait_for(
                "the box filled with the help's example",
                "const b = document.querySelector('#try-body'); return b && b.value.includes('ref')",
                json!([]),
            )
            .await;
        assert!(browser.text("#webhook-sender").await.contains("github"));
        browser
            .eval(
                "document.querySelector('#try-body').value = arguments[0]",
                json!([r#"{"ref": "refs/heads/main", "after": "a1b2c3"}"#]),
            )
            .await;
        browser.click("#try-send").await;
        let summary = browser
            .wait_for(
                "the dry run's answer",
                "const s = document.querySelector('#try-summary'); return s && s.textContent",
                json!([]),
            )
            .await;
        let summary = summary.as_str().unwrap();
        assert!(summary.starts_with("1 automation would start."), "{summary}");
        assert!(summary.contains("github signature was not checked"), "{summary}");
        let starts = |id: &str| {
            format!("return document.querySelector('li[data-automation=\"{id}\"]').dataset.wouldStart")
        };
        assert_eq!(browser.eval(&starts(&deploy), json!([])).await, json!("true"));
        assert_eq!(browser.eval(&starts(&preview), json!([])).await, json!("false"));
        let lines = browser
            .eval(
                "return document.querySelector(`li[data-automation=\"${arguments[0]}\"] pre`).textContent",
                json!([preview]),
            )
            .await;
        assert!(
            lines.as_str().unwrap().contains("ref = \"refs/heads/main\", compared with \"refs/heads/preview\""),
            "{lines}"
        );
        browser
            .eval("document.querySelector('#try-box').scrollIntoView()", json!([]))
            .await;
        picture(&browser, "try-a-body").await;

        // A body the source's contract refuses: the 400 is shown as it is.
        browser
            .eval(
                "document.querySelector('#try-body').value = '{\"after\": \"a1b2c3\"}'",
                json!([]),
            )
            .await;
        browser.click("#try-send").await;
        let error = browser
            .wait_for(
                "the refusal",
                "const e = document.querySelector('#try-error'); return e && e.textContent",
                json!([]),
            )
            .await;
        assert!(error.as_str().unwrap().starts_with("400: required param `ref`"), "{error}");

        // Nothing was stored.
        let queue = api.get("/api/dashboard/queue", &key).await;
        assert_eq!(queue["pending_events"], 0, "{queue}");
        let runs = api.get("/api/runs", &key).await;
        assert_eq!(runs["items"], json!([]), "{runs}");
    })
    .await;
}

/// The admin signs in; the tenant is picked afterwards.
async fn sign_in_admin(browser: &Browser, base: &str) {
    browser.open(&format!("{base}/")).await;
    browser.find("#signin-key").await.type_text(ADMIN_KEY).await;
    browser.click("#signin-submit").await;
    browser
        .wait_for(
            "the tenant picker",
            "const p = document.querySelector('#tenant-pick'); return p && !p.hidden && p.options.length > 2",
            json!([]),
        )
        .await;
}

/// The demo tenant of `tok serve --demo` after the service-desk scenario
/// (two orders, one converter error): the tickets page shows each group's
/// people with their open tickets, a ticket's trace, the incident without
/// its detail for the tenant and with it for the admin, the queue's tiles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_desk_pages_show_queues_traces_incidents_and_the_queue() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let server = Server::start(&db.url, port, &["--demo"], &[]);
        let printed = support::exports(&server.lines_until_listening());
        api.wait_ready().await;
        let (key, tenant) = (&printed["DEMO_KEY"], &printed["DEMO_TENANT"]);
        let orders = &printed["ESHOP_WEBHOOK"];
        for id in ["5001", "5002"] {
            send(&api, orders, json!({"kind": "order.created", "data": {"order": {"id": id}}})).await;
        }
        send(
            &api,
            &printed["CONVERTER_WEBHOOK"],
            json!({"document": {"id": "D-99"}, "errors": [{"code": "OCR_FAIL", "message": "Amount unreadable"}]}),
        )
        .await;

        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, key).await;
        browser.find("#runs").await;
        picture(&browser, "runs-demo").await;

        browser.open(&format!("{base}/#/tickets")).await;
        // Live: the tickets are routed while the page is open.
        let assigned = browser
            .wait_for(
                "three assigned tickets",
                "const cells = [...document.querySelectorAll('#tickets tbody tr td:nth-child(6)')]; \
                 const names = cells.map(c => c.textContent).filter(n => n !== 'unassigned'); \
                 return names.length === 3 ? names : null",
                json!([]),
            )
            .await;
        let queues = browser
            .eval(
                "return [...document.querySelectorAll('.queue-person')].map(p => p.textContent)",
                json!([]),
            )
            .await;
        for name in assigned.as_array().unwrap() {
            let name = name.as_str().unwrap();
            assert!(
                queues.as_array().unwrap().iter().any(|q| {
                    let q = q.as_str().unwrap();
                    q.starts_with(name) && q.contains("1 / ")
                }),
                "{name} has one open ticket in the queues: {queues}"
            );
        }
        picture(&browser, "tickets").await;
        browser.click("#tickets tbody tr").await;
        let trace = browser.text("#ticket-trace").await;
        assert!(trace.contains("Created by automation"), "{trace}");

        browser.open(&format!("{base}/#/incidents")).await;
        let incident = browser.text("#incidents").await;
        assert!(incident.contains("Document D-99 could not be converted"), "{incident}");
        assert!(!incident.contains("Detail (platform admin)"), "{incident}");
        browser.open(&format!("{base}/#/queue")).await;
        let tiles = browser.text("#queue-tiles").await;
        assert!(tiles.contains("Ready jobs") && tiles.contains("Oldest ready job"), "{tiles}");

        // The admin, acting for the demo tenant, sees the incident's detail.
        browser.click("#signout").await;
        browser.sign_in(&base, ADMIN_KEY).await;
        assert_eq!(
            browser.eval("return document.querySelector('#tenant-pick').value", json!([])).await,
            json!(tenant),
            "the one tenant is picked"
        );
        browser.open(&format!("{base}/#/incidents")).await;
        browser.click("#incidents details").await;
        let detail = browser.text("#incidents").await;
        assert!(detail.contains("Detail (platform admin)") && detail.contains("OCR_FAIL"), "{detail}");
        picture(&browser, "incidents-admin").await;
    })
    .await;
}

/// The last hour of one tenant's queue as the scheduler would have kept
/// it, a sample every 30 s from 58 to 1.5 minutes ago, with a burst of work
/// half an hour ago: raw rows, as the API cannot write the past.
async fn past_hour_of_samples(db: &TestDb, tenant: &str) -> usize {
    use sqlx::Connection as _;
    let now = tok_store::now_ms();
    let rows: Vec<String> = (0..114)
        .map(|i| {
            let at = now - 90_000 - (113 - i) * 30_000;
            let minutes_ago = (now - at) as f64 / 60_000.0;
            let burst = (-((minutes_ago - 32.0) / 6.0).powi(2)).exp();
            let ready = (38.0 * burst).round() as i64;
            let running = (4.0 * burst.sqrt()).round() as i64;
            let oldest = if ready > 0 { format!("{}", (burst * 95_000.0) as i64) } else { "NULL".into() };
            let completed = 90 + (700.0 * burst.sqrt()) as i64 + (i * 37 % 40);
            let failed = if i % 17 == 5 || (burst > 0.5 && i % 3 == 0) { 1 + i % 4 } else { 0 };
            format!(
                "('{tenant}', {at}, {ready}, {}, {running}, {}, {oldest}, {completed}, {failed}, 30000)",
                i % 5 / 3,
                (6.0 * burst) as i64,
            )
        })
        .collect();
    let sql = format!(
        "INSERT INTO queue_samples (tenant_id, at, ready, scheduled, running, pending_events, \
         oldest_ready_ms, steps_completed, steps_failed, window_ms) VALUES {}",
        rows.join(", ")
    );
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::query(&sql).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    rows.len()
}

const READY_LINE: &str = "const p = document.querySelector('svg[data-chart=depth] path[data-series=ready]'); \
     return p ? [+p.dataset.points, p.getAttribute('d')] : null";

/// Queue health over the last hour: the samples kept before the page
/// opened are drawn (the first one at the chart's left edge), and points
/// keep coming while it is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_page_charts_the_samples_kept_before_it_opened() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let _server = Server::start(&db.url, port, &[], &[("TOK_QUEUE_SAMPLE_EVERY", "1s")]);
        api.wait_ready().await;
        let (invoicing, _) = invoicing_stub().await;
        let shop = shop(&api, "Acme", &invoicing).await;
        let session = api.get("/api/dashboard/session", &shop.key).await;
        let tenant = session["tenant"]["id"].as_str().unwrap().to_owned();
        let kept = past_hour_of_samples(db, &tenant).await;
        for n in 0..6 {
            send(&api, &shop.order_url, json!({ "order": { "id": format!("70{n}") } })).await;
        }

        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, &shop.key).await;
        browser.open(&format!("{base}/#/queue")).await;
        let drawn = browser
            .wait_for(
                "the depth chart with the kept samples",
                &format!("const r = (() => {{ {READY_LINE} }})(); return r && r[0] >= {kept} ? r : null"),
                json!([]),
            )
            .await;
        let points = drawn[0].as_u64().unwrap();
        // The first point is 58 minutes back: near the left edge of the
        // 600-wide chart, whose plot starts at x = 44 (62 when the page
        // draws at once).
        let d = drawn[1].as_str().unwrap();
        let first_x: f64 = d[1..d.find(',').unwrap()].parse().unwrap();
        assert!((44.0..80.0).contains(&first_x), "the first point at x = {first_x}: {d}");
        let charts = browser
            .eval(
                "return [...document.querySelectorAll('svg[data-chart]')].map(c => c.dataset.chart)",
                json!([]),
            )
            .await;
        assert_eq!(charts, json!(["depth", "oldest", "throughput", "failures"]));
        let throughput = browser
            .eval(
                "return +document.querySelector('svg[data-chart=throughput] path[data-series=steps_per_s]').dataset.points",
                json!([]),
            )
            .await;
        assert!(throughput.as_u64().unwrap() >= kept as u64, "{throughput}");

        // The server keeps sampling (every second here): the chart grows.
        browser
            .wait_for(
                "more points than at first",
                &format!("const r = (() => {{ {READY_LINE} }})(); return r && r[0] > {points}"),
                json!([]),
            )
            .await;
        let history = api.get("/api/dashboard/queue/history", &shop.key).await;
        assert!(
            history["samples"].as_array().unwrap().len() > kept,
            "the server's own samples: {history:#}"
        );
        picture(&browser, "queue-health").await;
    })
    .await;
}
