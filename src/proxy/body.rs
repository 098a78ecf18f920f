//! Body types of the gateway: what goes upstream ([`RequestBody`]) and what goes
//! back to the client ([`ResponseBody`]).
//!
//! Both stream: nothing is buffered beyond what hyper hands over. They are enums
//! rather than boxed trait objects so the allowed path allocates no box per
//! request. A [`ResponseBody`] carries the request's [`Completion`]; dropping the
//! body (the last byte sent, or the client gone) is the moment a request ends,
//! which releases concurrency slots and marks the connection idle.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::time::Sleep;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use http_body::{Body, Frame, SizeHint};

use crate::http1::client::UpstreamBody;
use crate::http1::client::exchange::OutgoingBody;
// The server side's request body, named here beside the bodies it becomes.
use crate::access_log::PendingLine;
use crate::admission::tokens::TokenBill;
pub(crate) use crate::http1::server::ClientBody;
use crate::http1::server::ConnActivity;
use crate::limit::Permits;
use crate::llm::usage::UsageScanner;
use crate::metrics::DurationHistogram;

/// The error a request body yields when it outgrows the route's `max_body`.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {limit} bytes")]
pub(crate) struct BodyTooLarge {
    pub(crate) limit: u64,
}

/// The error a request body yields when reading the client's body failed:
/// a malformed chunked body, a client that hung up mid-body. The client's
/// fault, not the upstream's: the handler answers 400 (if it still can) and
/// does not count an upstream error; the upstream connection, mid-message,
/// is dropped with the failed exchange.
/// A client that stops sending its body mid-way (`Stalled`) is answered
/// 408 the same way.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientBodyError {
    #[error("the client's request body could not be read")]
    Read(#[source] hyper::Error),
    #[error("the client sent no body bytes within body_read_timeout ({0:?})")]
    Stalled(Duration),
}

impl ClientBodyError {
    /// The client-body failure behind `error` (as the upstream client
    /// reports a failed exchange), if that is what it was.
    pub(crate) fn of(error: &std::io::Error) -> Option<&ClientBodyError> {
        // Directly inside (the HTTP/1.1 client), or a source of what is
        // (hyper's HTTP/2 client wraps it).
        let inner = error
            .get_ref()
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        std::iter::successors(inner, |error| error.source())
            .find_map(|error| error.downcast_ref::<ClientBodyError>())
    }
}

/// The stall guard of a streamed client body: past `timeout` without a
/// byte, the body fails with [`ClientBodyError::Stalled`]. The timer is
/// made the first time the body has to wait (a body that is all there
/// never needs one) and reset after each wait that brought bytes.
#[derive(Debug)]
pub(crate) struct Stall {
    timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    progressed: bool,
}

impl Stall {
    pub(crate) fn new(timeout: Duration) -> Stall {
        Stall {
            timeout,
            timer: None,
            progressed: false,
        }
    }

    /// Called when the body is `Pending`: `Ready` once it has stalled.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let timeout = self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if std::mem::take(&mut self.progressed) {
            timer.as_mut().reset(tokio::time::Instant::now() + timeout);
        }
        timer.as_mut().poll(cx)
    }
}

/// A request body on its way upstream.
#[derive(Debug)]
pub(crate) enum RequestBody {
    /// The client's body, streamed, optionally capped. `replay` holds bytes
    /// already read from it (for a `body:FIELD` key), sent first.
    Streaming {
        replay: Option<Bytes>,
        inner: ClientBody,
        cap: Option<BodyCap>,
        stall: Stall,
    },
    /// A body already in memory (buffered for a `body:FIELD` key).
    Buffered(Option<Bytes>),
}

/// Sent again on another connection only when in memory.
impl OutgoingBody for RequestBody {
    fn take_buffered(&mut self) -> Option<Option<Bytes>> {
        match self {
            RequestBody::Buffered(bytes) => Some(bytes.take()),
            RequestBody::Streaming { .. } => None,
        }
    }
}

