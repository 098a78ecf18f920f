//! The upstream's response body, read from its connection by whoever polls
//! it — hyper's server dispatcher, in the task of the client's request.
//!
//! A body that had already arrived with the head is handed over as bytes and
//! its connection goes back to the pool at once. Otherwise the body owns the
//! connection while it streams and returns it the moment the last byte is
//! taken; a body dropped early (client gone) closes the connection, since it
//! is mid-message.

use std::fmt::Debug;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::Sleep;

use bytes::Bytes;
use http::HeaderName;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;

use super::chunked::{ChunkedDecoder, Decoded};
use super::conn::UpstreamConn;

/// Where a connection goes back when its response body has been read to the
/// end: the pool it came from. The body never names the pool, as pingora's
/// proxy gives a session back (`release_http_session`) and the session knows
/// nothing of the connector.
pub(crate) trait CheckIn: Send + Sync + Debug {
    /// Takes `conn` back after a complete response; `keep_alive`: the
    /// response let it carry another request.
    fn check_in(&self, conn: UpstreamConn, keep_alive: bool);

    /// The body failed after its head was relayed (the client's stream is
    /// cut): `error` is `InvalidData` when it broke HTTP/1.1, else the
    /// connection failed or closed early. The connection is not given back.
    fn body_failed(&self, error: &io::Error);

    /// The longest wait for the next bytes of a body: past it the body
    /// fails with `TimedOut` and its connection is dropped.
    fn read_timeout(&self) -> Duration;
}

/// What [`UpstreamBody::keep_until_end`] holds: anything, dropped with the
/// body.
pub(crate) trait EndGuard: Send + Sync + Debug {}

impl<T: Send + Sync + Debug> EndGuard for T {}

/// A boxed body with something dropped along with it
/// ([`UpstreamBody::keep_until_end`]).
struct Guarded {
    inner: UnsyncBoxBody<Bytes, io::Error>,
    _guard: Box<dyn EndGuard>,
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where a streamed body is.
#[derive(Debug)]
enum Remaining {
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
}

/// An upstream response body.
#[derive(Debug)]
pub struct UpstreamBody {
    kind: Kind,
}

/// Boxed where it is large and rare: a response travels by value through
/// several layers (handler, hyper), and the common case — a body that came
/// with its head — should not carry a connection's worth of bytes each time.
#[derive(Debug)]
enum Kind {
    /// All of it, or nothing left.
    Full(Option<Bytes>),
    Streaming(Box<Streaming>),
    /// A `101 Switching Protocols`: the connection, for the tunnel.
    Upgrade(Option<Box<UpstreamConn>>),
    /// Read by another client (an HTTP/2 upstream's stream).
    Boxed(UnsyncBoxBody<Bytes, io::Error>),
}

/// A body still arriving on its connection.
#[derive(Debug)]
struct Streaming {
    conn: Option<UpstreamConn>,
    pool: Arc<dyn CheckIn>,
    remaining: Remaining,
    keep_alive: bool,
    /// Armed the first time the body waits for bytes (a body that arrives
    /// with its head never needs one); reset after each wait that ended in
    /// bytes, so it measures the time since the last progress.
    stall: Option<Pin<Box<Sleep>>>,
    /// Bytes arrived since the stall timer was last set.
    progressed: bool,
    /// Dropped with the body ([`UpstreamBody::keep_until_end`]).
    until_end: Option<Box<dyn EndGuard>>,
}

fn stalled() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the upstream sent no body bytes within read_timeout",
    )
}

fn closed_early() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the upstream closed the connection before the end of the body",
    )
}

impl UpstreamBody {
    /// Some of it is still to come from the upstream (it did not all come
    /// with the head): the request ends when it has.
    pub(crate) fn still_arriving(&self) -> bool {
        match &self.kind {
            Kind::Streaming(streaming) => streaming.conn.is_some(),
            Kind::Boxed(body) => !body.is_end_stream(),
            Kind::Full(_) | Kind::Upgrade(_) => false,
        }
    }

    /// Keeps `guard` until the body is dropped (its last byte taken, or the
    /// client gone): what the end of a body still arriving must set off. A
    /// body already here drops it now.
    pub(crate) fn keep_until_end(&mut self, guard: Box<dyn EndGuard>) {
        match &mut self.kind {
            Kind::Streaming(streaming) => streaming.until_end = Some(guard),
            Kind::Boxed(body) => {
                let inner = std::mem::take(body);
                *body = UnsyncBoxBody::new(Guarded {
                    inner,
                    _guard: guard,
                });
            }
            Kind::Full(_) | Kind::Upgrade(_) => {}
        }
    }

    /// Hands the trailer fields named `name` on as the body's last frame
    /// (a trailers frame, after the data), for whoever reads it; other
    /// trailer fields stay dropped. Only a chunked body has trailers; an
    /// HTTP/2 stream's come as its frames anyway.
    pub fn keep_trailer(&mut self, name: HeaderName) {
        if let Kind::Streaming(streaming) = &mut self.kind
            && let Remaining::Chunked(decoder) = &mut streaming.remaining
        {
            decoder.keep_trailer(name);
        }
    }

    /// A body another client reads (`upstream::h2`), errors as `io::Error`s.
    pub(crate) fn boxed(body: UnsyncBoxBody<Bytes, io::Error>) -> UpstreamBody {
        UpstreamBody {
            kind: Kind::Boxed(body),
        }
    }

    pub(crate) fn full(bytes: Option<Bytes>) -> UpstreamBody {
        UpstreamBody {
            kind: Kind::Full(bytes.filter(|b| !b.is_empty())),
        }
    }

