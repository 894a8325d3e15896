//! The live stream (`GET /api/stream`) on real processes: a run's events
//! arrive in the order they committed, a client that reconnects with
//! `Last-Event-ID` is given what it missed, a tenant never sees another
//! tenant's events, an incident that happens again is `incident.updated`
//! (`incident.opened` only for a new one), and on PostgreSQL an `api`
//! process streams the steps a separate `worker` process recorded, a
//! client reconnecting to another `api` process is given what it missed,
//! and a stream open on one process ends once its key is revoked through
//! another (a `closed` event its last).

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use tok_store::testing::{TestDb, run_on_fresh_db};

use support::{ADMIN_KEY, Api, Server, free_port};

tok_store::backend_tests!(run_on_fresh_db;
    a_runs_events_arrive_in_commit_order_and_a_reconnect_gets_what_it_missed,
    a_tenant_sees_only_its_own_events_and_the_admin_follows_one,
    a_repeated_incident_is_updated_not_opened_again,
    a_run_its_start_control_holds_says_so_in_the_stream,
);

/// One server-sent event.
#[derive(Debug, Clone)]
struct Event {
    id: Option<String>,
    kind: String,
    data: Value,
}

/// A client of `GET /api/stream`.
struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    async fn open(api: &Api, key: &str, tenant: Option<&str>, last_id: Option<&str>) -> Stream {
        let mut request = api
            .http
            .get(format!("{}/api/stream", api.base))
            .bearer_auth(key);
        if let Some(tenant) = tenant {
            request = request.header("X-Tok-Tenant", tenant);
        }
        if let Some(id) = last_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200, "GET /api/stream");
        let kind = response.headers()["content-type"].to_str().unwrap();
        assert!(kind.starts_with("text/event-stream"), "content type {kind}");
        Stream {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (keep-alive comments skipped). A minute without one
    /// means the stream is broken: the test fails rather than hangs.
    async fn next(&mut self) -> Event {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse(&block) {
                    return event;
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.response.chunk())
                .await
                .expect("no stream event within a minute")
                .unwrap()
                .expect("the stream ended");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Events up to and including the `run.updated` that says `run` completed.
    async fn until_completed(&mut self, run: &str) -> Vec<Event> {
        self.until_status(run, "completed").await
    }

    /// Events up to and including the `run.updated` that says `run` is
    /// `status`, and what follows it at once (the events the same
    /// record published after it).
    async fn until_status(&mut self, run: &str, status: &str) -> Vec<Event> {
        let mut seen = Vec::new();
        loop {
            let event = self.next().await;
            let done = event.kind == "run.updated"
                && event.data["run_id"] == run
                && event.data["status"] == status;
            seen.push(event);
            if done {
                while let Ok(event) =
                    tokio::time::timeout(Duration::from_millis(500), self.next()).await
                {
                    seen.push(event);
                }
                return seen;
            }
        }
    }
}

fn parse(block: &str) -> Option<Event> {
    let (mut id, mut kind, mut data) = (None, String::from("message"), String::new());
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("event:") {
            kind = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim_start());
        }
    }
    (!data.is_empty()).then(|| Event {
        id,
        kind,
        data: serde_json::from_str(&data).unwrap(),
    })
}

/// A tenant with a webhook source and an automation of three steps: one
/// the dispatcher runs, one a worker runs outside the database, one the
/// worker's record transaction runs. Returns (key, tenant id, webhook URL).
async fn tenant(api: &Api, name: &str) -> (String, String, String) {
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": name }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let source = api
        .post(
            "/api/sources",
            &key,
            json!({ "name": "shop", "params": [
                { "name": "orderId", "path": "order", "type": "string", "required": true }
            ]}),
        )
        .await;
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": "Order",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "steps": [
                { "id": "st_mark", "type": "set", "config": { "values": { "seen": "{{orderId}}" } } },
                { "id": "st_pause", "type": "flow/pause", "config": { "seconds": 0.01 } },
                { "id": "st_ticket", "type": "ticket/upsert", "config": { "externalId": "{{orderId}}" } }
            ]
        }),
    )
    .await;
    (
        key,
        tenant["id"].as_str().unwrap().to_owned(),
        source["url"].as_str().unwrap().to_owned(),
    )
}

