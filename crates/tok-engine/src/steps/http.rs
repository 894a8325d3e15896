//! `http`: calls a URL, through a connection (credentials, rate limit,
//! concurrency cap, circuit breaker) or directly. Runs with no database
//! connection held; the connection's limits are checked in one short
//! transaction before the call and updated in another after it. The same
//! call ([`Http::call`]) fetches dashboard widgets' data (`crate::widgets`).
//! Every call goes through the outbound guard (`crate::outbound`): internal
//! addresses are refused on every hop, the answer is read against the byte
//! budget (64 KiB, `MAX_OUTPUT_BYTES`), and a call through a connection
//! stays on its base URL's origin (`origin_mismatch` otherwise).
//!
//! A request goes where its URL says, and nowhere else: headers that name
//! another destination or change the framing (`Host`, `Forwarded`,
//! `X-Forwarded-Host`, hop-by-hop headers, …: [`headers::UNSENT`]) are
//! refused, at save when written and at the call when rendered, whether or
//! not the request carries a connection's credentials. Methods are the
//! usual seven ([`METHODS`]): `TRACE` would echo a connection's credentials
//! back into the run's outputs, `CONNECT` opens a tunnel.
//!
//! Every attempt sends `Idempotency-Key: <run id>:<path>`, the same on every
//! retry. What is retried (docs/connectors.md): a connection error, 5xx, 408, 425,
//! 429 (after `Retry-After` when given). 400, 401, 403, 404 and other 4xx are
//! terminal. A timeout before the request went out is retried; a timeout
//! after it went out is retried only for idempotent methods (GET, HEAD, PUT,
//! DELETE, OPTIONS): a POST that may have been acted on is not sent twice by
//! tok's own decision.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde_json::{Map, Value, json};
use tok_core::error::StepError;
use tok_core::ids::{JobId, TenantId};
use tok_core::limits::MAX_OUTPUT_BYTES;
use tok_store::{Admission, CallOutcome, Connection, ConnectionStore};

use crate::outbound::{Exchange, Outbound, OutboundAllow, SendError, body, headers, origin};
use crate::recorded::Answers;
use crate::registry::{StepCall, StepHandler};

/// Default and largest per-call timeouts.
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
const MAX_TIMEOUT_MS: u64 = 120_000;

pub(crate) struct Http {
    store: Arc<dyn ConnectionStore>,
    outbound: Outbound,
    answers: Answers,
}

impl Http {
    /// Calls go through the outbound guard with `allow`'s exceptions.
    pub(crate) fn new(store: Arc<dyn ConnectionStore>, allow: &OutboundAllow) -> Self {
        Self::answered(store, allow, Answers::Live)
    }

    /// Calls answered as `answers` says: by the services (through the
    /// guard), by a recording, or by the services into a recording
    /// (`tok test`, `crate::recorded`).
    pub(crate) fn answered(
        store: Arc<dyn ConnectionStore>,
        allow: &OutboundAllow,
        answers: Answers,
    ) -> Self {
        Self {
            store,
            outbound: Outbound::new(allow),
            answers,
        }
    }
}

/// Who makes a call: a step (its id, which recorded answers are matched
/// by; the `Idempotency-Key` every attempt sends; the run's trace), or
/// nobody in particular (a widget: `Caller::default()`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Caller<'a> {
    pub(crate) step: Option<&'a str>,
    pub(crate) idempotency_key: Option<&'a str>,
    pub(crate) traceparent: Option<&'a str>,
    /// The worker's hold on the step's job, checked right before the send.
    pub(crate) lease: Option<&'a crate::registry::Lease>,
}

/// How much of an error answer's body its message shows.
const SNIPPET_BYTES: usize = 300;

/// The parts of a config a call needs, checked.
struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<Value>,
    timeout: Duration,
}

/// The methods an `http` step (and a widget, GET alone) sends.
pub(crate) const METHODS: [Method; 7] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::OPTIONS,
];

/// A method as written, if tok sends it.
fn method(written: &str) -> Result<Method, String> {
    let method = Method::from_bytes(written.trim().to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("http `method` `{written}` is not an HTTP method"))?;
    if !METHODS.contains(&method) {
        return Err(format!(
            "http `method` `{written}` is not one tok sends: expected one of {} (`TRACE` would \
             echo a connection's credentials into the run, `CONNECT` opens a tunnel)",
            METHODS.map(|m| m.to_string()).join(", ")
        ));
    }
    Ok(method)
}

