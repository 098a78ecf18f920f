//! Sliding window counter: two fixed-window counters, the previous one
//! weighted by the part of it still inside the sliding window.
//!
//! At offset `e` into the current window of length `W`, the estimate is
//! `used = previous × (W − e) / W + current`, and a request of cost `c` is
//! admitted when `used + c <= limit`. Everything is compared multiplied by `W`
//! in u128, so the test is exact (no float, no rounding before comparing).
//!
//! Worked example, `limit = 100`, `W = 60 s`: at 10:01:15 (`e` = 15 s, a
//! quarter in), `previous = 100`, `current = 20`: `used = 100 × 45/60 + 20 =
//! 95`, so 5 more units pass. At 10:01:00.100, just after a boundary with 100
//! in the previous window, `used ≈ 99.8`: the fixed window's 2 × limit burst
//! across the boundary does not happen.
//!
//! # Error bound
//!
//! The estimate assumes the previous window's traffic was spread evenly. For
//! any interval `(t − W, t]`, with `t` at offset `e` of window `k`, `P` the
//! units charged in window `k − 1` and `P_tail` those of them inside the
//! interval, the units admitted in the interval are at most
//!
//! `limit + P_tail − P × (W − e) / W`  (≤ `limit + P × e / W` < 2 × limit),
//!
//! so it is exact for evenly spread traffic and only over-admits by how much
//! the previous window's traffic was bunched at its end. (Proof: the last
//! admission at offset `e' <= e` saw `P(W − e') + C·W <= limit·W` with `C` the
//! current count after it, and `P(W − e) <= P(W − e')`.) The property test in
//! `tests/limit_props.rs` checks exactly this inequality.
//!
//! State: window index and two 32-bit counts, 16 bytes — which keeps every
//! key's slot in the store at 40 bytes. The counts never exceed `limit`, and
//! configuration validation keeps a sliding window's `limit` within `u32`.

use super::Nanos;
use super::verdict::{Verdict, div, sat_nanos, settle};

/// A key's two counters, `current` belonging to window number `window`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub(crate) window: u64,
    pub(crate) previous: u32,
    pub(crate) current: u32,
}

/// The largest `limit` a sliding window can hold (its counts are `u32`).
pub(crate) const MAX_LIMIT: u64 = u32::MAX as u64;

