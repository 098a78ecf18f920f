//! Interim (1xx) responses (RFC 9110 §15.2): an upstream's
//! `103 Early Hints` reaches an HTTP/1.1 client before the final response,
//! as it arrives; an HTTP/1.0 client gets only the final response; an
//! upstream's `100 Continue` is not relayed (the gateway answers a client's
//! `Expect` itself, once); an upstream that sends interim heads without end
//! gets the client a 502, not a hang. Real sockets: a scripted raw upstream
//! and raw clients against the gateway in process.

mod common;

use std::time::Duration;

use common::InProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const HINTS: &[u8] = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n";
const FINAL: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ndone";

/// What the scripted upstream does on each request, after reading its head.
#[derive(Clone, Copy)]
enum Script {
    /// The 103, then waits for the test's go, then the 200.
    HintsThenWait,
    /// The 103 and the 200 at once.
    Hints,
    /// A `100 Continue`, then (after the body, if any) the 200.
    Continue,
    /// 103 heads, without end.
    EndlessHints,
}

/// A raw upstream that answers every connection's first request by `script`.
async fn upstream(script: Script) -> (String, mpsc::UnboundedSender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (go_tx, go_rx) = mpsc::unbounded_channel::<()>();
    let go = std::sync::Arc::new(tokio::sync::Mutex::new(go_rx));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let go = go.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                // Each request on the connection: its head, then the script.
                loop {
                    let head_end = loop {
                        if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&seen[..head_end]).to_ascii_lowercase();
                    let body_len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    seen.drain(..head_end);
                    let written = match script {
                        Script::HintsThenWait => {
                            let _ = stream.write_all(HINTS).await;
                            go.lock().await.recv().await;
                            stream.write_all(FINAL).await
                        }
                        Script::Hints => stream.write_all(&[HINTS, FINAL].concat()).await,
                        Script::Continue => {
                            let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
                            while seen.len() < body_len {
                                match stream.read(&mut buf).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                                }
                            }
                            stream.write_all(FINAL).await
                        }
                        Script::EndlessHints => {
                            while stream.write_all(HINTS).await.is_ok() {}
                            return;
                        }
                    };
                    if written.is_err() {
                        return;
                    }
                    seen.drain(..body_len.min(seen.len()));
                }
            });
        }
    });
    (url, go_tx)
}

async fn gateway(url: &str) -> InProcess {
    InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[upstreams.api]
url = "{url}"
timeout = "20s"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#
    ))
    .await
}

/// Reads from `stream` until `done` says the bytes are complete (at most 10 s).
async fn read_until(stream: &mut TcpStream, done: impl Fn(&[u8]) -> bool) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        while !done(&got) {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "timed out with {:?}",
        String::from_utf8_lossy(&got)
    );
    String::from_utf8_lossy(&got).into_owned()
}

fn ends_with_done(bytes: &[u8]) -> bool {
    bytes.ends_with(b"done")
}

#[tokio::test]
async fn early_hints_reach_an_http11_client_before_the_final_response() {
    let (url, go) = upstream(Script::HintsThenWait).await;
    let gateway = gateway(&url).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"GET /page HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // The upstream holds its final response until the hints have arrived:
    // they must come on their own, early.
    let hints = read_until(&mut client, |b| b.windows(4).any(|w| w == b"\r\n\r\n")).await;
    assert_eq!(hints.as_bytes(), HINTS, "{hints}");
    go.send(()).unwrap();
    let rest = read_until(&mut client, ends_with_done).await;
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
    // The connection carries on.
    client
        .write_all(b"GET /again HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let _ = read_until(&mut client, |b| b.windows(4).any(|w| w == b"\r\n\r\n")).await;
    go.send(()).unwrap();
    let again = read_until(&mut client, ends_with_done).await;
    assert!(again.starts_with("HTTP/1.1 200 OK\r\n"), "{again}");
}

#[tokio::test]
async fn an_http10_client_gets_only_the_final_response() {
    let (url, _go) = upstream(Script::Hints).await;
    let gateway = gateway(&url).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"GET /page HTTP/1.0\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let got = read_until(&mut client, ends_with_done).await;
    assert!(got.starts_with("HTTP/1.0 200 OK\r\n"), "{got}");
    assert!(!got.contains("103"), "{got}");
}

#[tokio::test]
async fn hints_that_arrive_with_the_final_response_still_come_first() {
    let (url, _go) = upstream(Script::Hints).await;
    let gateway = gateway(&url).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"GET /page HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let got = read_until(&mut client, ends_with_done).await;
    let hints = std::str::from_utf8(HINTS).unwrap();
    assert!(got.starts_with(hints), "{got}");
    assert!(
        got[hints.len()..].starts_with("HTTP/1.1 200 OK\r\n"),
        "{got}"
    );
}

#[tokio::test]
async fn an_upstreams_100_continue_is_not_relayed() {
    let (url, _go) = upstream(Script::Continue).await;
    let gateway = gateway(&url).await;
    // A plain request: the upstream's 100 is dropped.
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"GET /page HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let got = read_until(&mut client, ends_with_done).await;
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");

    // A client that asks `Expect: 100-continue` gets one `100 Continue`,
    // the gateway's, before it sends the body, and then the final response.
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let go_ahead = read_until(&mut client, |b| b.windows(4).any(|w| w == b"\r\n\r\n")).await;
    assert_eq!(go_ahead, "HTTP/1.1 100 Continue\r\n\r\n");
    client.write_all(b"hello").await.unwrap();
    let got = read_until(&mut client, ends_with_done).await;
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(!got.contains("100 Continue"), "a second 100: {got}");
}

#[tokio::test]
async fn endless_interim_responses_end_in_a_502() {
    let (url, _go) = upstream(Script::EndlessHints).await;
    let gateway = gateway(&url).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"GET /page HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // Hints first (a bounded number), then the gateway's 502, long before
    // the upstream's 20 s timeout.
    let got = read_until(&mut client, |b| {
        String::from_utf8_lossy(b).contains("HTTP/1.1 502") && b.ends_with(b"}")
    })
    .await;
    let relayed = got.matches("HTTP/1.1 103 Early Hints").count();
    assert!(relayed <= 16, "{relayed} interim heads relayed");
    let final_head = &got[got.find("HTTP/1.1 502").unwrap()..];
    assert!(
        final_head.contains("application/problem+json"),
        "{final_head}"
    );
}
