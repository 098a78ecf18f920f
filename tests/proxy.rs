//! End-to-end tests of the HTTP/1.1 proxy through real sockets: the
//! gateway in process (the binary for `SIGTERM`) in front of an in-process
//! upstream; timeouts on paused time.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Gateway, InProcess, TestUpstream, eventually, get, raw, raw_for, send};
use http_body_util::{BodyExt, Full};
use hyper::Request;

fn config(upstream: &TestUpstream, extra_server: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shutdown_timeout = "5s"
{extra_server}

[upstreams.api]
url = "{url}"
timeout = "2s"
connect_timeout = "500ms"

[upstreams.renamed]
url = "{url}"
host = "backend.internal"

[upstreams.dead]
url = "http://127.0.0.1:1"
connect_timeout = "500ms"

[[routes]]
name = "health"
match = {{ path = "/health" }}
respond = {{ status = 200, body = "ok\n" }}

[[routes]]
name = "small"
match = {{ path_prefix = "/small" }}
upstream = "api"
max_body = "16B"

[[routes]]
name = "dead"
match = {{ path_prefix = "/dead" }}
upstream = "dead"

[[routes]]
name = "renamed"
match = {{ path_prefix = "/renamed" }}
upstream = "renamed"

[[routes]]
name = "api"
match = {{ path_prefix = "/", methods = ["GET", "POST", "PUT"] }}
upstream = "api"
"#,
        url = upstream.url()
    )
}

#[tokio::test]
async fn respond_route_answers_from_the_gateway() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let reply = get(gateway.addr, "/health", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, "ok\n");
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn request_and_response_pass_unchanged() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let request = Request::post("/things/1?sort=desc&x=%20y")
        .header("host", "api.example.com")
        .header("x-custom", "value 1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"a\":1}")))
        .unwrap();
    let reply = send(gateway.addr, request).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, "echo");
    assert_eq!(reply.header("x-upstream"), Some("yes"));
    let seen = upstream.last_seen();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.uri, "/things/1?sort=desc&x=%20y");
    assert_eq!(seen.header("host"), Some("api.example.com"));
    assert_eq!(seen.header("x-custom"), Some("value 1"));
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.body, "{\"a\":1}");
}

#[tokio::test]
async fn hop_by_hop_headers_are_dropped_both_ways() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let reply = get(
        gateway.addr,
        "/hop",
        &[
            ("connection", "keep-alive, x-client-secret"),
            ("x-client-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("upgrade", "websocket-nonsense"),
            ("x-client-kept", "1"),
        ],
    )
    .await;
    assert_eq!(reply.status, 200);
    let seen = upstream.last_seen();
    for name in [
        "x-client-secret",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
    ] {
        assert_eq!(seen.header(name), None, "{name} reached the upstream");
    }
    assert_eq!(seen.header("x-client-kept"), Some("1"));
    assert_eq!(reply.header("x-upstream-secret"), None);
    assert_eq!(reply.header("keep-alive"), None);
    assert_eq!(reply.header("x-upstream-kept"), Some("1"));
}

#[tokio::test]
async fn forwarding_headers_are_appended() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    get(
        gateway.addr,
        "/xff",
        &[
            ("x-forwarded-for", "203.0.113.9"),
            ("forwarded", "for=203.0.113.9"),
        ],
    )
    .await;
    let seen = upstream.last_seen();
    assert_eq!(
        seen.header("x-forwarded-for"),
        Some("203.0.113.9, 127.0.0.1")
    );
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    assert_eq!(
        seen.header("forwarded"),
        Some("for=203.0.113.9, for=127.0.0.1;proto=http;host=gateway.test")
    );
    assert_eq!(seen.header("host"), Some("gateway.test"));

    get(gateway.addr, "/renamed", &[]).await;
    assert_eq!(
        upstream.last_seen().header("host"),
        Some("backend.internal")
    );
    assert_eq!(
        upstream.last_seen().header("x-forwarded-for"),
        Some("127.0.0.1")
    );
}

