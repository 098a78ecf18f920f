//! Forwarding to upstreams (RFC 9110 §7.6): the pipeline's side of an
//! [`Upstream`], as functions of it ([`prepare`], [`exchange`]) — its methods
//! (pools, health, balancing) are all the upstream layer's.
//! What changes in the request on the way —
//! `Host`, `X-Forwarded-For` / `X-Forwarded-Proto` / `Forwarded`, hop-by-hop
//! fields left out — is written straight into the upstream head
//! ([`OwnFields`]) rather than edited in the header map. The response's
//! hop-by-hop fields are dropped as its head is parsed ([`crate::http1::client`]).

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};

use super::body::{ClientBodyError, RequestBody};
use crate::answer::error::GatewayError;
use crate::http::field_lines::FieldLines;
use crate::http::hop_by_hop::{ConnectionToken, connection_tokens, is_hop_by_hop};
use crate::http::structured::is_tchar;
use crate::http1::client::{InterimSink, OwnFields, UpstreamBody};
use crate::identity::normalize;
use crate::upstream::deadline::Deadline;
use crate::upstream::health::Failure;
use crate::upstream::pool::PoolError;
use crate::upstream::{Attempt, NotConnected, Start, Upstream};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::{PathAndQuery, Uri};
use http::{Response, Version};

/// A request ready to go upstream, to whichever URL takes it.
#[derive(Debug)]
pub(crate) struct Prepared<'p> {
    /// The client's request head; its target is the client's until a URL
    /// is chosen (then that URL's prefix goes in front), and its header map
    /// is left as the client sent it: `own` says what changes on the way.
    /// Borrowed from the handler's future, where it was made: each move of
    /// it was a copy of 224 bytes (four of them per request).
    pub(crate) parts: &'p mut Parts,
    /// Taken by the exchange (an empty body is left in its place).
    pub(crate) body: RequestBody,
    pub(crate) own: OwnFields,
    /// Neither the upstream's `host` nor the client's: the chosen URL's
    /// authority is the `Host`.
    host_from_url: bool,
}

/// How a request's exchange ended, before it is a [`GatewayError`].
enum Failed {
    NotConnected(NotConnected),
    /// The exchange with `url` failed.
    Pool {
        url: usize,
        source: PoolError,
    },
    /// The upstream's `timeout` passed, with the exchange under way on
    /// `url` if there was one.
    Timeout {
        url: Option<usize>,
    },
    /// The target cannot be joined to the URL's prefix.
    Target,
}

/// Sends the request to a URL that takes requests and waits for the
/// response head, at most `timeout` for all of it (connections that
/// could not be opened, and the next URL tried, included). The outcome
/// is recorded on the URL (what ejects a failing one), and the URL is
/// noted in `attempt`, so that a retry goes elsewhere.
/// `cap` tells a body-cap abort (413) from a failure. The
/// response body reads from the upstream connection as it is polled;
/// the response's fields come beside it, as lines.
///
/// The exchange future is large, so it is boxed, once: inline it would
/// make every future above it (send, route_and_act, handle) larger by as
/// much. Boxed here, out of line: in this small function the future is
/// made in its box, out of the way of the caller's large poll function.
/// `prepared` is lent, not moved: it stays in the caller's future, where
/// it was made, instead of being copied into this one and then into its
/// box (~530 bytes, ~190 instructions per request).
#[inline(never)]
pub(crate) fn exchange<'a>(
    upstream: &'a Upstream,
    prepared: &'a mut Prepared<'_>,
    cap: BodyCapped<'a>,
    interim: Option<&'a dyn InterimSink>,
    attempt: &'a mut Attempt,
) -> Pin<Box<impl Future<Output = Exchanged> + 'a>> {
    // The box first, then the future written into it: with `Box::pin`
    // the future was made first, kept on the stack for the unwinding of
    // a failed allocation, and copied.
    Box::into_pin(Box::write(
        Box::new_uninit(),
        connect_and_exchange(upstream, prepared, cap, interim, attempt),
    ))
}

/// The upstream's answer: its response (the body read from the
/// connection as it is polled) and its fields, as lines.
pub(crate) type Exchanged = Result<(Response<UpstreamBody>, FieldLines), GatewayError>;

/// A streamed body's cap (`max_body`) as the exchange sees it: whether the
/// body outgrew it, which makes a failed exchange a 413.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyCapped<'a> {
    /// Set when the streamed body outgrew `limit`; `None`: no cap.
    pub(crate) exceeded: Option<&'a AtomicBool>,
    pub(crate) limit: u64,
}

