//! DESIGN §11, the verified scenario, against a real `tok serve --demo`
//! process over HTTP, on both backends.
//!
//! The demo tenant is used as a newcomer would use it: its API key and
//! webhook URLs come from what `--demo` prints. An order becomes a ticket of
//! type `order` tagged `awaiting packing`; that change routes it to the
//! least busy warehouse member; a second order goes to someone else; a
//! converter error (message at `errors.0.message`) becomes an `error` ticket
//! for IT and an incident that the tenant sees without `detail` and the
//! platform admin with it. A second tenant sees none of it, and a restart
//! with `--demo` seeds nothing twice.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::{TestDb, backends};

const ADMIN_KEY: &str = "scenario-test-admin-key";
/// Rounds of a bounded poll, `POLL_PAUSE` apart: a generous bound on a
/// loaded CI machine, never an assertion about speed.
const POLL_ROUNDS: usize = 600;
const POLL_PAUSE: Duration = Duration::from_millis(100);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `tok serve --demo`; killed when dropped, so a failing
/// assertion leaves no process behind.
struct Server {
    child: Child,
    /// Lines the process printed to stdout, read by a thread that keeps
    /// draining the pipe so the server never blocks on a full one.
    lines: Receiver<String>,
}

impl Server {
    fn start(url: &str, port: u16) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tok"))
            .args(["serve", "--demo"])
            .env("TOK_DATABASE_URL", url)
            .env("TOK_LISTEN", format!("127.0.0.1:{port}"))
            .env("TOK_PUBLIC_URL", format!("http://localhost:{port}/"))
            .env("TOK_ADMIN_KEY", ADMIN_KEY)
            .env("TOK_NODE_ID", "scenario-test-node")
            .env("TOK_CONCURRENCY", "4")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tok serve --demo");
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        Server { child, lines }
    }

    /// The stdout lines up to the one that says the server listens.
    fn lines_until_listening(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with("tok listening on ") => return seen,
                Ok(line) => seen.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("tok serve printed no `tok listening` line; it printed: {seen:#?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("tok serve ended before it listened; it printed: {seen:#?}")
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `--demo` printed: `export NAME=value` lines.
fn exports(lines: &[String]) -> HashMap<String, String> {
    lines
        .iter()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn wait_ready(&self) {
        for _ in 0..600 {
            if let Ok(r) = self.http.get(format!("{}/readyz", self.base)).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("tok serve did not become ready within 30 s");
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        tenant: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(tenant) = tenant {
            request = request.header("X-Tok-Tenant", tenant);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("{path} answered {status} with a body that is not JSON ({e}): {text}")
        });
        (status, body)
    }

    /// A GET that must succeed, as the tenant of `key`.
    async fn get(&self, path: &str, key: &str) -> Value {
        self.get_as(path, key, None).await
    }

    /// A GET that must succeed; `tenant` sends `X-Tok-Tenant` (the admin).
    async fn get_as(&self, path: &str, key: &str, tenant: Option<&str>) -> Value {
        let (status, body) = self
            .call(reqwest::Method::GET, path, key, tenant, None)
            .await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }

    async fn post(&self, path: &str, key: &str, body: Value) -> Value {
        let (status, answer) = self
            .call(reqwest::Method::POST, path, key, None, Some(body))
            .await;
        assert!(status.is_success(), "POST {path}: {status} {answer}");
        answer
    }

    /// Every item of a listing, all pages.
    async fn all(&self, path: &str, key: &str, tenant: Option<&str>) -> Vec<Value> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page_path = match &cursor {
                Some(c) => format!("{path}?limit=500&cursor={c}"),
                None => format!("{path}?limit=500"),
            };
            let page = self.get_as(&page_path, key, tenant).await;
            items.extend(
                page["items"]
                    .as_array()
                    .expect("a listing has items")
                    .clone(),
            );
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return items,
            }
        }
    }

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
    // reqwest is built with rustls and no default crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let db = TestDb::create(backend).await;
    let port = free_port();
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
    };
    let server = Server::start(&db.url, port);
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
    let server = Server::start(&db.url, port);
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
