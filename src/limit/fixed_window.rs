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
//!
//! Long windows (a daily quota) may be aligned per key instead
//! ([`WindowAlign`](super::WindowAlign)): with `reset_jitter` the limiter
//! shifts each key's clock by a fixed offset from its digest before calling
//! [`decide`], so keys reset at different moments of the day; with
//! `align = "first_request"` the window starts at the key's first request and
//! the `*_first` functions below keep the window's *start* (not its index) in
//! `State::window`. Worked example, `limit = 1000`, `window = 1d`,
//! first_request: a key's first call at 14:05 opens a window until 14:05 the
//! next day; its first call after that opens the next one.

use super::Nanos;
use super::verdict::{Verdict, sat_nanos, settle};

/// A key's counter: `count` units charged in window number `window`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// Index of the window the count belongs to: its start / window length.
    pub(crate) window: u64,
    pub(crate) count: u64,
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
pub(crate) fn decide(
    state: State,
    now: Nanos,
    cost: u64,
    limit: u64,
    window: Nanos,
) -> (State, Verdict) {
    let (idx, used, reset_in) = current(state, now, window);
    charge(state, idx, used, reset_in, cost, limit)
}

/// The decision once the window in force is known: `window` identifies it
/// (index or start), `used` units are spent in it, it ends in `reset_in`.
fn charge(
    state: State,
    window: u64,
    used: u64,
    reset_in: Nanos,
    cost: u64,
    limit: u64,
) -> (State, Verdict) {
    let never = cost > limit;
    let after = used.saturating_add(cost);
    if !never && after <= limit {
        let t = if after == 0 { 0 } else { reset_in };
        let next = State {
            window,
            count: after,
        };
        return (next, Verdict::allow(limit - after, t));
    }
    let t = if used == 0 { 0 } else { reset_in };
    let verdict = Verdict::deny(limit.saturating_sub(used), t, reset_in, never);
    (state, verdict)
}

/// Nothing charged in the current window: the key can be forgotten.
pub(crate) fn is_fresh(state: State, now: Nanos, window: Nanos) -> bool {
    current(state, now, window).1 == 0
}

/// Post-response settlement: charge (`delta > 0`) or refund in the current
/// window, keeping `0 <= count <= limit`.
pub(crate) fn adjust(state: State, now: Nanos, delta: i64, limit: u64, window: Nanos) -> State {
    let (idx, used, _) = current(state, now, window);
    State {
        window: idx,
        count: settle(used, delta, limit),
    }
}

/// `align = "first_request"`: the window in force at `now` (its start and the
/// units used), a new one when the last has ended or nothing was charged.
fn current_first(state: State, now: Nanos, window: Nanos) -> (Nanos, u64, Nanos) {
    let w = window.max(1);
    let end = state.window.saturating_add(w);
    if state.count == 0 || now >= end {
        return (now, 0, w);
    }
    // `now` a little behind the start (clock reads racing) counts in it.
    (state.window, state.count, end.saturating_sub(now).max(1))
}

/// [`decide`] for `align = "first_request"`; `State::window` is the start.
pub(crate) fn decide_first(
    state: State,
    now: Nanos,
    cost: u64,
    limit: u64,
    window: Nanos,
) -> (State, Verdict) {
    let (start, used, reset_in) = current_first(state, now, window);
    charge(state, start, used, reset_in, cost, limit)
}

/// [`is_fresh`] for `align = "first_request"`.
pub(crate) fn is_fresh_first(state: State, now: Nanos, window: Nanos) -> bool {
    current_first(state, now, window).1 == 0
}

/// [`adjust`] for `align = "first_request"`.
pub(crate) fn adjust_first(
    state: State,
    now: Nanos,
    delta: i64,
    limit: u64,
    window: Nanos,
) -> State {
    let (start, used, _) = current_first(state, now, window);
    State {
        window: start,
        count: settle(used, delta, limit),
    }
}

