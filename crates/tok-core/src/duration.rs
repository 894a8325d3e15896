//! Human-written durations (`"30s"`, `"1h30m"`, `"1.5s"`) as used in retry
//! schedules and `wait` steps, and serde helpers that keep them in that form in
//! stored definitions. [`humanize`] says a delay as a log line does.

use std::time::Duration;

use thiserror::Error;

const ACCEPTED: &str = "a number followed by ms, s, m, h or d, optionally combined like `1h30m`";

/// Why a duration string was rejected. Every message repeats the input and the
/// accepted form so it can be shown to the author of the definition as is.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    #[error("duration `{input}` is empty; expected {ACCEPTED}")]
    Empty { input: String },
    #[error("duration `{input}` has no number at byte {at}; expected {ACCEPTED}")]
    MissingNumber { input: String, at: usize },
    #[error("duration `{input}` has a number without a unit at byte {at}; expected {ACCEPTED}")]
    MissingUnit { input: String, at: usize },
    #[error("duration `{input}` has the unknown unit `{unit}`; expected {ACCEPTED}")]
    UnknownUnit { input: String, unit: String },
    #[error("duration `{input}` is too long to represent")]
    Overflow { input: String },
}

const NANOS_PER_MS: u128 = 1_000_000;
const NANOS_PER_SEC: u128 = 1_000 * NANOS_PER_MS;
const NANOS_PER_MIN: u128 = 60 * NANOS_PER_SEC;
const NANOS_PER_HOUR: u128 = 60 * NANOS_PER_MIN;
const NANOS_PER_DAY: u128 = 24 * NANOS_PER_HOUR;

/// Parses `"500ms"`, `"30s"`, `"2m"`, `"1h"`, `"1d"`, decimals (`"1.5s"`) and
/// sequences of those (`"1h30m"`, summed). Surrounding whitespace is ignored;
/// whitespace inside is not accepted.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let input = s.trim();
    let err_input = || s.to_owned();
    if input.is_empty() {
        return Err(DurationError::Empty { input: err_input() });
    }
    let bytes = input.as_bytes();
    let mut pos = 0;
    let mut total: u128 = 0;
    while pos < bytes.len() {
        let number_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        let int_part = &input[number_start..pos];
        let mut frac_part = "";
        if pos < bytes.len() && bytes[pos] == b'.' {
            let frac_start = pos + 1;
            pos = frac_start;
            while pos < bytes.len() && bytes[pos].is_ascii_digit() {
                pos += 1;
            }
            frac_part = &input[frac_start..pos];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(DurationError::MissingNumber {
                input: err_input(),
                at: number_start,
            });
        }
        let unit_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_alphabetic() {
            pos += 1;
        }
        let unit = &input[unit_start..pos];
        let unit_nanos = match unit {
            "ms" => NANOS_PER_MS,
            "s" => NANOS_PER_SEC,
            "m" => NANOS_PER_MIN,
            "h" => NANOS_PER_HOUR,
            "d" => NANOS_PER_DAY,
            "" => {
                return Err(DurationError::MissingUnit {
                    input: err_input(),
                    at: unit_start,
                });
            }
            other => {
                return Err(DurationError::UnknownUnit {
                    input: err_input(),
                    unit: other.to_owned(),
                });
            }
        };
        let overflow = || DurationError::Overflow { input: err_input() };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| overflow())?
        };
        let mut part = whole.checked_mul(unit_nanos).ok_or_else(overflow)?;
        // Digits beyond nanosecond precision of a day cannot matter.
        let frac_digits = &frac_part[..frac_part.len().min(15)];
        if !frac_digits.is_empty() {
            let numerator: u128 = frac_digits.parse().map_err(|_| overflow())?;
            let denominator = 10u128.pow(u32::try_from(frac_digits.len()).unwrap_or(15));
            part = part
                .checked_add(numerator * unit_nanos / denominator)
                .ok_or_else(overflow)?;
        }
        total = total.checked_add(part).ok_or_else(overflow)?;
    }
    nanos_to_duration(total).ok_or_else(|| DurationError::Overflow { input: err_input() })
}

fn nanos_to_duration(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    let subsec = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, subsec))
}

/// The canonical text of a duration, which [`parse_duration`] reads back to the
/// same value: largest units first (`"1h30m"`, `"2m"`, `"1s500ms"`), `"0s"` for
/// zero, and a decimal millisecond part only below one millisecond.
pub fn format_duration(d: Duration) -> String {
    let mut nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("d", NANOS_PER_DAY),
        ("h", NANOS_PER_HOUR),
        ("m", NANOS_PER_MIN),
        ("s", NANOS_PER_SEC),
    ] {
        if nanos >= size {
            out.push_str(&format!("{}{unit}", nanos / size));
            nanos %= size;
        }
    }
    if nanos > 0 {
        let whole_ms = nanos / NANOS_PER_MS;
        let sub_ms = nanos % NANOS_PER_MS;
        if sub_ms == 0 {
            out.push_str(&format!("{whole_ms}ms"));
        } else {
            let frac = format!("{sub_ms:06}");
            out.push_str(&format!("{whole_ms}.{}ms", frac.trim_end_matches('0')));
        }
    }
    out
}

