//! What a connection's reads and requests tell its watchdog: a record of
//! activity shared by the connection's I/O, its requests (the fast path's,
//! hyper's, and the pipeline's response bodies, which mark a request's end)
//! and the connection layer's watchdog, which reads it to enforce the
//! header and idle timeouts. It lives with the server codec so the pipeline
//! can mark a request's end without naming the connection layer.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tokio::time::Instant;

use super::Closing;
use super::linger::LingerSwitch;

/// Activity of one connection, shared by its I/O wrapper, its requests and
/// its watchdog. Times are milliseconds since the connection was accepted.
///
/// The watchdog is never woken by traffic: it asks to be looked at again at
/// the earliest moment any deadline could fall ([`ConnActivity::check_at`]),
/// its worker's sweep wakes it then (`conn::sweep`: one timer per worker,
/// not one per connection), and it reads these marks. A request costs a few
/// relaxed atomics, not a timer.
#[derive(Debug)]
pub(crate) struct ConnActivity {
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
    /// rare, so a lock ([`Rare::answer_waker`]), taken only when this is set.
    answer_awaited: AtomicBool,
    /// Why the connection's task was woken by someone else: [`EVICT`]
    /// (asked to close if idle, to make room at `max_connections`, see
    /// [`ConnActivity::request_eviction`]) and [`DUE`] (its deadlines are
    /// to be looked at, [`ConnActivity::wake_if_due`]). One load on every
    /// wake-up reads both.
    flags: AtomicU8,
    /// When the watchdog is to look at the deadlines next, in
    /// [`ConnActivity::now_ms`]'s milliseconds; [`NOT_SCHEDULED`] when it
    /// was woken for it and has not asked again yet. 32 bits: it fits in
    /// what the other fields leave of the allocation (a connection past 49
    /// days is looked at on every sweep).
    check_at: AtomicU32,
    /// The connection task's waker, stored once when the connection starts
    /// (a task's waker does not change): how an eviction or the sweep
    /// reaches an idle connection, which nothing else polls. Locked when
    /// the connection starts and when it is woken so, never per request.
    task: parking_lot::Mutex<Option<std::task::Waker>>,
    /// Whether interim (1xx) heads are relayed: set while the fast path
    /// serves the connection (HTTP/1.1 clients only; hyper's servers have no
    /// way to send them).
    relay_interim: AtomicBool,
    /// Interim heads are queued ([`Rare::interim`]): known without taking
    /// the lock (a 1xx is rare: the lock is for them, never for a plain
    /// request).
    interim_waiting: AtomicBool,
    /// What few connections use, made by the first use: every connection,
    /// idle ones included, would carry its room (~70 bytes) otherwise.
    rare: RareCell,
}

/// [`ConnActivity::flags`]: asked to close if idle.
const EVICT: u8 = 1;
/// [`ConnActivity::flags`]: the deadlines are due to be looked at.
const DUE: u8 = 2;
/// [`ConnActivity::check_at`]: no look asked for.
const NOT_SCHEDULED: u32 = u32::MAX;

/// A [`Rare`] made by its first use: one pointer, null until then. (A
/// `OnceLock<Box<Rare>>` takes two words, and with it `ConnActivity` took
/// 88 bytes: 104 behind its `Arc`, which the allocator rounds to 112; 80
/// bytes round to 96.)
#[derive(Debug, Default)]
struct RareCell(AtomicPtr<Rare>);

// `AtomicPtr` is `Send` and `Sync` whatever it points to: what the cell
// shares between threads must be both.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<Rare>();
};

impl RareCell {
    fn get(&self) -> Option<&Rare> {
        // SAFETY: non-null only once it points to the `Rare` this cell
        // owns (set once below, freed only by `Drop`), published with
        // `Release` and read with `Acquire`.
        unsafe { self.0.load(Ordering::Acquire).as_ref() }
    }

    fn get_or_init(&self) -> &Rare {
        if let Some(rare) = self.get() {
            return rare;
        }
        let made = Box::into_raw(Box::<Rare>::default());
        match self.0.compare_exchange(
            std::ptr::null_mut(),
            made,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: `made` is now the cell's, alive until its `Drop`.
            Ok(_) => unsafe { &*made },
            Err(first) => {
                // Made by another thread in between: its stays.
                // SAFETY: `made` was never published; `first` is the
                // cell's, as in `get`.
                unsafe {
                    drop(Box::from_raw(made));
                    &*first
                }
            }
        }
    }
}

