//! Sliding log: the exact reference. One timestamp per admitted cost unit,
//! stored compactly as runs of `(timestamp, units)`.
//!
//! A request of cost `c` at `now` is admitted when the units logged in
//! `(now − window, now]` plus `c` are at most `limit`. Memory grows with the
//! limit (one run per admitted request at worst), so this is for small limits
//! and as the yardstick the approximations are tested against.
//!
//! Worked example, `limit = 3`, `window = 10 s`: requests at 0 s, 1 s, 2 s
//! pass (log `[(0,1), (1,1), (2,1)]`); at 5 s the log holds 3 units, so a
//! request is denied with `retry_after = 5 s` (the unit of 0 s leaves the
//! window at 10 s) and `reset_after = 5 s`; at 10 s it passes and the run of
//! 0 s is dropped.
//!
//! The decision ([`check`]) is pure; [`record`] appends the admitted units
//! and drops expired runs, [`unrecord`] takes back the newest units (to roll
//! back a stack that another limit denied). Timestamps are kept
//! non-decreasing: a `now` slightly behind the newest run (two threads read
//! the clock, then lock in the other order) is logged at the newest run's
//! time, which only makes the unit leave a few nanoseconds later.

use std::collections::VecDeque;

use super::Nanos;
use super::verdict::Verdict;

/// A key's log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// `(timestamp, units)`, oldest first, timestamps non-decreasing.
    runs: VecDeque<(Nanos, u64)>,
    /// Sum of the units of `runs` (expired ones included until dropped).
    total: u64,
}

/// A unit logged at `ts` is inside the window at `now` iff `ts > now − window`.
fn expired(ts: Nanos, now: Nanos, window: Nanos) -> bool {
    ts.saturating_add(window) <= now
}

impl State {
    /// The live runs at `now`, oldest first, and the units they hold.
    fn live(&self, now: Nanos, window: Nanos) -> (impl Iterator<Item = &(Nanos, u64)>, u64) {
        let mut dead = 0;
        let mut skip = 0;
        for &(ts, n) in &self.runs {
            if !expired(ts, now, window) {
                break;
            }
            dead += n;
            skip += 1;
        }
        (self.runs.iter().skip(skip), self.total - dead)
    }

    /// Units in the window at `now`.
    pub fn used(&self, now: Nanos, window: Nanos) -> u64 {
        self.live(now, window).1
    }

    /// Runs held (memory use is proportional).
    #[cfg(test)]
    pub(crate) fn runs(&self) -> usize {
        self.runs.len()
    }
}

/// Decide a request of `cost` at `now` (pure). If it is admitted, the caller
/// records it with [`record`].
pub fn check(state: &State, now: Nanos, cost: u64, limit: u64, window: Nanos) -> Verdict {
    let (live, used) = state.live(now, window);
    let never = cost > limit;
    let allowed = !never && used.saturating_add(cost) <= limit;
    let after = if allowed { used + cost } else { used };
    let remaining = limit.saturating_sub(after);
    let mut live = live.peekable();
    // `t`: until the oldest logged unit leaves (the one just admitted if the
    // log was empty); 0 when nothing is logged.
    let oldest = live.peek().map(|&&(ts, _)| ts);
    let reset_after = match oldest {
        Some(ts) => ts.saturating_add(window).saturating_sub(now),
        None if after > 0 => window,
        None => 0,
    };
    if allowed {
        return Verdict::allow(remaining, reset_after);
    }
    // Units to free: used + cost − limit. Walk the runs until enough leave.
    let mut to_free = used.saturating_add(cost).saturating_sub(limit);
    let mut retry = 0;
    if !never {
        for &(ts, n) in live {
            retry = ts.saturating_add(window).saturating_sub(now);
            if n >= to_free {
                break;
            }
            to_free -= n;
        }
    }
    Verdict::deny(remaining, reset_after, retry, never)
}

/// Log `cost` units at `now`, dropping runs that left the window.
pub fn record(state: &mut State, now: Nanos, cost: u64, window: Nanos) {
    while let Some(&(ts, n)) = state.runs.front() {
        if !expired(ts, now, window) {
            break;
        }
        state.runs.pop_front();
        state.total -= n;
    }
    if cost == 0 {
        return;
    }
    state.total = state.total.saturating_add(cost);
    match state.runs.back_mut() {
        Some((ts, n)) if *ts >= now => *n = n.saturating_add(cost),
        _ => state.runs.push_back((now, cost)),
    }
}

/// Take back the newest `cost` units (a refund, or a stack roll-back).
pub(crate) fn unrecord(state: &mut State, mut cost: u64) {
    while cost > 0 {
        let Some((_, n)) = state.runs.back_mut() else {
            break;
        };
        let take = cost.min(*n);
        *n -= take;
        state.total -= take;
        cost -= take;
        if *n == 0 {
            state.runs.pop_back();
        }
    }
}

/// Nothing logged inside the window: the key can be forgotten.
pub(crate) fn is_fresh(state: &State, now: Nanos, window: Nanos) -> bool {
    state.used(now, window) == 0
}

/// Post-response settlement: log extra units at `now` (up to the limit) or
/// refund the newest ones.
pub(crate) fn adjust(state: &mut State, now: Nanos, delta: i64, limit: u64, window: Nanos) {
    if delta >= 0 {
        let room = limit.saturating_sub(state.used(now, window));
        record(state, now, delta.unsigned_abs().min(room), window);
    } else {
        unrecord(state, delta.unsigned_abs());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::NANOS_PER_SEC;

    const S: Nanos = NANOS_PER_SEC;

    fn hit(s: &mut State, now: Nanos, cost: u64) -> Verdict {
        let v = check(s, now, cost, 3, 10 * S);
        if v.allowed {
            record(s, now, cost, 10 * S);
        }
        v
    }

    #[test]
    fn worked_example() {
        let mut s = State::default();
        let t0 = 1_000 * S;
        for i in 0..3 {
            assert!(hit(&mut s, t0 + i * S, 1).allowed);
        }
        let v = hit(&mut s, t0 + 5 * S, 1);
        assert!(!v.allowed);
        assert_eq!(
            (v.retry_after, v.reset_after, v.remaining),
            (Some(5 * S), 5 * S, 0)
        );
        // Cost 2 needs two units to leave: the second leaves at 11 s.
        let v = hit(&mut s, t0 + 5 * S, 2);
        assert_eq!(v.retry_after, Some(6 * S));
        assert!(hit(&mut s, t0 + 10 * S, 1).allowed);
        assert_eq!(s.runs(), 3, "the run of 0 s was dropped");
    }

    #[test]
    fn runs_merge_and_unrecord() {
        let mut s = State::default();
        record(&mut s, 5, 2, 100);
        record(&mut s, 5, 1, 100);
        record(&mut s, 4, 1, 100); // behind: merged into the newest run
        assert_eq!((s.runs(), s.used(5, 100)), (1, 4));
        record(&mut s, 6, 1, 100);
        unrecord(&mut s, 2);
        assert_eq!((s.runs(), s.used(6, 100)), (1, 3));
        assert!(is_fresh(&s, 105, 100));
    }

    #[test]
    fn never_has_no_retry() {
        let v = check(&State::default(), 0, 4, 3, S);
        assert!(v.never && v.retry_after.is_none());
    }
}