#[tokio::test]
async fn no_route_is_404_problem_json() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    // DELETE matches no route's methods: a method mismatch is 404 too.
    let request = Request::delete("/things")
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let reply = send(gateway.addr, request).await;
    assert_eq!(reply.status, 404);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let body = reply.json();
    assert_eq!(body["status"], 404);
    assert_eq!(body["title"], "Not Found");
    assert!(body["detail"].as_str().unwrap().contains("DELETE /things"));
}

#[tokio::test]
async fn unreachable_upstream_is_502_problem_json() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let reply = get(gateway.addr, "/dead", &[]).await;
    assert_eq!(reply.status, 502);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.json()["status"], 502);
}

#[tokio::test(start_paused = true)]
async fn slow_upstream_is_504_problem_json() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let reply = get(gateway.addr, "/slow/3000", &[]).await;
    assert_eq!(reply.status, 504);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.json()["status"], 504);
}

#[tokio::test]
async fn response_body_streams() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let request = Request::get("/stream")
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = common::send_streaming(gateway.addr, request).await;
    let mut body = response.into_body();
    // The upstream holds its last chunk until the first has reached us.
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first chunk arrives before the last is produced")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first\n");
    upstream.release();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last\n");
}

#[tokio::test]
async fn request_body_streams_to_the_upstream() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let payload = vec![b'x'; 3 * 1024 * 1024];
    let request = Request::put("/upload")
        .header("host", "x")
        .body(Full::new(Bytes::from(payload.clone())))
        .unwrap();
    let reply = send(gateway.addr, request).await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.last_seen().body.len(), payload.len());
}

#[tokio::test]
async fn oversized_headers_are_431() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "max_header_bytes = \"4KiB\"")).await;
    let big = "a".repeat(5000);
    let reply = get(gateway.addr, "/x", &[("x-big", &big)]).await;
    assert_eq!(reply.status, 431);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(upstream.count(), 0);
    // Far beyond the limit hyper refuses to buffer it at all: still 431.
    let huge = "a".repeat(64 * 1024);
    let answer = raw(
        gateway.addr,
        format!("GET / HTTP/1.1\r\nhost: x\r\nx-huge: {huge}\r\n\r\n").as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}

// Paused time: `raw_for`'s wait for more bytes takes no real time.
#[tokio::test(start_paused = true)]
async fn oversized_bodies_are_413() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    // Declared length over the cap: refused before reading the body.
    let request = Request::post("/small")
        .header("host", "x")
        .body(Full::new(Bytes::from(vec![b'a'; 17])))
        .unwrap();
    let reply = send(gateway.addr, request).await;
    assert_eq!(reply.status, 413);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    // Chunked, no declared length: cut off while streaming (the whole
    // body was sent, so the connection may stay open).
    let answer = raw_for(
        gateway.addr,
        b"POST /small HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // Within the cap it goes through.
    let request = Request::post("/small")
        .header("host", "x")
        .body(Full::new(Bytes::from_static(b"ok")))
        .unwrap();
    assert_eq!(send(gateway.addr, request).await.status, 200);
}

#[tokio::test]
async fn malformed_requests_are_400() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let answer = raw(
        gateway.addr,
        b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello",
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(upstream.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn slow_request_heads_are_cut_off() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(
        &upstream,
        "header_read_timeout = \"300ms\"\nidle_timeout = \"30s\"",
    ))
    .await;
    // Half a request head, then silence: the connection must be closed
    // (`raw` fails the test if it is still open after 10 s).
    let answer = raw(
        gateway.addr,
        b"GET / HTTP/1.1\r\nhost: x\r\n",
        Duration::from_secs(10),
    )
    .await;
    assert!(!answer.contains("200"), "{answer}");
}