impl Drop for RareCell {
    fn drop(&mut self) {
        let rare = *self.0.get_mut();
        if !rare.is_null() {
            // SAFETY: made by `Box::into_raw` in `get_or_init`, owned by
            // this cell alone, and no reference to it outlives `&self`.
            drop(unsafe { Box::from_raw(rare) });
        }
    }
}

/// The parts of a connection's activity that few connections use.
#[derive(Debug, Default)]
struct Rare {
    /// The waker of a gate waiting for the requests in flight to be
    /// answered.
    answer_waker: parking_lot::Mutex<Option<std::task::Waker>>,
    /// The request the codec refused (the connection closes after it), for
    /// the connection's metrics and log.
    refused: OnceLock<super::Refusal>,
    /// Interim heads queued by the upstream exchange and not written yet.
    interim: parking_lot::Mutex<Vec<u8>>,
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
            flags: AtomicU8::new(0),
            check_at: AtomicU32::new(NOT_SCHEDULED),
            task: parking_lot::Mutex::new(None),
            relay_interim: AtomicBool::new(false),
            interim_waiting: AtomicBool::new(false),
            rare: RareCell::default(),
        }
    }

    /// Turns the relaying of interim heads on (the fast path serves) or off.
    pub(crate) fn relay_interim(&self, on: bool) {
        self.relay_interim.store(on, Ordering::Relaxed);
    }

    /// Queues an interim head for the client, if this connection relays
    /// them; called from within the connection's task.
    pub(crate) fn queue_interim(&self, head: &[u8]) {
        if !self.relay_interim.load(Ordering::Relaxed) {
            return;
        }
        self.rare().interim.lock().extend_from_slice(head);
        self.interim_waiting.store(true, Ordering::Release);
    }

    /// The rarely used parts, made now if they were not yet.
    fn rare(&self) -> &Rare {
        self.rare.get_or_init()
    }

    /// Remembers the connection task's waker, for evictions.
    pub(crate) fn set_task(&self, waker: &std::task::Waker) {
        *self.task.lock() = Some(waker.clone());
    }

    /// Whether nothing is in progress: no request in flight, no head begun.
    fn is_between_requests(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_started_ms.load(Ordering::Relaxed) == 0
    }

    /// When this connection went idle, if it is an idle keep-alive one that
    /// may be evicted: it has served a request (a connection that has sent
    /// nothing yet may be a client whose first request is on its way), has
    /// none in progress, is not closing or asked to already, and is no
    /// upgrade's tunnel.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        let last = self.last_activity_ms.load(Ordering::Relaxed);
        if last == 0
            || !self.is_between_requests()
            || self.closing.load(Ordering::Relaxed)
            || self.flags.load(Ordering::Relaxed) & EVICT != 0
            || self.linger.is_off()
        {
            return None;
        }
        Some(self.started + std::time::Duration::from_millis(last - 1))
    }

    /// Asks the connection to close if it is still idle when it looks (its
    /// task is woken for it). False when it was asked already.
    pub(crate) fn request_eviction(&self) -> bool {
        if self.flags.fetch_or(EVICT, Ordering::SeqCst) & EVICT != 0 {
            return false;
        }
        self.wake_task();
        true
    }

    fn wake_task(&self) {
        if let Some(waker) = self.task.lock().as_ref() {
            waker.wake_by_ref();
        }
    }

    /// Read by the connection's task on each wake-up (one relaxed load):
    /// whether anyone woke it with something to look at (an eviction, its
    /// deadlines due); [`ConnActivity::evicted`] and
    /// [`ConnActivity::take_due`] then say which.
    #[inline]
    pub(crate) fn woken_for_something(&self) -> bool {
        self.flags.load(Ordering::Relaxed) != 0
    }

    /// True when the connection was asked to close and is idle, so it
    /// closes now. A connection that turned busy meanwhile is left alone
    /// (and may be asked again once idle).
    pub(crate) fn evicted(&self) -> bool {
        if self.flags.load(Ordering::Relaxed) & EVICT == 0 {
            return false;
        }
        if self.is_between_requests() {
            return true;
        }
        self.flags.fetch_and(!EVICT, Ordering::SeqCst);
        false
    }

    /// Asks to be woken once [`ConnActivity::now_ms`] reaches `at_ms` (by
    /// the worker's sweep, at its granularity: never before).
    pub(crate) fn check_at(&self, at_ms: u64) {
        let at = u32::try_from(at_ms).unwrap_or(NOT_SCHEDULED - 1);
        self.check_at.store(at, Ordering::Relaxed);
    }

    /// The sweep's look at this connection at `now_ms` (its
    /// [`ConnActivity::ms_at`]): when the watchdog's look is due, marks it
    /// [`DUE`] and wakes the task (once: it asks again when it has looked).
    /// Otherwise the moment it is due, in `now_ms`'s milliseconds, if one
    /// is asked for.
    pub(crate) fn wake_if_due(&self, now_ms: u64) -> Option<u64> {
        let at = self.check_at.load(Ordering::Relaxed);
        if at == NOT_SCHEDULED {
            return None;
        }
        if now_ms < u64::from(at) {
            return Some(u64::from(at));
        }
        self.check_at.store(NOT_SCHEDULED, Ordering::Relaxed);
        self.flags.fetch_or(DUE, Ordering::Release);
        self.wake_task();
        None
    }

    /// Whether the sweep woke the task to look at the deadlines (then the
    /// mark is cleared).
    pub(crate) fn take_due(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & DUE != 0
            && self.flags.fetch_and(!DUE, Ordering::Acquire) & DUE != 0
    }

    /// `at` in [`ConnActivity::now_ms`]'s milliseconds.
    pub(crate) fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_millis() as u64 + 1
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
            if let Some(waker) = self.rare().answer_waker.lock().take() {
                waker.wake();
            }
        }
    }
}