/// Counts a streamed body against `max_body` and flags an overflow so the
/// handler can answer 413 instead of 502.
#[derive(Debug)]
pub(crate) struct BodyCap {
    pub(crate) limit: u64,
    pub(crate) seen: u64,
    pub(crate) exceeded: Arc<AtomicBool>,
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            RequestBody::Buffered(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            RequestBody::Streaming {
                replay,
                inner,
                cap,
                stall,
            } => {
                if let Some(bytes) = replay.take() {
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                let frame = match Pin::new(inner).poll_frame(cx) {
                    Poll::Pending => {
                        return match stall.poll_stalled(cx) {
                            Poll::Pending => Poll::Pending,
                            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(
                                ClientBodyError::Stalled(stall.timeout),
                            )))),
                        };
                    }
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Some(Err(Box::new(ClientBodyError::Read(e)))));
                    }
                    Poll::Ready(Some(Ok(frame))) => frame,
                };
                stall.progressed = true;
                if let (Some(cap), Some(data)) = (cap.as_mut(), frame.data_ref()) {
                    cap.seen = cap.seen.saturating_add(data.len() as u64);
                    if cap.seen > cap.limit {
                        cap.exceeded.store(true, Ordering::Relaxed);
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge { limit: cap.limit }))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Buffered(bytes) => bytes.is_none(),
            RequestBody::Streaming { replay, inner, .. } => {
                replay.is_none() && inner.is_end_stream()
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Buffered(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            RequestBody::Buffered(None) => SizeHint::with_exact(0),
            RequestBody::Streaming {
                replay: None,
                inner,
                ..
            } => inner.size_hint(),
            RequestBody::Streaming {
                replay: Some(bytes),
                inner,
                ..
            } => {
                // The client's declared length still describes the whole body.
                let rest = inner.size_hint();
                let already = bytes.len() as u64;
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(already));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(already));
                }
                hint
            }
        }
    }
}

/// What happens when a request ends (its response body finished or dropped).
#[derive(Debug, Default)]
pub(crate) struct Completion {
    /// The connection the request came on, told that it is idle again.
    pub(crate) connection: Option<Arc<ConnActivity>>,
    /// Concurrency slots of the request, released by being dropped.
    #[expect(dead_code, reason = "held, never read: dropping it is the release")]
    pub(crate) permits: Permits,
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(connection) = &self.connection {
            connection.request_finished();
        }
    }
}

/// The request-duration observation and access-log line of a response
/// whose body is still arriving from the upstream: made when the body is
/// dropped (its last byte sent, or the client gone), so both hold the
/// request's whole time, not just the time to its head.
#[derive(Debug)]
pub(crate) struct BodyTiming {
    histogram: DurationHistogram,
    /// From the request's arrival to its response head.
    to_head: Duration,
    /// When the head was ready.
    head_at: Instant,
    /// `None` when the access log is off, or the line was not to be written.
    line: Option<PendingLine>,
}

impl BodyTiming {
    pub(crate) fn new(histogram: DurationHistogram, to_head: Duration) -> BodyTiming {
        BodyTiming {
            histogram,
            to_head,
            head_at: Instant::now(),
            line: None,
        }
    }

    /// Writes `line` when the body ends, with the whole duration.
    pub(crate) fn log_at_end(&mut self, line: PendingLine) {
        self.line = Some(line);
    }
}

impl Drop for BodyTiming {
    fn drop(&mut self) {
        let elapsed = self.to_head + self.head_at.elapsed();
        self.histogram.observe(elapsed);
        if let Some(line) = &self.line {
            line.log(elapsed);
        }
    }
}

/// A response body on its way to the client.
#[derive(Debug)]
pub(crate) struct ResponseBody {
    kind: ResponseKind,
    /// Dropped with the body: the end of the request.
    _completion: Completion,
}

#[derive(Debug)]
enum ResponseKind {
    Full(Option<Bytes>),
    /// The upstream's body, read from its connection as it is polled.
    Upstream(UpstreamBody),
    /// The upstream's body, its bytes scanned for the tokens it reports
    /// as they go by (a token route's response), settled when it ends.
    /// The meter first: fields drop in order, and the settlement must be
    /// in before the body's timing writes the log line that shows it.
    Metered(Box<UsageMeter>, UpstreamBody),
}

/// A token route's response being relayed: what reads its usage and the
/// bill to settle when the body ends or is dropped (the client gone:
/// whatever usage had arrived by then counts).
#[derive(Debug)]
pub(crate) struct UsageMeter {
    reader: UsageReader,
    bill: Option<TokenBill>,
}

/// Where a metered body's usage comes from.
#[derive(Debug)]
enum UsageReader {
    /// Its bytes, scanned as they go by (`None` once finished).
    Scanner(Option<UsageScanner>),
    /// A trailer field (`usage = "header:NAME"` when the head had none),
    /// taken out of the trailers as they go by; `count` is what it said.
    Trailer {
        name: HeaderName,
        count: Option<u64>,
    },
}

impl Drop for UsageMeter {
    fn drop(&mut self) {
        if let Some(bill) = self.bill.take() {
            let used = match &mut self.reader {
                UsageReader::Scanner(scanner) => scanner
                    .take()
                    .and_then(UsageScanner::finish)
                    .map(|usage| usage.total),
                UsageReader::Trailer { count, .. } => *count,
            };
            bill.settle(used);
        }
    }
}

