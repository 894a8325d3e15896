//! `mcp`: calls one tool (`tools/call`) on an MCP server over streamable
//! HTTP, through a connection whose `base_url` is the server's endpoint
//! and whose credentials (`{"bearer": …}` or `{"headers": {…}}`) go on every
//! HTTP request. Like `http`, it runs with no database connection held: the
//! connection's limits (rate, concurrency cap, circuit breaker) are checked
//! in one short transaction before the call and updated in another after it.
//!
//! Each attempt opens its own client session (`initialize`, then
//! `tools/call`), bounded as a whole by `timeoutMs`, and closes it in the
//! background afterwards. Outputs: `result`, the `CallToolResult` as JSON
//! (`content`, `structuredContent`, …), and, when the tool returned
//! structured content that is an object, each of its keys (`result` itself
//! is never replaced). A result with `isError: true` fails the step
//! terminally with the tool's text.
//!
//! What is retried (docs/connectors.md, "`mcp`"): a connection error, HTTP
//! 408, 425, 429 (after `Retry-After` when given), 502, 503 and 504, and
//! anything that goes wrong before `tools/call` was sent (the handshake
//! failing or timing out). MCP has no idempotency key, so once `tools/call`
//! has gone out, a timeout or a dropped connection is terminal: the server
//! may have run the tool, and tok does not run it twice by its own
//! decision. Protocol errors, an unknown tool, invalid arguments and other
//! HTTP statuses are terminal.

use std::collections::HashMap;
use std::error::Error as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ErrorData,
    Implementation, ProtocolVersion,
};
use rmcp::service::ClientInitializeError;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::{ServiceError, ServiceExt};
use serde_json::{Map, Value};
use tok_core::error::StepError;
use tok_core::limits::MAX_OUTPUT_BYTES;
use tok_store::{Admission, CallOutcome, Connection, ConnectionStore};

use crate::outbound::{Outbound, OutboundAllow, refusal_in};
use crate::recorded::Answers;
use crate::registry::{StepCall, StepHandler};

/// Default and largest per-call timeouts (handshake and tool call together).
/// The default is longer than `http`'s because tools often do real work.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;
const MAX_TIMEOUT_MS: u64 = 120_000;

/// Largest JSON response or SSE event accepted from the server. Outputs are
/// capped at 64 KiB anyway; this stops a runaway answer from being buffered
/// (rmcp reads a JSON body as a stream against this limit, and an SSE
/// stream event by event, so memory per call stays within it; what it
/// cannot bound is the number of SSE events, which the timeout ends).
const MAX_RESPONSE_BYTES: usize = 16 * MAX_OUTPUT_BYTES;

type TransportError = StreamableHttpError<reqwest::Error>;

pub(crate) struct Mcp {
    store: Arc<dyn ConnectionStore>,
    outbound: Outbound,
    client: reqwest::Client,
    answers: Answers,
}

impl Mcp {
    /// Calls go through the outbound guard with `allow`'s exceptions: the
    /// guard's client (its resolver, no proxies) and its check of the
    /// endpoint URL before each session.
    pub(crate) fn new(store: Arc<dyn ConnectionStore>, allow: &OutboundAllow) -> Self {
        Self::answered(store, allow, Answers::Live)
    }

    /// Tools answered as `answers` says: by the servers, by a recording of
    /// their results, or by the servers into one (`tok test`,
    /// `crate::recorded`).
    pub(crate) fn answered(
        store: Arc<dyn ConnectionStore>,
        allow: &OutboundAllow,
        answers: Answers,
    ) -> Self {
        let outbound = Outbound::new(allow);
        // Redirects are not followed (the guard's client follows none): a
        // 301-303 would turn the POST into a GET and lose the message, and
        // another origin would receive the credentials. The endpoint URL
        // must be the real one.
        let client = outbound.client_for(|builder| {
            // As rmcp's own client: a half-read SSE body makes a pooled
            // connection stall on reuse.
            builder.pool_max_idle_per_host(0)
        });
        Self {
            store,
            outbound,
            client,
            answers,
        }
    }
}

