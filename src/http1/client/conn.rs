//! One HTTP/1.1 connection to an upstream: the socket and its two buffers,
//! kept together across the requests it carries.
//!
//! The buffers live as long as the connection, so a request in steady state
//! reuses memory the previous one had: the request head is written into the
//! same `Vec`, and the read buffer gets its space back once the previous
//! response's bytes (shared with the client's response) are gone.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};

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

/// What [`UpstreamConn::idle_state`] found on an idle connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleState {
    /// Nothing: it can carry a request.
    Open,
    /// The upstream closed it (or it failed).
    Closed,
    /// Bytes the upstream sent after its last response.
    Stray,
}

/// A connection to an upstream with its buffers.
#[derive(Debug)]
pub struct UpstreamConn {
    stream: TcpStream,
    /// Received and not yet consumed.
    pub read: BytesMut,
    /// The request head being written.
    pub write: Vec<u8>,
}

impl UpstreamConn {
    pub fn new(stream: TcpStream) -> UpstreamConn {
        UpstreamConn {
            stream,
            read: BytesMut::new(),
            write: Vec::with_capacity(1024),
        }
    }

    /// What an idle connection holds: nothing (it can carry a request), a
    /// close, or bytes the upstream sent unasked since its last response.
    ///
    /// One non-blocking `recv` on the socket itself, not through tokio's
    /// readiness: that is only as fresh as the event loop's last poll, and
    /// bytes that came meanwhile (a body after a `204`, more than
    /// `Content-Length` said, written just after the head) would be read as
    /// the next client's response. Anything read means the connection is
    /// not used again, so the byte taken is not missed.
    pub fn idle_state(&mut self) -> IdleState {
        if !self.read.is_empty() {
            return IdleState::Stray;
        }
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        // The socket is non-blocking (tokio's): nothing there is `WouldBlock`.
        match SockRef::from(&self.stream).recv(&mut probe) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => IdleState::Open,
            Ok(0) | Err(_) => IdleState::Closed,
            Ok(_) => IdleState::Stray,
        }
    }

    /// Reads more into the read buffer; `Ok(0)` is the upstream closing.
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_fill(Pin::new(&mut self.stream), &mut self.read, cx)
    }

    /// Writes the request head buffer, and `then` after it.
    pub async fn write_head(&mut self, then: &[u8]) -> io::Result<()> {
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
        let (reader, writer) = self.stream.split();
        (reader, writer, &mut self.read)
    }

    /// The socket and whatever was received past the last response: what an
    /// upgraded connection starts with.
    pub fn into_parts(self) -> (TcpStream, BytesMut) {
        (self.stream, self.read)
    }
}
