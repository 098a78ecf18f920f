//! Property tests of the limiter algorithms against their documented bounds.
//!
//! Arrivals are generated as (gap, cost) pairs on an explicit clock (no
//! sleeping), run through the pure decision functions, and the admitted
//! units are checked against the exact sliding-window definition:
//!
//! * sliding log: never more than `limit` units in any `(t − W, t]`;
//! * sliding window counter: in any `(t − W, t]` with `t` at offset `e` of its
//!   window, at most `limit + P_tail − P·(W − e)/W` (the bound documented in
//!   `src/limit/sliding_window.rs`), and so always below `2 × limit`;
//! * token bucket: in any `[a, b]`, at most `capacity + (b − a) × rate`.
//!
//! Each is bounded from below too, so a limiter that denied everything
//! would fail: every denial of the sliding log is one the limit required,
//! and the sliding window counter and the token bucket decide each arrival
//! exactly as their reference definitions do, computed here from the
//! admitted history alone (two windows' counts weighted by the position in
//! the window; a bucket level that refills continuously and caps at
//! `capacity`).

use proptest::prelude::*;
use tollgate::limit::{Nanos, Rate, sliding_log, sliding_window, token_bucket};

const MS: Nanos = 1_000_000;
const T0: Nanos = 1_700_000_000_000 * MS;

/// Arrivals: gaps up to `max_gap` ms, costs 1..=3.
fn arrivals(max_gap: u64) -> impl Strategy<Value = Vec<(Nanos, u64)>> {
    prop::collection::vec((0..=max_gap, 1u64..=3), 1..300).prop_map(|v| {
        let mut now = T0;
        v.into_iter()
            .map(|(gap, cost)| {
                now += gap * MS;
                (now, cost)
            })
            .collect()
    })
}

/// Units admitted in `(from, to]`.
fn units_in(admitted: &[(Nanos, u64)], from: Nanos, to: Nanos) -> u64 {
    admitted
        .iter()
        .filter(|&&(t, _)| t > from && t <= to)
        .map(|&(_, c)| c)
        .sum()
}

proptest! {
    #[test]
    fn sliding_log_never_exceeds_limit(
        limit in 1u64..20,
        window_ms in 10u64..2_000,
        arrivals in arrivals(200),
    ) {
        let window = window_ms * MS;
        let mut state = sliding_log::State::default();
        let mut admitted = Vec::new();
        for &(now, cost) in &arrivals {
            let v = sliding_log::check(&state, now, cost, limit, window);
            if v.allowed {
                sliding_log::record(&mut state, now, cost, window);
                admitted.push((now, cost));
            } else if !v.never {
                // A denial is right: the request would have broken the limit.
                prop_assert!(units_in(&admitted, now - window, now) + cost > limit);
                let retry = v.retry_after.unwrap_or(0);
                prop_assert!(retry > 0);
                prop_assert!(units_in(&admitted, now + retry - window, now) + cost <= limit);
            }
            prop_assert_eq!(state.used(now, window), units_in(&admitted, now - window, now));
        }
        for &(t, _) in &admitted {
            prop_assert!(units_in(&admitted, t.saturating_sub(window), t) <= limit);
        }
    }

    #[test]
    fn sliding_window_within_documented_bound(
        limit in 1u64..50,
        window_ms in 10u64..2_000,
        arrivals in arrivals(100),
    ) {
        let window = window_ms * MS;
        let mut state = sliding_window::State::default();
        let mut admitted = Vec::new();
        let (w, l) = (u128::from(window), u128::from(limit));
        for &(now, cost) in &arrivals {
            let (next, v) = sliding_window::decide(state, now, cost, limit, window);
            // The reference: P the units of the previous window, C those of
            // the current one, e the offset in it; admitted iff
            // P·(W − e)/W + C + cost ≤ limit, and never when cost > limit.
            let k = now / window;
            let e = u128::from(now % window);
            let cur_start = k * window;
            let p = u128::from(units_in(&admitted, cur_start - window - 1, cur_start - 1));
            let c = u128::from(units_in(&admitted, cur_start - 1, now));
            let admits = cost <= limit && p * (w - e) + (c + u128::from(cost)) * w <= l * w;
            prop_assert_eq!(v.allowed, admits, "now={} p={} c={} e={} cost={}", now, p, c, e, cost);
            prop_assert_eq!(v.never, cost > limit);
            if v.allowed {
                state = next;
                admitted.push((now, cost));
            }
        }
        for &(t, _) in &admitted {
            let k = t / window;
            let e = u128::from(t % window);
            let prev_start = (k - 1) * window;
            let cur_start = k * window;
            // P: units charged in window k − 1; P_tail: those after t − W.
            let p = u128::from(units_in(&admitted, prev_start - 1, cur_start - 1));
            let p_tail = u128::from(units_in(&admitted, t - window, cur_start - 1));
            let in_window = u128::from(units_in(&admitted, t - window, t));
            // in_window <= L + P_tail − P·(W − e)/W, multiplied by W.
            prop_assert!(in_window * w + p * (w - e) <= l * w + p_tail * w,
                "t={t} in_window={in_window} p={p} p_tail={p_tail} e={e}");
            prop_assert!(in_window < 2 * l);
        }
    }

    #[test]
    fn token_bucket_admits_at_most_burst_plus_refill(
        capacity in 1u64..30,
        tokens in 1u64..20,
        per_ms in 1u64..5_000,
        arrivals in arrivals(100),
    ) {
        let refill = Rate { tokens, per: per_ms * MS };
        let mut state = token_bucket::State::default();
        let mut admitted = Vec::new();
        // The reference bucket, in ticks (one token = `per` ticks; a
        // nanosecond refills `tokens` ticks): full at the start.
        let full = u128::from(capacity) * u128::from(refill.per);
        let mut level = full;
        let mut last = T0;
        for &(now, cost) in &arrivals {
            let (next, v) = token_bucket::decide(state, now, cost, capacity, refill);
            level = (level + u128::from(now - last) * u128::from(tokens)).min(full);
            last = now;
            let need = u128::from(cost) * u128::from(refill.per);
            let admits = cost <= capacity && need <= level;
            prop_assert_eq!(v.allowed, admits, "now={} level={} need={}", now, level, need);
            prop_assert_eq!(v.never, cost > capacity);
            if admits {
                level -= need;
            }
            if v.allowed {
                state = next;
                admitted.push((now, cost));
            } else if let Some(retry) = v.retry_after {
                prop_assert!(token_bucket::decide(state, now + retry, cost, capacity, refill).1.allowed);
                prop_assert!(!token_bucket::decide(state, now + retry - 1, cost, capacity, refill).1.allowed);
            }
        }
        for (i, &(a, _)) in admitted.iter().enumerate() {
            let mut sum = 0u128;
            for &(b, c) in &admitted[i..] {
                sum += u128::from(c);
                // sum <= capacity + (b − a)·tokens/per
                let refilled = u128::from(b - a) * u128::from(tokens) / u128::from(refill.per);
                prop_assert!(sum <= u128::from(capacity) + refilled);
            }
        }
    }
}
