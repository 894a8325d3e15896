//! What a stored step keeps, and how long a tenant's data lives
//! (docs/operations.md, "Retention").
//!
//! A successful step's `input` and `output` over [`HEAD_BYTES`] are stored
//! as `{"_truncated": true, "bytes", "sha256", "head"}`: nobody reads a
//! successful step's data in full, and at scenario B (docs/capacity.md) it
//! is most of the database. A failed (or retrying) step keeps everything,
//! so does a step of an automation with `settings.keepStepData` and a step
//! in the sample. The run's context — what later steps read — is kept apart
//! and never truncated: truncation is of the stored record only.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::run::{StepRecord, StepStatus};

/// How much of a long value a truncated record keeps, and the size past
/// which a value is truncated: its JSON text in bytes.
pub const HEAD_BYTES: usize = 512;

/// A value as a successful step stores it: itself when its JSON text is at
/// most [`HEAD_BYTES`], else its size, SHA-256 and the first bytes of the
/// text (cut at a character boundary, so the head is valid UTF-8).
pub fn truncated(value: &Value) -> Value {
    let text = value.to_string();
    if text.len() <= HEAD_BYTES {
        return value.clone();
    }
    let mut end = HEAD_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let digest = Sha256::digest(text.as_bytes());
    let sha256: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    json!({
        "_truncated": true,
        "bytes": text.len(),
        "sha256": sha256,
        "head": &text[..end],
    })
}

/// Whether a step's data is stored in full: a failed or retrying step
/// always (it is what someone will read), a completed or waiting one only
/// when `keep` (the automation's `keepStepData` or the sample says so).
pub fn keeps_everything(status: StepStatus, keep: bool) -> bool {
    keep || matches!(status, StepStatus::Failed | StepStatus::Retrying)
}

/// The record as it is stored: see [`keeps_everything`] and [`truncated`].
pub fn for_storage(mut record: StepRecord, keep: bool) -> StepRecord {
    if !keeps_everything(record.status, keep) {
        record.input = record.input.as_ref().map(truncated);
        record.output = record.output.as_ref().map(truncated);
    }
    record
}

/// How long a tenant's data lives, in days (`tenants.settings.retention`).
/// Each reader of the data sets its own: step inputs and outputs are read
/// while a run is fresh, run summaries for a year of reports, a ticket's
/// log for a quarter, an event for as long as someone asks why a run
/// started, the audit log for as long as someone may ask who changed what
/// (a legal need, so a year by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Retention {
    /// `run_steps`: the step records of runs.
    pub step_data_days: u32,
    /// `runs`: finished runs (with the step records left of them).
    pub runs_days: u32,
    /// `ticket_trace`: the log of each ticket.
    pub trace_days: u32,
    /// `event_inbox`: dispatched events.
    pub inbox_days: u32,
    /// `audit`: who changed what with which key.
    pub audit_days: u32,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            step_data_days: 30,
            runs_days: 365,
            trace_days: 90,
            inbox_days: 30,
            audit_days: 365,
        }
    }
}

/// The longest retention a setting may ask for: ten years.
pub const MAX_DAYS: u32 = 3650;

impl Retention {
    /// Each period is 1 to [`MAX_DAYS`] days, and step data lives no longer
    /// than its runs (a run's expiry takes its steps with it). The error
    /// names the field.
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("stepDataDays", self.step_data_days),
            ("runsDays", self.runs_days),
            ("traceDays", self.trace_days),
            ("inboxDays", self.inbox_days),
            ("auditDays", self.audit_days),
        ];
        for (name, days) in fields {
            if !(1..=MAX_DAYS).contains(&days) {
                return Err(format!(
                    "retention.{name}: {days} days is out of range; a period is 1 to {MAX_DAYS} days"
                ));
            }
        }
        if self.step_data_days > self.runs_days {
            return Err(format!(
                "retention.stepDataDays: {} days is longer than runsDays ({} days); a run's steps go with it",
                self.step_data_days, self.runs_days
            ));
        }
        Ok(())
    }
}

/// Milliseconds in a day.
pub const DAY_MS: i64 = 24 * 3600 * 1000;

/// The instant before which data kept `days` days has expired at `now_ms`.
pub fn cutoff(now_ms: i64, days: u32) -> i64 {
    now_ms - i64::from(days) * DAY_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: StepStatus, output: Value) -> StepRecord {
        StepRecord {
            path: "0".into(),
            step_id: "s".into(),
            kind: "http".into(),
            attempt: 1,
            status,
            input: Some(json!({ "url": "https://example.test" })),
            output: Some(output),
            error: None,
            log: Vec::new(),
            started_at: 0,
            finished_at: 0,
        }
    }

    #[test]
    fn a_short_value_is_stored_as_it_is() {
        let value = json!({ "ok": true });
        assert_eq!(truncated(&value), value);
    }

    #[test]
    fn a_long_value_keeps_its_size_hash_and_head() {
        let value = json!({ "body": "é".repeat(400) });
        let text = value.to_string();
        let stored = truncated(&value);
        assert_eq!(stored["_truncated"], json!(true));
        assert_eq!(stored["bytes"], json!(text.len()));
        let head = stored["head"].as_str().unwrap();
        assert!(head.len() <= HEAD_BYTES && head.len() >= HEAD_BYTES - 1);
        assert!(text.starts_with(head));
        let sha = stored["sha256"].as_str().unwrap();
        assert_eq!(sha, hex_of(&Sha256::digest(text.as_bytes())));
    }

    fn hex_of(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn only_a_successful_step_is_truncated() {
        let long = json!({ "body": "x".repeat(600) });
        let done = for_storage(record(StepStatus::Completed, long.clone()), false);
        assert_eq!(done.output.unwrap()["_truncated"], json!(true));
        for status in [StepStatus::Failed, StepStatus::Retrying] {
            let kept = for_storage(record(status, long.clone()), false);
            assert_eq!(kept.output, Some(long.clone()));
        }
        let kept = for_storage(record(StepStatus::Completed, long.clone()), true);
        assert_eq!(kept.output, Some(long));
    }

    #[test]
    fn retention_defaults_and_bounds() {
        let r: Retention = serde_json::from_value(json!({ "traceDays": 10 })).unwrap();
        assert_eq!(r.trace_days, 10);
        assert_eq!(r.step_data_days, 30);
        assert_eq!(r.audit_days, 365);
        assert!(r.validate().is_ok());
        let zero = Retention {
            inbox_days: 0,
            ..Retention::default()
        };
        assert!(zero.validate().unwrap_err().contains("retention.inboxDays"));
        let longer = Retention {
            step_data_days: 400,
            ..Retention::default()
        };
        assert!(
            longer
                .validate()
                .unwrap_err()
                .contains("retention.stepDataDays")
        );
        assert!(serde_json::from_value::<Retention>(json!({ "stepDays": 1 })).is_err());
    }
}
