//! Signals (docs/workflows.md, "Signals about a ticket: `subject`"): `POST
//! /api/signals {key, subject?, payload}` resumes, in one transaction,
//! every waiting `wait_for_event` of the tenant on that key about the same
//! subject (a ticket id of the tenant; a signal without one resumes only
//! waits without one) whose `where` holds over the payload, or buffers the
//! signal for the lookback window (`TOK_SIGNAL_LOOKBACK`) when none does. A
//! subject that is not one of the tenant's tickets is a 400
//! `unknown_subject`, the same for another tenant's ticket as for one that
//! does not exist. An `Idempotency-Key` header makes a repeat answer the
//! first send's answer. A tenant sends at most its
//! `settings.limits.signalsPerSecond` (100 a second, bursts of 200, per API
//! process: [`crate::quotas`]); over it, 429 `rate_limited` with
//! `Retry-After`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tok_core::waits::MAX_SUBJECT_BYTES;
use tok_store::NewSignal;

use crate::AppState;
use crate::auth::{KeyActor, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, Routes, SIGNAL};

pub(crate) fn router() -> Routes {
    Routes::new().post("/api/signals", SIGNAL, send)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(send))]
pub(crate) struct Api;

/// Longest signal key, in bytes: keys name things (`order:123:paid`).
const MAX_KEY_BYTES: usize = 200;

/// Largest payload: the wait step that takes the signal publishes it as
/// its output, which may be at most 64 KiB with the rest of that output.
const MAX_PAYLOAD_BYTES: usize = 60 * 1024;

/// Longest `Idempotency-Key` kept as is; a longer one is stored as its hash.
const MAX_IDEMPOTENCY_KEY_BYTES: usize = 200;

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_body", message).with("field", field)
}

#[utoipa::path(post, path = "/api/signals", tag = "signals", responses((status = 202, body = crate::openapi::schemas::SignalSent), (status = 429, description = "over the tenant's `settings.limits.signalsPerSecond` (`rate_limited`; `Retry-After` says when a signal is allowed again)", body = crate::openapi::ErrorBody)))]
async fn send(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    KeyActor(actor): KeyActor,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let limits = state.quotas.limits(state.engine.store(), &tenant).await?;
    if let Err(wait) = state
        .quotas
        .take_signal(&tenant, &limits, std::time::Instant::now())
    {
        let tok_core::quotas::Rate { rate, burst } = limits.signal_rate();
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "this tenant may send {rate} signals per second, bursts of {burst} \
                 (settings.limits.signalsPerSecond); retry later"
            ),
        )
        .with("retry_after_ms", (wait.as_millis() as u64).max(1)));
    }
    let Value::Object(mut body) = body else {
        return Err(ApiError::bad_request(
            "invalid_body",
            "the body must be a JSON object: {\"key\": \"…\", \"payload\": {…}}",
        ));
    };
    let key = key(&mut body)?;
    let subject = subject(&mut body)?;
    let payload = body.remove("payload").unwrap_or_else(|| json!({}));
    if let Some(field) = body.keys().next() {
        return Err(invalid(
            field,
            format!(
                "`{field}` is not a field of a signal; send `key`, `payload` and, for a signal \
                 about a ticket, `subject`"
            ),
        ));
    }
    let size = payload.to_string().len();
    if size > MAX_PAYLOAD_BYTES {
        return Err(invalid(
            "payload",
            format!(
                "`payload` is {size} bytes; at most {MAX_PAYLOAD_BYTES} (the wait step that \
                 takes it publishes it as its output)"
            ),
        ));
    }
    // Text PostgreSQL cannot store is refused here, on both backends alike.
    crate::routes::storable_json("`key`", &Value::String(key.clone()))?;
    crate::routes::storable_json("`payload`", &payload)?;
    if let Some(id) = &subject {
        crate::routes::storable_json("`subject`", &Value::String(id.clone()))?;
        // Scoped to the tenant: another tenant's ticket is as unknown here
        // as one that never existed, and answered the same.
        if state.engine.store().ticket(&tenant, id).await?.is_none() {
            return Err(ApiError::bad_request(
                "unknown_subject",
                format!(
                    "`subject` {id:?} is not a ticket of yours; a signal's subject is the id of \
                     one of your tickets (GET /api/tickets lists them)"
                ),
            )
            .with("field", "subject"));
        }
    }
    let signal = NewSignal {
        key,
        subject,
        payload,
        idempotency_key: idempotency_key(&headers)?,
        lookback_ms: i64::try_from(state.engine.config().signal_lookback.as_millis())
            .unwrap_or(i64::MAX),
        actor: Some(actor),
    };
    let sent = state.engine.store().send_signal(&tenant, signal).await?;
    if !sent.resumed.is_empty() {
        state.engine.job_ready();
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "signal_id": sent.signal_id,
            "subject": sent.subject,
            "resumed": sent.resumed,
            "buffered": sent.buffered,
            "duplicate": sent.duplicate,
        })),
    ))
}

