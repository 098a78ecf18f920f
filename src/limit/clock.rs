//! The only place in the limiter that reads the time.
//!
//! Every algorithm is a pure function of `now`, so the clock is injected: the
//! HTTP layer reads [`Clock::now`] once per request and passes the value down,
//! and tests drive a [`ManualClock`] instead of sleeping (or, end to end, a
//! [`TokioClock`] under tokio's paused clock).
//!
//! Time is [`Nanos`] since the Unix epoch because windows are aligned to the
//! epoch (a `"1m"` window starts at every whole minute of wall-clock time).
//! Wall-clock time can jump (NTP steps, a VM resuming), and a jump backwards
//! would hand out fresh windows or refill buckets twice. [`SystemClock`]
//! therefore reads `SystemTime` and a monotonic clock once, at construction,
//! and from then on reports `anchor + elapsed`: epoch-aligned at start,
//! monotonic after.
//!
//! The monotonic clock is `quanta`'s (the one governor uses): it reads the
//! CPU's invariant TSC where there is one, calibrated against
//! `CLOCK_MONOTONIC`, in ~10 ns where `std::time::Instant` took ~37 ns on the
//! benchmark machine — more than the token-bucket decision itself (see
//! BENCHMARKS.md). Without a usable TSC it falls back to `CLOCK_MONOTONIC`.
//! Two cores' counters may disagree by a few nanoseconds; the algorithms
//! treat a `now` slightly behind a key's state conservatively, so that is
//! harmless.
//!
//! Example: built at `SystemTime` = 1_700_000_000 s; 250 ms later (by the
//! monotonic clock) `now()` is `1_700_000_000_250_000_000`, even if the
//! system clock was stepped back meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Nanos;

/// A source of the current time in nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    fn now(&self) -> Nanos;
}

/// Epoch-aligned at construction, monotonic afterwards.
#[derive(Debug, Clone)]
pub struct SystemClock {
    /// Wall-clock time, in ns since the epoch, at the moment `start` was read.
    anchor: Nanos,
    /// The monotonic clock's raw reading at construction (TSC ticks, or
    /// nanoseconds without a usable TSC): elapsed time is one scaled
    /// difference of two raw readings, not two `Instant`s and a `Duration`.
    start: u64,
    monotonic: quanta::Clock,
}

impl SystemClock {
    pub fn new() -> Self {
        // A system clock set before 1970 is a broken host; starting at 0 keeps
        // the limiter working (windows are still consistent, only misaligned).
        let anchor = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let monotonic = quanta::Clock::new();
        SystemClock {
            anchor,
            start: monotonic.raw(),
            monotonic,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        // 0 for a reading behind `start` (another core's counter); u64
        // nanoseconds of elapsed time last 584 years: saturate, never wrap.
        let elapsed = self
            .monotonic
            .delta_as_nanos(self.start, self.monotonic.raw());
        self.anchor.saturating_add(elapsed)
    }
}

/// A clock that only moves when told to; for tests and simulation.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    pub fn new(now: Nanos) -> Self {
        ManualClock {
            now: AtomicU64::new(now),
        }
    }

    #[cfg(test)]
    pub(crate) fn set(&self, now: Nanos) {
        self.now.store(now, Ordering::Relaxed);
    }

    pub fn advance(&self, by: Nanos) {
        self.now.fetch_add(by, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Relaxed)
    }
}

/// tokio's clock (`tokio::time::Instant`), anchored at an epoch time given
/// at construction. With tokio's clock paused (`tokio::time::pause`, in
/// tests), the limiter's time moves exactly as far as tokio's timers do, so
/// an end-to-end test that waits for a window to pass waits for nothing.
#[derive(Debug, Clone)]
pub struct TokioClock {
    anchor: Nanos,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Reads `anchor` (ns since the epoch) now; call it inside a runtime
    /// when tokio's clock is paused, so both start together.
    pub fn starting_at(anchor: Nanos) -> Self {
        TokioClock {
            anchor,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        let elapsed = self.start.elapsed();
        self.anchor
            .saturating_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(5);
        assert_eq!(c.now(), 5);
        c.advance(10);
        assert_eq!(c.now(), 15);
        c.set(3);
        assert_eq!(c.now(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_moves_with_tokios_time() {
        let c = TokioClock::starting_at(7);
        assert_eq!(c.now(), 7);
        tokio::time::advance(std::time::Duration::from_millis(1500)).await;
        assert_eq!(c.now(), 7 + 1_500_000_000);
    }

    #[test]
    fn system_clock_is_epoch_aligned_and_monotonic() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        // After 2020-01-01: the anchor is wall-clock time, not boot time.
        assert!(a > 1_577_836_800 * crate::limit::NANOS_PER_SEC);
        assert!(b >= a);
    }
}
