//! The `mcp` step against a small MCP server started by the test (rmcp's
//! server side behind axum on port 0) that counts the tool calls it runs:
//! templated arguments reach the tool and its structured result is
//! published; a tool error, an unknown tool and a call that outlives its
//! timeout fail the run with one call (MCP has no idempotency key); a 503 in
//! front of the server is retried. Both backends. A result recorded from
//! the server (`tok test --record`) is replayed without calling it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};
use tok_core::ids::{AutomationId, RunId, TenantId};
use tok_engine::definitions::prepare;
use tok_engine::{Engine, EngineConfig, Registry};
use tok_store::testing::{TestDb, backends};
use tok_store::{Backend, NewConnection, RunDetail, Store};

/// What the MCP server saw.
#[derive(Default)]
struct Seen {
    /// Tools run, by name, in order (calls refused by the gate are not here).
    calls: Mutex<Vec<String>>,
    /// `Authorization` headers of every HTTP request.
    auth: Mutex<Vec<Option<String>>>,
    /// `traceparent` headers of every HTTP request.
    traceparents: Mutex<Vec<Option<String>>>,
    /// How many `tools/call` requests the gate still answers with 503.
    fail_calls: AtomicUsize,
    /// How many it did.
    refused: AtomicUsize,
}

impl Seen {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

/// Tools: `add` (structured `{sum}`), `fail` (a tool error), `slow` (sleeps
/// `ms`).
#[derive(Clone)]
struct Tools {
    seen: Arc<Seen>,
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let number = |key: &str| {
            args.get(key)
                .and_then(Value::as_i64)
                .ok_or_else(|| ErrorData::invalid_params(format!("`{key}` must be a number"), None))
        };
        let result = match request.name.as_ref() {
            "add" => {
                let (a, b) = (number("a")?, number("b")?);
                self.seen.calls.lock().unwrap().push("add".into());
                CallToolResult::structured(json!({ "sum": a + b }))
            }
            "fail" => {
                self.seen.calls.lock().unwrap().push("fail".into());
                CallToolResult::error(vec![ContentBlock::text("invoice INV-7 is locked")])
            }
            "slow" => {
                self.seen.calls.lock().unwrap().push("slow".into());
                let ms = number("ms")?;
                tokio::time::sleep(Duration::from_millis(ms as u64)).await;
                CallToolResult::success(vec![ContentBlock::text("done")])
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("there is no tool `{other}`"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}

/// In front of the MCP service: records `Authorization` and `traceparent`
/// and answers 503 to
/// the first `fail_calls` `tools/call` requests.
async fn gate(State(seen): State<Arc<Seen>>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    seen.traceparents.lock().unwrap().push(
        parts
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    );
    seen.auth.lock().unwrap().push(
        parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    );
    let is_call = serde_json::from_slice::<Value>(&bytes)
        .is_ok_and(|message| message["method"] == "tools/call");
    if is_call
        && seen
            .fail_calls
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        seen.refused.fetch_add(1, Ordering::SeqCst);
        return (StatusCode::SERVICE_UNAVAILABLE, "overloaded").into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Serves the tools at `http://127.0.0.1:<port>/mcp`.
async fn serve(seen: Arc<Seen>) -> String {
    let tools = Tools { seen: seen.clone() };
    let service = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    let app = Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(seen, gate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/mcp")
}

struct Setup {
    db: TestDb,
    store: Arc<dyn Store>,
    tenant: TenantId,
    registry: Registry,
}

impl Setup {
    async fn new(backend: Backend) -> Self {
        // The stub services listen on loopback ports chosen at random; the
        // outbound guard refuses loopback unless it is opened.
        Self::guarded(backend, "127.0.0.1/32").await
    }

    /// A setup whose outbound guard opens only `allow` (`TOK_OUTBOUND_ALLOW`).
    async fn guarded(backend: Backend, allow: &str) -> Self {
        let db = TestDb::create(backend).await;
        let store = tok_store::connect(&db.url, 10, &db.keys).await.unwrap();
        store.migrate().await.unwrap();
        let tenant = store.create_tenant("Acme", "key-hash").await.unwrap().id;
        let allow = tok_engine::OutboundAllow::parse(allow).unwrap();
        let registry = Registry::with_connectors(store.clone(), &allow);
        Self {
            db,
            store,
            tenant,
            registry,
        }
    }

    async fn connection(&self, name: &str, url: &str) {
        self.store
            .create_connection(
                &self.tenant,
                NewConnection {
                    name: name.into(),
                    service: "mcp".into(),
                    base_url: Some(url.into()),
                    credentials: json!({ "bearer": "secret-token" }),
                    rate: None,
                    burst: 1,
                    max_concurrency: None,
                    breaker_threshold: 5,
                    breaker_cooldown_ms: 30_000,
                },
            )
            .await
            .unwrap();
    }

    fn definition(config: Value) -> Vec<u8> {
        let definition = json!({
            "name": "ask the tools", "trigger": { "kind": "manual" },
            "steps": [{ "id": "st_tool", "type": "mcp", "config": config }],
            "settings": { "retry": { "max_attempts": 4, "backoff": ["50ms"] } }
        });
        serde_json::to_vec(&definition).unwrap()
    }

    async fn automation(&self, config: Value) -> AutomationId {
        let (_, version) =
            prepare(&Self::definition(config), &self.registry).unwrap_or_else(|e| panic!("{e:?}"));
        self.store
            .create_automation(&self.tenant, version)
            .await
            .unwrap()
            .id
    }

    /// Runs the automation once with `input` and waits for the end.
    async fn run(&self, automation: &AutomationId, input: Value) -> RunDetail {
        let engine = Engine::new(
            self.store.clone(),
            self.registry.clone(),
            EngineConfig {
                concurrency: 4,
                poll_interval: Duration::from_millis(20),
                ..EngineConfig::default()
            },
        );
        let running = engine.start(true).await.unwrap();
        let run = engine
            .start_run(&self.tenant, automation, input, None)
            .await
            .unwrap();
        let detail = self.finished(&run).await;
        running.shutdown().await;
        detail
    }

    async fn finished(&self, run: &RunId) -> RunDetail {
        for _ in 0..1500 {
            let d = self.store.run(&self.tenant, run).await.unwrap().unwrap();
            if matches!(d.run.status.as_str(), "completed" | "failed") {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("run {run} did not finish within 30 s");
    }

    async fn cleanup(self) {
        drop(self.registry);
        drop(self.store);
        self.db.cleanup().await;
    }
}

#[tokio::test]
async fn a_tool_gets_templated_arguments_and_its_structured_result_is_published() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        let url = serve(seen.clone()).await;
        let s = Setup::new(backend).await;
        s.connection("calculator", &url).await;
        let automation = s
            .automation(json!({ "connection": "calculator", "tool": "add",
                                "arguments": { "a": "{{x}}", "b": "{{y}}" } }))
            .await;
        let detail = s.run(&automation, json!({ "x": 2, "y": 40 })).await;

        assert_eq!(
            detail.run.status, "completed",
            "{backend:?}: {:?}",
            detail.run.error
        );
        assert_eq!(detail.context["st_tool"]["sum"], 42, "{backend:?}");
        assert_eq!(
            detail.context["st_tool"]["result"]["structuredContent"]["sum"], 42,
            "{backend:?}"
        );
        assert_eq!(seen.calls(), ["add"], "{backend:?}");
        let auth = seen.auth.lock().unwrap().clone();
        assert!(!auth.is_empty(), "{backend:?}");
        assert!(
            auth.iter()
                .all(|a| a.as_deref() == Some("Bearer secret-token")),
            "{backend:?}: credentials on every request: {auth:?}"
        );
        // Every request of the session carries the step's trace context
        // (no exporter here: the step's own span in the run's trace).
        let trace = tok_engine::traces::RunTrace::of(detail.run.id.as_str(), &detail.context);
        let wanted = trace.for_child(detail.run.id.as_str(), "0", 1);
        let traceparents = seen.traceparents.lock().unwrap().clone();
        assert!(
            traceparents
                .iter()
                .all(|t| t.as_deref() == Some(wanted.as_str())),
            "{backend:?}: {wanted} on every request: {traceparents:?}"
        );
        s.cleanup().await;
    }
}

#[tokio::test]
async fn a_tool_error_fails_the_run_without_a_retry() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        let url = serve(seen.clone()).await;
        let s = Setup::new(backend).await;
        s.connection("billing", &url).await;
        let automation = s
            .automation(json!({ "connection": "billing", "tool": "fail" }))
            .await;
        let detail = s.run(&automation, json!({})).await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        let error = detail.run.error.unwrap_or_default();
        assert!(
            error.contains("invoice INV-7 is locked"),
            "{backend:?}: {error}"
        );
        assert_eq!(seen.calls(), ["fail"], "{backend:?}");
        s.cleanup().await;
    }
}

#[tokio::test]
async fn an_unknown_tool_fails_the_run_without_a_retry() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        let url = serve(seen.clone()).await;
        let s = Setup::new(backend).await;
        s.connection("calculator", &url).await;
        let automation = s
            .automation(json!({ "connection": "calculator", "tool": "divide" }))
            .await;
        let detail = s.run(&automation, json!({})).await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        let error = detail.run.error.unwrap_or_default();
        assert!(error.contains("no tool `divide`"), "{backend:?}: {error}");
        assert!(seen.calls().is_empty(), "{backend:?}");
        s.cleanup().await;
    }
}

#[tokio::test]
async fn a_503_before_the_tool_is_retried() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        seen.fail_calls.store(2, Ordering::SeqCst);
        let url = serve(seen.clone()).await;
        let s = Setup::new(backend).await;
        s.connection("calculator", &url).await;
        let automation = s
            .automation(json!({ "connection": "calculator", "tool": "add",
                                "arguments": { "a": 1, "b": 2 } }))
            .await;
        let detail = s.run(&automation, json!({})).await;

