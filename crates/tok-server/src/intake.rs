//! What protects the inbox before a webhook is written: a rate limit per
//! webhook token, and backpressure — when the queue behind the inbox is
//! deeper than a threshold, sources not marked critical get 429 so the
//! senders retry later, while critical sources are still accepted.
//!
//! Both are kept in the API process's memory: a token's rate limit holds per
//! API process (the bucket is [`crate::quotas::Buckets`]) (with several API processes behind a balancer, the limit is
//! per process), and the queue depth is sampled every second, not read per
//! request, so the webhook stays one insert.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Deserialize as _;
use tok_core::contract::Param;
use tok_core::ids::{SourceId, TenantId};
use tok_store::Source;

use crate::senders::Preset;

/// How long a webhook token's source is kept in memory: the webhook path
/// then reads nothing before its one insert. A change, rotation or delete
/// forgets the source in the process that made it at once; another API
/// process sees it within this time.
const SOURCE_TTL: Duration = Duration::from_secs(10);

/// Describes the webhooks' counter: its `# HELP` in `/metrics`.
pub(crate) fn describe() {
    metrics::describe_counter!(
        "tok_webhooks_total",
        "Webhooks answered 202, by outcome: accepted (a new event) or duplicate (its idempotency key was seen)"
    );
}

/// A webhook source as ingest reads it: the row, its params contract, its
/// sender and its schema, parsed and compiled once when the source is
/// cached rather than on every request.
pub(crate) struct WebhookSource {
    pub(crate) source: Source,
    /// The declared params; a declaration that does not parse counts as
    /// none (the source API validates them before saving).
    pub(crate) params: Vec<Param>,
    /// Whose signature it checks: `None` for a source without a secret;
    /// `Err(name)` for a sender this version of tok does not know (a newer
    /// one saved it), whose webhooks are all refused rather than let in
    /// unchecked.
    pub(crate) preset: Option<Result<Preset, String>>,
    /// The compiled schema; `Err` with why, should a saved schema no
    /// longer compile or cost more than this version allows (one saved
    /// before its cost was bounded): its webhooks are then refused, never
    /// let through.
    pub(crate) schema: Option<Result<Arc<crate::body_schema::Checker>, String>>,
    /// Whether the tenant requires its webhooks signed
    /// (`settings.webhooks.requireSignature`, else the platform's
    /// `TOK_REQUIRE_SIGNED_WEBHOOKS`), as it was when the source was read.
    pub(crate) require_signature: bool,
    /// Until when the token it was found by opens it (ms since the epoch):
    /// the overlap's end for the token before a rotation, else none.
    until: Option<i64>,
}

impl WebhookSource {
    pub(crate) fn new(source: Source, token: &str, require_signature: bool) -> Self {
        let params = Vec::<Param>::deserialize(&source.params).unwrap_or_default();
        let until = source.token_until(token);
        let preset = source.secret.as_ref().map(|_| {
            let name = source.verify_preset.as_deref().unwrap_or("standard");
            Preset::parse(name).ok_or_else(|| name.to_owned())
        });
        let schema = source.schema.as_ref().map(|schema| {
            crate::body_schema::compile(schema)
                .map(Arc::new)
                .map_err(|e| e.message)
        });
        Self {
            source,
            params,
            preset,
            schema,
            require_signature,
            until,
        }
    }
}

/// Sources by webhook token, for [`SOURCE_TTL`]. A hit hands out a shared
/// reference: nothing of the source is copied per request.
#[derive(Default)]
pub(crate) struct SourceCache {
    by_token: Mutex<HashMap<String, (Arc<WebhookSource>, Instant)>>,
}

impl SourceCache {
    pub(crate) fn get(&self, token: &str, now: Instant) -> Option<Arc<WebhookSource>> {
        let cache = self.by_token.lock().unwrap_or_else(|e| e.into_inner());
        let wall = tok_store::now_ms();
        cache
            .get(token)
            .filter(|(_, at)| now.saturating_duration_since(*at) < SOURCE_TTL)
            .filter(|(s, _)| s.until.is_none_or(|until| until > wall))
            .map(|(s, _)| Arc::clone(s))
    }

    /// Keeps `source` as what `token` opens. A source with a schema is
    /// compiled on a blocking thread (a schema kept may take tens of
    /// milliseconds to compile), not on the threads that serve requests.
    pub(crate) async fn put(
        &self,
        token: &str,
        source: Source,
        require_signature: bool,
        now: Instant,
    ) -> Arc<WebhookSource> {
        let source = if source.schema.is_some() {
            let owned = token.to_owned();
            let made = tokio::task::spawn_blocking(move || {
                WebhookSource::new(source, &owned, require_signature)
            });
            match made.await {
                Ok(made) => Arc::new(made),
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        } else {
            Arc::new(WebhookSource::new(source, token, require_signature))
        };
        let mut cache = self.by_token.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() > 100_000 {
            cache.clear();
        }
        cache.insert(token.to_owned(), (Arc::clone(&source), now));
        source
    }

    /// Drops every token of the source `id`, after it changed.
    pub(crate) fn forget(&self, id: &SourceId) {
        let mut cache = self.by_token.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|_, (s, _)| s.source.id != *id);
    }

