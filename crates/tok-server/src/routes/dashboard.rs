//! Reads the dashboard needs beside the resources' own: who a key is
//! (`GET /api/dashboard/session`), the tenant's queue right now
//! (`GET /api/dashboard/queue`) and over the last minutes
//! (`GET /api/dashboard/queue/history`, the samples the scheduler keeps).
//! The runs listing is `runs.rs`'s.

use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;
use serde_json::{Value, json};
use tok_store::{KeyOwner, QueueSample};

use crate::AppState;
use crate::auth::{Caller, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::routes::{READ, Routes};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/dashboard/session", READ, session)
        .get("/api/dashboard/queue", READ, queue)
        .get("/api/dashboard/queue/history", READ, history)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(session, queue, history))]
pub(crate) struct Api;

/// The most minutes of history one answer covers: the samples are kept a
/// day ([`tok_store::QUEUE_SAMPLES_KEPT`]).
const MAX_MINUTES: u32 = 1440;
/// The most samples one answer holds (the newest): a day at the default
/// 30 s is 2,880.
const MAX_SAMPLES: u32 = 3000;

/// What kind of key signed in, its name and scopes, and the tenant of a
/// tenant's key.
#[utoipa::path(get, path = "/api/dashboard/session", tag = "dashboard", responses((status = 200, body = crate::openapi::schemas::Session)))]
async fn session(State(state): State<AppState>, Caller(key): Caller) -> ApiResult<Json<Value>> {
    let mut me = match key.owner() {
        KeyOwner::Platform => json!({ "kind": "admin", "tenant": null }),
        KeyOwner::Tenant(id) => {
            let tenant = state.engine.store().tenant(&id).await?;
            json!({
                "kind": "tenant",
                "tenant": { "id": id, "name": tenant.map(|t| t.name) },
            })
        }
    };
    me["name"] = json!(key.name);
    me["scopes"] = json!(key.scopes);
    Ok(Json(me))
}

/// The tenant's jobs by state, the age of its oldest ready job and its
/// events not yet dispatched.
#[utoipa::path(get, path = "/api/dashboard/queue", tag = "dashboard", responses((status = 200, body = crate::openapi::schemas::QueueHealth)))]
async fn queue(State(state): State<AppState>, Tenant(tenant, _): Tenant) -> ApiResult<Json<Value>> {
    let stats = state.engine.store().queue_stats(&[tenant]).await?;
    Ok(Json(json!({
        "ready": stats.ready,
        "scheduled": stats.scheduled,
        "running": stats.running,
        "pending_events": stats.pending_events,
        "oldest_ready_s": stats.oldest_ready_ms.map(|ms| ms as f64 / 1000.0),
        "sampled_at": jiff::Timestamp::now().to_string(),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    minutes: Option<u32>,
}

/// The tenant's queue over the last `minutes` (60 by default, at most
/// 1440), oldest sample first: one sample every `sample_every_s`, kept by
/// the node that runs the scheduler.
#[utoipa::path(
    get,
    path = "/api/dashboard/queue/history",
    tag = "dashboard",
    params(("minutes" = Option<u32>, Query, description = "How far back, in minutes: 1 to 1440 (60 by default).")),
    responses((status = 200, body = crate::openapi::schemas::QueueHistory))
)]
async fn history(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| {
        ApiError::bad_request("bad_query", e.body_text()).with("expected", "minutes=1..1440")
    })?;
    let minutes = query.minutes.unwrap_or(60);
    if !(1..=MAX_MINUTES).contains(&minutes) {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("minutes must be from 1 to {MAX_MINUTES}; it is {minutes}"),
        )
        .with("expected", "minutes=1..1440"));
    }
    let now = tok_store::now_ms();
    let since = now - i64::from(minutes) * 60_000;
    let samples = state
        .engine
        .store()
        .queue_samples(&tenant, since, MAX_SAMPLES)
        .await?;
    let every = state.engine.config().scheduler.queue_sample_every;
    Ok(Json(json!({
        "tenant_id": tenant,
        "minutes": minutes,
        "from": tok_store::rfc3339::format(since),
        "to": tok_store::rfc3339::format(now),
        "sample_every_s": every.as_secs_f64(),
        "samples": samples.iter().map(sample_view).collect::<Vec<_>>(),
    })))
}

fn sample_view(s: &QueueSample) -> Value {
    let window_s = s.window_ms as f64 / 1000.0;
    let per_s = |n: i64| {
        if s.window_ms > 0 {
            n as f64 / window_s
        } else {
            0.0
        }
    };
    json!({
        "at": tok_store::rfc3339::format(s.at),
        "ready": s.ready,
        "scheduled": s.scheduled,
        "running": s.running,
        "pending_events": s.pending_events,
        "oldest_ready_s": s.oldest_ready_ms.map(|ms| ms as f64 / 1000.0),
        "steps_completed": s.steps_completed,
        "steps_failed": s.steps_failed,
        "window_s": window_s,
        "steps_per_s": per_s(s.steps_completed + s.steps_failed),
    })
}
