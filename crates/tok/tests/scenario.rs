//! The service desk scenario (README.md, "A service desk in five minutes"),
//! verified against a real `tok serve --demo` process over HTTP, on both
//! backends.
//!
//! The demo tenant is used as a newcomer would use it: its API key and
//! webhook URLs come from what `--demo` prints. An order becomes a ticket of
//! type `order` tagged `awaiting packing`; that change routes it to the
//! least busy warehouse member; a second order goes to someone else; a
//! converter error (message at `errors.0.message`) becomes an `error` ticket
//! for IT and an incident that the tenant sees without `detail` and the
//! platform admin with it. A second tenant sees none of it, and a restart
//! with `--demo` seeds nothing twice.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, backends};

use support::{ADMIN_KEY, Api, Server, exports, free_port};
/// Rounds of a bounded poll, `POLL_PAUSE` apart: a generous bound on a
/// loaded CI machine, never an assertion about speed.
const POLL_ROUNDS: usize = 600;
const POLL_PAUSE: Duration = Duration::from_millis(100);

impl Api {
    /// Sends a webhook; it must be accepted at once (202) as a new event.
    async fn webhook(&self, url: &str, body: Value) -> String {
        let response = self.http.post(url).json(&body).send().await.unwrap();
        let status = response.status();
        let answer: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "webhook {body}: {answer}");
        assert_eq!(answer["duplicate"], false, "webhook {body}: {answer}");
        answer["event_id"].as_str().unwrap().to_owned()
    }

    /// Polls the tenant's tickets until the one with `external_id` passes
    /// `done`; panics with what it last saw when the bound runs out.
    async fn ticket_when(
        &self,
        key: &str,
        external_id: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut last = Value::Null;
        for _ in 0..POLL_ROUNDS {
            let tickets = self.all("/api/tickets", key, None).await;
            if let Some(ticket) = tickets.iter().find(|t| t["external_id"] == external_id) {
                if done(ticket) {
                    return ticket.clone();
                }
                last = ticket.clone();
            }
            tokio::time::sleep(POLL_PAUSE).await;
        }
        panic!("ticket {external_id} never became {what}; last seen: {last}");
    }
}

/// Member names by id, of the demo group `name`.
fn members(groups: &[Value], name: &str) -> HashMap<String, String> {
    let group = groups
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("the demo has no group `{name}`: {groups:?}"));
    group["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn has_tag(ticket: &Value, tag: &str) -> bool {
    ticket["tags"]
        .as_array()
        .is_some_and(|tags| tags.iter().any(|t| t == tag))
}

fn assignee_id(ticket: &Value) -> Option<&str> {
    ticket["assignee"]["id"].as_str()
}

