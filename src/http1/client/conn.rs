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
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp;
use tokio_rustls::client::TlsStream;

/// An upstream socket: plain TCP, or TLS over TCP.
#[derive(Debug)]
pub enum UpstreamStream {
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
pub enum ReadHalf<'a> {
    Plain(tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>),
}

/// The write side of a split connection (see [`ReadHalf`]).
pub enum WriteHalf<'a> {
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
pub fn poll_fill<R: AsyncRead>(
    reader: Pin<&mut R>,
    read: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if read.capacity() - read.len() < READ_RESERVE / 2 {
        read.reserve(READ_RESERVE);
    }
    tokio_util::io::poll_read_buf(reader, cx, read)
}

/// A connection to an upstream with its buffers.
#[derive(Debug)]
pub struct UpstreamConn {
    stream: UpstreamStream,
    /// Received and not yet consumed.
    pub read: BytesMut,
    /// The request head being written.
    pub write: Vec<u8>,
}

impl UpstreamConn {
    pub fn new(stream: TcpStream) -> UpstreamConn {
        UpstreamConn::over(UpstreamStream::Plain(stream))
    }

    /// A connection over a TCP or TLS stream.
    pub fn over(stream: UpstreamStream) -> UpstreamConn {
        UpstreamConn {
            stream,
            read: BytesMut::new(),
            write: Vec::with_capacity(1024),
        }
    }

    /// Whether an idle connection can carry a request: the upstream has sent
    /// nothing — neither a close nor stray bytes — since its last response.
    /// Costs no system call unless the socket has signalled readiness.
    pub fn is_idle_and_open(&mut self) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let stream = match &mut self.stream {
            UpstreamStream::Plain(stream) => stream,
            // TLS: a read tells (it also takes in records the upstream may
            // send unasked, such as TLS 1.3 session tickets); plaintext
            // bytes or a close make it unusable.
            UpstreamStream::Tls(stream) => {
                let mut probe = [0u8; 1];
                let mut buf = ReadBuf::new(&mut probe);
                return matches!(Pin::new(stream).poll_read(&mut cx, &mut buf), Poll::Pending);
            }
        };
        match stream.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            // Readiness may be left over from the last read; a probe tells.
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(stream.try_read(&mut probe),
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Reads more into the read buffer; `Ok(0)` is the upstream closing.
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_fill(Pin::new(&mut self.stream), &mut self.read, cx)
    }

    /// Writes the request head buffer, and `then` after it.
    pub async fn write_head(&mut self, then: &[u8]) -> io::Result<()> {
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
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>, &mut BytesMut) {
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
    pub fn into_parts(self) -> (UpstreamStream, BytesMut) {
        (self.stream, self.read)
    }
}
