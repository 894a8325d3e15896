//! `TOK_OUTBOUND_ALLOW`: the exceptions an operator opens in the outbound
//! guard. Comma-separated entries, each one of
//!
//! - a CIDR (`10.20.0.0/16`, `fd00::/8`) or a single address (`10.1.2.3`):
//!   every port of those addresses, however the URL names them (an address
//!   or a name that resolves to one);
//! - `host:port` (`localhost:8080`, `127.0.0.1:9000`, `[::1]:9000`): that
//!   port of that host, matched against the URL's host as written;
//! - `any`, alone: no guard at all, for a laptop.
//!
//! The default (empty) allows nothing but public addresses.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::address;

/// The outbound guard's exceptions (see the module doc). `Default` is the
/// closed guard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboundAllow {
    any: bool,
    nets: Vec<IpNet>,
    /// Hosts as written (lower case, no trailing dot, IPv6 without brackets).
    hosts: Vec<(String, u16)>,
}

impl OutboundAllow {
    /// No guard: every address may be called (`TOK_OUTBOUND_ALLOW=any`).
    pub fn any() -> Self {
        Self {
            any: true,
            ..Self::default()
        }
    }

    /// Opens one `host:port` (tests and benches that call a local service).
    pub fn host_port(host: &str, port: u16) -> Self {
        Self {
            hosts: vec![(normalize(host), port)],
            ..Self::default()
        }
    }

    /// Parses `TOK_OUTBOUND_ALLOW`; the error names the entry it could not
    /// read and says what an entry may be.
    pub fn parse(text: &str) -> Result<Self, String> {
        let entries: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        let mut allow = Self::default();
        for entry in &entries {
            if entry.eq_ignore_ascii_case("any") {
                if entries.len() > 1 {
                    return Err(format!(
                        "TOK_OUTBOUND_ALLOW: `any` turns the guard off and stands alone; \
                         it was given with {} other entries",
                        entries.len() - 1
                    ));
                }
                return Ok(Self::any());
            }
            if let Ok(net) = entry.parse::<IpNet>() {
                allow.nets.push(net.trunc());
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                allow.nets.push(IpNet::from(ip));
            } else if let Some((host, port)) = split_host_port(entry) {
                allow.hosts.push((host, port));
            } else {
                return Err(format!(
                    "TOK_OUTBOUND_ALLOW: `{entry}` is not an entry tok can read; expected a CIDR \
                     (10.20.0.0/16), an address (10.1.2.3), host:port (localhost:8080, \
                     [::1]:9000) or `any`"
                ));
            }
        }
        Ok(allow)
    }

    /// Adds the entries of `other` (a test's service beside the defaults).
    pub fn with(mut self, other: OutboundAllow) -> Self {
        self.any |= other.any;
        self.nets.extend(other.nets);
        self.hosts.extend(other.hosts);
        self
    }

    /// The guard is off (`any`).
    pub fn is_any(&self) -> bool {
        self.any
    }

    /// `ip` is in an allowed network (whatever the port).
    pub(crate) fn allows_address(&self, ip: IpAddr) -> bool {
        self.any || address::within(&self.nets, ip)
    }

    /// `host` (as the URL writes it) on `port` is an allowed `host:port`.
    pub(crate) fn allows_host_port(&self, host: &str, port: u16) -> bool {
        let host = normalize(host);
        self.any || self.hosts.iter().any(|(h, p)| *h == host && *p == port)
    }

    /// `host` is the host of some `host:port` entry: its resolved addresses
    /// are let through by the resolver, which does not know the port; the
    /// port is checked before the request is sent.
    pub(crate) fn names_host(&self, host: &str) -> bool {
        let host = normalize(host);
        self.hosts.iter().any(|(h, _)| *h == host)
    }
}

