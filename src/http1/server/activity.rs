//! What a connection's reads and requests tell its watchdog: a record of
//! activity shared by the connection's I/O, its requests (the fast path's,
//! hyper's, and the pipeline's response bodies, which mark a request's end)
//! and the connection layer's watchdog, which reads it to enforce the
//! header and idle timeouts. It lives with the server codec so the pipeline
//! can mark a request's end without naming the connection layer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::time::Instant;

use super::Closing;
use super::linger::LingerSwitch;

/// Activity of one connection, shared by its I/O wrapper, its requests and
/// its watchdog. Times are milliseconds since the connection was accepted.
///
/// The watchdog is never woken by traffic: it sleeps to the earliest moment
/// any deadline could fall (see `watchdog`) and looks at these marks when
/// it wakes. A request costs a few relaxed atomics, not a timer.
#[derive(Debug)]
pub struct ConnActivity {
    pub(crate) started: Instant,
    /// Requests whose response has not ended yet.
    pub(crate) in_flight: AtomicU32,
    /// Last moment a request ended or bytes moved (idle clock).
    pub(crate) last_activity_ms: AtomicU64,
    /// When the first byte of a not-yet-complete request head arrived; 0 = none.
    pub(crate) head_started_ms: AtomicU64,
    /// Draining or idle too long: the response in progress is the last.
    pub(crate) closing: AtomicBool,
    /// Off once the connection is handed to a tunnel (see [`linger`](super::linger)).
    pub(crate) linger: LingerSwitch,
    /// The gate of a handed-off connection waits for the requests in flight
    /// to be answered before it passes an upgrade ([`super::gate::Answered`]);
    /// rare, so a lock, taken only when `answer_awaited` is set.
    answer_awaited: AtomicBool,
    answer_waker: parking_lot::Mutex<Option<std::task::Waker>>,
}

impl ConnActivity {
    pub(crate) fn new() -> Self {
        ConnActivity {
            started: Instant::now(),
            in_flight: AtomicU32::new(0),
            last_activity_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            linger: LingerSwitch::default(),
            answer_awaited: AtomicBool::new(false),
            answer_waker: parking_lot::Mutex::new(None),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        // +1 so that 0 can mean "not set".
        self.started.elapsed().as_millis() as u64 + 1
    }

    pub(crate) fn bytes_read(&self) {
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
        self.head_started_ms.store(now, Ordering::Relaxed);
    }

    pub(crate) fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started_ms.store(0, Ordering::Relaxed);
    }

    /// The connection now belongs to an upgrade's tunnel: its shutdown must
    /// not linger (the tunnel still reads from it).
    pub(crate) fn handed_to_tunnel(&self) {
        self.linger.turn_off();
    }

    /// Marks the connection as closing; true when nothing is in progress on
    /// it (no request, no head begun), so it can be closed right away.
    pub(crate) fn begin_closing(&self) -> bool {
        self.closing.store(true, Ordering::Relaxed);
        self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_started_ms.load(Ordering::Relaxed) == 0
    }

    /// Called when a request's response body ends.
    pub(crate) fn request_finished(&self) {
        self.last_activity_ms
            .store(self.now_ms(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.answer_awaited.load(Ordering::SeqCst) {
            self.answer_awaited.store(false, Ordering::SeqCst);
            if let Some(waker) = self.answer_waker.lock().take() {
                waker.wake();
            }
        }
    }
}

/// A handed-off connection's gate asks whether every request is answered.
pub(crate) struct ActivityAnswered(pub(crate) Arc<ConnActivity>);

impl super::gate::Answered for ActivityAnswered {
    fn poll_answered(&self, cx: &mut Context<'_>) -> Poll<()> {
        let activity = &self.0;
        if activity.in_flight.load(Ordering::SeqCst) == 0 {
            return Poll::Ready(());
        }
        *activity.answer_waker.lock() = Some(cx.waker().clone());
        activity.answer_awaited.store(true, Ordering::SeqCst);
        // A request that ended in between would not have seen the flag.
        if activity.in_flight.load(Ordering::SeqCst) == 0 {
            activity.answer_awaited.store(false, Ordering::SeqCst);
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Closing for ConnActivity {
    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }
}
