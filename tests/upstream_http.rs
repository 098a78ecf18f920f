//! End-to-end tests of the gateway's HTTP/1.1 client (the gateway in
//! process) against a scripted upstream that writes exact bytes: response framings (chunked, length,
//! until close, none), interim responses, malformed and truncated answers,
//! and keep-alive connections that the upstream closes.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{InProcess, get, raw, send};
use http_body_util::Full;
use hyper::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the scripted upstream does with one request.
enum Answer {
    /// Writes these pieces (a short pause between them) and keeps the
    /// connection open.
    Pieces(Vec<Vec<u8>>),
    /// Writes the bytes, then closes.
    ThenClose(Vec<u8>),
    /// Closes without answering.
    Close,
}

fn bytes(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

/// An upstream on a raw socket: `script(request text, index of the request on
/// its connection)` decides each answer. Records requests and connections.
struct Scripted {
    addr: std::net::SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Scripted {
    async fn start(script: fn(&str, usize) -> Answer) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (count, log) = (connections.clone(), requests.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, script, log.clone()));
            }
        });
        Scripted {
            addr,
            connections,
            requests,
            task,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve(
    mut stream: TcpStream,
    script: fn(&str, usize) -> Answer,
    log: Arc<Mutex<Vec<String>>>,
) {
    let mut buf = Vec::new();
    for index in 0.. {
        let Some(request) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        log.lock().unwrap().push(request.clone());
        match script(&request, index) {
            Answer::Pieces(pieces) => {
                for piece in pieces {
                    if stream.write_all(&piece).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            Answer::ThenClose(answer) => {
                let _ = stream.write_all(&answer).await;
                return;
            }
            Answer::Close => return,
        }
    }
}

/// Reads one request (head, and a body framed by Content-Length or
/// chunked) as text; `None` when the connection ends first.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let complete = |buf: &[u8]| -> Option<usize> {
        let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        if head.contains("transfer-encoding: chunked") {
            let end = buf[head_end..].windows(5).position(|w| w == b"0\r\n\r\n")?;
            return Some(head_end + end + 5);
        }
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .map_or(0, |value| value.trim().parse::<usize>().unwrap());
        (buf.len() >= head_end + length).then_some(head_end + length)
    };
    loop {
        if let Some(end) = complete(buf) {
            let request = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end);
            return Some(request);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn config(upstream: &Scripted) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
# One worker: idle upstream connections are kept per worker, and these tests
# count connections.
workers = 1

[upstreams.up]
url = "http://{addr}"
timeout = "3s"
connect_timeout = "500ms"

[[routes]]
name = "all"
match = {{ path_prefix = "/" }}
upstream = "up"
"#,
        addr = upstream.addr
    )
}

/// Sends a request with `method` and an optional body through the gateway.
async fn request(gateway: &InProcess, method: &str, path: &str, body: &str) -> common::Reply {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "gateway.test")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(gateway.addr, request).await
}