    /// Drops every source of `tenant`, after its settings changed.
    pub(crate) fn forget_tenant(&self, tenant: &TenantId) {
        let mut cache = self.by_token.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|_, (s, _)| s.source.tenant_id != *tenant);
    }
}

/// The webhook counters, registered with the metrics recorder on the first
/// webhook (after `tok serve` installed its recorder) instead of being
/// looked up by name and labels on every request.
#[derive(Default)]
pub(crate) struct IngestMetrics {
    counters: OnceLock<[metrics::Counter; 2]>,
}

impl IngestMetrics {
    /// Counts one answered webhook in `tok_webhooks_total{outcome}`.
    pub(crate) fn webhook(&self, duplicate: bool) {
        let [accepted, repeated] = self.counters.get_or_init(|| {
            [
                metrics::counter!("tok_webhooks_total", "outcome" => "accepted"),
                metrics::counter!("tok_webhooks_total", "outcome" => "duplicate"),
            ]
        });
        if duplicate { repeated } else { accepted }.increment(1);
    }
}

/// A token bucket per source: `rate` requests per second, bursts of `rate`
/// (the buckets the tenants' signal rates use too).
pub(crate) type TokenLimits = crate::quotas::Buckets<SourceId>;

/// The queue depth the backpressure decision reads, and its threshold.
pub(crate) struct Backpressure {
    pub(crate) threshold: i64,
    depth: AtomicI64,
}

impl Backpressure {
    pub(crate) fn new(threshold: i64) -> Self {
        Self {
            threshold,
            depth: AtomicI64::new(0),
        }
    }

    pub(crate) fn record(&self, depth: i64) {
        self.depth.store(depth, Ordering::Relaxed);
    }

    /// Whether non-critical sources should be turned away now.
    pub(crate) fn overloaded(&self) -> Option<i64> {
        let depth = self.depth.load(Ordering::Relaxed);
        (depth > self.threshold).then_some(depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_rate_then_waits() {
        let limits = TokenLimits::default();
        let source = SourceId::from("src_1");
        let t0 = Instant::now();
        assert!(limits.take(&source, 2.0, 2.0, t0).is_ok());
        assert!(limits.take(&source, 2.0, 2.0, t0).is_ok());
        let wait = limits.take(&source, 2.0, 2.0, t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(
            limits
                .take(&source, 2.0, 2.0, t0 + Duration::from_millis(500))
                .is_ok()
        );
    }

    fn source(
        secret: Option<&str>,
        preset: Option<&str>,
        schema: Option<serde_json::Value>,
    ) -> Source {
        Source {
            id: SourceId::from("src_1"),
            tenant_id: TenantId::from("ten_1"),
            name: "shop".into(),
            token: "tok_1".into(),
            params: serde_json::json!([]),
            critical: false,
            rate_limit: None,
            secret: secret.map(str::to_owned),
            verify_preset: preset.map(str::to_owned),
            schema,
            previous_token: None,
            previous_token_until: None,
            previous_secret: None,
            previous_secret_until: None,
            created_at: 0,
            secret_error: None,
        }
    }

    #[test]
    fn a_sources_sender_is_read_once_and_an_unknown_one_lets_nothing_in() {
        let plain = WebhookSource::new(source(None, None, None), "tok_1", false);
        assert!(plain.preset.is_none());
        // A secret without a sender's name is Standard Webhooks'.
        let older = WebhookSource::new(source(Some("s"), None, None), "tok_1", false);
        assert_eq!(older.preset, Some(Ok(Preset::Standard)));
        let github = WebhookSource::new(source(Some("s"), Some("github"), None), "tok_1", false);
        assert_eq!(github.preset, Some(Ok(Preset::Github)));
        // A sender a newer tok saved: known as such, never as no sender.
        let newer = WebhookSource::new(source(Some("s"), Some("paypal"), None), "tok_1", false);
        assert_eq!(newer.preset, Some(Err("paypal".to_owned())));
    }

    #[test]
    fn a_sources_schema_is_compiled_when_it_is_cached() {
        let schema = serde_json::json!({ "required": ["id"] });
        let cached = WebhookSource::new(source(None, None, Some(schema)), "tok_1", false);
        let compiled = cached.schema.unwrap().unwrap();
        assert!(compiled.check_now(&serde_json::json!({})).is_err());
        assert!(compiled.check_now(&serde_json::json!({ "id": 1 })).is_ok());
        let broken = serde_json::json!({ "type": 5 });
        let cached = WebhookSource::new(source(None, None, Some(broken)), "tok_1", false);
        assert!(
            cached.schema.unwrap().is_err(),
            "kept as broken, not as none"
        );
    }

    #[test]
    fn backpressure_starts_past_its_threshold() {
        let pressure = Backpressure::new(100);
        pressure.record(100);
        assert_eq!(pressure.overloaded(), None);
        pressure.record(101);
        assert_eq!(pressure.overloaded(), Some(101));
    }
}
