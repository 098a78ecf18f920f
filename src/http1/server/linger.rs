//! Lingering close: after the last response on a connection, the write side
//! is shut down and whatever the client still sends is read and thrown away,
//! for a short while, before the socket is closed.
//!
//! Closing a TCP socket whose receive buffer still holds bytes makes the
//! kernel answer with a reset instead of a FIN, and a reset can destroy the
//! response the client has not read yet. A client uploading a body to a
//! route that answers before reading it (a 429 from a limit, a 413, an
//! upstream's early answer) would then see "connection reset" instead of the
//! answer, or fail writing the rest of its body before it reads the answer.
//! nginx does the same (`lingering_close`). The wait ends when the client
//! closes its side, on a read error, when nothing has arrived for
//! [`LINGER_IDLE`], or after [`LINGER`] in all. A connection closed while
//! idle (nothing more coming) costs one `LINGER_IDLE` wait, off the request
//! path.

use std::io;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How long a closing connection keeps reading what the client still sends,
/// at most.
pub(crate) const LINGER: Duration = Duration::from_secs(5);

/// The linger ends early when nothing arrives for this long.
pub(crate) const LINGER_IDLE: Duration = Duration::from_millis(500);

/// Turns the linger off for a connection handed to a tunnel (an upgrade):
/// its shutdown is then the tunnel's, when one direction ends, and what the
/// client still sends belongs to the other direction.
#[derive(Debug, Default)]
pub(crate) struct LingerSwitch(AtomicBool);

impl LingerSwitch {
    pub(crate) fn turn_off(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_off(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// An I/O whose shutdown lingers: `poll_shutdown` sends the FIN, then reads
/// and discards as [`close`] does, unless its [`LingerSwitch`] was turned
/// off. (hyper shuts the I/O down before it drops it.)
#[derive(Debug)]
pub(crate) struct Lingering<T, S> {
    inner: T,
    state: State,
    switch: S,
}

#[derive(Debug)]
enum State {
    Open,
    Draining(Box<Drain>),
    Closed,
}

/// The two clocks of a linger.
#[derive(Debug)]
struct Drain {
    /// When the linger ends in any case.
    end: Instant,
    /// Fires when nothing has arrived for `LINGER_IDLE`; moved on by reads.
    idle: Pin<Box<Sleep>>,
}

impl Drain {
    fn start() -> Self {
        let now = Instant::now();
        Drain {
            end: now + LINGER,
            idle: Box::pin(tokio::time::sleep_until(now + LINGER_IDLE)),
        }
    }
}

impl<T, S: Deref<Target = LingerSwitch>> Lingering<T, S> {
    pub(crate) fn new(inner: T, switch: S) -> Self {
        Lingering {
            inner,
            state: State::Open,
            switch,
        }
    }
}

/// Reads and discards from `io` until it ends or fails, nothing arrives for
/// [`LINGER_IDLE`], or the linger's end.
fn poll_drain<T: AsyncRead + Unpin>(
    io: &mut T,
    drain: &mut Drain,
    cx: &mut Context<'_>,
) -> Poll<()> {
    let mut scratch = [0u8; 4096];
    loop {
        let mut buf = ReadBuf::new(&mut scratch);
        match Pin::new(&mut *io).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(()),
            Poll::Ready(Ok(())) => {
                let now = Instant::now();
                if now >= drain.end {
                    return Poll::Ready(());
                }
                let idle_until = (now + LINGER_IDLE).min(drain.end);
                drain.idle.as_mut().reset(idle_until);
            }
            Poll::Ready(Err(_)) => return Poll::Ready(()),
            Poll::Pending => return drain.idle.as_mut().poll(cx),
        }
    }
}

/// Shuts `io`'s write side down, then lingers (see the module doc).
pub(crate) async fn close<T: AsyncRead + AsyncWrite + Unpin>(io: &mut T) {
    use tokio::io::AsyncWriteExt;
    if io.shutdown().await.is_err() {
        return;
    }
    let mut drain = Drain::start();
    std::future::poll_fn(|cx| poll_drain(io, &mut drain, cx)).await;
}

impl<T: AsyncRead + Unpin, S: Unpin> AsyncRead for Lingering<T, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T, S> AsyncWrite for Lingering<T, S>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Deref<Target = LingerSwitch> + Unpin,
{
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
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Open => {
                    if let Err(error) = ready!(Pin::new(&mut this.inner).poll_shutdown(cx)) {
                        this.state = State::Closed;
                        return Poll::Ready(Err(error));
                    }
                    this.state = if this.switch.is_off() {
                        State::Closed
                    } else {
                        State::Draining(Box::new(Drain::start()))
                    };
                }
                State::Draining(drain) => {
                    ready!(poll_drain(&mut this.inner, drain, cx));
                    this.state = State::Closed;
                }
                State::Closed => return Poll::Ready(Ok(())),
            }
        }
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A server that answers at once and closes while the client is still
    /// sending: with a lingering close the client reads the whole answer.
    #[tokio::test]
    async fn an_early_answer_survives_the_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut io = Lingering::new(stream, Box::new(LingerSwitch::default()));
            let mut first = [0u8; 1024];
            let _ = io.read(&mut first).await.unwrap();
            io.write_all(b"answer").await.unwrap();
            io.shutdown().await.unwrap();
        });
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut reader, mut writer) = client.split();
        let upload = async {
            let chunk = vec![b'u'; 64 * 1024];
            for _ in 0..64 {
                if writer.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            let _ = writer.shutdown().await;
        };
        let read = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut answer = Vec::new();
            let _ = reader.read_to_end(&mut answer).await;
            answer
        };
        let ((), answer) = tokio::join!(upload, read);
        assert_eq!(answer, b"answer");
        server.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_linger_ends_when_nothing_arrives() {
        let (client, server) = tokio::io::duplex(1024);
        let mut io = Lingering::new(server, Box::new(LingerSwitch::default()));
        // The client neither sends nor closes: the shutdown returns after
        // LINGER_IDLE.
        let started = Instant::now();
        io.shutdown().await.unwrap();
        assert_eq!(started.elapsed(), LINGER_IDLE);
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn the_linger_is_bounded_while_data_keeps_coming() {
        let (mut client, server) = tokio::io::duplex(1024);
        let sender = tokio::spawn(async move {
            // A byte every 100 ms, forever (until the pipe breaks).
            while client.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let started = Instant::now();
        close(&mut Lingering::new(server, Box::new(LingerSwitch::default())).inner).await;
        let took = started.elapsed();
        assert!(
            took >= LINGER && took <= LINGER + Duration::from_millis(100),
            "{took:?}"
        );
        sender.abort();
    }

    #[tokio::test]
    async fn a_switched_off_linger_leaves_the_reads_to_the_tunnel() {
        let (mut client, server) = tokio::io::duplex(1024);
        let switch = std::sync::Arc::new(LingerSwitch::default());
        switch.turn_off();
        let mut io = Lingering::new(server, switch);
        client.write_all(b"for the upstream").await.unwrap();
        io.shutdown().await.unwrap();
        // Nothing was drained: the bytes are still there to read.
        let mut got = [0u8; 16];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"for the upstream");
    }
}
