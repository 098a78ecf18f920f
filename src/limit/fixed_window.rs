//! Fixed window: one counter per key, reset at window boundaries aligned to
//! the Unix epoch.
//!
//! The cheapest algorithm and the least exact: a request of cost `c` is
//! admitted when `used + c <= limit`, and `used` drops to 0 at every boundary,
//! so a client can pass `limit` just before a boundary and `limit` again just
//! after: up to 2 × limit within a short time (contract §2; `simulate` shows
//! it). Use the sliding window when that matters.
//!
//! Worked example, `limit = 100`, `window = 60 s`: 100 requests at
//! 10:00:59.900 fill window 10:00 (`count` 100, the 101st is denied with
//! `retry_after` = 100 ms); 100 more at 10:01:00.100 start window 10:01 at 0
//! and all pass — 200 in 200 ms.
//!
//! State is the window's index (`now / window`) and its count: 16 bytes.

use super::Nanos;
use super::verdict::{Verdict, sat_nanos, settle};

/// A key's counter: `count` units charged in window number `window`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Index of the window the count belongs to: its start / window length.
    pub window: u64,
    pub count: u64,
}

/// The window index and the units already used in it at `now`. A `now` a
/// little behind the state's window (two threads read the clock, then lock
/// in the other order) counts in the state's window: the conservative choice.
fn current(state: State, now: Nanos, window: Nanos) -> (u64, u64, Nanos) {
    let w = window.max(1);
    let idx = now / w;
    if state.window > idx {
        let end = (u128::from(state.window) + 1) * u128::from(w);
        return (state.window, state.count, sat_nanos(end - u128::from(now)));
    }
    let used = if state.window == idx { state.count } else { 0 };
    // Until the end of the window, at least 1 ns.
    (idx, used, w - now % w)
}

/// Decide a request of `cost` at `now`; the returned state is to be stored
/// only if the verdict admits.
pub fn decide(state: State, now: Nanos, cost: u64, limit: u64, window: Nanos) -> (State, Verdict) {
    let (idx, used, reset_in) = current(state, now, window);
    let never = cost > limit;
    let after = used.saturating_add(cost);
    if !never && after <= limit {
        let t = if after == 0 { 0 } else { reset_in };
        let next = State {
            window: idx,
            count: after,
        };
        return (next, Verdict::allow(limit - after, t));
    }
    let t = if used == 0 { 0 } else { reset_in };
    let verdict = Verdict::deny(limit.saturating_sub(used), t, reset_in, never);
    (state, verdict)
}

/// Nothing charged in the current window: the key can be forgotten.
pub fn is_fresh(state: State, now: Nanos, window: Nanos) -> bool {
    current(state, now, window).1 == 0
}

/// Post-response settlement: charge (`delta > 0`) or refund in the current
/// window, keeping `0 <= count <= limit`.
pub fn adjust(state: State, now: Nanos, delta: i64, limit: u64, window: Nanos) -> State {
    let (idx, used, _) = current(state, now, window);
    State {
        window: idx,
        count: settle(used, delta, limit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::NANOS_PER_SEC;

    const S: Nanos = NANOS_PER_SEC;
    const MS: Nanos = 1_000_000;

    /// Run `n` requests of cost 1 at `now`; returns how many passed.
    fn burst(state: &mut State, now: Nanos, n: u64, limit: u64, window: Nanos) -> u64 {
        let mut passed = 0;
        for _ in 0..n {
            let (next, v) = decide(*state, now, 1, limit, window);
            if v.allowed {
                *state = next;
                passed += 1;
            }
        }
        passed
    }

    #[test]
    fn boundary_burst_lets_twice_the_limit_through() {
        // The documented weakness: 100/min, 100 at :59.900 and 100 at :00.100.
        let (limit, window) = (100, 60 * S);
        let boundary = 1_700_000_040 * S; // a multiple of 60 s
        assert_eq!(boundary % window, 0);
        let mut s = State::default();
        assert_eq!(burst(&mut s, boundary - 100 * MS, 150, limit, window), 100);
        assert_eq!(burst(&mut s, boundary + 100 * MS, 150, limit, window), 100);
    }

    #[test]
    fn header_numbers_and_retry() {
        let (limit, window) = (5, 10 * S);
        let now = 1_000 * S + 3 * S;
        let mut s = State::default();
        let (n, v) = decide(s, now, 2, limit, window);
        assert!(v.allowed);
        assert_eq!(
            (v.remaining, v.reset_after, v.retry_after),
            (3, 7 * S, None)
        );
        s = n;
        let (_, v) = decide(s, now, 4, limit, window);
        assert!(!v.allowed && !v.never);
        assert_eq!(
            (v.remaining, v.reset_after, v.retry_after),
            (3, 7 * S, Some(7 * S))
        );
        // Empty window: t = 0 (nothing to wait for).
        let (_, v) = decide(s, now + 7 * S, 0, limit, window);
        assert_eq!((v.remaining, v.reset_after), (5, 0));
    }

    #[test]
    fn cost_above_limit_is_never() {
        let (_, v) = decide(State::default(), 0, 6, 5, S);
        assert!(!v.allowed && v.never);
        assert_eq!(v.retry_after, None);
    }

    #[test]
    fn late_now_counts_in_the_newer_window() {
        let s = State {
            window: 11,
            count: 5,
        };
        // now is in window 10, a hair behind: still full.
        let (_, v) = decide(s, 11 * S - 1, 1, 5, S);
        assert!(!v.allowed);
    }

    #[test]
    fn adjust_clamps() {
        let s = State {
            window: 3,
            count: 4,
        };
        assert_eq!(adjust(s, 3 * S, 10, 5, S).count, 5);
        assert_eq!(adjust(s, 3 * S, -10, 5, S).count, 0);
        assert!(is_fresh(s, 4 * S, S));
        assert!(!is_fresh(s, 3 * S, S));
    }
}
