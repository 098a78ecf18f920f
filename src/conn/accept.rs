//! The accept loop every listener of the process runs — the traffic
//! listeners on each worker, the admin listener and the decision listener:
//! accept, take a connection slot, hand the connection to its own task, and
//! keep going through accept errors.
//!
//! - **Connection slots**: a connection takes its slot (a permit of the
//!   listener's semaphore) right after `accept` and gives it back when its
//!   task ends. At the cap the loop holds at most one accepted connection
//!   waiting for a slot, and further ones wait in the kernel backlog.
//!   (Taking the slot *before* `accept` would let an idle worker's loop sit
//!   on a slot while connections queue on another worker's socket.) A
//!   traffic loop holding a connection at the cap asks the keep-alive
//!   connection idle the longest, of any worker, to close and make room
//!   ([`super::evict`]).
//! - **Accept errors** (out of file descriptors, `EMFILE`/`ENFILE`, and the
//!   like) back off and retry instead of ending the loop, as mini-redis's
//!   server does: 5 ms, doubling to at most 1 s, back to 5 ms after the next
//!   connection ([`Backoff`]). A loop that ended would leave its socket
//!   open, queueing connections nobody accepts.
//! - **Stopping**: the loop ends when its `stop` switch turns true (a
//!   reload removed the listener, or the drain began); connections already
//!   handed off carry on in their tasks.
//!
//! What a connection is served with is the caller's: [`accept_and_serve`]
//! takes a closure from the accepted stream to its connection's future (the
//! proxy's hand-off to the HTTP/1.1 path or TLS, the admin endpoints, the
//! decision service), so this module knows nothing of what runs above it.
//! [`until_shutdown`] is the ending the admin and decision listeners'
//! hyper connections share.

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::conn::evict::Registry;

/// How long an accept loop at the cap waits for the connection it asked to
/// close before it asks another (the first may have turned busy), or looks
/// again for an idle one when none was.
const EVICT_RETRY: Duration = Duration::from_millis(100);

/// A listening socket, as the accept loop sees it: a `TcpListener`, or in
/// tests a script of connections and errors.
pub(crate) trait Accept {
    /// The stream of an accepted connection.
    type Stream;

    /// The next connection and its peer, or why there is none this time.
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Stream, SocketAddr)>> + Send;
}

impl Accept for TcpListener {
    type Stream = TcpStream;

    fn accept(&self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + Send {
        TcpListener::accept(self)
    }
}

/// The wait after a failed accept: [`Backoff::FIRST`], doubling with each
/// failure in a row up to [`Backoff::MOST`]; a connection accepted starts
/// it over. Out of file descriptors, retrying at once would spin on the
/// same error; waiting a whole second after every failure would leave a
/// burst of closing connections' descriptors unused for that long.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    /// The wait after the first failure.
    pub(crate) const FIRST: Duration = Duration::from_millis(5);
    /// The longest wait.
    pub(crate) const MOST: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }

    /// An accept failed: how long to wait before the next one.
    pub(crate) fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (wait * 2).min(Self::MOST);
        wait
    }

    /// A connection was accepted: the next failure waits the least again.
    pub(crate) fn accepted(&mut self) {
        self.next = Self::FIRST;
    }
}

/// Accepts on `listener` until `stop` turns true, giving each connection a
/// slot of `permits` (see the module doc; at the cap, `evict`'s idle
/// connections are asked to make room) and running `serve(stream, peer)`
/// in a task of its own, which holds the slot until it ends. Returns at
/// once when `stop` is already true.
pub(crate) async fn accept_and_serve<L, F, C>(
    listener: L,
    permits: Arc<Semaphore>,
    evict: Option<Arc<Registry>>,
    mut stop: watch::Receiver<bool>,
    mut serve: F,
) where
    L: Accept,
    F: FnMut(L::Stream, SocketAddr) -> C,
    C: Future<Output = ()> + Send + 'static,
{
    if *stop.borrow_and_update() {
        return;
    }
    let mut backoff = Backoff::new();
    while let Some((stream, peer, permit)) = accept_next(
        &listener,
        &permits,
        evict.as_deref(),
        &mut stop,
        &mut backoff,
    )
    .await
    {
        tokio::spawn(Holding::new(serve(stream, peer), permit));
    }
}

