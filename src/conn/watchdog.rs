//! The per-connection watchdog: what watches a connection while a protocol
//! serves it — eviction at `max_connections` ([`super::evict`]), the drain
//! ([`super::drain`]), and the deadlines of slow request heads and idle
//! connections. One loop, [`Watchdog::serve`], for the three ways a
//! connection is served (the fast path, hyper's HTTP/1.1 after a hand-off,
//! hyper's HTTP/2); each protocol brings only its own way to close.
//!
//! Each wake-up of the connection's task polls, in this order: the serving
//! future; then, when the task was woken for it (one load of its activity's
//! flags), the eviction; then, unless the protocol was already asked to
//! close, the drain and the deadlines. The connection has no timer of its
//! own: it asks its worker's sweep ([`super::sweep`]) to wake it when the
//! next deadline could fall, at the sweep's granularity (never before the
//! deadline, at most [`super::sweep::MOST`] after it).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use crate::app::App;
use crate::config::ServerConfig;
use crate::conn::drain::DrainWatch;
use crate::http1::server::ConnActivity;
use crate::proxy::handler::Downstream;

/// The settings a connection reads, copied at accept (a reload applies to
/// connections accepted after it).
///
/// Kept in whole milliseconds and bytes, 32 bits each: every connection's
/// task, idle or not, carries a copy in its watchdog (12 bytes, against 40
/// as two `Duration`s and a `usize`). A timeout longer than `u32::MAX` ms
/// (49 days) is that long; a head limit over 4 GiB is 4 GiB.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    header_read_ms: u32,
    idle_ms: u32,
    max_header_bytes: u32,
}

impl ConnLimits {
    pub(crate) fn of(server: &ServerConfig) -> ConnLimits {
        ConnLimits::new(
            server.header_read_timeout,
            server.idle_timeout,
            server.max_header_bytes,
        )
    }

    pub(crate) fn new(
        header_read_timeout: Duration,
        idle_timeout: Duration,
        max_header_bytes: usize,
    ) -> ConnLimits {
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        ConnLimits {
            header_read_ms: ms(header_read_timeout),
            idle_ms: ms(idle_timeout),
            max_header_bytes: u32::try_from(max_header_bytes).unwrap_or(u32::MAX),
        }
    }

    pub(crate) fn max_header_bytes(&self) -> usize {
        self.max_header_bytes as usize
    }

    fn header_read_ms(&self) -> u64 {
        self.header_read_ms.into()
    }

    fn idle_ms(&self) -> u64 {
        self.idle_ms.into()
    }

    /// How long after its start a new connection's watchdog looks first:
    /// no deadline can fall before it.
    fn first_check_ms(&self) -> u64 {
        self.header_read_ms().min(self.idle_ms())
    }
}

/// Why the watchdog asks the protocol to close its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closing {
    /// The server drains, or the connection was idle for `idle_timeout`:
    /// finish what is in flight, then close.
    Politely,
    /// A request head not complete within `header_read_timeout`.
    SlowHead,
}

/// What the protocol did when asked to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shutdown {
    /// It closes once what is in flight is done: it is served on, and no
    /// longer watched for the drain or the timer.
    Begun,
    /// Nothing to wait for: the connection is dropped now.
    Now,
}

/// What a connection's task holds for as long as it is open, idle or not,
/// kept once and lent as a whole: its watchdog and its request handler
/// each borrow it with one pointer (the watchdog borrowing each part took
/// five, the handler's closure three).
pub(crate) struct ConnParts {
    pub(crate) app: Arc<App>,
    pub(crate) activity: Arc<ConnActivity>,
    pub(crate) limits: ConnLimits,
    /// The peer's address and port: 20 bytes with the flag below, where a
    /// `SocketAddr` takes 32 (an IPv6 peer's flow label and scope, which
    /// nothing reads, are not kept).
    ip: IpAddr,
    port: u16,
    /// Served over TLS (`"https"` for the forwarding fields): a flag, not
    /// a `&str` of 16 bytes.
    https: bool,
}

