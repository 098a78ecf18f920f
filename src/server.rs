//! Listeners, the accept loop, per-connection protections and graceful drain.
//!
//! - **Connection cap**: the accept loop takes a permit before `accept`, so at
//!   `max_connections` further connections wait in the kernel backlog.
//! - **Accept errors** (e.g. out of file descriptors) back off and retry instead
//!   of ending the loop (as in mini-redis).
//! - **Slow clients**: a per-connection watchdog closes a connection whose
//!   request head is not complete within `header_read_timeout` (slowloris) and
//!   one idle between requests for `idle_timeout`. hyper's own header timer is
//!   off, because it also runs while a keep-alive connection is idle and would
//!   cap the idle time at the header timeout.
//! - **Reloads**: a new `listen` list is applied as soon as the generation
//!   changes: new addresses are bound, removed ones stop accepting (their open
//!   connections carry on).
//! - **Drain**: on shutdown the listeners close (new connections are refused),
//!   open connections finish their in-flight request with `Connection: close`,
//!   and the drain waits at most `shutdown_timeout`.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::app::App;
use crate::handler::{Downstream, handle};
use crate::proxy::body::Completion;

/// Binds every traffic listener of the configuration.
pub async fn bind(addresses: &[SocketAddr]) -> io::Result<Vec<TcpListener>> {
    let mut listeners = Vec::with_capacity(addresses.len());
    for address in addresses {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Serves `listeners` until `shutdown` turns true, then drains. Returns when
/// every connection has closed or `shutdown_timeout` has passed.
pub async fn serve(
    app: Arc<App>,
    listeners: Vec<TcpListener>,
    mut shutdown: watch::Receiver<bool>,
) {
    let limits = app.snapshot().config.server.clone();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    // Each connection task holds a sender; the drain ends when all are gone.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let mut accepting = Accepting {
        app: app.clone(),
        permits,
        shutdown: shutdown.clone(),
        alive: alive_tx,
        loops: HashMap::new(),
    };
    // Listeners are keyed by their configured address, in config order.
    for (address, listener) in limits.listen.iter().zip(listeners) {
        accepting.start(*address, listener);
    }
    let sweeper = tokio::spawn(sweep_idle_keys(app.clone()));
    let mut generations = app.subscribe_generations();
    // Wait for the shutdown signal, applying listener changes of reloads.
    while !*shutdown.borrow() {
        tokio::select! {
            changed = shutdown.changed() => if changed.is_err() { break },
            changed = generations.changed() => {
                if changed.is_err() {
                    break;
                }
                accepting.reconcile().await;
            }
        }
    }
    for (_, (stop, task)) in accepting.loops.drain() {
        let _ = stop.send(true);
        let _ = task.await;
    }
    drop(accepting);
    sweeper.abort();
    let timeout = app.snapshot().config.server.shutdown_timeout;
    if tokio::time::timeout(timeout, alive_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!(
            ?timeout,
            "shutdown timeout reached with connections still open"
        );
    }
}

/// The running accept loops, by configured address.
struct Accepting {
    app: Arc<App>,
    permits: Arc<Semaphore>,
    /// The drain signal, for connections.
    shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
    /// Per listener: its stop switch and its accept loop.
    loops: HashMap<SocketAddr, (watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
}

impl Accepting {
    fn start(&mut self, address: SocketAddr, listener: TcpListener) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(
            self.app.clone(),
            listener,
            self.permits.clone(),
            stop_rx,
            self.shutdown.clone(),
            self.alive.clone(),
        ));
        self.loops.insert(address, (stop_tx, task));
    }

    /// Applies a reloaded `listen` list: binds the new addresses, then closes
    /// the ones no longer listed (open connections on them carry on). A new
    /// address that cannot be bound is logged and skipped; nothing else changes.
    async fn reconcile(&mut self) {
        let wanted = self.app.snapshot().config.server.listen.clone();
        for address in &wanted {
            if self.loops.contains_key(address) {
                continue;
            }
            match TcpListener::bind(address).await {
                Ok(listener) => {
                    let bound = listener.local_addr().unwrap_or(*address);
                    tracing::info!(%bound, "listening on http://{bound} (added by reload)");
                    self.start(*address, listener);
                }
                Err(error) => {
                    tracing::error!(%address, %error, "reload: cannot listen on the new address; it is not served");
                }
            }
        }
        let gone: Vec<SocketAddr> = self
            .loops
            .keys()
            .filter(|a| !wanted.contains(a))
            .copied()
            .collect();
        for address in gone {
            if let Some((stop, task)) = self.loops.remove(&address) {
                let _ = stop.send(true);
                let _ = task.await;
                tracing::info!(%address, "stopped listening (removed by reload)");
            }
        }
    }
}

