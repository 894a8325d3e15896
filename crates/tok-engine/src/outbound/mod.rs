//! The outbound guard: the one way tok calls a service for a tenant (the
//! `http` step, widgets, `mcp` over HTTP, and polls, whose request is a
//! run's first step). See docs/architecture.md, "The outbound guard", and
//! docs/security.md, "Calls tok makes for a tenant".
//!
//! A call flows through three checks, each on what is really connected:
//!
//! 1. Before each request (the first and every redirect hop, which tok
//!    follows itself, at most [`MAX_REDIRECTS`]): a URL whose host is an
//!    address is judged here, since the HTTP client does not resolve
//!    literals; a `host:port` of `TOK_OUTBOUND_ALLOW` is matched here, where
//!    the port is known.
//! 2. At resolution: the client's resolver ([`GuardedResolver`]) returns
//!    only the addresses the guard allows, so the address connected is the
//!    address judged and a name that resolves to a public address once and
//!    to 127.0.0.1 the next time (DNS rebinding) cannot pass.
//! 3. While reading: answers are read against the byte budget
//!    ([`body`]), never whole.
//!
//! Environment proxies are off: a proxy would connect in tok's place and
//! bypass every check. A refusal is an [`Refused`] error whose text begins
//! with `outbound_refused:`, names the address and `TOK_OUTBOUND_ALLOW`,
//! and carries nothing of any answer. Credentials keep to their origin
//! ([`origin`]): a redirect off the origin they are bound to is refused
//! before it is followed.

mod address;
mod allow;
pub(crate) mod body;
pub mod headers;
pub mod origin;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{self, HeaderMap};
use reqwest::{Method, StatusCode, Url};

pub use address::{Denied, denied};
pub use allow::OutboundAllow;

/// Redirects followed per call; the sixth is refused.
pub const MAX_REDIRECTS: usize = 5;

/// The code that begins every refusal's message (and a widget's 400).
pub const REFUSED: &str = "outbound_refused";

/// A call the guard would not make: what was to be called and why not.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{REFUSED}: tok does not call {target} for a tenant: {reason}; the platform's operator \
     can open it with TOK_OUTBOUND_ALLOW"
)]
pub struct Refused {
    /// `127.0.0.1:8080`, or a name and the address it resolved to.
    pub target: String,
    /// Why: the range the address is in.
    pub reason: String,
}

/// The guarded client, built once per handler from the allow list. Cheap to
/// clone.
#[derive(Clone)]
pub struct Outbound {
    allow: Arc<OutboundAllow>,
    client: reqwest::Client,
}

impl Outbound {
    /// A guard that opens exactly `allow`'s exceptions.
    pub fn new(allow: &OutboundAllow) -> Self {
        let allow = Arc::new(allow.clone());
        let client = guarded(&allow)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self { allow, client }
    }

    pub fn allow(&self) -> &OutboundAllow {
        &self.allow
    }

