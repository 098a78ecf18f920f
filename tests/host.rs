//! The host rule (`http::host`) end to end, through real sockets to an
//! in-process gateway and an upstream that records every byte
//! (`RawUpstream`): on HTTP/1.1 every refused class of `Host` value, and of
//! an absolute-form target's authority, is a 400 problem+json with the
//! connection closed, and nothing of it reaches the upstream — as the first
//! request of a connection (the fast path reads it) and after a chunked
//! request that handed the connection to hyper (the gate reads it). On
//! HTTP/2 (h2c with prior knowledge) a bad `:authority` or `Host`, or a
//! `Host` naming another origin, is a 400 on its stream, and the connection
//! serves on. Good hosts are forwarded as they came; refusals are counted
//! where other refusals are.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{InProcess, RawUpstream};
use http::{Request, Version};

/// Every answer arrives well before this; it only turns a hang into a failure.
const LIMIT: Duration = Duration::from_secs(5);

async fn gateway(upstream: &RawUpstream) -> InProcess {
    InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[upstreams.api]
url = "{url}"
timeout = "5s"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#,
        url = upstream.url()
    ))
    .await
}

/// A chunked request: the fast path hands the connection to hyper at it.
const HAND_OFF: &[u8] =
    b"POST /hand-off HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";

/// The `Host` values refused on HTTP/1.1, by class.
fn refused_hosts() -> Vec<(&'static str, Vec<u8>)> {
    let mut hosts: Vec<(&'static str, Vec<u8>)> = [
        ("a port that is not a number", &b"example.com:abc"[..]),
        ("a port over 65535", b"example.com:65536"),
        ("a port far over 65535", b"example.com:99999"),
        ("an empty port", b"example.com:"),
        ("a colon alone", b":"),
        ("an unclosed IP literal", b"[::1"),
        ("IPv6 without brackets", b"::1"),
        ("IPvFuture", b"[v1.x]"),
        ("pct-encoding", b"ex%41mple.com"),
        ("a broken pct-encoding", b"ex%4"),
        ("a space", b"exa mple"),
        ("userinfo", b"a@b"),
        ("a path", b"a/b"),
        ("a query", b"a?b"),
        ("a fragment", b"a#b"),
        ("UTF-8", "bücher.example".as_bytes()),
        ("an empty label", b"a..b"),
        ("a number that is no IPv4 address", b"1.2.3.256"),
        ("a second colon", b"a:1:2"),
        ("an empty value", b""),
    ]
    .into_iter()
    .map(|(class, host)| (class, host.to_vec()))
    .collect();
    hosts.push((
        "a name over 255 bytes",
        format!("{}.example", "a".repeat(250)).into_bytes(),
    ));
    hosts
}

fn get_with_host(host: &[u8]) -> Vec<u8> {
    [b"GET /x HTTP/1.1\r\nHost: ", host, b"\r\n\r\n"].concat()
}

/// One response off a raw connection.
struct Answer<'a> {
    status: u16,
    /// Field lines, names in lower case.
    fields: Vec<(String, String)>,
    body: Vec<u8>,
    /// The bytes after it.
    rest: &'a [u8],
}

