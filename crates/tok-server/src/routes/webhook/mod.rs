//! `POST /webhook/{token}`: fast and dumb. Check the token, the size, the
//! sender's signature on the raw bytes ([`crate::senders`]), that the JSON
//! can be stored (no U+0000), the source's schema and its contract, write
//! one inbox row, answer 202 — nothing is evaluated and nothing external
//! is awaited. A Slack source answers Slack's `url_verification` with its
//! challenge and stores nothing. `?dry_run=true` goes through the same
//! checks and answers what would happen instead of storing anything
//! ([`dry_run`]). `GET` on the same URL explains what the webhook expects.

mod dry_run;

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tok_core::contract::{self, ContractError};
use tok_core::ids::EventId;
use tok_store::NewEvent;

use crate::error::{ApiError, ApiResult};
use crate::intake::WebhookSource;
use crate::routes::{OwnSecret, Path, Routes};
use crate::senders::{Preset, Signed};
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
    let store = state.engine.store();
    let source = store.source_by_token(token).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_webhook",
            "no webhook has this URL",
        )
    })?;
    let tenant = store.tenant(&source.tenant_id).await?;
    // A tenant being deleted has no webhooks any more: they answer as a
    // deleted source's do.
    if tenant.as_ref().is_some_and(|t| t.deleting()) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_webhook",
            "no webhook has this URL",
        ));
    }
    let require_signature = tenant.map_or(state.require_signed_webhooks, |t| {
        t.webhooks.requires_signature(state.require_signed_webhooks)
    });
    Ok(state
        .sources
        .put(token, source, require_signature, now)
        .await)
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

/// Whether `?dry_run=` asks for a dry run (`true`/`1`; `false`/`0` or no
/// such parameter: a real one).
fn dry_run_asked(query: Option<&str>) -> ApiResult<bool> {
    let Some(query) = query else {
        return Ok(false);
    };
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, "true"));
        if name == "dry_run" {
            return match value {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                other => Err(ApiError::bad_request(
                    "invalid_query",
                    format!(
                        "`dry_run` is `{}`; expected true or false",
                        other.chars().take(40).collect::<String>()
                    ),
                )
                .with("field", "dry_run")),
            };
        }
    }
    Ok(false)
}

#[utoipa::path(post, path = "/webhook/{token}", tag = "webhook", responses(
    (status = 202, body = Answer),
    (status = 200, description = "`?dry_run=true`: what would happen, nothing stored; or, for a Slack source, the `challenge` of Slack's `url_verification`", body = crate::openapi::schemas::WebhookAnswered),
    (status = 401, description = "the sender's signature is missing (`signature_missing`), does not match (`signature_invalid`) or its timestamp is too far from now (`timestamp_out_of_range`), with the `header` read; or the tenant requires signed webhooks and the source has no `verify` (`signature_required`)", body = crate::openapi::ErrorBody),
))]
async fn accept(
    State(state): State<AppState>,
    Path(token): Path<String>,
    request: Request,
) -> ApiResult<Response> {
    // The request's own headers: the `HeaderMap` extractor would copy them.
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let dry = dry_run_asked(parts.uri.query())?;
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
    // A dry run adds nothing to the queue, so it is not held back by it.
    if !dry
        && !source.critical
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
    let signature = check_signature(&state, &cached, headers, &bytes, dry).await?;
    let payload: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
            .with("line", e.line())
            .with("column", e.column())
    })?;
    crate::routes::storable_json("the body", &payload)?;
    let preset = signature.preset();
    if let Some(challenge) = preset.and_then(|p| p.challenge(&payload)) {
        // Slack's handshake: answered, never an event.
        let challenge = challenge.to_owned();
        return Ok(if dry {
            Json(dry_run::challenged(&cached, &signature, &challenge)).into_response()
        } else {
            Json(json!({ "challenge": challenge })).into_response()
        });
    }
    let payload = match &cached.schema {
        Some(Ok(schema)) => {
            let (payload, checked) = Arc::clone(schema).check(payload).await;
            checked?;
            payload
        }
        Some(Err(why)) => {
            return Err(ApiError::bad_request(
                "invalid_schema",
                format!("the source's schema is no longer accepted (it does not compile, or costs more than this version of tok allows), so nothing is accepted until it is fixed with PATCH /api/sources/{}: {why}", source.id),
            )
            .with("field", "schema"));
        }
        None => payload,
    };
    let mut params = contract::extract(&cached.params, &payload).map_err(contract_error)?;
    if let Some(preset) = preset {
        let signed = signature.signed().cloned().unwrap_or_default();
        params.insert("_sender".into(), sender_params(preset, &signed));
    }
    let idempotency_key = idempotency_key(&signature, headers, &payload, &bytes);
    if dry {
        let answer = dry_run::answer(
            &state,
            &cached,
            &signature,
            &payload,
            params,
            &idempotency_key,
        )
        .await?;
        return Ok(Json(answer).into_response());
    }
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
    )
        .into_response())
}

