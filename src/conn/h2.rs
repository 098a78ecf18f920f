//! HTTP/2 from clients: hyper's server over a TLS stream whose ALPN chose
//! `h2`, or over a cleartext one that opened with the connection preface
//! (h2c with prior knowledge). Every stream is one request through the same
//! `proxy::handler::handle` as an HTTP/1.1 request, so limits count streams,
//! not connections, and 429s carry the same fields.
//!
//! Limits against abuse (hyper's `h2`): at most [`MAX_CONCURRENT_STREAMS`]
//! open streams; a header list no larger than `max_header_bytes`; and the
//! rapid-reset bound of CVE-2023-44487: a client that resets more than
//! [`MAX_PENDING_RESETS`] streams the server has not yet taken up, or makes
//! the server reset more than [`MAX_LOCAL_ERROR_RESETS`] with protocol
//! errors, gets a `GOAWAY` (`ENHANCE_YOUR_CALM`) and is disconnected. The
//! connection is watched like an HTTP/1.1 one: idle longer than
//! `idle_timeout` or draining, it is shut down gracefully (`GOAWAY`, open
//! streams finish).

use hyper::server::conn::http2;
use hyper::service::{Service, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::conn::drain::DrainWatch;
use crate::conn::service::hyper_service;
use crate::conn::watchdog::{ConnParts, Shutdown, Watchdog, register_task};

/// The first bytes of the HTTP/2 connection preface (RFC 9113 §3.4): enough
/// to tell it from any HTTP/1.1 request line.
pub(crate) const PREFACE: &[u8] = crate::http1::server::H2_PREFACE;

/// Streams a client may have open at once (RFC 9113 recommends at least
/// 100).
pub(crate) const MAX_CONCURRENT_STREAMS: u32 = 100;

/// Streams a client may reset before the server has taken them up; past it
/// the connection is closed (the rapid-reset attack).
pub(crate) const MAX_PENDING_RESETS: usize = 20;

/// Streams the server may reset for a client's protocol errors before it
/// closes the connection.
pub(crate) const MAX_LOCAL_ERROR_RESETS: usize = 256;

/// Serves `conn`'s HTTP/2 connection on `io` until it closes, the server
/// drains (`draining`: it already does), or the watchdog finds it idle.
pub(crate) async fn serve<S>(conn: ConnParts, io: S, mut drain: DrainWatch, draining: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    register_task(&conn.activity).await;
    let limits = conn.limits;
    let metrics = conn.app.metrics().clone();
    let handler = hyper_service(conn.app.clone(), conn.activity.clone(), conn.downstream());
    // Boxed here, unlike on HTTP/1.1: hyper spawns every stream as a task,
    // moving the handler's future into it more than once, which cost more
    // than allocating it once (see BENCHMARKS.md, *TLS and HTTP/2*).
    let service = service_fn(move |request| Box::pin(handler.call(request)));
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(u32::try_from(limits.max_header_bytes()).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(MAX_PENDING_RESETS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESETS);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let peer = conn.peer();
    let mut watchdog = Watchdog::new(&conn, &mut drain, draining);
    // Draining, idle, or frames but no request within
    // header_read_timeout: a GOAWAY either way, so a client whose stream
    // raced with it learns that it was not processed. (Evicted, it is
    // idle, with no stream open: nothing a GOAWAY would save it from.)
    let served = watchdog.serve(connection.as_mut(), |connection, _, _| {
        connection.graceful_shutdown();
        Shutdown::Begun
    });
    if let Some(Err(error)) = served.await {
        match goaway_sent(&error) {
            Some(reason) => {
                metrics.record_http2_connection_error(reason);
                tracing::info!(%peer, reason, "HTTP/2 connection closed with a GOAWAY error");
            }
            None => tracing::debug!(%peer, %error, "HTTP/2 connection ended with an error"),
        }
    }
}

/// The error code of the GOAWAY the gateway sent to end a connection (h2's
/// own: the client broke the protocol or a bound, e.g. rapid reset's
/// `enhance_your_calm`), as the metric's label; `None` for an I/O error, a
/// client's own GOAWAY, or anything else.
fn goaway_sent(error: &hyper::Error) -> Option<&'static str> {
    let h2 = std::iter::successors(std::error::Error::source(error), |cause| cause.source())
        .find_map(|cause| cause.downcast_ref::<h2::Error>())?;
    if !(h2.is_go_away() && h2.is_library()) {
        return None;
    }
    Some(reason_label(h2.reason()?))
}

/// RFC 9113 §7's error codes, in lower case.
fn reason_label(reason: h2::Reason) -> &'static str {
    match reason {
        h2::Reason::NO_ERROR => "no_error",
        h2::Reason::PROTOCOL_ERROR => "protocol_error",
        h2::Reason::INTERNAL_ERROR => "internal_error",
        h2::Reason::FLOW_CONTROL_ERROR => "flow_control_error",
        h2::Reason::SETTINGS_TIMEOUT => "settings_timeout",
        h2::Reason::STREAM_CLOSED => "stream_closed",
        h2::Reason::FRAME_SIZE_ERROR => "frame_size_error",
        h2::Reason::REFUSED_STREAM => "refused_stream",
        h2::Reason::CANCEL => "cancel",
        h2::Reason::COMPRESSION_ERROR => "compression_error",
        h2::Reason::CONNECT_ERROR => "connect_error",
        h2::Reason::ENHANCE_YOUR_CALM => "enhance_your_calm",
        h2::Reason::INADEQUATE_SECURITY => "inadequate_security",
        h2::Reason::HTTP_1_1_REQUIRED => "http_1_1_required",
        _ => "other",
    }
}
