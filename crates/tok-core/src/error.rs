//! The error a step returns, which carries the retry decision with it.
//!
//! Whoever knows why a step failed (the step implementation) says whether
//! trying again can help; nothing else in tok guesses. The default is
//! terminal: only failures that say so are retried (see [`crate::retry`]).

use std::time::Duration;

use thiserror::Error;

/// Why a step failed and whether it is worth trying again.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StepError {
    /// Trying again cannot help (bad request, validation, missing data).
    #[error("{0}")]
    Terminal(String),
    /// A transient failure (connection error, 5xx); retried on the policy's
    /// schedule.
    #[error("{0}")]
    Retryable(String),
    /// The other side said when to come back (429 with `Retry-After`).
    #[error("{message} (retry after {after:?})")]
    RetryAfter { message: String, after: Duration },
    /// Not attempted at all: a limit held the step back (rate limit,
    /// concurrency cap, open circuit breaker). It comes back after `after`
    /// and spends no attempt. `kind` names the limit as a run's
    /// `blocked_by` says it ([`crate::blocked`]).
    #[error("{message} (deferred {after:?})")]
    Deferred {
        kind: &'static str,
        message: String,
        after: Duration,
    },
}

impl StepError {
    /// A failure that must not be retried.
    pub fn terminal(message: impl Into<String>) -> Self {
        StepError::Terminal(message.into())
    }

    /// A failure worth retrying on the policy's schedule.
    pub fn retryable(message: impl Into<String>) -> Self {
        StepError::Retryable(message.into())
    }

    /// A failure worth retrying, not before `after`.
    pub fn retry_after(message: impl Into<String>, after: Duration) -> Self {
        StepError::RetryAfter {
            message: message.into(),
            after,
        }
    }

    /// A step the limit `kind` held back before it called anything.
    pub fn deferred(kind: &'static str, message: impl Into<String>, after: Duration) -> Self {
        StepError::Deferred {
            kind,
            message: message.into(),
            after,
        }
    }

    /// Whether another attempt may be made (attempts permitting).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, StepError::Terminal(_))
    }

    /// The same error, its message cut to [`crate::limits::MAX_ERROR_BYTES`]
    /// with a marker when it is longer.
    pub fn bounded(self) -> Self {
        let cut = |mut message: String| {
            crate::budget::bound_error(&mut message);
            message
        };
        match self {
            StepError::Terminal(m) => StepError::Terminal(cut(m)),
            StepError::Retryable(m) => StepError::Retryable(cut(m)),
            StepError::RetryAfter { message, after } => StepError::RetryAfter {
                message: cut(message),
                after,
            },
            StepError::Deferred {
                kind,
                message,
                after,
            } => StepError::Deferred {
                kind,
                message: cut(message),
                after,
            },
        }
    }

    /// The message without the retry hint.
    pub fn message(&self) -> &str {
        match self {
            StepError::Terminal(m) | StepError::Retryable(m) => m,
            StepError::RetryAfter { message, .. } | StepError::Deferred { message, .. } => message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_and_accessors() {
        let t = StepError::terminal("HTTP 404 from https://x");
        assert!(!t.is_retryable());
        assert_eq!(t.message(), "HTTP 404 from https://x");
        assert_eq!(t.to_string(), "HTTP 404 from https://x");

        let r = StepError::retryable("connection refused");
        assert!(r.is_retryable());
        assert_eq!(r, StepError::Retryable("connection refused".into()));

        let a = StepError::retry_after("HTTP 429", Duration::from_secs(20));
        assert!(a.is_retryable());
        assert_eq!(a.message(), "HTTP 429");
        assert_eq!(a.to_string(), "HTTP 429 (retry after 20s)");
    }
}