impl ConnParts {
    /// The parts of `activity`'s connection from `peer`, under the
    /// settings of `app`'s configuration now.
    pub(crate) fn new(
        app: Arc<App>,
        activity: Arc<ConnActivity>,
        peer: SocketAddr,
        https: bool,
    ) -> ConnParts {
        // Only what the connection reads of its settings: a copy of the
        // whole server section would be kept (with its allocations) as
        // long as the connection, idle or not.
        let limits = ConnLimits::of(&app.snapshot().config.server);
        ConnParts {
            app,
            activity,
            limits,
            ip: peer.ip(),
            port: peer.port(),
            https,
        }
    }

    /// The client's address.
    #[inline]
    pub(crate) fn peer(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    /// The connection as its requests' handler sees it.
    #[inline]
    pub(crate) fn downstream(&self) -> Downstream {
        Downstream {
            peer: self.peer(),
            proto: if self.https { "https" } else { "http" },
        }
    }
}

/// One connection's watchdog, kept across a hand-off from one protocol to
/// the next (the fast path to hyper), so a drain seen by the first is
/// carried to the second.
///
/// It borrows what the connection's task holds anyway (its parts, the
/// drain watch): the task of every connection carries it, idle or not, so
/// it is kept to a few words.
pub(crate) struct Watchdog<'a> {
    conn: &'a ConnParts,
    drain: &'a mut DrainWatch,
    /// The protocol was asked to close politely. Carried over a hand-off,
    /// the next protocol is asked at once.
    closing: bool,
    /// The protocol being served is still to be asked to close: it started
    /// while the connection was closing.
    ask: bool,
}

impl<'a> Watchdog<'a> {
    /// A watchdog of `conn`'s connection; `closing` when the protocol it
    /// serves must be asked to close as soon as it starts (the server
    /// already drains). Its first look at the deadlines is asked of the
    /// sweep now (no deadline can fall before it).
    pub(crate) fn new(
        conn: &'a ConnParts,
        drain: &'a mut DrainWatch,
        closing: bool,
    ) -> Watchdog<'a> {
        let activity = &conn.activity;
        activity.check_at(activity.now_ms() + conn.limits.first_check_ms());
        Watchdog {
            conn,
            drain,
            closing,
            ask: false,
        }
    }

    /// The parts of the connection watched.
    pub(crate) fn conn(&self) -> &'a ConnParts {
        self.conn
    }

    /// Whether the protocol was asked to close, for one that keeps a
    /// watchdog of its own (HTTP/2 after h2c's hand-off).
    pub(crate) fn is_closing(&self) -> bool {
        self.closing
    }

    /// Serves `serving` until it ends on its own (`Some` of its output), or
    /// until the watchdog ends the connection (`None`): evicted (counted and
    /// logged here), or `close` answered [`Shutdown::Now`]. `close` is the
    /// protocol's way to close, given the serving future, why, and the
    /// connection's activity (so that it need not hold it: the closure
    /// lives in every connection's task).
    ///
    /// No allocation and a few words of state: the future borrows the
    /// watchdog and `serving`, which live in the connection's task.
    pub(crate) fn serve<'w, F: Future>(
        &'w mut self,
        mut serving: Pin<&'w mut F>,
        mut close: impl FnMut(Pin<&mut F>, Closing, &ConnActivity) -> Shutdown + 'w,
    ) -> impl Future<Output = Option<F::Output>> + 'w {
        // A protocol that starts while the connection closes is asked at
        // once, before its first poll.
        self.ask = self.closing;
        std::future::poll_fn(move |cx| {
            let conn = self.conn;
            let activity = &*conn.activity;
            if std::mem::take(&mut self.ask)
                && close(serving.as_mut(), Closing::Politely, activity) == Shutdown::Now
            {
                return Poll::Ready(None);
            }
            loop {
                if let Poll::Ready(output) = serving.as_mut().poll(cx) {
                    return Poll::Ready(Some(output));
                }
                // Nobody woke the task but its own I/O (every wake-up of a
                // busy connection): one load, and the drain's below.
                let woken = activity.woken_for_something();
                if woken && activity.evicted() {
                    tracing::debug!(peer = %conn.peer(), "idle connection closed to make room at max_connections");
                    conn.app.metrics().record_connection_evicted();
                    return Poll::Ready(None);
                }
                if self.closing {
                    return Poll::Pending;
                }
                let why = if Pin::new(&mut *self.drain).poll(cx).is_ready() {
                    Closing::Politely
                } else if !(woken && activity.take_due()) {
                    return Poll::Pending;
                } else {
                    match deadlines(activity, &conn.limits) {
                        Due::Later(at) => {
                            activity.check_at(at);
                            return Poll::Pending;
                        }
                        Due::SlowHead => {
                            tracing::debug!(peer = %conn.peer(), "request head not complete in time; closing");
                            Closing::SlowHead
                        }
                        Due::Idle => Closing::Politely,
                    }
                };
                match close(serving.as_mut(), why, activity) {
                    Shutdown::Now => return Poll::Ready(None),
                    Shutdown::Begun => self.closing = true,
                }
            }
        })
    }
}

