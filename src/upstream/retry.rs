//! Upstream retries: when to try again, how long to wait, and the budget that
//! keeps retries from multiplying an outage.
//!
//! A route opts in with `retry = { attempts, on, base, cap, budget }`
//! ([`RetryPolicy`]); the pipeline runs the attempts (`proxy::handler`), this
//! module decides:
//!
//! - **Delay: full jitter.** Retry `n` (0 for the first) waits a uniformly
//!   random time in `[0, min(cap, base × 2^n)]` ([`full_jitter`]): spread
//!   out, so the clients of a failing upstream do not come back in step. An
//!   upstream's `Retry-After` replaces the draw when it is shorter than what
//!   is left of the request's time; a longer one ends the retries.
//! - **Budget.** Over the last 10 s a route's retries stay within `budget`
//!   (a share) of its client requests, plus a floor of one retry per second
//!   ([`RetryBudget`], as Finagle's retry budget): against a dead upstream
//!   a 20 % budget adds at most a fifth more traffic, not `attempts` times
//!   as much. Ten one-second slots of atomic counters: no lock on the
//!   request path.
//!
//! Which requests may be retried at all (idempotent methods, or one with an
//! `Idempotency-Key`; a body that can be sent again; nothing relayed to the
//! client yet) is the pipeline's call, as it holds the request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub(crate) use crate::config::RetryPolicy;
/// Nanoseconds on the gateway's clock (the limiter clock's unit, which the
/// pipeline passes in).
type Nanos = u64;
const NANOS_PER_SEC: Nanos = 1_000_000_000;

impl RetryPolicy {
    /// The bound of retry `n`'s delay: `min(cap, base × 2^n)`.
    pub(crate) fn bound(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// Whether a response of `status` is retried.
    pub(crate) fn retries_status(&self, status: u16) -> bool {
        self.on_status.contains(&status)
    }
}

/// A uniformly random delay in `[0, bound]`; `draw(n)` returns a uniform
/// integer in `[0, n]` (injected, so tests can check the distribution).
pub(crate) fn full_jitter(bound: Duration, draw: impl FnOnce(u64) -> u64) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(draw(nanos).min(nanos))
}

/// The process's uniform draw for [`full_jitter`].
pub(crate) fn draw(n: u64) -> u64 {
    fastrand::u64(0..=n)
}

/// The wait before a retry: the upstream's `Retry-After` if it fits in
/// `left`, else the jittered delay if that fits; `None`: do not retry.
pub(crate) fn wait_before(
    jittered: Duration,
    retry_after: Option<Duration>,
    left: Duration,
) -> Option<Duration> {
    match retry_after {
        Some(after) if after < left => Some(after),
        Some(_) => None,
        None => (jittered < left).then_some(jittered),
    }
}

/// Seconds of history the budget looks at.
const WINDOW_SECS: u64 = 10;

/// Retries allowed in the window whatever the traffic: one per second.
const FLOOR: u64 = WINDOW_SECS;

/// A route's retry budget over the last ten seconds.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    permille: u64,
    slots: [Slot; WINDOW_SECS as usize],
}

/// One second of the window: which second it holds, and its counts.
#[derive(Debug, Default)]
struct Slot {
    second: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

impl RetryBudget {
    pub(crate) fn new(permille: u64) -> RetryBudget {
        RetryBudget {
            permille,
            slots: Default::default(),
        }
    }

    /// The slot of `now`'s second, emptied first if it held an older second.
    /// Two requests racing over a slot's turn may lose a count: the budget
    /// is a bound on load, not an exact ledger.
    fn slot(&self, now: Nanos) -> &Slot {
        let second = now / NANOS_PER_SEC;
        let slot = &self.slots[(second % WINDOW_SECS) as usize];
        let held = slot.second.load(Ordering::Relaxed);
        if held != second
            && slot
                .second
                .compare_exchange(held, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            slot.requests.store(0, Ordering::Relaxed);
            slot.retries.store(0, Ordering::Relaxed);
        }
        slot
    }