/// Sends an order; returns the event id.
async fn order(api: &Api, url: &str, id: &str) -> String {
    let response = api
        .http
        .post(url)
        .json(&json!({ "order": id }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    body["event_id"].as_str().unwrap().to_owned()
}

/// The run an event started, once it exists.
async fn run_of(api: &Api, key: &str, event: &str) -> String {
    for _ in 0..1200 {
        let runs = api.get("/api/dashboard/runs", key).await;
        if let Some(run) = runs["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["event_id"] == event)
        {
            return run["id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("event {event} started no run within a minute");
}

async fn run_status(api: &Api, key: &str, run: &str) -> String {
    let run = api.get(&format!("/api/runs/{run}"), key).await;
    run["status"].as_str().unwrap().to_owned()
}

/// The sequence number of an event id (`<process start>-<n>`).
fn seq(event: &Event) -> u64 {
    let id = event.id.as_deref().expect("every event has an id");
    id.rsplit_once('-').unwrap().1.parse().unwrap()
}

/// The kinds and paths of one run's events, in the order they came.
fn of_run(events: &[Event], run: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.data["run_id"] == run)
        .map(|e| match e.kind.as_str() {
            "step.recorded" => format!(
                "step {} {}",
                e.data["path"].as_str().unwrap(),
                e.data["status"].as_str().unwrap()
            ),
            "run.updated" => format!("run {}", e.data["status"].as_str().unwrap()),
            other => other.to_owned(),
        })
        .collect()
}

async fn a_runs_events_arrive_in_commit_order_and_a_reconnect_gets_what_it_missed(db: &TestDb) {
    let port = free_port();
    let api = Api::new(port);
    let _server = Server::start(&db.url, port, &[], &[]);
    api.wait_ready().await;
    let (key, _, url) = tenant(&api, "Shop").await;

    let mut stream = Stream::open(&api, &key, None, None).await;
    let event = order(&api, &url, "A-1").await;
    let run = run_of(&api, &key, &event).await;
    let events = stream.until_completed(&run).await;
    let kinds = of_run(&events, &run);
    let steps: Vec<&String> = kinds.iter().filter(|e| e.starts_with("step")).collect();
    assert_eq!(
        steps,
        ["step 0 completed", "step 1 completed", "step 2 completed"],
        "the run's steps in the order they committed: {events:#?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("run completed"),
        "the run's end comes after its steps: {kinds:?}"
    );
    assert!(
        events.iter().any(|e| e.kind == "ticket.updated"),
        "the ticket step's change is streamed: {events:#?}"
    );
    let ids: Vec<u64> = events.iter().map(seq).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    let last_seen = events.last().unwrap().id.clone().unwrap();
    drop(stream);

    // While nobody follows, a second order runs to its end.
    let missed_event = order(&api, &url, "A-2").await;
    let missed_run = run_of(&api, &key, &missed_event).await;
    for _ in 0..1200 {
        if run_status(&api, &key, &missed_run).await == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(run_status(&api, &key, &missed_run).await, "completed");

    // Reconnecting with the last id seen gives exactly what came after it.
    let mut again = Stream::open(&api, &key, None, Some(&last_seen)).await;
    let replayed = again.until_completed(&missed_run).await;
    assert!(
        replayed.iter().all(|e| e.data["run_id"] != run.as_str()),
        "nothing seen before is sent again: {replayed:#?}"
    );
    let missed = of_run(&replayed, &missed_run);
    assert!(
        missed.contains(&"step 2 completed".to_owned())
            && missed.last().map(String::as_str) == Some("run completed"),
        "the missed run's steps and its end are replayed: {missed:?}"
    );
    assert!(seq(&replayed[0]) > seq(events.last().unwrap()));

    // An id the server cannot replay from (another start) says: reload.
    let mut stale = Stream::open(&api, &key, None, Some("00000000-5")).await;
    assert_eq!(stale.next().await.kind, "reload");
}

async fn a_tenant_sees_only_its_own_events_and_the_admin_follows_one(db: &TestDb) {
    let port = free_port();
    let api = Api::new(port);
    let _server = Server::start(&db.url, port, &[], &[]);
    api.wait_ready().await;
    let (key_a, id_a, url_a) = tenant(&api, "A").await;
    let (key_b, _, url_b) = tenant(&api, "B").await;

    let mut stream_b = Stream::open(&api, &key_b, None, None).await;
    let mut admin_a = Stream::open(&api, ADMIN_KEY, Some(&id_a), None).await;
    let event_a = order(&api, &url_a, "from-a").await;
    let run_a = run_of(&api, &key_a, &event_a).await;
    let seen_by_admin = admin_a.until_completed(&run_a).await;
    assert!(seen_by_admin.iter().any(|e| e.kind == "step.recorded"));

    // B's stream has had A's whole run by now if it were to leak; the
    // first thing it shows is B's own run.
    let event_b = order(&api, &url_b, "from-b").await;
    let run_b = run_of(&api, &key_b, &event_b).await;
    let seen_by_b = stream_b.until_completed(&run_b).await;
    assert!(
        seen_by_b
            .iter()
            .all(|e| e.data["run_id"] == run_b.as_str() || e.data["run_id"].is_null()),
        "B sees only its own run: {seen_by_b:#?}"
    );
    let (status, _) = api
        .call(reqwest::Method::GET, "/api/stream", ADMIN_KEY, None, None)
        .await;
    assert_eq!(status, 400, "the admin must say which tenant it follows");
}

/// On PostgreSQL, one process serves the API and another does the work:
/// the API process streams the steps the worker recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_process_streams_the_steps_a_worker_process_recorded() {
    if tok_store::testing::skip_postgres() {
        eprintln!("TOK_TEST_SKIP_POSTGRES=1: the api/worker stream test is NOT run");
        return;
    }
    run_on_fresh_db(tok_store::Backend::Postgres, async |db: &TestDb| {
        let port = free_port();
        let api = Api::new(port);
        let _api_server = Server::start(
            &db.url,
            port,
            &[],
            &[("TOK_ROLE", "api"), ("TOK_NODE_ID", "api-node")],
        );
        api.wait_ready().await;
        let (key, _, url) = tenant(&api, "Split").await;
        let mut stream = Stream::open(&api, &key, None, None).await;
        let worker_port = free_port();
        let _worker = Server::start(
            &db.url,
            worker_port,
            &[],
            &[("TOK_ROLE", "worker"), ("TOK_NODE_ID", "worker-node")],
        );
        let event = order(&api, &url, "split-1").await;
        let run = run_of(&api, &key, &event).await;
        let events = stream.until_completed(&run).await;
        let steps: Vec<String> = of_run(&events, &run)
            .into_iter()
            .filter(|e| e.starts_with("step"))
            .collect();
        assert_eq!(
            steps,
            ["step 0 completed", "step 1 completed", "step 2 completed"],
            "the worker's steps, streamed by the api process: {events:#?}"
        );
    })
    .await;
}

/// A service that refuses everything with 422 (terminal: the run fails).
async fn refusing_service() -> String {
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                axum::Json(json!({ "error": "order is locked" })),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/orders", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// The incident events of one run: (kind, incident id).
fn incidents_of(events: &[Event], run: &str) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e.kind.starts_with("incident.") && e.data["run_id"] == run)
        .map(|e| {
            (
                e.kind.clone(),
                e.data["incident_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn a_repeated_incident_is_updated_not_opened_again(db: &TestDb) {
    let port = free_port();
    let api = Api::new(port);
    let refusing = refusing_service().await;
    let _server = Server::start(
        &db.url,
        port,
        &[],
        &[("TOK_OUTBOUND_ALLOW", &support::allow(&refusing))],
    );
    api.wait_ready().await;
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Desk" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let source = api
        .post(
            "/api/sources",
            &key,
            json!({ "name": "shop", "params": [
                { "name": "orderId", "path": "order", "type": "string", "required": true }
            ]}),
        )
        .await;
    // An incident step (one source for every order), then a call the
    // service refuses: the failed run opens (or joins) its incident too.
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": "Review",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "steps": [
                { "id": "st_flag", "type": "incident/create",
                  "config": { "title": "Orders need a look", "source": "orders-review" } },
                { "id": "st_send", "type": "http",
                  "config": { "method": "POST", "url": refusing, "body": { "order": "{{orderId}}" } } }
            ]
        }),
    )
    .await;
    let url = source["url"].as_str().unwrap();

    let mut stream = Stream::open(&api, &key, None, None).await;
    let first = run_of(&api, &key, &order(&api, url, "R-1").await).await;
    let events = stream.until_status(&first, "failed").await;
    let opened = incidents_of(&events, &first);
    assert_eq!(
        opened.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["incident.opened", "incident.opened"],
        "the step's incident and the failed run's, both new: {events:#?}"
    );
    assert_ne!(opened[0].1, opened[1].1);

    let second = run_of(&api, &key, &order(&api, url, "R-2").await).await;
    let events = stream.until_status(&second, "failed").await;
    let again = incidents_of(&events, &second);
    assert_eq!(
        again,
        opened
            .iter()
            .map(|(_, id)| ("incident.updated".to_owned(), id.clone()))
            .collect::<Vec<_>>(),
        "the same two incidents happened again: {events:#?}"
    );
    let listed = api.get("/api/incidents", &key).await;
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["occurrences"] == 2),
        "{listed:#}"
    );
}

/// On PostgreSQL, behind a load balancer: a client that followed one `api`
/// process reconnects to another with its `Last-Event-ID` and is given
/// what it missed, not told to reload; an id neither process gave still
/// says reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_to_another_api_process_gets_what_it_missed() {
    if tok_store::testing::skip_postgres() {
        eprintln!("TOK_TEST_SKIP_POSTGRES=1: the two-api-process stream test is NOT run");
        return;
    }
    run_on_fresh_db(tok_store::Backend::Postgres, async |db: &TestDb| {
        let (port_a, port_b) = (free_port(), free_port());
        let (api_a, api_b) = (Api::new(port_a), Api::new(port_b));
        let _a = Server::start(&db.url, port_a, &[], &[("TOK_NODE_ID", "node-a")]);
        let _b = Server::start(
            &db.url,
            port_b,
            &[],
            &[("TOK_ROLE", "api"), ("TOK_NODE_ID", "node-b")],
        );
        api_a.wait_ready().await;
        api_b.wait_ready().await;
        let (key, _, url) = tenant(&api_a, "Balanced").await;

        let mut on_a = Stream::open(&api_a, &key, None, None).await;
        // B follows too, so it has received what A sends from now on.
        let mut on_b = Stream::open(&api_b, &key, None, None).await;
        let run = run_of(&api_a, &key, &order(&api_a, &url, "LB-1").await).await;
        let seen = on_a.until_completed(&run).await;
        let seen_on_b = on_b.until_completed(&run).await;
        let ids = |events: &[Event]| events.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
        assert_eq!(
            ids(&seen_on_b)[..seen.len().min(seen_on_b.len())],
            ids(&seen)[..seen.len().min(seen_on_b.len())],
            "both processes give the same events the same ids"
        );
        let last_seen = seen
            .iter()
            .rev()
            .find(|e| e.data["run_id"] == run.as_str())
            .and_then(|e| e.id.clone())
            .unwrap();
        drop((on_a, on_b));

        let missed = run_of(&api_a, &key, &order(&api_a, &url, "LB-2").await).await;
        for _ in 0..1200 {
            if run_status(&api_a, &key, &missed).await == "completed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut again = Stream::open(&api_b, &key, None, Some(&last_seen)).await;
        let replayed = again.until_completed(&missed).await;
        assert_ne!(replayed[0].kind, "reload", "{replayed:#?}");
        assert!(
            replayed.iter().all(|e| e.data["run_id"] != run.as_str()),
            "nothing seen before is sent again: {replayed:#?}"
        );
        let steps: Vec<String> = of_run(&replayed, &missed)
            .into_iter()
            .filter(|e| e.starts_with("step"))
            .collect();
        assert_eq!(
            steps,
            ["step 0 completed", "step 1 completed", "step 2 completed"],
            "the missed run's steps, from the other process: {replayed:#?}"
        );
        let mut stale = Stream::open(&api_b, &key, None, Some("00000000-5")).await;
        assert_eq!(stale.next().await.kind, "reload");
    })
    .await;
}

async fn a_run_its_start_control_holds_says_so_in_the_stream(db: &TestDb) {
    let port = free_port();
    let api = Api::new(port);
    let _server = Server::start(&db.url, port, &[], &[]);
    api.wait_ready().await;
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": "Shop" }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let source = api
        .post("/api/sources", &key, json!({ "name": "shop" }))
        .await;
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": "Throttled",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "flow": { "throttle": { "limit": 1, "period": "1h" } },
            "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "x" } }]
        }),
    )
    .await;
    let url = source["url"].as_str().unwrap();
    let mut stream = Stream::open(&api, &key, None, None).await;
    let first = order(&api, url, "A-1").await;
    let second = order(&api, url, "A-2").await;
    let first = run_of(&api, &key, &first).await;
    let second = run_of(&api, &key, &second).await;
    let mut held = None;
    while held.is_none() {
        let event = stream.next().await;
        if event.kind == "run.updated" && event.data["run_id"] == second {
            held = Some(event.data);
        }
    }
    let held = held.unwrap();
    assert_eq!(held["status"], "queued", "{held:#}");
    assert_eq!(held["blocked_by"]["kind"], "throttle", "{held:#}");
    assert!(held["blocked_by"]["until"].is_string(), "{held:#}");
    // The first of the key's runs was not held.
    let mut status = String::new();
    for _ in 0..1200 {
        status = run_status(&api, &key, &first).await;
        if status == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, "completed");
}