impl fmt::Display for OutboundAllow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.any {
            return f.write_str("any");
        }
        let mut entries: Vec<String> = self.nets.iter().map(ToString::to_string).collect();
        entries.extend(self.hosts.iter().map(|(h, p)| {
            if h.contains(':') {
                format!("[{h}]:{p}")
            } else {
                format!("{h}:{p}")
            }
        }));
        f.write_str(&entries.join(","))
    }
}

/// Lower case, without a trailing dot or IPv6 brackets: how a host is
/// compared.
fn normalize(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

fn split_host_port(entry: &str) -> Option<(String, u16)> {
    let (host, port) = entry.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    let host = if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?;
        inner.parse::<std::net::Ipv6Addr>().ok()?;
        inner.to_owned()
    } else {
        // A bare IPv6 address would be ambiguous (`::1:8080`).
        if host.contains(':') {
            return None;
        }
        // A fully qualified name's trailing dot ends no label.
        let name = host.strip_suffix('.').unwrap_or(host);
        let valid = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        if !valid {
            return None;
        }
        host.to_owned()
    };
    Some((normalize(&host), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_allows_nothing_internal() {
        let allow = OutboundAllow::default();
        assert!(!allow.is_any());
        assert!(!allow.allows_address("127.0.0.1".parse().unwrap()));
        assert!(!allow.allows_host_port("localhost", 8080));
        assert_eq!(OutboundAllow::parse("").unwrap(), allow);
        assert_eq!(OutboundAllow::parse(" , ").unwrap(), allow);
    }

    #[test]
    fn cidrs_addresses_and_host_ports_are_read() {
        let allow =
            OutboundAllow::parse("10.20.0.0/16, 192.168.1.7,fd00::/8, LocalHost.:8080,[::1]:9000")
                .unwrap();
        assert!(allow.allows_address("10.20.3.4".parse().unwrap()));
        assert!(!allow.allows_address("10.21.0.1".parse().unwrap()));
        assert!(allow.allows_address("192.168.1.7".parse().unwrap()));
        assert!(!allow.allows_address("192.168.1.8".parse().unwrap()));
        assert!(allow.allows_address("fd00::5".parse().unwrap()));
        assert!(allow.allows_host_port("localhost", 8080));
        assert!(allow.allows_host_port("LOCALHOST.", 8080));
        assert!(!allow.allows_host_port("localhost", 8081));
        assert!(allow.allows_host_port("[::1]", 9000));
        assert!(allow.allows_host_port("::1", 9000));
        assert!(allow.names_host("localhost"));
        assert!(!allow.names_host("example.com"));
        assert_eq!(
            allow.to_string(),
            "10.20.0.0/16,192.168.1.7/32,fd00::/8,localhost:8080,[::1]:9000"
        );
        // Host bits of a CIDR are dropped, as the network means.
        let truncated = OutboundAllow::parse("10.1.2.3/8").unwrap();
        assert!(truncated.allows_address("10.200.0.1".parse().unwrap()));
    }

    #[test]
    fn any_stands_alone_and_turns_the_guard_off() {
        let allow = OutboundAllow::parse("ANY").unwrap();
        assert!(allow.is_any());
        assert!(allow.allows_address("169.254.169.254".parse().unwrap()));
        let mixed = OutboundAllow::parse("any,10.0.0.0/8").unwrap_err();
        assert!(mixed.contains("stands alone"), "{mixed}");
    }

    #[test]
    fn a_bad_entry_is_named() {
        for bad in [
            "localhost",
            "10.0.0.0/33",
            "host:0",
            "host:99999",
            "[::1]",
            "[nothost]:80",
            "http://localhost:8080",
            "exa mple.com:80",
            ":80",
        ] {
            let error = OutboundAllow::parse(&format!("10.0.0.0/8,{bad}")).unwrap_err();
            assert!(error.contains(&format!("`{bad}`")), "{bad}: {error}");
            assert!(error.contains("TOK_OUTBOUND_ALLOW"), "{error}");
            assert!(error.contains("host:port"), "{error}");
        }
    }
}
