//! Response splitting from a malicious upstream, one raw-socket test per
//! variant: a body after a `204` / `304` / `HEAD` answer, more bytes than
//! `Content-Length`, a second response glued to the first, `Content-Length`
//! with `Transfer-Encoding`, HTTP/1.0 with `Transfer-Encoding`, differing
//! `Content-Length`, each chunk-line form hyper refuses, obs-fold, bare CR and
//! LF in the head.
//!
//! Each test asserts what the client got, what the upstream received byte
//! for byte, and that the next client — which would get the poisoned
//! connection if it were pooled — gets only its own response: the upstream
//! answers every other request with a body naming the request's path, so a
//! connection shifted by one response is visible. The gateway in process,
//! on real time (the Nagle variant needs the kernel's real ACK timing).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::openmetrics::parse;
use common::{InProcess, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the malicious upstream writes for `/evil`, in pieces (a pause
/// between them, so a later piece arrives after the gateway took the first).
type Script = Arc<dyn Fn(&str) -> Vec<Vec<u8>> + Send + Sync>;

/// What one upstream connection received, and whether the gateway closed it.
#[derive(Debug, Default)]
struct ConnLog {
    received: Vec<u8>,
    closed: bool,
}

/// A raw-TCP upstream on `127.0.0.1:0`: `/evil` gets the script's bytes,
/// any other path `200` with the path as its body.
struct Malicious {
    addr: std::net::SocketAddr,
    conns: Arc<Mutex<Vec<Arc<Mutex<ConnLog>>>>>,
    /// Answers written whole so far.
    answered: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Malicious {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Malicious {
    async fn start(evil: Script) -> Malicious {
        Malicious::start_with(evil, false).await
    }

    /// `nagle`: leave Nagle's algorithm on for the upstream's sockets.
    async fn start_with(evil: Script, nagle: bool) -> Malicious {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<Arc<Mutex<ConnLog>>>>> = Arc::default();
        let answered = Arc::new(AtomicUsize::new(0));
        let (list, count) = (conns.clone(), answered.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // Unless `nagle`, each piece leaves at once; with Nagle's
                // algorithm a later piece waits in this kernel for the ACK of
                // the first, which may come only with the gateway's next
                // request on the connection.
                let _ = stream.set_nodelay(!nagle);
                let log = Arc::new(Mutex::new(ConnLog::default()));
                list.lock().unwrap().push(log.clone());
                tokio::spawn(serve(stream, evil.clone(), log, count.clone()));
            }
        });
        Malicious {
            addr,
            conns,
            answered,
            task,
        }
    }

    fn connections(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    /// The bytes connection `index` received.
    fn received(&self, index: usize) -> Vec<u8> {
        self.conns.lock().unwrap()[index]
            .lock()
            .unwrap()
            .received
            .clone()
    }

    /// Waits until connection `index` was closed by the gateway.
    async fn closed(&self, index: usize) -> bool {
        eventually(async || self.conns.lock().unwrap()[index].lock().unwrap().closed).await
    }

    /// Waits until `count` answers were written whole.
    async fn answered(&self, count: usize) {
        assert!(
            eventually(async || self.answered.load(Ordering::SeqCst) >= count).await,
            "the upstream did not write {count} answers"
        );
    }
}

async fn serve(
    mut stream: TcpStream,
    evil: Script,
    log: Arc<Mutex<ConnLog>>,
    answered: Arc<AtomicUsize>,
) {
    let mut pending = Vec::new();
    loop {
        // One request head (the tests send no bodies).
        let end = loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    log.lock().unwrap().closed = true;
                    return;
                }
                Ok(n) => {
                    log.lock().unwrap().received.extend_from_slice(&chunk[..n]);
                    pending.extend_from_slice(&chunk[..n]);
                }
            }
        };
        let head = String::from_utf8_lossy(&pending[..end]).into_owned();
        pending.drain(..end);
        let mut words = head.split(' ');
        let method = words.next().unwrap_or_default().to_owned();
        let path = words.next().unwrap_or_default().to_owned();
        let pieces = if path == "/evil" {
            evil(&method)
        } else {
            vec![
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{path}",
                    path.len()
                )
                .into_bytes(),
            ]
        };
        for (i, piece) in pieces.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            if stream.write_all(piece).await.is_err() {
                return;
            }
        }
        answered.fetch_add(1, Ordering::SeqCst);
    }
}

fn config(upstream: &Malicious) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
# One worker: one idle list, so the second client would get the first's
# connection if it were pooled.
workers = 1

[upstreams.up]
url = "http://{addr}"
timeout = "5s"

[[routes]]
name = "all"
match = {{ path_prefix = "/" }}
upstream = "up"
"#,
        addr = upstream.addr
    )
}

