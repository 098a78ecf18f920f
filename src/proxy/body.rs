//! What goes upstream: the client's body forwarded ([`RequestBody`]),
//! capped by the route's `max_body` and guarded against a client that
//! stalls. What goes back to the client is `answer::body`.
//!
//! It streams: nothing is buffered beyond what hyper hands over. An enum
//! rather than a boxed trait object, so the allowed path allocates no box
//! per request.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::http1::client::exchange::OutgoingBody;
// The server side's request body, named here beside the body it becomes.
pub(crate) use crate::http1::server::ClientBody;

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