/// Stores the connection task's waker in `activity`, for an eviction to
/// wake it (see [`super::evict`]); the watchdog then reads the flag on every
/// wake-up and registers nothing.
pub(crate) async fn register_task(activity: &ConnActivity) {
    std::future::poll_fn(|cx| {
        activity.set_task(cx.waker());
        Poll::Ready(())
    })
    .await;
}

/// What [`deadlines`] decided.
enum Due {
    /// Look again at this moment ([`ConnActivity::now_ms`]'s milliseconds).
    Later(u64),
    /// Idle too long: close politely.
    Idle,
    /// Request head too slow: drop the connection.
    SlowHead,
}

/// Decides on a connection's deadlines, and when to look again.
///
/// A head that starts at `t` must be complete by `t + header_timeout`, and
/// `t` is never earlier than now; so looking again no later than `now +
/// header_timeout` can never miss a head's deadline, however many requests
/// come and go meanwhile — which is why traffic needs no wake-up.
fn deadlines(activity: &ConnActivity, limits: &ConnLimits) -> Due {
    let (header_ms, idle_ms) = (limits.header_read_ms(), limits.idle_ms());
    let now = activity.now_ms();
    let soonest_head_deadline = now + header_ms;
    if activity.in_flight.load(Ordering::Relaxed) > 0 {
        return Due::Later(soonest_head_deadline);
    }
    let head = activity.head_started_ms.load(Ordering::Relaxed);
    if head != 0 {
        let deadline = head + header_ms;
        return if now >= deadline {
            Due::SlowHead
        } else {
            Due::Later(deadline)
        };
    }
    let deadline = activity.last_activity_ms.load(Ordering::Relaxed) + idle_ms;
    if now >= deadline {
        Due::Idle
    } else {
        Due::Later(deadline.min(soonest_head_deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::sync::Arc;

    use tokio::time::Instant;

    use crate::conn::drain::Drain;
    use crate::conn::evict::{Registered, Registry};
    use crate::conn::sweep::sweep;

    /// `activity`'s connection, run by this task, in a registry whose
    /// sweep runs until the returned guard is dropped.
    async fn swept(activity: &Arc<ConnActivity>) -> (Registered, tokio::task::JoinHandle<()>) {
        register_task(activity).await;
        let registry = Registry::new(1);
        let registered = registry.register(0, activity.clone());
        (registered, tokio::spawn(sweep(registry, 0)))
    }

    const HEADER: Duration = Duration::from_secs(1);
    const IDLE: Duration = Duration::from_secs(5);

    /// A connection's parts, under [`HEADER`] and [`IDLE`].
    fn parts() -> ConnParts {
        let config = crate::config::Config::from_bytes(
            std::path::Path::new("gateway.toml"),
            b"[server]\nlisten = \"127.0.0.1:0\"\n[upstreams.api]\nurl = \"http://127.0.0.1:9\"\n\
              [[routes]]\nname = \"all\"\nmatch = { path_prefix = \"/\" }\nupstream = \"api\"\n",
        )
        .unwrap();
        let mut conn = ConnParts::new(
            App::new(config),
            Arc::new(ConnActivity::new()),
            "127.0.0.1:1".parse().unwrap(),
            false,
        );
        conn.limits = ConnLimits::new(HEADER, IDLE, 8 * 1024);
        conn
    }

    /// A request served on `activity`: the connection is idle from now.
    fn served(activity: &ConnActivity) {
        activity.bytes_read();
        activity.request_started();
        activity.request_finished();
    }

    /// A serving future that ends once `closed` is set.
    fn until(closed: &Cell<bool>) -> impl Future<Output = &'static str> + '_ {
        std::future::poll_fn(move |_| {
            if closed.get() {
                Poll::Ready("closed")
            } else {
                Poll::Pending
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_head_is_closed_as_the_protocol_answers() {
        let (conn, drain) = (parts(), Drain::new(1));
        let (activity, mut watch) = (&conn.activity, drain.watch(0));
        let _sweep = swept(activity).await;
        let mut watchdog = Watchdog::new(&conn, &mut watch, false);
        activity.bytes_read();
        let start = Instant::now();
        let asked = RefCell::new(Vec::new());
        let serving = std::pin::pin!(std::future::pending::<()>());
        let served = watchdog.serve(serving, |_, why, _| {
            asked.borrow_mut().push(why);
            Shutdown::Now
        });
        assert_eq!(served.await, None);
        assert_eq!(*asked.borrow(), [Closing::SlowHead]);
        assert!(start.elapsed() >= HEADER);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_asked_politely_once_and_served_to_its_end() {
        let (conn, drain) = (parts(), Drain::new(1));
        let (activity, mut watch) = (&conn.activity, drain.watch(0));
        let _sweep = swept(activity).await;
        let mut watchdog = Watchdog::new(&conn, &mut watch, false);
        served(activity);
        let start = Instant::now();
        let (closed, asked) = (Cell::new(false), RefCell::new(Vec::new()));
        let serving = std::pin::pin!(until(&closed));
        let served = watchdog.serve(serving, |_, why, _| {
            asked.borrow_mut().push(why);
            closed.set(true);
            Shutdown::Begun
        });
        assert_eq!(served.await, Some("closed"));
        // Looked at after the header timeout, closed after the idle one.
        assert_eq!(*asked.borrow(), [Closing::Politely]);
        assert!(start.elapsed() >= IDLE);
        assert!(watchdog.is_closing());
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_seen_before_a_hand_off_asks_the_next_protocol_before_its_first_poll() {
        let (conn, drain) = (parts(), Drain::new(1));
        let (activity, mut watch) = (&conn.activity, drain.watch(0));
        let _sweep = swept(activity).await;
        let mut watchdog = Watchdog::new(&conn, &mut watch, false);
        let events = RefCell::new(Vec::new());
        // The first protocol: asked when the drain starts, ends with its
        // request in flight answered.
        let closed = Cell::new(false);
        drain.start();
        let serving = std::pin::pin!(until(&closed));
        let first = watchdog.serve(serving, |_, why, _| {
            events.borrow_mut().push(("first asked", why));
            closed.set(true);
            Shutdown::Begun
        });
        assert_eq!(first.await, Some("closed"));
        // The second is asked before anything else happens to it.
        let polled = Cell::new(false);
        let serving = std::pin::pin!(std::future::poll_fn(|_| {
            polled.set(true);
            Poll::Ready(())
        }));
        let second = watchdog.serve(serving, |_, why, _| {
            assert!(!polled.get(), "asked before its first poll");
            events.borrow_mut().push(("second asked", why));
            Shutdown::Begun
        });
        assert_eq!(second.await, Some(()));
        assert_eq!(
            *events.borrow(),
            [
                ("first asked", Closing::Politely),
                ("second asked", Closing::Politely)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_connection_ends_counted_without_asking_the_protocol() {
        let (conn, drain) = (parts(), Drain::new(1));
        let (activity, mut watch) = (&conn.activity, drain.watch(0));
        let _sweep = swept(activity).await;
        let mut watchdog = Watchdog::new(&conn, &mut watch, false);
        served(activity);
        assert!(activity.request_eviction());
        let serving = std::pin::pin!(std::future::pending::<()>());
        let served = watchdog.serve(serving, |_, why, _| panic!("asked: {why:?}"));
        assert_eq!(served.await, None);
        assert!(
            conn.app
                .metrics()
                .encode()
                .contains("tollgate_connections_evicted_total 1\n"),
            "{}",
            conn.app.metrics().encode()
        );
    }
}