/// The request the gateway sends upstream for a client's `METHOD path`
/// with only a `Host` (and `Connection: close`, which stays behind).
fn forwarded(method: &str, path: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: gateway.test\r\nx-forwarded-for: 127.0.0.1\r\n\
         x-forwarded-proto: http\r\nforwarded: for=127.0.0.1;proto=http;host=gateway.test\r\n\r\n"
    )
    .into_bytes()
}

/// Sends `METHOD path` on a new connection and reads until the gateway
/// closes it (the request asks to close): the raw answer.
async fn client(gateway: &InProcess, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    let request =
        format!("{method} {path} HTTP/1.1\r\nhost: gateway.test\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The body of a raw answer (after its head), decoded if it is chunked;
/// `None` for chunked framing that does not end well.
fn body(answer: &str) -> String {
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        return String::new();
    };
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_owned();
    }
    let mut decoded = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size, 16).unwrap_or(0);
        if size == 0 || after.len() < size + 2 {
            break;
        }
        decoded.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    decoded
}

/// `tollgate_upstream_errors_total{upstream="up",kind}`.
async fn upstream_errors(gateway: &InProcess, kind: &str) -> f64 {
    let reply = common::get(gateway.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let exposition = parse(&text).unwrap();
    exposition.count(
        "tollgate_upstream_errors_total",
        &[("upstream", "up"), ("kind", kind)],
    )
}

/// What the first client should have got.
enum Expect {
    /// This status line and exactly this body.
    Answer(&'static str, &'static str),
    /// A 502 problem+json, the upstream error counted.
    Refused,
    /// The head went out, then the stream was cut (or nothing came at all,
    /// when the body failed while the head was still buffered); counted.
    Cut,
}

/// Runs one variant: the first client's `method /evil` is answered by
/// `evil`, a second client follows, and both the clients' answers and the
/// upstream's received bytes are checked.
async fn variant(method: &str, expect: Expect, evil: Script) {
    let upstream = Malicious::start(evil).await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let first = client(&gateway, method, "/evil").await;
    match expect {
        Expect::Answer(status, want) => {
            assert!(first.starts_with(status), "{first:?}");
            assert_eq!(body(&first), want, "{first:?}");
        }
        Expect::Refused => {
            assert!(first.starts_with("HTTP/1.1 502 "), "{first:?}");
            assert!(
                first
                    .to_ascii_lowercase()
                    .contains("content-type: application/problem+json\r\n"),
                "{first:?}"
            );
            assert_eq!(upstream_errors(&gateway, "protocol").await, 1.0);
        }
        Expect::Cut => {
            assert!(
                first.is_empty() || first.starts_with("HTTP/1.1 200 "),
                "{first:?}"
            );
            assert!(
                !first.ends_with("0\r\n\r\n"),
                "the body was ended cleanly: {first:?}"
            );
            assert_eq!(upstream_errors(&gateway, "protocol").await, 1.0);
        }
    }
    // All of the malicious answer has gone out before the next client.
    upstream.answered(1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = client(&gateway, "GET", "/second").await;
    assert!(second.starts_with("HTTP/1.1 200 "), "{second:?}");
    assert_eq!(
        body(&second),
        "/second",
        "the second client got another's bytes"
    );
    // The poisoned connection carried one request and was closed; the second
    // client's went on a connection of its own.
    assert_eq!(upstream.connections(), 2);
    assert!(upstream.closed(0).await, "the first connection stayed open");
    assert_eq!(upstream.received(0), forwarded(method, "/evil"));
    assert_eq!(upstream.received(1), forwarded("GET", "/second"));
}

fn pieces(pieces: &[&[u8]]) -> Script {
    let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
    Arc::new(move |_| pieces.clone())
}

/// A complete response, glued after the first as the next client's.
const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray";

#[tokio::test]
async fn a_body_after_a_204_is_not_the_next_response() {
    variant(
        "GET",
        Expect::Answer("HTTP/1.1 204 ", ""),
        pieces(&[b"HTTP/1.1 204 No Content\r\n\r\n", STRAY]),
    )
    .await;
    variant(
        "GET",
        Expect::Answer("HTTP/1.1 204 ", ""),
        pieces(&[&[&b"HTTP/1.1 204 No Content\r\n\r\n"[..], STRAY].concat()]),
    )
    .await;
}

#[tokio::test]
async fn a_body_after_a_304_is_not_the_next_response() {
    variant(
        "GET",
        Expect::Answer("HTTP/1.1 304 ", ""),
        pieces(&[
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
            b"stray",
        ]),
    )
    .await;
}

#[tokio::test]
async fn a_body_after_a_head_answer_is_not_the_next_response() {
    variant(
        "HEAD",
        Expect::Answer("HTTP/1.1 200 ", ""),
        pieces(&[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"stray"]),
    )
    .await;
    variant(
        "HEAD",
        Expect::Answer("HTTP/1.1 200 ", ""),
        pieces(&[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray"]),
    )
    .await;
}

#[tokio::test]
async fn bytes_past_the_content_length_are_not_the_next_response() {
    variant(
        "GET",
        Expect::Answer("HTTP/1.1 200 ", "abc"),
        pieces(&[&[
            &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"[..],
            STRAY,
        ]
        .concat()]),
    )
    .await;
    variant(
        "GET",
        Expect::Answer("HTTP/1.1 200 ", "abc"),
        pieces(&[b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab", b"cstray"]),
    )
    .await;
}

#[tokio::test]
async fn a_second_response_glued_to_the_first_is_not_the_next_response() {
    // Right behind the first, and in a later write (after the first was
    // relayed and its connection would be idle).
    variant(
        "GET",
        Expect::Answer("HTTP/1.1 200 ", "first"),
        pieces(&[&[
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"[..],
            STRAY,
        ]
        .concat()]),
    )
    .await;
    variant(
        "GET",
        Expect::Answer("HTTP/1.1 200 ", "first"),
        pieces(&[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", STRAY]),
    )
    .await;
    variant(
        "GET",
        Expect::Answer("HTTP/1.1 200 ", "first"),
        pieces(&[
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n0\r\n\r\n",
            STRAY,
        ]),
    )
    .await;
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_refused() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 34\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray",
    ] {
        variant("GET", Expect::Refused, pieces(&[answer])).await;
    }
}

#[tokio::test]
async fn transfer_encoding_in_http_1_0_is_refused() {
    variant(
        "GET",
        Expect::Refused,
        pieces(&[b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n5\r\nhello\r\n0\r\n\r\n"]),
    )
    .await;
}

#[tokio::test]
async fn differing_or_malformed_content_lengths_are_refused() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5 5\r\n\r\nhello",
    ] {
        variant("GET", Expect::Refused, pieces(&[answer])).await;
    }
}

#[tokio::test]
async fn each_chunk_line_form_hyper_refuses_cuts_the_stream() {
    for chunks in [
        &b"5 zz\r\nhello\r\n0\r\n\r\n"[..],
        b"5;a\nb\r\nhello\r\n0\r\n\r\n",
        b"5\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\n0\r\n\r\n",
        b"5\r\nhelloX0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"-5\r\nhello\r\n0\r\n\r\n",
        b"10000000000000000\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX: 1\n\r\n",
        b"5\r\nhello\r\n0\r\n folded: 1\r\n\r\n",
        b"5\r\nhello\r\n0\r\n\n",
    ] {
        let answer = [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            chunks,
            STRAY,
        ]
        .concat();
        variant("GET", Expect::Cut, pieces(&[&answer])).await;
    }
}

#[tokio::test]
async fn obs_fold_and_bare_cr_or_lf_in_the_head_are_refused() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 5\r\n\r\nhello"[..],
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\tfolded\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\rContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r2\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\nContent-Length: 5\n\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 5\r\n\r\nhello",
    ] {
        variant("GET", Expect::Refused, pieces(&[answer])).await;
    }
}

/// 200 rounds of a client asking for a `204` after which the upstream
/// writes a whole response, and one asking for its own path: how many of
/// the 400 got a response meant for another. `nagle`: the upstream leaves
/// Nagle's algorithm on, so its stray response waits in its kernel for the
/// ACK of the `204` — which comes with the gateway's next request on that
/// connection.
async fn shifted_clients(nagle: bool) -> usize {
    let upstream =
        Malicious::start_with(pieces(&[b"HTTP/1.1 204 No Content\r\n\r\n", STRAY]), nagle).await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let mut shifted = 0;
    for round in 0..200 {
        // On a shifted connection this client gets a 200 meant for another.
        let first = client(&gateway, "GET", "/evil").await;
        if !first.starts_with("HTTP/1.1 204 ") {
            shifted += 1;
        }
        // The stray response has been written before the next client asks.
        upstream.answered(2 * round + 1).await;
        let path = format!("/client-{round}");
        let answer = client(&gateway, "GET", &path).await;
        if body(&answer) != path {
            shifted += 1;
        }
        upstream.answered(2 * round + 2).await;
    }
    shifted
}

/// The issue's measurement (67 of 200 then). Stray bytes that have arrived
/// are found by the check before reuse, whatever the event loop has seen.
#[tokio::test]
async fn no_client_of_400_gets_the_stray_response_after_a_204() {
    assert_eq!(shifted_clients(false).await, 0);
}

/// Bytes still in the upstream cannot be seen by any check (hyper's client
/// and nginx are no different): at most one client, the first after the
/// first stray response, can get them; the pool then stops reusing the
/// upstream's connections, and every later client gets its own response.
/// Without that rule, 197 of the 400 got another's (with it, 0 in the runs
/// so far: a young connection ACKs at once, so the first stray response
/// arrives in time to be found).
#[tokio::test]
async fn after_one_stray_response_held_by_nagle_no_other_client_gets_one() {
    let shifted = shifted_clients(true).await;
    assert!(
        shifted <= 1,
        "{shifted} of 400 clients got another's response"
    );
}
