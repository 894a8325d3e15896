//! `spawn_app` and the requests every feature's tests make.
//!
//! Each test gets a database of its own (a SQLite file or a fresh PostgreSQL
//! database), a migrated store, a platform admin key, and an engine whose
//! dispatcher and workers really run. Requests go through the router with
//! `oneshot`, exactly as a client's would, without binding a port. Waiting
//! for the engine is always a bounded poll of the API, never a fixed sleep.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tok_engine::{Engine, EngineConfig, OutboundAllow, Registry, Running};
use tok_server::AppState;
use tok_store::testing::{TestDb, backends, catch_unwind};
use tok_store::{Backend, hash_secret};
use tower::ServiceExt;

/// Scheme and host the app is told it is reachable at (`TOK_PUBLIC_URL`).
pub(crate) const PUBLIC_URL: &str = "https://tok.example.test";

/// How long a poll waits for the engine before the test fails. Generous: a
/// loaded CI machine may be slow, and a passing test never waits this long.
const PATIENCE: Duration = Duration::from_secs(30);

/// Pause between two looks at the API while polling.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// The API suite's tests are generated per backend by
/// `tok_store::backend_tests!` with [`run`] as their runner:
/// `backend_tests!(crate::helpers::run; test_a, test_b)`.
pub(crate) use tok_store::backend_tests;

/// Runs one test on a fresh app and always cleans up afterwards (the
/// PostgreSQL database is dropped even when an assertion fails). A
/// PostgreSQL test is skipped, saying so, when `TOK_TEST_SKIP_POSTGRES=1`.
pub(crate) async fn run(backend: Backend, test: impl AsyncFnOnce(&TestApp)) {
    run_serving(backend, None, OutboundAllow::default(), test).await;
}

