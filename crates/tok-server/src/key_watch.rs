//! Whether the keys of open live streams still work. A request is checked
//! once, when it arrives ([`crate::auth`]); a stream (`GET /api/stream`)
//! stays open for hours, so the key it was opened with is looked up again
//! by its hash every [`CHECK_EVERY`], the very lookup every request makes,
//! from this process: a key revoked through any process (`DELETE
//! /api/keys/{id}`, or the platform admin key rotated out) or past its
//! `expires_at` ends the streams it holds open on every process within
//! about [`CHECK_EVERY`].
//!
//! One check per key, however many streams it holds open: the first stream
//! of a key starts its check, the others follow the same answer, and the
//! check stops once the key's last stream ended. A database that does not
//! answer keeps the streams open (the next check decides), as it keeps no
//! one signed in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tok_store::{KeyStore, Store};
use tokio::sync::watch;

/// How often the key of an open stream is looked up again.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Why a stream's key stopped working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyEnd {
    /// Still works.
    Valid,
    /// Revoked (or no longer there).
    Revoked,
    /// Past its `expires_at`.
    Expired,
}

/// The keys that hold streams open in this process, each with the answer
/// of its last check.
#[derive(Default)]
pub(crate) struct KeyWatch {
    watched: Arc<Mutex<HashMap<String, Watched>>>,
    checks: AtomicU64,
}

struct Watched {
    /// Tells whether the key still works.
    state: watch::Sender<KeyEnd>,
    /// Which check this is, so that an ended check removes only its own
    /// entry.
    check: u64,
}

impl KeyWatch {
    /// Follows the key of this hash (its SHA-256, as stored): the receiver
    /// turns from [`KeyEnd::Valid`] once the key is revoked or expired.
    pub(crate) fn follow(&self, store: &Arc<dyn Store>, hash: &str) -> watch::Receiver<KeyEnd> {
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = watched.get(hash)
            && *w.state.borrow() == KeyEnd::Valid
        {
            return w.state.subscribe();
        }
        let (state, receiver) = watch::channel(KeyEnd::Valid);
        let check = self.checks.fetch_add(1, Ordering::Relaxed);
        watched.insert(
            hash.to_owned(),
            Watched {
                state: state.clone(),
                check,
            },
        );
        tokio::spawn(check_until_ended(
            Arc::clone(store),
            Arc::clone(&self.watched),
            hash.to_owned(),
            state,
            check,
        ));
        receiver
    }
}

/// Looks the key up every [`CHECK_EVERY`] until it stops working (and says
/// so to its streams) or its last stream ended.
async fn check_until_ended(
    store: Arc<dyn Store>,
    watched: Arc<Mutex<HashMap<String, Watched>>>,
    hash: String,
    state: watch::Sender<KeyEnd>,
    check: u64,
) {
    let forget = || {
        let mut watched = watched.lock().unwrap_or_else(|e| e.into_inner());
        if watched.get(&hash).is_some_and(|w| w.check == check) {
            watched.remove(&hash);
        }
    };
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        {
            // Under the lock a new stream of the key subscribes under, so
            // none subscribes to a check that is ending.
            let mut held = watched.lock().unwrap_or_else(|e| e.into_inner());
            if state.receiver_count() == 0 {
                if held.get(&hash).is_some_and(|w| w.check == check) {
                    held.remove(&hash);
                }
                return;
            }
        }
        let end = match KeyStore::key_by_hash(&*store, &hash).await {
            Ok(Some(key)) if key.expired(tok_store::now_ms()) => KeyEnd::Expired,
            Ok(Some(_)) => KeyEnd::Valid,
            Ok(None) => KeyEnd::Revoked,
            Err(e) => {
                tracing::debug!(error = %e, "could not check the key of an open stream");
                KeyEnd::Valid
            }
        };
        if end != KeyEnd::Valid {
            forget();
            state.send_replace(end);
            return;
        }
    }
}