impl ResponseBody {
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        ResponseBody {
            kind: ResponseKind::Full((!bytes.is_empty()).then_some(bytes)),
            _completion: Completion::default(),
        }
    }

    pub(crate) fn upstream(body: UpstreamBody) -> Self {
        ResponseBody {
            kind: ResponseKind::Upstream(body),
            _completion: Completion::default(),
        }
    }

    /// Some of the body is still to come from the upstream.
    pub(crate) fn still_arriving(&self) -> bool {
        match &self.kind {
            ResponseKind::Upstream(body) | ResponseKind::Metered(_, body) => body.still_arriving(),
            ResponseKind::Full(_) => false,
        }
    }

    /// The body with its bytes fed to `scanner` as they go by, and `bill`
    /// settled on the usage found when it ends. A body the gateway made
    /// itself reports no usage: `bill` stands as reserved.
    pub(crate) fn metered(self, scanner: UsageScanner, bill: TokenBill) -> Self {
        self.metered_by(UsageReader::Scanner(Some(scanner)), bill)
    }

    /// The body with `bill` settled, when it ends, on the count its
    /// trailer field `name` reports. The field is the gateway's: it is
    /// taken out of the trailers relayed (an HTTP/1.1 upstream's are never
    /// relayed; an HTTP/2 one's other fields go on as before).
    pub(crate) fn metered_by_trailer(self, name: HeaderName, bill: TokenBill) -> Self {
        self.metered_by(UsageReader::Trailer { name, count: None }, bill)
    }

    fn metered_by(self, reader: UsageReader, bill: TokenBill) -> Self {
        let ResponseBody { kind, _completion } = self;
        let kind = match kind {
            ResponseKind::Upstream(mut body) => {
                if let UsageReader::Trailer { name, .. } = &reader {
                    body.keep_trailer(name.clone());
                }
                ResponseKind::Metered(
                    Box::new(UsageMeter {
                        reader,
                        bill: Some(bill),
                    }),
                    body,
                )
            }
            other => other,
        };
        ResponseBody { kind, _completion }
    }

    /// Attaches what must happen when the response ends: `completion`, and
    /// `timing`, observed when the body is dropped.
    pub(crate) fn with_completion(
        mut self,
        completion: Completion,
        timing: Option<BodyTiming>,
    ) -> Self {
        if let Some(timing) = timing {
            self.time_until_end(timing);
        }
        self._completion = completion;
        self
    }

    #[cold]
    #[inline(never)]
    fn time_until_end(&mut self, timing: BodyTiming) {
        match &mut self.kind {
            ResponseKind::Upstream(body) | ResponseKind::Metered(_, body) => {
                body.keep_until_end(Box::new(timing))
            }
            // Not an upstream body: its end is now (`timing` dropped here).
            ResponseKind::Full(_) => {}
        }
    }
}

/// A token route's body: polled as any upstream body, its data fed to the
/// usage scanner. Out of line: the other bodies' poll stays as small as it
/// was (callgrind: +52 instructions a request with this arm inline).
#[inline(never)]
fn poll_metered(
    meter: &mut UsageMeter,
    body: &mut UpstreamBody,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
    loop {
        let polled = Pin::new(&mut *body).poll_frame(cx);
        let Poll::Ready(Some(Ok(frame))) = polled else {
            return polled;
        };
        match &mut meter.reader {
            UsageReader::Scanner(scanner) => {
                if let (Some(scanner), Some(data)) = (scanner, frame.data_ref()) {
                    scanner.feed(data);
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            UsageReader::Trailer { name, count } => {
                let mut trailers = match frame.into_trailers() {
                    Ok(trailers) => trailers,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                };
                *count = trailer_count(&trailers, name);
                trailers.remove(&*name);
                if !trailers.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                // Nothing else in them: on to the body's end.
            }
        }
    }
}

/// The count trailer field `name` reports: one field holding a whole
/// number. Two of them disagree or repeat, and say nothing certain.
fn trailer_count(trailers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let mut values = trailers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => crate::admission::reported_count(value.as_bytes()),
        _ => None,
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut self.get_mut().kind {
            ResponseKind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ResponseKind::Upstream(body) => Pin::new(body).poll_frame(cx),
            ResponseKind::Metered(meter, body) => poll_metered(meter, body, cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Full(bytes) => bytes.is_none(),
            ResponseKind::Upstream(body) | ResponseKind::Metered(_, body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            ResponseKind::Full(None) => SizeHint::with_exact(0),
            ResponseKind::Upstream(body) | ResponseKind::Metered(_, body) => body.size_hint(),
        }
    }
}
