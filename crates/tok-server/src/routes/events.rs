//! Events: one accepted event with the runs it started, and replays — of
//! one event, or of a source's events over a time range — through the
//! normal dispatch (its filters, start controls and loop protection), so
//! that an event that came before its automation existed, or while the
//! automation was paused or wrong, can still start it (docs/operations.md,
//! "Replaying events").
//!
//! A replay is a new inbox row naming the first event (`replay_of`). With
//! `mode: "if_no_runs"` it is written only when neither the event nor any
//! replay of it started a run and none of them waits for the dispatcher;
//! the store decides that under a lock of the event, so two replays sent
//! at once start one run, not two. `mode` has no default: a replay says
//! whether it may start runs a second time.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tok_core::ids::{EventId, SourceId, TenantId};
use tok_store::{EventFilter, ReplayMode, Replayed, RunFilter};

use crate::AppState;
use crate::audit::AuditNote;
use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{JsonBody, Path, READ, Routes, WRITE};

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/api/events/{id}", READ, show)
        .post("/api/events/{id}/replay", WRITE, replay)
        .post("/api/events/replay", WRITE, replay_many)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(show, replay, replay_many))]
pub(crate) struct Api;

/// How long a replay of one event waits for the dispatcher to take it, so
/// that its answer lists the runs it started.
const DISPATCH_WAIT: Duration = Duration::from_secs(5);

/// The most events one filtered replay takes; `next_cursor` goes on.
const MAX_REPLAY_PAGE: u32 = 1_000;

/// The runs an event started, at most a page of them.
async fn runs_of(state: &AppState, tenant: &TenantId, event: &EventId) -> ApiResult<Vec<Value>> {
    let filter = RunFilter {
        event_id: Some(event.to_string()),
        ..RunFilter::default()
    };
    let runs = state
        .engine
        .store()
        .runs(tenant, &filter, super::MAX_LIMIT, None)
        .await?;
    Ok(runs.items.iter().map(|r| json!(r)).collect())
}

#[utoipa::path(get, path = "/api/events/{id}", tag = "events", responses((status = 200, body = crate::openapi::schemas::EventDetail)))]
async fn show(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let id = EventId::from(id);
    let event = state
        .engine
        .store()
        .event(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("event"))?;
    let mut answer = json!(event);
    answer["runs"] = Value::Array(runs_of(&state, &tenant, &id).await?);
    Ok(Json(answer))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    mode: Option<String>,
}

fn mode(mode: Option<&str>) -> ApiResult<ReplayMode> {
    match mode {
        Some("always") => Ok(ReplayMode::Always),
        Some("if_no_runs") => Ok(ReplayMode::IfNoRuns),
        Some(other) => Err(ApiError::bad_request(
            "invalid_body",
            format!("`mode` is `{other}`; it must be `always` or `if_no_runs`"),
        )
        .with("field", "mode")),
        None => Err(ApiError::bad_request(
            "invalid_body",
            "a replay needs `mode`: `always` (the event starts its runs again) or \
             `if_no_runs` (only if it never started one)",
        )
        .with("field", "mode")),
    }
}

