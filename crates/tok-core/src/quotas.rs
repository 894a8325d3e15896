//! A tenant's quotas (docs/security.md, "Tenant quotas"): what one tenant
//! may take of the shared processes, set by the platform admin in
//! `tenants.settings.limits` (`PATCH /api/tenants/{id} {"settings":
//! {"limits": {…}}}`).
//!
//! The stored object holds only what the admin set; a quota left out is its
//! default, so a default changed in a later release reaches every tenant
//! that never chose. [`TenantLimits::apply`] checks an admin's change field
//! by field, so that a refusal names the one field that is wrong and what
//! it expects.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Signals a tenant may send per second (`signalsPerSecond`) unless the
/// admin says otherwise: far above what people and services waiting on
/// each other send, well below what would fill the shared writer.
pub const DEFAULT_SIGNALS_PER_SECOND: f64 = 100.0;
/// The burst of the default signal rate: two seconds' worth at once.
pub const DEFAULT_SIGNAL_BURST: u32 = 200;
/// Highest `signalsPerSecond` rate the admin may set.
pub const MAX_SIGNALS_PER_SECOND: f64 = 10_000.0;
/// Largest `signalsPerSecond` burst the admin may set.
pub const MAX_SIGNAL_BURST: u32 = 100_000;
/// Live streams (`GET /api/stream`) one API key may hold open at once
/// unless the admin says otherwise: a few browser tabs and a script.
pub const DEFAULT_STREAMS: u32 = 5;
/// Most live streams per key the admin may allow.
pub const MAX_STREAMS: u32 = 1000;
/// Highest tenant-wide `startsPerMinute` default the admin may set.
pub const MAX_STARTS_PER_MINUTE: u32 = 1_000_000;
/// Ceiling of `concurrency`: more steps in flight than a large fleet has
/// worker slots is no cap at all.
pub const MAX_TENANT_CONCURRENCY: u32 = 10_000;

/// A token bucket: `rate` per second on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    /// Tokens added per second (a fraction is allowed: `0.5` is one every
    /// two seconds).
    pub rate: f64,
    /// Most tokens the bucket holds: how many may come at once after a
    /// quiet while.
    pub burst: u32,
}

/// A tenant's quotas as the admin set them; `None` is the default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantLimits {
    /// `signalsPerSecond`: `POST /api/signals` of the tenant, per API
    /// process ([`DEFAULT_SIGNALS_PER_SECOND`], burst
    /// [`DEFAULT_SIGNAL_BURST`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals_per_second: Option<Rate>,
    /// `streams`: live streams open at once per API key, per API process
    /// ([`DEFAULT_STREAMS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u32>,
    /// `startsPerMinute`: the start limit of each of the tenant's
    /// automations that sets none itself (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_per_minute: Option<u32>,
    /// `concurrency`: steps of the tenant in flight at once across every
    /// process (none by default). A claim, and a dispatch handing first
    /// steps to its own slots, takes no job of the tenant while this many
    /// of its jobs hold a live lease; the count is the leases in the jobs'
    /// rows, so a slot comes back with its lease, a dead worker's included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

/// A refused change of a quota: the field (`settings.limits.<name>`) and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitError {
    pub field: String,
    pub message: String,
}

fn refused(name: &str, message: String) -> LimitError {
    let field = format!("settings.limits.{name}");
    LimitError {
        message: format!("{field}: {message}"),
        field,
    }
}

/// The names [`TenantLimits::apply`] takes, for its refusal of another.
const NAMES: &str = "signalsPerSecond, streams, startsPerMinute, concurrency";

impl TenantLimits {
    /// The signal rate in force.
    pub fn signal_rate(&self) -> Rate {
        self.signals_per_second.unwrap_or(Rate {
            rate: DEFAULT_SIGNALS_PER_SECOND,
            burst: DEFAULT_SIGNAL_BURST,
        })
    }

    /// Live streams per key in force.
    pub fn streams(&self) -> u32 {
        self.streams.unwrap_or(DEFAULT_STREAMS)
    }

