//! Connections to outside services and the limits that protect them: a
//! token bucket (rate, burst), a cap on calls in flight, and a circuit
//! breaker. They live in the database, so they hold across every worker
//! process sharing it. A step asks [`ConnectionStore::admit`] before it
//! calls (one short transaction), calls with no connection held, and reports
//! the outcome with [`ConnectionStore::release`]. A connection is read
//! afresh for every call, so a change ([`ConnectionStore::update_connection`])
//! applies from the next call on, in every process.
//!
//! Credentials are sealed at rest (`secrets/`): the store seals them as
//! it writes them and opens them in [`ConnectionStore::connection`], so a
//! caller only ever sees them plain. Neither type below prints them.

use std::fmt;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tok_core::ids::{JobId, TenantId};

use crate::Result;

#[derive(Clone)]
pub struct NewConnection {
    pub name: String,
    /// `http` or `mcp`.
    pub service: String,
    pub base_url: Option<String>,
    /// Applied to calls, never shown: `{"bearer": "…"}`, `{"basic": {"user","password"}}`
    /// or `{"headers": {…}}`.
    pub credentials: Value,
    /// Calls per second; `None` for no rate limit.
    pub rate: Option<f64>,
    pub burst: i32,
    pub max_concurrency: Option<i32>,
    pub breaker_threshold: i32,
    pub breaker_cooldown_ms: i64,
}

#[derive(Clone, Serialize)]
pub struct Connection {
    pub id: String,
    pub name: String,
    pub service: String,
    pub base_url: Option<String>,
    /// The plain credentials, opened by [`ConnectionStore::connection`] (the
    /// worker's read, or the answer to a create). `Null` in a listing
    /// ([`ConnectionStore::connections`]), which opens none: see
    /// [`Connection::has_credentials`].
    #[serde(skip)]
    pub credentials: Value,
    /// Whether the connection holds credentials (known without opening them).
    pub has_credentials: bool,
    pub rate: Option<f64>,
    pub burst: i32,
    pub max_concurrency: Option<i32>,
    pub breaker_threshold: i32,
    pub breaker_cooldown_ms: i64,
    pub breaker_state: String,
    pub failures: i32,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
}

/// A change to a connection: each `Some` replaces what is stored, `None`
/// leaves it. Its name and service never change (what refers to it names
/// it).
#[derive(Clone, Default)]
pub struct ConnectionPatch {
    /// `Some(None)` removes the base URL.
    pub base_url: Option<Option<String>>,
    /// The new credentials, sealed under the newest key; `{}` removes them.
    pub credentials: Option<Value>,
    /// `Some(None)` removes the rate limit.
    pub rate: Option<Option<f64>>,
    pub burst: Option<i32>,
    /// `Some(None)` removes the cap on calls in flight.
    pub max_concurrency: Option<Option<i32>>,
    pub breaker_threshold: Option<i32>,
    pub breaker_cooldown_ms: Option<i64>,
    /// What the connection must still be for the change to apply, as the
    /// caller read it when it judged the change: a change of the base URL
    /// is judged by where the credentials held then would go, and must not
    /// apply to credentials given meanwhile. Otherwise the change is a
    /// [`StoreError::Changed`](crate::StoreError::Changed) and nothing
    /// is written.
    pub expect: Option<ExpectedConnection>,
}

/// A connection's base URL and whether it holds credentials, as a change
/// was judged against ([`ConnectionPatch::expect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedConnection {
    pub base_url: Option<String>,
    pub has_credentials: bool,
}

/// Everything but the credentials.
impl fmt::Debug for ConnectionPatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionPatch")
            .field("base_url", &self.base_url)
            .field("credentials", &self.credentials.as_ref().map(|_| "***"))
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .field("max_concurrency", &self.max_concurrency)
            .field("expect", &self.expect)
            .finish_non_exhaustive()
    }
}

/// Everything but the credentials.
impl fmt::Debug for NewConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewConnection")
            .field("name", &self.name)
            .field("service", &self.service)
            .field("base_url", &self.base_url)
            .field("credentials", &"***")
            .field("rate", &self.rate)
            .field("max_concurrency", &self.max_concurrency)
            .finish_non_exhaustive()
    }
}