    /// A body of `length` bytes still to come (at least one: a body already
    /// read whole is a full one). The connection goes back at the last byte.
    pub(crate) fn length(
        conn: UpstreamConn,
        pool: Arc<dyn CheckIn>,
        length: u64,
        keep_alive: bool,
    ) -> UpstreamBody {
        debug_assert!(length > 0, "an empty body is not streamed");
        Self::streaming(conn, pool, Remaining::Length(length), keep_alive)
    }

    pub(crate) fn chunked(
        conn: UpstreamConn,
        pool: Arc<dyn CheckIn>,
        keep_alive: bool,
    ) -> UpstreamBody {
        Self::streaming(
            conn,
            pool,
            Remaining::Chunked(ChunkedDecoder::default()),
            keep_alive,
        )
    }

    pub(crate) fn until_close(conn: UpstreamConn, pool: Arc<dyn CheckIn>) -> UpstreamBody {
        Self::streaming(conn, pool, Remaining::UntilClose, false)
    }

    fn streaming(
        conn: UpstreamConn,
        pool: Arc<dyn CheckIn>,
        remaining: Remaining,
        keep_alive: bool,
    ) -> UpstreamBody {
        UpstreamBody {
            kind: Kind::Streaming(Box::new(Streaming {
                conn: Some(conn),
                pool,
                remaining,
                keep_alive,
                stall: None,
                progressed: false,
                until_end: None,
            })),
        }
    }

    pub(crate) fn upgrade(conn: UpstreamConn) -> UpstreamBody {
        UpstreamBody {
            kind: Kind::Upgrade(Some(Box::new(conn))),
        }
    }

    /// The connection of a `101` response, taken out for the tunnel.
    pub(crate) fn take_upgraded(&mut self) -> Option<UpstreamConn> {
        match &mut self.kind {
            Kind::Upgrade(conn) => conn.take().map(|conn| *conn),
            _ => None,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let (conn_slot, pool, remaining, keep_alive, stall, progressed) =
            match &mut self.get_mut().kind {
                Kind::Full(bytes) => return Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
                Kind::Upgrade(_) => return Poll::Ready(None),
                Kind::Boxed(body) => return Pin::new(body).poll_frame(cx),
                Kind::Streaming(streaming) => {
                    let Streaming {
                        conn,
                        pool,
                        remaining,
                        keep_alive,
                        stall,
                        progressed,
                        ..
                    } = &mut **streaming;
                    (conn, pool, remaining, *keep_alive, stall, progressed)
                }
            };
        loop {
            let Some(conn) = conn_slot.as_mut() else {
                return Poll::Ready(None);
            };
            match remaining {
                Remaining::Length(left) => {
                    // Never 0 here: the last byte hands the connection back
                    // (and `conn_slot` is empty from then on).
                    if !conn.read.is_empty() {
                        let take = usize::try_from(*left)
                            .unwrap_or(usize::MAX)
                            .min(conn.read.len());
                        let data = conn.read.split_to(take).freeze();
                        *left -= take as u64;
                        if *left == 0 {
                            // Back to the pool now: hyper may not poll again
                            // once the body reports its end.
                            release(conn_slot, pool, keep_alive);
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Remaining::Chunked(decoder) => match decoder.decode(&mut conn.read) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::Done) => {
                        release(conn_slot, pool, keep_alive);
                        // Kept trailer fields are the last frame; the next
                        // poll finds no connection and ends the body.
                        return Poll::Ready(
                            decoder.take_trailers().map(|t| Ok(Frame::trailers(t))),
                        );
                    }
                    Ok(Decoded::NeedMore) => {}
                    Err(error) => {
                        conn_slot.take();
                        pool.body_failed(&error);
                        return Poll::Ready(Some(Err(error)));
                    }
                },
                Remaining::UntilClose => {
                    if !conn.read.is_empty() {
                        let data = conn.read.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
            }
            let filled = match conn.poll_fill(cx) {
                Poll::Ready(filled) => filled,
                Poll::Pending => {
                    let timeout = pool.read_timeout();
                    let timer = stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    if std::mem::take(progressed) {
                        timer.as_mut().reset(tokio::time::Instant::now() + timeout);
                    }
                    ready!(timer.as_mut().poll(cx));
                    // Stalled: the connection is mid-message, so it is
                    // dropped, and the client's stream is cut.
                    conn_slot.take();
                    let error = stalled();
                    pool.body_failed(&error);
                    return Poll::Ready(Some(Err(error)));
                }
            };
            match filled {
                Ok(0) => {
                    conn_slot.take();
                    if let Remaining::UntilClose = remaining {
                        return Poll::Ready(None);
                    }
                    let error = closed_early();
                    pool.body_failed(&error);
                    return Poll::Ready(Some(Err(error)));
                }
                Ok(_) => *progressed = true,
                Err(error) => {
                    conn_slot.take();
                    pool.body_failed(&error);
                    return Poll::Ready(Some(Err(error)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(bytes) => bytes.is_none(),
            Kind::Upgrade(_) => true,
            Kind::Boxed(body) => body.is_end_stream(),
            Kind::Streaming(streaming) => streaming.conn.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Kind::Full(None) | Kind::Upgrade(_) => SizeHint::with_exact(0),
            Kind::Boxed(body) => body.size_hint(),
            Kind::Streaming(streaming) => match streaming.remaining {
                Remaining::Length(left) => SizeHint::with_exact(left),
                _ => SizeHint::default(),
            },
        }
    }
}

/// Ends the body's hold on its connection ([`CheckIn::check_in`]).
fn release(slot: &mut Option<UpstreamConn>, pool: &Arc<dyn CheckIn>, keep_alive: bool) {
    if let Some(conn) = slot.take() {
        pool.check_in(conn, keep_alive);
    }
}
