//! One router per resource.

pub(crate) mod approvals;
pub(crate) mod automations;
pub(crate) mod connections;
pub(crate) mod dashboard;
pub(crate) mod groups;
pub(crate) mod health;
pub(crate) mod incidents;
pub(crate) mod metrics;
pub(crate) mod platform_incidents;
pub(crate) mod runs;
pub(crate) mod signals;
pub(crate) mod sources;
pub(crate) mod stream;
pub(crate) mod tenants;
pub(crate) mod ticket_types;
pub(crate) mod tickets;
pub(crate) mod webhook;
pub(crate) mod widgets;

use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// Refuses JSON (`what`: "the body", "`input`") with U+0000 in a string or
/// key: PostgreSQL cannot store it, and both backends answer alike, with a
/// 400 that names where it is.
pub(crate) fn storable_json(what: &str, value: &Value) -> Result<(), ApiError> {
    match tok_store::storable::nul_at(value) {
        None => Ok(()),
        Some(pointer) => Err(ApiError::bad_request(
            "nul_in_json",
            tok_store::storable::nul_refused(what, &pointer).to_string(),
        )
        .with("path", pointer)),
    }
}

/// `limit` and `cursor` of every listing.
#[derive(Debug, Deserialize)]
pub(crate) struct PageQuery {
    pub(crate) limit: Option<u32>,
    pub(crate) cursor: Option<String>,
}

impl PageQuery {
    /// The page size: 50 by default, at most 500.
    pub(crate) fn limit(&self) -> Result<u32, ApiError> {
        match self.limit {
            None => Ok(50),
            Some(n @ 1..=500) => Ok(n),
            Some(n) => Err(ApiError::bad_request(
                "bad_limit",
                format!("limit is {n}; it must be between 1 and 500"),
            )),
        }
    }
}

/// A JSON body whose rejection is an [`ApiError`] saying what was wrong.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T, S> axum::extract::FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::bad_request("invalid_body", rejection.body_text())),
        }
    }
}

impl<T: serde::de::DeserializeOwned> JsonBody<T> {
    /// Parses bytes already read, with the same errors as the extractor.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        serde_json::from_slice(bytes).map(Self).map_err(|e| {
            ApiError::bad_request("invalid_body", format!("the body is not valid: {e}"))
        })
    }
}
