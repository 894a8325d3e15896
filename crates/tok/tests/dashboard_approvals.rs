//! The dashboard's approvals page in a real headless Chromium, against a
//! real `tok serve`: a run waiting at an `approval` step shows its prompt
//! and approvers, an approver's decision with a comment resumes the run (it
//! completes with the decision as the step's output), and the page moves
//! the approval out of the pending list without a reload; the run's page
//! says the approval holds it and links there. The automations
//! page shows when a schedule trigger runs next (`next_run_at`).
//!
//! `TOK_DASHBOARD_SCREENSHOTS=<dir>` also saves the pages as `approvals.png`
//! and `automations.png`.

mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use std::time::Duration;

use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};
use webdriver::Browser;

/// Polls the run until it is no longer waiting or running.
async fn finished(api: &Api, key: &str, run: &str) -> Value {
    for _ in 0..300 {
        let detail = api.get(&format!("/api/runs/{run}"), key).await;
        if !matches!(
            detail["status"].as_str(),
            Some("queued" | "running" | "waiting")
        ) {
            return detail;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run {run} never finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_decides_on_the_approvals_page_and_the_run_goes_on() {
    run_on_fresh_db(Backend::Sqlite, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let _server = Server::start(&db.url, port, &[], &[]);
        api.wait_ready().await;
        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Acme" }))
            .await;
        let key = tenant["api_key"].as_str().unwrap().to_owned();
        let group = api
            .post(
                "/api/groups",
                &key,
                json!({ "name": "Finance", "members": [{ "name": "Alice" }, { "name": "Bob" }] }),
            )
            .await;
        let bob = group["members"][1]["id"].as_str().unwrap().to_owned();
        let automation = api
            .post(
                "/api/automations",
                &key,
                json!({
                    "name": "Refund",
                    "trigger": { "kind": "manual" },
                    "steps": [
                        { "id": "st_ok", "type": "approval",
                          "config": { "approvers": { "group": "Finance" },
                                      "prompt": "Refund order {{orderId}}?" } },
                        { "id": "st_after", "type": "flow/log",
                          "config": { "message": "{{st_ok.decision}} by {{st_ok.by.name}}" } },
                    ],
                }),
            )
            .await;
        let automation = automation["id"].as_str().unwrap().to_owned();
        api.post(
            "/api/automations",
            &key,
            json!({
                "name": "New Year report",
                "trigger": { "kind": "schedule", "cron": "0 8 1 1 *", "timezone": "Europe/Prague" },
                "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "report" } }],
            }),
        )
        .await;
        let started = api
            .post(
                &format!("/api/automations/{automation}/runs"),
                &key,
                json!({ "input": { "orderId": "5001" } }),
            )
            .await;
        let run = started["run_id"].as_str().unwrap().to_owned();

        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.open(&format!("{base}/#/approvals")).await;
        browser.find("#signin-key").await.type_text(&key).await;
        browser.click("#signin-submit").await;
        let card = browser
            .wait_for(
                "the pending approval with its prompt and approvers",
                "const c = document.querySelector('#approvals .approval'); \
                 return c && c.querySelector('.pill.pending') && c.innerText",
                json!([]),
            )
            .await;
        let card = card.as_str().unwrap();
        assert!(card.contains("Refund order 5001?"), "{card}");
        assert!(card.contains("Alice, Bob"), "{card}");
        assert!(card.contains("Refund"), "the automation by name: {card}");
        if let Ok(dir) = std::env::var("TOK_DASHBOARD_SCREENSHOTS") {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(format!("{dir}/approvals.png"), browser.screenshot().await).unwrap();
        }

        // The run's page says what holds it, and links to the approvals.
        browser.open(&format!("{base}/#/runs/{run}")).await;
        let held = browser
            .wait_for(
                "the run held by its approval",
                "const c = document.querySelector('#run-held [data-kind=approval]'); \
                 return c && c.innerText",
                json!([]),
            )
            .await;
        let held = held.as_str().unwrap();
        assert!(held.contains("a decision on its approval"), "{held}");
        assert!(held.contains("open approvals"), "{held}");
        browser.click("#run-held a[href='#/approvals']").await;
        browser
            .wait_for(
                "the pending approval again",
                "return document.querySelector('#approvals .approval .pill.pending') !== null",
                json!([]),
            )
            .await;

        // Bob approves, with a comment.
        browser
            .eval(
                "const s = document.querySelector('#approvals select[name=member]'); \
                 s.value = arguments[0]; s.dispatchEvent(new Event('change'));",
                json!([bob]),
            )
            .await;
        browser
            .find("#approvals input[name=comment]")
            .await
            .type_text("within policy")
            .await;
        browser
            .click("#approvals button[data-decide=approve]")
            .await;
        browser
            .wait_for(
                "the empty pending list",
                "return !document.querySelector('#approvals .approval') && \
                 document.querySelector('#approvals').innerText.includes('Nothing waits')",
                json!([]),
            )
            .await;
        let done = finished(&api, &key, &run).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        let output = done["steps"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|s| s["step_id"] == "st_ok")
            .map(|s| s["output"].clone())
            .unwrap();
        assert_eq!(output["decision"], "approve", "{done:#}");
        assert_eq!(output["by"]["name"], "Bob");
        assert_eq!(output["comment"], "within policy");

        // The decision shows under All.
        browser
            .eval(
                "const s = document.querySelector('#approvals-filter'); \
                 s.value = 'all'; s.dispatchEvent(new Event('change'));",
                json!([]),
            )
            .await;
        let decided = browser
            .wait_for(
                "the decided approval",
                "const d = document.querySelector('#approvals .approval .decided'); \
                 return d && d.innerText",
                json!([]),
            )
            .await;
        let decided = decided.as_str().unwrap();
        assert!(decided.contains("approved by Bob"), "{decided}");
        assert!(decided.contains("within policy"), "{decided}");

        // The automations page shows when the schedule runs next.
        let automations = api.all("/api/automations", &key, None).await;
        let report = automations
            .iter()
            .find(|a| a["name"] == "New Year report")
            .unwrap();
        let next: jiff::Timestamp = report["next_run_at"].as_str().unwrap().parse().unwrap();
        browser.open(&format!("{base}/#/automations")).await;
        let shown = browser
            .wait_for(
                "the schedule's next run",
                "const rows = [...document.querySelectorAll('#automations tbody tr')]; \
                 const row = rows.find(r => r.innerText.includes('New Year report')); \
                 const n = row && row.querySelector('.next-run'); \
                 return n && [n.title, n.innerText]",
                json!([]),
            )
            .await;
        let title: jiff::Timestamp = shown[0].as_str().unwrap().parse().unwrap();
        assert_eq!(title, next, "{shown}");
        assert!(
            shown[1].as_str().is_some_and(|t| !t.is_empty() && t != "—"),
            "{shown}"
        );
        if let Ok(dir) = std::env::var("TOK_DASHBOARD_SCREENSHOTS") {
            std::fs::write(format!("{dir}/automations.png"), browser.screenshot().await).unwrap();
        }
    })
    .await;
}
