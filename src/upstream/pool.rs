//! Keep-alive connections to one upstream address, and the request loop
//! that picks one, runs the exchange and decides on a retry.
//!
//! A pool serves one address and keeps one idle list per worker thread
//! ([`crate::worker`]), so checkout is a `Vec::pop` under a lock no other
//! thread takes in steady state, and a connection — registered with the
//! event loop of the worker that opened it — is reused on that worker,
//! never woken through another thread's loop. A connection comes back when its response body has been
//! read to the end ([`UpstreamBody`]), or at once when the body came with
//! the head.
//!
//! A connection is reused only if it is empty and open as far as the event
//! loop has seen, probed with a non-blocking read where the loop saw it
//! become readable ([`UpstreamConn::idle_state`]), and never after a response with
//! bytes buffered past its end: bytes an upstream writes after a response
//! (a body after a `204`, more than `Content-Length`) would be the next
//! client's response. Once an upstream is seen doing that, its pool stops
//! reusing connections, since such bytes may also still be on their way.
//!
//! An upstream may close an idle keep-alive connection at any time. Most
//! such closes are seen before use (the socket has signalled readiness while
//! idle); one that races with the request shows as a connection that took
//! the request and answered nothing. That request is sent again on a new
//! connection only when doing so cannot repeat an action: its method is
//! idempotent (RFC 9110 §9.2.2) and its body is in memory — the rule nginx
//! follows too. A new connection that answers nothing either is a
//! [`PoolError::Unanswered`]: the upstream layer may send the request to
//! another URL (`crate::upstream`).
//!
//! An `https://` URL's pool shakes hands on each new connection, within the
//! same `connect_timeout` as the TCP connect, and pools the TLS
//! connections exactly like plaintext ones. A failed handshake (a
//! certificate the trust roots do not vouch for, or for another name) is a
//! connect error naming the address, the name and rustls's reason.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::request::Parts;
use http::{Method, Request, Response};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::http::field_lines::{FieldLines, recycle_map};
use crate::http1::client::conn::{IdleState, UpstreamConn, UpstreamStream};
use crate::http1::client::exchange::{Outgoing, OutgoingBody, exchange};
use crate::http1::client::head::{Framing, OwnFields, ResponseHead, encode_request};
use crate::http1::client::interim::InterimSink;
use crate::http1::client::response_body::{CheckIn, UpstreamBody};
use crate::worker::PerWorker;
use prometheus_client::metrics::counter::Counter;

/// Connections idle longer than this are not reused (upstreams commonly close
/// idle keep-alive connections after a minute or more).
const IDLE_TIMEOUT: Duration = Duration::from_secs(50);
/// Most idle connections kept per address; more are closed when returned.
const MAX_IDLE: usize = 256;

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No connection could be opened (refused, unreachable, timed out).
    #[error("cannot connect to {address}")]
    Connect {
        address: String,
        #[source]
        source: io::Error,
    },
    /// The connection failed while the request was sent or answered, or the
    /// answer was not HTTP/1.1 the gateway can forward.
    #[error("the upstream connection failed")]
    Request(#[source] io::Error),
    /// The connection failed before any byte of a response came back (an
    /// upstream stopping, or a keep-alive close racing the request): an
    /// idempotent request may go to another URL (`crate::upstream`).
    #[error("the upstream connection failed before answering")]
    Unanswered(#[source] io::Error),
}

impl PoolError {
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, PoolError::Connect { .. })
    }

    /// Nothing of a response came back before the connection failed.
    pub(crate) fn is_unanswered(&self) -> bool {
        matches!(self, PoolError::Unanswered(_))
    }

    /// The upstream's answer broke HTTP/1.1 (refused by the client's parser).
    pub(crate) fn is_protocol(&self) -> bool {
        matches!(self, PoolError::Request(error) if error.kind() == io::ErrorKind::InvalidData)
    }
}

/// An idle connection, and when it stops being worth reusing.
///
/// The times are tokio's clock as the request read it for its deadline
/// (`proxy::forward`), not read again here: a connection that comes back
/// with its response's head counts as idle from when its request started,
/// a little early, which only retires it sooner. Two clock reads and a
/// subtraction were ~120 instructions a request.
#[derive(Debug)]
struct Idle {
    conn: UpstreamConn,
    expires: Instant,
}

