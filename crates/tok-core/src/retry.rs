//! Retry policies and the decision, after a failed attempt, whether and when
//! to try again.
//!
//! The engine calls [`RetryPolicy::resolve`] with the step's and the
//! automation's policies, then [`decide`] with the step's [`StepError`]; the
//! returned [`Decision`] is data (the job's next `run_after`, or failing the
//! run), so the whole schedule is testable without a clock.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::duration::serde_durations;
use crate::error::StepError;
use crate::limits::MAX_ATTEMPTS_CAP;

/// How many attempts a step gets and how long to wait between them.
/// `backoff[i]` is the wait after failed attempt `i + 1`; when the list is
/// shorter than the attempts, its last entry repeats. Written as
/// `{"max_attempts": 5, "backoff": ["30s", "2m", "10m", "1h"]}`; either key may
/// be left out and takes the default's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    #[serde(with = "serde_durations")]
    pub backoff: Vec<Duration>,
}

impl Default for RetryPolicy {
    /// Attempt 1 now, then after 30 s, 2 min, 10 min and 1 h.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            backoff: vec![
                Duration::from_secs(30),
                Duration::from_secs(2 * 60),
                Duration::from_secs(10 * 60),
                Duration::from_secs(60 * 60),
            ],
        }
    }
}

impl RetryPolicy {
    /// The policy in force for a step: the step's own, else the automation's,
    /// else the default; `max_attempts` clamped to `1..=MAX_ATTEMPTS_CAP`.
    pub fn resolve(step: Option<&RetryPolicy>, automation: Option<&RetryPolicy>) -> RetryPolicy {
        let mut policy = step.or(automation).cloned().unwrap_or_default();
        policy.max_attempts = policy.max_attempts.clamp(1, MAX_ATTEMPTS_CAP);
        policy
    }

    /// The scheduled wait after attempt `failed_attempt` failed, before
    /// jitter, or `None` when no attempt is left. Attempts count from one (zero
    /// is read as one); an empty backoff list means retrying immediately.
    pub fn base_delay(&self, failed_attempt: u32) -> Option<Duration> {
        let attempt = failed_attempt.max(1);
        if attempt >= self.max_attempts {
            return None;
        }
        let i = usize::try_from(attempt - 1).unwrap_or(usize::MAX);
        Some(
            self.backoff
                .get(i)
                .or(self.backoff.last())
                .copied()
                .unwrap_or(Duration::ZERO),
        )
    }

    /// The wait before the next attempt: [`Self::base_delay`] with ±10 %
    /// uniform jitter, so many runs failing together do not retry together.
    pub fn delay_after(&self, failed_attempt: u32, rng: &mut impl Rng) -> Option<Duration> {
        let base = self.base_delay(failed_attempt)?;
        let nanos = base.as_nanos();
        let spread = nanos / 10;
        let jittered = nanos - spread + rng.random_range(0..=2 * spread);
        Some(duration_from_nanos(jittered))
    }
}

fn duration_from_nanos(nanos: u128) -> Duration {
    const PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / PER_SEC).unwrap_or(u64::MAX);
    let subsec = u32::try_from(nanos % PER_SEC).unwrap_or(0);
    Duration::new(secs, subsec)
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Run the step again after this long.
    RetryIn(Duration),
    /// Give up: the run fails at this step.
    Fail,
}

