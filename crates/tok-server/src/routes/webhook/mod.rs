//! `POST /webhook/{token}`: fast and dumb. Check the token, the size, that
//! the JSON can be stored (no U+0000) and the source's contract, write one
//! inbox row, answer 202 — nothing is evaluated and nothing external is
//! awaited. `GET` on the same URL explains what the webhook expects.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tok_core::contract::{self, ContractError};
use tok_core::ids::EventId;
use tok_store::NewEvent;

use crate::error::{ApiError, ApiResult};
use crate::intake::WebhookSource;
use crate::routes::{OwnSecret, Path, Routes};
use crate::{AppState, MAX_WEBHOOK_BYTES};

pub(crate) fn router() -> Routes {
    Routes::new().get("/webhook/{token}", OwnSecret, help).post(
        "/webhook/{token}",
        OwnSecret,
        accept,
    )
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(help, accept))]
pub(crate) struct Api;

/// Longest `Idempotency-Key` header kept as is; a longer one is hashed.
const MAX_KEY_LEN: usize = 200;

async fn source(state: &AppState, token: &str) -> ApiResult<Arc<WebhookSource>> {
    let now = std::time::Instant::now();
    if let Some(source) = state.sources.get(token, now) {
        return Ok(source);
    }
    let source = state
        .engine
        .store()
        .source_by_token(token)
        .await?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_webhook",
                "no webhook has this URL",
            )
        })?;
    Ok(state.sources.put(token, source, now))
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the body is larger than {MAX_WEBHOOK_BYTES} bytes"),
    )
    .with("limit", MAX_WEBHOOK_BYTES)
}

/// The 202's body.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = WebhookAccepted)]
struct Answer {
    #[schema(value_type = String)]
    event_id: EventId,
    duplicate: bool,
}

/// `prefix` followed by the SHA-256 of `data` in lowercase hex.
fn sha256_key(prefix: &str, data: &[u8]) -> String {
    let mut hex = [0u8; 64];
    hex::encode_to_slice(Sha256::digest(data), &mut hex).expect("64 hex digits for 32 bytes");
    let mut key = String::with_capacity(prefix.len() + hex.len());
    key.push_str(prefix);
    key.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
    key
}

#[utoipa::path(post, path = "/webhook/{token}", tag = "webhook", responses((status = 202, body = Answer)))]
async fn accept(
    State(state): State<AppState>,
    Path(token): Path<String>,
    request: Request,
) -> ApiResult<(StatusCode, Json<Answer>)> {
    // The request's own headers: the `HeaderMap` extractor would copy them.
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_WEBHOOK_BYTES) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(body, MAX_WEBHOOK_BYTES)
        .await
        .map_err(|_| too_large())?;
    let cached = source(&state, &token).await?;
    let source = &cached.source;
    if let Some(rate) = source.rate_limit
        && let Err(wait) = state.token_limits.take(
            &source.id,
            f64::from(rate.max(1)),
            f64::from(rate.max(1)),
            std::time::Instant::now(),
        )
    {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("this webhook accepts {rate} requests per second; retry later"),
        )
        .with("retry_after_ms", wait.as_millis() as u64));
    }
    if !source.critical
        && let Some(depth) = state.backpressure.overloaded()
    {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "overloaded",
            format!(
                "{depth} events and steps are waiting, more than {}; retry later (sources marked critical are still accepted)",
                state.backpressure.threshold
            ),
        )
        .with("retry_after_ms", 5000));
    }
    if source.secret.is_some() {
        let secrets = source.secrets(tok_store::now_ms());
        verify_signature(
            &secrets,
            headers,
            &bytes,
            jiff::Timestamp::now().as_second(),
        )?;
    }
    let payload: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
            .with("line", e.line())
            .with("column", e.column())
    })?;
    crate::routes::storable_json("the body", &payload)?;
    let params = contract::extract(&cached.params, &payload).map_err(contract_error)?;
    // Standard Webhooks senders name each message with `webhook-id`. On a
    // signed source it is the key, whatever else is sent: it is part of
    // what was signed, so a captured request replayed with another
    // `Idempotency-Key` is the same event, not a new one.
    let key_header = if source.secret.is_some() {
        headers.get("webhook-id")
    } else {
        headers
            .get("idempotency-key")
            .or_else(|| headers.get("webhook-id"))
    }
    .and_then(|v| v.to_str().ok());
    let idempotency_key = match key_header {
        Some(key) if !key.trim().is_empty() && key.len() <= MAX_KEY_LEN => {
            format!("key:{}", key.trim())
        }
        Some(key) if !key.trim().is_empty() => sha256_key("key-sha256:", key.trim().as_bytes()),
        _ => sha256_key("body-sha256:", &bytes),
    };
    let event = NewEvent {
        source_id: Some(source.id.clone()),
        source_kind: "webhook".into(),
        idempotency_key,
        payload,
        params: Value::Object(params),
        depth: 0,
        cause_run_id: None,
        origin_automation_id: None,
        target_automation_id: None,
        // The sender's trace, if it sent a valid one: the runs continue it.
        traceparent: super::traceparent(headers),
        ..NewEvent::default()
    };
    let (event_id, accepted) = state
        .engine
        .store()
        .accept_event(&source.tenant_id, event)
        .await?;
    if !accepted.duplicate {
        state.engine.event_accepted(&source.tenant_id);
    }
    state.ingest_metrics.webhook(accepted.duplicate);
    Ok((
        StatusCode::ACCEPTED,
        Json(Answer {
            event_id,
            duplicate: accepted.duplicate,
        }),
    ))
}

