//! The HTTP/1.1 fast path (`tollgate::http1::server`) on real sockets.
//!
//! First, differentially against hyper: the same responses are served by
//! `h1::serve` on one listener and by hyper's `http1` server on another, the
//! same raw request bytes go to both, and the raw answers (the `date` value
//! blanked) must be byte for byte the same — the fast path's promise is that
//! a client cannot tell which one answered. Then end to end through the
//! gateway in process: hand-off to hyper in the middle of a connection,
//! pipelining, `Expect`, `Connection: close`, `HEAD`, slow and large heads,
//! and malformed ones.

mod common;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::{InProcess, TestUpstream, raw};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::http1::server::{self as h1, Closing, Ended, Rewind};

/// Every exchange ends well before this; it only turns a hang into a failure.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(5);

/// How long a response with no framing (read until close) may stay silent
/// before it is taken as ended. Only a response that is wrong in some other
/// way gets here: both servers frame every answer in the tables.
const SILENCE: Duration = Duration::from_millis(300);

/// A body whose one chunk's size line, `10`, has no hex letters.
const SIXTEEN: &[u8] = b"0123456789abcdef";

/// 512 bytes: many of them make a body longer than the fast path's write
/// batch, in chunks whose size line (`200`) has no hex letters.
static BLOCK: [u8; 512] = [b'z'; 512];

/// A body longer than one write.
static LARGE: [u8; 100 * 1024] = [b'L'; 100 * 1024];

/// A `date` value the tables set themselves: kept, not blanked.
const FIXED_DATE: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

// ---------------------------------------------------------------------------
// Responses both servers give.

/// The fast path's connection never drains in these tests.
struct Never;

impl Closing for Never {
    fn is_closing(&self) -> bool {
        false
    }
}

/// A response body with a chosen length hint and frames. Between frames it
/// returns `Pending` once (waking itself at once), so a streamed body is
/// really written in pieces rather than gathered whole.
struct TestBody {
    chunks: VecDeque<Bytes>,
    /// `Some(n)`: `size_hint` is exactly n. `None`: unknown.
    exact: Option<u64>,
    /// `is_end_stream` is true when no chunks are left (as `Empty`/`Full`);
    /// false for a stream that only finds out it ended when polled.
    knows_end: bool,
    /// Sent after the data, if any.
    trailers: Option<http::HeaderMap>,
    yielded: bool,
}