/// How often idle limiter keys are evicted. Keys back at full quota carry no
/// information, so evicting them bounds memory under floods of one-shot keys.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

async fn sweep_idle_keys(app: Arc<App>) {
    let mut interval = tokio::time::interval(SWEEP_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        // Sweeping locks one shard at a time; run it off the async workers.
        let app = app.clone();
        let removed = tokio::task::spawn_blocking(move || app.sweep())
            .await
            .unwrap_or(0);
        if removed > 0 {
            tracing::debug!(removed, "evicted idle limiter keys");
        }
    }
}

/// A connection slot and an accepted connection, or `None` once `stop`
/// fires. Accept errors (EMFILE and friends) back off and retry rather than
/// end the loop; `backoff` carries the current delay between calls.
pub(crate) async fn accept_next(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    stop: &mut watch::Receiver<bool>,
    backoff: &mut Duration,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.ok()?,
            _ = stop.changed() => return None,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return None,
        };
        match accepted {
            Ok((stream, peer)) => {
                *backoff = Duration::from_millis(5);
                return Some((stream, peer, permit));
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed; backing off");
                drop(permit);
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

async fn accept_loop(
    app: Arc<App>,
    listener: TcpListener,
    permits: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    let mut backoff = Duration::from_millis(5);
    while let Some((stream, peer, permit)) =
        accept_next(&listener, &permits, &mut stop, &mut backoff).await
    {
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let shutdown = shutdown.clone();
        let alive = alive.clone();
        tokio::spawn(async move {
            serve_connection(app, stream, peer, shutdown).await;
            drop(permit);
            drop(alive);
        });
    }
}

/// Activity of one connection, shared by its I/O wrapper, its requests and
/// its watchdog. Times are milliseconds since the connection was accepted.
#[derive(Debug)]
pub struct ConnActivity {
    started: Instant,
    /// Requests whose response has not ended yet.
    in_flight: AtomicU32,
    /// Last moment a request ended or bytes moved (idle clock).
    last_activity_ms: AtomicU64,
    /// When the first byte of a not-yet-complete request head arrived; 0 = none.
    head_started_ms: AtomicU64,
    /// Wakes the watchdog when a head starts, so its deadline is exact.
    head_started: tokio::sync::Notify,
}

impl ConnActivity {
    fn new() -> Self {
        ConnActivity {
            started: Instant::now(),
            in_flight: AtomicU32::new(0),
            last_activity_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
            head_started: tokio::sync::Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        // +1 so that 0 can mean "not set".
        self.started.elapsed().as_millis() as u64 + 1
    }

    fn bytes_read(&self) {
        // Only the first byte of a request head matters: while a request is
        // in flight the connection is not idle, and `request_finished` marks
        // the idle clock. So the clock is read about once per request.
        if self.in_flight.load(Ordering::Relaxed) != 0
            || self.head_started_ms.load(Ordering::Relaxed) != 0
        {
            return;
        }
        let now = self.now_ms();
        self.last_activity_ms.store(now, Ordering::Relaxed);
        // Once per request: the 0 → now transition wakes the watchdog.
        if self
            .head_started_ms
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.head_started.notify_one();
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started_ms.store(0, Ordering::Relaxed);
    }

    /// Called when a request's response body ends.
    pub fn request_finished(&self) {
        self.last_activity_ms
            .store(self.now_ms(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the watchdog decided.
enum Verdict {
    /// Check again at this instant.
    Later(Instant),
    /// Idle too long: close politely.
    Idle,
    /// Request head too slow: drop the connection.
    SlowHead,
}

fn watchdog(activity: &ConnActivity, header_timeout: Duration, idle_timeout: Duration) -> Verdict {
    let now = activity.now_ms();
    let at = |ms: u64| activity.started + Duration::from_millis(ms.saturating_sub(1));
    if activity.in_flight.load(Ordering::Relaxed) > 0 {
        return Verdict::Later(at(now) + idle_timeout);
    }
    let head = activity.head_started_ms.load(Ordering::Relaxed);
    if head != 0 {
        let deadline = head + header_timeout.as_millis() as u64;
        return if now >= deadline {
            Verdict::SlowHead
        } else {
            Verdict::Later(at(deadline))
        };
    }
    let deadline =
        activity.last_activity_ms.load(Ordering::Relaxed) + idle_timeout.as_millis() as u64;
    if now >= deadline {
        Verdict::Idle
    } else {
        Verdict::Later(at(deadline))
    }
}

async fn serve_connection(
    app: Arc<App>,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    let server = app.snapshot().config.server.clone();
    let activity = Arc::new(ConnActivity::new());
    let io = TokioIo::new(ActivityIo {
        inner: stream,
        activity: activity.clone(),
    });
    let downstream = Downstream {
        peer,
        proto: "http",
    };
    let service = {
        let activity = activity.clone();
        service_fn(move |request| {
            let app = app.clone();
            let activity = activity.clone();
            activity.request_started();
            async move {
                // Boxed on purpose: the handler's future holds the whole
                // forward step (upstream request, timeout timer) and is
                // kilobytes large. Inline, hyper moves it by value from
                // `service_fn` into its dispatcher on every request, and
                // those copies were the top user-space cost in a profile of
                // the allow path (memmove ~12% of user time; see
                // BENCHMARKS.md). One small allocation is cheaper.
                let (response, held) = Box::pin(handle(&app, downstream, request)).await;
                let completion = Completion {
                    connection: Some(activity),
                    permits: held.permits,
                };
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| body.with_completion(completion)),
                )
            }
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true)
        // Room for the largest allowed head; the handler answers 431 with
        // problem+json above `max_header_bytes`, hyper's own 431 is the backstop.
        .max_buf_size((server.max_header_bytes + 16 * 1024).max(8 * 1024));
    let connection = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    let mut draining = false;
    loop {
        let next_check = match watchdog(&activity, server.header_read_timeout, server.idle_timeout)
        {
            Verdict::Later(at) => at,
            Verdict::SlowHead => {
                tracing::debug!(%peer, "request head not complete in time; closing");
                return;
            }
            Verdict::Idle => {
                connection.as_mut().graceful_shutdown();
                draining = true;
                Instant::now() + server.shutdown_timeout
            }
        };
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "connection ended with an error");
                }
                return;
            }
            _ = shutdown.changed(), if !draining => {
                connection.as_mut().graceful_shutdown();
                draining = true;
            }
            _ = tokio::time::sleep_until(next_check), if !draining => {}
            _ = activity.head_started.notified(), if !draining => {}
        }
    }
}

/// A TCP stream that tells its [`ConnActivity`] when bytes arrive.
struct ActivityIo {
    inner: TcpStream,
    activity: Arc<ConnActivity>,
}

impl AsyncRead for ActivityIo {
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

impl AsyncWrite for ActivityIo {
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