    /// A client for callers that drive their own requests (rmcp): the same
    /// resolver, no proxies, no redirects. Each request's URL must still go
    /// through [`Outbound::check`] first, for addresses written as such.
    pub(crate) fn client_for(
        &self,
        configure: impl FnOnce(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
    ) -> reqwest::Client {
        configure(guarded(&self.allow).redirect(reqwest::redirect::Policy::none()))
            .build()
            .unwrap_or_default()
    }

    /// Judges a URL before it is requested: an address written in it, and a
    /// `host:port` exception. Names are judged by address when the client
    /// resolves them; [`Outbound::check_before_send`] adds a named
    /// exception's other ports. The scheme is the callers' to judge.
    pub fn check(&self, url: &Url) -> Result<(), Refused> {
        if self.allow.is_any() {
            return Ok(());
        }
        let port = url.port_or_known_default().unwrap_or(0);
        match url.host() {
            None => Err(Refused {
                target: url.as_str().to_owned(),
                reason: "the URL has no host".into(),
            }),
            Some(url::Host::Ipv4(ip)) => self.check_address(IpAddr::V4(ip), port),
            Some(url::Host::Ipv6(ip)) => self.check_address(IpAddr::V6(ip), port),
            Some(url::Host::Domain(_)) => Ok(()),
        }
    }

    fn check_address(&self, ip: IpAddr, port: u16) -> Result<(), Refused> {
        if self.allow.allows_address(ip) || self.allow.allows_host_port(&ip.to_string(), port) {
            return Ok(());
        }
        match denied(ip) {
            None => Ok(()),
            Some(d) => Err(Refused {
                target: SocketAddr::new(ip, port).to_string(),
                reason: d.to_string(),
            }),
        }
    }

    /// Everything judged of a URL before a request to it: [`Outbound::check`]
    /// and a named exception's other ports. For callers that send their
    /// own requests through [`Outbound::client_for`]'s client.
    pub(crate) async fn check_before_send(&self, url: &Url) -> Result<(), Refused> {
        self.check(url)?;
        self.check_named_exception(url).await
    }

    /// A name that is the host of a `host:port` exception passes the
    /// resolver whatever it resolves to; on another port than the
    /// exception's, it is resolved and judged here instead.
    async fn check_named_exception(&self, url: &Url) -> Result<(), Refused> {
        let (Some(url::Host::Domain(name)), Some(port)) = (url.host(), url.port_or_known_default())
        else {
            return Ok(());
        };
        if self.allow.is_any()
            || !self.allow.names_host(name)
            || self.allow.allows_host_port(name, port)
        {
            return Ok(());
        }
        let addrs = tokio::net::lookup_host((name, port))
            .await
            .map_err(|e| Refused {
                target: format!("{name}:{port}"),
                reason: format!("it could not be resolved: {e}"),
            })?;
        for addr in addrs {
            if !self.allow.allows_address(addr.ip())
                && let Some(d) = denied(addr.ip())
            {
                return Err(Refused {
                    target: format!("{name}:{port} ({})", addr.ip()),
                    reason: format!("{d}, and TOK_OUTBOUND_ALLOW opens {name} on other ports only"),
                });
            }
        }
        Ok(())
    }

    /// Sends `exchange`, following redirects itself so that each hop is
    /// judged before it is requested. Returns the final answer's head; its
    /// body is the caller's to read, through [`body`].
    pub(crate) async fn send(&self, exchange: Exchange) -> Result<reqwest::Response, SendError> {
        let Exchange {
            mut method,
            mut url,
            mut headers,
            mut body,
            timeout,
            credentials_origin,
            lease,
        } = exchange;
        let deadline = Instant::now() + timeout;
        for hop in 0..=MAX_REDIRECTS {
            self.check_before_send(&url)
                .await
                .map_err(SendError::Refused)?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let mut request = self
                .client
                .request(method.clone(), url.clone())
                .headers(headers.clone())
                .timeout(remaining.max(Duration::from_millis(1)));
            if let Some(body) = &body {
                request = request.body(body.clone());
            }
            if lease.as_ref().is_some_and(|lease| !lease.held()) {
                return Err(SendError::LeaseRanOut);
            }
            let response = request.send().await.map_err(SendError::from_reqwest)?;
            let status = response.status();
            let location = response
                .headers()
                .get(header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_owned);
            let follows = matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308);
            let (true, Some(location)) = (follows, location) else {
                return Ok(response);
            };
            drop(response);
            let next = url.join(&location).map_err(|e| {
                SendError::Redirect(format!(
                    "{method} {url} answered {status} with a Location tok cannot read \
                     (`{location}`: {e})"
                ))
            })?;
            if hop == MAX_REDIRECTS {
                return Err(SendError::Redirect(format!(
                    "{method} {url} answered {status} after {MAX_REDIRECTS} redirects; \
                     tok follows at most {MAX_REDIRECTS}"
                )));
            }
            if !matches!(next.scheme(), "http" | "https") {
                return Err(SendError::Redirect(format!(
                    "{method} {url} redirected to `{next}`, which is not http or https"
                )));
            }
            if let Some(origin) = &credentials_origin
                && next.origin() != *origin
            {
                return Err(SendError::Redirect(format!(
                    "{}: {method} {url} redirected to {}, another origin than {}; \
                     the connection's credentials are sent only to its base_url's origin, \
                     so the redirect is not followed",
                    origin::MISMATCH,
                    next.origin().ascii_serialization(),
                    origin.ascii_serialization()
                )));
            }
            if next.origin() != url.origin() {
                for name in [
                    header::AUTHORIZATION,
                    header::COOKIE,
                    header::PROXY_AUTHORIZATION,
                ] {
                    headers.remove(name);
                }
            }
            // As browsers do: a 303, or a 301/302 answering a POST, turns
            // into a GET without the body; 307 and 308 keep both.
            let to_get = status == StatusCode::SEE_OTHER && method != Method::HEAD
                || matches!(status.as_u16(), 301 | 302) && method == Method::POST;
            if to_get {
                method = Method::GET;
                body = None;
                headers.remove(header::CONTENT_TYPE);
                headers.remove(header::CONTENT_LENGTH);
            }
            url = next;
        }
        unreachable!("the last hop returns")
    }
}

/// A client builder with the guard's resolver and no proxies.
fn guarded(allow: &Arc<OutboundAllow>) -> reqwest::ClientBuilder {
    // TLS uses rustls with the ring provider (a lighter build than the
    // default); installing it twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .dns_resolver(GuardedResolver {
            allow: allow.clone(),
        })
        .connect_timeout(Duration::from_secs(5))
        .user_agent(concat!("tok/", env!("CARGO_PKG_VERSION")))
}

/// One request as a caller describes it.
pub(crate) struct Exchange {
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Option<Vec<u8>>,
    /// For the whole call: every hop and the answer's body.
    pub(crate) timeout: Duration,
    /// The origin credentials in `headers` are bound to: a redirect off it
    /// is refused rather than followed.
    pub(crate) credentials_origin: Option<url::Origin>,
    /// The worker's hold on the step's job, checked at the last moment
    /// before each request goes out ([`SendError::LeaseRanOut`]).
    pub(crate) lease: Option<crate::registry::Lease>,
}

