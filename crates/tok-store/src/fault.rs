//! Commit-then-error, injected for the fault suite (`crates/tok/tests/chaos.rs`).
//!
//! A database connection can fail after the server committed a transaction
//! but before the client heard so: the caller sees an error for a write
//! that happened. tok must come out of it with nothing lost and nothing
//! twice (a webhook sent again is found a duplicate; a record thought lost
//! is found moved on). To show it on a real process, the fault suite starts
//! `tok serve` with `TOK_FAULT_COMMIT_THEN_ERROR=record:N,inbox:N`: every
//! N-th batch of records, or of webhook events, commits and is then
//! answered as failed.
//!
//! The dispatch suite needs an event whose runs the database refuses, on
//! both backends, to show that the dispatcher sets it aside and goes on
//! with the others: a run whose event body has `"tok_fault":
//! "refuse_dispatch"` at its top is refused by the dispatch's
//! `insert_runs` ([`refuses_dispatch`]) as a database refuses invalid data.
//!
//! The hooks exist in debug builds only (the ones `cargo test` runs); a
//! release build compiles it to a constant `false` and never reads the
//! variable, so production has no fault path at all.

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Site {
    /// The records' group commit.
    Record,
    /// The webhook inbox's group commit.
    Inbox,
}

/// Whether this batch, committed, is to be answered as failed.
#[cfg(debug_assertions)]
pub(crate) fn commit_then_error(site: Site) -> bool {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static EVERY: OnceLock<(u64, u64)> = OnceLock::new();
    static COUNTS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
    let (record, inbox) = *EVERY.get_or_init(|| {
        let spec = std::env::var("TOK_FAULT_COMMIT_THEN_ERROR").unwrap_or_default();
        let every = |name: &str| {
            spec.split(',')
                .filter_map(|part| part.trim().split_once(':'))
                .find(|(site, _)| *site == name)
                .and_then(|(_, n)| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        (every("record"), every("inbox"))
    });
    let (every, count) = match site {
        Site::Record => (record, &COUNTS[0]),
        Site::Inbox => (inbox, &COUNTS[1]),
    };
    if every == 0 {
        return false;
    }
    let hit = (count.fetch_add(1, Ordering::Relaxed) + 1) % every == 0;
    if hit {
        tracing::warn!(site = ?site, "injected fault: a committed batch is answered as failed");
    }
    hit
}

/// Release builds: no fault is ever injected.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub(crate) fn commit_then_error(_site: Site) -> bool {
    false
}

/// The refusal of a dispatch's runs, when one of them is the dispatch
/// suite's culprit: its context's body says `"tok_fault":
/// "refuse_dispatch"`.
#[cfg(debug_assertions)]
pub(crate) fn refuses_dispatch<'a>(
    contexts: impl IntoIterator<Item = &'a serde_json::Value>,
) -> crate::Result<()> {
    let culprit = contexts
        .into_iter()
        .any(|context| context["_body"]["tok_fault"] == "refuse_dispatch");
    match culprit {
        true => Err(crate::StoreError::Refused(
            "injected fault: the database refused this event's runs as invalid data".into(),
        )),
        false => Ok(()),
    }
}

/// Release builds: nothing is refused.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub(crate) fn refuses_dispatch<'a>(
    _contexts: impl IntoIterator<Item = &'a serde_json::Value>,
) -> crate::Result<()> {
    Ok(())
}

/// The error a faulted batch is answered with.
pub(crate) fn injected() -> crate::StoreError {
    crate::StoreError::Unavailable("injected fault: the batch was committed, then failed".into())
}

/// `answers`, or the injected error when the batch is to fail after its commit.
pub(crate) fn after_commit<T>(site: Site, answers: crate::Result<T>) -> crate::Result<T> {
    match answers {
        Ok(_) if commit_then_error(site) => Err(injected()),
        answers => answers,
    }
}
