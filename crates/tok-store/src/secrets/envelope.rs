//! The sealed envelope as a column holds it, and what can be told of a
//! stored credential or signing secret without a key: whether it is
//! sealed, and under which key.

use serde_json::Value;

/// The envelope's version this code writes and reads.
pub(super) const ENVELOPE: &str = "v1";

/// Which key sealed what the `credentials` column holds; `None` for plain
/// credentials (or none).
pub fn sealed_under(stored: &Value) -> Option<&str> {
    Envelope::of(stored).map(|e| e.key)
}

/// Which key sealed what a source's secret column holds; `None` for a
/// plain secret.
pub fn text_sealed_under(stored: &str) -> Option<String> {
    envelope_text(stored).and_then(|v| Envelope::of(&v).map(|e| e.key.to_owned()))
}

/// The envelope a secret column's text holds, if it holds one: a plain
/// secret (never JSON of an envelope's shape) is not taken for one.
pub(super) fn envelope_text(stored: &str) -> Option<Value> {
    if !stored.starts_with('{') {
        return None;
    }
    serde_json::from_str::<Value>(stored)
        .ok()
        .filter(|v| Envelope::of(v).is_some())
}

/// Whether a connection holds credentials, read from its column without
/// opening them.
pub fn holds_credentials(stored: &Value) -> bool {
    Envelope::of(stored).is_some() || !is_empty(stored)
}

pub(super) fn is_empty(credentials: &Value) -> bool {
    match credentials {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

/// The fields of a sealed envelope: an object of exactly these four
/// strings (a plain credential of another shape is not taken for one).
pub(super) struct Envelope<'a> {
    pub(super) version: &'a str,
    pub(super) key: &'a str,
    pub(super) nonce: &'a str,
    pub(super) data: &'a str,
}

impl<'a> Envelope<'a> {
    pub(super) fn of(stored: &'a Value) -> Option<Self> {
        let map = stored.as_object()?;
        if map.len() != 4 {
            return None;
        }
        let field = |name: &str| map.get(name).and_then(Value::as_str);
        Some(Self {
            version: field("sealed")?,
            key: field("key")?,
            nonce: field("nonce")?,
            data: field("data")?,
        })
    }
}
