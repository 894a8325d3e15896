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
//!
//! A stream lasts as long as its key: revoked through any process, or
//! rotated out (the platform admin key), it ends within about a second
//! ([`crate::key_watch`]); at the key's `expires_at` it ends then. Its last
//! event is `closed`, with `{"reason": "key_revoked" | "key_expired",
//! "message"}`; a client that reconnects with that key gets 401.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
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
use crate::auth::{Caller, Tenant, bearer_of};
use crate::error::{ApiError, ApiResult};
use crate::key_watch::KeyEnd;
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
    Caller(caller): Caller,
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
    let key = Held {
        state: state.key_watch.follow(state.engine.store(), &key),
        expiry: expiry(caller.expires_at),
    };
    let subscription = state.engine.stream().subscribe(&tenant, last);
    Ok(Sse::new(events(subscription, place, key))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The key a stream was opened with: whether it still works, and its end.
struct Held {
    state: tokio::sync::watch::Receiver<KeyEnd>,
    expiry: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Held {
    /// Why the key stops working, when it does.
    async fn ended(&mut self) -> KeyEnd {
        tokio::select! {
            changed = self.state.changed() => match changed {
                Ok(()) => match *self.state.borrow_and_update() {
                    KeyEnd::Valid => KeyEnd::Valid,
                    end => end,
                },
                // The check is gone without an answer: the key is not known
                // to work, so the stream ends as if revoked.
                Err(_) => KeyEnd::Revoked,
            },
            () = &mut self.expiry => KeyEnd::Expired,
        }
    }
}

/// Resolves at `expires_at` (ms since the epoch), or never.
fn expiry(expires_at: Option<i64>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    match expires_at {
        Some(at) => {
            let left = u64::try_from(at - tok_store::now_ms()).unwrap_or(0);
            Box::pin(tokio::time::sleep(Duration::from_millis(left)))
        }
        None => Box::pin(std::future::pending()),
    }
}

/// The replay (or a `reload` for what cannot be replayed), then live
/// events until the process stops serving or the key stops working (a last
/// `closed` event says why). The stream holds `place` until it is dropped.
fn events(
    subscription: Subscription,
    place: StreamPlace,
    key: Held,
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
    let state = (first.into_iter(), live, closed, place, Some(key));
    futures_util::stream::unfold(
        state,
        |(mut first, mut live, mut closed, place, key)| async move {
            // The key ended: its `closed` event went out last.
            let mut key = key?;
            if let Some(event) = first.next() {
                return Some((Ok(event), (first, live, closed, place, Some(key))));
            }
            if *closed.borrow() {
                return None;
            }
            let event = loop {
                tokio::select! {
                    received = live.recv() => break match received {
                        Ok(event) => sse(&event),
                        Err(RecvError::Lagged(n)) => reload(&format!("{n} events were missed while the client was slow")),
                        Err(RecvError::Closed) => return None,
                    },
                    _ = closed.changed() => return None,
                    end = key.ended() => match end {
                        KeyEnd::Valid => continue,
                        end => return Some((Ok(key_closed(end)), (first, live, closed, place, None))),
                    },
                }
            };
            Some((Ok(event), (first, live, closed, place, Some(key))))
        },
    )
}

/// The last event of a stream whose key stopped working.
fn key_closed(end: KeyEnd) -> Event {
    let (reason, message) = match end {
        KeyEnd::Expired => (
            "key_expired",
            "the API key this stream was opened with expired: sign in with another key",
        ),
        _ => (
            "key_revoked",
            "the API key this stream was opened with was revoked: sign in with another key",
        ),
    };
    Event::default()
        .event("closed")
        .data(json!({ "reason": reason, "message": message }).to_string())
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
