//! The gateway's upstream client (`http1::client` and `upstream::pool`) against hyper's
//! (`hyper::client::conn::http1`), on real sockets.
//!
//! A raw upstream on `127.0.0.1:0` answers `/case/N` with the exact bytes of
//! case N of a table — status lines, framings, chunked forms with extensions
//! and trailers, interim responses, HEAD, 204/304, close-delimited bodies,
//! and many malformed answers — and then closes. Both clients send the same
//! request to it. They must agree on accepting or refusing the response, and
//! on an accepted one's status, fields (but those hop-by-hop and the
//! length, which each carries its own way) and body bytes. Where they do
//! not, the gateway's client must be the stricter one, and the case says so
//! with its reason (`Stricter`); a case the gateway accepts and hyper
//! refuses is always a failure.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::http1::client::exchange::OutgoingBody;
use tollgate::http1::client::head::OwnFields;
use tollgate::upstream::pool::{BodyErrors, ConnectionPool};

/// The request body both clients send: none. (The gateway's own body type
/// is the pipeline's; the client takes any `OutgoingBody`.)
struct NoBody;

impl http_body::Body for NoBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        true
    }
}

impl OutgoingBody for NoBody {
    fn take_buffered(&mut self) -> Option<Option<Bytes>> {
        Some(None)
    }
}

/// Every exchange ends well before this; it only turns a hang into a failure.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(10);

/// What the two clients must do with a case.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The same: both accept with the same message, or both refuse.
    Same,
    /// hyper accepts; the gateway refuses, for this reason.
    Stricter(&'static str),
}

use Expect::{Same, Stricter};

struct Case {
    method: Method,
    answer: Vec<u8>,
    expect: Expect,
}

fn case(method: Method, answer: impl AsRef<[u8]>, expect: Expect) -> Case {
    Case {
        method,
        answer: answer.as_ref().to_vec(),
        expect,
    }
}

fn get(answer: impl AsRef<[u8]>, expect: Expect) -> Case {
    case(Method::GET, answer, expect)
}

/// `200 OK`, chunked, with `chunks` as the body.
fn chunked(chunks: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{chunks}").into_bytes()
}

