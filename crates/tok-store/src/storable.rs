//! Text every backend can store, and the rows a database refuses.
//!
//! PostgreSQL refuses U+0000 in `text` and in the strings (and keys) of
//! `jsonb`, while SQLite stores it, and JSON may carry it (`"\u0000"`). So
//! that both backends behave alike, what a user sends with U+0000 is refused
//! before it is written ([`nul_at`], [`StoreError::Refused`]), and what tok
//! wrote itself (a step's output, error and log, the run's context) has it
//! replaced by U+FFFD, the replacement character ([`mend_record`]): a step's
//! result is never lost over one character.
//!
//! Whatever else a database refuses in one row (`refused_row`) fails only
//! that row: the group commits write a failed batch again item by item
//! (`batch.rs`).

use std::borrow::Cow;

use serde_json::Value;

use crate::{
    ClaimedJob, ContextChange, NextJob, Record, RunStatus, StepRecord, StepStatus, StoreError,
};

/// What takes U+0000's place in text tok writes itself.
pub const REPLACEMENT: char = '\u{FFFD}';

/// The JSON pointer (RFC 6901, `""` for the whole value) of the first string
/// or object key in `value` that contains U+0000, which PostgreSQL cannot
/// store; `None` when there is none.
pub fn nul_at(value: &Value) -> Option<String> {
    fn walk(value: &Value, path: &mut Vec<String>) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().enumerate().any(|(i, item)| {
                path.push(i.to_string());
                let found = walk(item, path);
                if !found {
                    path.pop();
                }
                found
            }),
            Value::Object(map) => map.iter().any(|(key, item)| {
                path.push(key.replace('~', "~0").replace('/', "~1"));
                let found = key.contains('\0') || walk(item, path);
                if !found {
                    path.pop();
                }
                found
            }),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }
    let mut path = Vec::new();
    walk(value, &mut path).then(|| {
        path.iter()
            .fold(String::new(), |pointer, part| pointer + "/" + part)
    })
}

/// The refusal of an input whose JSON has U+0000 at `pointer`; `what` names
/// the input ("the event's payload").
pub fn nul_refused(what: &str, pointer: &str) -> StoreError {
    let at = if pointer.is_empty() {
        String::new()
    } else {
        format!(" at {pointer}")
    };
    StoreError::Refused(format!(
        "{what} has the character U+0000 (\\u0000) in a string{at}; tok cannot store it: \
         remove it, or send binary data encoded (base64, say)"
    ))
}

/// Refuses an event whose text cannot be stored.
pub(crate) fn check_event(event: &crate::NewEvent) -> crate::Result<()> {
    if let Some(pointer) = nul_at(&event.payload) {
        return Err(nul_refused("the event's payload", &pointer));
    }
    if let Some(pointer) = nul_at(&event.params) {
        return Err(nul_refused("the event's params", &pointer));
    }
    let texts = [
        ("idempotency key", Some(&event.idempotency_key)),
        ("source kind", Some(&event.source_kind)),
        ("type", event.event_type.as_ref()),
        ("ticket", event.subject_ticket_id.as_ref()),
    ];
    match texts
        .into_iter()
        .find(|(_, text)| text.is_some_and(|t| t.contains('\0')))
    {
        Some((what, _)) => Err(StoreError::Refused(format!(
            "the event's {what} has the character U+0000; tok cannot store it: remove it"
        ))),
        None => Ok(()),
    }
}

/// `s` with U+0000 replaced, borrowed when there is none.
fn mend_str(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', &REPLACEMENT.to_string()))
    } else {
        Cow::Borrowed(s)
    }
}

fn mend_string(s: &mut String) {
    if let Cow::Owned(mended) = mend_str(s) {
        *s = mended;
    }
}

/// Replaces U+0000 in every string and key of `value`.
pub fn mend_value(value: &mut Value) {
    match value {
        Value::String(s) => mend_string(s),
        Value::Array(items) => items.iter_mut().for_each(mend_value),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                let entries = std::mem::take(map);
                for (key, mut item) in entries {
                    mend_value(&mut item);
                    map.insert(mend_str(&key).into_owned(), item);
                }
            } else {
                map.values_mut().for_each(mend_value);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Makes a record storable on every backend: U+0000 in its steps' input,
/// output, error and log, and in the run's error becomes U+FFFD. A record
/// without U+0000 is left as it is (and nothing is copied). The run's
/// context is mended as it is written (`rows::raw_json`), where what is
/// written of it is serialized anyway, rather than walked whole here at
/// every step.
pub fn mend_record(record: &mut Record) {
    for step in &mut record.steps {
        mend_step(step);
    }
    if let Some(error) = &mut record.error {
        mend_string(error);
    }
    if let Some(ticket) = &mut record.subject_ticket_id {
        mend_string(ticket);
    }
}

fn mend_step(step: &mut StepRecord) {
    for text in [&mut step.path, &mut step.step_id, &mut step.kind] {
        mend_string(text);
    }
    for value in [&mut step.input, &mut step.output].into_iter().flatten() {
        mend_value(value);
    }
    if let Some(error) = &mut step.error {
        mend_string(error);
    }
    step.log.iter_mut().for_each(mend_string);
}

/// Whether a write failed because the database refused the data of a row
/// (PostgreSQL's SQLSTATE classes 22, data exception, 23, integrity
/// constraint violation, and 54, program limit exceeded, such as a value
/// too big for its index; SQLite's constraint, too-big and mismatch
/// errors), not because it could not be reached: such a batch is written
/// again item by item, so that only the row at fault fails.
pub(crate) fn refused_row(e: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(db)) = e else {
        return false;
    };
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return ["22", "23", "54"]
            .iter()
            .any(|class| pg.code().starts_with(class));
    }
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // The primary result code: SQLITE_TOOBIG, SQLITE_CONSTRAINT, SQLITE_MISMATCH.
        let primary = db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .map(|code| code & 0xff);
        return matches!(primary, Some(18..=20));
    }
    false
}