impl ConnActivity {
    /// The request the codec refused (the fast path or, after a hand-off,
    /// the gate), if it refused one.
    pub(crate) fn refusal(&self) -> Option<&super::Refusal> {
        self.rare.get()?.refused.get()
    }
}

/// A handed-off connection's gate asks whether every request is answered.
pub(crate) struct ActivityAnswered(pub(crate) Arc<ConnActivity>);

impl super::gate::Answered for ActivityAnswered {
    fn refused(&self, refusal: super::Refusal) {
        Closing::refused(&*self.0, refusal);
    }

    fn poll_answered(&self, cx: &mut Context<'_>) -> Poll<()> {
        let activity = &self.0;
        if activity.in_flight.load(Ordering::SeqCst) == 0 {
            return Poll::Ready(());
        }
        *activity.rare().answer_waker.lock() = Some(cx.waker().clone());
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

    fn interim_waiting(&self) -> bool {
        self.interim_waiting.load(Ordering::Acquire)
    }

    /// Inlined: this runs once per response, nearly always to find
    /// nothing (a call, its frame set up for the lock, was ~18 instructions
    /// a response, `bench/instructions.sh`).
    #[inline(always)]
    fn take_interim(&self, out: &mut Vec<u8>) {
        // A plain load first: a swap is a locked instruction.
        if self.interim_waiting.load(Ordering::Relaxed) {
            self.take_queued_interim(out);
        }
    }

    fn refused(&self, refusal: super::Refusal) {
        // A connection refuses once: it closes after.
        let _ = self.rare().refused.set(refusal);
    }
}

impl ConnActivity {
    /// [`Closing::take_interim`] once interim heads were queued. Out of
    /// line: a 1xx is rare.
    #[cold]
    #[inline(never)]
    fn take_queued_interim(&self, out: &mut Vec<u8>) {
        if !self.interim_waiting.swap(false, Ordering::Acquire) {
            return;
        }
        let mut queued = self.rare().interim.lock();
        out.extend_from_slice(&queued);
        queued.clear();
        if queued.capacity() > 4096 {
            queued.shrink_to(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection, idle or not, holds one (behind an `Arc`): what
    /// few use is boxed away ([`Rare`]). Raise the bound only knowingly.
    #[test]
    fn a_connection_s_activity_stays_small() {
        let size = std::mem::size_of::<ConnActivity>();
        assert!(size <= 80, "ConnActivity is {size} bytes");
    }

    #[test]
    fn the_rare_parts_work_when_first_used() {
        let activity = ConnActivity::new();
        assert!(activity.refusal().is_none());
        activity.relay_interim(true);
        activity.queue_interim(b"HTTP/1.1 103 Early Hints\r\n\r\n");
        assert!(activity.interim_waiting());
        let mut out = Vec::new();
        activity.take_interim(&mut out);
        assert_eq!(out, b"HTTP/1.1 103 Early Hints\r\n\r\n");
        assert!(!activity.interim_waiting());
    }
}
