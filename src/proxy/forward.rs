//! Forwarding to upstreams (RFC 9110 §7.6): a connection pool per upstream
//! URL, round robin over them, the request's hop-by-hop headers removed,
//! `X-Forwarded-For` / `X-Forwarded-Proto` / `Forwarded` set. The response's
//! hop-by-hop fields are dropped as its head is parsed ([`super::client`]).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::body::RequestBody;
use super::client::{ConnectionPool, UpstreamBody};
use crate::config::UpstreamConfig;
use crate::error::GatewayError;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response, Version};
use smallvec::SmallVec;

/// One upstream of a snapshot: its settings and a connection pool per URL.
#[derive(Debug)]
pub struct Upstream {
    pub config: UpstreamConfig,
    /// Aligned with `config.urls`.
    pools: Vec<Arc<ConnectionPool>>,
    next: AtomicUsize,
}

/// A request ready to go upstream, and the URL (pool) it was built for.
#[derive(Debug)]
pub struct Prepared {
    pub request: Request<RequestBody>,
    url: usize,
}

impl Upstream {
    pub fn new(config: UpstreamConfig) -> Upstream {
        let pools = config
            .urls
            .iter()
            .map(|url| {
                // Validation guarantees an `http://` URL with an authority.
                let host = url.host().unwrap_or("127.0.0.1");
                let port = url.port_u16().unwrap_or(80);
                let address = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                ConnectionPool::new(address, config.connect_timeout)
            })
            .collect();
        Upstream {
            config,
            pools,
            next: AtomicUsize::new(0),
        }
    }

    /// Closes idle upstream connections that expired or were closed by the
    /// upstream; how many.
    pub fn prune_idle(&self) -> usize {
        self.pools.iter().map(|pool| pool.prune()).sum()
    }

    /// The next base URL's index, round robin.
    fn pick(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.config.urls.len()
    }

    /// Sends the request upstream and waits for the response head, at most
    /// `timeout`. `body_exceeded` tells a body-cap abort (413) from a failure.
    /// The response body reads from the upstream connection as it is polled.
    ///
    /// Not an `async fn`: the exchange future is large, so it is boxed here,
    /// once, and the future returned stays small — an inline one would make
    /// every future above it (forward, route_and_act, handle) larger by as
    /// much, each copied when created and moved.
    pub fn send(
        &self,
        prepared: Prepared,
        body_exceeded: Option<Arc<AtomicBool>>,
        body_limit: u64,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, GatewayError>> + '_ {
        let exchange = Box::pin(self.pools[prepared.url].send(prepared.request));
        let timeout = self.config.timeout;
        async move {
            let name = &self.config.name;
            match tokio::time::timeout(timeout, exchange).await {
                Err(_) => Err(GatewayError::UpstreamTimeout {
                    upstream: name.clone(),
                    timeout,
                }),
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(_)) if body_exceeded.is_some_and(|flag| flag.load(Ordering::Relaxed)) => {
                    Err(GatewayError::BodyTooLarge { limit: body_limit })
                }
                Ok(Err(source)) if source.is_connect() => Err(GatewayError::UpstreamConnect {
                    upstream: name.clone(),
                    source,
                }),
                Ok(Err(source)) => Err(GatewayError::UpstreamFailed {
                    upstream: name.clone(),
                    source,
                }),
            }
        }
    }

    /// Builds the upstream request from the client's: new URI, forwarding
    /// headers, hop-by-hop headers removed.
    pub fn prepare(
        &self,
        mut parts: Parts,
        body: RequestBody,
        peer: SocketAddr,
        proto: &'static str,
    ) -> Result<Prepared, GatewayError> {
        let url = self.pick();
        let base = &self.config.urls[url];
        // HTTP/2 and absolute-form requests carry the host in the URI
        // (RFC 9113 §8.3.1); it wins over a `Host` header.
        let client_host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| parts.headers.get(header::HOST).cloned());
        parts.uri = upstream_uri(base, &parts.uri)?;
        // Only a request with `Connection` can ask to upgrade.
        let present = hop_by_hop_present(&parts.headers);
        let upgrade = if present & CONNECTION_BIT != 0 {
            super::upgrade::requested(&parts.headers)
        } else {
            None
        };
        remove_present(&mut parts.headers, present);
        if let Some(protocol) = upgrade {
            super::upgrade::restore_headers(&mut parts.headers, protocol);
        }
        append_forwarding(&mut parts.headers, peer.ip(), proto, client_host.as_ref());
        match (&self.config.host, client_host) {
            (Some(host), _) => {
                parts.headers.insert(header::HOST, host.clone());
            }
            (None, Some(host)) => {
                parts.headers.insert(header::HOST, host);
            }
            (None, None) => {
                if let Some(authority) = base.authority()
                    && let Ok(value) = HeaderValue::from_str(authority.as_str())
                {
                    parts.headers.insert(header::HOST, value);
                }
            }
        }
        parts.version = Version::HTTP_11;
        Ok(Prepared {
            request: Request::from_parts(parts, body),
            url,
        })
    }
}

/// Arc'd upstreams of a snapshot, by index in [`Config::upstreams`](crate::config::Config).
pub type Upstreams = Vec<Arc<Upstream>>;

/// The request target sent upstream, in origin form (`/prefix/path?query`):
/// the upstream URL's path prefix, then the client's path and query.
fn upstream_uri(base: &Uri, request: &Uri) -> Result<Uri, GatewayError> {
    let base_path = base.path().trim_end_matches('/');
    let path_and_query = match request.path_and_query() {
        // No prefix: the client's target as parsed, shared, not copied.
        Some(pq) if base_path.is_empty() => Ok(pq.clone()),
        None if base_path.is_empty() => Ok(PathAndQuery::from_static("/")),
        pq => {
            let request_pq = pq.map_or("/", PathAndQuery::as_str);
            PathAndQuery::try_from(format!("{base_path}{request_pq}"))
        }
    };
    path_and_query
        .map(Uri::from)
        .map_err(|_| GatewayError::BadRequest {
            reason: "the request target cannot be forwarded",
        })
}

