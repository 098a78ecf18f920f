//! One HTTP/1.1 connection to an upstream: the socket and its two buffers,
//! kept together across the requests it carries.
//!
//! The buffers live as long as the connection, so a request in steady state
//! reuses memory the previous one had: the request head is written into the
//! same `Vec`, and the read buffer gets its space back once the previous
//! response's bytes (shared with the client's response) are gone.
//!
//! The socket is TCP, or TLS over TCP for an `https://` upstream
//! ([`UpstreamStream`]): an enum rather than a type parameter, so the
//! response body, the pool and the tunnels keep one concrete connection
//! type (a parameter would reach through all of them into the pipeline's
//! response body); a plaintext read or write costs one predictable branch.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use socket2::SockRef;
use tokio::io::Interest;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp;
use tokio_rustls::client::TlsStream;

/// An upstream socket: plain TCP, or TLS over TCP.
#[derive(Debug)]
pub(crate) enum UpstreamStream {
    Plain(TcpStream),
    /// Boxed: a TLS session is large, and plaintext connections should not
    /// carry its size.
    Tls(Box<TlsStream<TcpStream>>),
}

/// Forwards each call to the stream inside.
macro_rules! each_stream {
    ($self:expr, $stream:ident => $call:expr) => {
        match $self.get_mut() {
            UpstreamStream::Plain($stream) => $call,
            UpstreamStream::Tls($stream) => $call,
        }
    };
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each_stream!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each_stream!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, s => Pin::new(s).poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each_stream!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Plain(s) => s.is_write_vectored(),
            UpstreamStream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The read side of a split connection: a TCP half borrows the socket's
/// direction, a TLS one goes through tokio's `split` (one session, two
/// users).
pub(crate) enum ReadHalf<'a> {
    Plain(tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>),
}

/// The write side of a split connection (see [`ReadHalf`]).
pub(crate) enum WriteHalf<'a> {
    Plain(tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<&'a mut TlsStream<TcpStream>>),
}

impl AsyncRead for ReadHalf<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ReadHalf::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(s) => Pin::new(s).poll_write(cx, buf),
            WriteHalf::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(s) => Pin::new(s).poll_flush(cx),
            WriteHalf::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(s) => Pin::new(s).poll_shutdown(cx),
            WriteHalf::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Space made free in the read buffer before each read.
const READ_RESERVE: usize = 8 * 1024;

/// Reads more from `reader` into `read`, making room first; `Ok(0)` is the
/// upstream closing. For the whole connection and for its read half alike.
pub(crate) fn poll_fill<R: AsyncRead>(
    reader: Pin<&mut R>,
    read: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if read.capacity() - read.len() < READ_RESERVE / 2 {
        read.reserve(READ_RESERVE);
    }
    tokio_util::io::poll_read_buf(reader, cx, read)
}

/// What [`UpstreamConn::idle_state`] found on an idle connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdleState {
    /// Nothing: it can carry a request.
    Open,
    /// The upstream closed it (or it failed).
    Closed,
    /// Bytes the upstream sent after its last response.
    Stray,
}

/// [`UpstreamConn::idle_state`] of a TLS connection. Bytes on an idle TLS
/// socket need not be a response: TLS 1.3 servers send session tickets
/// after the handshake. So a peek first (nothing there: open), then rustls
/// reads what came: plaintext is stray bytes, a close is a close, and
/// records it took in whole (tickets) leave the connection open — unless
/// bytes are still waiting that it did not get to read (tokio's readiness
/// not caught up yet), where the connection is given up rather than trusted.
fn tls_idle_state(stream: &mut TlsStream<TcpStream>) -> IdleState {
    let waiting = |stream: &TlsStream<TcpStream>| {
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        let tcp = stream.get_ref().0;
        // As in `idle_state`: no readiness, no system call.
        match tcp.try_io(Interest::READABLE, || SockRef::from(tcp).peek(&mut probe)) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => None,
            Ok(0) | Err(_) => Some(IdleState::Closed),
            Ok(_) => Some(IdleState::Stray),
        }
    };
    if waiting(stream).is_none() && stream.get_ref().1.wants_read() {
        // Nothing on the socket; rustls holds no plaintext unless it wants
        // no more input, which is checked below.
        return IdleState::Open;
    }
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    match Pin::new(&mut *stream).poll_read(&mut cx, &mut buf) {
        Poll::Ready(Ok(())) if buf.filled().is_empty() => IdleState::Closed,
        Poll::Ready(Ok(())) => IdleState::Stray,
        Poll::Ready(Err(_)) => IdleState::Closed,
        Poll::Pending => match waiting(stream) {
            None => IdleState::Open,
            Some(_) => IdleState::Stray,
        },
    }
}