    /// The limits as a tenant's stored settings hold them; a value that no
    /// longer reads (written by hand) counts as none set.
    pub fn of_settings(settings: &Value) -> Self {
        settings
            .get("limits")
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default()
    }

    /// Every quota in force, defaults filled in, as the API shows them.
    pub fn in_force(&self) -> Value {
        let rate = self.signal_rate();
        json!({
            "signalsPerSecond": { "rate": rate.rate, "burst": rate.burst },
            "streams": self.streams(),
            "startsPerMinute": self.starts_per_minute,
            "concurrency": self.concurrency,
        })
    }

    /// Applies the admin's change: each field named is set, `null` sets it
    /// back to its default, the others stay. Nothing is changed when a
    /// field is refused.
    pub fn apply(&mut self, change: &Map<String, Value>) -> Result<(), LimitError> {
        let mut next = self.clone();
        for (name, value) in change {
            match name.as_str() {
                "signalsPerSecond" => next.signals_per_second = rate(value)?,
                "streams" => {
                    next.streams = whole(name, value, 1, MAX_STREAMS, "live streams per API key")?
                }
                "startsPerMinute" => {
                    next.starts_per_minute = whole(
                        name,
                        value,
                        1,
                        MAX_STARTS_PER_MINUTE,
                        "runs each automation without a limit of its own may start per minute",
                    )?
                }
                "concurrency" => {
                    next.concurrency = whole(
                        name,
                        value,
                        1,
                        MAX_TENANT_CONCURRENCY,
                        "the tenant's steps in flight at once across every process",
                    )?
                }
                other => {
                    return Err(refused(
                        other,
                        format!("`{other}` is not a tenant limit; the limits are {NAMES}"),
                    ));
                }
            }
        }
        *self = next;
        Ok(())
    }
}

/// A whole number from `min` to `max`, or `null` for the default.
fn whole(
    name: &str,
    value: &Value,
    min: u32,
    max: u32,
    what: &str,
) -> Result<Option<u32>, LimitError> {
    if value.is_null() {
        return Ok(None);
    }
    value
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| (min..=max).contains(n))
        .map(Some)
        .ok_or_else(|| {
            refused(
                name,
                format!(
                    "{value} is not a whole number from {min} to {max} ({what}); null sets the default"
                ),
            )
        })
}

