//! Which addresses tok refuses to call for a tenant: every range that
//! leads into the platform's own network rather than to a public service
//! (docs/security.md, "Calls tok makes for a tenant").
//!
//! The ranges are a table of CIDRs held in `ipnet` networks, so each
//! refusal can name the range it fell in. The standard library's
//! `is_private`/`is_loopback`/… do not cover CGNAT (`is_shared` is
//! unstable) nor say which range matched, and no well-kept crate holds this
//! list as a policy; the table is the whole of what is written by hand.
//! IPv6 forms that carry an IPv4 address (IPv4-mapped `::ffff:0:0/96`,
//! NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are judged by the IPv4 address
//! they lead to; the deprecated IPv4-compatible `::/96` is refused whole.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use ipnet::{IpNet, Ipv6Net};

/// IPv4 ranges tok does not call, with what each is.
const V4: &[(&str, &str)] = &[
    ("0.0.0.0/8", "an unspecified (\"this network\") address"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a carrier-grade NAT (shared) address"),
    ("127.0.0.0/8", "a loopback address"),
    (
        "169.254.0.0/16",
        "a link-local address (cloud metadata services live here)",
    ),
    ("172.16.0.0/12", "a private address"),
    (
        "192.0.0.0/24",
        "an IETF protocol assignment (not a public service)",
    ),
    ("192.168.0.0/16", "a private address"),
    (
        "198.18.0.0/15",
        "a benchmarking address (used inside networks)",
    ),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved or broadcast address"),
];

/// IPv6 ranges tok does not call (the forms that embed an IPv4 address are
/// judged separately, by that address).
const V6: &[(&str, &str)] = &[
    ("::/128", "the unspecified address"),
    ("::1/128", "the loopback address"),
    ("::/96", "an IPv4-compatible address (deprecated)"),
    ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("2001::/32", "a Teredo tunnel address"),
    ("fc00::/7", "a unique local (private) address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address (deprecated)"),
    ("ff00::/8", "a multicast address"),
];

struct Range {
    net: IpNet,
    what: &'static str,
}

fn table(entries: &[(&str, &'static str)]) -> Vec<Range> {
    entries
        .iter()
        .map(|(cidr, what)| Range {
            net: cidr.parse().expect("the table's CIDRs are valid"),
            what,
        })
        .collect()
}

static V4_RANGES: LazyLock<Vec<Range>> = LazyLock::new(|| table(V4));
static V6_RANGES: LazyLock<Vec<Range>> = LazyLock::new(|| table(V6));

/// Why an address is refused: the range it is in and what that range is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub address: IpAddr,
    pub range: IpNet,
    pub what: String,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is {} ({})", self.address, self.what, self.range)
    }
}

/// The reason `ip` must not be called for a tenant, or `None` for a public
/// address.
pub fn denied(ip: IpAddr) -> Option<Denied> {
    match ip {
        IpAddr::V4(v4) => denied_v4(v4).map(|(range, what)| Denied {
            address: ip,
            range,
            what: what.to_owned(),
        }),
        IpAddr::V6(v6) => denied_v6(v6),
    }
}

fn denied_v4(ip: Ipv4Addr) -> Option<(IpNet, &'static str)> {
    V4_RANGES
        .iter()
        .find(|r| r.net.contains(&IpAddr::V4(ip)))
        .map(|r| (r.net, r.what))
}

fn denied_v6(ip: Ipv6Addr) -> Option<Denied> {
    if let Some((form, v4)) = embedded_v4(ip) {
        return denied_v4(v4).map(|(range, what)| Denied {
            address: IpAddr::V6(ip),
            range,
            what: format!("the {form} form of {v4}, {what}"),
        });
    }
    V6_RANGES
        .iter()
        .find(|r| r.net.contains(&IpAddr::V6(ip)))
        .map(|r| Denied {
            address: IpAddr::V6(ip),
            range: r.net,
            what: r.what.to_owned(),
        })
}

static MAPPED: LazyLock<Ipv6Net> = LazyLock::new(|| "::ffff:0:0/96".parse().expect("valid"));
static NAT64: LazyLock<Ipv6Net> = LazyLock::new(|| "64:ff9b::/96".parse().expect("valid"));
static SIX_TO_FOUR: LazyLock<Ipv6Net> = LazyLock::new(|| "2002::/16".parse().expect("valid"));

/// The IPv4 address an IPv6 address leads to, for the forms that carry one.
fn embedded_v4(ip: Ipv6Addr) -> Option<(&'static str, Ipv4Addr)> {
    let o = ip.octets();
    if MAPPED.contains(&ip) {
        return Some(("IPv4-mapped", Ipv4Addr::new(o[12], o[13], o[14], o[15])));
    }
    if NAT64.contains(&ip) {
        return Some(("NAT64", Ipv4Addr::new(o[12], o[13], o[14], o[15])));
    }
    if SIX_TO_FOUR.contains(&ip) {
        return Some(("6to4", Ipv4Addr::new(o[2], o[3], o[4], o[5])));
    }
    None
}

/// Whether `ip` lies in one of `nets` (an IPv4-mapped address counts as
/// its IPv4 address, so `127.0.0.1/32` also opens `::ffff:127.0.0.1`).
pub(crate) fn within(nets: &[IpNet], ip: IpAddr) -> bool {
    let v4 = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4),
        IpAddr::V4(_) => None,
    };
    nets.iter()
        .any(|n| n.contains(&ip) || v4.is_some_and(|v4| n.contains(&v4)))
}