fn cases() -> Vec<Case> {
    let mut many = String::from("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n");
    for i in 1..100 {
        many.push_str(&format!("X-F{i}: {i}\r\n"));
    }
    let too_many = format!("{many}X-F100: 100\r\n\r\n");
    many.push_str("\r\n");
    let mut huge = String::from("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n");
    for i in 0..80 {
        huge.push_str(&format!("X-Big-{i}: {}\r\n", "h".repeat(1000)));
    }
    huge.push_str("\r\n");
    let long_lws = format!("3{}\r\nabc\r\n0\r\n\r\n", " ".repeat(17 * 1024));
    vec![
        // Status lines.
        get("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", Same),
        get("HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok", Same),
        get("HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", Same),
        get("HTTP/1.1 299 Custom Reason\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 599 x\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 999 x\r\nContent-Length: 0\r\n\r\n", Same),
        get(b"HTTP/1.1 200 \xe9t\xe9\tok\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", Same),
        get("HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1  200 OK\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n", Same),
        get("http/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", Same),
        get("ICY 200 OK\r\nContent-Length: 0\r\n\r\n", Same),
        get(b"HTTP/1.1 200 O\x00K\r\nContent-Length: 0\r\n\r\n", Same),
        get(
            "\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Stricter("an empty line before the status line: on a reused connection, a framing disagreement"),
        ),
        // Fields.
        get(
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\nX-A: 2\r\nX-Tab: a\tb\r\nX-Obs: \xff\xfe\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n",
            Same,
        ),
        get(
            "HTTP/1.1 200 OK\r\nConnection: x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: 1\r\nContent-Length: 0\r\n\r\n",
            Same,
        ),
        get(many, Same),
        get(too_many, Same),
        get(
            huge,
            Stricter("a response head over 64 KiB (hyper's client allows about 400 KiB)"),
        ),
        get("HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 200 OK\r\nX-A: 1\r\n\tfolded\r\nContent-Length: 0\r\n\r\n", Same),
        get(b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n", Same),
        get(b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 0\r\n\r\n", Same),
        get(b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 200 OK\r\nX-A : 1\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 200 OK\r\nX-A 1\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 200 OK\r\n: 1\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 200 OK\rX-A: 1\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 200 OK\r\nX-A: 1\r2\r\nContent-Length: 0\r\n\r\n", Same),
        get(
            "HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
            Stricter("a bare LF line end in the head: lines end only at CRLF here"),
        ),
        get(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok",
            Stricter("a bare LF line end in the head: lines end only at CRLF here"),
        ),
        // Length framing.
        get(
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
            Stricter("a list of lengths in one line: the crate's one Content-Length rule refuses lists"),
        ),
        get("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 005\r\n\r\nhello", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 5 5\r\n\r\nhello", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\nhello", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 5,\r\n\r\nhello", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nhello", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551616\r\n\r\n", Same),
        get("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", Same),
        // Close-delimited.
        get("HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nuntil the end", Same),
        get("HTTP/1.0 200 OK\r\n\r\nuntil the end", Same),
        get("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw bytes", Same),
        get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw bytes", Same),
        // Chunked.
        get(chunked("5\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("4\r\nWiki\r\n5;name=value\r\npedia\r\nE;a;b=\"c d\"\r\n in\r\n\r\nchunks.\r\n0\r\n\r\n"), Same),
        get(chunked("A\r\n0123456789\r\n00a\r\n0123456789\r\n0\r\n\r\n"), Same),
        get(chunked("3 \t\r\nabc\r\n3 ;x\r\nabc\r\n0\r\n\r\n"), Same),
        get(chunked("3\r\nabc\r\n0\r\nExpires: never\r\nX-T:\tv \r\n\r\n"), Same),
        // The kept trailer: whitespace around the value, the name's case,
        // repeats, an empty value, names that only start alike.
        get(chunked("3\r\nabc\r\n0\r\nX-Usage: \t 42 \t\r\n\r\n"), Same),
        get(chunked("3\r\nabc\r\n0\r\nx-usage:7\r\nX-USAGE: 8\r\nx-usage-more: 1\r\nx-usag: 2\r\n\r\n"), Same),
        get(chunked("0\r\nx-usage:\r\nExpires: never\r\n\r\n"), Same),
        get(&b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx-usage: 1 \xff2\r\n\r\n"[..], Same),
        get(chunked("1\r\nx\r\n0\r\nx-usage: 5\nx-usage: 6\r\n\r\n"), Same),
        get(chunked("0\r\nx-usage : 5\r\n\r\n"), Same),
        get(chunked("0\r\nx-usage: 5\r\n folded\r\n\r\n"), Same),
        get(chunked("3;ext\r\nabc\r\n0;last\r\n\r\n"), Same),
        get(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            Same,
        ),
        get(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            Same,
        ),
        get(chunked("5 zz\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("5zz\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("5;a\nb\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("5;a\rb\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("5\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("5\r\nhello\n0\r\n\r\n"), Same),
        get(chunked("5\r\nhelloXY0\r\n\r\n"), Same),
        get(chunked("0x5\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("-5\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked(" 5\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked(";5\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("10000000000000000\r\nhello\r\n0\r\n\r\n"), Same),
        get(chunked("5\r\nhello\r\n"), Same),
        get(chunked("5\r\nhel"), Same),
        get(chunked("5\r\nhello\r\n0\r\n"), Same),
        get(chunked("5\r\nhello\r\n0\r\n\n"), Same),
        get(chunked("5\r\nhello\r\n0\r\nX: 1\nY: 2\r\n\r\n"), Same),
        get(chunked("5\r\nhello\r\n0\r\nno colon here\r\n\r\n"), Same),
        get(chunked("5\r\nhello\r\n0\r\n folded: 1\r\n\r\n"), Same),
        get(
            chunked("3;a\x01\r\nabc\r\n0\r\n\r\n"),
            Stricter("a control byte in a chunk extension: not extension syntax"),
        ),
        get(
            chunked(&long_lws),
            Stricter("17 KiB of whitespace after a chunk size: it counts against the 16 KiB extension limit, which hyper applies to extensions only"),
        ),
        // Interim responses.
        get(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Same,
        ),
        get(
            "HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Stricter("a bare LF line end in an interim head"),
        ),
        // No body, whatever the fields say.
        case(Method::HEAD, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", Same),
        case(Method::HEAD, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", Same),
        case(Method::HEAD, "HTTP/1.1 404 Not Found\r\n\r\n", Same),
        case(
            Method::HEAD,
            "HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
            Stricter("an invalid Content-Length in a HEAD answer: it is relayed, so it must be valid"),
        ),
        get("HTTP/1.1 204 No Content\r\n\r\n", Same),
        get("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", Same),
        get("HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nETag: \"x\"\r\n\r\n", Same),
        get("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", Same),
        // Framing ambiguities.
        get(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Stricter("Transfer-Encoding with Content-Length: RFC 9112 §6.3 item 3, \"ought to be handled as an error\"; two framings are how responses are split"),
        ),
        get(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Stricter("Transfer-Encoding with Content-Length (RFC 9112 §6.3 item 3)"),
        ),
        get(
            "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
            Stricter("framing fields are judged whatever the status: a 204 with two framings is as broken as a 200"),
        ),
        get(
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Same,
        ),
        get(
            "HTTP/1.0 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
            Stricter("Transfer-Encoding in HTTP/1.0 (RFC 9112 §6.1), whatever the status"),
        ),
        // Not HTTP at all.
        get("SSH-2.0-OpenSSH_9.2\r\n\r\n", Same),
        get("", Same),
    ]
}

/// What a client made of a response.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Accepted {
        status: StatusCode,
        /// Lower-case names, sorted by name (stably: a name's values keep
        /// their order), without hop-by-hop fields and `Content-Length`
        /// (but in a HEAD answer, where it is a field like any other).
        fields: Vec<(String, Vec<u8>)>,
        body: Bytes,
        /// The values of trailer field `x-usage`, in order: the one
        /// trailer the gateway's client keeps when told to (a token
        /// route's usage count), compared with hyper's trailers.
        usage_trailer: Vec<Vec<u8>>,
    },
    Refused(String),
}

/// Names that never reach the client (RFC 9110 §7.6.1), and those
/// `Connection` names.
fn end_to_end(fields: Vec<(String, Vec<u8>)>, head: bool) -> Vec<(String, Vec<u8>)> {
    let named: Vec<String> = fields
        .iter()
        .filter(|(name, _)| name == "connection")
        .flat_map(|(_, value)| {
            String::from_utf8_lossy(value)
                .split(',')
                .map(|token| token.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut kept: Vec<_> = fields
        .into_iter()
        .filter(|(name, _)| {
            ![
                "connection",
                "keep-alive",
                "proxy-connection",
                "te",
                "trailer",
                "transfer-encoding",
                "upgrade",
            ]
            .contains(&name.as_str())
                && !named.contains(name)
                && (head || name != "content-length")
        })
        .collect();
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    kept
}

/// The raw upstream: reads a request head, answers `/case/N` with case N's
/// bytes, shuts its write side and waits for the client to close.
async fn upstream(answers: Arc<Vec<Vec<u8>>>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let answers = answers.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let index: usize = text
                    .split_whitespace()
                    .nth(1)
                    .and_then(|path| path.strip_prefix("/case/"))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(usize::MAX);
                if let Some(answer) = answers.get(index) {
                    let _ = stream.write_all(answer).await;
                }
                let _ = stream.shutdown().await;
                let _ = tokio::time::timeout(EXCHANGE_LIMIT, async {
                    while stream.read(&mut chunk).await.is_ok_and(|n| n > 0) {}
                })
                .await;
            });
        }
    });
    addr
}

/// The gateway's client: a pool of its own for the case, so nothing is reused.
async fn ours(addr: std::net::SocketAddr, method: &Method, path: &str) -> Outcome {
    let pool = ConnectionPool::new(
        addr.to_string(),
        EXCHANGE_LIMIT,
        EXCHANGE_LIMIT,
        BodyErrors::default(),
    );
    let request = Request::builder()
        .method(method.clone())
        .uri(path)
        .header("host", "upstream.test")
        .body(NoBody)
        .unwrap();
    let (response, lines) = match pool.send(request, OwnFields::default(), None).await {
        Ok(answer) => answer,
        Err(error) => {
            return Outcome::Refused(format!("head: {:?}", std::error::Error::source(&error)));
        }
    };
    let status = response.status();
    let mut body = response.into_body();
    body.keep_trailer(http::HeaderName::from_static("x-usage"));
    let (body, usage_trailer) = match body.collect().await {
        Ok(collected) => usage_values(collected),
        Err(error) => return Outcome::Refused(format!("body: {error}")),
    };
    let mut text = Vec::new();
    lines.write_to(&mut text);
    let fields = text
        .split(|&b| b == b'\n')
        .filter_map(|line| line.strip_suffix(b"\r"))
        .filter(|line| !line.is_empty())
        .map(|line| {
            let colon = line.iter().position(|&b| b == b':').unwrap();
            let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
            (name, line[colon + 1..].trim_ascii().to_vec())
        })
        .collect();
    Outcome::Accepted {
        status,
        fields: end_to_end(fields, method == Method::HEAD),
        body,
        usage_trailer,
    }
}

/// A body's bytes, and the values of its trailer field `x-usage`.
fn usage_values(collected: http_body_util::Collected<Bytes>) -> (Bytes, Vec<Vec<u8>>) {
    let values = collected
        .trailers()
        .map(|trailers| {
            trailers
                .get_all("x-usage")
                .iter()
                .map(|value| value.as_bytes().to_vec())
                .collect()
        })
        .unwrap_or_default();
    (collected.to_bytes(), values)
}

/// hyper's client, on a connection of its own.
async fn hypers(addr: std::net::SocketAddr, method: &Method, path: &str) -> Outcome {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method.clone())
        .uri(path)
        .header("host", "upstream.test")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(error) => return Outcome::Refused(format!("head: {error}")),
    };
    let status = response.status();
    let fields = response
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    let (body, usage_trailer) = match response.into_body().collect().await {
        Ok(collected) => usage_values(collected),
        Err(error) => return Outcome::Refused(format!("body: {error}")),
    };
    Outcome::Accepted {
        status,
        fields: end_to_end(fields, method == Method::HEAD),
        body,
        usage_trailer,
    }
}

#[tokio::test]
async fn the_gateway_client_agrees_with_hyper_or_is_stricter() {
    let cases = cases();
    let addr = upstream(Arc::new(cases.iter().map(|c| c.answer.clone()).collect())).await;
    let mut failures = Vec::new();
    // Of the cases that agree: both accepted, both refused; and the stricter.
    let (mut accepted, mut refused, mut stricter) = (0, 0, Vec::new());
    for (index, case) in cases.iter().enumerate() {
        let path = format!("/case/{index}");
        let run = async {
            let ours = ours(addr, &case.method, &path).await;
            let hypers = hypers(addr, &case.method, &path).await;
            (ours, hypers)
        };
        let (ours, hypers) = tokio::time::timeout(EXCHANGE_LIMIT * 2, run)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "case {index} hung: {:?}",
                    String::from_utf8_lossy(&case.answer)
                )
            });
        let agrees = match (&ours, &hypers, case.expect) {
            (Outcome::Refused(_), Outcome::Refused(_), Same) => {
                refused += 1;
                true
            }
            (Outcome::Accepted { .. }, Outcome::Accepted { .. }, Same) => {
                accepted += 1;
                ours == hypers
            }
            (Outcome::Refused(_), Outcome::Accepted { .. }, Stricter(reason)) => {
                stricter.push(format!("case {index}: {reason}"));
                true
            }
            _ => false,
        };
        if !agrees {
            failures.push(format!(
                "case {index} ({} {:?}), expected {:?}:\n  ours:  {ours:?}\n  hyper: {hypers:?}",
                case.method,
                String::from_utf8_lossy(&case.answer),
                case.expect
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!(
        "{accepted} accepted by both, {refused} refused by both, {} refused only by the gateway:\n{}",
        stricter.len(),
        stricter.join("\n")
    );
    // The table exercises both sides of the line.
    assert!(accepted >= 30 && refused >= 30, "{accepted} / {refused}");
}