/// Why [`Outbound::send`] got no answer.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The guard refused an address (terminal).
    Refused(Refused),
    /// A redirect tok will not follow (terminal).
    Redirect(String),
    /// The request failed on its way (the caller classifies it).
    Http(reqwest::Error),
    /// The worker's lease on the step's job ran out before the request
    /// went out: it was not sent (another worker may run the step now).
    LeaseRanOut,
}

impl SendError {
    fn from_reqwest(e: reqwest::Error) -> Self {
        match refusal_in(&e) {
            Some(refused) => SendError::Refused(refused.clone()),
            None => SendError::Http(e),
        }
    }
}

/// The guard's refusal behind an HTTP client's error, if that is why it
/// failed (the resolver's refusal comes back as a connect error).
pub fn refusal_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(refused) = e.downcast_ref::<Refused>() {
            return Some(refused);
        }
        current = e.source();
    }
    None
}

/// The client's resolver: the system's resolution, then only the addresses
/// the guard allows.
struct GuardedResolver {
    allow: Arc<OutboundAllow>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            // A `host:port` exception's host: its port was checked before
            // the request went out.
            if allow.is_any() || allow.names_host(&host) {
                return Ok(Box::new(addrs.into_iter()) as Addrs);
            }
            let mut refused = None;
            let mut kept = Vec::with_capacity(addrs.len());
            for addr in addrs {
                match denied(addr.ip()) {
                    Some(d) if !allow.allows_address(addr.ip()) => {
                        refused.get_or_insert(d);
                    }
                    _ => kept.push(addr),
                }
            }
            if kept.is_empty()
                && let Some(d) = refused
            {
                let error = Refused {
                    target: format!("{host} ({})", d.address),
                    reason: d.to_string(),
                };
                return Err(Box::new(error) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(allow: &str, url: &str) -> Result<(), String> {
        Outbound::new(&OutboundAllow::parse(allow).unwrap())
            .check(&Url::parse(url).unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn addresses_written_in_urls_are_judged_before_sending() {
        for url in [
            "http://127.0.0.1:8080/metrics",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:a9fe:a9fe]/",
            "http://0.0.0.0/",
            // Other spellings of 127.0.0.1 that URL parsing turns into it.
            "http://2130706433/",
            "http://0x7f.1/",
            "http://127.1/",
        ] {
            let error = check("", url).unwrap_err();
            assert!(error.starts_with("outbound_refused: "), "{url}: {error}");
            assert!(error.contains("TOK_OUTBOUND_ALLOW"), "{error}");
        }
        let error = check("", "http://169.254.169.254/latest/meta-data/").unwrap_err();
        assert!(error.contains("169.254.169.254:80"), "{error}");
        assert!(error.contains("link-local"), "{error}");
        assert!(check("", "https://8.8.8.8/").is_ok());
        assert!(
            check("", "https://example.com/").is_ok(),
            "names wait for the resolver"
        );
    }

    #[test]
    fn exceptions_open_exactly_what_they_name() {
        assert!(check("127.0.0.1:8080", "http://127.0.0.1:8080/x").is_ok());
        assert!(check("127.0.0.1:8080", "http://127.0.0.1:8081/x").is_err());
        assert!(check("127.0.0.0/8", "http://127.0.0.5:22/").is_ok());
        assert!(check("127.0.0.0/8", "http://[::ffff:127.0.0.5]:22/").is_ok());
        assert!(check("127.0.0.0/8", "http://[::1]/").is_err());
        assert!(check("[::1]:9000", "http://[::1]:9000/").is_ok());
        assert!(check("any", "http://169.254.169.254/").is_ok());
    }

    #[tokio::test]
    async fn the_resolver_returns_no_refused_address() {
        let resolver = GuardedResolver {
            allow: Arc::new(OutboundAllow::default()),
        };
        let error = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => panic!("localhost resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e,
        };
        let refused = refusal_in(error.as_ref()).expect("the guard's refusal");
        assert!(refused.target.starts_with("localhost ("), "{refused}");
        assert!(refused.reason.contains("loopback"), "{refused}");

        let open = GuardedResolver {
            allow: Arc::new(OutboundAllow::parse("localhost:8080").unwrap()),
        };
        let addrs: Vec<_> = open
            .resolve("localhost".parse().unwrap())
            .await
            .expect("an exception's host resolves")
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }

    #[tokio::test]
    async fn a_named_exception_on_another_port_is_refused() {
        let outbound = Outbound::new(&OutboundAllow::parse("localhost:8080").unwrap());
        let url = Url::parse("http://localhost:22/").unwrap();
        let error = outbound.check_named_exception(&url).await.unwrap_err();
        assert!(error.to_string().contains("other ports only"), "{error}");
        let url = Url::parse("http://localhost:8080/").unwrap();
        assert!(outbound.check_named_exception(&url).await.is_ok());
    }
}