/// An IPv4 network as a `IpNet` (for tests and the allow list).
#[cfg(test)]
fn v4net(s: &str) -> IpNet {
    IpNet::V4(s.parse::<ipnet::Ipv4Net>().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> Option<String> {
        denied(s.parse().unwrap()).map(|d| d.to_string())
    }

    #[test]
    fn every_internal_ipv4_range_is_refused_with_its_name() {
        for (ip, range) in [
            ("0.0.0.0", "0.0.0.0/8"),
            ("10.1.2.3", "10.0.0.0/8"),
            ("100.64.0.1", "100.64.0.0/10"),
            ("100.127.255.254", "100.64.0.0/10"),
            ("127.0.0.1", "127.0.0.0/8"),
            ("127.255.0.9", "127.0.0.0/8"),
            ("169.254.169.254", "169.254.0.0/16"),
            ("172.16.0.1", "172.16.0.0/12"),
            ("172.31.255.255", "172.16.0.0/12"),
            ("192.168.1.1", "192.168.0.0/16"),
            ("224.0.0.1", "224.0.0.0/4"),
            ("239.255.255.250", "224.0.0.0/4"),
            ("255.255.255.255", "240.0.0.0/4"),
            ("192.0.0.8", "192.0.0.0/24"),
            ("198.19.0.1", "198.18.0.0/15"),
        ] {
            let message = refused(ip).unwrap_or_else(|| panic!("{ip} must be refused"));
            assert!(message.contains(range), "{ip}: {message}");
            assert!(message.starts_with(ip), "{message}");
        }
        assert!(refused("169.254.169.254").unwrap().contains("link-local"));
        assert!(refused("100.64.0.1").unwrap().contains("carrier-grade NAT"));
    }

    #[test]
    fn public_addresses_and_the_edges_of_ranges_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "169.253.255.255",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(refused(ip), None, "{ip} is public");
        }
    }

    #[test]
    fn internal_ipv6_ranges_are_refused() {
        for (ip, what) in [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fc00::1", "unique local"),
            ("fd12:3456::1", "unique local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
            ("::127.0.0.1", "IPv4-compatible"),
            ("::8.8.8.8", "IPv4-compatible"),
            ("2001:0:4136:e378::1", "Teredo"),
            ("64:ff9b:1::a00:1", "local-use NAT64"),
        ] {
            let message = refused(ip).unwrap_or_else(|| panic!("{ip} must be refused"));
            assert!(message.contains(what), "{ip}: {message}");
        }
    }

    #[test]
    fn forms_that_embed_an_ipv4_address_are_judged_by_it() {
        for (ip, v4, range) in [
            ("::ffff:127.0.0.1", "127.0.0.1", "127.0.0.0/8"),
            (
                "::ffff:169.254.169.254",
                "169.254.169.254",
                "169.254.0.0/16",
            ),
            ("::ffff:10.0.0.1", "10.0.0.1", "10.0.0.0/8"),
            ("::ffff:100.64.0.1", "100.64.0.1", "100.64.0.0/10"),
            ("::ffff:0.0.0.0", "0.0.0.0", "0.0.0.0/8"),
            ("64:ff9b::7f00:1", "127.0.0.1", "127.0.0.0/8"),
            ("64:ff9b::a9fe:a9fe", "169.254.169.254", "169.254.0.0/16"),
            ("2002:7f00:1::", "127.0.0.1", "127.0.0.0/8"),
            ("2002:c0a8:101::1", "192.168.1.1", "192.168.0.0/16"),
        ] {
            let message = refused(ip).unwrap_or_else(|| panic!("{ip} must be refused"));
            assert!(message.contains(v4), "{ip}: {message}");
            assert!(message.contains(range), "{ip}: {message}");
        }
        assert!(refused("::ffff:127.0.0.1").unwrap().contains("IPv4-mapped"));
    }

    #[test]
    fn an_allowed_ipv4_network_also_opens_its_mapped_form() {
        let nets = [v4net("127.0.0.1/32")];
        assert!(within(&nets, "127.0.0.1".parse().unwrap()));
        assert!(within(&nets, "::ffff:127.0.0.1".parse().unwrap()));
        assert!(!within(&nets, "127.0.0.2".parse().unwrap()));
        assert!(!within(&nets, "::1".parse().unwrap()));
    }
}
