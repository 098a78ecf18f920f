//! Serving one traffic connection over HTTP/1.1, from its first byte to its
//! close: the gateway's own fast path ([`crate::http1::server`]) for plain
//! requests, then — from the first request that needs it — the hand-off to
//! hyper's HTTP/1.1 server, or to hyper's HTTP/2 server ([`super::h2`])
//! when the connection opens with the HTTP/2 preface (h2c with prior
//! knowledge).
//!
//! At the hand-off hyper starts from the bytes the fast path had read
//! ([`h1::Rewind`]), through [`h1::Gate`], which checks every later request
//! by the same framing rule before hyper reads it. The connection's
//! watchdog ([`super::watchdog`]: slow heads, idle time, eviction, the
//! drain's polite close) watches both halves. hyper's connection is boxed
//! at the hand-off, so the task of every connection does not carry its
//! size, idle or not. A request the codec refused is counted and logged
//! here ([`refused`]), as every other answer is.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::app::App;
use crate::conn::accept::Holding;
use crate::conn::drain::DrainWatch;
use crate::conn::evict::{Registered, Registry};
use crate::conn::h2;
use crate::conn::service::hyper_service;
use crate::conn::watchdog::{Closing, ConnParts, Shutdown, Watchdog, register_task};
use crate::http1::server::ActivityAnswered;
use crate::http1::server::ConnActivity;
use crate::http1::server::linger::{LingerSwitch, Lingering};
use crate::http1::server::{self as h1, Gate, Rewind};
use crate::proxy::handler::handle;

/// Serves one HTTP/1.1 connection (the fast path, then hyper) over a TCP
/// stream or, after its handshake, a TLS one (`https`, for the forwarding
/// fields), from `peer`. The connection is in `connections` (for evictions
/// at the cap) until its future is dropped.
///
/// Not an `async fn`: one keeps its arguments twice, as they came and as
/// the locals the body moves them into (rustc's layout of an `async fn`),
/// and the task of every connection, idle or not, would carry both (128
/// bytes here). The block below uses what it captures in place, and what
/// needs no `.await` (the activity, its registration, the settings, the
/// stream's wrapper) is made before it.
pub(crate) fn serve_connection<S>(
    app: Arc<App>,
    stream: S,
    peer: SocketAddr,
    https: bool,
    mut drain: DrainWatch,
    connections: &Arc<Registry>,
) -> Holding<impl Future<Output = ()> + Send + 'static, Registered>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(ConnActivity::new());
    let registered = connections.register(crate::worker::worker_index(), activity.clone());
    let mut io = ActivityIo {
        inner: stream,
        activity: activity.clone(),
    };
    let conn = ConnParts::new(app, activity, peer, https);
    let serving = async move {
        register_task(&conn.activity).await;
        let mut watchdog = Watchdog::new(&conn, &mut drain, false);
        // In a block of its own: what the fast path ends with is taken
        // apart before anything else is awaited, and dead after it (a
        // result or its bytes still in scope at a later `.await` would
        // keep their room, 74 bytes, in every connection's task, idle or
        // not).
        let (io, h2c) = {
            // Plain requests first, served by our own HTTP/1.1 path (`crate::http1::server`).
            let handed_over = {
                let conn = &conn;
                let respond = move |request| {
                    conn.activity.request_started();
                    // The handler's future itself, not wrapped: it attaches the
                    // request's completion to the body, and its field lines go
                    // into the head as they are (`h1` writes them).
                    handle(
                        &conn.app,
                        conn.downstream(),
                        request,
                        Some(conn.activity.clone()),
                    )
                };
                // The fast path relays interim (1xx) responses; hyper's servers,
                // which take over at a hand-off, have no way to send them.
                conn.activity.relay_interim(true);
                let fast = std::pin::pin!(h1::serve(
                    &mut io,
                    &*conn.activity,
                    conn.limits.max_header_bytes(),
                    respond
                ));
                // The fast path closes by itself once the request in flight is
                // answered, or at once when there is none.
                let served = watchdog.serve(fast, |_, why, activity| match why {
                    Closing::SlowHead => Shutdown::Now,
                    Closing::Politely if activity.begin_closing() => Shutdown::Now,
                    Closing::Politely => Shutdown::Begun,
                });
                match served.await {
                    Some(ended) => ended,
                    None => return,
                }
            };
            conn.activity.relay_interim(false);
            let prefix = match handed_over {
                Ok(h1::Ended::HandOff(prefix)) => prefix,
                Ok(h1::Ended::Closed) => {
                    refused(&conn.app, conn.peer(), &conn.activity);
                    return;
                }
                Err(error) => {
                    tracing::debug!(peer = %conn.peer(), %error, "connection ended with an error");
                    // A refusal whose answer could not be written still counts.
                    refused(&conn.app, conn.peer(), &conn.activity);
                    return;
                }
            };
            // h2c with prior knowledge: the connection preface is no HTTP/1.1
            // request, so the fast path handed it over; hyper's HTTP/2 server
            // takes it from the bytes read so far.
            let h2c = prefix.starts_with(h2::PREFACE);
            (Rewind::new(prefix, io), h2c)
        };
        if h2c {
            let closing = watchdog.is_closing();
            // Boxed, as hyper's HTTP/1.1 connection below.
            Box::pin(h2::serve(conn, io, drain, closing)).await;
            return;
        }

        // Everything else, from the first request that is not plain: hyper.
        // Boxed, once per handed-off connection: hyper's connection (with the
        // handler's future in it) is larger than the fast path's state, and the
        // task of every connection would otherwise carry its size, idle or not.
        Box::pin(serve_handed_off(io, watchdog)).await;
        refused(&conn.app, conn.peer(), &conn.activity);
    };
    Holding::new(serving, registered)
}