        assert_eq!(
            detail.run.status, "completed",
            "{backend:?}: {:?}",
            detail.run.error
        );
        assert_eq!(seen.refused.load(Ordering::SeqCst), 2, "{backend:?}");
        assert_eq!(seen.calls(), ["add"], "{backend:?}");
        assert_eq!(detail.context["st_tool"]["sum"], 3, "{backend:?}");
        s.cleanup().await;
    }
}

#[tokio::test]
async fn an_unreachable_server_is_retried_until_attempts_run_out() {
    for backend in backends() {
        // A port that was just free: nothing listens on it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        drop(listener);
        let s = Setup::new(backend).await;
        s.connection("gone", &url).await;
        let automation = s
            .automation(json!({ "connection": "gone", "tool": "add",
                                "arguments": { "a": 1, "b": 2 } }))
            .await;
        let detail = s.run(&automation, json!({})).await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        let error = detail.run.error.unwrap_or_default();
        assert!(error.contains("could not connect"), "{backend:?}: {error}");
        let attempts: Vec<i32> = detail.steps.iter().map(|st| st.attempt).collect();
        assert_eq!(attempts.iter().max(), Some(&4), "{backend:?}: {attempts:?}");
        s.cleanup().await;
    }
}

#[tokio::test]
async fn an_endpoint_at_an_internal_address_is_refused_by_the_guard() {
    let s = Setup::new(Backend::Sqlite).await;
    s.connection("metadata", "http://169.254.169.254/mcp").await;
    let automation = s
        .automation(json!({ "connection": "metadata", "tool": "add" }))
        .await;
    let detail = s.run(&automation, json!({})).await;

    assert_eq!(detail.run.status, "failed");
    let error = detail.run.error.unwrap_or_default();
    assert!(error.contains("outbound_refused"), "{error}");
    assert!(error.contains("169.254.169.254:80"), "{error}");
    assert!(error.contains("TOK_OUTBOUND_ALLOW"), "{error}");
    let attempts: Vec<i32> = detail.steps.iter().map(|st| st.attempt).collect();
    assert_eq!(attempts, [1], "a refusal is terminal: {attempts:?}");
    s.cleanup().await;
}

