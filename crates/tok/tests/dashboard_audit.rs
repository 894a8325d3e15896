//! The dashboard's audit log, in a real headless Chromium against a real
//! `tok serve`: a read-only key is not shown the Audit page; the tenant's
//! admin key makes a key on the Keys page and finds that change on the
//! Audit page, by its action filter too; the platform admin with no
//! tenant picked sees every tenant's changes.

mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use serde_json::json;
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};
use webdriver::Browser;

const AUDIT_LINK_SHOWN: &str = "return !document.querySelector('#nav-audit').hidden";

/// The rows on the Audit page: [action, summary] each.
const ROWS: &str = "return [...document.querySelectorAll('#audit tbody tr')]\
                    .map(r => [r.dataset.action, r.cells[r.cells.length - 1].textContent])";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_on_the_dashboard_shows_on_the_audit_page() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let _server = Server::start(&db.url, port, &[], &[]);
        api.wait_ready().await;
        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
            .await;
        let admin = tenant["api_key"].as_str().unwrap().to_owned();
        api.post("/api/tenants", ADMIN_KEY, json!({ "name": "Beta" }))
            .await;
        let reader = api
            .post(
                "/api/keys",
                &admin,
                json!({ "name": "wallboard", "scopes": ["read"] }),
            )
            .await["key"]
            .as_str()
            .unwrap()
            .to_owned();

        // A read key is not shown the audit log.
        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, &reader).await;
        assert_eq!(browser.eval(AUDIT_LINK_SHOWN, json!([])).await, false);

        // The tenant's admin key makes a key on the Keys page…
        browser.click("#signout").await;
        browser.sign_in(&base, &admin).await;
        assert_eq!(browser.eval(AUDIT_LINK_SHOWN, json!([])).await, true);
        browser.click("#nav-keys").await;
        browser.find("#keys").await;
        browser.find("#key-name").await.type_text("deploy").await;
        browser.click("#key-create").await;
        let secret = browser
            .wait_for(
                "the new key's secret",
                "const s = document.querySelector('#key-secret'); return s && s.value",
                json!([]),
            )
            .await;
        let secret = secret.as_str().unwrap().to_owned();

        // …and finds it on the Audit page, newest first, without its secret.
        browser.click("#nav-audit").await;
        let rows = browser
            .wait_for(
                "the audit rows",
                "const rows = [...document.querySelectorAll('#audit tbody tr')]; \
                 return rows.length >= 3 ? rows.map(r => r.dataset.action) : null",
                json!([]),
            )
            .await;
        assert_eq!(
            rows,
            json!(["key.created", "key.created", "tenant.created"]),
            "the dashboard's key, the API's, the tenant"
        );
        let shown = browser.eval(ROWS, json!([])).await;
        assert_eq!(shown[0][1], "\u{201c}deploy\u{201d} with read", "{shown}");
        let page = browser
            .eval("return document.querySelector('#audit').innerText", json!([]))
            .await;
        let page = page.as_str().unwrap();
        assert!(page.contains("first key"), "the actor's name: {page}");
        assert!(!page.contains(&secret) && !page.contains(&admin), "{page}");

        // Filtered by action.
        browser
            .eval(
                "const i = document.querySelector('#audit-action'); i.value = 'tenant.created'; \
                 i.dispatchEvent(new Event('change'))",
                json!([]),
            )
            .await;
        let filtered = browser
            .wait_for(
                "the filtered rows",
                "const rows = [...document.querySelectorAll('#audit tbody tr')]; \
                 return rows.length === 1 ? rows.map(r => r.dataset.action) : null",
                json!([]),
            )
            .await;
        assert_eq!(filtered, json!(["tenant.created"]));

        // The platform admin, no tenant picked: every tenant's changes.
        browser.click("#signout").await;
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
        browser.open(&format!("{base}/#/audit")).await;
        browser.eval(
            "const i = document.querySelector('#audit-action'); i.value = 'tenant.created'; \
             i.dispatchEvent(new Event('change'))",
            json!([]),
        )
        .await;
        let created = browser
            .wait_for(
                "both tenants' creation",
                "const rows = [...document.querySelectorAll('#audit tbody tr')]; \
                 return rows.length === 2 ? rows.map(r => r.cells[r.cells.length - 1].textContent) : null",
                json!([]),
            )
            .await;
        assert_eq!(created, json!(["Beta", "Acme"]));
    })
    .await;
}