/// A key revoked through one process ends the stream it holds open on
/// another: the `closed` event is its last, and the stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_on_every_process_once_its_key_is_revoked() {
    if tok_store::testing::skip_postgres() {
        eprintln!("TOK_TEST_SKIP_POSTGRES=1: the two-process revocation stream test is NOT run");
        return;
    }
    run_on_fresh_db(tok_store::Backend::Postgres, async |db: &TestDb| {
        let (port_a, port_b) = (free_port(), free_port());
        let (api_a, api_b) = (Api::new(port_a), Api::new(port_b));
        let _a = Server::start(&db.url, port_a, &[], &[("TOK_NODE_ID", "node-a")]);
        let _b = Server::start(
            &db.url,
            port_b,
            &[],
            &[("TOK_ROLE", "api"), ("TOK_NODE_ID", "node-b")],
        );
        api_a.wait_ready().await;
        api_b.wait_ready().await;
        let (admin, _, url) = tenant(&api_a, "Revoked").await;
        let made = api_a
            .post(
                "/api/keys",
                &admin,
                json!({ "name": "wall screen", "scopes": ["read"] }),
            )
            .await;
        let (id, key) = (made["id"].as_str().unwrap(), made["key"].as_str().unwrap());

        let mut on_b = Stream::open(&api_b, key, None, None).await;
        let run = run_of(&api_a, &admin, &order(&api_a, &url, "R-1").await).await;
        on_b.until_completed(&run).await;
        let (status, body) = api_a
            .call(
                reqwest::Method::DELETE,
                &format!("/api/keys/{id}"),
                &admin,
                None,
                None,
            )
            .await;
        assert_eq!(status, 204, "{body}");
        let last = loop {
            let event = on_b.next().await;
            if event.kind == "closed" {
                break event;
            }
        };
        assert_eq!(last.data["reason"], "key_revoked", "{last:?}");
        let rest = tokio::time::timeout(Duration::from_secs(30), on_b.response.chunk())
            .await
            .expect("the stream ends after its `closed` event")
            .unwrap();
        assert!(rest.is_none(), "nothing follows `closed`: {rest:?}");
        let (status, _) = api_b
            .call(reqwest::Method::GET, "/api/stream", key, None, None)
            .await;
        assert_eq!(status, 401);
    })
    .await;
}