#[tokio::test]
async fn chunked_responses_stream_and_keep_the_connection() {
    let upstream = Scripted::start(|_, _| {
        Answer::Pieces(vec![
            bytes("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Up: 1\r\n\r\n5\r\nhel"),
            bytes("lo\r\n6;ext=1\r\n world\r\n"),
            bytes("0\r\nX-Trailer: t\r\n\r\n"),
        ])
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    for _ in 0..3 {
        let reply = get(gateway.addr, "/chunked", &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "hello world");
        assert_eq!(reply.headers["x-up"], "1");
    }
    assert_eq!(upstream.connections(), 1, "one keep-alive connection");
}

#[tokio::test]
async fn responses_split_anywhere_are_read_whole() {
    let upstream = Scripted::start(|_, _| {
        let text = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-Split: yes\r\n\r\n0123456789";
        Answer::Pieces(text.chunks(7).map(<[u8]>::to_vec).collect())
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    for _ in 0..2 {
        let reply = get(gateway.addr, "/", &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "0123456789");
        assert_eq!(reply.headers["x-split"], "yes");
    }
    assert_eq!(upstream.connections(), 1);
}

#[tokio::test]
async fn close_delimited_bodies_end_with_the_connection() {
    let upstream = Scripted::start(|_, _| {
        Answer::ThenClose(bytes(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
        ))
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    for _ in 0..2 {
        let reply = get(gateway.addr, "/", &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "until the end");
    }
    assert_eq!(upstream.connections(), 2, "never reused");
}

#[tokio::test]
async fn interim_responses_are_skipped() {
    let upstream = Scripted::start(|_, _| {
        Answer::Pieces(vec![
            bytes("HTTP/1.1 100 Continue\r\n\r\n"),
            bytes("HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"),
            bytes("HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"),
        ])
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let reply = request(&gateway, "POST", "/items", "{}").await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.body, "ok");
}

#[tokio::test]
async fn bodiless_responses_do_not_desynchronise_the_connection() {
    let upstream = Scripted::start(|request, _| {
        if request.starts_with("HEAD") {
            Answer::Pieces(vec![bytes("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")])
        } else if request.starts_with("DELETE") {
            Answer::Pieces(vec![bytes("HTTP/1.1 204 No Content\r\n\r\n")])
        } else {
            Answer::Pieces(vec![bytes(
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            )])
        }
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let head = request(&gateway, "HEAD", "/", "").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.headers["content-length"], "5");
    assert!(head.body.is_empty());
    let deleted = request(&gateway, "DELETE", "/x", "").await;
    assert_eq!(deleted.status, 204);
    let got = get(gateway.addr, "/", &[]).await;
    assert_eq!(got.body, "hello");
    assert_eq!(upstream.connections(), 1);
}

#[tokio::test]
async fn transfer_encoding_with_content_length_is_502() {
    // RFC 9112 §6.3 item 3: such a message "ought to be handled as an
    // error"; two framings are how responses are split.
    let upstream = Scripted::start(|_, _| {
        Answer::Pieces(vec![bytes(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        )])
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    for _ in 0..2 {
        let reply = get(gateway.addr, "/", &[]).await;
        assert_eq!(reply.status, 502);
        assert_eq!(reply.headers["content-type"], "application/problem+json");
    }
    // The refused connection is never reused.
    assert_eq!(upstream.connections(), 2);
}

#[tokio::test]
async fn malformed_responses_are_502() {
    let upstream = Scripted::start(|request, _| {
        if request.contains("/conflict") {
            Answer::Pieces(vec![bytes(
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            )])
        } else if request.contains("/garbage") {
            Answer::Pieces(vec![bytes("SSH-2.0-OpenSSH_9.2\r\n\r\n")])
        } else {
            Answer::ThenClose(bytes("HTTP/1.1 200 OK\r\nContent-"))
        }
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    for path in ["/conflict", "/garbage", "/cut-head"] {
        let reply = get(gateway.addr, path, &[]).await;
        assert_eq!(reply.status, 502, "{path}");
        assert_eq!(
            reply.headers["content-type"], "application/problem+json",
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_body_cut_short_aborts_the_client_response() {
    let upstream = Scripted::start(|_, _| {
        Answer::ThenClose(bytes("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n012"))
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let answer = raw(
        gateway.addr,
        b"GET / HTTP/1.1\r\nhost: gateway.test\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    // The client sees the connection end before the 10 bytes it was
    // promised: right away (the head was still buffered when the body
    // failed) or after the part that came.
    assert!(
        answer.is_empty()
            || (answer.starts_with("HTTP/1.1 200") && answer.ends_with("\r\n\r\n012")),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_closed_keep_alive_connection_is_retried_only_when_safe() {
    // Each connection answers its first request and silently closes on the
    // second, as an upstream does when its keep-alive timer fires just as a
    // request arrives.
    let upstream = Scripted::start(|_, index| match index {
        0 => Answer::Pieces(vec![bytes(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        )]),
        _ => Answer::Close,
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    assert_eq!(get(gateway.addr, "/one", &[]).await.status, 200);
    // Idempotent, no body: sent again on a new connection.
    let again = get(gateway.addr, "/two", &[]).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(upstream.connections(), 2);
    // POST may have been acted on: not repeated, the client gets 502.
    let post = request(&gateway, "POST", "/three", "x").await;
    assert_eq!(post.status, 502);
    let posts = upstream
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST"))
        .count();
    assert_eq!(posts, 1, "the POST went up exactly once");
}

#[tokio::test]
async fn request_bodies_of_unknown_length_go_up_chunked() {
    let upstream = Scripted::start(|_, _| {
        Answer::Pieces(vec![bytes("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")])
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let answer = raw(
        gateway.addr,
        b"POST /upload HTTP/1.1\r\nhost: gateway.test\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let requests = upstream.requests();
    let sent = &requests[0];
    assert!(sent.contains("transfer-encoding: chunked\r\n"), "{sent}");
    assert!(!sent.contains("content-length"), "{sent}");
    let body = &sent[sent.find("\r\n\r\n").unwrap() + 4..];
    // Re-chunked as the frames arrived; the decoded body is what was sent.
    let mut decoded = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        if size == 0 {
            break;
        }
        decoded.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    assert_eq!(decoded, "wikipedia");
}

#[tokio::test]
async fn request_bodies_of_known_length_keep_it() {
    let upstream = Scripted::start(|_, _| {
        Answer::Pieces(vec![bytes("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")])
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let reply = request(&gateway, "PUT", "/doc", "0123456789").await;
    assert_eq!(reply.status, 200);
    let requests = upstream.requests();
    assert!(
        requests[0].starts_with("PUT /doc HTTP/1.1\r\n"),
        "{}",
        requests[0]
    );
    assert!(
        requests[0].contains("content-length: 10\r\n"),
        "{}",
        requests[0]
    );
    assert!(
        requests[0].ends_with("\r\n\r\n0123456789"),
        "{}",
        requests[0]
    );
}

#[tokio::test]
async fn large_bodies_stream_through_intact_both_ways() {
    // 4 MiB down (several socket buffers' worth, so the body is read as the
    // client takes it), 2 MiB up.
    let upstream = Scripted::start(|request, _| {
        let size = 4 * 1024 * 1024;
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let uploaded = request.len() - request.find("\r\n\r\n").unwrap() - 4;
        let mut answer =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nX-Uploaded: {uploaded}\r\n\r\n")
                .into_bytes();
        answer.extend_from_slice(&body);
        Answer::Pieces(vec![answer])
    })
    .await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let upload = "u".repeat(2 * 1024 * 1024);
    let reply = request(&gateway, "POST", "/big", &upload).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.headers["x-uploaded"],
        (2 * 1024 * 1024).to_string().as_str()
    );
    assert_eq!(reply.body.len(), 4 * 1024 * 1024);
    assert!(
        reply
            .body
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8),
        "body bytes arrive in order, none lost"
    );
}

#[tokio::test]
async fn an_answer_before_the_body_is_relayed_at_once() {
    // An upstream that refuses an upload on its head alone and then reads
    // nothing more, holding the connection open (as servers that check a
    // length or a credential first do).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                    break;
                }
                head.push(byte[0]);
            }
            let _ = stream
                .write_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\n\r\ntoo big\n")
                .await;
            held.push(stream);
        }
    });
    let upstream = Scripted {
        addr,
        connections: Arc::new(AtomicUsize::new(0)),
        requests: Arc::new(Mutex::new(Vec::new())),
        task,
    };
    let gateway = InProcess::start(&config(&upstream)).await;
    let upload = "u".repeat(16 * 1024 * 1024);
    // The upstream's early answer is relayed: a gateway that wrote on
    // would hit the upstream `timeout` (3 s) and answer 504.
    let reply = request(&gateway, "POST", "/upload", &upload).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.body, "too big\n");
}