/// The request the codec refused on `activity`'s connection, if it refused
/// one (malformed, framed ambiguously, a head too large): counted as
/// `tollgate_requests_total{route="none"}` with its status, and given an
/// access-log line, so a flood of them (a smuggling scan, a broken client)
/// shows where every other answer does.
fn refused(app: &App, peer: SocketAddr, activity: &ConnActivity) {
    let Some(refusal) = activity.refusal() else {
        return;
    };
    let status = refusal.status.as_u16();
    app.metrics().record_refused(status);
    crate::access_log::log(&crate::access_log::AccessEntry {
        method: "-",
        path: "-",
        route: crate::metrics::NO_ROUTE,
        status,
        elapsed: None,
        upstream: None,
        client_ip: peer.ip(),
        limit: None,
        retries: 0,
        refused: Some(refusal.detail),
        front: "proxy",
        tokens: None,
        queued: None,
        trace: None,
    });
}

/// Serves a connection with hyper's HTTP/1.1 server from the first request
/// the fast path handed over (its bytes replayed by `io`), under the watch
/// the fast path was served under.
async fn serve_handed_off<S>(io: Rewind<ActivityIo<S>>, mut watchdog: Watchdog<'_>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = watchdog.conn();
    let max_header_bytes = conn.limits.max_header_bytes();
    let activity = &conn.activity;
    let service = hyper_service(conn.app.clone(), activity.clone(), conn.downstream());
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true)
        // Room for the largest allowed head: the gate refuses longer ones
        // (431 problem+json) before hyper could.
        .max_buf_size((max_header_bytes + 16 * 1024).max(8 * 1024));
    // Lingering: hyper answers some requests before reading their bodies
    // (denied, too large, an upstream's early answer); see `crate::http1::server::linger`.
    // The gate checks every later request before hyper reads it (`h1::gate`).
    let io = TokioIo::new(Lingering::new(
        Gate::new(io, max_header_bytes, ActivityAnswered(activity.clone())),
        ActivityLinger(activity.clone()),
    ));
    let connection = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    let served = watchdog.serve(connection.as_mut(), |connection, why, _| match why {
        Closing::SlowHead => Shutdown::Now,
        Closing::Politely => {
            connection.graceful_shutdown();
            Shutdown::Begun
        }
    });
    if let Some(Err(error)) = served.await {
        tracing::debug!(peer = %conn.peer(), %error, "connection ended with an error");
    }
}

/// A connection's linger switch, reached through its activity.
struct ActivityLinger(Arc<ConnActivity>);

impl std::ops::Deref for ActivityLinger {
    type Target = LingerSwitch;

    fn deref(&self) -> &LingerSwitch {
        &self.0.linger
    }
}

/// A stream (TCP, or TLS over TCP) that tells its [`ConnActivity`] when
/// bytes arrive.
pub(crate) struct ActivityIo<S> {
    pub(crate) inner: S,
    pub(crate) activity: Arc<ConnActivity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for ActivityIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.bytes_read();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ActivityIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