/// `signalsPerSecond`: a number (that rate, bursts of twice as many) or
/// `{rate, burst}`, or `null` for the default.
fn rate(value: &Value) -> Result<Option<Rate>, LimitError> {
    const NAME: &str = "signalsPerSecond";
    let expected = format!(
        "expected a rate per second above 0 and at most {MAX_SIGNALS_PER_SECOND} \
         (bursts of twice as many), or {{\"rate\": …, \"burst\": 1 to {MAX_SIGNAL_BURST}}}; \
         null sets the default ({DEFAULT_SIGNALS_PER_SECOND}, burst {DEFAULT_SIGNAL_BURST})"
    );
    let of_rate = |v: &Value| {
        v.as_f64()
            .filter(|r| *r > 0.0 && *r <= MAX_SIGNALS_PER_SECOND)
    };
    match value {
        Value::Null => Ok(None),
        Value::Number(_) => {
            let rate = of_rate(value)
                .ok_or_else(|| refused(NAME, format!("{value} is out of range; {expected}")))?;
            let burst = ((rate * 2.0).ceil() as u32).clamp(1, MAX_SIGNAL_BURST);
            Ok(Some(Rate { rate, burst }))
        }
        Value::Object(map) => {
            if let Some(other) = map.keys().find(|k| *k != "rate" && *k != "burst") {
                return Err(refused(
                    &format!("{NAME}.{other}"),
                    format!("`{other}` is not part of a rate; {expected}"),
                ));
            }
            let given = map.get("rate").unwrap_or(&Value::Null);
            let rate = of_rate(given).ok_or_else(|| {
                refused(
                    &format!("{NAME}.rate"),
                    format!("{given} is not a rate per second above 0 and at most {MAX_SIGNALS_PER_SECOND}"),
                )
            })?;
            let given = map.get("burst").unwrap_or(&Value::Null);
            let burst = given
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=MAX_SIGNAL_BURST).contains(n))
                .ok_or_else(|| {
                    refused(
                        &format!("{NAME}.burst"),
                        format!("{given} is not a whole number from 1 to {MAX_SIGNAL_BURST}"),
                    )
                })?;
            Ok(Some(Rate { rate, burst }))
        }
        other => Err(refused(
            NAME,
            format!("{other} is neither a number nor an object; {expected}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(change: Value) -> Result<TenantLimits, LimitError> {
        let mut limits = TenantLimits::default();
        limits.apply(change.as_object().unwrap())?;
        Ok(limits)
    }

    #[test]
    fn defaults_are_in_force_until_the_admin_sets_one() {
        let limits = TenantLimits::default();
        assert_eq!(
            limits.in_force(),
            json!({
                "signalsPerSecond": { "rate": 100.0, "burst": 200 },
                "streams": 5,
                "startsPerMinute": null,
                "concurrency": null,
            })
        );
        assert_eq!(serde_json::to_value(&limits).unwrap(), json!({}));
    }

    #[test]
    fn a_rate_is_a_number_or_rate_and_burst() {
        let limits = applied(json!({ "signalsPerSecond": 10 })).unwrap();
        assert_eq!(
            limits.signal_rate(),
            Rate {
                rate: 10.0,
                burst: 20
            }
        );
        let limits = applied(json!({ "signalsPerSecond": { "rate": 0.5, "burst": 3 } })).unwrap();
        assert_eq!(
            limits.signal_rate(),
            Rate {
                rate: 0.5,
                burst: 3
            }
        );
        let mut limits = limits;
        limits
            .apply(json!({ "signalsPerSecond": null }).as_object().unwrap())
            .unwrap();
        assert_eq!(limits.signal_rate().burst, DEFAULT_SIGNAL_BURST);
    }

    #[test]
    fn stored_limits_that_no_longer_read_are_none_set() {
        let settings = json!({ "limits": { "concurrency": "many" } });
        assert_eq!(
            TenantLimits::of_settings(&settings),
            TenantLimits::default()
        );
        let settings = json!({ "limits": { "concurrency": 3 } });
        assert_eq!(TenantLimits::of_settings(&settings).concurrency, Some(3));
    }

    #[test]
    fn a_refusal_names_its_field_and_changes_nothing() {
        let cases = [
            (
                json!({ "signalsPerSecond": 0 }),
                "settings.limits.signalsPerSecond",
            ),
            (
                json!({ "signalsPerSecond": "fast" }),
                "settings.limits.signalsPerSecond",
            ),
            (
                json!({ "signalsPerSecond": { "rate": 5 } }),
                "settings.limits.signalsPerSecond.burst",
            ),
            (
                json!({ "signalsPerSecond": { "rate": 5, "burst": 9, "x": 1 } }),
                "settings.limits.signalsPerSecond.x",
            ),
            (json!({ "streams": 0 }), "settings.limits.streams"),
            (json!({ "streams": 2.5 }), "settings.limits.streams"),
            (
                json!({ "startsPerMinute": -1 }),
                "settings.limits.startsPerMinute",
            ),
            (json!({ "stream": 3 }), "settings.limits.stream"),
            (json!({ "concurrency": 0 }), "settings.limits.concurrency"),
            (json!({ "concurrency": "2" }), "settings.limits.concurrency"),
            (
                json!({ "concurrency": 10_001 }),
                "settings.limits.concurrency",
            ),
        ];
        for (change, field) in cases {
            let mut limits = TenantLimits {
                streams: Some(7),
                ..TenantLimits::default()
            };
            let error = limits.apply(change.as_object().unwrap()).unwrap_err();
            assert_eq!(error.field, field, "{change}");
            assert!(error.message.starts_with(field), "{error:?}");
            assert_eq!(limits.streams, Some(7), "{change}: nothing changed");
        }
    }
}