/// The error the client gets for an exchange that `failed` (the URL's
/// failure recorded where it was one). Out of line: the failure path.
#[cold]
#[inline(never)]
fn failure(upstream: &Upstream, failed: Failed, cap: BodyCapped<'_>) -> GatewayError {
    let name = &upstream.config.name;
    match failed {
        Failed::Timeout { url } => {
            if let Some(url) = url {
                upstream.record_failure(url, Failure::Timeout, None);
            }
            GatewayError::UpstreamTimeout {
                upstream: name.clone(),
                timeout: upstream.config.timeout,
            }
        }
        Failed::NotConnected(NotConnected::NoHealthy) => GatewayError::NoHealthyUpstream {
            upstream: name.clone(),
        },
        Failed::NotConnected(NotConnected::Connect(source)) => GatewayError::UpstreamConnect {
            upstream: name.clone(),
            source,
        },
        Failed::Target => GatewayError::BadRequest {
            reason: "the request target cannot be forwarded",
        },
        Failed::Pool { .. }
            if cap
                .exceeded
                .is_some_and(|flag| flag.load(Ordering::Relaxed)) =>
        {
            GatewayError::BodyTooLarge { limit: cap.limit }
        }
        // The client's body failed (malformed chunked coding, a
        // client gone mid-body): its fault, a 400, not an upstream
        // error; the upstream connection went with the exchange.
        Failed::Pool {
            source: PoolError::Request(error),
            ..
        } if ClientBodyError::of(&error).is_some() => {
            tracing::debug!(%error, "request body failed while going upstream");
            match ClientBodyError::of(&error) {
                Some(ClientBodyError::Stalled(timeout)) => {
                    GatewayError::RequestTimeout { timeout: *timeout }
                }
                _ => GatewayError::BadRequest {
                    reason: "the request body is malformed or incomplete",
                },
            }
        }
        Failed::Pool { url, source } => {
            let failure = if source.is_connect() {
                Failure::Connect
            } else {
                Failure::Reset
            };
            upstream.record_failure(url, failure, Some(&source));
            if source.is_connect() {
                GatewayError::UpstreamConnect {
                    upstream: name.clone(),
                    source,
                }
            } else {
                GatewayError::UpstreamFailed {
                    upstream: name.clone(),
                    source,
                }
            }
        }
    }
}

/// A connection to a URL ([`Upstream::start_connect`]), the request aimed at
/// it, the exchange, all within the upstream's `timeout`; a response
/// head's status recorded on the URL. A request the URL answered nothing
/// goes once more, to another URL when there is one, when it can be sent
/// again ([`Upstream::retry_unanswered`]). Its failures are the client's
/// errors at once ([`failure`]): a wrapper future that mapped them moved
/// the answer twice more.
async fn connect_and_exchange(
    upstream: &Upstream,
    prepared: &mut Prepared<'_>,
    cap: BodyCapped<'_>,
    interim: Option<&dyn InterimSink>,
    attempt: &mut Attempt,
) -> Exchanged {
    // A reused timer: a fresh one per request cost ~600 instructions.
    // The request's one clock read: its deadline, and the pool's idle times.
    let now = tokio::time::Instant::now();
    let mut deadline = Deadline::at(now + upstream.config.timeout);
    // The fields before a URL's `Host`.
    let own_fields = prepared.own.lines.len();
    let mut replay = attempt
        .may_retry_unanswered(&prepared.parts.method)
        .then(|| replay_of(&prepared.body))
        .flatten();
    // The URL the target was last aimed at: a second try takes the
    // client's target back from it (`client_target`) rather than keeping a
    // copy of it through every exchange for the rare one sent again.
    let mut aimed_at: Option<usize> = None;
    loop {
        let started = upstream.start_connect(attempt, now);
        let started = started.map_err(|not| failure(upstream, Failed::NotConnected(not), cap))?;
        let (url, connection, _in_flight) = match started {
            Start::Ready(url, connection, in_flight) => (url, connection, in_flight),
            Start::Open(url, in_flight) => {
                let opened = deadline
                    .guard(pin!(upstream.connect_from(url, in_flight, attempt)))
                    .await;
                let Some(opened) = opened else {
                    let failed = Failed::Timeout {
                        url: attempt.current,
                    };
                    return Err(failure(upstream, failed, cap));
                };
                opened.map_err(|not| failure(upstream, Failed::NotConnected(not), cap))?
            }
        };
        // Changed in place, and lent to the exchange: each move of the head
        // and its fields is a copy of ~530 bytes.
        let base = &upstream.config.urls[url];
        if let Some(before) = aimed_at {
            prepared.parts.uri = client_target(&upstream.config.urls[before], &prepared.parts.uri);
            prepared.own.lines.truncate(own_fields);
        }
        prepared.parts.uri = upstream_uri(base, &prepared.parts.uri)
            .map_err(|_| failure(upstream, Failed::Target, cap))?;
        aimed_at = Some(url);
        if prepared.host_from_url
            && let Some(authority) = base.authority()
        {
            prepared.own.push("host", authority.as_str().as_bytes());
        }
        let exchanged = deadline
            .guard(pin!(upstream.exchange(
                url,
                connection,
                prepared.parts,
                std::mem::replace(&mut prepared.body, RequestBody::Buffered(None)),
                &prepared.own,
                interim,
                now
            )))
            .await;
        let Some(exchanged) = exchanged else {
            return Err(failure(upstream, Failed::Timeout { url: Some(url) }, cap));
        };
        match exchanged {
            Ok(answer) => {
                upstream.record_status(url, answer.0.status().as_u16());
                return Ok(answer);
            }
            Err(source) if replay.is_some() && upstream.retry_unanswered(attempt, url, &source) => {
                prepared.body = RequestBody::Buffered(replay.take().flatten());
            }
            Err(source) => return Err(failure(upstream, Failed::Pool { url, source }, cap)),
        }
    }
}

