//! The dashboard's keys, in a real headless Chromium against a real
//! `tok serve`: a read-only key sees runs but neither their controls nor
//! the Keys page; the tenant's admin key makes a key on the Keys page,
//! copies its secret (shown once), and that key works until it is revoked
//! there.

mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};
use webdriver::Browser;

const KEYS_LINK_SHOWN: &str = "return !document.querySelector('#nav-keys').hidden";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_sees_what_its_scopes_allow_and_one_made_on_the_keys_page_works_until_revoked() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let _server = Server::start(&db.url, port, &[], &[]);
        api.wait_ready().await;
        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
            .await;
        let admin = tenant["api_key"].as_str().unwrap().to_owned();
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
        let automation = api
            .post(
                "/api/automations",
                &admin,
                json!({ "name": "Nightly", "trigger": { "kind": "manual" },
                        "steps": [{ "id": "st_wait", "type": "wait", "config": { "duration": "1h" } }] }),
            )
            .await;
        let run = api
            .post(
                &format!("/api/automations/{}/runs", automation["id"].as_str().unwrap()),
                &admin,
                json!({}),
            )
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();

        // The read key sees the run, without its controls or the Keys page.
        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, &reader).await;
        assert_eq!(browser.eval(KEYS_LINK_SHOWN, json!([])).await, false);
        browser.open(&format!("{base}/#/runs/{run}")).await;
        browser.find("#run-status").await;
        let controls = browser
            .eval(
                "return document.querySelectorAll('#run-cancel, #run-pause, #run-retry').length",
                json!([]),
            )
            .await;
        assert_eq!(controls, 0, "a read key is shown no run controls");

        // The tenant's admin key sees both, and makes a key.
        browser.click("#signout").await;
        browser.sign_in(&base, &admin).await;
        assert_eq!(browser.eval(KEYS_LINK_SHOWN, json!([])).await, true);
        browser.open(&format!("{base}/#/runs/{run}")).await;
        browser.find("#run-cancel").await;
        browser.click("#nav-keys").await;
        browser.find("#keys").await;
        let names = browser
            .eval(
                "return [...document.querySelectorAll('#keys tbody tr td:first-child')].map(td => td.textContent)",
                json!([]),
            )
            .await;
        assert_eq!(names, json!(["first key", "wallboard"]));
        browser.find("#key-name").await.type_text("deploy").await;
        browser
            .eval(
                "for (const box of document.querySelectorAll('input[name=scope]')) box.checked = box.value === 'write'",
                json!([]),
            )
            .await;
        browser.click("#key-create").await;
        let secret = browser
            .wait_for(
                "the new key's secret",
                "const s = document.querySelector('#key-secret'); return s && s.value",
                json!([]),
            )
            .await;
        let secret = secret.as_str().unwrap().to_owned();
        assert!(secret.starts_with("tok_"), "{secret}");
        let listed = browser
            .wait_for(
                "the new key in the list",
                "const rows = [...document.querySelectorAll('#keys tbody tr')]; \
                 const row = rows.find(r => r.cells[0].textContent === 'deploy'); \
                 return row ? [row.dataset.key, row.cells[1].textContent] : null",
                json!([]),
            )
            .await;
        assert_eq!(listed[1], "write");
        let id = listed[0].as_str().unwrap().to_owned();
        let page = browser
            .eval("return document.querySelector('#keys').innerText", json!([]))
            .await;
        assert!(
            !page.as_str().unwrap().contains(&secret),
            "the list shows no secret"
        );

        // The key works: it writes.
        let (status, body) = api
            .call(
                Method::POST,
                &format!("/api/automations/{}/pause", automation["id"].as_str().unwrap()),
                &secret,
                None,
                Some(json!({})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");

        // Revoked on the page (the second click confirms), it stops working.
        let button = format!("button[data-revoke=\"{id}\"]");
        browser.click(&button).await;
        assert_eq!(browser.text(&button).await, "Click again to revoke");
        browser.click(&button).await;
        browser
            .wait_for(
                "the key gone from the list",
                "return !document.querySelector(`tr[data-key=\"${arguments[0]}\"]`)",
                json!([id]),
            )
            .await;
        let (status, _) = api
            .call(Method::GET, "/api/automations", &secret, None, None)
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    })
    .await;
}
