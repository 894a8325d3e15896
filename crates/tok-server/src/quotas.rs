//! The tenant quotas the API holds in its process's memory (docs/security.md,
//! "Tenant quotas"): each tenant's signal rate (`signalsPerSecond`, a token
//! bucket per tenant, the same mechanism as a webhook source's
//! `rate_limit`), the live streams each API key holds open (`streams`), and
//! each widget's refreshes ([`WIDGET_REFRESHES`]).
//!
//! Both hold per API process: with several API processes behind a
//! balancer, a tenant may send up to that many times its rate and hold that
//! many times its streams. That is what they are for: they keep one tenant
//! from taking a process (its writer, its memory, its connections), and a
//! count shared across processes would cost a database write per signal,
//! the very load the rate bounds. An operator who needs a fleet-wide
//! figure sets each tenant's rate divided by the number of API processes.
//!
//! The tenant's limits are read from its row and kept for [`KEPT_FOR`]; the
//! admin's `PATCH` through this process forgets them (and the tenant's
//! bucket, so that a raised rate holds at once), through another process
//! they hold here at most [`KEPT_FOR`] later.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tok_core::ids::TenantId;
use tok_core::quotas::TenantLimits;
use tok_store::Store;

/// How long a tenant's limits are kept before its row is read again.
pub(crate) const KEPT_FOR: Duration = Duration::from_secs(5);

/// Token buckets by key: `rate` tokens a second, at most `burst` held.
/// Written by hand: the bucket is a dozen lines, and the crates that have
/// one (governor) fix the rate per limiter, where here each key's rate is
/// its tenant's or its source's setting of the moment.
pub(crate) struct Buckets<K> {
    buckets: Mutex<HashMap<K, (f64, Instant)>>,
}

impl<K> Default for Buckets<K> {
    fn default() -> Self {
        Self {
            buckets: Mutex::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    /// Takes one token from the key's bucket (full at first), or says how
    /// long until the next one is there.
    pub(crate) fn take(
        &self,
        key: &K,
        rate: f64,
        burst: f64,
        now: Instant,
    ) -> Result<(), Duration> {
        let rate = rate.max(f64::MIN_POSITIVE);
        let burst = burst.max(1.0);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, at) = buckets.entry(key.clone()).or_insert((burst, now));
        let refilled =
            (*tokens + now.saturating_duration_since(*at).as_secs_f64() * rate).min(burst);
        *at = now;
        if refilled >= 1.0 {
            *tokens = refilled - 1.0;
            Ok(())
        } else {
            *tokens = refilled;
            Err(Duration::from_secs_f64(
                ((1.0 - refilled) / rate).min(86_400.0),
            ))
        }
    }

    /// Forgets the key's bucket: the next take finds it full.
    pub(crate) fn forget(&self, key: &K) {
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// How often a widget may be refreshed (`?refresh=true`), per API
/// process: a refresh every 10 seconds after a burst of 3. Anyone with a
/// `read` key may refresh a widget, and each refresh is a call through its
/// connection: the limit keeps a read key from turning a tile into a flood
/// of credentialed calls (the cache still answers every read).
pub(crate) const WIDGET_REFRESHES: (f64, f64) = (0.1, 3.0);

/// Each tenant's limits, its signal bucket, the streams open per key, and
/// each widget's refreshes.
#[derive(Default)]
pub(crate) struct Quotas {
    limits: Mutex<HashMap<TenantId, (TenantLimits, Instant)>>,
    signals: Buckets<TenantId>,
    streams: Arc<Mutex<HashMap<String, u32>>>,
    refreshes: Buckets<(TenantId, String)>,
}

/// One open stream's place in its key's count, given back when dropped
/// (the stream ended or its client went away).
pub(crate) struct StreamPlace {
    key: String,
    streams: Arc<Mutex<HashMap<String, u32>>>,
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = streams.get_mut(&self.key) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                streams.remove(&self.key);
            }
        }
    }
}

impl Quotas {
    /// The tenant's limits, from memory when read less than [`KEPT_FOR`] ago.
    pub(crate) async fn limits(
        &self,
        store: &Arc<dyn Store>,
        tenant: &TenantId,
    ) -> tok_store::Result<TenantLimits> {
        {
            let kept = self.limits.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((limits, at)) = kept.get(tenant)
                && at.elapsed() < KEPT_FOR
            {
                return Ok(limits.clone());
            }
        }
        let limits = store
            .tenant(tenant)
            .await?
            .map(|t| t.limits)
            .unwrap_or_default();
        self.limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tenant.clone(), (limits.clone(), Instant::now()));
        Ok(limits)
    }

    /// The admin changed the tenant: its limits are read again, and its
    /// signal bucket starts full under the new rate.
    pub(crate) fn tenant_changed(&self, tenant: &TenantId) {
        self.limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tenant);
        self.signals.forget(tenant);
    }

    /// Takes one signal of the tenant's rate, or says how long until the
    /// next is allowed.
    pub(crate) fn take_signal(
        &self,
        tenant: &TenantId,
        limits: &TenantLimits,
        now: Instant,
    ) -> Result<(), Duration> {
        let rate = limits.signal_rate();
        self.signals
            .take(tenant, rate.rate, f64::from(rate.burst), now)
    }

    /// Takes one refresh of the tenant's widget `id` (a widget that exists:
    /// the buckets are per widget, never per name a caller makes up), or
    /// says how long until the next is allowed.
    pub(crate) fn take_refresh(
        &self,
        tenant: &TenantId,
        id: &str,
        now: Instant,
    ) -> Result<(), Duration> {
        let (rate, burst) = WIDGET_REFRESHES;
        self.refreshes
            .take(&(tenant.clone(), id.to_owned()), rate, burst, now)
    }

    /// Takes a place for one more stream of the key (its hash), or refuses
    /// it with the limit when `limits.streams()` are open.
    pub(crate) fn open_stream(
        &self,
        key_hash: &str,
        limits: &TenantLimits,
    ) -> Result<StreamPlace, u32> {
        let limit = limits.streams();
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let open = streams.entry(key_hash.to_owned()).or_default();
        if *open >= limit {
            return Err(limit);
        }
        *open += 1;
        Ok(StreamPlace {
            key: key_hash.to_owned(),
            streams: Arc::clone(&self.streams),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let buckets = Buckets::default();
        let t0 = Instant::now();
        for _ in 0..200 {
            assert!(buckets.take(&"t", 100.0, 200.0, t0).is_ok());
        }
        let wait = buckets.take(&"t", 100.0, 200.0, t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(10));
        assert!(
            buckets
                .take(&"t", 100.0, 200.0, t0 + Duration::from_millis(10))
                .is_ok()
        );
        buckets.forget(&"t");
        assert!(buckets.take(&"t", 100.0, 200.0, t0).is_ok(), "full again");
    }

    #[test]
    fn a_dropped_stream_gives_its_place_back() {
        let quotas = Quotas::default();
        let limits = TenantLimits {
            streams: Some(2),
            ..TenantLimits::default()
        };
        let first = quotas.open_stream("k", &limits).ok().unwrap();
        let _second = quotas.open_stream("k", &limits).ok().unwrap();
        assert_eq!(quotas.open_stream("k", &limits).err(), Some(2));
        assert!(quotas.open_stream("other key", &limits).is_ok());
        drop(first);
        assert!(quotas.open_stream("k", &limits).is_ok());
    }
}