/// `window = "1mo"`: the calendar month in force at `now` (its index
/// since January 1970), the units used in it, and the time until it ends.
/// A `now` a little behind the state's month counts in it, as in
/// [`current`].
fn current_month(state: State, now: Nanos) -> (u64, u64, Nanos) {
    let (idx, end) = super::calendar::month_of(now);
    if state.window > idx {
        // Clock reads racing across a month's end: at most a moment.
        return (state.window, state.count, 1);
    }
    let used = if state.window == idx { state.count } else { 0 };
    (idx, used, end.saturating_sub(now).max(1))
}

/// [`decide`] for calendar months; `State::window` is the month's index.
pub(crate) fn decide_month(state: State, now: Nanos, cost: u64, limit: u64) -> (State, Verdict) {
    let (idx, used, reset_in) = current_month(state, now);
    charge(state, idx, used, reset_in, cost, limit)
}

/// [`is_fresh`] for calendar months.
pub(crate) fn is_fresh_month(state: State, now: Nanos) -> bool {
    current_month(state, now).1 == 0
}

/// [`adjust`] for calendar months.
pub(crate) fn adjust_month(state: State, now: Nanos, delta: i64, limit: u64) -> State {
    let (idx, used, _) = current_month(state, now);
    State {
        window: idx,
        count: settle(used, delta, limit),
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
    fn calendar_months_reset_on_the_first_of_the_month() {
        // 2026-02-27T00:00:00Z, two days before March.
        let feb_27 = 1_772_150_400 * S;
        let march = 1_772_323_200 * S;
        let (s, v) = decide_month(State::default(), feb_27, 7, 10);
        assert!(v.allowed);
        assert_eq!(v.reset_after, march - feb_27);
        let (_, v) = decide_month(s, march - 1, 4, 10);
        assert!(!v.allowed, "February's 7 still count");
        assert_eq!(v.retry_after, Some(1));
        assert!(!is_fresh_month(s, march - 1));
        // March starts empty and runs 31 days.
        assert!(is_fresh_month(s, march));
        let (s, v) = decide_month(s, march, 10, 10);
        assert!(v.allowed);
        assert_eq!(v.reset_after, 31 * 86_400 * S);
        assert_eq!(adjust_month(s, march, -4, 10).count, 6);
    }

    #[test]
    fn first_request_windows_start_with_the_key() {
        let (limit, window) = (2, 86_400 * S);
        let first = 1_700_000_123 * S + 17 * MS; // not aligned to anything
        let (s, v) = decide_first(State::default(), first, 1, limit, window);
        assert!(v.allowed);
        assert_eq!(s.window, first, "the window starts at the first request");
        assert_eq!(v.reset_after, window);
        let (s, v) = decide_first(s, first + 3_600 * S, 1, limit, window);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
        let (_, v) = decide_first(s, first + window - 1, 1, limit, window);
        assert!(!v.allowed);
        assert_eq!(v.retry_after, Some(1));
        // The first request after the window ends opens the next one.
        let later = first + window + 5 * S;
        assert!(!is_fresh_first(s, first + window - 1, window));
        assert!(is_fresh_first(s, later, window));
        let (s, v) = decide_first(s, later, 1, limit, window);
        assert!(v.allowed);
        assert_eq!((s.window, s.count), (later, 1));
        assert_eq!(adjust_first(s, later, 5, limit, window).count, 2);
    }

    #[test]
    fn boundary_burst_lets_twice_the_limit_through() {
        // The documented weakness: 100/min, 100 at :59.900 and 100 at :00.100.
        let (limit, window) = (100, 60 * S);
        let boundary = 1_700_000_040 * S; // a multiple of 60 s
        assert_eq!(boundary % window, 0);
        let mut s = State::default();
        assert_eq!(
            burst(decide, &mut s, boundary - 100 * MS, 150, limit, window),
            100
        );
        assert_eq!(
            burst(decide, &mut s, boundary + 100 * MS, 150, limit, window),
            100
        );
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
