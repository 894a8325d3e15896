//! Retrying many runs from the dashboard, in a real headless Chromium
//! against a real `tok serve`: three runs failed at their second step; once
//! the automation is fixed, the runs page filtered to `failed` retries every
//! matching run on the current version with two clicks (the first says how
//! many), the operations page follows the operation to 3 of 3, and every
//! run completes.

mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use reqwest::Method;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};
use webdriver::Browser;

/// Log, then `second` (step `st_invoice`).
fn definition(second: Value) -> Value {
    json!({ "name": "Invoice", "trigger": { "kind": "manual" }, "steps": [
        { "id": "st_log", "type": "flow/log", "config": { "message": "start" } },
        second,
    ] })
}

/// Sets a select of the page to `value` as a person would.
const CHOOSE: &str = "const s = document.querySelector(arguments[0]); s.value = arguments[1]; \
     s.dispatchEvent(new Event('change')); return true";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_runs_are_retried_on_the_fixed_version_from_the_runs_page() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let _server = Server::start(&db.url, port, &[], &[]);
        api.wait_ready().await;
        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
            .await;
        let key = tenant["api_key"].as_str().unwrap().to_owned();
        // The outbound guard refuses a loopback address: the step fails.
        let broken = json!({ "id": "st_invoice", "type": "http",
            "config": { "method": "POST", "url": "http://127.0.0.1:9/invoices" } });
        let automation = api.post("/api/automations", &key, definition(broken)).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut runs = Vec::new();
        for n in 0..3 {
            let started = api
                .post(
                    &format!("/api/automations/{automation}/runs"),
                    &key,
                    json!({ "input": { "n": n } }),
                )
                .await;
            runs.push(started["run_id"].as_str().unwrap().to_owned());
        }
        for run in &runs {
            let mut status = Value::Null;
            for _ in 0..100 {
                status = api.get(&format!("/api/runs/{run}"), &key).await["status"].clone();
                if status == "failed" {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert_eq!(status, "failed", "run {run}");
        }
        let fixed =
            json!({ "id": "st_invoice", "type": "flow/log", "config": { "message": "invoiced" } });
        let (status, body) = api
            .call(
                Method::PUT,
                &format!("/api/automations/{automation}"),
                &key,
                None,
                Some(definition(fixed)),
            )
            .await;
        assert!(status.is_success(), "{status} {body}");

        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, &key).await;
        browser.open(&format!("{base}/#/runs")).await;
        browser.find("#filter-status").await;
        browser
            .eval(CHOOSE, json!(["#filter-status", "failed"]))
            .await;
        browser.find("#bulk-version").await;
        browser
            .eval(CHOOSE, json!(["#bulk-version", "current"]))
            .await;
        browser.click("#bulk-act").await;
        browser
            .wait_for(
                "the count of matching runs",
                "return document.querySelector('#bulk-act').textContent.includes('Retry 3 runs')",
                json!([]),
            )
            .await;
        browser.click("#bulk-act").await;
        browser
            .wait_for(
                "the operation done",
                "const d = document.querySelector('#operation-detail [data-status=\"done\"]'); \
                 return d && d.textContent",
                json!([]),
            )
            .await;
        assert_eq!(browser.text("#operation-detail .progress").await, "3 of 3");
        browser.find("#operations tr[data-status=\"done\"]").await;

        for run in &runs {
            let mut run_now = Value::Null;
            for _ in 0..100 {
                run_now = api.get(&format!("/api/runs/{run}"), &key).await;
                if run_now["status"] == "completed" {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert_eq!(run_now["status"], "completed", "{run_now:#}");
            assert_eq!(run_now["version"], json!(2));
        }
    })
    .await;
}