async fn scenario(backend: Backend) {
    let db = TestDb::create(backend).await;
    let port = free_port();
    let api = Api::new(port);
    let server = Server::start(&db.url, port, &["--demo"], &[]);
    let printed = exports(&server.lines_until_listening());
    api.wait_ready().await;
    let var = |name: &str| {
        printed
            .get(name)
            .unwrap_or_else(|| panic!("{backend:?}: --demo did not print {name}: {printed:?}"))
            .clone()
    };
    let (tenant, key) = (var("DEMO_TENANT"), var("DEMO_KEY"));
    let (eshop, converter) = (var("ESHOP_WEBHOOK"), var("CONVERTER_WEBHOOK"));
    assert!(key.starts_with("tok_demo_"), "{backend:?}: key {key}");
    for url in [&eshop, &converter] {
        assert!(
            url.starts_with(&format!("http://localhost:{port}/webhook/")),
            "{backend:?}: webhook URLs are built on TOK_PUBLIC_URL: {url}"
        );
    }
    // The printed URLs point at this server (TOK_PUBLIC_URL says localhost).
    let eshop = eshop.replace("localhost", "127.0.0.1");
    let converter = converter.replace("localhost", "127.0.0.1");

    let groups = api.all("/api/groups", &key, None).await;
    let warehouse = members(&groups, "warehouse");
    let shipping = members(&groups, "shipping");
    let it = members(&groups, "IT");
    assert_eq!(
        (warehouse.len(), shipping.len(), it.len()),
        (3, 2, 3),
        "{backend:?}: {groups:?}"
    );
    let automations: HashMap<String, String> = api
        .all("/api/automations", &key, None)
        .await
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap().to_owned(),
                a["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let automation = |name: &str| {
        automations
            .get(name)
            .unwrap_or_else(|| panic!("{backend:?}: the demo has no automation `{name}`"))
            .clone()
    };

    // 1-4: an order becomes a typed, tagged ticket, routed to the warehouse.
    let mut order_events = vec![
        api.webhook(
            &eshop,
            json!({"kind": "order.created", "data": {"order": {"id": "5001"}}}),
        )
        .await,
    ];
    let routed = |ticket: &Value| {
        ticket["type"] == "order"
            && has_tag(ticket, "awaiting packing")
            && assignee_id(ticket).is_some()
    };
    let first = api
        .ticket_when(&key, "order-5001", "a routed order", routed)
        .await;
    let first_assignee = assignee_id(&first).unwrap().to_owned();
    assert!(
        warehouse.contains_key(&first_assignee),
        "{backend:?}: order 5001 went to {} outside the warehouse {warehouse:?}",
        first["assignee"]
    );
    assert_eq!(
        first["assignee"]["name"], warehouse[&first_assignee],
        "{backend:?}"
    );

    // 5: the second order goes to someone else: the first person has one.
    order_events.push(
        api.webhook(
            &eshop,
            json!({"kind": "order.created", "data": {"order": {"id": "5002"}}}),
        )
        .await,
    );
    let second = api
        .ticket_when(&key, "order-5002", "a routed order", routed)
        .await;
    let second_assignee = assignee_id(&second).unwrap().to_owned();
    assert!(
        warehouse.contains_key(&second_assignee),
        "{backend:?}: order 5002 went to {} outside the warehouse",
        second["assignee"]
    );
    assert_ne!(
        second_assignee, first_assignee,
        "{backend:?}: both orders went to the same person"
    );

    // 6: a converter error, its message nested at errors.0.message.
    let error_event = api
        .webhook(
            &converter,
            json!({"document": {"id": "D-99"}, "errors": [{"code": "OCR_FAIL", "message": "Amount unreadable"}]}),
        )
        .await;
    let error_ticket = api
        .ticket_when(&key, "doc-D-99", "an error ticket for IT", |t| {
            t["type"] == "error" && assignee_id(t).is_some()
        })
        .await;
    assert!(
        it.contains_key(assignee_id(&error_ticket).unwrap()),
        "{backend:?}: the error went to {} outside IT {it:?}",
        error_ticket["assignee"]
    );
    let error_detail = api
        .get(
            &format!("/api/tickets/{}", error_ticket["id"].as_str().unwrap()),
            &key,
        )
        .await;
    assert_eq!(
        error_detail["title"], "Amount unreadable",
        "{backend:?}: the ticket's title is the converter's message: {error_detail}"
    );

    // The incident: title and impact for the tenant, detail for the admin.
    let mut incidents = Vec::new();
    for _ in 0..POLL_ROUNDS {
        incidents = api.all("/api/incidents", &key, None).await;
        if !incidents.is_empty() {
            break;
        }
        tokio::time::sleep(POLL_PAUSE).await;
    }
    assert_eq!(incidents.len(), 1, "{backend:?}: {incidents:?}");
    let incident = &incidents[0];
    assert_eq!(
        incident["title"], "Document D-99 could not be converted",
        "{backend:?}"
    );
    assert_eq!(incident["status"], "open", "{backend:?}");
    let impact = incident["impact"].as_str().unwrap_or_default();
    assert!(impact.contains("D-99"), "{backend:?}: impact {impact:?}");
    for internal in ["st_", "run_", "aut_"] {
        assert!(
            !incident.to_string().contains(internal),
            "{backend:?}: the tenant's incident shows `{internal}…`: {incident}"
        );
    }
    assert!(
        incident.get("detail").is_none(),
        "{backend:?}: the tenant sees the detail: {incident}"
    );
    let as_admin = api.all("/api/incidents", ADMIN_KEY, Some(&tenant)).await;
    assert_eq!(as_admin.len(), 1, "{backend:?}: {as_admin:?}");
    assert_eq!(as_admin[0]["id"], incident["id"], "{backend:?}");
    assert_eq!(
        as_admin[0]["detail"]["document"], "D-99",
        "{backend:?}: the admin sees the detail: {}",
        as_admin[0]
    );

    // The runs: per order one webhook run of "New order" and one "Route
    // orders" run started by the ticket change; one run for the error. The
    // assignment by "Route orders" starts nothing (its own change).
    let expected_runs = 5;
    let mut runs = Vec::new();
    for _ in 0..POLL_ROUNDS {
        runs = api.all("/api/dashboard/runs", &key, None).await;
        if runs.len() >= expected_runs && runs.iter().all(|r| r["status"] == "completed") {
            break;
        }
        tokio::time::sleep(POLL_PAUSE).await;
    }
    for run in &runs {
        assert_eq!(run["status"], "completed", "{backend:?}: {run}");
    }
    assert_eq!(runs.len(), expected_runs, "{backend:?}: {runs:#?}");
    let of = |name: &str| -> Vec<&Value> {
        let id = automation(name);
        runs.iter().filter(|r| r["automation_id"] == id).collect()
    };
    let mut new_order_events: Vec<&str> = of("New order")
        .iter()
        .map(|run| {
            assert_eq!(run["trigger_type"], "webhook", "{backend:?}: {run}");
            run["event_id"].as_str().unwrap()
        })
        .collect();
    new_order_events.sort_unstable();
    let mut sent: Vec<&str> = order_events.iter().map(String::as_str).collect();
    sent.sort_unstable();
    assert_eq!(
        new_order_events, sent,
        "{backend:?}: one run per order event"
    );
    let converter_runs = of("Converter errors");
    assert_eq!(converter_runs.len(), 1, "{backend:?}");
    assert_eq!(converter_runs[0]["event_id"], error_event.as_str());
    let route = of("Route orders");
    assert_eq!(route.len(), 2, "{backend:?}: {route:?}");
    let mut routed_orders = Vec::new();
    for run in &route {
        assert_eq!(run["trigger_type"], "event", "{backend:?}: {run}");
        let detail = api
            .get(&format!("/api/runs/{}", run["id"].as_str().unwrap()), &key)
            .await;
        let step = &detail["steps"][0];
        assert_eq!(
            (&step["type"], &step["status"]),
            (&json!("ticket/assign-least-busy"), &json!("completed")),
            "{backend:?}: {detail}"
        );
        routed_orders.push(detail["context"]["ticket"]["externalId"].clone());
    }
    routed_orders.sort_by_key(|v| v.to_string());
    assert_eq!(
        routed_orders,
        [json!("order-5001"), json!("order-5002")],
        "{backend:?}: each order is routed once"
    );

    // The ticket's trace says who got it.
    let detail = api
        .get(
            &format!("/api/tickets/{}", first["id"].as_str().unwrap()),
            &key,
        )
        .await;
    let trace = detail["trace"].as_array().expect("a ticket has its trace");
    let name = &warehouse[&first_assignee];
    assert!(
        trace.iter().any(|line| line["message"]
            .as_str()
            .is_some_and(|m| m.contains(name.as_str()) && m.contains("warehouse"))),
        "{backend:?}: the trace does not mention the assignment to {name}: {trace:#?}"
    );

    // A second tenant sees none of it.
    let other = api
        .post("/api/tenants", ADMIN_KEY, json!({"name": "Other"}))
        .await;
    let other_key = other["api_key"].as_str().unwrap();
    for listing in ["/api/tickets", "/api/incidents", "/api/dashboard/runs"] {
        let items = api.all(listing, other_key, None).await;
        assert!(
            items.is_empty(),
            "{backend:?}: the other tenant sees {listing}: {items:?}"
        );
    }
    let (status, body) = api
        .call(
            reqwest::Method::GET,
            &format!("/api/tickets/{}", first["id"].as_str().unwrap()),
            other_key,
            None,
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "{backend:?}: the other tenant reads the demo's ticket: {body}"
    );

    // A restart with --demo seeds nothing again and prints no new key.
    drop(server);
    let server = Server::start(&db.url, port, &["--demo"], &[]);
    let printed = server.lines_until_listening();
    api.wait_ready().await;
    assert!(
        exports(&printed).is_empty(),
        "{backend:?}: a second start seeded again: {printed:#?}"
    );
    assert_eq!(
        api.all("/api/sources", &key, None).await.len(),
        2,
        "{backend:?}"
    );
    assert_eq!(
        api.all("/api/automations", &key, None).await.len(),
        3,
        "{backend:?}"
    );
    assert_eq!(api.all("/api/groups", &key, None).await.len(), 3);
    drop(server);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_desk_scenario_runs_against_tok_serve_demo() {
    for backend in backends() {
        scenario(backend).await;
    }
}