/// The response at the front of `bytes` (framed by `Content-Length`: the
/// gateway's answers here have one).
fn response(bytes: &[u8]) -> Option<Answer<'_>> {
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&bytes[..head_end]).ok()?;
    let status = head.get(9..12)?.parse().ok()?;
    let fields: Vec<(String, String)> = head
        .split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = field(&fields, "content-length")
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    let body = bytes.get(head_end..head_end + length)?.to_vec();
    Some(Answer {
        status,
        fields,
        body,
        rest: &bytes[head_end + length..],
    })
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Sends `request` on a new connection (after the hand-off request, if
/// `after_hand_off`) and asserts the refusal: 400 problem+json with
/// `Connection: close`, nothing after it, the connection closed; and that
/// the upstream received nothing of it.
async fn assert_refused(
    gateway: &InProcess,
    upstream: &RawUpstream,
    request: &[u8],
    after_hand_off: bool,
    what: &str,
) {
    let before = upstream.all_bytes().len();
    let requests_before = upstream.requests();
    let sent = if after_hand_off {
        [HAND_OFF, request].concat()
    } else {
        request.to_vec()
    };
    let reply = raw_bytes(gateway, &sent).await;
    let mut rest = &reply[..];
    if after_hand_off {
        let first = response(rest).unwrap_or_else(|| panic!("{what}: no first answer: {reply:?}"));
        assert_eq!((first.status, &first.body[..]), (200, &b"ok"[..]), "{what}");
        rest = first.rest;
    }
    let Answer {
        status,
        fields,
        body,
        rest: after,
    } = response(rest)
        .unwrap_or_else(|| panic!("{what}: no answer: {:?}", String::from_utf8_lossy(&reply)));
    assert_eq!(status, 400, "{what}: {fields:?}");
    assert_eq!(
        field(&fields, "content-type"),
        Some("application/problem+json"),
        "{what}"
    );
    assert_eq!(field(&fields, "connection"), Some("close"), "{what}");
    let problem: serde_json::Value = serde_json::from_slice(&body).expect("problem+json");
    assert_eq!(problem["status"], 400, "{what}: {problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|detail| detail.to_ascii_lowercase().contains("host")),
        "{what}: {problem}"
    );
    assert!(after.is_empty(), "{what}: bytes after the refusal");
    // The hand-off request went up, alone; the refused one never.
    let expected = if after_hand_off { 1 } else { 0 };
    assert_eq!(upstream.requests(), requests_before + expected, "{what}");
    let received = upstream.all_bytes()[before..].to_vec();
    assert!(
        !received.windows(7).any(|w| w == b"GET /x "),
        "{what}: the refused request went upstream: {:?}",
        String::from_utf8_lossy(&received)
    );
}

/// Writes `bytes` and reads until the gateway closes (every exchange here
/// ends with a close: a refusal, or `Connection: close`).
async fn raw_bytes(gateway: &InProcess, bytes: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(gateway.addr)
        .await
        .expect("connect");
    // A gateway that refused and closed may refuse the rest of a write.
    let _ = stream.write_all(bytes).await;
    let mut out = Vec::new();
    tokio::time::timeout(LIMIT, stream.read_to_end(&mut out))
        .await
        .expect("the gateway closes in time")
        .ok();
    out
}

/// The `Host` the upstream received last.
fn last_host(upstream: &RawUpstream) -> Option<String> {
    let bytes = upstream.all_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let last = text.rsplit("HTTP/1.1\r\n").next()?;
    last.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("host")
            .then(|| value.trim().to_owned())
    })
}

#[tokio::test]
async fn every_refused_host_class_is_400_and_never_goes_upstream() {
    let upstream = RawUpstream::start().await;
    let gateway = gateway(&upstream).await;
    for (class, host) in refused_hosts() {
        for after_hand_off in [false, true] {
            let what = format!("Host: {class} (after a hand-off: {after_hand_off})");
            assert_refused(
                &gateway,
                &upstream,
                &get_with_host(&host),
                after_hand_off,
                &what,
            )
            .await;
        }
    }
}

#[tokio::test]
async fn an_absolute_form_authority_is_held_to_the_same_rule() {
    let upstream = RawUpstream::start().await;
    let gateway = gateway(&upstream).await;
    for (class, request) in [
        (
            "a port that is not a number",
            &b"GET http://example.com:abc/x HTTP/1.1\r\nHost: example.com\r\n\r\n"[..],
        ),
        (
            "a port over 65535",
            b"GET http://example.com:65536/x HTTP/1.1\r\nHost: example.com\r\n\r\n",
        ),
        (
            "an empty port",
            b"GET http://example.com:/x HTTP/1.1\r\nHost: example.com\r\n\r\n",
        ),
        (
            "userinfo",
            b"GET http://user@example.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n",
        ),
        (
            "an empty label",
            b"GET http://a..b/x HTTP/1.1\r\nHost: example.com\r\n\r\n",
        ),
        (
            "a good authority, no Host (RFC 9112 §3.2 still asks for one)",
            b"GET http://example.com/x HTTP/1.1\r\n\r\n",
        ),
        (
            "a good authority, a bad Host",
            b"GET http://example.com/x HTTP/1.1\r\nHost: example.com:abc\r\n\r\n",
        ),
    ] {
        for after_hand_off in [false, true] {
            let what = format!("target: {class} (after a hand-off: {after_hand_off})");
            assert_refused(&gateway, &upstream, request, after_hand_off, &what).await;
        }
    }
}