/// Whether the database could not be reached, or could not take the work
/// now, whatever the data: the connection failed or timed out, the pool is
/// closed, the database shuts down, lacks resources or a disk, failed a
/// serialization or broke a deadlock (PostgreSQL's SQLSTATE classes 08,
/// 40, 53, 57, 58 and XX), or the SQLite file is busy, locked, full or
/// cannot be opened or read. The same work may pass later.
pub(crate) fn outage(e: &StoreError) -> bool {
    let db = match e {
        StoreError::Unavailable(_) | StoreError::TenantDatabaseUnavailable(_) => return true,
        StoreError::Database(sqlx::Error::Database(db)) => db,
        StoreError::Database(e) => {
            return matches!(
                e,
                sqlx::Error::Io(_)
                    | sqlx::Error::Tls(_)
                    | sqlx::Error::Protocol(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::WorkerCrashed
                    | sqlx::Error::BeginFailed
            );
        }
        _ => return false,
    };
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        let class = &pg.code()[..pg.code().len().min(2)];
        return ["08", "40", "53", "57", "58", "XX"].contains(&class);
    }
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // The primary result code: SQLITE_BUSY (5) to SQLITE_IOERR (10),
        // SQLITE_CORRUPT (11), SQLITE_FULL (13) to SQLITE_PROTOCOL (15).
        let primary = db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .map(|code| code & 0xff);
        return matches!(primary, Some(5..=11 | 13..=15));
    }
    false
}

/// Whether the database chose this transaction to break a deadlock
/// (PostgreSQL's `40P01`): nothing of it was written, and the same writes
/// may be tried again at once.
pub(crate) fn deadlocked(e: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some_and(|pg| pg.code() == "40P01")
}

/// What a lone record the database refused is written as instead: the run
/// fails at the claimed step, with its context as it was before the step
/// (as stored) and an error saying why, and its job goes. The step is not run
/// again by itself (it would be refused again, for ever); a retry of the
/// run runs it again.
pub(crate) fn refused_record(job: &ClaimedJob, refused: &Record, now: i64) -> Record {
    let claimed = refused.steps.iter().find(|s| s.path == job.path);
    let error = format!(
        "the result of step `{}` could not be stored: the database refused it as invalid data. \
         The run is failed so that the step does not run again by itself; retry the run once \
         the step's output can be stored",
        claimed.map_or(job.path.as_str(), |s| s.step_id.as_str()),
    );
    let step = StepRecord {
        path: job.path.clone(),
        step_id: claimed.map(|s| s.step_id.clone()).unwrap_or_default(),
        kind: claimed.map(|s| s.kind.clone()).unwrap_or_default(),
        attempt: job.attempt,
        status: StepStatus::Failed,
        input: None,
        output: None,
        error: Some(error.clone()),
        log: Vec::new(),
        started_at: claimed.map_or(now, |s| s.started_at),
        finished_at: now,
    };
    Record {
        steps: vec![step],
        context: Value::Null.into(),
        changed: ContextChange::Kept,
        actions: job.actions,
        status: RunStatus::Failed,
        error: Some(error),
        next: NextJob::Done,
        subject_ticket_id: job.subject_ticket_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_first_nul_is_found_by_its_json_pointer() {
        assert_eq!(
            nul_at(&json!({"a": [1, "ok", {"b/c": "x\u{0}y"}]})),
            Some("/a/2/b~1c".into())
        );
        assert_eq!(nul_at(&json!("\u{0}")), Some(String::new()));
        assert_eq!(nul_at(&json!({"k\u{0}": 1})), Some("/k\u{0}".into()));
        assert_eq!(nul_at(&json!({"a": ["\\u0000 as text", 0, null]})), None);
    }

    #[test]
    fn a_mended_value_has_replacement_characters_where_nul_was() {
        let mut value = json!({"a\u{0}": ["x\u{0}", {"b": "\u{0}\u{0}"}], "n": 1});
        mend_value(&mut value);
        assert_eq!(
            value,
            json!({"a\u{FFFD}": ["x\u{FFFD}"
            , {"b": "\u{FFFD}\u{FFFD}"}], "n": 1})
        );
        assert_eq!(nul_at(&value), None);
    }
}
