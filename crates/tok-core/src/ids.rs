//! Identifiers of tok's records.
//!
//! Every record kind has its own newtype so a `RunId` can never be passed where a
//! `TenantId` is expected. Ids made by [`new_id`] start with a short prefix naming
//! the kind (`run_…`) and sort by creation time, which keeps indexes append-mostly
//! and makes listings naturally chronological.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The prefix [`Self::generate`] puts in front of new ids of this kind.
            pub const PREFIX: &'static str = $prefix;

            /// Wraps an existing id as is; no prefix is added or checked, so ids
            /// read back from storage or chosen by a caller keep their spelling.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// A fresh, time-ordered id with this kind's prefix (see [`new_id`]).
            pub fn generate() -> Self {
                Self(new_id(Self::PREFIX))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id as an owned string.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self(id.to_owned())
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A tenant: the owner of every other record. Every store function takes one.
    TenantId,
    "ten"
);
string_id!(
    /// A webhook source (`src_eshop`): where external events come in.
    SourceId,
    "src"
);
string_id!(
    /// An automation, across all of its versions.
    AutomationId,
    "aut"
);
string_id!(
    /// One run of one automation version.
    RunId,
    "run"
);
string_id!(
    /// An event in the inbox, external or internal.
    EventId,
    "evt"
);

/// A job row. Jobs are numbered by the database, so this is not a string id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub i64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<i64> for JobId {
    fn from(id: i64) -> Self {
        Self(id)
    }
}

/// A new id: `prefix`, `_`, then 32 lowercase hex digits made of 48 bits of
/// unix time in milliseconds (big endian) followed by 80 random bits.
///
/// Ids made later sort after ids made earlier (to the millisecond), so they can
/// serve as a creation-ordered primary key. This reads the system clock and the
/// thread's random generator; [`new_id_at`] is the pure form for tests.
pub fn new_id(prefix: &str) -> String {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let unix_ms = u64::try_from(unix_ms).unwrap_or(u64::MAX);
    new_id_at(prefix, unix_ms, &mut rand::rng())
}

/// [`new_id`] with the time and the random source given by the caller.
/// Only the low 48 bits of `unix_ms` are used (enough until the year 10889).
pub fn new_id_at(prefix: &str, unix_ms: u64, rng: &mut impl Rng) -> String {
    const TIME_MASK: u64 = (1 << 48) - 1;
    const RANDOM_MASK: u128 = (1 << 80) - 1;
    let random: u128 = rng.random::<u128>() & RANDOM_MASK;
    format!("{prefix}_{:012x}{random:020x}", unix_ms & TIME_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn new_id_has_prefix_and_32_lowercase_hex_digits() {
        let id = new_id("run");
        let hex = id.strip_prefix("run_").expect("prefix");
        assert_eq!(hex.len(), 32);
        assert!(
            hex.chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        );
    }

    #[test]
    fn new_id_at_puts_time_first_so_ids_sort_by_time() {
        let mut rng = StdRng::seed_from_u64(7);
        let earlier = new_id_at("evt", 1_700_000_000_000, &mut rng);
        let later = new_id_at("evt", 1_700_000_000_001, &mut rng);
        assert!(earlier < later, "{earlier} should sort before {later}");
        assert_eq!(&earlier[4..16], format!("{:012x}", 1_700_000_000_000u64));
    }

    #[test]
    fn new_id_at_differs_in_random_part() {
        let mut rng = StdRng::seed_from_u64(1);
        let a = new_id_at("x", 5, &mut rng);
        let b = new_id_at("x", 5, &mut rng);
        assert_ne!(a, b);
        assert_eq!(a[..14], b[..14]);
    }

    #[test]
    fn string_ids_serialize_transparently() {
        let id = RunId::new("run_abc");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"run_abc\"");
        let back: RunId = serde_json::from_str("\"run_abc\"").unwrap();
        assert_eq!(back, id);
        assert_eq!(back.to_string(), "run_abc");
        assert_eq!(TenantId::from("t1".to_owned()).as_str(), "t1");
        assert!(SourceId::generate().as_str().starts_with("src_"));
    }

    #[test]
    fn job_id_is_a_plain_number_in_json() {
        assert_eq!(serde_json::to_string(&JobId(42)).unwrap(), "42");
        assert_eq!(JobId::from(3).to_string(), "3");
    }
}
