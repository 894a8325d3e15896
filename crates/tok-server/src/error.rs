//! The API's one error type: a status, a stable code, a message that says
//! what to do, and optional fields (the param and path of a contract error).
//! Database internals never reach a client: a store error is logged here and
//! answered as 503 (database unavailable; `tenant_database_unavailable`,
//! with `Retry-After`, when only the tenant's own database is away) or
//! 500, but for an input the store refuses as unstorable (400,
//! `unstorable`: it names what is wrong, and the same input always fails
//! the same way).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tok_engine::EngineError;
use tok_store::{SecretError, StoreError};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub extra: Map<String, Value>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            extra: Map::new(),
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// Another tenant's ids answer exactly like ids that do not exist.
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = Map::new();
        error.insert("code".into(), json!(self.code));
        error.insert("message".into(), json!(self.message));
        let retry_after = error_retry_after(&self.extra);
        error.extend(self.extra);
        let mut response = (self.status, Json(json!({ "error": error }))).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

/// A `retry_after_ms` detail also goes out as a `Retry-After` header (whole
/// seconds, rounded up).
fn error_retry_after(extra: &Map<String, Value>) -> Option<u64> {
    extra
        .get("retry_after_ms")
        .and_then(Value::as_u64)
        .map(|ms| ms.div_ceil(1000).max(1))
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => Self::not_found(what),
            StoreError::Taken(message)
            | StoreError::Changed(message)
            | StoreError::InvalidState(message) => {
                Self::new(StatusCode::CONFLICT, "conflict", message)
            }
            // Deterministic for this input: a retry fails the same way.
            StoreError::Refused(message) => Self::bad_request("unstorable", message),
            // The operator's to fix (TOK_SECRET_KEY); the messages name a
            // connection and a key's id, never a key or a credential.
            StoreError::Secret(SecretError::NoKey) => {
                Self::bad_request("secret_key_missing", SecretError::NoKey.to_string())
            }
            StoreError::Secret(other) => {
                tracing::error!(error = %other, "connection credentials do not open");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "credentials_unopenable",
                    other.to_string(),
                )
            }
            // One tenant's own database is away: its calls are answered at
            // once while the others go on (the log names the database).
            StoreError::TenantDatabaseUnavailable(database) => {
                tracing::debug!(%database, "a call of a tenant whose database does not answer");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "tenant_database_unavailable",
                    "this tenant's database does not answer; try again shortly",
                )
                .with(
                    "retry_after_ms",
                    tok_store::TENANT_DATABASE_RETRY.as_millis() as u64,
                )
            }
            StoreError::Unavailable(message) => {
                tracing::error!(error = %message, "database unavailable");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database_unavailable",
                    "the database did not answer; try again shortly",
                )
            }
            StoreError::Database(sqlx_error) => {
                tracing::error!(error = %sqlx_error, "database error");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database_unavailable",
                    "the database did not answer; try again shortly",
                )
            }
            other => {
                tracing::error!(error = %other, "store error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Store(e) => e.into(),
            EngineError::AutomationNotFound(_) => Self::not_found("automation"),
            EngineError::AutomationPaused(_) => {
                Self::new(StatusCode::CONFLICT, "automation_paused", e.to_string())
            }
            EngineError::AutomationArchived(_) => {
                Self::new(StatusCode::CONFLICT, "automation_archived", e.to_string())
            }
            EngineError::StartRateExceeded { retry_after_ms, .. } => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "start_rate_exceeded",
                e.to_string(),
            )
            .with("retry_after_ms", retry_after_ms.max(1) as u64),
            EngineError::Definition(message) => {
                tracing::error!(%message, "stored definition unusable");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}
