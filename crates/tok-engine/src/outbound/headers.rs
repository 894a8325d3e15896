//! Request headers tok never sends for a tenant, on any outbound call (an
//! `http` step, a widget, a poll, a connection's own `credentials.headers`,
//! an `mcp` server's): a request goes where its URL says and is framed by
//! the HTTP client, so a header cannot send it (and the credentials it
//! carries) to another virtual host of the same address or another
//! upstream of a proxy.

/// Request headers tok never sends for a tenant, lowercase, and why: each
/// names where the request goes (another virtual host at the same address,
/// a proxy's upstream, another path) or how it is framed, which are the
/// URL's and the HTTP client's to say. Sent with a connection's
/// credentials, the first kind would take them to another site than the
/// origin they are bound to.
pub const UNSENT: &[(&str, &str)] = &[
    ("host", ROUTING),
    ("forwarded", ROUTING),
    ("x-forwarded-host", ROUTING),
    ("x-forwarded-server", ROUTING),
    ("x-host", ROUTING),
    ("x-original-url", ROUTING),
    ("x-rewrite-url", ROUTING),
    ("connection", FRAMING),
    ("keep-alive", FRAMING),
    ("proxy-connection", FRAMING),
    ("proxy-authorization", FRAMING),
    ("te", FRAMING),
    ("trailer", FRAMING),
    ("transfer-encoding", FRAMING),
    ("upgrade", FRAMING),
    ("content-length", FRAMING),
];

const ROUTING: &str = "it would send the request (and a connection's credentials) elsewhere \
                       than its URL says: write the host and path in `url`";
const FRAMING: &str = "hop-by-hop and framing headers are tok's HTTP client's to set";

/// Why header `name` is not sent, if it is one of [`UNSENT`].
pub fn unsent(name: &str) -> Option<String> {
    let lower = name.trim().to_ascii_lowercase();
    UNSENT
        .iter()
        .find(|(unsent, _)| *unsent == lower)
        .map(|(_, why)| format!("http header `{name}` is not sent: {why}"))
}

/// Headers that ask a service to take a request for another method than
/// the one it was sent with (a `GET` read as a `DELETE`). A widget's
/// request is a read: it sends none of them.
pub const METHOD_OVERRIDES: &[&str] = &[
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Whether header `name` is one of [`METHOD_OVERRIDES`].
pub fn overrides_method(name: &str) -> bool {
    METHOD_OVERRIDES.contains(&name.trim().to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_known_whatever_their_case() {
        assert!(unsent("Host").unwrap().contains("`Host`"));
        assert!(unsent(" X-Forwarded-Host ").is_some());
        assert!(unsent("transfer-encoding").is_some());
        assert!(unsent("X-Api-Key").is_none());
        assert!(unsent("Authorization").is_none());
        assert!(overrides_method("X-HTTP-Method-Override"));
        assert!(!overrides_method("X-Method"));
    }
}