/// A future that holds `held` (a connection slot, the server's liveness
/// sender) until it has run to its end: the task drops it then.
///
/// Not an `async move` block around the future: a block keeps its captured
/// future in a field of its own and the awaited one in another, so every
/// connection's task carried its whole state twice (5.7 KB an idle
/// connection, against 3.2 KB before the accept loop was shared; see
/// `tests::an_idle_connection_s_task_stays_small` in `conn::serve`).
pub(crate) struct Holding<F, T> {
    future: F,
    _held: T,
}

impl<F, T> Holding<F, T> {
    pub(crate) fn new(future: F, held: T) -> Holding<F, T> {
        Holding {
            future,
            _held: held,
        }
    }
}

impl<F: Future, T> Future for Holding<F, T> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        // SAFETY: `future` is pinned structurally: it is never moved out of
        // `Holding` (no method hands it out, and `Holding` has no `Drop`),
        // and `Holding` is `Unpin` only when `F` is.
        let future = unsafe { self.map_unchecked_mut(|holding| &mut holding.future) };
        future.poll(cx)
    }
}

/// An accepted connection and its connection slot, or `None` once `stop`
/// fires. Accept errors back off (`backoff`) and retry.
async fn accept_next<L: Accept>(
    listener: &L,
    permits: &Arc<Semaphore>,
    evict: Option<&Registry>,
    stop: &mut watch::Receiver<bool>,
    backoff: &mut Backoff,
) -> Option<(L::Stream, SocketAddr, OwnedSemaphorePermit)> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return None,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff.accepted();
                let permit = match permits.clone().try_acquire_owned() {
                    Ok(permit) => permit,
                    // At the cap: make room by closing an idle connection,
                    // and wait for a slot.
                    Err(_) => {
                        let acquire = permits.clone().acquire_owned();
                        tokio::pin!(acquire);
                        loop {
                            if let Some(registry) = evict {
                                registry.evict_oldest_idle();
                            }
                            tokio::select! {
                                permit = &mut acquire => break permit.ok()?,
                                _ = tokio::time::sleep(EVICT_RETRY), if evict.is_some() => {}
                                _ = stop.changed() => return None,
                            }
                        }
                    }
                };
                return Some((stream, peer, permit));
            }
            Err(error) => {
                let wait = backoff.failed();
                tracing::warn!(%error, ?wait, "accept failed; backing off");
                // The stop switch is not watched here: the wait is short,
                // and the next round sees a stop that came meanwhile.
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Drives a hyper server `connection` to its end. When `shutdown` turns
/// true first, asks it to finish the request in flight and close
/// (`graceful`, its `graceful_shutdown`) and waits for that. An error
/// ending the connection is logged at debug, naming the `listener`.
pub(crate) async fn until_shutdown<C, E>(
    connection: C,
    mut shutdown: watch::Receiver<bool>,
    graceful: impl FnOnce(Pin<&mut C>),
    listener: &'static str,
) where
    C: Future<Output = Result<(), E>>,
    E: Display,
{
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, listener, "connection ended with an error");
            }
        }
        _ = shutdown.changed() => {
            graceful(connection.as_mut());
            let _ = connection.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::*;

    #[test]
    fn backoff_doubles_to_its_most_and_starts_over_after_a_connection() {
        let mut backoff = Backoff::new();
        let waits: Vec<u64> = (0..10)
            .map(|_| backoff.failed().as_millis() as u64)
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.accepted();
        assert_eq!(backoff.failed(), Backoff::FIRST);
        assert_eq!(backoff.failed(), Backoff::FIRST * 2);
    }

    /// A listener that answers its script, one entry per `accept` (an
    /// error, or a connection named by a number), then waits forever; it
    /// notes when (on the test's paused clock) each `accept` was called.
    struct Scripted {
        script: Mutex<VecDeque<Result<u32, i32>>>,
        calls: Arc<Mutex<Vec<Duration>>>,
        start: Instant,
    }

    impl Accept for Scripted {
        type Stream = u32;

        fn accept(&self) -> impl Future<Output = io::Result<(u32, SocketAddr)>> + Send {
            self.calls.lock().unwrap().push(self.start.elapsed());
            let next = self.script.lock().unwrap().pop_front();
            async move {
                match next {
                    Some(Ok(id)) => Ok((id, SocketAddr::from(([127, 0, 0, 1], 40000)))),
                    Some(Err(errno)) => Err(io::Error::from_raw_os_error(errno)),
                    None => std::future::pending().await,
                }
            }
        }
    }

    /// An accept error (EMFILE, ENFILE) backs off 5, 10, 20 ms and the loop
    /// serves the connections after it; a connection starts the back-off
    /// over. The clock is tokio's paused one: the waits are exact and the
    /// test takes no time.
    #[tokio::test(start_paused = true)]
    async fn accept_errors_back_off_and_the_loop_keeps_serving() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let listener = Scripted {
            script: Mutex::new(VecDeque::from([
                Err(libc::EMFILE),
                Err(libc::EMFILE),
                Err(libc::ENFILE),
                Ok(1),
                Err(libc::EMFILE),
                Ok(2),
                Ok(3),
            ])),
            calls: calls.clone(),
            start: Instant::now(),
        };
        let (served_tx, mut served) = mpsc::unbounded_channel();
        let (stop_tx, stop) = watch::channel(false);
        let serving = tokio::spawn(accept_and_serve(
            listener,
            Arc::new(Semaphore::new(8)),
            None,
            stop,
            move |id, _peer| {
                let served_tx = served_tx.clone();
                async move {
                    let _ = served_tx.send(id);
                }
            },
        ));
        for expected in [1, 2, 3] {
            assert_eq!(served.recv().await, Some(expected));
        }
        stop_tx.send(true).unwrap();
        serving.await.unwrap();

        let calls = calls.lock().unwrap();
        let at: Vec<u64> = calls.iter().map(|at| at.as_millis() as u64).collect();
        // Three failures: 5, 10 and 20 ms apart; connection 1 at once after
        // the last wait; one failure after it waits 5 ms again.
        assert_eq!(at[..7], [0, 5, 15, 35, 35, 40, 40]);
    }

    /// The connection's task holds its slot: with one slot, the second
    /// connection is served only once the first one's task has ended.
    #[tokio::test(start_paused = true)]
    async fn a_connection_holds_its_slot_until_its_task_ends() {
        let listener = Scripted {
            script: Mutex::new(VecDeque::from([Ok(1), Ok(2)])),
            calls: Arc::new(Mutex::new(Vec::new())),
            start: Instant::now(),
        };
        let permits = Arc::new(Semaphore::new(1));
        let (served_tx, mut served) = mpsc::unbounded_channel();
        let (release_tx, release) = mpsc::unbounded_channel::<()>();
        let release = Arc::new(tokio::sync::Mutex::new(release));
        let (stop_tx, stop) = watch::channel(false);
        let serving = tokio::spawn(accept_and_serve(
            listener,
            permits.clone(),
            None,
            stop,
            move |id, _peer| {
                let served_tx = served_tx.clone();
                let release = release.clone();
                async move {
                    let _ = served_tx.send(id);
                    // Connection 1 lasts until the test releases it.
                    if id == 1 {
                        release.lock().await.recv().await;
                    }
                }
            },
        ));
        assert_eq!(served.recv().await, Some(1));
        // The paused clock moves only once every task waits, so after this
        // the loop has gone as far as it can without connection 1 ending:
        // holding connection 2, waiting for the slot.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(served.try_recv().is_err(), "served without a slot");
        assert_eq!(permits.available_permits(), 0);
        release_tx.send(()).unwrap();
        // Only the end of connection 1 lets connection 2 be served.
        assert_eq!(served.recv().await, Some(2));
        stop_tx.send(true).unwrap();
        serving.await.unwrap();
    }

    #[tokio::test]
    async fn a_stop_already_given_returns_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_stop_tx, stop) = watch::channel(true);
        accept_and_serve(
            listener,
            Arc::new(Semaphore::new(1)),
            None,
            stop,
            |_, _| async {},
        )
        .await;
    }

    /// On a real socket: a connection is served by the closure, and the
    /// stop switch ends the loop.
    #[tokio::test]
    async fn serves_tcp_connections_until_stopped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop_tx, stop) = watch::channel(false);
        let serving = tokio::spawn(accept_and_serve(
            listener,
            Arc::new(Semaphore::new(4)),
            None,
            stop,
            |mut stream: TcpStream, _peer| async move {
                let _ = stream.write_all(b"hello").await;
            },
        ));
        for _ in 0..2 {
            let mut client = TcpStream::connect(address).await.unwrap();
            let mut greeting = Vec::new();
            client.read_to_end(&mut greeting).await.unwrap();
            assert_eq!(greeting, b"hello");
        }
        stop_tx.send(true).unwrap();
        serving.await.unwrap();
    }
}
