//! What goes back to the client: [`ResponseBody`], an answer's body from
//! whichever front wrote it (an upstream's relayed, a 429, a problem, a
//! decision's empty 200).
//!
//! It streams: nothing is buffered beyond what the upstream hands over. An
//! enum rather than a boxed trait object, so the allowed path allocates no
//! box per request. It carries the request's [`Completion`]; dropping the
//! body (the last byte sent, or the client gone) is the moment a request
//! ends, which releases concurrency slots and marks the connection idle.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use http_body::{Body, Frame, SizeHint};

use crate::access_log::PendingLine;
use crate::admission::tokens::TokenBill;
use crate::http1::client::UpstreamBody;
use crate::http1::server::ConnActivity;
use crate::limit::Permits;
use crate::llm::usage::UsageScanner;
use crate::metrics::DurationHistogram;
use crate::trace::PendingSpans;

/// What happens when a request ends (its response body finished or dropped).
#[derive(Debug)]
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
    /// A recorded request's spans (`[tracing]`): its server span ends
    /// with the body.
    trace: Option<PendingSpans>,
}

impl BodyTiming {
    /// Boxed from the start: the body keeps it boxed, and every request's
    /// future carries (and its handler returns) it as one pointer.
    pub(crate) fn new(histogram: DurationHistogram, to_head: Duration) -> Box<BodyTiming> {
        Box::new(BodyTiming {
            histogram,
            to_head,
            head_at: Instant::now(),
            line: None,
            trace: None,
        })
    }

    /// Ends the request's server span when the body ends.
    pub(crate) fn trace_at_end(&mut self, spans: PendingSpans) {
        self.trace = Some(spans);
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
        if let Some(trace) = self.trace.take() {
            trace.end_after(self.head_at.elapsed());
        }
    }
}

/// A response body on its way to the client.
#[derive(Debug)]
pub(crate) struct ResponseBody {
    kind: ResponseKind,
    /// Dropped with the body: the end of the request. `None` until
    /// [`ResponseBody::attach_completion`]: replacing an empty completion
    /// dropped it, ~26 instructions a request (`bench/instructions.sh`).
    _completion: Option<Completion>,
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
            match &mut self.reader {
                UsageReader::Scanner(scanner) => {
                    bill.settle_usage(scanner.take().and_then(UsageScanner::finish));
                }
                UsageReader::Trailer { count, .. } => bill.settle(*count),
            }
        }
    }
}

impl ResponseBody {
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        ResponseBody {
            kind: ResponseKind::Full((!bytes.is_empty()).then_some(bytes)),
            _completion: None,
        }
    }

    pub(crate) fn upstream(body: UpstreamBody) -> Self {
        ResponseBody {
            kind: ResponseKind::Upstream(body),
            _completion: None,
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

    /// The body with `bill` settled when it ends, on no usage: a bill
    /// that only carries a usage event (`usage_events = true` on a route
    /// without `tokens`), recorded with the request's whole duration.
    pub(crate) fn settled_at_end(self, bill: TokenBill) -> Self {
        self.metered_by(UsageReader::Scanner(None), bill)
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
    /// `timing`, observed when the body is dropped. In place: taking and
    /// returning the body, the caller's `Response::map` moved the whole
    /// response once more on every request.
    pub(crate) fn attach_completion(
        &mut self,
        completion: Completion,
        timing: Option<Box<BodyTiming>>,
    ) {
        if let Some(timing) = timing {
            self.time_until_end(timing);
        }
        self._completion = Some(completion);
    }

    #[cold]
    #[inline(never)]
    fn time_until_end(&mut self, timing: Box<BodyTiming>) {
        match &mut self.kind {
            ResponseKind::Upstream(body) | ResponseKind::Metered(_, body) => {
                body.keep_until_end(timing)
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