#[tokio::test(start_paused = true)]
async fn idle_keep_alive_connections_are_closed() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(
        &upstream,
        "header_read_timeout = \"10s\"\nidle_timeout = \"400ms\"",
    ))
    .await;
    // Paused time: the gateway's idle timer and this clock are tokio's.
    let started = tokio::time::Instant::now();
    let answer = raw(
        gateway.addr,
        b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
        Duration::from_secs(10),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let elapsed = started.elapsed();
    // Closed (`raw` fails the test otherwise), and not before the idle
    // timeout.
    assert!(
        elapsed >= Duration::from_millis(300),
        "closed too early: {elapsed:?}"
    );
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests() {
    let upstream = TestUpstream::start().await;
    let mut gateway = Gateway::start(&config(&upstream, ""));
    let addr = gateway.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/slow/800", &[]).await });
    assert!(
        eventually(async || upstream.arrived() == 1).await,
        "the request never reached the upstream"
    );
    gateway.signal("TERM");
    // The listener is closed: new connections are refused.
    assert!(
        eventually(async || tokio::net::TcpStream::connect(addr).await.is_err()).await,
        "listener still open"
    );
    let reply = in_flight.await.unwrap();
    assert_eq!(reply.status, 200, "in-flight request was not drained");
    assert_eq!(reply.header("connection"), Some("close"));
    let status = tokio::task::spawn_blocking(move || gateway.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("gateway exited");
    assert!(status.success(), "{status:?}");
}

/// Opens an upgraded tunnel (`websocket`, echoed by the test upstream) through the gateway; returns the stream
/// after the 101, or the status line it got instead.
async fn open_tunnel(addr: std::net::SocketAddr) -> Result<tokio::net::TcpStream, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"GET /upgrade HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if head.starts_with("HTTP/1.1 101") {
        assert!(
            head.to_ascii_lowercase().contains("upgrade: websocket"),
            "{head}"
        );
        Ok(stream)
    } else {
        Err(head)
    }
}

#[tokio::test]
async fn upgraded_connections_are_tunnelled_and_hold_their_concurrency_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"

[upstreams.api]
url = "{}"

[limits.one_tunnel]
key = "route"
algorithm = "concurrency"
max = 1

[[routes]]
name = "ws"
match = {{ path = "/upgrade" }}
upstream = "api"
limits = ["one_tunnel"]
"#,
        upstream.url()
    ))
    .await;
    let mut tunnel = open_tunnel(gateway.addr).await.expect("101");
    tunnel
        .write_all(b"hello through the gateway")
        .await
        .unwrap();
    let mut echoed = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), tunnel.read_exact(&mut echoed))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(&echoed, b"hello through the gateway");
    // The open tunnel holds the only slot.
    let refused = open_tunnel(gateway.addr)
        .await
        .expect_err("second tunnel admitted");
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    drop(tunnel);
    let mut refused = String::new();
    let reopened = eventually(async || match open_tunnel(gateway.addr).await {
        Ok(_) => true,
        Err(head) => {
            assert!(head.starts_with("HTTP/1.1 429"), "{head}");
            refused = head;
            false
        }
    })
    .await;
    assert!(
        reopened,
        "slot not released after the tunnel closed: {refused}"
    );
}

#[tokio::test]
async fn upstream_connections_are_reused_and_closed_ones_are_not() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    // Alternate requests that keep the upstream connection alive with ones
    // after which the upstream closes it: none may fail.
    for i in 0..40 {
        let path = if i % 3 == 0 { "/close" } else { "/keep" };
        let reply = get(gateway.addr, path, &[]).await;
        assert_eq!(reply.status, 200, "request {i} to {path}: {:?}", reply.body);
    }
    assert_eq!(upstream.count(), 40);
}

#[tokio::test]
async fn an_upstream_with_several_urls_takes_them_in_turn() {
    let (first, second) = (TestUpstream::start().await, TestUpstream::start().await);
    let gateway = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"

[upstreams.pair]
url = ["{}", "{}"]

[[routes]]
name = "all"
match = {{ path_prefix = "/" }}
upstream = "pair"
"#,
        first.url(),
        second.url()
    ))
    .await;
    for i in 0..6 {
        let reply = get(gateway.addr, "/turn", &[]).await;
        assert_eq!(reply.status, 200, "request {i}");
    }
    assert_eq!((first.count(), second.count()), (3, 3));
}