#[utoipa::path(post, path = "/api/events/{id}/replay", tag = "events", responses(
    (status = 200, description = "The replay and the runs it started, or why `if_no_runs` wrote none", body = crate::openapi::schemas::EventReplayed),
    (status = 202, description = "The replay was written and the dispatcher has not taken it yet: `GET /api/events/{event_id}` lists its runs later", body = crate::openapi::schemas::EventReplayed),
))]
async fn replay(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ReplayBody>,
) -> ApiResult<(StatusCode, AuditNote, Json<Value>)> {
    let mode = mode(body.mode.as_deref())?;
    let id = EventId::from(id);
    let store = state.engine.store();
    let replayed = store
        .replay_event(&tenant, &id, mode)
        .await?
        .ok_or_else(|| ApiError::not_found("event"))?;
    let replay = match replayed {
        Replayed::HasRuns(runs) => {
            let note = AuditNote(format!("event {id} not replayed: it has runs"));
            let answer = json!({ "replayed": false, "reason": "has_runs", "runs": runs });
            return Ok((StatusCode::OK, note, Json(answer)));
        }
        Replayed::Pending(pending) => {
            let note = AuditNote(format!("event {id} not replayed: {pending} is pending"));
            let answer = json!({
                "replayed": false, "reason": "pending", "event_id": pending, "runs": [],
            });
            return Ok((StatusCode::OK, note, Json(answer)));
        }
        Replayed::Accepted(replay) => replay,
    };
    state.engine.event_accepted(&tenant);
    // The dispatcher takes the replay in turn with everyone's events; the
    // answer waits a little for it, to list the runs it started.
    let deadline = Instant::now() + DISPATCH_WAIT;
    let mut status = "pending".to_string();
    while Instant::now() < deadline {
        match store.event(&tenant, &replay).await? {
            Some(event) if event.status != "pending" => {
                status = event.status;
                break;
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            None => break,
        }
    }
    let runs: Vec<Value> = match status.as_str() {
        "pending" => Vec::new(),
        _ => runs_of(&state, &tenant, &replay)
            .await?
            .into_iter()
            .map(|run| run["id"].clone())
            .collect(),
    };
    let code = match status.as_str() {
        "pending" => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    };
    let note = AuditNote(format!(
        "event {id} replayed as {replay} ({}), {} runs",
        match mode {
            ReplayMode::Always => "always",
            ReplayMode::IfNoRuns => "if_no_runs",
        },
        runs.len()
    ));
    let answer = json!({
        "replayed": true, "event_id": replay, "replay_of": id, "status": status, "runs": runs,
    });
    Ok((code, note, Json(answer)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayManyBody {
    #[serde(default)]
    filter: FilterBody,
    mode: Option<String>,
    #[serde(default)]
    dry_run: bool,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FilterBody {
    source: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

/// A time of the filter, RFC 3339, in ms since the epoch.
fn instant(field: &str, value: Option<&str>) -> ApiResult<Option<i64>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let at = tok_store::rfc3339::parse(value).map_err(|e| {
        ApiError::bad_request("invalid_body", format!("`filter.{field}`: {e}"))
            .with("field", format!("filter.{field}"))
    })?;
    Ok(Some(at))
}

#[utoipa::path(post, path = "/api/events/replay", tag = "events", responses((status = 200, description = "With `dry_run`: `count` and the first page of `events`; else `replayed` and `skipped`", body = crate::openapi::schemas::EventsReplayed)))]
async fn replay_many(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    JsonBody(body): JsonBody<ReplayManyBody>,
) -> ApiResult<(AuditNote, Json<Value>)> {
    let mode = mode(body.mode.as_deref())?;
    let filter = EventFilter {
        source_id: body.filter.source.map(SourceId::from),
        since: instant("since", body.filter.since.as_deref())?,
        until: instant("until", body.filter.until.as_deref())?,
    };
    let limit = match body.limit {
        None => super::DEFAULT_LIMIT,
        Some(n @ 1..=MAX_REPLAY_PAGE) => n,
        Some(n) => {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("`limit` is {n}; a replay takes 1 to {MAX_REPLAY_PAGE} events a call, and `next_cursor` goes on"),
            )
            .with("field", "limit"));
        }
    };
    let page = super::PageQuery {
        limit: None,
        cursor: body.cursor,
    };
    let after = page.after("events")?;
    let store = state.engine.store();
    let events = store
        .events(&tenant, &filter, limit, after.as_deref())
        .await?;
    let next = events
        .next_cursor
        .as_deref()
        .map(|key| super::cursor("events", key));
    if body.dry_run {
        let count = store.count_events(&tenant, &filter).await?;
        let note = AuditNote(format!("dry run: {count} events would be replayed"));
        let answer = json!({
            "dry_run": true, "count": count, "events": events.items, "next_cursor": next,
        });
        return Ok((note, Json(answer)));
    }
    let mut replayed = Vec::new();
    let mut skipped = Vec::new();
    for event in &events.items {
        match store.replay_event(&tenant, &event.id, mode).await? {
            Some(Replayed::Accepted(replay)) => {
                replayed.push(json!({ "event_id": event.id, "replay_id": replay }));
            }
            Some(Replayed::HasRuns(runs)) => {
                skipped.push(json!({ "event_id": event.id, "reason": "has_runs", "runs": runs }));
            }
            Some(Replayed::Pending(pending)) => skipped
                .push(json!({ "event_id": event.id, "reason": "pending", "pending": pending })),
            // Expired between the page and its replay.
            None => skipped.push(json!({ "event_id": event.id, "reason": "gone" })),
        }
    }
    if !replayed.is_empty() {
        state.engine.event_accepted(&tenant);
    }
    let note = AuditNote(format!(
        "{} events replayed, {} skipped",
        replayed.len(),
        skipped.len()
    ));
    let answer = json!({ "replayed": replayed, "skipped": skipped, "next_cursor": next });
    Ok((note, Json(answer)))
}