/// A connection to an upstream with its buffers.
#[derive(Debug)]
pub(crate) struct UpstreamConn {
    stream: UpstreamStream,
    /// Received and not yet consumed.
    pub(crate) read: BytesMut,
    /// The request head being written.
    pub(crate) write: Vec<u8>,
}

impl UpstreamConn {
    pub(crate) fn new(stream: TcpStream) -> UpstreamConn {
        UpstreamConn::over(UpstreamStream::Plain(stream))
    }

    /// A connection over a TCP or TLS stream.
    pub(crate) fn over(stream: UpstreamStream) -> UpstreamConn {
        UpstreamConn {
            stream,
            read: BytesMut::new(),
            write: Vec::with_capacity(1024),
        }
    }

    /// What an idle connection holds: nothing (it can carry a request), a
    /// close, or bytes the upstream sent unasked since its last response.
    ///
    /// Asked of tokio's readiness first: a socket that has not become
    /// readable since its last read drained it (a `WouldBlock`, or a read
    /// that left the buffer part empty) holds nothing that had arrived by
    /// the event loop's last poll, and costs no system call; one that has
    /// gets a non-blocking `recv` of one byte. That poll came after the
    /// request being forwarded arrived (or at most a few dozen task polls
    /// before), so what is missed is what arrived in the microseconds
    /// since, no more than a `recv` misses of bytes still on their way;
    /// nginx's keep-alive cache trusts its event loop the same way. A
    /// stray byte seen marks the pool, which then stops reusing
    /// connections. Anything read means the connection is not used again,
    /// so the byte taken is not missed.
    pub(crate) fn idle_state(&mut self) -> IdleState {
        if !self.read.is_empty() {
            return IdleState::Stray;
        }
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        let stream = match &mut self.stream {
            UpstreamStream::Plain(stream) => stream,
            UpstreamStream::Tls(stream) => return tls_idle_state(stream),
        };
        // `try_io` calls the `recv` only where readiness says readable, and
        // clears that readiness when it finds nothing (`WouldBlock`); it
        // takes no cooperative budget, so a busy task is not told `Open`
        // for want of one, as `poll_read_ready` would.
        match stream.try_io(Interest::READABLE, || {
            SockRef::from(&*stream).recv(&mut probe)
        }) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => IdleState::Open,
            Ok(0) | Err(_) => IdleState::Closed,
            Ok(_) => IdleState::Stray,
        }
    }

    /// Reads more into the read buffer; `Ok(0)` is the upstream closing.
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_fill(Pin::new(&mut self.stream), &mut self.read, cx)
    }

    /// Writes the request head buffer, and `then` after it.
    pub(crate) async fn write_head(&mut self, then: &[u8]) -> io::Result<()> {
        self.write_head_bytes(then).await?;
        // TLS may hold the last record back while the socket is full; a
        // flush sends it (on TCP there is nothing to flush).
        if let UpstreamStream::Tls(stream) = &mut self.stream {
            stream.flush().await?;
        }
        Ok(())
    }

    async fn write_head_bytes(&mut self, then: &[u8]) -> io::Result<()> {
        if then.is_empty() {
            self.stream.write_all(&self.write).await
        } else {
            let head_len = self.write.len();
            let mut written = 0;
            // One `writev` for head and body in the common case.
            while written < head_len + then.len() {
                let slices = if written < head_len {
                    [
                        io::IoSlice::new(&self.write[written..]),
                        io::IoSlice::new(then),
                    ]
                } else {
                    [
                        io::IoSlice::new(&then[written - head_len..]),
                        io::IoSlice::new(&[]),
                    ]
                };
                let n = self.stream.write_vectored(&slices).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                written += n;
            }
            Ok(())
        }
    }

    /// The socket's two directions and the read buffer, to write a body
    /// while watching for an answer.
    pub(crate) fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>, &mut BytesMut) {
        match &mut self.stream {
            UpstreamStream::Plain(stream) => {
                let (reader, writer) = stream.split();
                (
                    ReadHalf::Plain(reader),
                    WriteHalf::Plain(writer),
                    &mut self.read,
                )
            }
            UpstreamStream::Tls(stream) => {
                let (reader, writer) = tokio::io::split(&mut **stream);
                (
                    ReadHalf::Tls(reader),
                    WriteHalf::Tls(writer),
                    &mut self.read,
                )
            }
        }
    }

    /// The socket and whatever was received past the last response: what an
    /// upgraded connection starts with.
    pub(crate) fn into_parts(self) -> (UpstreamStream, BytesMut) {
        (self.stream, self.read)
    }
}