/// The signal key: a non-empty string, compared exactly with the waits' keys.
fn key(body: &mut Map<String, Value>) -> ApiResult<String> {
    match body.remove("key") {
        None | Some(Value::Null) => Err(invalid(
            "key",
            "`key` is missing: name the key the waits wait for (their `wait_for_event` `key`)",
        )),
        Some(Value::String(key)) if key.trim().is_empty() => {
            Err(invalid("key", "`key` must not be empty"))
        }
        Some(Value::String(key)) if key.len() > MAX_KEY_BYTES => Err(invalid(
            "key",
            format!("`key` is {} bytes; at most {MAX_KEY_BYTES}", key.len()),
        )),
        Some(Value::String(key)) if tok_core::approval::is_decision_key(&key) => Err(invalid(
            "key",
            format!(
                "`key` {key:?} is reserved for decisions on approvals; decide with POST /api/approvals/{{id}}"
            ),
        )),
        Some(Value::String(key)) if tok_core::waits::is_reserved_key(&key) => Err(invalid(
            "key",
            format!(
                "`key` {key:?} is reserved: keys beginning with `{}` are tok's own",
                tok_core::waits::RESERVED_KEY_PREFIX
            ),
        )),
        Some(Value::String(key)) => Ok(key),
        Some(other) => Err(invalid(
            "key",
            format!("`key` must be a string, not {other}"),
        )),
    }
}

/// The ticket the signal is about: absent or null for none, else a
/// non-empty ticket id (checked against the tenant's tickets by the caller).
fn subject(body: &mut Map<String, Value>) -> ApiResult<Option<String>> {
    match body.remove("subject") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) if id.trim().is_empty() => Err(invalid(
            "subject",
            "`subject` must not be empty: give a ticket id, or leave `subject` out for a \
             signal about no ticket",
        )),
        Some(Value::String(id)) if id.len() > MAX_SUBJECT_BYTES => Err(invalid(
            "subject",
            format!(
                "`subject` is {} bytes; a ticket id has at most {MAX_SUBJECT_BYTES}",
                id.len()
            ),
        )),
        Some(Value::String(id)) => Ok(Some(id.trim().to_owned())),
        Some(other) => Err(invalid(
            "subject",
            format!("`subject` must be a ticket id (a string), not {other}"),
        )),
    }
}

/// The `Idempotency-Key` header; a blank one is no key.
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().map_err(|_| {
        ApiError::bad_request(
            "invalid_header",
            "the `Idempotency-Key` header must be visible ASCII",
        )
    })?;
    let key = key.trim();
    Ok(match key.len() {
        0 => None,
        n if n <= MAX_IDEMPOTENCY_KEY_BYTES => Some(key.to_owned()),
        _ => Some(format!("sha256:{}", hex::encode(Sha256::digest(key)))),
    })
}
