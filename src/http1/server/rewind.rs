//! An I/O that first gives back bytes already read from it.
//!
//! When the fast path hands a connection to hyper, the bytes it read but did
//! not serve (the head it declined, and whatever followed) must reach hyper
//! as if they were still unread.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, with `prefix` read first.
#[derive(Debug)]
pub struct Rewind<T> {
    /// Dropped once read: it is the fast path's whole read buffer, and a
    /// handed-off connection (an upgrade's tunnel) may live long.
    prefix: Option<BytesMut>,
    inner: T,
}

impl<T> Rewind<T> {
    pub fn new(prefix: BytesMut, inner: T) -> Self {
        Rewind {
            prefix: (!prefix.is_empty()).then_some(prefix),
            inner,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(prefix) = &mut this.prefix {
            let n = prefix.len().min(buf.remaining());
            buf.put_slice(&prefix[..n]);
            prefix.advance(n);
            if prefix.is_empty() {
                this.prefix = None;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn prefix_then_inner() {
        let inner: &[u8] = b" world";
        let mut io = Rewind::new(BytesMut::from(&b"hello"[..]), inner);
        let mut small = [0u8; 3];
        io.read_exact(&mut small).await.unwrap();
        assert_eq!(&small, b"hel");
        let mut rest = String::new();
        io.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "lo world");
        // The prefix's buffer is gone once read.
        assert!(io.prefix.is_none());
    }
}
