//! The per-connection watchdog: what watches a connection while a protocol
//! serves it — eviction at `max_connections` ([`super::evict`]), the drain
//! ([`super::drain`]), and the deadlines of slow request heads and idle
//! connections. One loop, [`Watchdog::serve`], for the three ways a
//! connection is served (the fast path, hyper's HTTP/1.1 after a hand-off,
//! hyper's HTTP/2); each protocol brings only its own way to close.
//!
//! Each wake-up of the connection's task polls, in this order: the serving
//! future; the eviction flag; then, unless the protocol was already asked
//! to close, the drain and the watchdog's timer. The timer holds the task's
//! waker once polled, so it is polled again only once it has fired, not on
//! every wake-up of a busy connection (two or three per request).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::config::ServerConfig;
use crate::conn::drain::DrainWatch;
use crate::http1::server::ConnActivity;
use crate::metrics::Metrics;

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

    pub(crate) fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_ms.into())
    }

    pub(crate) fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_ms.into())
    }

    pub(crate) fn max_header_bytes(&self) -> usize {
        self.max_header_bytes as usize
    }

    /// When a new connection's watchdog looks first: no deadline can fall
    /// before it.
    pub(crate) fn first_check(&self) -> Duration {
        self.header_read_timeout().min(self.idle_timeout())
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

/// One connection's watchdog, kept across a hand-off from one protocol to
/// the next (the fast path to hyper), so a drain seen by the first is
/// carried to the second.
///
/// It borrows what the connection's task holds anyway (its activity, the
/// drain watch, the timer): the task of every connection carries it, idle
/// or not, so it is kept to a few words.
pub(crate) struct Watchdog<'a> {
    activity: &'a ConnActivity,
    metrics: &'a Metrics,
    limits: ConnLimits,
    /// For the log lines.
    peer: &'a SocketAddr,
    drain: &'a mut DrainWatch,
    /// One timer for the connection's life, moved only when it fires.
    check: Pin<&'a mut Sleep>,
    /// The protocol was asked to close politely. Carried over a hand-off,
    /// the next protocol is asked at once.
    closing: bool,
    /// The protocol being served is still to be asked to close: it started
    /// while the connection was closing.
    ask: bool,
    /// Whether `check` holds this task's waker: it then wakes the task when
    /// it fires, and is polled only once it has (`is_elapsed`).
    armed: bool,
}