/// A name is judged by the addresses it resolves to: `localhost` is
/// loopback, which this guard does not open, so the step fails at once with
/// the guard's refusal rather than being retried as a failed connection.
#[tokio::test]
async fn an_endpoint_named_by_a_refused_host_fails_at_once() {
    for backend in backends() {
        let s = Setup::guarded(backend, "192.0.2.1/32").await;
        s.connection("loopback", "http://localhost:9/mcp").await;
        let automation = s
            .automation(json!({ "connection": "loopback", "tool": "add",
                                "arguments": { "a": 1, "b": 2 } }))
            .await;
        let detail = s.run(&automation, json!({})).await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        let error = detail.run.error.unwrap_or_default();
        assert!(error.contains("outbound_refused"), "{backend:?}: {error}");
        assert!(error.contains("localhost"), "{backend:?}: {error}");
        assert!(!error.contains("could not connect"), "{backend:?}: {error}");
        let attempts: Vec<i32> = detail.steps.iter().map(|st| st.attempt).collect();
        assert_eq!(attempts, [1], "{backend:?}: a refusal is terminal");
        s.cleanup().await;
    }
}

#[tokio::test]
async fn a_call_past_its_timeout_is_not_sent_twice() {
    for backend in backends() {
        let seen = Arc::new(Seen::default());
        let url = serve(seen.clone()).await;
        let s = Setup::new(backend).await;
        s.connection("slowpoke", &url).await;
        let automation = s
            .automation(json!({ "connection": "slowpoke", "tool": "slow",
                                "arguments": { "ms": 3000 }, "timeoutMs": 500 }))
            .await;
        let detail = s.run(&automation, json!({})).await;

        assert_eq!(detail.run.status, "failed", "{backend:?}");
        let error = detail.run.error.unwrap_or_default();
        assert!(error.contains("500 ms"), "{backend:?}: {error}");
        assert!(error.contains("idempotency key"), "{backend:?}: {error}");
        // Wait past a retry the policy would have made (50 ms) to be sure
        // none comes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(seen.calls(), ["slow"], "{backend:?}");
        s.cleanup().await;
    }
}