impl Idle {
    /// Still worth handing out at `now`: not idle too long, and not closed
    /// (or sent something unasked-for) by the upstream meanwhile. Stray
    /// bytes mark `pool` as misframing.
    fn usable(&mut self, pool: &ConnectionPool, now: Instant) -> bool {
        if now >= self.expires {
            return false;
        }
        match self.conn.idle_state() {
            IdleState::Open => true,
            IdleState::Closed => false,
            IdleState::Stray => {
                pool.misframed();
                false
            }
        }
    }
}

/// How a pool's connections shake hands: with what trust roots, as what
/// name.
pub(crate) struct PoolTls {
    pub(crate) connector: tokio_rustls::TlsConnector,
    pub(crate) name: rustls::pki_types::ServerName<'static>,
}

impl PoolTls {
    /// The TLS handshake on `stream`; a failure says as what name.
    pub(crate) async fn handshake(
        &self,
        stream: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.connector
            .connect(self.name.clone(), stream)
            .await
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("TLS handshake as {} failed: {e}", self.name.to_str()),
                )
            })
    }
}

/// Opens a TCP connection to `address` (without Nagle's delay) and goes on
/// with `then` (a TLS handshake, a protocol's own), all within `timeout`:
/// how both upstream clients connect. Any failure, or the timeout, is a
/// [`PoolError::Connect`].
pub(crate) async fn connect_within<T, F>(
    address: &str,
    timeout: Duration,
    then: impl FnOnce(TcpStream) -> F,
) -> Result<T, PoolError>
where
    F: Future<Output = io::Result<T>>,
{
    let connect_error = |source| PoolError::Connect {
        address: address.to_owned(),
        source,
    };
    let connecting = async {
        let stream = TcpStream::connect(address).await?;
        let _ = stream.set_nodelay(true);
        then(stream).await
    };
    tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| connect_error(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")))?
        .map_err(connect_error)
}

/// The keep-alive connections to one upstream address (`host:port`).
pub struct ConnectionPool {
    address: String,
    connect_timeout: Duration,
    /// Longest wait for the next bytes of a response body.
    read_timeout: Duration,
    /// `https://`: the handshake on each new connection.
    tls: Option<PoolTls>,
    /// Idle connections, per worker: each list on cache lines of its own
    /// (two workers' lists side by side shared a line, which each checkout
    /// and check-in — a lock, a pop or push, an unlock — moved between the
    /// cores).
    idle: PerWorker<Mutex<Vec<Idle>>>,
    /// Where response bodies that fail after their head are counted.
    body_errors: BodyErrors,
    /// The upstream wrote bytes past the end of a response: its connections
    /// are not reused from then on (see [`ConnectionPool::misframed`]).
    misframing: AtomicBool,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionPool")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// RFC 9110 §9.2.2.
pub(crate) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

impl ConnectionPool {
    pub fn new(
        address: String,
        connect_timeout: Duration,
        read_timeout: Duration,
        body_errors: BodyErrors,
    ) -> Arc<ConnectionPool> {
        ConnectionPool::with_tls(address, connect_timeout, read_timeout, body_errors, None)
    }

    /// A pool whose connections are TLS when `tls` is given.
    pub(crate) fn with_tls(
        address: String,
        connect_timeout: Duration,
        read_timeout: Duration,
        body_errors: BodyErrors,
        tls: Option<PoolTls>,
    ) -> Arc<ConnectionPool> {
        Arc::new(ConnectionPool {
            address,
            connect_timeout,
            read_timeout,
            body_errors,
            misframing: AtomicBool::new(false),
            tls,
            idle: PerWorker::default(),
        })
    }

    /// The idle list of the worker running this code (off worker threads —
    /// tests, tools — the index is 0).
    fn idle_list(&self) -> &Mutex<Vec<Idle>> {
        self.idle.mine()
    }

    /// The most recently used open connection at `now`, if any (LIFO keeps
    /// few warm).
    pub(crate) fn take_idle(&self, now: Instant) -> Option<UpstreamConn> {
        loop {
            let mut idle = self.idle_list().lock().pop()?;
            if idle.usable(self, now) {
                return Some(idle.conn);
            }
        }
    }

    /// Notes that the upstream wrote bytes past the end of a response. A
    /// check before reuse finds such bytes once they have arrived, but not
    /// those still on their way — held by the upstream's Nagle algorithm
    /// until the next request's ACK, say — which the next client would read
    /// as its response. An upstream seen doing it once is not trusted with
    /// a reused connection again: every request gets a new one, until a
    /// reload replaces the pool.
    fn misframed(&self) {
        if !self.misframing.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                upstream = %self.address,
                "the upstream sent bytes past the end of a response; its connections are no longer reused"
            );
        }
    }

    /// Takes a connection back after a complete response if it may carry
    /// another request (`keep_alive`), nothing unasked-for arrived after it
    /// and the upstream has never been seen misframing; otherwise it is
    /// closed. It is idle from `now` on.
    fn release(&self, conn: UpstreamConn, keep_alive: bool, now: Instant) {
        if !keep_alive {
            return;
        }
        if !conn.read.is_empty() {
            self.misframed();
            return;
        }
        if self.misframing.load(Ordering::Relaxed) {
            return;
        }
        let mut idle = self.idle_list().lock();
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                conn,
                expires: now + IDLE_TIMEOUT,
            });
        }
    }

    /// Closes idle connections that are too old or that the upstream has
    /// closed, on every worker's list. Checkout finds them too, but only
    /// from the top of a list: without this, the ones below would sit in
    /// `CLOSE_WAIT` for as long as traffic stays low. Run by the idle sweeper.
    pub(crate) fn prune(&self) -> usize {
        let mut closed = 0;
        let now = Instant::now();
        for list in self.idle.iter() {
            let mut idle = list.lock();
            let before = idle.len();
            idle.retain_mut(|idle| idle.usable(self, now));
            closed += before - idle.len();
        }
        closed
    }

    /// Idle connections, all workers together.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.iter().map(|list| list.lock().len()).sum()
    }

    async fn connect(&self) -> Result<UpstreamConn, PoolError> {
        connect_within(&self.address, self.connect_timeout, |stream| async {
            let Some(tls) = &self.tls else {
                return Ok(UpstreamConn::new(stream));
            };
            let stream = tls.handshake(stream).await?;
            Ok(UpstreamConn::over(UpstreamStream::Tls(Box::new(stream))))
        })
        .await
    }

    /// Sends `request` on a pooled connection (or a new one) and waits for
    /// the response head; the body is read as the response is polled. The
    /// response's fields come as lines beside it (its header map is empty).
    /// `own` are the fields the gateway writes in place of some of the
    /// request's (see [`OwnFields`]); interim (1xx) responses go to
    /// `interim`, the client's connection, when it relays them.
    pub async fn send<B: OutgoingBody>(
        self: &Arc<Self>,
        request: Request<B>,
        own: OwnFields,
        interim: Option<&dyn InterimSink>,
    ) -> Result<(Response<UpstreamBody>, FieldLines), PoolError> {
        let (mut parts, body) = request.into_parts();
        let now = Instant::now();
        let first = self.checkout(now).await?;
        self.send_on(first, &mut parts, body, &own, interim, now)
            .await
    }

    /// A connection for the next request at `now`: the most recently used
    /// idle one (`true`: reused), or a new one. Nothing is sent: a failure
    /// here is always a [`PoolError::Connect`], and the request can go
    /// elsewhere.
    pub(crate) async fn checkout(&self, now: Instant) -> Result<(UpstreamConn, bool), PoolError> {
        match self.take_idle(now) {
            Some(conn) => Ok((conn, true)),
            None => Ok((self.connect_new().await?, false)),
        }
    }

    /// A new connection ([`ConnectionPool::take_idle`] found none).
    pub(crate) async fn connect_new(&self) -> Result<UpstreamConn, PoolError> {
        // Boxed: a connect (a TLS handshake's state with it) is rare on a
        // pooled upstream, and inline it made every request's future —
        // copied into its box — larger.
        Box::pin(self.connect()).await
    }

    /// [`ConnectionPool::send`] on `first`, a connection from
    /// [`ConnectionPool::checkout`]. The request's head and `own` are
    /// borrowed, not moved: they stay where the caller keeps them, rather
    /// than being copied into this future (~650 bytes, ~130 instructions
    /// per request each time); `parts`' header map goes back with the
    /// response, emptied, for the connection to reuse. `now`: when the
    /// request started, what a connection freed with its response's head
    /// counts as idle from (see [`Idle`]).
    pub(crate) async fn send_on<B: OutgoingBody>(
        self: &Arc<Self>,
        first: (UpstreamConn, bool),
        parts: &mut Parts,
        body: B,
        own: &OwnFields,
        interim: Option<&dyn InterimSink>,
        now: Instant,
    ) -> Result<(Response<UpstreamBody>, FieldLines), PoolError> {
        let mut body = Outgoing::new(body);
        let framing = body.framing();
        let may_retry = body.is_replayable() && is_idempotent(&parts.method);
        let (mut conn, mut reused) = first;
        loop {
            conn.write.clear();
            encode_request(parts, framing, own, &mut conn.write);
            match exchange(&mut conn, &parts.method, &mut body, framing, interim).await {
                Ok(head) => {
                    let (mut response, fields) = self.response(conn, head, now);
                    // The request's map, emptied, travels back with the
                    // response for the connection to reuse.
                    recycle_map(&mut parts.headers, response.headers_mut());
                    return Ok((response, fields));
                }
                // A keep-alive connection closed under the request.
                Err(failure) if reused && failure.silent && may_retry => {
                    drop(conn);
                    (conn, reused) = self.checkout(Instant::now()).await?;
                }
                Err(failure) if failure.silent => {
                    return Err(PoolError::Unanswered(failure.error));
                }
                Err(failure) => return Err(PoolError::Request(failure.error)),
            }
        }
    }

    /// The response to hand on, its body reading from `conn`.
    fn response(
        self: &Arc<Self>,
        mut conn: UpstreamConn,
        head: ResponseHead,
        now: Instant,
    ) -> (Response<UpstreamBody>, FieldLines) {
        let ResponseHead {
            parts,
            fields,
            framing,
            keep_alive,
        } = head;
        let body = if parts.status == http::StatusCode::SWITCHING_PROTOCOLS {
            UpstreamBody::upgrade(conn)
        } else {
            match framing {
                Framing::Empty => {
                    self.release(conn, keep_alive, now);
                    UpstreamBody::full(None)
                }
                // The whole body came with the head: the connection is free.
                Framing::Length(length) if conn.read.len() as u64 >= length => {
                    let bytes = conn.read.split_to(length as usize).freeze();
                    self.release(conn, keep_alive, now);
                    UpstreamBody::full(Some(bytes))
                }
                Framing::Length(length) => {
                    UpstreamBody::length(conn, self.clone(), length, keep_alive)
                }
                Framing::Chunked => UpstreamBody::chunked(conn, self.clone(), keep_alive),
                Framing::UntilClose => UpstreamBody::until_close(conn, self.clone()),
            }
        };
        (Response::from_parts(parts, body), fields)
    }
}