impl<'a> Watchdog<'a> {
    /// A watchdog of `activity`'s connection under `limits`, with `check`
    /// its timer; `closing` when the protocol it serves must be asked to close
    /// as soon as it starts (the server already drains).
    pub(crate) fn new(
        activity: &'a ConnActivity,
        metrics: &'a Metrics,
        limits: ConnLimits,
        peer: &'a SocketAddr,
        drain: &'a mut DrainWatch,
        closing: bool,
        check: Pin<&'a mut Sleep>,
    ) -> Watchdog<'a> {
        Watchdog {
            activity,
            metrics,
            limits,
            peer,
            drain,
            check,
            closing,
            ask: false,
            armed: false,
        }
    }

    /// The settings the connection was accepted with.
    pub(crate) fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    /// Whether the protocol was asked to close, for one that keeps a
    /// watchdog of its own (HTTP/2 after h2c's hand-off).
    pub(crate) fn is_closing(&self) -> bool {
        self.closing
    }

    /// Serves `serving` until it ends on its own (`Some` of its output), or
    /// until the watchdog ends the connection (`None`): evicted (counted and
    /// logged here), or `close` answered [`Shutdown::Now`]. `close` is the
    /// protocol's way to close, given the serving future and why.
    ///
    /// No allocation and a few words of state: the future borrows the
    /// watchdog and `serving`, which live in the connection's task.
    pub(crate) fn serve<'w, F: Future>(
        &'w mut self,
        mut serving: Pin<&'w mut F>,
        mut close: impl FnMut(Pin<&mut F>, Closing) -> Shutdown + 'w,
    ) -> impl Future<Output = Option<F::Output>> + 'w {
        // A protocol that starts while the connection closes is asked at
        // once, before its first poll.
        self.ask = self.closing;
        self.armed = false;
        std::future::poll_fn(move |cx| {
            if std::mem::take(&mut self.ask)
                && close(serving.as_mut(), Closing::Politely) == Shutdown::Now
            {
                return Poll::Ready(None);
            }
            loop {
                if let Poll::Ready(output) = serving.as_mut().poll(cx) {
                    return Poll::Ready(Some(output));
                }
                if self.activity.evicted() {
                    tracing::debug!(peer = %self.peer, "idle connection closed to make room at max_connections");
                    self.metrics.record_connection_evicted();
                    return Poll::Ready(None);
                }
                if self.closing {
                    return Poll::Pending;
                }
                let why = if Pin::new(&mut *self.drain).poll(cx).is_ready() {
                    Closing::Politely
                } else if self.armed && !self.check.is_elapsed() {
                    return Poll::Pending;
                } else {
                    // Outside the cooperative budget: `serving` may have
                    // used it up (a burst of pipelined requests), and a
                    // timer polled without budget stays unregistered — the
                    // connection would never be checked again.
                    let unbudgeted = tokio::task::unconstrained(self.check.as_mut());
                    if std::pin::pin!(unbudgeted).poll(cx).is_pending() {
                        self.armed = true;
                        return Poll::Pending;
                    }
                    self.armed = false;
                    match deadlines(self.activity, &self.limits) {
                        Due::Later(at) => {
                            self.check.as_mut().reset(at);
                            continue;
                        }
                        Due::SlowHead => {
                            tracing::debug!(peer = %self.peer, "request head not complete in time; closing");
                            Closing::SlowHead
                        }
                        Due::Idle => Closing::Politely,
                    }
                };
                match close(serving.as_mut(), why) {
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
    /// Check again at this instant.
    Later(Instant),
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
    let (header_timeout, idle_timeout) = (limits.header_read_timeout(), limits.idle_timeout());
    let now = activity.now_ms();
    let at = |ms: u64| activity.started + Duration::from_millis(ms.saturating_sub(1));
    let soonest_head_deadline = at(now) + header_timeout;
    if activity.in_flight.load(Ordering::Relaxed) > 0 {
        return Due::Later(soonest_head_deadline);
    }
    let head = activity.head_started_ms.load(Ordering::Relaxed);
    if head != 0 {
        let deadline = head + header_timeout.as_millis() as u64;
        return if now >= deadline {
            Due::SlowHead
        } else {
            Due::Later(at(deadline))
        };
    }
    let deadline =
        activity.last_activity_ms.load(Ordering::Relaxed) + idle_timeout.as_millis() as u64;
    if now >= deadline {
        Due::Idle
    } else {
        Due::Later(at(deadline).min(soonest_head_deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    use crate::conn::drain::Drain;

    const HEADER: Duration = Duration::from_secs(1);
    const IDLE: Duration = Duration::from_secs(5);

    fn limits() -> ConnLimits {
        ConnLimits::new(HEADER, IDLE, 8 * 1024)
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
        let (activity, metrics, drain) = (ConnActivity::new(), Metrics::new(), Drain::new(1));
        let (mut watch, peer) = (drain.watch(0), "127.0.0.1:1".parse().unwrap());
        let check = std::pin::pin!(tokio::time::sleep(HEADER));
        let mut watchdog = Watchdog::new(
            &activity,
            &metrics,
            limits(),
            &peer,
            &mut watch,
            false,
            check,
        );
        activity.bytes_read();
        let start = Instant::now();
        let asked = RefCell::new(Vec::new());
        let serving = std::pin::pin!(std::future::pending::<()>());
        let served = watchdog.serve(serving, |_, why| {
            asked.borrow_mut().push(why);
            Shutdown::Now
        });
        assert_eq!(served.await, None);
        assert_eq!(*asked.borrow(), [Closing::SlowHead]);
        assert!(start.elapsed() >= HEADER);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_asked_politely_once_and_served_to_its_end() {
        let (activity, metrics, drain) = (ConnActivity::new(), Metrics::new(), Drain::new(1));
        let (mut watch, peer) = (drain.watch(0), "127.0.0.1:1".parse().unwrap());
        let check = std::pin::pin!(tokio::time::sleep(HEADER));
        let mut watchdog = Watchdog::new(
            &activity,
            &metrics,
            limits(),
            &peer,
            &mut watch,
            false,
            check,
        );
        served(&activity);
        let start = Instant::now();
        let (closed, asked) = (Cell::new(false), RefCell::new(Vec::new()));
        let serving = std::pin::pin!(until(&closed));
        let served = watchdog.serve(serving, |_, why| {
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
        let (activity, metrics, drain) = (ConnActivity::new(), Metrics::new(), Drain::new(1));
        let (mut watch, peer) = (drain.watch(0), "127.0.0.1:1".parse().unwrap());
        let check = std::pin::pin!(tokio::time::sleep(HEADER));
        let mut watchdog = Watchdog::new(
            &activity,
            &metrics,
            limits(),
            &peer,
            &mut watch,
            false,
            check,
        );
        let events = RefCell::new(Vec::new());
        // The first protocol: asked when the drain starts, ends with its
        // request in flight answered.
        let closed = Cell::new(false);
        drain.start();
        let serving = std::pin::pin!(until(&closed));
        let first = watchdog.serve(serving, |_, why| {
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
        let second = watchdog.serve(serving, |_, why| {
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
        let (activity, metrics, drain) = (ConnActivity::new(), Metrics::new(), Drain::new(1));
        let (mut watch, peer) = (drain.watch(0), "127.0.0.1:1".parse().unwrap());
        let check = std::pin::pin!(tokio::time::sleep(HEADER));
        let mut watchdog = Watchdog::new(
            &activity,
            &metrics,
            limits(),
            &peer,
            &mut watch,
            false,
            check,
        );
        served(&activity);
        assert!(activity.request_eviction());
        let serving = std::pin::pin!(std::future::pending::<()>());
        let served = watchdog.serve(serving, |_, why| panic!("asked: {why:?}"));
        assert_eq!(served.await, None);
        assert!(
            metrics
                .encode()
                .contains("tollgate_connections_evicted_total 1\n"),
            "{}",
            metrics.encode()
        );
    }
}