/// The client's target back from `sent`, the target [`upstream_uri`]
/// aimed at `base`: its path and query without `base`'s path prefix (all
/// `upstream_uri` reads of a target). Out of line: only a request sent
/// once more needs it.
#[cold]
#[inline(never)]
fn client_target(base: &Uri, sent: &Uri) -> Uri {
    let prefix = base.path().trim_end_matches('/');
    let sent = sent.path_and_query().map_or("/", PathAndQuery::as_str);
    // `upstream_uri` put the prefix in front: what follows is the client's.
    let target = sent.strip_prefix(prefix).filter(|t| !t.is_empty());
    target
        .and_then(|target| target.parse().ok())
        .unwrap_or_else(|| Uri::from_static("/"))
}

/// The request body once more, for a second try, when it is in memory
/// (`Some(Some)`) or there is none (`Some(None)`); `None` for a stream,
/// which can be sent only once.
fn replay_of(body: &RequestBody) -> Option<Option<bytes::Bytes>> {
    use http_body::Body as _;
    match body {
        RequestBody::Buffered(bytes) => Some(bytes.clone()),
        streaming if streaming.is_end_stream() => Some(None),
        RequestBody::Streaming { .. } => None,
    }
}

impl<'p> Prepared<'p> {
    /// The client's request as it came, to be [`prepare`]d where it is
    /// made (the caller's future): a request built and returned by a
    /// function was copied once more.
    #[inline(always)]
    pub(crate) fn new(parts: &'p mut Parts, body: RequestBody) -> Prepared<'p> {
        Prepared {
            parts,
            body,
            own: OwnFields::default(),
            host_from_url: false,
        }
    }
}

/// Makes `request`, the client's ([`Prepared::new`]), the upstream
/// request: forwarding headers, hop-by-hop headers removed; the target is
/// set when a URL is chosen ([`exchange`]). The fields are written into
/// the request's own lines where they stay ([`own_fields`]): returned,
/// they were a copy of 304 bytes.
pub(crate) fn prepare(
    upstream: &Upstream,
    request: &mut Prepared<'_>,
    peer: SocketAddr,
    proto: &'static str,
) {
    let parts = &mut *request.parts;
    // HTTP/2 and absolute-form requests carry the host in the URI
    // (RFC 9113 §8.3.1); it wins over a `Host` header.
    let client_host = parts
        .uri
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        .or_else(|| parts.headers.get(header::HOST).cloned());
    let host = upstream.config.host.as_ref().or(client_host.as_ref());
    parts.version = Version::HTTP_11;
    request.host_from_url = host.is_none();
    own_fields(
        &mut request.own,
        &parts.headers,
        host,
        peer.ip(),
        proto,
        client_host.as_ref(),
    );
}

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

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// What the gateway writes into the upstream request in place of the
/// client's fields: `Host` (`host`, if any), the forwarding fields —
/// the peer appended to `X-Forwarded-For`, `X-Forwarded-Proto`, an RFC 7239
/// `Forwarded` element appended — and, for an upgrade, `Upgrade` and
/// `Connection: upgrade` (and [`OwnFields::upgrade`] set); hop-by-hop fields
/// and those `Connection` names are left out (RFC 9110 §7.6.1). Written
/// into `own`, empty.
fn own_fields(
    own: &mut OwnFields,
    headers: &HeaderMap,
    host: Option<&HeaderValue>,
    peer: IpAddr,
    proto: &'static str,
    client_host: Option<&HeaderValue>,
) {
    // Allocated outright: `reserve` on an empty vector took its general
    // growth path first.
    own.lines = Vec::with_capacity(160);
    if let Some(host) = host {
        own.push("host", host.as_bytes());
    }
    own.omit.push(header::HOST);

    // One pass over the names finds the hop-by-hop fields present (most
    // requests carry none, or `Connection: keep-alive`) and the forwarding
    // fields the gateway rewrites; the map is searched only for those that
    // are there (a lookup by a custom name costs hundreds of instructions).
    let mut connection = false;
    let (mut forwarded_for, mut forwarded) = (false, false);
    for name in headers.keys() {
        if is_hop_by_hop(name.as_str().as_bytes()) {
            connection |= name == header::CONNECTION;
            own.omit.push(name.clone());
        } else if *name == X_FORWARDED_FOR
            || *name == X_FORWARDED_PROTO
            || name == header::FORWARDED
        {
            forwarded_for |= *name == X_FORWARDED_FOR;
            forwarded |= name == header::FORWARDED;
            own.omit.push(name.clone());
        }
    }
    // `Connection` names more hop-by-hop fields, and is how a request asks
    // to upgrade.
    let mut upgrade = false;
    if connection {
        let values = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok());
        for token in values.flat_map(|v| connection_tokens(v.as_bytes())) {
            match token {
                ConnectionToken::Upgrade => upgrade = true,
                ConnectionToken::Names(name) => {
                    if let Ok(name) = HeaderName::from_bytes(name) {
                        own.omit.push(name);
                    }
                }
                ConnectionToken::Close | ConnectionToken::KeepAlive => {}
            }
        }
    }
    if upgrade && let Some(protocol) = headers.get(header::UPGRADE) {
        own.push("upgrade", protocol.as_bytes());
        own.push("connection", b"upgrade");
        own.upgrade = true;
    }