fn parse(config: &Value, base_url: Option<&str>) -> Result<Request, String> {
    let method = match config.get("method").and_then(Value::as_str) {
        None => Method::GET,
        Some(m) => method(m)?,
    };
    let url = config
        .get("url")
        .and_then(Value::as_str)
        .filter(|u| !u.trim().is_empty())
        .ok_or("http needs `url`: an absolute URL, or a path under the connection's base URL")?;
    let url = match base_url {
        Some(base) if !url.starts_with("http://") && !url.starts_with("https://") => {
            format!(
                "{}/{}",
                base.trim_end_matches('/'),
                url.trim_start_matches('/')
            )
        }
        _ => url.to_owned(),
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "http `url` `{url}` must start with http:// or https://"
        ));
    }
    let headers = match config.get("headers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), value)
            })
            .collect(),
        Some(_) => return Err("http `headers` must be an object of header names to values".into()),
    };
    if let Some(why) = headers.iter().find_map(|(name, _)| headers::unsent(name)) {
        return Err(why);
    }
    let timeout = super::timeout_ms(config, "http", DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS)?;
    Ok(Request {
        method,
        url,
        headers,
        body: config.get("body").filter(|b| !b.is_null()).cloned(),
        timeout,
    })
}

fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
    )
}

/// Headers the connection's credentials add to every call.
fn credential_headers(connection: &Connection) -> Result<HeaderMap, StepError> {
    let mut headers = HeaderMap::new();
    let bad = |what: &str| StepError::terminal(format!("connection `{}`: {what}", connection.name));
    let c = &connection.credentials;
    if let Some(token) = c.get("bearer").and_then(Value::as_str) {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| bad("the bearer token is not a valid header value"))?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    if let Some(basic) = c.get("basic") {
        use std::io::Write as _;
        let user = basic
            .get("user")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let password = basic
            .get("password")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut raw = Vec::new();
        let _ = write!(raw, "{user}:{password}");
        let value = HeaderValue::from_str(&format!("Basic {}", base64(&raw)))
            .map_err(|_| bad("basic credentials are not valid"))?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    if let Some(Value::Object(extra)) = c.get("headers") {
        for (name, value) in extra {
            if let Some(why) = headers::unsent(name) {
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
    Ok(headers)
}

/// Standard base64 (for `Authorization: Basic`), to avoid a dependency for
/// one header.
fn base64(input: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `Retry-After` in seconds or as an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    let wait = at.as_millisecond() - tok_store::now_ms();
    Some(Duration::from_millis(wait.max(0) as u64))
}

impl Http {
    /// Sends the request through the guard and maps the answer to outputs
    /// or a classified error. The body is read against the byte budget.
    async fn send(
        &self,
        caller: Caller<'_>,
        request: Request,
        connection: Option<&Connection>,
    ) -> (Result<Map<String, Value>, StepError>, CallOutcome) {
        let url = match Url::parse(&request.url) {
            Ok(url) if url.has_host() => url,
            _ => {
                let e = StepError::terminal(format!(
                    "http `url` `{}` is not an absolute URL with a host",
                    request.url
                ));
                return (Err(e), CallOutcome::Answered);
            }
        };
        let credentials_origin = match connection.map(|c| origin::for_call(c, &url)).transpose() {
            Ok(origin) => origin.flatten(),
            Err(message) => return (Err(StepError::terminal(message)), CallOutcome::Answered),
        };
        let mut headers = match connection.map(credential_headers).transpose() {
            Ok(h) => h.unwrap_or_default(),
            Err(e) => return (Err(e), CallOutcome::Answered),
        };
        for (name, value) in &request.headers {
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                (Ok(n), Ok(v)) => {
                    headers.insert(n, v);
                }
                _ => {
                    let e =
                        StepError::terminal(format!("header `{name}` is not a valid HTTP header"));
                    return (Err(e), CallOutcome::Answered);
                }
            }
        }
        let Caller {
            step,
            idempotency_key,
            traceparent,
            lease,
        } = caller;
        if let Some(Ok(key)) = idempotency_key.map(HeaderValue::from_str) {
            headers.insert("idempotency-key", key);
        }
        // The run's trace, unless the automation sends a trace context of
        // its own.
        if let Some(Ok(value)) = traceparent.map(HeaderValue::from_str)
            && !headers.contains_key("traceparent")
        {
            headers.insert("traceparent", value);
        }
        let body = match &request.body {
            Some(Value::String(text)) => Some(text.clone().into_bytes()),
            Some(json) => {
                if !headers.contains_key(reqwest::header::CONTENT_TYPE) {
                    headers.insert(
                        reqwest::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                }
                Some(json.to_string().into_bytes())
            }
            None => None,
        };
        let method = request.method.clone();
        let called = url.clone();
        let exchange = Exchange {
            method: method.clone(),
            url,
            headers,
            body,
            timeout: request.timeout,
            credentials_origin,
            lease: lease.cloned(),
        };
        let sent = match &self.answers {
            Answers::Live => self.outbound.send(exchange).await,
            Answers::Replay(recording) => match recording.replay(step, &method, &called) {
                Ok(response) => Ok(response),
                Err(missing) => return (Err(StepError::terminal(missing)), CallOutcome::Answered),
            },
            Answers::Record(recording) => match self.outbound.send(exchange).await {
                // One byte past the budget is kept, so that a replay of an
                // answer too large fails as the call did.
                Ok(answer) => recording
                    .record(step, &method, &called, answer, MAX_OUTPUT_BYTES + 1)
                    .await
                    .map_err(SendError::Http),
                Err(e) => Err(e),
            },
        };
        // A live answer is shown under the URL it came from (after its
        // redirects); a replayed or recorded one, rebuilt from bytes, under
        // the URL called.
        let answered_url = match (&sent, &self.answers) {
            (Ok(response), Answers::Live) => response.url().clone(),
            _ => called,
        };
        let response = match sent {
            Ok(r) => r,
            Err(SendError::Refused(refused)) => {
                return (
                    Err(StepError::terminal(refused.to_string())),
                    CallOutcome::Answered,
                );
            }
            Err(SendError::Redirect(message)) => {
                return (Err(StepError::terminal(message)), CallOutcome::Answered);
            }
            Err(SendError::LeaseRanOut) => {
                // Not sent: nothing for the breaker; the connection's slot
                // expires with the lease.
                let step = step.unwrap_or("http");
                return (
                    Err(crate::registry::Lease::ran_out(step)),
                    CallOutcome::Answered,
                );
            }
            Err(SendError::Http(e)) => {
                return (
                    Err(classify_send_error(&e, &method, request.timeout)),
                    CallOutcome::Unavailable,
                );
            }
        };
        let status = response.status();
        let response_headers = response.headers().clone();
        let code = status.as_u16();
        let answered = format!("{method} {answered_url} answered {status}");
        if code == 429 {
            let message = format!("{answered}: too many requests");
            return match retry_after(&response_headers) {
                Some(after) => (
                    Err(StepError::retry_after(message, after)),
                    CallOutcome::Unavailable,
                ),
                None => (Err(StepError::retryable(message)), CallOutcome::Unavailable),
            };
        }
        if status.is_server_error() || status.is_client_error() {
            // Only what the message shows is read.
            let snippet = match body::prefix(response, SNIPPET_BYTES).await {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(_) => String::new(),
            };
            let message = format!("{answered}: {snippet}");
            return if status.is_server_error() || code == 408 || code == 425 {
                (Err(StepError::retryable(message)), CallOutcome::Unavailable)
            } else {
                (Err(StepError::terminal(message)), CallOutcome::Answered)
            };
        }
        let announced = response.content_length();
        let bounded = match body::read(response, MAX_OUTPUT_BYTES).await {
            Ok(b) => b,
            Err(e) => {
                return (
                    Err(classify_send_error(&e, &method, request.timeout)),
                    CallOutcome::Unavailable,
                );
            }
        };
        if !bounded.complete {
            let size = match announced {
                Some(n) => format!("{n} bytes (its Content-Length)"),
                None => format!("more than {MAX_OUTPUT_BYTES} bytes"),
            };
            let e = StepError::terminal(format!(
                "output_too_large: {answered} with {size}; tok reads at most {MAX_OUTPUT_BYTES} \
                 bytes of an answer (the byte budget) and stopped reading there"
            ));
            return (Err(e), CallOutcome::Answered);
        }
        let bytes = bounded.bytes;
        let is_json = response_headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("json"));
        let body = if is_json {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        } else {
            Value::String(String::from_utf8_lossy(&bytes).into_owned())
        };
        let mut headers_out = Map::new();
        for (name, value) in &response_headers {
            if let Ok(v) = value.to_str() {
                headers_out.insert(name.as_str().to_owned(), json!(v));
            }
        }
        let mut out = Map::new();
        out.insert("status".into(), json!(code));
        out.insert("headers".into(), Value::Object(headers_out));
        out.insert("body".into(), body);
        (Ok(out), CallOutcome::Answered)
    }
}

fn classify_send_error(e: &reqwest::Error, method: &Method, timeout: Duration) -> StepError {
    let what = format!(
        "{method} {}",
        e.url().map(|u| u.as_str()).unwrap_or("the URL")
    );
    if e.is_builder() {
        return StepError::terminal(format!("{what}: the request could not be built: {e}"));
    }
    if e.is_connect() {
        return StepError::retryable(format!("{what}: could not connect: {e}"));
    }
    if e.is_timeout() {
        let message = format!("{what}: no answer within {} ms", timeout.as_millis());
        return if idempotent(method) {
            StepError::retryable(message)
        } else {
            StepError::terminal(format!(
                "{message}; the request was sent, so it is not repeated automatically \
                 (the service may have acted on it)"
            ))
        };
    }
    if idempotent(method) {
        StepError::retryable(format!("{what}: {e}"))
    } else {
        StepError::terminal(format!(
            "{what}: the connection failed after the request was sent: {e}"
        ))
    }
}

impl Http {
    /// One call as `config` (an `http` step's config) describes it, through
    /// its `connection` when it names one: the connection's limits are
    /// checked in one short transaction before the call (holding a slot
    /// under `slot`, for `lease_ms` at most) and fed its outcome in another
    /// after it; no database connection is held while the call is out.
    pub(crate) async fn call(
        &self,
        tenant: &TenantId,
        config: &Value,
        slot: JobId,
        lease_ms: i64,
        caller: Caller<'_>,
    ) -> Result<Map<String, Value>, StepError> {
        let connection = match config.get("connection").and_then(Value::as_str) {
            Some(name) => Some(
                self.store
                    .connection(tenant, name)
                    .await
                    .map_err(super::connection_unreadable)?
                    .ok_or_else(|| {
                        StepError::terminal(format!("connection `{name}` does not exist"))
                    })?,
            ),
            None => None,
        };
        let request = parse(
            config,
            connection.as_ref().and_then(|c| c.base_url.as_deref()),
        )
        .map_err(StepError::terminal)?;
        if let Some(c) = &connection {
            let admission = self
                .store
                .admit(tenant, &c.id, slot, lease_ms)
                .await
                .map_err(|e| {
                    StepError::retryable(format!("connection storage unavailable: {e}"))
                })?;
            if let Admission::Wait {
                delay_ms,
                reason,
                kind,
            } = admission
            {
                metrics::counter!("tok_connector_deferred_total", "connector" => "http")
                    .increment(1);
                return Err(StepError::deferred(
                    kind,
                    format!("connection `{}`: {reason}", c.name),
                    Duration::from_millis(delay_ms.max(1) as u64),
                ));
            }
        }
        let started = Instant::now();
        let (result, outcome) = self.send(caller, request, connection.as_ref()).await;
        let outcome_label = match &result {
            Ok(_) => "ok",
            Err(e) if e.is_retryable() => "retryable",
            Err(_) => "terminal",
        };
        metrics::counter!("tok_connector_calls_total", "connector" => "http", "outcome" => outcome_label)
            .increment(1);
        // Per connection by its name (docs/operations.md, "Metrics": the
        // p95 of each tenant's connection); a call without one counts under
        // `connection=""`.
        let connection_name = connection.as_ref().map_or("", |c| c.name.as_str());
        metrics::histogram!(
            "tok_connector_call_seconds",
            "connector" => "http",
            "tenant" => tenant.to_string(),
            "connection" => connection_name.to_owned()
        )
        .record(started.elapsed().as_secs_f64());
        if let Some(c) = &connection
            && let Err(e) = self.store.release(tenant, &c.id, slot, outcome).await
        {
            // The slot expires with the lease; the breaker misses one outcome.
            tracing::warn!(connection = %c.name, error = %e, "could not release a connection slot");
        }
        result
    }
}

/// Checks an `http` config as far as it can be before it is rendered (a
/// templated URL or method is checked when it is; header names are never
/// rendered).
pub(crate) fn check(config: &Value) -> Result<(), String> {
    check_config(config).map_err(|e| e.message)
}

/// [`check`], naming the key of the config a problem concerns.
fn check_config(config: &Value) -> Result<(), crate::registry::ConfigError> {
    let at = |key: String| move |message: String| crate::registry::ConfigError { key, message };
    if let Some(Value::Object(headers)) = config.get("headers")
        && let Some((name, why)) = headers
            .keys()
            .find_map(|name| headers::unsent(name).map(|why| (name, why)))
    {
        return Err(at(format!("headers.{name}"))(why));
    }
    if let Some(written) = config.get("method").and_then(Value::as_str)
        && !written.contains("{{")
    {
        method(written).map_err(at("method".into()))?;
    }
    let base = config
        .get("connection")
        .map(|_| "https://connection.invalid");
    let url = config
        .get("url")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if url.contains("{{") {
        return Ok(());
    }
    parse(config, base).map(|_| ()).map_err(at(String::new()))
}

#[async_trait]
impl StepHandler for Http {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        self.call(
            &call.tenant_id,
            &call.config,
            call.job_id,
            call.lease_ms,
            Caller {
                step: Some(&call.step_id),
                idempotency_key: Some(&call.idempotency_key),
                traceparent: call.traceparent.as_deref(),
                lease: Some(&call.lease),
            },
        )
        .await
    }

    fn config_keys(&self) -> Option<&'static [&'static str]> {
        Some(&[
            "connection",
            "method",
            "url",
            "headers",
            "body",
            "timeoutMs",
        ])
    }

    fn validate(&self, config: &Value) -> Result<(), String> {
        check(config)
    }

    fn check_config(&self, config: &Value) -> Result<(), crate::registry::ConfigError> {
        check_config(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
    }

    #[test]
    fn no_header_sends_a_request_elsewhere_and_no_method_echoes_it() {
        for name in [
            "Host",
            "host",
            "X-Forwarded-Host",
            "Forwarded",
            "Transfer-Encoding",
        ] {
            let config =
                json!({ "url": "https://a.example/", "headers": { name: "evil.example" } });
            let error = parse(&config, None).err().expect(name);
            assert!(error.contains(&format!("`{name}` is not sent")), "{error}");
            let error = check_config(&config).unwrap_err();
            assert_eq!(error.key, format!("headers.{name}"));
            // Also under a templated URL, which is judged at the call.
            let templated = json!({ "url": "https://{{h}}/", "headers": { name: "x" } });
            assert!(check(&templated).is_err(), "{name}");
        }
        assert!(
            parse(
                &json!({ "url": "https://a.example/", "headers": { "X-Api": "1" } }),
                None
            )
            .is_ok()
        );
        for m in ["TRACE", "trace", "CONNECT", "PROPFIND"] {
            let config = json!({ "url": "https://a.example/", "method": m });
            let error = parse(&config, None).err().expect(m);
            assert!(error.contains("not one tok sends"), "{error}");
            assert_eq!(check_config(&config).unwrap_err().key, "method");
        }
        for m in ["get", "HEAD", "POST", "put", "PATCH", "DELETE", "OPTIONS"] {
            assert!(
                parse(&json!({ "url": "https://a.example/", "method": m }), None).is_ok(),
                "{m}"
            );
        }
        // A templated method is judged at the call (with a templated URL).
        assert!(check(&json!({ "url": "https://{{h}}/", "method": "{{m}}" })).is_ok());
    }

    #[test]
    fn relative_urls_join_the_connection_base() {
        let r = parse(
            &json!({ "url": "/invoices" }),
            Some("https://api.example.com/v1/"),
        )
        .unwrap();
        assert_eq!(r.url, "https://api.example.com/v1/invoices");
        assert!(parse(&json!({ "url": "/invoices" }), None).is_err());
        assert!(parse(&json!({ "url": "x", "method": "NOT A METHOD" }), None).is_err());
        assert!(parse(&json!({ "url": "https://a", "timeoutMs": 0 }), None).is_err());
    }
}