/// A count that is at most `limit <= MAX_LIMIT`, as stored.
fn count(v: u128) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The counters rolled forward to `now`: (window index, offset in it,
/// previous, current). A `now` behind the state's window is taken as the
/// start of that window (conservative; see `fixed_window`).
fn rolled(state: State, now: Nanos, w: Nanos) -> (u64, u128, u128, u128) {
    let idx = now / w;
    if state.window > idx {
        return (
            state.window,
            0,
            u128::from(state.previous),
            u128::from(state.current),
        );
    }
    let e = u128::from(now % w);
    let (p, c) = if state.window == idx {
        (state.previous, state.current)
    } else if state.window + 1 == idx {
        (state.current, 0)
    } else {
        (0u32, 0u32)
    };
    (idx, e, u128::from(p), u128::from(c))
}

/// Smallest wait `d >= 0` after offset `e` such that the estimate leaves room
/// for `need` units (`need <= limit`), given counts `p`, `c`.
fn wait_for(p: u128, c: u128, e: u128, w: u128, limit: u128, need: u128) -> u128 {
    // In this window: p·(W − x) + c·W <= (limit − need)·W, for x in [e, W).
    if let Some(room) = limit.checked_sub(need + c) {
        let x = if p == 0 {
            e
        } else {
            w.saturating_sub(div(room * w, p)).max(e)
        };
        if x < w {
            return x - e;
        }
    }
    // In the next one, `c` has become the previous count and current is 0:
    // c·(W − y) <= (limit − need)·W.
    let room = limit.saturating_sub(need);
    let y = if c == 0 {
        0
    } else {
        w.saturating_sub(div(room * w, c))
    };
    (w - e) + y
}

/// Decide a request of `cost` at `now`; store the returned state only if the
/// verdict admits.
pub fn decide(state: State, now: Nanos, cost: u64, limit: u64, window: Nanos) -> (State, Verdict) {
    let w64 = window.max(1);
    let (idx, e, p, c) = rolled(state, now, w64);
    let (w, l, k) = (u128::from(w64), u128::from(limit), u128::from(cost));
    let never = cost > limit;
    // Both sides multiplied by W: p·(W − e) + (c + cost)·W <= limit·W.
    let weighted = p * (w - e);
    let allowed = !never && weighted + (c + k) * w <= l * w;
    let c_after = if allowed { c + k } else { c };
    let remaining = div((l * w).saturating_sub(weighted + c_after * w), w);
    let reset_after = if remaining >= l {
        0
    } else {
        sat_nanos(wait_for(p, c_after, e, w, l, remaining + 1))
    };
    let remaining = sat_nanos(remaining);
    if allowed {
        let next = State {
            window: idx,
            previous: count(p),
            current: count(c_after),
        };
        (next, Verdict::allow(remaining, reset_after))
    } else {
        let retry = if never {
            0
        } else {
            sat_nanos(wait_for(p, c, e, w, l, k))
        };
        (state, Verdict::deny(remaining, reset_after, retry, never))
    }
}

/// Both counters are out of the sliding window: the key can be forgotten.
pub(crate) fn is_fresh(state: State, now: Nanos, window: Nanos) -> bool {
    let (_, _, p, c) = rolled(state, now, window.max(1));
    p == 0 && c == 0
}

/// Post-response settlement on the current counter, kept in `0..=limit`.
pub(crate) fn adjust(state: State, now: Nanos, delta: i64, limit: u64, window: Nanos) -> State {
    let (idx, _, p, c) = rolled(state, now, window.max(1));
    State {
        window: idx,
        previous: count(p),
        current: count(u128::from(settle(sat_nanos(c), delta, limit))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::NANOS_PER_SEC;
    use crate::limit::verdict::burst;

    const S: Nanos = NANOS_PER_SEC;
    const MS: Nanos = 1_000_000;

    #[test]
    fn no_boundary_burst() {
        // Same traffic as fixed_window's boundary test: 150 at :59.900 and
        // 150 at :00.100. The sliding window passes limit + a tiny error.
        let (limit, window) = (100, 60 * S);
        let boundary = 1_700_000_040 * S;
        let mut s = State::default();
        let first = burst(decide, &mut s, boundary - 100 * MS, 150, limit, window);
        let second = burst(decide, &mut s, boundary + 100 * MS, 150, limit, window);
        assert_eq!(first, 100);
        // Estimate at +100 ms: 100 × 59.9/60 = 99.83 → no whole unit fits.
        assert_eq!(second, 0);
        // The bound: limit + P·e/W = 100 + 100 × 0.1/60 < 101.
        assert!(first + second <= limit + 1);
    }

    #[test]
    fn worked_example() {
        let (limit, window) = (100, 60 * S);
        let start = 1_700_000_040 * S;
        let s = State {
            window: start / window,
            previous: 100,
            current: 20,
        };
        let now = start + 15 * S;
        let (_, v) = decide(s, now, 5, limit, window);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
        let (_, v) = decide(s, now, 6, limit, window);
        assert!(!v.allowed);
        // 6 units need the estimate at <= 94: 100·(W − x)/W <= 74, x >= 15.6 s.
        assert_eq!(v.retry_after, Some(600 * MS));
        assert_eq!(v.remaining, 5);
        // One more unit (remaining 6) also at x = 15.6 s.
        assert_eq!(v.reset_after, 600 * MS);
    }

    #[test]
    fn retry_after_is_when_it_passes() {
        let (limit, window) = (10, 10 * S);
        let mut s = State::default();
        let now = 1_000 * S + 5 * S;
        assert_eq!(burst(decide, &mut s, now, 10, limit, window), 10);
        let (_, v) = decide(s, now, 3, limit, window);
        let wait = v.retry_after.expect("not never");
        assert!(!decide(s, now + wait - 1, 3, limit, window).1.allowed);
        assert!(decide(s, now + wait, 3, limit, window).1.allowed);
    }

    #[test]
    fn never_and_fresh() {
        let (_, v) = decide(State::default(), 0, 11, 10, S);
        assert!(v.never && v.retry_after.is_none());
        let s = State {
            window: 5,
            previous: 0,
            current: 3,
        };
        assert!(!is_fresh(s, 6 * S, S), "current becomes previous");
        assert!(is_fresh(s, 7 * S, S));
        assert_eq!(adjust(s, 5 * S, -5, 10, S).current, 0);
        assert_eq!(adjust(s, 5 * S, 50, 10, S).current, 10);
    }
}