/// The parts of a config a call needs, checked.
#[derive(Debug)]
struct Request {
    connection: String,
    tool: String,
    arguments: Option<Map<String, Value>>,
    timeout: Duration,
}

fn parse(config: &Value) -> Result<Request, String> {
    let required = |key: &str, what: &str| {
        config
            .get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("mcp needs `{key}`: {what}"))
    };
    let connection = required(
        "connection",
        "the name of a connection whose base URL is the MCP endpoint",
    )?;
    let tool = required("tool", "the name of the tool to call")?;
    let arguments = match config.get("arguments") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(map.clone()),
        Some(_) => {
            return Err("mcp `arguments` must be an object of argument names to values".into());
        }
    };
    let timeout = super::timeout_ms(config, "mcp", DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS)?;
    Ok(Request {
        connection,
        tool,
        arguments,
        timeout,
    })
}

/// The transport settings for a connection: its endpoint, credentials and
/// the step's `traceparent` (unless the connection's headers set one).
fn transport_config(
    connection: &Connection,
    traceparent: Option<&str>,
) -> Result<StreamableHttpClientTransportConfig, StepError> {
    let bad = |what: &str| StepError::terminal(format!("connection `{}`: {what}", connection.name));
    let url = connection
        .base_url
        .as_deref()
        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
        .ok_or_else(|| bad("an mcp connection needs `base_url`: the server's MCP endpoint URL"))?;
    let c = &connection.credentials;
    if c.get("basic").is_some() {
        return Err(bad(
            "mcp takes `bearer` or `headers` credentials, not `basic`",
        ));
    }
    let mut headers = HashMap::new();
    if let Some(Value::Object(extra)) = c.get("headers") {
        for (name, value) in extra {
            if let Some(why) = crate::outbound::headers::unsent(name) {
                return Err(bad(&why));
            }
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| bad(&format!("`{name}` is not a header name")))?;
            let value =
                HeaderValue::from_str(value.as_str().unwrap_or_default()).map_err(|_| {
                    bad(&format!(
                        "the value of `{name}` is not a valid header value"
                    ))
                })?;
            headers.insert(name, value);
        }
    }
    let traceparent_header = HeaderName::from_static("traceparent");
    if let Some(Ok(value)) = traceparent.map(HeaderValue::from_str)
        && !headers.contains_key(&traceparent_header)
    {
        headers.insert(traceparent_header, value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(url)
        .custom_headers(headers)
        .max_json_response_size(MAX_RESPONSE_BYTES)
        .max_sse_event_size(MAX_RESPONSE_BYTES)
        // Re-initializing an expired session re-sends the POST that failed:
        // it could run a tool twice.
        .reinit_on_expired_session(false);
    if let Some(token) = c.get("bearer").and_then(Value::as_str) {
        if HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
            return Err(bad("the bearer token is not a valid header value"));
        }
        config = config.auth_header(token);
    }
    Ok(config)
}

/// Where a failure happened: before `tools/call` went out, any failure may
/// be retried without risk; after, only answers that say the server did not
/// take the call.
#[derive(Clone, Copy)]
enum Phase {
    Handshake,
    Call,
}

/// The HTTP status behind a transport error, when there is one. 429 and 5xx
/// come as structured metadata; other statuses only in the message
/// (`HTTP 408 Request Timeout: …`).
fn http_status(e: &TransportError) -> Option<u16> {
    match e {
        StreamableHttpError::HttpStatus(s) => Some(s.status),
        StreamableHttpError::UnexpectedServerResponse(m) => m
            .strip_prefix("HTTP ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok()),
        StreamableHttpError::AuthRequired(_) => Some(401),
        StreamableHttpError::InsufficientScope(_) => Some(403),
        StreamableHttpError::SessionExpired => Some(404),
        StreamableHttpError::Client(e) => e.status().map(|s| s.as_u16()),
        _ => None,
    }
}

/// `Retry-After` in seconds or as an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    let wait = at.as_millisecond() - tok_store::now_ms();
    Some(Duration::from_millis(wait.max(0) as u64))
}