    // Written straight into the lines; the peer's text once, then copied.
    // IPv4-mapped IPv6 peers are shown as the IPv4 address they are.
    let peer = normalize(peer);
    let lines = &mut own.lines;
    lines.extend_from_slice(b"x-forwarded-for: ");
    let earlier_hops = forwarded_for.then(|| headers.get_all(X_FORWARDED_FOR));
    for value in earlier_hops.iter().flatten() {
        if let Ok(text) = value.to_str() {
            let text = text.trim();
            if !text.is_empty() {
                lines.extend_from_slice(text.as_bytes());
                lines.extend_from_slice(b", ");
            }
        }
    }
    let ip_start = lines.len();
    push_ip(lines, peer);
    let ip = ip_start..lines.len();
    lines.extend_from_slice(b"\r\nx-forwarded-proto: ");
    lines.extend_from_slice(proto.as_bytes());
    lines.extend_from_slice(b"\r\nforwarded: ");
    let earlier_elements = forwarded.then(|| headers.get_all(header::FORWARDED));
    for value in earlier_elements.iter().flatten() {
        if let Ok(text) = value.to_str() {
            lines.extend_from_slice(text.as_bytes());
            lines.extend_from_slice(b", ");
        }
    }
    match peer {
        IpAddr::V4(_) => {
            lines.extend_from_slice(b"for=");
            lines.extend_from_within(ip);
        }
        IpAddr::V6(_) => {
            lines.extend_from_slice(b"for=\"[");
            lines.extend_from_within(ip);
            lines.extend_from_slice(b"]\"");
        }
    }
    lines.extend_from_slice(b";proto=");
    lines.extend_from_slice(proto.as_bytes());
    if let Some(host) = client_host.and_then(|h| h.to_str().ok()) {
        if host.bytes().all(is_tchar) {
            lines.extend_from_slice(b";host=");
            lines.extend_from_slice(host.as_bytes());
        } else if host.bytes().all(|b| b != b'"' && b != b'\\') {
            lines.extend_from_slice(b";host=\"");
            lines.extend_from_slice(host.as_bytes());
            lines.push(b'"');
        }
    }
    lines.extend_from_slice(b"\r\n");
}

