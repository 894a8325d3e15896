//! The `flow` of an automation as written beside its `trigger`: its
//! priority and its start controls. Like the rest of the definition these
//! types only describe; what they do to the runs an event starts is
//! [`crate::start`]'s (which re-exports them).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Filter;
use crate::duration::{serde_duration, serde_optional_duration};

/// `flow`: the start controls of an automation. Unknown keys are refused
/// like everywhere in a definition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowControl {
    /// `priority`: a number, or a template string (checked by
    /// [`crate::start::check_priority`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Debounce>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<Throttle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Batch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub singleton: Option<Singleton>,
    /// `startTimeout`: a run no worker has begun this long after it was
    /// made ends `expired` (held by a start control, a cap, a queue key).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_optional_duration"
    )]
    pub start_timeout: Option<Duration>,
    /// `cancelOn`: the events that cancel a run of the automation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cancel_on: Vec<CancelOn>,
}

impl FlowControl {
    /// Whether the automation says nothing of how its runs start (no
    /// priority, no start control, no start timeout, no `cancelOn`).
    pub fn is_empty(&self) -> bool {
        self.priority.is_none()
            && self.debounce.is_none()
            && self.throttle.is_none()
            && self.batch.is_none()
            && self.singleton.is_none()
            && self.start_timeout.is_none()
            && self.cancel_on.is_empty()
    }
}

/// One `cancelOn` entry: an event of `source` whose `where` holds and
/// whose value at `match` equals the run's (its first context's, where
/// the same path is read) cancels the run, with its compensation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelOn {
    /// A webhook or poll source's id (as `trigger.source` names it), or an
    /// internal event's type (`ticket.closed`, as `trigger.event`).
    pub source: String,
    #[serde(rename = "where", default, skip_serializing_if = "Option::is_none")]
    pub where_: Option<Filter>,
    /// The path whose values must be equal (`_body.orderId`, `orderId`).
    #[serde(rename = "match")]
    pub match_: String,
}

/// `debounce: {key?, period, maxWait?}`: a key's events start one run
/// `period` after the last of them (at the latest `maxWait` after the
/// first), with the last one's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Debounce {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(with = "serde_duration")]
    pub period: Duration,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_optional_duration"
    )]
    pub max_wait: Option<Duration>,
}

/// `throttle: {key?, limit, period, burst?}`: at most `limit` starts per
/// `period` per key, `burst` (default 1) of them at once; the others wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Throttle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub limit: u32,
    #[serde(with = "serde_duration")]
    pub period: Duration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

/// `batch: {key?, maxSize, timeout}`: up to `maxSize` events of a key, or
/// what came within `timeout` of the first, start one run whose context
/// has `_events` (their bodies, in order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Batch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub max_size: u32,
    #[serde(with = "serde_duration")]
    pub timeout: Duration,
}

/// `singleton: {key?, mode}`: one run per key at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Singleton {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub mode: SingletonMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SingletonMode {
    /// An event while a run of its key is unfinished makes a `skipped` run.
    Skip,
    /// It cancels that run (with its compensation) and starts its own.
    Cancel,
    /// It waits behind it, and behind the key's runs queued before it:
    /// one run at a time, in the order the events came.
    Queue,
}