/// A response body gives its connection back here, or says it failed.
impl CheckIn for ConnectionPool {
    fn check_in(&self, conn: UpstreamConn, keep_alive: bool) {
        self.release(conn, keep_alive, Instant::now());
    }

    fn body_failed(&self, error: &io::Error) {
        self.body_errors.count(error);
    }

    fn read_timeout(&self) -> Duration {
        self.read_timeout
    }
}

/// Counters of response bodies that fail after their head was relayed (the
/// client's stream is cut then): `protocol`, the body broke HTTP/1.1 (a bad
/// chunk line); `timeout`, no bytes came within `read_timeout`; `reset`, it
/// was cut short or the connection failed. And `retried_unanswered`: the
/// requests sent again to another URL because theirs answered nothing
/// (`crate::upstream`), a retry with `reason="reset"`.
#[derive(Debug, Clone, Default)]
pub struct BodyErrors {
    pub(crate) protocol: Counter,
    pub(crate) timeout: Counter,
    pub(crate) reset: Counter,
    pub(crate) retried_unanswered: Counter,
}

impl BodyErrors {
    fn count(&self, error: &io::Error) {
        match error.kind() {
            io::ErrorKind::InvalidData => self.protocol.inc(),
            io::ErrorKind::TimedOut => self.timeout.inc(),
            _ => self.reset.inc(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection and its upstream end, the latter as a blocking std
    /// socket so writing to it needs no await.
    async fn pair(listener: &tokio::net::TcpListener) -> (UpstreamConn, std::net::TcpStream) {
        let conn = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (peer, _) = listener.accept().await.unwrap();
        let peer = peer.into_std().unwrap();
        peer.set_nonblocking(false).unwrap();
        peer.set_nodelay(true).unwrap();
        (UpstreamConn::new(conn), peer)
    }

    /// Bytes or a close that reached the socket are found before reuse once
    /// the event loop has polled (the `yield_now`, which on tokio's
    /// scheduler comes back after a poll of the loop): the stray and the
    /// closed connections are discarded, the clean one is handed out, and
    /// a clean connection's check finds nothing to read.
    #[tokio::test]
    async fn bytes_or_a_close_the_event_loop_has_seen_keep_a_connection_from_reuse() {
        use std::io::Write as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let pool = ConnectionPool::new(
            address,
            Duration::from_secs(1),
            Duration::from_secs(1),
            BodyErrors::default(),
        );
        let (stray, mut stray_peer) = pair(&listener).await;
        let (closed, closed_peer) = pair(&listener).await;
        let (clean, _clean_peer) = pair(&listener).await;
        let now = Instant::now();
        pool.release(clean, true, now);
        pool.release(closed, true, now);
        pool.release(stray, true, now);
        assert_eq!(pool.idle_count(), 3);
        stray_peer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray")
            .unwrap();
        drop(closed_peer);
        // A wide margin for loopback delivery, then one turn of the loop.
        std::thread::sleep(Duration::from_millis(50));
        tokio::task::yield_now().await;
        let mut taken = pool
            .take_idle(Instant::now())
            .expect("the clean connection");
        assert_eq!(taken.idle_state(), IdleState::Open);
        assert_eq!(pool.idle_count(), 0);
        // An upstream seen sending stray bytes is not pooled any more.
        pool.release(taken, true, Instant::now());
        assert_eq!(pool.idle_count(), 0);
    }

    /// The check of a connection the event loop has not seen become
    /// readable makes no system call: bytes that reached the socket after
    /// the loop's last poll are not read by it (they are found once the
    /// loop has polled).
    #[tokio::test]
    async fn a_connection_with_no_readiness_event_is_not_probed() {
        use std::io::Write as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (mut conn, mut peer) = pair(&listener).await;
        peer.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // No await since the write: the loop has not polled, so no `recv`
        // was made (one would have taken the byte and said `Stray`).
        assert_eq!(conn.idle_state(), IdleState::Open);
        tokio::task::yield_now().await;
        assert_eq!(conn.idle_state(), IdleState::Stray);
    }

    #[tokio::test]
    async fn prune_closes_connections_the_upstream_closed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let pool = ConnectionPool::new(
            address.clone(),
            Duration::from_secs(1),
            Duration::from_secs(1),
            BodyErrors::default(),
        );
        let kept = TcpStream::connect(&address).await.unwrap();
        let (_kept_peer, _) = listener.accept().await.unwrap();
        let closed = TcpStream::connect(&address).await.unwrap();
        let (closed_peer, _) = listener.accept().await.unwrap();
        pool.release(UpstreamConn::new(closed), true, Instant::now());
        pool.release(UpstreamConn::new(kept), true, Instant::now());
        assert_eq!(pool.idle_count(), 2);
        drop(closed_peer);
        // The close reaches the socket's readiness through the event loop.
        for _ in 0..100 {
            if pool.prune() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(pool.idle_count(), 1, "only the open connection stays");
    }
}
