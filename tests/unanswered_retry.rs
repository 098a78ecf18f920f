//! An idempotent request that its URL answered nothing goes once more, to
//! the other URL (nginx's `proxy_next_upstream error`), on a route without
//! `retry`; a `POST` does not. The upstreams are raw sockets: one answers,
//! the other stops answering the way an instance being stopped under load
//! does — it accepts a connection (a pooled one, or a new one), reads the
//! request and closes without a byte.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use common::{InProcess, get, send};
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A raw HTTP/1.1 upstream answering `200` with its `name` as the body on
/// keep-alive connections, until told to stop answering.
struct RawUpstream {
    addr: SocketAddr,
    /// Close every connection on its next request, answering nothing.
    silent: Arc<AtomicBool>,
    /// Requests it read, by method: GET, POST.
    gets: Arc<AtomicUsize>,
    posts: Arc<AtomicUsize>,
}

impl RawUpstream {
    async fn start(name: &'static str) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let upstream = RawUpstream {
            addr: listener.local_addr().expect("addr"),
            silent: Arc::default(),
            gets: Arc::default(),
            posts: Arc::default(),
        };
        let (silent, gets, posts) = (
            upstream.silent.clone(),
            upstream.gets.clone(),
            upstream.posts.clone(),
        );
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (silent, gets, posts) = (silent.clone(), gets.clone(), posts.clone());
                tokio::spawn(serve(stream, name, silent, gets, posts));
            }
        });
        upstream
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// One connection: each request read whole (head and `Content-Length`
/// body), then answered, or the connection closed when `silent`.
async fn serve(
    mut stream: TcpStream,
    name: &'static str,
    silent: Arc<AtomicBool>,
    gets: Arc<AtomicUsize>,
    posts: Arc<AtomicUsize>,
) {
    let mut buffer = Vec::new();
    loop {
        let Some(head_end) = read_head(&mut stream, &mut buffer).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut more = [0u8; 1024];
            match stream.read(&mut more).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&more[..n]),
            }
        }
        buffer.drain(..head_end + length);
        if head.starts_with("post ") {
            posts.fetch_add(1, Ordering::SeqCst);
        } else {
            gets.fetch_add(1, Ordering::SeqCst);
        }
        if silent.load(Ordering::SeqCst) {
            // Closed with the request read and nothing answered.
            return;
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{name}",
            name.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads until `buffer` holds a whole request head; where it ends.
async fn read_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(at + 4);
        }
        let mut more = [0u8; 1024];
        match stream.read(&mut more).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&more[..n]),
        }
    }
}

async fn post(addr: SocketAddr) -> common::Reply {
    let request = Request::post("/x")
        .header("host", "gateway.test")
        .body(Full::new(Bytes::from_static(b"{\"order\":1}")))
        .expect("a request");
    send(addr, request).await
}

/// `tollgate_upstream_retries_total{upstream="api",reason}`.
async fn retries(gateway: &InProcess, reason: &str) -> f64 {
    let reply = get(gateway.admin.expect("admin"), "/metrics", &[]).await;
    let exposition =
        common::openmetrics::parse(&String::from_utf8_lossy(&reply.body)).expect("exposition");
    exposition.count(
        "tollgate_upstream_retries_total",
        &[("upstream", "api"), ("reason", reason)],
    )
}

#[tokio::test]
async fn a_get_its_url_answered_nothing_goes_to_the_other_url_and_a_post_does_not() {
    let stopping = RawUpstream::start("stopping").await;
    let other = RawUpstream::start("other").await;
    let gateway = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[upstreams.api]
url = ["{stopping}", "{other}"]
# Not ejected by its failures: the POSTs below still reach it.
eject = {{ after = 1000 }}

[[routes]]
name = "x"
match = {{ path = "/x" }}
upstream = "api"
"#,
        stopping = stopping.url(),
        other = other.url(),
    ))
    .await;

    // Both answer, and leave keep-alive connections in the pool.
    let mut bodies: Vec<Bytes> = Vec::new();
    for _ in 0..4 {
        let reply = get(gateway.addr, "/x", &[]).await;
        assert_eq!(reply.status, 200);
        bodies.push(reply.body);
    }
    assert!(bodies.iter().any(|b| b == "stopping") && bodies.iter().any(|b| b == "other"));
    assert_eq!(retries(&gateway, "reset").await, 0.0);

    // One instance stops answering: its pooled connections and new ones
    // alike are closed under the request, with nothing answered.
    stopping.silent.store(true, Ordering::SeqCst);
    let dropped_before = stopping.gets.load(Ordering::SeqCst);
    for i in 0..8 {
        let reply = get(gateway.addr, "/x", &[]).await;
        assert_eq!(reply.status, 200, "GET {i}: {:?}", reply.body);
        assert_eq!(reply.body, "other", "GET {i}");
    }
    let dropped = stopping.gets.load(Ordering::SeqCst) - dropped_before;
    assert!(
        dropped >= 2,
        "round robin sent GETs to the stopping URL: {dropped}"
    );
    let retried = retries(&gateway, "reset").await;
    assert!(
        (2.0..=8.0).contains(&retried),
        "one retry per GET the stopping URL dropped: {retried}"
    );

    // A POST is never sent twice: the ones the stopping URL took are 502.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(post(gateway.addr).await.status);
    }
    let failed = statuses.iter().filter(|s| **s == 502).count();
    let passed = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(failed + passed, statuses.len(), "{statuses:?}");
    assert_eq!(
        failed,
        stopping.posts.load(Ordering::SeqCst),
        "{statuses:?}"
    );
    assert_eq!(passed, other.posts.load(Ordering::SeqCst), "{statuses:?}");
    assert!(
        failed >= 2,
        "round robin sent POSTs to the stopping URL: {statuses:?}"
    );
    assert_eq!(
        retries(&gateway, "reset").await,
        retried,
        "a POST was retried"
    );
}