/// Decides after attempt `failed_attempt` (1-based) failed with `err`:
/// terminal errors fail at once; retryable ones follow the policy's jittered
/// schedule; `RetryAfter` waits exactly what the other side asked for (never
/// less), while attempts remain.
pub fn decide(
    err: &StepError,
    failed_attempt: u32,
    policy: &RetryPolicy,
    rng: &mut impl Rng,
) -> Decision {
    let delay = match err {
        StepError::Terminal(_) => None,
        StepError::Retryable(_) => policy.delay_after(failed_attempt, rng),
        StepError::RetryAfter { after, .. } => policy.base_delay(failed_attempt).map(|_| *after),
        // Nothing was attempted, so no attempt is spent.
        StepError::Deferred { after, .. } => Some(*after),
    };
    delay.map_or(Decision::Fail, Decision::RetryIn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn within_ten_percent(d: Duration, base: Duration) -> bool {
        d >= base - base / 10 && d <= base + base / 10
    }

    #[test]
    fn default_schedule_matches_design() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_attempts, 5);
        assert_eq!(p.base_delay(1), Some(secs(30)));
        assert_eq!(p.base_delay(2), Some(secs(120)));
        assert_eq!(p.base_delay(3), Some(secs(600)));
        assert_eq!(p.base_delay(4), Some(secs(3600)));
        assert_eq!(p.base_delay(5), None);
    }

    #[test]
    fn delay_after_jitters_within_ten_percent_and_repeats_the_last_entry() {
        let p = RetryPolicy {
            max_attempts: 10,
            backoff: vec![secs(10), secs(100)],
        };
        let mut rng = StdRng::seed_from_u64(3);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let d = p.delay_after(1, &mut rng).unwrap();
            assert!(within_ten_percent(d, secs(10)), "{d:?}");
            seen.insert(d);
            let d = p.delay_after(7, &mut rng).unwrap();
            assert!(within_ten_percent(d, secs(100)), "{d:?}");
        }
        assert!(seen.len() > 1, "jitter must vary the delay");
        assert_eq!(p.delay_after(10, &mut rng), None);
        assert_eq!(p.delay_after(11, &mut rng), None);
    }

    #[test]
    fn resolve_prefers_step_then_automation_and_caps_attempts() {
        let step = RetryPolicy {
            max_attempts: 2,
            backoff: vec![secs(1)],
        };
        let automation = RetryPolicy {
            max_attempts: 50,
            backoff: vec![secs(5)],
        };
        assert_eq!(RetryPolicy::resolve(Some(&step), Some(&automation)), step);
        let from_automation = RetryPolicy::resolve(None, Some(&automation));
        assert_eq!(from_automation.max_attempts, MAX_ATTEMPTS_CAP);
        assert_eq!(from_automation.backoff, vec![secs(5)]);
        assert_eq!(RetryPolicy::resolve(None, None), RetryPolicy::default());
        let zero = RetryPolicy {
            max_attempts: 0,
            backoff: vec![],
        };
        assert_eq!(RetryPolicy::resolve(Some(&zero), None).max_attempts, 1);
    }

    #[test]
    fn decide_follows_the_error_kind() {
        let p = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(9);
        assert_eq!(
            decide(&StepError::terminal("400"), 1, &p, &mut rng),
            Decision::Fail
        );
        match decide(&StepError::retryable("503"), 2, &p, &mut rng) {
            Decision::RetryIn(d) => assert!(within_ten_percent(d, secs(120)), "{d:?}"),
            Decision::Fail => panic!("attempt 2 of 5 must be retried"),
        }
        assert_eq!(
            decide(&StepError::retryable("503"), 5, &p, &mut rng),
            Decision::Fail
        );
        assert_eq!(
            decide(&StepError::retry_after("429", secs(7)), 1, &p, &mut rng),
            Decision::RetryIn(secs(7))
        );
        assert_eq!(
            decide(&StepError::retry_after("429", secs(7)), 5, &p, &mut rng),
            Decision::Fail
        );
    }

    #[test]
    fn serde_uses_design_shape_and_defaults_missing_keys() {
        let p: RetryPolicy =
            serde_json::from_str(r#"{"max_attempts":3,"backoff":["1s","1m"]}"#).unwrap();
        assert_eq!(p.backoff, vec![secs(1), secs(60)]);
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"max_attempts":3,"backoff":["1s","1m"]}"#
        );
        let only_attempts: RetryPolicy = serde_json::from_str(r#"{"max_attempts":2}"#).unwrap();
        assert_eq!(only_attempts.backoff, RetryPolicy::default().backoff);
        let typo = serde_json::from_str::<RetryPolicy>(r#"{"maxAttempts":2}"#).unwrap_err();
        assert!(typo.to_string().contains("maxAttempts"), "{typo}");
    }
}