/// How a request's signature was taken.
pub(crate) enum Signature {
    /// The source has no `verify` and the tenant does not require one.
    Unsigned,
    /// The sender's signature holds.
    Verified(Preset, Signed),
    /// A dry run asked with the tenant's own API key and none of the
    /// sender's headers: not checked (the dashboard's "try a body").
    NotChecked(Preset),
}

impl Signature {
    fn preset(&self) -> Option<Preset> {
        match self {
            Signature::Unsigned => None,
            Signature::Verified(preset, _) | Signature::NotChecked(preset) => Some(*preset),
        }
    }

    fn signed(&self) -> Option<&Signed> {
        match self {
            Signature::Verified(_, signed) => Some(signed),
            _ => None,
        }
    }
}

/// Checks the request against the source's sender, before the body is
/// parsed: a refusal is a 401 naming the header, and nothing of the
/// request is kept.
async fn check_signature(
    state: &AppState,
    cached: &WebhookSource,
    headers: &HeaderMap,
    body: &[u8],
    dry: bool,
) -> ApiResult<Signature> {
    let source = &cached.source;
    let preset = match &cached.preset {
        None if cached.require_signature => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "signature_required",
                format!(
                    "this tenant accepts signed webhooks only, and source `{}` checks no sender's signature; give it one with PATCH /api/sources/{} {{\"verify\": {{\"preset\", \"secret\"}}}}",
                    source.name, source.id
                ),
            ));
        }
        None => return Ok(Signature::Unsigned),
        Some(Err(name)) => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "signature_invalid",
                format!(
                    "source `{}` checks the signature of sender `{name}`, which this version of tok does not know; nothing is accepted unchecked",
                    source.name
                ),
            ));
        }
        Some(Ok(preset)) => *preset,
    };
    if dry && !preset.sent_any(headers) && signed_in(state, cached, headers).await {
        return Ok(Signature::NotChecked(preset));
    }
    let now = jiff::Timestamp::now().as_second();
    let secrets = source.secrets(tok_store::now_ms()).map_err(|e| {
        // The sender is told to come back; the operator reads why (the
        // key's id, never a key) in the log.
        tracing::error!(source = %source.id, tenant = %source.tenant_id, error = %e,
            "a webhook's signature cannot be checked: the source's signing secret does not open");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "signature_unavailable",
            "tok cannot check this webhook's signature now (its signing secret does not open \
             under the platform's TOK_SECRET_KEY; the operator is told); nothing was stored: \
             send it again later",
        )
        .with("retry_after_ms", 60_000u64)
    })?;
    let signed = preset.verify(&secrets, headers, body, now)?;
    Ok(Signature::Verified(preset, signed))
}