impl TestBody {
    fn new(shape: &Shape) -> TestBody {
        let (chunks, exact, knows_end): (Vec<&[u8]>, Option<u64>, bool) = match shape {
            Shape::Empty => (vec![], Some(0), true),
            Shape::Full(bytes) => (vec![bytes], Some(bytes.len() as u64), true),
            Shape::Sized(chunks) => (
                chunks.clone(),
                Some(chunks.iter().map(|c| c.len() as u64).sum()),
                true,
            ),
            Shape::Stream(chunks) | Shape::WithTrailers(chunks) => (chunks.clone(), None, false),
        };
        let trailers = matches!(shape, Shape::WithTrailers(_)).then(|| {
            let mut map = http::HeaderMap::new();
            map.insert("x-checksum", HeaderValue::from_static("1"));
            map
        });
        TestBody {
            chunks: chunks
                .into_iter()
                .filter(|c| !c.is_empty())
                .map(Bytes::copy_from_slice)
                .collect(),
            exact,
            knows_end,
            trailers,
            yielded: false,
        }
    }
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if !this.yielded {
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.yielded = false;
        if let Some(chunk) = this.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.knows_end && self.chunks.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// A response body in the tables.
#[derive(Debug, Clone)]
enum Shape {
    /// Ended before the head is written.
    Empty,
    /// One frame, its length known.
    Full(&'static [u8]),
    /// Several frames, their total known.
    Sized(Vec<&'static [u8]>),
    /// Several frames, no length until the end.
    Stream(Vec<&'static [u8]>),
    /// As `Stream`, then a trailers frame (`x-checksum: 1`).
    WithTrailers(Vec<&'static [u8]>),
}

/// One row of the response table.
#[derive(Debug, Clone)]
struct Case {
    status: u16,
    fields: Vec<(&'static str, &'static str)>,
    body: Shape,
}

fn case(status: u16, fields: &[(&'static str, &'static str)], body: Shape) -> Case {
    Case {
        status,
        fields: fields.to_vec(),
        body,
    }
}

/// The responses compared with hyper's. Streamed chunks are below 10 bytes
/// or a multiple of 16 so their size lines have no hex letters: the letter
/// case is [`streamed_chunk_sizes_match_hyper`]'s, kept apart so a mismatch
/// there does not hide the rest.
fn cases() -> Vec<Case> {
    use Shape::*;
    let hello: &[u8] = b"hello world";
    let stream = || Stream(vec![b"hello", b" ", b"streamed", b"0123456789abcdef"]);
    vec![
        case(200, &[], Empty),
        case(200, &[], Full(hello)),
        case(201, &[("location", "/things/1")], Full(hello)),
        case(204, &[], Empty),
        // A body on 204 is not sent (and not framed).
        case(204, &[], Full(hello)),
        case(304, &[("etag", "\"v1\"")], Empty),
        // 304 keeps a length field: it describes the representation.
        case(304, &[("content-length", "11")], Full(hello)),
        case(404, &[("content-type", "text/plain")], Full(b"not found")),
        case(500, &[], Empty),
        case(599, &[], Full(b"odd")),
        case(200, &[], stream()),
        case(201, &[], stream()),
        case(404, &[], stream()),
        case(204, &[], stream()),
        // A stream that turns out to be empty: chunked with no chunks.
        case(200, &[], Stream(vec![])),
        case(200, &[], Sized(vec![b"hello", b" ", b"world"])),
        case(
            200,
            &[
                ("x-multi", "a"),
                ("set-cookie", "a=1"),
                ("x-multi", "b"),
                ("set-cookie", "b=2"),
                ("x-multi", "c"),
            ],
            Full(hello),
        ),
        case(200, &[("connection", "close")], Full(hello)),
        case(200, &[("connection", "close")], stream()),
        case(200, &[("connection", "keep-alive")], Full(hello)),
        case(
            200,
            &[("connection", "x-hop"), ("connection", "close")],
            Empty,
        ),
        case(200, &[("content-length", "11")], Full(hello)),
        case(200, &[("content-length", "0")], Empty),
        // The field frames a body that does not know its length.
        case(200, &[("content-length", "30")], stream()),
        case(200, &[("date", FIXED_DATE)], Full(hello)),
        case(200, &[("transfer-encoding", "chunked")], stream()),
        case(200, &[("transfer-encoding", "chunked")], Full(SIXTEEN)),
        case(200, &[("transfer-encoding", "chunked")], Empty),
        case(200, &[("trailer", "x-checksum")], stream()),
        // Trailers the client did not ask for (no `TE: trailers`): dropped.
        case(
            200,
            &[("trailer", "x-checksum")],
            WithTrailers(vec![b"data", b"more"]),
        ),
        case(200, &[], WithTrailers(vec![b"data"])),
        case(200, &[], WithTrailers(vec![])),
        // Longer than the fast path's 16 KiB write batch.
        case(200, &[], Stream(vec![&BLOCK; 80])),
        case(200, &[], Full(&LARGE)),
        case(
            200,
            &[],
            Sized(vec![&LARGE[..40 * 1024], &LARGE[..60 * 1024]]),
        ),
        case(
            200,
            &[
                ("content-type", "application/json"),
                ("cache-control", "no-store"),
            ],
            Full(b"{\"a\":1}"),
        ),
        // Neither writes this head: the connection closes unanswered.
        case(
            200,
            &[("content-length", "5"), ("content-length", "6")],
            stream(),
        ),
        // A response cannot be informational: an empty 500, then close.
        case(103, &[("link", "</style.css>; rel=preload")], Full(hello)),
    ]
}

// Rows the tests below name (the first rows of `cases` keep their places;
// `rows_named_by_index_are_those_rows` checks it).
const ROW_OK_EMPTY: usize = 0;
const ROW_OK_FULL: usize = 1;
const ROW_CREATED: usize = 2;
const ROW_NO_CONTENT: usize = 3;
const ROW_STREAM: usize = 10;
const ROW_MULTI: usize = 16;
const ROW_CLOSE: usize = 17;

#[test]
fn rows_named_by_index_are_those_rows() {
    let table = cases();
    let is = |n: usize, status: u16, fields: usize, body: &str| {
        let row = &table[n];
        assert_eq!(row.status, status, "row {n}: {row:?}");
        assert_eq!(row.fields.len(), fields, "row {n}: {row:?}");
        assert!(
            format!("{:?}", row.body).starts_with(body),
            "row {n}: {row:?}"
        );
    };
    is(ROW_OK_EMPTY, 200, 0, "Empty");
    is(ROW_OK_FULL, 200, 0, "Full");
    is(ROW_CREATED, 201, 1, "Full");
    is(ROW_NO_CONTENT, 204, 0, "Empty");
    is(ROW_STREAM, 200, 0, "Stream");
    is(ROW_MULTI, 200, 5, "Full");
    is(ROW_CLOSE, 200, 1, "Full");
    assert_eq!(table[ROW_CLOSE].fields, [("connection", "close")]);
}

/// Builds the response for a request, the same for both servers. `/case/N`
/// is row N of `table`; anything else is a small 200. A request body is
/// echoed in `x-request-body`, so both servers are seen to pass it on.
async fn answer<B>(request: Request<B>, table: &[Case]) -> Response<TestBody>
where
    B: Body,
    B::Error: std::fmt::Debug,
{
    let path = request.uri().path().to_owned();
    let received = request
        .into_body()
        .collect()
        .await
        .expect("request body")
        .to_bytes();
    let row = path
        .strip_prefix("/case/")
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| table.get(n));
    let row = row
        .cloned()
        .unwrap_or_else(|| case(200, &[], Shape::Full(b"other")));
    let mut response = Response::new(TestBody::new(&row.body));
    *response.status_mut() = StatusCode::from_u16(row.status).unwrap();
    for (name, value) in &row.fields {
        response.headers_mut().append(*name, value.parse().unwrap());
    }
    if !received.is_empty() {
        response.headers_mut().insert(
            "x-request-body",
            HeaderValue::from_bytes(&received).unwrap(),
        );
    }
    response
}

/// The two servers of a differential test.
struct Pair {
    fast: SocketAddr,
    hyper: SocketAddr,
    /// Requests the fast path gave to hyper: none of the tables' should be.
    hand_offs: Arc<AtomicUsize>,
}

impl Pair {
    async fn start(table: Vec<Case>) -> Pair {
        let table = Arc::new(table);
        let hand_offs = Arc::new(AtomicUsize::new(0));
        let fast = serve_fast(table.clone(), hand_offs.clone()).await;
        let hyper = serve_hyper(table).await;
        Pair {
            fast,
            hyper,
            hand_offs,
        }
    }

    fn assert_no_hand_offs(&self) {
        assert_eq!(
            self.hand_offs.load(Ordering::Relaxed),
            0,
            "the fast path handed plain requests to hyper: the comparison \
             would be hyper against hyper"
        );
    }
}

/// `h1::serve` on each connection, then hyper on what it hands over (as the
/// gateway's `serve_connection` does).
async fn serve_fast(table: Arc<Vec<Case>>, hand_offs: Arc<AtomicUsize>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (table, hand_offs) = (table.clone(), hand_offs.clone());
            tokio::spawn(async move {
                let respond = |request| {
                    let table = table.clone();
                    // No field lines of the gateway's own: the table's
                    // responses carry all their fields in the map.
                    async move { (answer(request, &table).await, ()) }
                };
                let prefix = match h1::serve(&mut stream, &Never, 64 * 1024, respond).await {
                    Ok(Ended::HandOff(prefix)) => prefix,
                    Ok(Ended::Closed) | Err(_) => return,
                };
                hand_offs.fetch_add(1, Ordering::Relaxed);
                let service = service_fn(move |request| {
                    let table = table.clone();
                    async move { Ok::<_, Infallible>(answer(request, &table).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(Rewind::new(prefix, stream)), service)
                    .await;
            });
        }
    });
    addr
}

/// hyper's HTTP/1.1 server with its defaults.
async fn serve_hyper(table: Arc<Vec<Case>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let table = table.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let table = table.clone();
                    async move { Ok::<_, Infallible>(answer(request, &table).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

// ---------------------------------------------------------------------------
// A raw client that reads one response at a time by its framing.

/// One response as it came off the wire.
#[derive(Debug)]
struct Answer {
    /// Every byte of it, as sent.
    raw: Vec<u8>,
    /// 0 when no complete head arrived.
    status: u16,
    headers: Vec<(String, String)>,
    /// The body with chunked framing removed.
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
}

struct Client {
    stream: TcpStream,
    /// Read and not yet part of an answer.
    buffer: Vec<u8>,
    /// The server closed (or reset) the connection.
    ended: bool,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buffer: Vec::new(),
            ended: false,
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        // A server that closed may refuse the write; what it answered before
        // is still read, and the transcript shows the difference.
        let _ = self.stream.write_all(bytes).await;
    }

    /// Reads more; false at the end of the stream. A reset counts as the end:
    /// a server that closes with a request unread resets the connection.
    async fn fill(&mut self, silence: Option<Duration>) -> bool {
        if self.ended {
            return false;
        }
        let mut chunk = [0u8; 8192];
        let read = match silence {
            Some(limit) => match tokio::time::timeout(limit, self.stream.read(&mut chunk)).await {
                Ok(read) => read,
                Err(_) => return false,
            },
            None => self.stream.read(&mut chunk).await,
        };
        match read {
            Ok(0) | Err(_) => {
                self.ended = true;
                false
            }
            Ok(n) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// At least `n` bytes buffered; false if the stream ended first.
    async fn fill_to(&mut self, n: usize) -> bool {
        while self.buffer.len() < n {
            if !self.fill(None).await {
                return false;
            }
        }
        true
    }

    /// The next response (an interim `100 Continue` is one too). For a
    /// response to `HEAD` pass `is_head`: its length fields describe a body
    /// that is not sent. If the stream ends early, what arrived is returned.
    async fn read_answer(&mut self, is_head: bool) -> Answer {
        let head_end = loop {
            if let Some(at) = find(&self.buffer, b"\r\n\r\n") {
                break at + 4;
            }
            if !self.fill(None).await {
                return self.take_partial();
            }
        };
        let mut slots = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut slots);
        let status = match parsed.parse(&self.buffer[..head_end]) {
            Ok(httparse::Status::Complete(_)) => parsed.code.unwrap_or(0),
            _ => return self.take_partial(),
        };
        let headers: Vec<(String, String)> = parsed
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        let get = |name: &str| {
            headers
                .iter()
                .filter(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let transfer_encoding = get("transfer-encoding");
        let content_length = get("content-length");
        let mut body = Vec::new();
        let end = if is_head || status < 200 || status == 204 || status == 304 {
            head_end
        } else if !transfer_encoding.is_empty() {
            let last = transfer_encoding.rsplit(',').next().unwrap_or("").trim();
            if last.eq_ignore_ascii_case("chunked") {
                match self.read_chunked(head_end, &mut body).await {
                    Some(end) => end,
                    None => return self.take_partial(),
                }
            } else {
                self.read_until_close(head_end, &mut body).await
            }
        } else if !content_length.is_empty() {
            let length: usize = content_length
                .split(',')
                .next()
                .unwrap()
                .trim()
                .parse()
                .expect("content-length");
            if !self.fill_to(head_end + length).await {
                return self.take_partial();
            }
            body.extend_from_slice(&self.buffer[head_end..head_end + length]);
            head_end + length
        } else {
            self.read_until_close(head_end, &mut body).await
        };
        let raw: Vec<u8> = self.buffer.drain(..end).collect();
        Answer {
            raw,
            status,
            headers,
            body,
        }
    }

    /// A chunked body starting at `at`; returns where the message ends.
    async fn read_chunked(&mut self, mut at: usize, body: &mut Vec<u8>) -> Option<usize> {
        loop {
            let line_end = loop {
                if let Some(i) = find(&self.buffer[at..], b"\r\n") {
                    break at + i;
                }
                if !self.fill(None).await {
                    return None;
                }
            };
            let line = String::from_utf8_lossy(&self.buffer[at..line_end]).into_owned();
            let size = line.split(';').next().unwrap().trim();
            let size = usize::from_str_radix(size, 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // Trailer fields, then the empty line.
                loop {
                    let end = loop {
                        if let Some(i) = find(&self.buffer[at..], b"\r\n") {
                            break at + i;
                        }
                        if !self.fill(None).await {
                            return None;
                        }
                    };
                    let empty = end == at;
                    at = end + 2;
                    if empty {
                        return Some(at);
                    }
                }
            }
            if !self.fill_to(at + size + 2).await {
                return None;
            }
            body.extend_from_slice(&self.buffer[at..at + size]);
            at += size + 2;
        }
    }

    async fn read_until_close(&mut self, at: usize, body: &mut Vec<u8>) -> usize {
        while self.fill(Some(SILENCE)).await {}
        body.extend_from_slice(&self.buffer[at..]);
        self.buffer.len()
    }

    fn take_partial(&mut self) -> Answer {
        Answer {
            raw: std::mem::take(&mut self.buffer),
            status: 0,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Whether the server closed the connection: reads until the end, which
    /// must come at once (the server shuts down right after its answer).
    async fn closed(&mut self) -> bool {
        while self.fill(None).await {}
        self.buffer.is_empty()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `raw` with the server-made `date` values replaced by `<date>`.
fn blank_dates(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split("\r\n").enumerate() {
        if i > 0 {
            out.push_str("\r\n");
        }
        match line.strip_prefix("date: ") {
            Some(value) if value != FIXED_DATE && httpdate::parse_http_date(value).is_ok() => {
                out.push_str("date: <date>");
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// What a client sees of one exchange: the answer to `request` and then to
/// a probe request on the same connection (empty if the server closed after
/// the first answer, which is part of what must match).
async fn transcript(addr: SocketAddr, request: &[u8], is_head: bool) -> String {
    let exchange = async {
        let mut client = Client::connect(addr).await;
        client.send(request).await;
        let first = client.read_answer(is_head).await;
        client
            .send(b"GET /probe HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            .await;
        let probe = client.read_answer(false).await;
        format!(
            "{}\n--- then ---\n{}",
            blank_dates(&first.raw),
            blank_dates(&probe.raw)
        )
    };
    tokio::time::timeout(EXCHANGE_LIMIT, exchange)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no answer in time to {:?}",
                String::from_utf8_lossy(request)
            )
        })
}

/// The raw request for a method; `close` adds `Connection: close`.
fn request_bytes(method: &str, path: &str, close: bool) -> Vec<u8> {
    let mut text = format!("{method} {path} HTTP/1.1\r\nhost: t\r\n");
    if close {
        text.push_str("connection: close\r\n");
    }
    if method == "POST" {
        text.push_str("content-type: text/plain\r\ncontent-length: 3\r\n\r\nabc");
    } else {
        text.push_str("\r\n");
    }
    text.into_bytes()
}

/// Every row of [`cases`] requested with `method`, with and without
/// `Connection: close`, from both servers; fails listing every difference.
async fn assert_table_matches_hyper(method: &str) {
    let table = cases();
    let pair = Pair::start(table.clone()).await;
    let mut differences = Vec::new();
    for (n, row) in table.iter().enumerate() {
        for close in [false, true] {
            let request = request_bytes(method, &format!("/case/{n}"), close);
            let is_head = method == "HEAD";
            let fast = transcript(pair.fast, &request, is_head).await;
            let hyper = transcript(pair.hyper, &request, is_head).await;
            if fast != hyper {
                differences.push(format!(
                    "{method} row {n} {row:?}, close={close}\n  fast path: {fast:?}\n  hyper:     {hyper:?}"
                ));
            }
        }
    }
    pair.assert_no_hand_offs();
    assert!(
        differences.is_empty(),
        "{} difference(s) from hyper:\n{}",
        differences.len(),
        differences.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Differential tests.

#[tokio::test]
async fn get_responses_match_hyper() {
    assert_table_matches_hyper("GET").await;
}

#[tokio::test]
async fn head_responses_match_hyper() {
    assert_table_matches_hyper("HEAD").await;
}

#[tokio::test]
async fn post_responses_match_hyper() {
    assert_table_matches_hyper("POST").await;
}

#[tokio::test]
async fn the_table_is_what_a_client_expects() {
    // The differential tests would pass if both servers were wrong the same
    // way, or both silent; spot-check that the bytes are the ones meant.
    let pair = Pair::start(cases()).await;
    let run = async {
        let mut client = Client::connect(pair.fast).await;
        client
            .send(format!("GET /case/{ROW_STREAM} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())
            .await;
        let streamed = client.read_answer(false).await;
        assert_eq!(streamed.status, 200, "{}", streamed.text());
        assert_eq!(streamed.header("transfer-encoding"), Some("chunked"));
        assert_eq!(streamed.body, b"hello streamed0123456789abcdef");
        client
            .send(
                format!(
                    "POST /case/{ROW_OK_FULL} HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabc"
                )
                .as_bytes(),
            )
            .await;
        let full = client.read_answer(false).await;
        assert_eq!(full.status, 200, "{}", full.text());
        assert_eq!(full.header("content-length"), Some("11"));
        assert_eq!(full.header("x-request-body"), Some("abc"));
        assert_eq!(full.body, b"hello world");
        assert!(full.header("date").is_some());
        client
            .send(
                format!(
                    "GET /case/{ROW_NO_CONTENT} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await;
        let no_content = client.read_answer(false).await;
        assert_eq!(no_content.status, 204, "{}", no_content.text());
        assert_eq!(no_content.header("connection"), Some("close"));
        assert!(client.closed().await, "the connection stayed open");
    };
    tokio::time::timeout(EXCHANGE_LIMIT, run)
        .await
        .expect("in time");
    pair.assert_no_hand_offs();
}

#[tokio::test]
async fn keep_alive_exchanges_match_hyper() {
    // Several requests on one connection, each read before the next is
    // sent: the state kept between requests (the reused field map, the
    // output buffer) must not leak into the next answer.
    let pair = Pair::start(cases()).await;
    let steps = [
        (
            format!("GET /case/{ROW_MULTI} HTTP/1.1\r\nhost: t\r\n\r\n"),
            false,
        ),
        (
            format!(
                "POST /case/{ROW_STREAM} HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nhello"
            ),
            false,
        ),
        (
            format!("HEAD /case/{ROW_OK_FULL} HTTP/1.1\r\nhost: t\r\n\r\n"),
            true,
        ),
        (
            format!("GET /case/{ROW_NO_CONTENT} HTTP/1.1\r\nhost: t\r\n\r\n"),
            false,
        ),
        (
            format!("GET /case/{ROW_OK_EMPTY} HTTP/1.1\r\nhost: t\r\n\r\n"),
            false,
        ),
    ];
    let mut transcripts = Vec::new();
    for addr in [pair.fast, pair.hyper] {
        let run = async {
            let mut client = Client::connect(addr).await;
            let mut text = String::new();
            for (request, is_head) in &steps {
                client.send(request.as_bytes()).await;
                let answer = client.read_answer(*is_head).await;
                text.push_str(&blank_dates(&answer.raw));
                text.push_str("\n---\n");
            }
            text
        };
        transcripts.push(
            tokio::time::timeout(EXCHANGE_LIMIT, run)
                .await
                .expect("in time"),
        );
    }
    assert_eq!(transcripts[0], transcripts[1], "fast path, then hyper");
    assert_eq!(transcripts[0].matches("HTTP/1.1 ").count(), steps.len());
    pair.assert_no_hand_offs();
}

#[tokio::test]
async fn pipelined_exchanges_match_hyper() {
    // Requests sent together: each answered in order, none lost in the
    // buffer between them.
    let pair = Pair::start(cases()).await;
    let together = format!(
        "GET /case/{ROW_OK_FULL} HTTP/1.1\r\nhost: t\r\n\r\n\
         POST /case/{ROW_STREAM} HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\nhi\
         HEAD /case/{ROW_CREATED} HTTP/1.1\r\nhost: t\r\n\r\n\
         GET /case/{ROW_CLOSE} HTTP/1.1\r\nhost: t\r\n\r\n\
         GET /case/{ROW_OK_EMPTY} HTTP/1.1\r\nhost: t\r\n\r\n"
    );
    let mut transcripts = Vec::new();
    for addr in [pair.fast, pair.hyper] {
        let run = async {
            let mut client = Client::connect(addr).await;
            client.send(together.as_bytes()).await;
            let mut text = String::new();
            // The fourth answer says `connection: close`: the fifth request
            // is not answered, by either.
            for is_head in [false, false, true, false] {
                text.push_str(&blank_dates(&client.read_answer(is_head).await.raw));
                text.push_str("\n---\n");
            }
            assert!(
                client.closed().await,
                "{addr}: open after connection: close"
            );
            text
        };
        transcripts.push(
            tokio::time::timeout(EXCHANGE_LIMIT, run)
                .await
                .expect("in time"),
        );
    }
    assert_eq!(transcripts[0], transcripts[1], "fast path, then hyper");
    assert_eq!(transcripts[0].matches("HTTP/1.1 ").count(), 4);
    pair.assert_no_hand_offs();
}

#[tokio::test]
async fn streamed_chunk_sizes_match_hyper() {
    // Chunk sizes with hex letters in them (10..=15, 0x1a, 0xff, 0xabc):
    // hyper writes them upper-case.
    let sizes: &[usize] = &[10, 11, 12, 13, 14, 15, 26, 255, 0xabc];
    static XS: [u8; 0xabc] = [b'x'; 0xabc];
    let chunks: Vec<&'static [u8]> = sizes.iter().map(|&n| &XS[..n]).collect();
    let pair = Pair::start(vec![case(200, &[], Shape::Stream(chunks))]).await;
    let request = request_bytes("GET", "/case/0", false);
    let fast = transcript(pair.fast, &request, false).await;
    let hyper = transcript(pair.hyper, &request, false).await;
    pair.assert_no_hand_offs();
    assert_eq!(fast, hyper, "fast path, then hyper");
}

#[tokio::test]
async fn transfer_encoding_without_chunked_matches_hyper() {
    // A response field `transfer-encoding: gzip` on a body of unknown
    // length: hyper chunks it and says so (`gzip, chunked`); a client reads
    // a body whose last coding is not chunked until the connection closes.
    let pair = Pair::start(vec![case(
        200,
        &[("transfer-encoding", "gzip")],
        Shape::Stream(vec![b"not", b"really", b"gzip"]),
    )])
    .await;
    let request = request_bytes("GET", "/case/0", false);
    let fast = transcript(pair.fast, &request, false).await;
    let hyper = transcript(pair.hyper, &request, false).await;
    pair.assert_no_hand_offs();
    assert_eq!(fast, hyper, "fast path, then hyper");
}

// ---------------------------------------------------------------------------
// Never more lenient than hyper: for every head both parsers see, a head
// hyper refuses is refused by the gateway too (its parse, and the gate's
// scanner that reads every request after a hand-off); the same for hosts,
// in `Host` and in an absolute-form target.

/// The requests the mutations start from: no body, a length, chunked,
/// HTTP/1.0.
const LENIENCY_BASES: [&[u8]; 4] = [
    b"GET /a?b=c HTTP/1.1\r\nHost: t\r\nX-Y: z\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx",
    b"POST /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1;e=v\r\nx\r\n0\r\nT: 1\r\n\r\n",
    b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
];

/// Bytes inserted or written over each position: the separators, the
/// line ends, controls, obs-text and a few token bytes.
const LENIENCY_BYTES: [u8; 16] = [
    0x00, 0x01, b'\t', b'\n', 0x0b, b'\r', b' ', b'"', b',', b':', b';', 0x7f, 0x80, 0xff, b'a',
    b'0',
];

/// Each base, and each with one byte inserted, replaced or deleted at every
/// position.
fn leniency_corpus() -> Vec<Vec<u8>> {
    let mut corpus = Vec::new();
    for base in LENIENCY_BASES {
        corpus.push(base.to_vec());
        for at in 0..base.len() {
            let mut deleted = base.to_vec();
            deleted.remove(at);
            corpus.push(deleted);
            for byte in LENIENCY_BYTES {
                let mut inserted = base.to_vec();
                inserted.insert(at, byte);
                corpus.push(inserted);
                let mut replaced = base.to_vec();
                replaced[at] = byte;
                corpus.push(replaced);
            }
        }
    }
    corpus.sort();
    corpus.dedup();
    corpus
}

/// Whether the gateway refuses `bytes` (what a client sends first on a
/// connection): `h1::parse` refuses it, or the gate's scanner does, at a
/// head or in a chunked body.
fn gateway_refuses(bytes: &[u8]) -> bool {
    let max_head = 64 * 1024;
    let mut buffer = bytes::BytesMut::from(bytes);
    if let h1::Parsed::Refused(_) = h1::parse(&mut buffer, &mut http::HeaderMap::new(), max_head) {
        return true;
    }
    let mut scanner = h1::gate::Scanner::new(max_head);
    let mut passed = 0;
    loop {
        match scanner.scan(&bytes[passed..]) {
            h1::gate::Step::Pass(n) => passed += n,
            h1::gate::Step::AwaitIdle => passed += scanner.release_upgrade(),
            h1::gate::Step::AwaitAnswer => scanner.answered(b"HTTP/1.1 404 Not Found\r\n"),
            h1::gate::Step::RefuseHead(_) | h1::gate::Step::RefuseBody(_) => return true,
            h1::gate::Step::More | h1::gate::Step::Tunnel => return false,
        }
    }
}

/// Whether hyper's server refuses `bytes`: it answers 4xx or 5xx itself
/// (every request it accepts is answered 200 by the table), or closes
/// without an answer. A request hyper waits on (a body it reads as longer)
/// is not refused.
async fn hyper_refuses(addr: SocketAddr, bytes: &[u8]) -> bool {
    let mut client = Client::connect(addr).await;
    client.send(bytes).await;
    match tokio::time::timeout(Duration::from_millis(300), client.read_answer(false)).await {
        Ok(answer) => answer.status >= 400 || (answer.status == 0 && client.ended),
        Err(_) => false,
    }
}

/// hyper's HTTP/1.1 server with its defaults, answering every request it
/// accepts `200 ok` once it has read the body (whatever the body's fate).
async fn serve_hyper_ok() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = service_fn(|request: Request<hyper::body::Incoming>| async move {
                    let _ = request.into_body().collect().await;
                    Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn the_gateway_refuses_every_head_hyper_refuses() {
    let hyper = serve_hyper_ok().await;
    let corpus = leniency_corpus();
    let mut more_lenient = Vec::new();
    let mut hyper_refused = 0;
    for bytes in &corpus {
        if hyper_refuses(hyper, bytes).await {
            hyper_refused += 1;
            if !gateway_refuses(bytes) {
                more_lenient.push(format!("{:?}", String::from_utf8_lossy(bytes)));
            }
        }
    }
    assert!(
        more_lenient.is_empty(),
        "{} of {} heads hyper refuses are accepted:\n{}",
        more_lenient.len(),
        hyper_refused,
        more_lenient.join("\n")
    );
    // The corpus is a real test: hyper refuses a good part of it.
    assert!(
        hyper_refused > corpus.len() / 4,
        "{hyper_refused} of {}",
        corpus.len()
    );
}

/// Host values the host corpus starts from: a name and port, an IPv6
/// literal and port, an IPv4 address.
const HOST_SEEDS: [&[u8]; 3] = [b"example.com:80", b"[::1]:8080", b"10.0.0.1"];

/// Bytes that matter to a host: the delimiters of an authority and a URI,
/// the ones pct-encoding and literals use, and [`LENIENCY_BYTES`].
const HOST_BYTES: [u8; 14] = [
    b'%', b'@', b'/', b'?', b'#', b'[', b']', b':', b'.', b'\\', b'v', b'9', b'x', b'=',
];

/// Each seed, and each with one byte inserted, replaced or deleted at
/// every position, and the classes of the host rule's table; each value as
/// the `Host` of an origin-form request and as the authority of an
/// absolute-form target (what hyper parses with `http::Uri`).
fn host_corpus() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = [
        &b""[..],
        b"a:",
        b"a:abc",
        b"a:65536",
        b"a:99999",
        b"::1",
        b"[::1",
        b"[v1.x]",
        b"ex%41mple.com",
        b"ex%4",
        b"a@b",
        b"a b",
        b"a..b",
        "b\u{fc}cher.example".as_bytes(),
    ]
    .iter()
    .map(|value| value.to_vec())
    .collect();
    for seed in HOST_SEEDS {
        values.push(seed.to_vec());
        for at in 0..=seed.len() {
            if at < seed.len() {
                let mut deleted = seed.to_vec();
                deleted.remove(at);
                values.push(deleted);
            }
            for &byte in HOST_BYTES.iter().chain(&LENIENCY_BYTES) {
                let mut inserted = seed.to_vec();
                inserted.insert(at, byte);
                values.push(inserted);
                if at < seed.len() {
                    let mut replaced = seed.to_vec();
                    replaced[at] = byte;
                    values.push(replaced);
                }
            }
        }
    }
    let mut corpus = Vec::new();
    for value in values {
        corpus.push([&b"GET / HTTP/1.1\r\nHost: "[..], &value, b"\r\n\r\n"].concat());
        corpus.push(
            [
                &b"GET http://"[..],
                &value,
                b"/ HTTP/1.1\r\nHost: t\r\n\r\n",
            ]
            .concat(),
        );
    }
    corpus.sort();
    corpus.dedup();
    corpus
}

#[tokio::test]
async fn the_gateway_refuses_every_host_hyper_refuses() {
    let hyper = serve_hyper_ok().await;
    let corpus = host_corpus();
    let mut more_lenient = Vec::new();
    let mut hyper_refused = 0;
    let mut only_gateway_refused = 0;
    for bytes in &corpus {
        let gateway = gateway_refuses(bytes);
        if hyper_refuses(hyper, bytes).await {
            hyper_refused += 1;
            if !gateway {
                more_lenient.push(format!("{:?}", String::from_utf8_lossy(bytes)));
            }
        } else if gateway {
            only_gateway_refused += 1;
        }
    }
    assert!(
        more_lenient.is_empty(),
        "{} of {} hosts hyper refuses are accepted:\n{}",
        more_lenient.len(),
        hyper_refused,
        more_lenient.join("\n")
    );
    // A real test: hyper refuses a good part (absolute-form targets it
    // cannot parse), and the host rule is stricter than hyper (which takes
    // any `Host` value httparse lets through, and `a:abc` in a target).
    assert!(
        hyper_refused > corpus.len() / 8,
        "{hyper_refused} of {}",
        corpus.len()
    );
    assert!(
        only_gateway_refused > corpus.len() / 8,
        "{only_gateway_refused} of {}",
        corpus.len()
    );
}

// ---------------------------------------------------------------------------
// End to end through the gateway.

fn gateway_config(upstream: &TestUpstream) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
max_header_bytes = "48KiB"

[upstreams.api]
url = "{url}"
timeout = "5s"
connect_timeout = "1s"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#,
        url = upstream.url()
    )
}

/// One request-response on `client`, in time.
async fn exchange(client: &mut Client, request: &[u8], is_head: bool) -> Answer {
    client.send(request).await;
    tokio::time::timeout(EXCHANGE_LIMIT, client.read_answer(is_head))
        .await
        .expect("an answer in time")
}

#[tokio::test]
async fn hand_off_mid_connection_then_hyper_serves_the_rest() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&gateway_config(&upstream)).await;
    let mut client = Client::connect(gateway.addr).await;

    let first = exchange(&mut client, b"GET /one HTTP/1.1\r\nhost: t\r\n\r\n", false).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.body, b"echo");

    // Chunked: not the fast path's; hyper takes the connection from here,
    // reading the head again from the bytes the fast path already read.
    let chunked = exchange(
        &mut client,
        b"POST /two HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n\
          5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(chunked.status, 200, "{}", chunked.text());
    assert_eq!(chunked.body, b"echo");
    let seen = upstream.last_seen();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.uri, "/two");
    assert_eq!(seen.body, "hello world");

    let third = exchange(
        &mut client,
        b"GET /three HTTP/1.1\r\nhost: t\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(third.status, 200, "{}", third.text());
    assert_eq!(third.body, b"echo");
    assert_eq!(upstream.last_seen().uri, "/three");
    assert_eq!(upstream.count(), 3);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&gateway_config(&upstream)).await;
    let mut client = Client::connect(gateway.addr).await;
    client
        .send(
            b"GET /cost/1 HTTP/1.1\r\nhost: t\r\n\r\n\
              GET /cost/2 HTTP/1.1\r\nhost: t\r\n\r\n",
        )
        .await;
    for expected in ["1", "2"] {
        let answer = tokio::time::timeout(EXCHANGE_LIMIT, client.read_answer(false))
            .await
            .expect("an answer in time");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-cost"), Some(expected), "{}", answer.text());
        assert_eq!(answer.body, b"echo");
    }
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn expect_continue_gets_100_then_the_response() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&gateway_config(&upstream)).await;
    let mut client = Client::connect(gateway.addr).await;
    // The body is held back until the 100 arrives, as a client that asks
    // for one does.
    let interim = exchange(
        &mut client,
        b"POST /upload HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(interim.status, 100, "{}", interim.text());
    assert_eq!(interim.raw, b"HTTP/1.1 100 Continue\r\n\r\n");
    let answer = exchange(&mut client, b"hello", false).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.body, b"echo");
    assert_eq!(upstream.last_seen().body, "hello");
    // The connection goes on (in hyper now).
    let next = exchange(
        &mut client,
        b"GET /after HTTP/1.1\r\nhost: t\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(next.status, 200, "{}", next.text());
}

#[tokio::test]
async fn connection_close_is_answered_and_the_connection_closed() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&gateway_config(&upstream)).await;
    let mut client = Client::connect(gateway.addr).await;
    let answer = exchange(
        &mut client,
        b"GET /bye HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("connection"), Some("close"));
    assert_eq!(answer.body, b"echo");
    let closed = tokio::time::timeout(EXCHANGE_LIMIT, client.closed())
        .await
        .expect("the server closed the connection");
    assert!(closed, "bytes after the last response");
}

#[tokio::test]
async fn head_gets_the_head_and_no_body() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&gateway_config(&upstream)).await;
    let mut client = Client::connect(gateway.addr).await;
    let answer = exchange(
        &mut client,
        b"HEAD /thing HTTP/1.1\r\nhost: t\r\n\r\n",
        true,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-upstream"), Some("yes"));
    // The upstream's length of the body a GET would get is relayed.
    assert_eq!(answer.header("content-length"), Some("4"));
    assert!(answer.raw.ends_with(b"\r\n\r\n"), "{}", answer.text());
    assert_eq!(upstream.last_seen().method, "HEAD");
    // No body follows the head: the next bytes are the next response.
    let next = exchange(&mut client, b"GET /next HTTP/1.1\r\nhost: t\r\n\r\n", false).await;
    assert!(next.raw.starts_with(b"HTTP/1.1 200 "), "{}", next.text());
    assert_eq!(next.body, b"echo");
}

// Paused time: each pause lasts until the gateway has read the part.
#[tokio::test(start_paused = true)]
async fn a_head_in_three_writes_is_served() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&gateway_config(&upstream)).await;
    let mut client = Client::connect(gateway.addr).await;
    // Each part a separate segment (no delay on the client): the fast path
    // sees a partial head twice before the whole.
    for part in [
        &b"GET /pie"[..],
        b"ces HTTP/1.1\r\nhost: t\r\nx-a:",
        b" 1\r\n\r\n",
    ] {
        client.send(part).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = common::within_wall_clock(EXCHANGE_LIMIT, client.read_answer(false))
        .await
        .expect("an answer in time");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.body, b"echo");
    let seen = upstream.last_seen();
    assert_eq!(seen.uri, "/pieces");
    assert_eq!(seen.header("x-a"), Some("1"));
}

#[tokio::test]
async fn a_large_head_is_served_and_one_over_the_limit_is_431() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&gateway_config(&upstream)).await;
    // Over the fast path's 16 KiB, under the configured 48 KiB: hyper takes
    // it and it is served.
    let big = "b".repeat(24 * 1024);
    let mut client = Client::connect(gateway.addr).await;
    let answer = exchange(
        &mut client,
        format!("GET /big HTTP/1.1\r\nhost: t\r\nx-big: {big}\r\n\r\n").as_bytes(),
        false,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.body, b"echo");
    assert_eq!(
        upstream.last_seen().header("x-big").map(str::len),
        Some(big.len())
    );
    // The connection goes on after it.
    let next = exchange(
        &mut client,
        b"GET /small HTTP/1.1\r\nhost: t\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(next.status, 200, "{}", next.text());
    let served = upstream.count();

    // Over 48 KiB (but within what hyper buffers): the gateway's 431, as
    // `tests/proxy.rs` expects it.
    let huge = "h".repeat(56 * 1024);
    let mut client = Client::connect(gateway.addr).await;
    let answer = exchange(
        &mut client,
        format!("GET /huge HTTP/1.1\r\nhost: t\r\nx-huge: {huge}\r\n\r\n").as_bytes(),
        false,
    )
    .await;
    assert_eq!(answer.status, 431, "{}", answer.text());
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(upstream.count(), served, "the upstream saw the huge head");
}

#[tokio::test]
async fn a_malformed_request_line_is_400_from_hyper() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&gateway_config(&upstream)).await;
    for bad in [
        &b"GET  /x HTTP/1.1\r\nhost: t\r\n\r\n"[..],
        b"GET /x HTTP/9.9\r\nhost: t\r\n\r\n",
        b"G\x01T /x HTTP/1.1\r\nhost: t\r\n\r\n",
    ] {
        let answer = raw(gateway.addr, bad, EXCHANGE_LIMIT).await;
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{:?}: {answer}",
            String::from_utf8_lossy(bad)
        );
    }
    // After a plain request on the same connection, too: the hand-off
    // carries the bad bytes to hyper, which refuses them.
    let mut client = Client::connect(gateway.addr).await;
    let first = exchange(&mut client, b"GET /ok HTTP/1.1\r\nhost: t\r\n\r\n", false).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let bad = exchange(&mut client, b"GET /x HTTP/1.1\r\nbad header\r\n\r\n", false).await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(upstream.count(), 1);
}

/// A gateway with short slow-head and idle limits and a route it answers
/// itself.
fn short_timeouts_config() -> String {
    r#"
[server]
listen = "127.0.0.1:0"
header_read_timeout = "300ms"
idle_timeout = "400ms"

[[routes]]
name = "health"
match = { path = "/health" }
respond = { status = 200, body = "ok\n" }
"#
    .to_owned()
}

/// Sends `count` pipelined requests in one write, reads every answer, sends
/// `then`, and says whether the gateway closed the connection within 4 s
/// (of paused time, in the tests that call it).
async fn closed_after_pipelined_burst(count: usize, then: &[u8]) -> bool {
    let gateway = InProcess::start(&short_timeouts_config()).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    let burst = b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n".repeat(count);
    stream.write_all(&burst).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let answers = |bytes: &[u8]| bytes.windows(12).filter(|w| w == b"HTTP/1.1 200").count();
    while answers(&seen) < count {
        let n = tokio::time::timeout(EXCHANGE_LIMIT, stream.read(&mut buf))
            .await
            .expect("answers in time")
            .unwrap();
        assert!(n > 0, "closed after {} answers", answers(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    stream.write_all(then).await.unwrap();
    tokio::time::timeout(Duration::from_secs(4), async {
        while stream.read(&mut buf).await.unwrap_or(0) > 0 {}
    })
    .await
    .is_ok()
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_pipelined_requests_does_not_escape_the_idle_timeout() {
    // 230 requests in one read use up the task's cooperative budget before
    // the watchdog's timer is first polled; it must still be armed.
    assert!(closed_after_pipelined_burst(1, b"").await, "one request");
    assert!(
        closed_after_pipelined_burst(230, b"").await,
        "idle connection never closed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_pipelined_requests_does_not_escape_the_head_timeout() {
    assert!(
        closed_after_pipelined_burst(230, b"GET /health HTTP/1.1\r\nhost").await,
        "slow head never cut"
    );
}

/// A flood of denied requests pipelined on one connection does not hold up
/// another connection: after a rate-limit denial the flooding connection
/// steps aside before each next request (`h1::serve`), so the other client's
/// answer comes after a few of the flood's answers, not after as many as one
/// poll of the flooding connection can write (about a hundred before).
#[tokio::test]
async fn a_connection_being_denied_steps_aside_for_the_others() {
    const FLOOD: usize = 400;
    let upstream = TestUpstream::start().await;
    let config = format!(
        "{}\n[limits.per_key]\nkey = \"header:x-api-key\"\nalgorithm = \"token_bucket\"\n\
         capacity = 1\nrefill = \"1/m\"\n",
        gateway_config(&upstream).replace(
            "upstream = \"api\"\n",
            "upstream = \"api\"\nlimits = [\"per_key\"]\n"
        )
    );
    let gateway = InProcess::start(&config).await;
    let flooding = b"GET /flood HTTP/1.1\r\nhost: t\r\nx-api-key: abuser\r\n\r\n";
    let mut flood = Client::connect(gateway.addr).await;
    // The abuser's one token, then its first denial.
    assert_eq!(exchange(&mut flood, flooding, false).await.status, 200);
    assert_eq!(exchange(&mut flood, flooding, false).await.status, 429);
    let mut legit = Client::connect(gateway.addr).await;
    // Both arrive before the gateway next runs: the flood first.
    flood.send(&flooding.repeat(FLOOD)).await;
    legit
        .send(b"GET /legit HTTP/1.1\r\nhost: t\r\nx-api-key: good\r\n\r\n")
        .await;
    let answer = tokio::time::timeout(EXCHANGE_LIMIT, legit.read_answer(false))
        .await
        .expect("an answer in time");
    assert_eq!(answer.status, 200, "{}", answer.text());
    // The flood's answers written by then (the gateway runs on this thread:
    // nothing more is written until the next await).
    let mut chunk = vec![0u8; 256 * 1024];
    while let Ok(n @ 1..) = flood.stream.try_read(&mut chunk) {
        flood.buffer.extend_from_slice(&chunk[..n]);
    }
    let answered = |buffer: &[u8]| {
        buffer
            .windows(b"HTTP/1.1 ".len())
            .filter(|w| *w == b"HTTP/1.1 ")
            .count()
    };
    let before = answered(&flood.buffer);
    assert!(
        before < FLOOD / 8,
        "{before} of the flood's {FLOOD} denials were written before the other client's answer"
    );
    // The flood is answered all the same, every request denied.
    for _ in 0..FLOOD {
        let denied = tokio::time::timeout(EXCHANGE_LIMIT, flood.read_answer(false))
            .await
            .expect("an answer in time");
        assert_eq!(denied.status, 429, "{}", denied.text());
    }
}