    /// Counts one client request of the route.
    pub(crate) fn record_request(&self, now: Nanos) {
        self.slot(now).requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry from the budget if it has room; `false`: over budget.
    pub(crate) fn try_spend(&self, now: Nanos) -> bool {
        let current = self.slot(now);
        let second = now / NANOS_PER_SEC;
        let (mut requests, mut retries) = (0, 0);
        for slot in &self.slots {
            let held = slot.second.load(Ordering::Relaxed);
            if held <= second && second - held < WINDOW_SECS {
                requests += slot.requests.load(Ordering::Relaxed);
                retries += slot.retries.load(Ordering::Relaxed);
            }
        }
        let allowed = requests.saturating_mul(self.permille) / 1000 + FLOOR;
        if retries >= allowed {
            return false;
        }
        current.retries.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// `Retry-After` as a wait: delay-seconds, or an HTTP date (from `now`).
pub(crate) fn parse_retry_after(value: &[u8], now: std::time::SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NANOS_PER_SEC;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 2,
            on_connect: true,
            on_status: vec![502, 503, 504, 429],
            base: Duration::from_millis(25),
            cap: Duration::from_secs(1),
            budget_permille: 200,
        }
    }

    #[test]
    fn bounds_double_up_to_the_cap() {
        let p = policy();
        assert_eq!(p.bound(0), Duration::from_millis(25));
        assert_eq!(p.bound(1), Duration::from_millis(50));
        assert_eq!(p.bound(5), Duration::from_millis(800));
        assert_eq!(p.bound(6), Duration::from_secs(1));
        assert_eq!(p.bound(40), Duration::from_secs(1), "no overflow");
    }

    #[test]
    fn full_jitter_covers_zero_to_the_bound_evenly() {
        let bound = Duration::from_millis(100);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut bins = [0u32; 10];
        let draws = 20_000;
        for _ in 0..draws {
            let wait = full_jitter(bound, |n| rng.u64(0..=n));
            assert!(wait <= bound);
            let bin = (wait.as_nanos() * 10 / (bound.as_nanos() + 1)) as usize;
            bins[bin] += 1;
        }
        let expected = draws / 10;
        for (i, count) in bins.iter().enumerate() {
            let off = (*count as i64 - expected as i64).unsigned_abs();
            assert!(
                off * 10 < expected as u64,
                "bin {i}: {count} of {draws} ({bins:?})"
            );
        }
        // The extremes are reachable.
        assert_eq!(full_jitter(bound, |_| 0), Duration::ZERO);
        assert_eq!(full_jitter(bound, |n| n), bound);
        assert_eq!(
            full_jitter(bound, |n| n + 5),
            bound,
            "a draw past n is clamped"
        );
    }

    #[test]
    fn retry_after_wins_when_it_fits() {
        let jitter = Duration::from_millis(10);
        let left = Duration::from_secs(2);
        assert_eq!(
            wait_before(jitter, Some(Duration::from_secs(1)), left),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            wait_before(jitter, Some(Duration::from_secs(3)), left),
            None
        );
        assert_eq!(wait_before(jitter, None, left), Some(jitter));
        assert_eq!(wait_before(jitter, None, Duration::from_millis(5)), None);
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(parse_retry_after(b" 3 ", now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(
            parse_retry_after(later.as_bytes(), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(parse_retry_after(b"soon", now), None);
    }

    #[test]
    fn the_budget_is_a_share_of_requests_plus_a_floor() {
        let budget = RetryBudget::new(200);
        let t0 = 1_700_000_000 * S;
        // No traffic yet: the floor alone, ten in ten seconds.
        let spent = (0..50).filter(|_| budget.try_spend(t0)).count();
        assert_eq!(spent, 10);
        // 100 requests over the next seconds make room for 20 more.
        for i in 0..100 {
            budget.record_request(t0 + (i % 5) * S);
        }
        let spent = (0..50).filter(|_| budget.try_spend(t0 + 4 * S)).count();
        assert_eq!(spent, 20);
        // Ten seconds later the old seconds have left the window.
        let spent = (0..50).filter(|_| budget.try_spend(t0 + 15 * S)).count();
        assert_eq!(spent, 10);
    }
}
