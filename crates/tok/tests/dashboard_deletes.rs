//! Deleting from the dashboard, in a real headless Chromium against a real
//! `tok serve`: a read-only key is shown no delete buttons; a key that may
//! write deletes a widget and removes a member of a group with two clicks
//! each, and when the API refuses (a member with open tickets, a group an
//! automation names) the page shows the refusal's reason and keeps the
//! row.

mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tok_store::Backend;
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};
use webdriver::Browser;

/// The text of the page's flash message once it holds `arguments[0]`.
const FLASHED: &str = "const f = document.querySelector('#flash'); \
     return f && !f.hidden && f.textContent.includes(arguments[0]) && f.textContent";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_key_deletes_with_two_clicks_and_sees_why_a_delete_is_refused() {
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
        let group = api
            .post(
                "/api/groups",
                &admin,
                json!({ "name": "warehouse", "members": [{ "name": "Eva" }, { "name": "Jan" }] }),
            )
            .await;
        let group_id = group["id"].as_str().unwrap().to_owned();
        let eva = group["members"][0]["id"].as_str().unwrap().to_owned();
        let jan = group["members"][1]["id"].as_str().unwrap().to_owned();
        api.post(
            "/api/ticket-types",
            &admin,
            json!({ "name": "order", "statuses": ["new", "shipped"] }),
        )
        .await;
        let ticket = api
            .post(
                "/api/tickets",
                &admin,
                json!({ "external_id": "T-1", "type": "order" }),
            )
            .await;
        let (status, body) = api
            .call(
                Method::PATCH,
                &format!("/api/tickets/{}", ticket["id"].as_str().unwrap()),
                &admin,
                None,
                Some(json!({ "assignee_id": eva })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        api.post(
            "/api/automations",
            &admin,
            json!({ "name": "Route", "trigger": { "kind": "event", "event": "ticket.created" },
                    "steps": [{ "id": "st_assign", "type": "ticket/assign-least-busy",
                                "config": { "group": "warehouse" } }] }),
        )
        .await;
        let widget = api
            .post(
                "/api/widgets",
                &admin,
                json!({ "name": "Open orders", "request": { "url": "https://stats.example.invalid/open" },
                        "ttlSec": 60 }),
            )
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned();

        // A read key sees the group and the widget, and no delete button.
        let browser = Browser::start().await;
        let base = format!("http://localhost:{port}");
        browser.sign_in(&base, &reader).await;
        browser.open(&format!("{base}/#/tickets")).await;
        browser.find(&format!("[data-member=\"{jan}\"]")).await;
        let buttons = "return document.querySelectorAll('[data-delete-group], [data-remove-member], \
             [data-delete-widget]').length";
        assert_eq!(browser.eval(buttons, json!([])).await, 0);
        browser.open(&format!("{base}/#/widgets")).await;
        browser.find(&format!("[data-widget=\"{widget}\"]")).await;
        assert_eq!(browser.eval(buttons, json!([])).await, 0);

        // A write key: Eva holds an open ticket, so she stays, and the
        // page says why.
        browser.click("#signout").await;
        browser.sign_in(&base, &admin).await;
        browser.open(&format!("{base}/#/tickets")).await;
        let remove_eva = format!("button[data-remove-member=\"{eva}\"]");
        browser.click(&remove_eva).await;
        assert_eq!(browser.text(&remove_eva).await, "Click again to remove");
        browser.click(&remove_eva).await;
        let flashed = browser
            .wait_for("the member's refusal", FLASHED, json!(["reassign"]))
            .await;
        let flashed = flashed.as_str().unwrap();
        assert!(
            flashed.contains("member `Eva` of group `warehouse`")
                && flashed.contains("1 ticket (open, assigned to `Eva`)"),
            "{flashed}"
        );
        assert_eq!(browser.text(&remove_eva).await, "Remove", "disarmed");
        browser.find(&format!("[data-member=\"{eva}\"]")).await;

        // The group is named by an automation.
        let delete_group = format!("button[data-delete-group=\"{group_id}\"]");
        browser.click(&delete_group).await;
        assert_eq!(browser.text(&delete_group).await, "Click again to delete");
        browser.click(&delete_group).await;
        let flashed = browser
            .wait_for("the group's refusal", FLASHED, json!(["automation `Route`"]))
            .await;
        assert!(
            flashed.as_str().unwrap().contains("group `warehouse` is in use by"),
            "{flashed}"
        );
        browser.find(&format!("[data-group=\"{group_id}\"]")).await;

        // Jan holds nothing: two clicks remove him.
        let remove_jan = format!("button[data-remove-member=\"{jan}\"]");
        browser.click(&remove_jan).await;
        browser.click(&remove_jan).await;
        browser
            .wait_for(
                "Jan gone from the group",
                "return !document.querySelector(`[data-member=\"${arguments[0]}\"]`)",
                json!([jan]),
            )
            .await;
        let members = api.get(&format!("/api/groups/{group_id}"), &admin).await["members"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(members, 1);

        // The widget goes with two clicks, its tile with it.
        browser.open(&format!("{base}/#/widgets")).await;
        let delete_widget = format!("button[data-delete-widget=\"{widget}\"]");
        browser.click(&delete_widget).await;
        assert_eq!(browser.text(&delete_widget).await, "Click again to delete");
        browser.click(&delete_widget).await;
        browser
            .wait_for(
                "the widget's tile gone",
                "return !document.querySelector(`[data-widget=\"${arguments[0]}\"]`)",
                json!([widget]),
            )
            .await;
        let (status, _) = api
            .call(
                Method::GET,
                &format!("/api/widgets/{widget}"),
                &admin,
                None,
                None,
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    })
    .await;
}