/// Classifies a failure of the HTTP transport (the request did not get a
/// JSON-RPC answer).
fn classify_transport(
    error: &(dyn std::error::Error + Send + Sync + 'static),
    phase: Phase,
    what: &str,
) -> (StepError, CallOutcome) {
    // rmcp's `Client` variant does not give the HTTP client's error as its
    // source, so the chain is walked from both: the guard's refusal of a
    // name comes back from the resolver as the client's connect error.
    let client = match error.downcast_ref::<TransportError>() {
        Some(StreamableHttpError::Client(inner)) => refusal_in(inner),
        _ => None,
    };
    if let Some(refused) = refusal_in(error).or(client) {
        // The guard refused the address before anything was sent.
        return (
            StepError::terminal(format!("{what}: {refused}")),
            CallOutcome::Answered,
        );
    }
    let Some(e) = error.downcast_ref::<TransportError>() else {
        return after_send(phase, format!("{what}: {error}"));
    };
    let message = format!("{what}: {e}");
    if let Some(status) = http_status(e) {
        return match status {
            429 => {
                let after = match e {
                    StreamableHttpError::HttpStatus(s) => {
                        s.retry_after.as_deref().and_then(retry_after)
                    }
                    _ => None,
                };
                let message = format!("{what}: HTTP 429, too many requests");
                let error = match after {
                    Some(after) => StepError::retry_after(message, after),
                    None => StepError::retryable(message),
                };
                (error, CallOutcome::Unavailable)
            }
            408 | 425 | 502 | 503 | 504 => {
                (StepError::retryable(message), CallOutcome::Unavailable)
            }
            s if s >= 500 => (StepError::terminal(message), CallOutcome::Unavailable),
            _ => (StepError::terminal(message), CallOutcome::Answered),
        };
    }
    match e {
        StreamableHttpError::Client(inner) if inner.is_connect() => (
            StepError::retryable(format!("{what}: could not connect: {inner}")),
            CallOutcome::Unavailable,
        ),
        StreamableHttpError::Client(_)
        | StreamableHttpError::Io(_)
        | StreamableHttpError::Sse(_)
        | StreamableHttpError::UnexpectedEndOfStream
        | StreamableHttpError::TransportChannelClosed
        | StreamableHttpError::SessionRecoveryTimeout => after_send(phase, message),
        // Malformed answers, wrong content types, oversized bodies,
        // reserved headers: trying again gives the same answer.
        _ => (StepError::terminal(message), CallOutcome::Answered),
    }
}

/// A connection that failed in a way that does not say whether the server
/// acted: retryable before `tools/call` was sent, terminal after.
fn after_send(phase: Phase, message: String) -> (StepError, CallOutcome) {
    let error = match phase {
        Phase::Handshake => StepError::retryable(format!("{message} (before tools/call was sent)")),
        Phase::Call => StepError::terminal(format!(
            "{message}; tools/call was already sent and MCP has no idempotency key, \
             so it is not repeated automatically (the tool may have run)"
        )),
    };
    (error, CallOutcome::Unavailable)
}

fn json_rpc_error(what: &str, e: &ErrorData) -> (StepError, CallOutcome) {
    let hint = match e.code.0 {
        -32601 => " (the server does not support this method)",
        -32602 => " (unknown tool or invalid arguments)",
        _ => "",
    };
    let mut message = format!("{what}: error {}: {}{hint}", e.code.0, e.message);
    if let Some(data) = &e.data {
        message.push_str(": ");
        message.extend(data.to_string().chars().take(300));
    }
    (StepError::terminal(message), CallOutcome::Answered)
}

fn classify_handshake(e: &ClientInitializeError, what: &str) -> (StepError, CallOutcome) {
    match e {
        ClientInitializeError::TransportError { error, .. } => {
            classify_transport(error.error.as_ref(), Phase::Handshake, what)
        }
        ClientInitializeError::JsonRpcError(data) => json_rpc_error(what, data),
        ClientInitializeError::ConnectionClosed(_) => {
            after_send(Phase::Handshake, format!("{what}: {e}"))
        }
        other => (
            StepError::terminal(format!("{what}: {other}")),
            CallOutcome::Answered,
        ),
    }
}

fn classify_call(e: &ServiceError, what: &str) -> (StepError, CallOutcome) {
    match e {
        ServiceError::McpError(data) => json_rpc_error(what, data),
        ServiceError::TransportSend(error) => {
            classify_transport(error.error.as_ref(), Phase::Call, what)
        }
        ServiceError::TransportClosed | ServiceError::Timeout { .. } => {
            after_send(Phase::Call, format!("{what}: {e}"))
        }
        other => {
            let message = match other.source() {
                Some(source) => format!("{what}: {other}: {source}"),
                None => format!("{what}: {other}"),
            };
            (StepError::terminal(message), CallOutcome::Answered)
        }
    }
}

/// The outputs of a successful result, or the tool's own error.
fn outputs(result: CallToolResult, tool: &str) -> Result<Map<String, Value>, StepError> {
    let json = serde_json::to_value(&result)
        .map_err(|e| StepError::terminal(format!("tool `{tool}`: unreadable result: {e}")))?;
    if result.is_error == Some(true) {
        let text: Vec<&str> = json
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect();
        let text = if text.is_empty() {
            result
                .structured_content
                .as_ref()
                .map_or_else(|| "no message".to_owned(), Value::to_string)
        } else {
            text.join("\n")
        };
        return Err(StepError::terminal(format!(
            "tool `{tool}` reported an error: {text}"
        )));
    }
    let mut out = Map::new();
    if let Some(Value::Object(structured)) = &result.structured_content {
        out.extend(structured.clone());
    }
    out.insert("result".into(), json);
    Ok(out)
}

/// How the `tools/call` part of an attempt ended.
enum Called {
    Answer(Result<CallToolResult, ServiceError>),
    /// The handshake used up the timeout; the call was not started.
    NotSent,
    /// The call was sent and no answer came within the timeout.
    TimedOut,
}

impl Mcp {
    /// Opens a session, calls the tool and maps the answer to outputs or a
    /// classified error.
    async fn call(
        &self,
        step: Option<&str>,
        request: &Request,
        connection: &Connection,
        traceparent: Option<&str>,
    ) -> (Result<Map<String, Value>, StepError>, CallOutcome) {
        if let Answers::Replay(recording) = &self.answers {
            let result = recording
                .replay_tool(step, &request.tool)
                .and_then(|json| {
                    serde_json::from_value::<CallToolResult>(json).map_err(|e| {
                        format!(
                            "the recorded result of tools/call `{}` is not an MCP \
                             CallToolResult: {e}",
                            request.tool
                        )
                    })
                })
                .map_err(StepError::terminal)
                .and_then(|result| outputs(result, &request.tool));
            return (result, CallOutcome::Answered);
        }
        let config = match transport_config(connection, traceparent) {
            Ok(c) => c,
            Err(e) => return (Err(e), CallOutcome::Answered),
        };
        let endpoint = format!("MCP server `{}`", connection.name);
        // An address written in the endpoint URL is judged here (the
        // client's resolver sees only names), and a named exception's
        // other ports.
        match reqwest::Url::parse(config.uri.as_ref()) {
            Ok(url) => {
                if let Err(refused) = self.outbound.check_before_send(&url).await {
                    return (
                        Err(StepError::terminal(format!("{endpoint}: {refused}"))),
                        CallOutcome::Answered,
                    );
                }
            }
            Err(e) => {
                return (
                    Err(StepError::terminal(format!(
                        "{endpoint}: the base_url is not a URL: {e}"
                    ))),
                    CallOutcome::Answered,
                );
            }
        }
        let timeout = request.timeout;
        let deadline = Instant::now() + timeout;
        let transport = StreamableHttpClientTransport::with_client(self.client.clone(), config);
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("tok", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE);

        let session = match tokio::time::timeout(timeout, info.serve(transport)).await {
            Ok(Ok(session)) => session,
            Ok(Err(e)) => {
                let (error, outcome) = classify_handshake(&e, &format!("{endpoint}: initialize"));
                return (Err(error), outcome);
            }
            Err(_) => {
                return (
                    Err(StepError::retryable(format!(
                        "{endpoint}: no answer to initialize within {} ms (before tools/call was sent)",
                        timeout.as_millis()
                    ))),
                    CallOutcome::Unavailable,
                );
            }
        };
        // A timer that is already due may still let the call out before it
        // fires; below a few milliseconds, do not start the call at all.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let called = if remaining < Duration::from_millis(5) {
            Called::NotSent
        } else {
            let mut params = CallToolRequestParams::new(request.tool.clone());
            if let Some(arguments) = &request.arguments {
                params = params.with_arguments(arguments.clone());
            }
            match tokio::time::timeout(remaining, session.call_tool(params)).await {
                Ok(answer) => Called::Answer(answer),
                Err(_) => Called::TimedOut,
            }
        };
        // Close the session (HTTP DELETE) without making the step wait.
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), session.cancel()).await;
        });

        let what = format!("{endpoint}: tools/call `{}`", request.tool);
        match called {
            Called::Answer(Ok(result)) => {
                if let Answers::Record(recording) = &self.answers
                    && let Ok(json) = serde_json::to_value(&result)
                {
                    recording.record_tool(step, &request.tool, json);
                }
                (outputs(result, &request.tool), CallOutcome::Answered)
            }
            Called::Answer(Err(e)) => {
                let (error, outcome) = classify_call(&e, &what);
                (Err(error), outcome)
            }
            Called::NotSent => (
                Err(StepError::retryable(format!(
                    "{endpoint}: initialize used the whole {} ms timeout \
                     (before tools/call was sent)",
                    timeout.as_millis()
                ))),
                CallOutcome::Unavailable,
            ),
            Called::TimedOut => (
                Err(StepError::terminal(format!(
                    "{what}: no answer within {} ms; tools/call was sent and MCP has no \
                     idempotency key, so it is not repeated automatically (the tool may have run)",
                    timeout.as_millis()
                ))),
                CallOutcome::Unavailable,
            ),
        }
    }
}