/// Appends `ip` in its usual text form. IPv4 is written digit by digit: it
/// is on every forwarded request, and `fmt` costs several times as much.
fn push_ip(buf: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf.push(b'.');
                }
                buf.extend_from_slice(digits.format(octet).as_bytes());
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(buf, "{v6}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upstream request head for a GET to `/` with `headers`.
    fn head_for(headers: HeaderMap, peer: &str, client_host: Option<&str>) -> String {
        let client_host = client_host.map(|h| HeaderValue::from_str(h).unwrap());
        let mut own = OwnFields::default();
        own_fields(
            &mut own,
            &headers,
            Some(&HeaderValue::from_static("backend")),
            peer.parse().unwrap(),
            "http",
            client_host.as_ref(),
        );
        let mut parts = http::Request::new(()).into_parts().0;
        parts.headers = headers;
        let mut out = Vec::new();
        crate::http1::client::head::encode_request(
            &parts,
            crate::http1::client::head::RequestFraming::Empty,
            &own,
            &mut out,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn hop_by_hop_and_connection_named_fields_stay_behind() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, x-secret"),
        );
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::HOST, HeaderValue::from_static("client.example"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        let head = head_for(headers, "10.0.0.1", None);
        assert_eq!(
            head,
            "GET / HTTP/1.1\r\nhost: backend\r\nx-forwarded-for: 10.0.0.1\r\n\
             x-forwarded-proto: http\r\nforwarded: for=10.0.0.1;proto=http\r\n\
             x-kept: 1\r\n\r\n"
        );
    }

    #[test]
    fn an_upgrade_keeps_its_protocol() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        let head = head_for(headers, "10.0.0.1", None);
        assert!(
            head.contains("upgrade: websocket\r\nconnection: upgrade\r\n"),
            "{head}"
        );
        assert_eq!(head.matches("upgrade").count(), 2, "{head}");
    }

    #[test]
    fn forwarding_fields_are_appended() {
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        headers.append("x-forwarded-for", HeaderValue::from_static("2.2.2.2"));
        headers.append("forwarded", HeaderValue::from_static("for=1.1.1.1"));
        // A client's claim about the scheme is replaced, not passed on.
        headers.append("x-forwarded-proto", HeaderValue::from_static("https"));
        let head = head_for(headers, "::ffff:10.0.0.1", Some("example.com:8080"));
        assert!(
            head.contains("x-forwarded-for: 1.1.1.1, 2.2.2.2, 10.0.0.1\r\n"),
            "{head}"
        );
        assert!(head.contains("x-forwarded-proto: http\r\n"), "{head}");
        assert!(
            head.contains(
                "forwarded: for=1.1.1.1, for=10.0.0.1;proto=http;host=\"example.com:8080\"\r\n"
            ),
            "{head}"
        );
        for name in ["x-forwarded-for", "x-forwarded-proto", "forwarded:"] {
            assert_eq!(head.matches(name).count(), 1, "{name} in {head}");
        }
        let head = head_for(HeaderMap::new(), "2001:db8::1", Some("example.com"));
        assert!(
            head.contains("forwarded: for=\"[2001:db8::1]\";proto=http;host=example.com\r\n"),
            "{head}"
        );
    }

    /// A target sent once more, to another URL, is the client's again
    /// before the other URL's prefix goes in front of it.
    #[test]
    fn client_target_undoes_upstream_uri() {
        let request: Uri = "/users?id=1".parse().unwrap();
        for base in [
            "http://127.0.0.1:9000/v1/",
            "http://127.0.0.1:9000/v1",
            "http://127.0.0.1:9000",
            "http://127.0.0.1:9000/",
        ] {
            let base: Uri = base.parse().unwrap();
            let sent = upstream_uri(&base, &request).unwrap();
            assert_eq!(client_target(&base, &sent), request, "{base}");
            let root: Uri = "/".parse().unwrap();
            let sent = upstream_uri(&base, &root).unwrap();
            let back = client_target(&base, &sent);
            assert_eq!(upstream_uri(&base, &back).unwrap(), sent, "{base}");
        }
        let other: Uri = "http://127.0.0.1:9001/v2".parse().unwrap();
        let base: Uri = "http://127.0.0.1:9000/v1".parse().unwrap();
        let sent = upstream_uri(&base, &request).unwrap();
        let again = upstream_uri(&other, &client_target(&base, &sent)).unwrap();
        assert_eq!(again, "/v2/users?id=1");
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