#[tokio::test]
async fn good_hosts_are_forwarded_as_they_came() {
    let upstream = RawUpstream::start().await;
    let gateway = gateway(&upstream).await;
    for host in [
        "example.com",
        "EXAMPLE.com:8080",
        "example.com.",
        "example.com:0",
        "example.com:65535",
        "10.0.0.1:80",
        "[::1]",
        "[2001:db8::1]:443",
        "a-b_c~d.example",
    ] {
        let request = format!("GET /ok HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let reply = raw_bytes(&gateway, request.as_bytes()).await;
        let answer = response(&reply).expect("an answer");
        assert_eq!(answer.status, 200, "{host}");
        assert_eq!(last_host(&upstream).as_deref(), Some(host));
    }
    // Absolute form: the target's authority wins over Host (RFC 9112
    // §3.2.2) and is what goes upstream.
    let reply = raw_bytes(
        &gateway,
        b"GET http://a.example:8080/ok HTTP/1.1\r\nHost: b.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(response(&reply).map(|answer| answer.status), Some(200));
    assert_eq!(last_host(&upstream).as_deref(), Some("a.example:8080"));
}

/// `(status, problem detail)` of one HTTP/2 request on `client`.
async fn h2_exchange(
    client: &mut h2::client::SendRequest<Bytes>,
    request: Request<()>,
) -> (u16, String) {
    let (response, _) = client
        .send_request(request, true)
        .expect("the stream opens");
    let response = tokio::time::timeout(LIMIT, response)
        .await
        .expect("an answer in time")
        .expect("an answer, not a reset");
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("the body");
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let detail = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|problem| problem["detail"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (status, detail)
}

/// A request with a relative target (no `:authority`; h2 then sends
/// `:scheme: http` for an HTTP/1.1 request it forwards) and these `Host`s.
fn without_authority(hosts: &[&str]) -> Request<()> {
    let mut request = Request::get("/x").version(Version::HTTP_11);
    for host in hosts {
        request = request.header("host", *host);
    }
    request.body(()).unwrap()
}

#[tokio::test]
async fn http2_authority_and_host_are_checked_per_stream() {
    let upstream = RawUpstream::start().await;
    let gateway = gateway(&upstream).await;
    let stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(stream).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();

    // Refused, each on its own stream of the one connection. (An
    // `:authority` that `http::uri::Authority` cannot read — `%`, a space,
    // brackets out of place — is refused by h2 itself with a stream reset
    // before the gateway sees it; the h2 client cannot even send one.)
    let authority = |uri: &str| Request::get(uri).body(()).unwrap();
    let with_host =
        |uri: &str, host: &str| Request::get(uri).header("host", host).body(()).unwrap();
    for (what, request) in [
        (
            ":authority with userinfo",
            authority("http://user@a.example/x"),
        ),
        (
            ":authority port not a number",
            authority("http://a.example:abc/x"),
        ),
        (
            ":authority port over 65535",
            authority("http://a.example:99999/x"),
        ),
        (":authority empty port", authority("http://a.example:/x")),
        (":authority empty label", authority("http://a..example/x")),
        (
            ":authority no IPv4 address",
            authority("http://1.2.3.256/x"),
        ),
        (
            "Host names another host",
            with_host("http://a.example/x", "b.example"),
        ),
        (
            "Host names another port",
            with_host("http://a.example/x", "a.example:8080"),
        ),
        ("Host alone, invalid", without_authority(&["a.example:abc"])),
        ("two Hosts", without_authority(&["a.example", "a.example"])),
        ("neither :authority nor Host", without_authority(&[])),
    ] {
        let (status, detail) = h2_exchange(&mut client, request).await;
        assert_eq!(status, 400, "{what}: {detail}");
        assert!(
            detail.to_ascii_lowercase().contains("host") || detail.contains(":authority"),
            "{what}: {detail}"
        );
    }
    assert_eq!(upstream.requests(), 0, "{:?}", upstream.all_bytes());

    // Forwarded, on the same connection: it served on after the refusals.
    for (request, host) in [
        (authority("http://a.example:8080/x"), "a.example:8080"),
        (authority("http://[::1]:80/x"), "[::1]:80"),
        (without_authority(&["b.example"]), "b.example"),
        (with_host("http://a.example/x", "A.EXAMPLE:80"), "a.example"),
    ] {
        let (status, detail) = h2_exchange(&mut client, request).await;
        assert_eq!(status, 200, "{host}: {detail}");
        assert_eq!(last_host(&upstream).as_deref(), Some(host));
    }
    assert_eq!(upstream.requests(), 4);
}

#[tokio::test]
async fn host_refusals_are_counted_as_other_refusals_are() {
    let upstream = RawUpstream::start().await;
    let gateway = gateway(&upstream).await;
    // Two on HTTP/1.1 (the codec's refusals), one on HTTP/2 (the guard's).
    for request in [
        &b"GET / HTTP/1.1\r\nHost: example.com:abc\r\n\r\n"[..],
        b"GET http://a:99999/ HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        let reply = raw_bytes(&gateway, request).await;
        assert_eq!(response(&reply).map(|answer| answer.status), Some(400));
    }
    let stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(stream).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = Request::get("http://a.example:abc/").body(()).unwrap();
    assert_eq!(h2_exchange(&mut client, request).await.0, 400);

    // Counted as each refused connection closes (after a lingering read).
    let admin = gateway.admin.expect("admin listener");
    let labels = [("route", "none"), ("status", "400")];
    let count = async || {
        let reply = common::get(admin, "/metrics", &[]).await;
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        let exposition = common::openmetrics::parse(&text).expect("OpenMetrics");
        exposition.sum("tollgate_requests_total", &labels)
    };
    common::eventually(async || count().await >= 3.0).await;
    assert_eq!(count().await, 3.0);
}