/// Whether the request carries an API key of the source's tenant (or the
/// platform admin key): a dry run asked so needs no sender's signature.
async fn signed_in(state: &AppState, cached: &WebhookSource, headers: &HeaderMap) -> bool {
    let Some(secret) = crate::auth::bearer_of(headers) else {
        return false;
    };
    match crate::auth::valid_key(state, secret).await {
        Ok(Some(key)) => match key.owner() {
            tok_store::KeyOwner::Platform => true,
            tok_store::KeyOwner::Tenant(tenant) => tenant == cached.source.tenant_id,
        },
        _ => false,
    }
}

/// `_sender` in the run's context: the sender, and what it named in its
/// headers that the body does not say (GitHub's event, Shopify's topic).
fn sender_params(preset: Preset, signed: &Signed) -> Value {
    let mut sender = Map::new();
    sender.insert("preset".into(), json!(preset.as_str()));
    if let Some(event) = &signed.event {
        sender.insert("event".into(), json!(event));
    }
    if let Some(delivery) = &signed.delivery {
        sender.insert("delivery".into(), json!(delivery));
    }
    Value::Object(sender)
}

/// The event's idempotency key: on a signed source the sender's own name
/// of the delivery (its header, or the body's event id), and only then
/// the body's hash; an `Idempotency-Key` header is not signed, so a
/// signed source ignores it (a captured request replayed with another is
/// still the same event). An unsigned source takes `Idempotency-Key`, then
/// `webhook-id` (or Svix's `svix-id`), then the body's hash.
fn idempotency_key(
    signature: &Signature,
    headers: &HeaderMap,
    payload: &Value,
    bytes: &[u8],
) -> String {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let in_body = |preset: Preset| {
        preset
            .body_key()
            .and_then(|field| payload.get(field))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let named: Option<String> = match signature {
        Signature::Verified(preset, signed) => signed.delivery.clone().or_else(|| in_body(*preset)),
        Signature::NotChecked(preset) => in_body(*preset),
        Signature::Unsigned => header("idempotency-key")
            .or_else(|| header("webhook-id"))
            .or_else(|| header("svix-id"))
            .map(str::to_owned),
    };
    match named.as_deref().map(str::trim) {
        Some(key) if !key.is_empty() && key.len() <= MAX_KEY_LEN => format!("key:{key}"),
        Some(key) if !key.is_empty() => sha256_key("key-sha256:", key.as_bytes()),
        _ => sha256_key("body-sha256:", bytes),
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
        match &cached.preset {
            Some(Ok(preset)) => {
                map.insert(
                    "signature".into(),
                    json!(format!("required: {}", preset.summary())),
                );
                map.insert(
                    "verify".into(),
                    json!({ "preset": preset.as_str(), "headers": preset.sent_headers() }),
                );
            }
            Some(Err(name)) => {
                map.insert(
                    "signature".into(),
                    json!(format!(
                        "required: sender `{name}`, unknown to this version of tok"
                    )),
                );
            }
            None if cached.require_signature => {
                map.insert(
                    "signature".into(),
                    json!("required, but this source checks no sender's signature: its webhooks are refused until it is given `verify`"),
                );
            }
            None => {}
        }
        if let Some(schema) = &source.schema {
            map.insert("schema".into(), schema.clone());
        }
        let idempotency = match &cached.preset {
            Some(Ok(Preset::Github)) => "X-GitHub-Delivery is the key",
            Some(Ok(Preset::Shopify)) => "X-Shopify-Webhook-Id is the key",
            Some(Ok(Preset::Standard)) => "webhook-id (Svix: svix-id) is the key",
            Some(Ok(Preset::Stripe)) => "the event's `id` is the key",
            Some(Ok(Preset::Slack)) => {
                "the Events API's `event_id` is the key, else the body's hash"
            }
            _ => "send an Idempotency-Key header; without one, the body's hash is the key",
        };
        map.insert(
            "idempotency".into(),
            json!(format!("{idempotency}. A repeat within 24 h answers 202 with the first event_id and \"duplicate\": true")),
        );
        map.insert(
            "dry_run".into(),
            json!("POST with ?dry_run=true: checked like a real webhook, answered 200 with the params and which automations would start; nothing is stored"),
        );
    }
    Ok(Json(help))
}