/// [`run`] for tests that call a local service: a listener is bound on
/// 127.0.0.1 before the app starts, the app's outbound guard opens exactly
/// its `host:port` (as `TOK_OUTBOUND_ALLOW` would), and the test takes it
/// with [`TestApp::service_listener`]. Every other internal address stays
/// refused.
pub(crate) async fn run_with_service(backend: Backend, test: impl AsyncFnOnce(&TestApp)) {
    if !backends().contains(&backend) {
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the local service");
    let addr = listener.local_addr().expect("the service's address");
    let allow = OutboundAllow::host_port(&addr.ip().to_string(), addr.port());
    run_serving(backend, Some(listener), allow, test).await;
}

/// [`run`] on an app whose outbound guard opens `allow`, with `service`
/// (a listener bound before the app started) for
/// [`TestApp::service_listener`].
pub(crate) async fn run_serving(
    backend: Backend,
    service: Option<tokio::net::TcpListener>,
    allow: OutboundAllow,
    test: impl AsyncFnOnce(&TestApp),
) {
    if !backends().contains(&backend) {
        return;
    }
    let app = spawn_app(backend, allow).await;
    *app.service.lock().unwrap() = service;
    let outcome = catch_unwind(test(&app)).await;
    app.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A running tok: the router, its state, and the engine behind it.
pub(crate) struct TestApp {
    pub(crate) backend: Backend,
    pub(crate) router: Router,
    pub(crate) state: AppState,
    pub(crate) admin_key: String,
    running: tokio::sync::Mutex<Option<Running>>,
    db: TestDb,
    /// The local service's listener of [`run_with_service`].
    service: std::sync::Mutex<Option<tokio::net::TcpListener>>,
}

/// A fresh database, migrated, with an admin key, and an engine running its
/// dispatcher and workers. `/readyz` stays 503 until `state.set_ready()`.
/// Its outbound guard opens `allow` (`TOK_OUTBOUND_ALLOW`; closed by
/// default, as `tok serve`'s).
pub(crate) async fn spawn_app(backend: Backend, allow: OutboundAllow) -> TestApp {
    spawn_app_with(backend, allow, |_| {}, |state| state).await
}

/// [`run`] on an app whose platform requires signed webhooks of every
/// tenant that did not choose (`TOK_REQUIRE_SIGNED_WEBHOOKS=true`).
pub(crate) async fn run_requiring_signatures(backend: Backend, test: impl AsyncFnOnce(&TestApp)) {
    if !backends().contains(&backend) {
        return;
    }
    let app = spawn_app_with(
        backend,
        OutboundAllow::default(),
        |_| {},
        |state| state.require_signed_webhooks(true),
    )
    .await;
    let outcome = catch_unwind(test(&app)).await;
    app.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// [`run`] on an app whose registry also has a `script` step, for tests of
/// what is refused when a definition is saved: its sandbox program does
/// not exist, so a script saved here would fail when it ran.
pub(crate) async fn run_with_script_checks(backend: Backend, test: impl AsyncFnOnce(&TestApp)) {
    if !backends().contains(&backend) {
        return;
    }
    let app = spawn_app_with(
        backend,
        OutboundAllow::default(),
        |registry| {
            let pool = tok_script::ScriptPool::new(tok_script::PoolConfig::new(
                "/nonexistent/tok-script-sandbox",
                ["script-sandbox"],
            ))
            .expect("a pool that starts no child until a script runs");
            registry.register("script", tok_engine::ScriptStep::new(pool));
        },
        |state| state,
    )
    .await;
    let outcome = catch_unwind(test(&app)).await;
    app.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// [`spawn_app`] whose registry `extend` adds to and whose state
/// `configure` sets up as `tok serve` would from its configuration.
async fn spawn_app_with(
    backend: Backend,
    allow: OutboundAllow,
    extend: impl FnOnce(&mut Registry),
    configure: impl FnOnce(AppState) -> AppState,
) -> TestApp {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let admin_key = format!("tok_admin_{}", tok_store::random_token());
    store
        .add_admin_key(&hash_secret(&admin_key))
        .await
        .expect("add the admin key");
    let mut registry = Registry::with_connectors(store.clone(), &allow);
    extend(&mut registry);
    let engine = Engine::new(
        store.clone(),
        registry,
        EngineConfig {
            node_id: "api-tests".into(),
            concurrency: 4,
            poll_interval: Duration::from_millis(20),
            shutdown_grace: Duration::from_secs(5),
            // No sampling: which steps are stored whole is then certain.
            step_sample: 0.0,
            outbound: allow.clone(),
            ..EngineConfig::default()
        },
    );
    let running = engine.start(true).await.expect("start the engine");
    let state = configure(AppState::new(engine, PUBLIC_URL));
    TestApp {
        backend,
        router: tok_server::app(state.clone()),
        state,
        admin_key,
        running: tokio::sync::Mutex::new(Some(running)),
        db,
        service: std::sync::Mutex::new(None),
    }
}

/// What a client got back: the status and the body (JSON; `null` when the
/// body was empty, a string when it was not JSON).
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: axum::http::HeaderMap,
    pub(crate) body: Value,
}

impl Reply {
    /// Asserts the status, showing the body when it differs; returns the body.
    #[track_caller]
    pub(crate) fn expect(self, status: StatusCode) -> Value {
        assert_eq!(
            self.status, status,
            "unexpected status; body: {:#}",
            self.body
        );
        self.body
    }

    /// Asserts an error answer (`{"error": {"code", "message", …}}`) with this
    /// status and code; returns the `error` object.
    #[track_caller]
    pub(crate) fn expect_error(self, status: StatusCode, code: &str) -> Value {
        let body = self.expect(status);
        let error = body["error"].clone();
        assert_eq!(error["code"], code, "unexpected error code; body: {body:#}");
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "an error must say what went wrong; body: {body:#}"
        );
        error
    }
}

/// A tenant and its API key, as `POST /api/tenants` answered them.
#[derive(Debug, Clone)]
pub(crate) struct Tenant {
    pub(crate) id: String,
    pub(crate) key: String,
}

impl TestApp {
    /// The listener of the local service the app may call (only under
    /// [`run_with_service`]; once).
    pub(crate) fn service_listener(&self) -> tokio::net::TcpListener {
        self.service
            .lock()
            .unwrap()
            .take()
            .expect("run the test with `run_with_service` to get a local service, once")
    }

    /// Sends one request through the router.
    pub(crate) async fn send(&self, request: Request<Body>) -> Reply {
        send(self.router.clone(), request).await
    }

    /// Sends requests all at once, each from its own task, as impatient
    /// clients retrying in parallel would; the replies come back in order.
    pub(crate) async fn send_together(&self, requests: Vec<Request<Body>>) -> Vec<Reply> {
        let tasks: Vec<_> = requests
            .into_iter()
            .map(|r| tokio::spawn(send(self.router.clone(), r)))
            .collect();
        let mut replies = Vec::with_capacity(tasks.len());
        for task in tasks {
            replies.push(task.await.expect("a request task panicked"));
        }
        replies
    }

    /// A request with an optional bearer key, extra headers and a raw body.
    pub(crate) async fn request(
        &self,
        method: Method,
        uri: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Body,
    ) -> Reply {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(key) = key {
            builder = builder.header("authorization", format!("Bearer {key}"));
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        self.send(builder.body(body).expect("a valid request"))
            .await
    }

    pub(crate) async fn get(&self, key: &str, uri: &str) -> Reply {
        self.request(Method::GET, uri, Some(key), &[], Body::empty())
            .await
    }

    pub(crate) async fn post(&self, key: &str, uri: &str, body: &Value) -> Reply {
        self.post_with(key, uri, &[], body).await
    }

    pub(crate) async fn post_with(
        &self,
        key: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Reply {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.request(
            Method::POST,
            uri,
            Some(key),
            &all,
            Body::from(body.to_string()),
        )
        .await
    }

    pub(crate) async fn put(&self, key: &str, uri: &str, body: &Value) -> Reply {
        let headers = [("content-type", "application/json")];
        self.request(
            Method::PUT,
            uri,
            Some(key),
            &headers,
            Body::from(body.to_string()),
        )
        .await
    }

    pub(crate) async fn patch(&self, key: &str, uri: &str, body: &Value) -> Reply {
        let headers = [("content-type", "application/json")];
        self.request(
            Method::PATCH,
            uri,
            Some(key),
            &headers,
            Body::from(body.to_string()),
        )
        .await
    }

    pub(crate) async fn delete(&self, key: &str, uri: &str) -> Reply {
        self.request(Method::DELETE, uri, Some(key), &[], Body::empty())
            .await
    }

    /// A GET with the platform admin key acting for `tenant` (`X-Tok-Tenant`).
    pub(crate) async fn get_as_admin(&self, tenant: &Tenant, uri: &str) -> Reply {
        let headers = [("x-tok-tenant", tenant.id.as_str())];
        self.request(
            Method::GET,
            uri,
            Some(&self.admin_key),
            &headers,
            Body::empty(),
        )
        .await
    }

    /// Creates a tenant with the admin key.
    pub(crate) async fn create_tenant(&self, name: &str) -> Tenant {
        let body = self
            .post(&self.admin_key, "/api/tenants", &json!({ "name": name }))
            .await
            .expect(StatusCode::CREATED);
        assert_eq!(body["name"], name, "{body:#}");
        Tenant {
            id: body["id"].as_str().expect("tenant id").to_owned(),
            key: body["api_key"].as_str().expect("api_key").to_owned(),
        }
    }

    /// Creates a source (`{name, params}`); returns `{id, token, url, …}`.
    pub(crate) async fn create_source(&self, tenant: &Tenant, body: &Value) -> Value {
        let source = self
            .post(&tenant.key, "/api/sources", body)
            .await
            .expect(StatusCode::CREATED);
        assert!(
            source["id"].is_string() && source["token"].is_string(),
            "{source:#}"
        );
        source
    }

    /// Creates an automation (version 1); returns its id.
    pub(crate) async fn create_automation(&self, tenant: &Tenant, definition: &Value) -> String {
        let created = self
            .post(&tenant.key, "/api/automations", definition)
            .await
            .expect(StatusCode::CREATED);
        assert_eq!(created["version"], 1, "{created:#}");
        created["id"].as_str().expect("automation id").to_owned()
    }

    /// Creates a ticket type; returns `{id, name, statuses, fields, …}`.
    pub(crate) async fn create_ticket_type(
        &self,
        tenant: &Tenant,
        name: &str,
        statuses: &[&str],
    ) -> Value {
        let body = json!({ "name": name, "statuses": statuses, "fields": [] });
        let created = self
            .post(&tenant.key, "/api/ticket-types", &body)
            .await
            .expect(StatusCode::CREATED);
        assert_eq!(created["name"], name, "{created:#}");
        created
    }

    /// Creates a group whose members have the default capacity; returns
    /// `{id, name, members: [{id, name, capacity}]}`.
    pub(crate) async fn create_group(
        &self,
        tenant: &Tenant,
        name: &str,
        members: &[&str],
    ) -> Value {
        let members: Vec<Value> = members.iter().map(|m| json!({ "name": m })).collect();
        let body = json!({ "name": name, "members": members });
        let created = self
            .post(&tenant.key, "/api/groups", &body)
            .await
            .expect(StatusCode::CREATED);
        assert_eq!(created["name"], name, "{created:#}");
        created
    }

    /// Creates a ticket as a person (`POST /api/tickets`); returns it.
    pub(crate) async fn create_ticket(&self, tenant: &Tenant, body: &Value) -> Value {
        let created = self
            .post(&tenant.key, "/api/tickets", body)
            .await
            .expect(StatusCode::CREATED);
        assert!(created["id"].is_string(), "{created:#}");
        created
    }

    /// `GET /api/tickets/{id}`: the ticket with its trace.
    pub(crate) async fn ticket(&self, tenant: &Tenant, id: &str) -> Value {
        self.get(&tenant.key, &format!("/api/tickets/{id}"))
            .await
            .expect(StatusCode::OK)
    }

    /// Sends a webhook body (no authentication: the token is the secret).
    pub(crate) async fn webhook(&self, token: &str, body: &Value) -> Reply {
        self.webhook_with(token, &[], body).await
    }

    pub(crate) async fn webhook_with(
        &self,
        token: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Reply {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        let uri = format!("/webhook/{token}");
        self.request(Method::POST, &uri, None, &all, Body::from(body.to_string()))
            .await
    }

    /// Starts a manual run; returns its id.
    pub(crate) async fn start_run(
        &self,
        tenant: &Tenant,
        automation: &str,
        body: &Value,
    ) -> String {
        let uri = format!("/api/automations/{automation}/runs");
        let started = self
            .post(&tenant.key, &uri, body)
            .await
            .expect(StatusCode::CREATED);
        started["run_id"].as_str().expect("run_id").to_owned()
    }

    /// Polls `GET /api/runs/{id}` until `done` holds for the run.
    pub(crate) async fn wait_for_run(
        &self,
        tenant: &Tenant,
        run_id: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let uri = format!("/api/runs/{run_id}");
        self.poll(&format!("run {run_id}"), async || {
            let run = self.get(&tenant.key, &uri).await.expect(StatusCode::OK);
            done(&run).then_some(run).ok_or(())
        })
        .await
    }

    /// Polls until the run has finished (completed, failed or cancelled).
    pub(crate) async fn wait_for_final(&self, tenant: &Tenant, run_id: &str) -> Value {
        self.wait_for_run(tenant, run_id, is_final).await
    }

    /// Polls a runs listing (`query` without `?`) until it holds `count`
    /// runs, every one of them finished; returns the items, newest first.
    pub(crate) async fn wait_for_runs(
        &self,
        tenant: &Tenant,
        query: &str,
        count: usize,
    ) -> Vec<Value> {
        let uri = format!("/api/dashboard/runs?limit=500&{query}");
        self.poll(&format!("{count} finished runs at {uri}"), async || {
            let page = self.get(&tenant.key, &uri).await.expect(StatusCode::OK);
            let items = page["items"].as_array().cloned().unwrap_or_default();
            assert!(
                items.len() <= count,
                "more runs than expected at {uri}: {page:#}"
            );
            (items.len() == count && items.iter().all(is_final))
                .then_some(items)
                .ok_or(())
        })
        .await
    }

    /// Retries `probe` until it answers `Ok`, for at most [`PATIENCE`].
    pub(crate) async fn poll<T>(
        &self,
        what: &str,
        mut probe: impl AsyncFnMut() -> Result<T, ()>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Ok(value) = probe().await {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "gave up waiting for {what} after {PATIENCE:?} ({:?})",
                self.backend
            );
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Runs `sql` (one or more statements) on the app's database from a
    /// connection of its own: for a fault a test injects on purpose (a
    /// trigger that refuses a write), never to read what the API shows.
    pub(crate) async fn sql(&self, sql: &str) {
        use sqlx::Connection as _;
        match self.backend {
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.db.url)
                    .await
                    .expect("a connection of its own");
                sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
                conn.close().await.expect("close");
            }
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.db.url)
                    .await
                    .expect("a connection of its own");
                sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
                conn.close().await.expect("close");
            }
        }
    }

    /// Stops the dispatcher and the workers: nothing moves until
    /// [`TestApp::start_engine`]. Requests are still served.
    pub(crate) async fn stop_engine(&self) {
        if let Some(running) = self.running.lock().await.take() {
            running.shutdown().await;
        }
    }

    /// Starts the dispatcher and the workers again after [`TestApp::stop_engine`].
    pub(crate) async fn start_engine(&self) {
        let mut running = self.running.lock().await;
        assert!(running.is_none(), "the engine is already running");
        *running = Some(
            self.state
                .engine
                .start(true)
                .await
                .expect("restart the engine"),
        );
    }

    /// Stops the engine, closes every handle on the database and drops it.
    async fn cleanup(self) {
        self.stop_engine().await;
        let TestApp {
            router, state, db, ..
        } = self;
        drop(router);
        drop(state);
        db.cleanup().await;
    }
}

/// Sends one request through `router`, checking a JSON answer against the
/// OpenAPI document.
pub(crate) async fn send(router: Router, request: Request<Body>) -> Reply {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = router
        .oneshot(request)
        .await
        .expect("the router is infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("read the response body")
        .to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    let json = headers
        .get("content-type")
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if json {
        crate::openapi::check_reply(&method, &path, status, &body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

/// A JSON request, for [`TestApp::send_together`].
pub(crate) fn json_request(
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Body::from(body.to_string()))
        .expect("a valid request")
}

/// Whether a run (summary or detail) has reached a final status.
pub(crate) fn is_final(run: &Value) -> bool {
    matches!(
        run["status"].as_str(),
        Some("completed" | "failed" | "cancelled" | "refused" | "skipped" | "expired")
    )
}

/// The ids of a listing's items, in order.
pub(crate) fn ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|r| r["id"].as_str().expect("an id").to_owned())
        .collect()
}

/// A contract-free source named `name`.
pub(crate) fn plain_source(name: &str) -> Value {
    json!({ "name": name, "params": [] })
}

/// A definition triggered by a webhook on `source`.
pub(crate) fn on_webhook(name: &str, source: &str, steps: &Value) -> Value {
    json!({ "name": name, "trigger": { "kind": "webhook", "source": source }, "steps": steps })
}

/// A definition started only by hand.
pub(crate) fn manual(name: &str, steps: &Value) -> Value {
    json!({ "name": name, "trigger": { "kind": "manual" }, "steps": steps })
}

/// A `flow/log` step.
pub(crate) fn log_step(id: &str, message: &str) -> Value {
    json!({ "id": id, "type": "flow/log", "config": { "message": message } })
}

/// A definition started by an internal event (`ticket.created`, …).
pub(crate) fn on_event(name: &str, event: &str, steps: &Value) -> Value {
    json!({ "name": name, "trigger": { "kind": "event", "event": event }, "steps": steps })
}

/// The messages of a ticket's trace, in order.
pub(crate) fn trace_messages(ticket: &Value) -> Vec<String> {
    ticket["trace"]
        .as_array()
        .unwrap_or_else(|| panic!("a ticket with a trace: {ticket:#}"))
        .iter()
        .map(|line| line["message"].as_str().expect("a message").to_owned())
        .collect()
}

/// A time as the API answers it (an RFC 3339 string), in unix milliseconds;
/// `None` for anything else, a number of milliseconds included.
pub(crate) fn ms(value: &Value) -> Option<i64> {
    value
        .as_str()?
        .parse::<jiff::Timestamp>()
        .ok()
        .map(|at| at.as_millisecond())
}