#[tokio::test]
async fn a_step_without_tool_or_connection_is_rejected_at_save() {
    let s = Setup::new(Backend::Sqlite).await;
    for (config, missing) in [
        (json!({ "connection": "calculator" }), "tool"),
        (json!({ "tool": "add" }), "connection"),
        (
            json!({ "connection": "c", "tool": "add", "arguments": "a=1" }),
            "arguments",
        ),
    ] {
        let error = prepare(&Setup::definition(config), &s.registry)
            .err()
            .map(|e| format!("{e:?}"))
            .unwrap_or_default();
        assert!(error.contains(missing), "{missing}: {error}");
    }
    s.cleanup().await;
}

#[tokio::test]
async fn a_recorded_tool_result_is_replayed_without_calling_the_server() {
    use tok_engine::recorded::{Answers, Recording};
    let seen = Arc::new(Seen::default());
    let url = serve(seen.clone()).await;
    let mut s = Setup::new(Backend::Sqlite).await;
    s.connection("calculator", &url).await;
    let automation = s
        .automation(json!({ "connection": "calculator", "tool": "add",
                            "arguments": { "a": "{{x}}", "b": "{{y}}" } }))
        .await;
    let allow = tok_engine::OutboundAllow::parse("127.0.0.1/32").unwrap();
    let recording = Arc::new(Recording::new());
    s.registry
        .add_answered_connectors(s.store.clone(), &allow, Answers::Record(recording.clone()));
    let recorded = s.run(&automation, json!({ "x": 2, "y": 40 })).await;
    assert_eq!(recorded.run.status, "completed", "{:?}", recorded.run.error);
    assert_eq!(seen.calls(), ["add"]);
    assert_eq!(recording.len(), 1);

    s.registry
        .add_answered_connectors(s.store.clone(), &allow, Answers::Replay(recording));
    let replayed = s.run(&automation, json!({ "x": 2, "y": 40 })).await;
    assert_eq!(replayed.run.status, "completed", "{:?}", replayed.run.error);
    assert_eq!(replayed.context["st_tool"]["sum"], 42);
    assert_eq!(seen.calls(), ["add"], "the replay called nobody");
    s.cleanup().await;
}
