//! `GET /api/stream`: the tenant's live events as server-sent events
//! (`run.updated`, `step.recorded`, `ticket.updated`, `incident.opened`
//! for a new incident, `incident.updated` when an open one happens again),
//! each with an `id:`. A client that reconnects with `Last-Event-ID` is
//! sent what it missed first, from the last few minutes; when that is gone,
//! or when it falls behind the live events, it is sent a `reload` event:
//! load the view again. The events are [`tok_engine::stream`]'s.
//!
//! One API key holds at most its tenant's `settings.limits.streams` open at
//! once (5 by default, per API process: [`crate::quotas`]); one more is 429
//! `too_many_streams`. A stream's place is given back when it ends, its
//! client gone.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde_json::json;
use tok_engine::stream::{self, Kind, Subscription};
use tokio::sync::broadcast::error::RecvError;

use tok_store::hash_secret;

use crate::AppState;
use crate::auth::{Tenant, bearer_of};
use crate::error::{ApiError, ApiResult};
use crate::quotas::StreamPlace;
use crate::routes::{READ, Routes};

pub(crate) fn router() -> Routes {
    Routes::new().get("/api/stream", READ, follow)
}

/// What these routes are, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(follow))]
pub(crate) struct Api;

#[utoipa::path(get, path = "/api/stream", tag = "stream", responses((status = 200, description = "Server-sent events", content_type = "text/event-stream"), (status = 429, description = "the key has its tenant's `settings.limits.streams` open already (`too_many_streams`)", body = crate::openapi::ErrorBody)))]
async fn follow(
    State(state): State<AppState>,
    Tenant(tenant, _): Tenant,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let limits = state.quotas.limits(state.engine.store(), &tenant).await?;
    let key = hash_secret(bearer_of(&headers).unwrap_or_default());
    let place = state.quotas.open_stream(&key, &limits).map_err(|limit| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_streams",
            format!(
                "this API key has {limit} live streams open, the most its tenant allows \
                 (settings.limits.streams); close one first"
            ),
        )
        .with("limit", limit)
    })?;
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let subscription = state.engine.stream().subscribe(&tenant, last);
    Ok(Sse::new(events(subscription, place))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The replay (or a `reload` for what cannot be replayed), then live
/// events until the process stops serving. The stream holds `place` until
/// it is dropped.
fn events(
    subscription: Subscription,
    place: StreamPlace,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let Subscription {
        missed,
        gap,
        live,
        closed,
    } = subscription;
    let first: Vec<Event> = gap
        .then(|| reload("what you missed is no longer kept"))
        .into_iter()
        .chain(missed.iter().map(|e| sse(e)))
        .collect();
    let state = (first.into_iter(), live, closed, place);
    futures_util::stream::unfold(
        state,
        |(mut first, mut live, mut closed, place)| async move {
            if let Some(event) = first.next() {
                return Some((Ok(event), (first, live, closed, place)));
            }
            if *closed.borrow() {
                return None;
            }
            let event = tokio::select! {
                received = live.recv() => match received {
                    Ok(event) => sse(&event),
                    Err(RecvError::Lagged(n)) => reload(&format!("{n} events were missed while the client was slow")),
                    Err(RecvError::Closed) => return None,
                },
                _ = closed.changed() => return None,
            };
            Some((Ok(event), (first, live, closed, place)))
        },
    )
}

fn sse(event: &stream::Event) -> Event {
    Event::default()
        .id(event.id.as_str())
        .event(event.kind.as_str())
        .data(&*event.data)
}

fn reload(reason: &str) -> Event {
    Event::default()
        .event(Kind::Reload.as_str())
        .data(json!({ "reason": reason }).to_string())
}