/// A delay for a log line: "800 ms", "30 s", "2 min", "1.0 h".
pub fn humanize(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 1.0 {
        format!("{} ms", d.as_millis())
    } else if secs < 120.0 {
        format!("{secs:.0} s")
    } else if secs < 7200.0 {
        format!("{:.0} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3600.0)
    }
}

/// `#[serde(with = "serde_duration")]` for one [`Duration`] written as `"30s"`.
pub mod serde_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the canonical text of [`super::format_duration`].
    pub fn serialize<S: Serializer>(d: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format_duration(*d))
    }

    /// Reads any form [`super::parse_duration`] accepts.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "serde_optional_duration")]` for an optional
/// [`Duration`] written as `"1h"`.
pub mod serde_optional_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        d: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => serializer.serialize_str(&super::format_duration(*d)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| super::parse_duration(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// `#[serde(with = "serde_durations")]` for a list of durations such as a retry
/// backoff schedule, written as `["30s", "2m"]`.
pub mod serde_durations {
    use std::time::Duration;

    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes each duration's canonical text.
    pub fn serialize<S: Serializer>(ds: &[Duration], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(ds.len()))?;
        for d in ds {
            seq.serialize_element(&super::format_duration(*d))?;
        }
        seq.end()
    }

    /// Reads a list of duration strings; the first bad one fails the whole list.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Duration>, D::Error> {
        let texts = Vec::<String>::deserialize(deserializer)?;
        texts
            .iter()
            .map(|t| super::parse_duration(t).map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn parses_each_unit() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), secs(30));
        assert_eq!(parse_duration("2m").unwrap(), secs(120));
        assert_eq!(parse_duration("1h").unwrap(), secs(3600));
        assert_eq!(parse_duration("1d").unwrap(), secs(86_400));
    }

    #[test]
    fn parses_combinations_and_decimals() {
        assert_eq!(parse_duration("1h30m").unwrap(), secs(5400));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration(".5m").unwrap(), secs(30));
        assert_eq!(parse_duration(" 1m1s ").unwrap(), secs(61));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
    }

    #[test]
    fn rejects_bad_input_with_the_input_and_units_in_the_message() {
        let err = parse_duration("10 minutes").unwrap_err();
        assert_eq!(
            err,
            DurationError::MissingUnit {
                input: "10 minutes".into(),
                at: 2
            }
        );
        let msg = parse_duration("5x").unwrap_err().to_string();
        assert!(
            msg.contains("`5x`") && msg.contains("ms, s, m, h or d"),
            "{msg}"
        );
        assert!(matches!(
            parse_duration("  "),
            Err(DurationError::Empty { .. })
        ));
        assert!(matches!(
            parse_duration("10"),
            Err(DurationError::MissingUnit { .. })
        ));
        assert!(matches!(
            parse_duration("s"),
            Err(DurationError::MissingNumber { .. })
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999d"),
            Err(DurationError::Overflow { .. })
        ));
    }

    #[test]
    fn formats_canonically_and_reads_back() {
        for (d, text) in [
            (secs(30), "30s"),
            (secs(120), "2m"),
            (secs(600), "10m"),
            (secs(3600), "1h"),
            (secs(5400), "1h30m"),
            (Duration::from_millis(1500), "1s500ms"),
            (Duration::from_nanos(1_500_000), "1.5ms"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text).unwrap(), d);
        }
    }

    #[test]
    fn serde_durations_round_trip_the_same_strings() {
        #[derive(Debug, serde::Serialize, serde::Deserialize)]
        struct Holder {
            #[serde(with = "serde_durations")]
            backoff: Vec<Duration>,
            #[serde(with = "serde_duration")]
            one: Duration,
        }
        let json = r#"{"backoff":["30s","2m","10m","1h"],"one":"1d"}"#;
        let h: Holder = serde_json::from_str(json).unwrap();
        assert_eq!(h.backoff, vec![secs(30), secs(120), secs(600), secs(3600)]);
        assert_eq!(serde_json::to_string(&h).unwrap(), json);
        let bad = serde_json::from_str::<Holder>(r#"{"backoff":["3 days"],"one":"1s"}"#);
        assert!(bad.unwrap_err().to_string().contains("`3 days`"));
    }
}