/// Everything but the credentials.
impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("service", &self.service)
            .field("base_url", &self.base_url)
            .field("credentials", &"***")
            .field("has_credentials", &self.has_credentials)
            .field("breaker_state", &self.breaker_state)
            .finish_non_exhaustive()
    }
}

/// Whether a call may go ahead now.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Go ahead; a slot is held until [`ConnectionStore::release`].
    Go,
    /// Not now: come back in `delay_ms` (nothing was spent); `kind` names
    /// the limit (`breaker`, `connection_concurrency`, `connection_rate`:
    /// [`tok_core::blocked`]).
    Wait {
        delay_ms: i64,
        reason: String,
        kind: &'static str,
    },
}

/// How a call ended, for the circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The service answered (any answer that is not a retryable failure).
    Answered,
    /// Connection error, timeout, 5xx, 429: counts toward opening the breaker.
    Unavailable,
}

#[async_trait]
pub trait ConnectionStore: Send + Sync {
    /// Creates a connection, its credentials sealed under the newest key.
    /// Credentials without any key configured (PostgreSQL without
    /// `TOK_SECRET_KEY`) are [`SecretError::NoKey`](crate::SecretError::NoKey),
    /// and nothing is written; a connection without credentials needs none.
    async fn create_connection(&self, tenant: &TenantId, new: NewConnection) -> Result<Connection>;
    /// A page of connections by name, after the name `after`, without
    /// their credentials (none is opened: `credentials` is `Null`).
    async fn connections(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<crate::Page<Connection>>;
    /// A connection by name or id, with its credentials opened (for the
    /// worker). Credentials that do not open (their key is not in
    /// `TOK_SECRET_KEY`, or they were sealed for another row) are a
    /// [`StoreError::Secret`](crate::StoreError::Secret) naming the
    /// connection and the key.
    async fn connection(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<Connection>>;
    /// A connection by name or id with its credentials left closed
    /// (`Null`, as a listing has them): for what needs its settings only.
    /// It answers where [`Self::connection`] fails on credentials that do
    /// not open (their key was lost), so such a connection can still be
    /// shown, given new credentials, or deleted.
    async fn connection_unopened(
        &self,
        tenant: &TenantId,
        name_or_id: &str,
    ) -> Result<Option<Connection>>;
    /// Changes the connection `id` as `patch` says, new credentials sealed
    /// under the newest key (without one, as [`Self::create_connection`]:
    /// nothing is written). Its breaker's state and its calls in flight
    /// stay. Answers the connection as changed, its credentials not opened
    /// (`Null`); `None` when the tenant has no connection `id`.
    async fn update_connection(
        &self,
        tenant: &TenantId,
        id: &str,
        patch: ConnectionPatch,
    ) -> Result<Option<Connection>>;
    /// Deletes the connection `id` and its slots; false when the tenant has
    /// none of that id. What still names it fails at its next call.
    async fn delete_connection(&self, tenant: &TenantId, id: &str) -> Result<bool>;
    /// Checks the breaker, the concurrency cap and the token bucket, in that
    /// order, and takes a token and a slot when all allow the call.
    async fn admit(
        &self,
        tenant: &TenantId,
        connection_id: &str,
        job: JobId,
        lease_ms: i64,
    ) -> Result<Admission>;
    /// Frees the call's slot and feeds its outcome to the breaker.
    async fn release(
        &self,
        tenant: &TenantId,
        connection_id: &str,
        job: JobId,
        outcome: CallOutcome,
    ) -> Result<()>;
}

/// The decision of [`ConnectionStore::admit`], pure: given the connection's
/// state at `now`, whether to call and the state to write back.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Gate {
    pub(crate) rate: Option<f64>,
    pub(crate) burst: i32,
    pub(crate) tokens: f64,
    pub(crate) refilled_at: i64,
    pub(crate) max_concurrency: Option<i32>,
    pub(crate) in_flight: i64,
    pub(crate) breaker_state: String,
    pub(crate) opened_at: Option<i64>,
    pub(crate) cooldown_ms: i64,
}

impl Gate {
    /// Returns the admission and, when the call goes ahead, the new
    /// (tokens, breaker state, opened_at).
    pub(crate) fn decide(&self, now: i64) -> (Admission, Option<(f64, String, Option<i64>)>) {
        let mut state = self.breaker_state.clone();
        let mut opened_at = self.opened_at;
        if state == "open" || state == "half_open" {
            let until = self.opened_at.unwrap_or(now) + self.cooldown_ms;
            if now < until {
                let reason = if state == "open" {
                    "the circuit breaker is open after repeated failures"
                } else {
                    "the circuit breaker is testing the service with one call"
                };
                return (
                    Admission::Wait {
                        delay_ms: until - now,
                        reason: reason.into(),
                        kind: tok_core::blocked::BREAKER,
                    },
                    None,
                );
            }
            // Cool-down over (or a probe went missing): let one probe through.
            state = "half_open".into();
            opened_at = Some(now);
        }
        if let Some(max) = self.max_concurrency
            && self.in_flight >= i64::from(max)
        {
            let reason = format!("{max} calls are already in flight on this connection");
            return (
                Admission::Wait {
                    delay_ms: 100,
                    reason,
                    kind: tok_core::blocked::CONNECTION_CONCURRENCY,
                },
                None,
            );
        }
        let mut tokens = self.tokens;
        if let Some(rate) = self.rate.filter(|r| *r > 0.0) {
            let elapsed = (now - self.refilled_at).max(0) as f64 / 1000.0;
            tokens = (self.tokens + elapsed * rate).min(f64::from(self.burst.max(1)));
            if tokens < 1.0 {
                let delay_ms = (((1.0 - tokens) / rate) * 1000.0).ceil().max(1.0) as i64;
                let reason = format!("the rate limit of {rate} calls per second is reached");
                let kind = tok_core::blocked::CONNECTION_RATE;
                return (
                    Admission::Wait {
                        delay_ms,
                        reason,
                        kind,
                    },
                    None,
                );
            }
            tokens -= 1.0;
        }
        (Admission::Go, Some((tokens, state, opened_at)))
    }
}

mod sql;

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> Gate {
        Gate {
            rate: None,
            burst: 1,
            tokens: 0.0,
            refilled_at: 0,
            max_concurrency: None,
            in_flight: 0,
            breaker_state: "closed".into(),
            opened_at: None,
            cooldown_ms: 1000,
        }
    }

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let g = Gate {
            rate: Some(10.0),
            burst: 5,
            tokens: 0.0,
            refilled_at: 0,
            ..gate()
        };
        // 50 ms at 10/s is half a token: wait 50 ms more.
        assert_eq!(
            g.decide(50).0,
            Admission::Wait {
                delay_ms: 50,
                reason: "the rate limit of 10 calls per second is reached".into(),
                kind: "connection_rate",
            }
        );
        // After 10 s the bucket holds its burst of 5, one is taken.
        let (admission, state) = g.decide(10_000);
        assert_eq!(admission, Admission::Go);
        assert_eq!(state.unwrap().0, 4.0);
    }

    #[test]
    fn the_concurrency_cap_holds_calls_back() {
        let g = Gate {
            max_concurrency: Some(2),
            in_flight: 2,
            ..gate()
        };
        assert!(matches!(
            g.decide(0).0,
            Admission::Wait {
                kind: "connection_concurrency",
                ..
            }
        ));
        let g = Gate {
            max_concurrency: Some(2),
            in_flight: 1,
            ..gate()
        };
        assert_eq!(g.decide(0).0, Admission::Go);
    }

    #[test]
    fn an_open_breaker_waits_out_its_cooldown_then_lets_one_probe_through() {
        let g = Gate {
            breaker_state: "open".into(),
            opened_at: Some(1000),
            ..gate()
        };
        assert_eq!(
            g.decide(1500).0,
            Admission::Wait {
                delay_ms: 500,
                reason: "the circuit breaker is open after repeated failures".into(),
                kind: "breaker",
            }
        );
        let (admission, state) = g.decide(2000);
        assert_eq!(admission, Admission::Go);
        assert_eq!(state.unwrap().1, "half_open");
        let probing = Gate {
            breaker_state: "half_open".into(),
            opened_at: Some(2000),
            ..gate()
        };
        assert!(matches!(probing.decide(2500).0, Admission::Wait { .. }));
    }
}