#[async_trait]
impl StepHandler for Mcp {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        let request = parse(&call.config).map_err(StepError::terminal)?;
        let connection = self
            .store
            .connection(&call.tenant_id, &request.connection)
            .await
            .map_err(super::connection_unreadable)?
            .ok_or_else(|| {
                StepError::terminal(format!(
                    "connection `{}` does not exist",
                    request.connection
                ))
            })?;
        let admission = self
            .store
            .admit(&call.tenant_id, &connection.id, call.job_id, call.lease_ms)
            .await
            .map_err(|e| StepError::retryable(format!("connection storage unavailable: {e}")))?;
        if let Admission::Wait {
            delay_ms,
            reason,
            kind,
        } = admission
        {
            metrics::counter!("tok_connector_deferred_total", "connector" => "mcp").increment(1);
            return Err(StepError::deferred(
                kind,
                format!("connection `{}`: {reason}", connection.name),
                Duration::from_millis(delay_ms.max(1) as u64),
            ));
        }
        if !call.lease.held() {
            // The connection's slot expires with the lease.
            return Err(crate::registry::Lease::ran_out(&call.step_id));
        }
        let started = Instant::now();
        let (result, outcome) = self
            .call(
                Some(&call.step_id),
                &request,
                &connection,
                call.traceparent.as_deref(),
            )
            .await;
        let outcome_label = match &result {
            Ok(_) => "ok",
            Err(e) if e.is_retryable() => "retryable",
            Err(_) => "terminal",
        };
        metrics::counter!("tok_connector_calls_total", "connector" => "mcp", "outcome" => outcome_label)
            .increment(1);
        metrics::histogram!(
            "tok_connector_call_seconds",
            "connector" => "mcp",
            "tenant" => call.tenant_id.to_string(),
            "connection" => connection.name.clone()
        )
        .record(started.elapsed().as_secs_f64());
        if let Err(e) = self
            .store
            .release(&call.tenant_id, &connection.id, call.job_id, outcome)
            .await
        {
            // The slot expires with the lease; the breaker misses one outcome.
            tracing::warn!(connection = %connection.name, error = %e, "could not release a connection slot");
        }
        result
    }

    fn config_keys(&self) -> Option<&'static [&'static str]> {
        Some(&["connection", "tool", "arguments", "timeoutMs"])
    }

    fn validate(&self, config: &Value) -> Result<(), String> {
        let mut config = config.clone();
        // Templated values are checked when rendered.
        if let Some(map) = config.as_object_mut() {
            for key in ["arguments", "timeoutMs"] {
                if map
                    .get(key)
                    .and_then(Value::as_str)
                    .is_some_and(|s| s.contains("{{"))
                {
                    map.remove(key);
                }
            }
        }
        parse(&config).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_needs_a_connection_and_a_tool() {
        let ok =
            parse(&json!({ "connection": "ai", "tool": "add", "arguments": { "a": 1 } })).unwrap();
        assert_eq!(ok.tool, "add");
        assert_eq!(ok.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert!(
            parse(&json!({ "tool": "add" }))
                .unwrap_err()
                .contains("connection")
        );
        assert!(
            parse(&json!({ "connection": "ai", "tool": " " }))
                .unwrap_err()
                .contains("tool")
        );
        assert!(parse(&json!({ "connection": "ai", "tool": "add", "arguments": [1] })).is_err());
        assert!(parse(&json!({ "connection": "ai", "tool": "add", "timeoutMs": 0 })).is_err());
    }

    #[test]
    fn statuses_in_messages_are_read() {
        let e = TransportError::UnexpectedServerResponse("HTTP 408 Request Timeout: slow".into());
        assert_eq!(http_status(&e), Some(408));
        let e = TransportError::UnexpectedServerResponse("garbage".into());
        assert_eq!(http_status(&e), None);
        let (error, outcome) = classify_transport(
            &TransportError::UnexpectedServerResponse("HTTP 425 Too Early: x".into()),
            Phase::Call,
            "x",
        );
        assert!(error.is_retryable());
        assert_eq!(outcome, CallOutcome::Unavailable);
        let (error, _) = classify_transport(
            &TransportError::UnexpectedServerResponse("HTTP 400 Bad Request: x".into()),
            Phase::Handshake,
            "x",
        );
        assert!(!error.is_retryable());
    }

    #[test]
    fn a_429_waits_for_retry_after() {
        use rmcp::transport::streamable_http_client::HttpStatusError;
        let e = TransportError::HttpStatus(HttpStatusError::new(429, Some("2".into())));
        let (error, outcome) = classify_transport(&e, Phase::Call, "x");
        assert_eq!(
            error,
            StepError::retry_after("x: HTTP 429, too many requests", Duration::from_secs(2))
        );
        assert_eq!(outcome, CallOutcome::Unavailable);
        let e = TransportError::HttpStatus(HttpStatusError::new(500, None));
        assert!(!classify_transport(&e, Phase::Call, "x").0.is_retryable());
    }

    #[test]
    fn a_lost_connection_is_retried_only_before_the_call() {
        let lost = TransportError::UnexpectedEndOfStream;
        assert!(
            classify_transport(&lost, Phase::Handshake, "x")
                .0
                .is_retryable()
        );
        let (error, _) = classify_transport(&lost, Phase::Call, "x");
        assert!(!error.is_retryable());
        assert!(error.message().contains("idempotency"));
    }
}