/// Hop-by-hop headers of RFC 9110 §7.6.1, always removed.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The place of `name` in [`HOP_BY_HOP`], if it is one.
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    HOP_BY_HOP.iter().position(|hop| hop == name)
}

/// The bit of `Connection` in [`hop_by_hop_present`]'s mask.
const CONNECTION_BIT: u8 = 1;

/// Which of [`HOP_BY_HOP`] are present, as a bit mask in its order: one pass
/// over the names (most requests carry none, or only `Connection:
/// keep-alive`) instead of a hashed lookup per name.
fn hop_by_hop_present(headers: &HeaderMap) -> u8 {
    let mut present = 0u8;
    for name in headers.keys() {
        if let Some(index) = hop_by_hop_index(name) {
            present |= 1 << index;
        }
    }
    present
}

/// Removes hop-by-hop headers, including every header `Connection` names.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let present = hop_by_hop_present(headers);
    remove_present(headers, present);
}

/// [`remove_hop_by_hop`] given what [`hop_by_hop_present`] found.
fn remove_present(headers: &mut HeaderMap, present: u8) {
    if present == 0 {
        return;
    }
    if present & CONNECTION_BIT != 0 {
        let named: SmallVec<[HeaderName; 4]> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|token| {
                !token.is_empty()
                    && !token.eq_ignore_ascii_case("close")
                    && !token.eq_ignore_ascii_case("keep-alive")
                    && !token.eq_ignore_ascii_case("upgrade")
            })
            .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << index) != 0 {
            headers.remove(name);
        }
    }
}

/// Appends the peer to `X-Forwarded-For`, sets `X-Forwarded-Proto`, and
/// appends an RFC 7239 `Forwarded` element.
fn append_forwarding(
    headers: &mut HeaderMap,
    peer: IpAddr,
    proto: &'static str,
    host: Option<&HeaderValue>,
) {
    let peer = canonical_ip(peer);
    let mut xff = String::with_capacity(64);
    for value in headers.get_all(X_FORWARDED_FOR) {
        if let Ok(text) = value.to_str() {
            let text = text.trim();
            if !text.is_empty() {
                xff.push_str(text);
                xff.push_str(", ");
            }
        }
    }
    push_ip(&mut xff, peer);
    if let Some(value) = into_value(xff) {
        headers.insert(X_FORWARDED_FOR, value);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));

    let mut forwarded = String::with_capacity(96);
    for value in headers.get_all(header::FORWARDED) {
        if let Ok(text) = value.to_str() {
            forwarded.push_str(text);
            forwarded.push_str(", ");
        }
    }
    match peer {
        IpAddr::V4(_) => {
            forwarded.push_str("for=");
            push_ip(&mut forwarded, peer);
        }
        IpAddr::V6(_) => {
            forwarded.push_str("for=\"[");
            push_ip(&mut forwarded, peer);
            forwarded.push_str("]\"");
        }
    }
    forwarded.push_str(";proto=");
    forwarded.push_str(proto);
    if let Some(host) = host.and_then(|h| h.to_str().ok()) {
        if host.bytes().all(is_token_byte) {
            forwarded.push_str(";host=");
            forwarded.push_str(host);
        } else if host.bytes().all(|b| b != b'"' && b != b'\\') {
            forwarded.push_str(";host=\"");
            forwarded.push_str(host);
            forwarded.push('"');
        }
    }
    if let Some(value) = into_value(forwarded) {
        headers.insert(header::FORWARDED, value);
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// A header value that takes over the string's buffer instead of copying
/// it (`None` if it holds bytes a header value cannot).
fn into_value(text: String) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from(text.into_bytes().into_boxed_slice())).ok()
}

/// Appends `ip` in its usual text form. IPv4 is written digit by digit: it
/// is on every forwarded request, and `fmt` costs several times as much.
fn push_ip(buf: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf.push('.');
                }
                buf.push_str(digits.format(octet));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(buf, "{v6}");
        }
    }
}

/// IPv4-mapped IPv6 peers are shown as the IPv4 address they are.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_named_headers_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, x-secret"),
        );
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        remove_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("x-kept"));
    }

    #[test]
    fn forwarding_headers_are_appended() {
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        headers.append("x-forwarded-for", HeaderValue::from_static("2.2.2.2"));
        let host = HeaderValue::from_static("example.com:8080");
        append_forwarding(
            &mut headers,
            "::ffff:10.0.0.1".parse().unwrap(),
            "http",
            Some(&host),
        );
        assert_eq!(headers["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.0.0.1");
        assert_eq!(headers["x-forwarded-proto"], "http");
        assert_eq!(
            headers["forwarded"],
            "for=10.0.0.1;proto=http;host=\"example.com:8080\""
        );
        let mut headers = HeaderMap::new();
        append_forwarding(&mut headers, "2001:db8::1".parse().unwrap(), "http", None);
        assert_eq!(headers["forwarded"], "for=\"[2001:db8::1]\";proto=http");
    }

    #[test]
    fn upstream_uri_joins_base_path() {
        let base: Uri = "http://127.0.0.1:9000/v1/".parse().unwrap();
        let request: Uri = "/users?id=1".parse().unwrap();
        assert_eq!(upstream_uri(&base, &request).unwrap(), "/v1/users?id=1");
        let base: Uri = "http://127.0.0.1:9000".parse().unwrap();
        assert_eq!(upstream_uri(&base, &request).unwrap(), "/users?id=1");
    }
}