/// How far a signed webhook's timestamp may be from our clock.
const SIGNATURE_TOLERANCE_SECS: u64 = 300;

fn unsigned(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "bad_signature", message)
}

/// Verifies a Standard Webhooks signature: HMAC-SHA256 over
/// `<webhook-id>.<webhook-timestamp>.<body>` with the source's secret
/// (`whsec_<base64>`, or the raw string), sent as `webhook-signature:
/// v1,<base64>` (several, space-separated, during a key rotation). During
/// a rotation's overlap `secrets` holds the new secret and the one before,
/// and a signature by either is accepted. The timestamp must be within
/// five minutes of `now`, so a captured request cannot be replayed later.
fn verify_signature(secrets: &[&str], headers: &HeaderMap, body: &[u8], now: i64) -> ApiResult<()> {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use hmac::{Hmac, Mac};

    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let (Some(id), Some(timestamp), Some(signatures)) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) else {
        return Err(unsigned(
            "this webhook is signed: send webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks)",
        ));
    };
    let sent_at: i64 = timestamp
        .parse()
        .map_err(|_| unsigned("webhook-timestamp must be unix seconds"))?;
    // Any i64 may be sent: the distance is taken without overflow.
    let away = now.abs_diff(sent_at);
    if away > SIGNATURE_TOLERANCE_SECS {
        return Err(unsigned(format!(
            "webhook-timestamp is {away} s away from the server's clock; at most {SIGNATURE_TOLERANCE_SECS} s are accepted"
        )));
    }
    let mut matches = false;
    for secret in secrets {
        let key = match secret.strip_prefix("whsec_") {
            Some(encoded) => STANDARD
                .decode(encoded)
                .unwrap_or_else(|_| secret.as_bytes().to_vec()),
            None => secret.as_bytes().to_vec(),
        };
        let mut mac = Hmac::<Sha256>::new_from_slice(&key)
            .map_err(|_| unsigned("the source's secret cannot be used as an HMAC key"))?;
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        let expected = mac.finalize().into_bytes();
        matches |= signatures.split_whitespace().any(|candidate| {
            candidate
                .strip_prefix("v1,")
                .and_then(|b64| STANDARD.decode(b64).ok())
                .is_some_and(|sig| {
                    // Constant-time comparison.
                    sig.len() == expected.len()
                        && sig
                            .iter()
                            .zip(expected.iter())
                            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                            == 0
                })
        });
    }
    if matches {
        Ok(())
    } else {
        Err(unsigned(
            "webhook-signature does not match the body and the source's secret",
        ))
    }
}

fn contract_error(e: ContractError) -> ApiError {
    let message = e.to_string();
    match e {
        ContractError::Missing { param, path } => ApiError::bad_request("missing_param", message)
            .with("param", param)
            .with("path", path),
        ContractError::WrongType {
            param,
            path,
            expected,
            found,
        } => ApiError::bad_request("wrong_type", message)
            .with("param", param)
            .with("path", path)
            .with("expected", json!(expected))
            .with("found", found),
    }
}

#[utoipa::path(get, path = "/webhook/{token}", tag = "webhook", responses((status = 200, body = crate::openapi::schemas::WebhookHelp)))]
async fn help(State(state): State<AppState>, Path(token): Path<String>) -> ApiResult<Json<Value>> {
    let cached = source(&state, &token).await?;
    let source = &cached.source;
    let mut help = contract::help(&cached.params);
    if let Value::Object(map) = &mut help {
        map.insert("url".into(), json!(state.webhook_url(&token)));
        map.insert("source".into(), json!(source.name));
        map.insert("max_body_bytes".into(), json!(MAX_WEBHOOK_BYTES));
        if source.secret.is_some() {
            map.insert(
                "signature".into(),
                json!("required: Standard Webhooks headers webhook-id, webhook-timestamp (unix seconds, within 5 minutes) and webhook-signature (v1,<base64 HMAC-SHA256 of id.timestamp.body>)"),
            );
        }
        map.insert(
            "idempotency".into(),
            json!("send an Idempotency-Key header; without one, the body's hash is the key. A repeat within 24 h answers 202 with the first event_id and \"duplicate\": true"),
        );
    }
    Ok(Json(help))
}
