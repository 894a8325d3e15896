//! Times as clients read them. The store keeps unix milliseconds (one integer
//! type on both backends, cheap to compare and to index); every row a client
//! sees serializes its times as RFC 3339 strings in UTC, so a reader never has
//! to guess the unit or the zone. The conversion lives here, on the rows'
//! `Serialize`, so no route can forget it.

use serde::Serializer;

/// `ms` (unix milliseconds) as RFC 3339 in UTC, to the millisecond when it
/// has them: `2026-12-01T19:35:50.123Z`. A value out of range (never written
/// by tok) is shown as its number of milliseconds.
pub fn format(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(at) => at.to_string(),
        Err(_) => ms.to_string(),
    }
}

/// [`format`] of an optional time; `None` stays `None` (JSON `null`).
pub fn format_opt(ms: Option<i64>) -> Option<String> {
    ms.map(format)
}

/// Parses an RFC 3339 time (`2026-12-01T19:35:50Z`, with any offset) into
/// unix milliseconds; the error says what was expected.
pub fn parse(text: &str) -> Result<i64, String> {
    text.parse::<jiff::Timestamp>()
        .map(|at| at.as_millisecond())
        .map_err(|e| format!("`{text}` is not an RFC 3339 time such as 2026-12-01T19:35:50Z: {e}"))
}

/// `#[serde(serialize_with = "crate::rfc3339::serialize")]` on an `i64` of
/// milliseconds.
pub fn serialize<S: Serializer>(ms: &i64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*ms))
}

/// `#[serde(serialize_with = "crate::rfc3339::serialize_opt")]` on an
/// `Option<i64>` of milliseconds.
pub fn serialize_opt<S: Serializer>(ms: &Option<i64>, serializer: S) -> Result<S::Ok, S::Error> {
    match ms {
        Some(ms) => serializer.serialize_str(&format(*ms)),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_read_as_utc_and_back() {
        assert_eq!(format(0), "1970-01-01T00:00:00Z");
        assert_eq!(format(1_764_617_750_123), "2025-12-01T19:35:50.123Z");
        assert_eq!(
            parse("2025-12-01T20:35:50.123+01:00"),
            Ok(1_764_617_750_123)
        );
        let err = parse("yesterday").unwrap_err();
        assert!(err.contains("`yesterday` is not an RFC 3339 time"), "{err}");
    }
}
