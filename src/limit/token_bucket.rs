//! Token bucket as GCRA (the generic cell rate algorithm): a burst of
//! `capacity` units, refilled at `refill` on average.
//!
//! Instead of a token count and a refill timer, a key stores one number, the
//! *theoretical arrival time* `tat`: the instant at which its bucket would be
//! full again. The bucket holds `(now + τ − tat) / T` tokens, where `T` is
//! the time one token takes to refill and `τ = capacity × T`. A request of
//! cost `c` is admitted when `max(tat, now) + c·T − now <= τ`, and then `tat`
//! becomes `max(tat, now) + c·T`. Refill is computed on arrival: no timer.
//!
//! `T = per / tokens` is generally not a whole number of nanoseconds
//! (`"3/s"` is 333 333 333.3 ns), so all times are kept multiplied by
//! `refill.tokens` ("scaled" nanoseconds, in u128): then `T = per` and
//! everything is exact integer arithmetic, including the header numbers.
//!
//! Worked example, `capacity = 20`, `refill = "10/s"` (T = 100 ms): a fresh
//! key takes a burst of 20 at once (`tat = now + 2 s`; the 21st is denied with
//! `retry_after = 100 ms`). 250 ms later the bucket holds `floor(2.5) = 2`
//! tokens and `reset_after` (until one more) is 50 ms.
//!
//! The leaky bucket (`leaky_bucket.rs`) is the same recurrence with
//! `capacity + 1` units, so both share `gcra`.
//!
//! # `wait`: holding instead of refusing
//!
//! With `wait = W` (nginx `limit_req` without `nodelay`, for a token
//! bucket), a request the bucket refuses now but would admit within `W` is
//! admitted at once and charged — `tat` runs up to `W` past the full bucket,
//! a debt of at most `W × refill` tokens that every later request sees — and
//! carries a `delay`: the time until its tokens would have been there,
//! `new_tat − now − τ`. The caller holds it that long before forwarding
//! it. Past `W` it is refused as without `wait`, with the same
//! `retry_after` (when the tokens are there, no hold needed). So the
//! condition becomes `max(tat, now) + c·T − now <= τ + W`.
//!
//! Worked example, `capacity = 2`, `refill = "10/s"`, `wait = "250ms"`:
//! five requests at T: the first two pass, the third is held 100 ms, the
//! fourth 200 ms (both report `r` 0, as admitted); the fifth would wait
//! 300 ms and is refused with `retry_after = 300 ms`, charging nothing.
//!
//! State: `tat`, 16 bytes.

use super::verdict::{Verdict, ceil_div, div, sat_nanos};
use super::{Nanos, Rate};

/// A key's theoretical arrival time, in scaled nanoseconds (ns × `tokens`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    // Two halves rather than a `u128`: a `u128` is 16-byte aligned, which
    // would pad every key's slot in the store by 8 bytes.
    tat: [u64; 2],
}

impl State {
    /// The theoretical arrival time (scaled nanoseconds).
    pub(crate) fn tat(self) -> u128 {
        (u128::from(self.tat[1]) << 64) | u128::from(self.tat[0])
    }

    /// The state whose theoretical arrival time is `tat`.
    pub(crate) fn at(tat: u128) -> State {
        State {
            tat: [tat as u64, (tat >> 64) as u64],
        }
    }
}

/// The outcome of [`gcra`]: the state to store if admitted, the verdict, and
/// how far `tat` runs ahead of `now` afterwards (scaled ns; the leaky
/// bucket's delay comes from it).
pub(crate) struct Outcome {
    pub(crate) state: State,
    pub(crate) verdict: Verdict,
    pub(crate) ahead: u128,
}

/// `now` in scaled nanoseconds.
fn scaled(now: Nanos, rate: Rate) -> u128 {
    u128::from(now) * u128::from(rate.tokens.max(1))
}

/// Scaled nanoseconds back to nanoseconds, rounded up (a client told to wait
/// must not come back a nanosecond early).
fn unscale(d: u128, rate: Rate) -> Nanos {
    sat_nanos(ceil_div(d, u128::from(rate.tokens.max(1))))
}

/// The GCRA decision for `cost` units against a bucket of `capacity` units.
#[inline]
pub(crate) fn gcra(state: State, now: Nanos, cost: u64, capacity: u64, rate: Rate) -> Outcome {
    gcra_within(state, now, cost, capacity, rate, 0)
}

/// [`gcra`] admitting up to `slack` (scaled ns) past the full bucket: the
/// `tat` of an admitted request may then run ahead of `now` by `τ + slack`
/// (the debt a token bucket's `wait` allows). `r` and `t` are those of the
/// bucket as it is; `retry_after` of a refused request is until its tokens
/// are there.
#[inline(always)]
fn gcra_within(
    state: State,
    now: Nanos,
    cost: u64,
    capacity: u64,
    rate: Rate,
    slack: u128,
) -> Outcome {
    let t = u128::from(rate.per.max(1));
    let tau = u128::from(capacity) * t;
    let now_s = scaled(now, rate);
    let tat = state.tat().max(now_s);
    let never = cost > capacity;
    let new_tat = tat + u128::from(cost) * t;
    let allowed = !never && new_tat - now_s <= tau + slack;
    let ahead = if allowed { new_tat } else { tat } - now_s;
    let room = tau.saturating_sub(ahead);
    let remaining = div(room, t);
    // Until one more whole token: the level must reach (remaining + 1)·T,
    // after paying back any debt a settlement left (`ahead` beyond `tau`).
    let reset_after = if remaining >= u128::from(capacity) {
        0
    } else {
        unscale((remaining + 1) * t - room + ahead.saturating_sub(tau), rate)
    };
    let remaining = sat_nanos(remaining);
    if allowed {
        Outcome {
            state: State::at(new_tat),
            verdict: Verdict::allow(remaining, reset_after),
            ahead,
        }
    } else {
        let retry = unscale(new_tat.saturating_sub(now_s + tau), rate);
        Outcome {
            state,
            verdict: Verdict::deny(remaining, reset_after, retry, never),
            ahead,
        }
    }
}

/// Decide a request of `cost` at `now`; store the returned state only if the
/// verdict admits.
pub fn decide(
    state: State,
    now: Nanos,
    cost: u64,
    capacity: u64,
    refill: Rate,
) -> (State, Verdict) {
    let o = gcra(state, now, cost, capacity, refill);
    (o.state, o.verdict)
}

/// [`decide`] with `wait` (ns, 0 = none): a request that fits within `wait`
/// is admitted and charged, its verdict's `delay` the time until its tokens
/// would have been there (rounded up: it must not leave early). See the
/// module doc.
///
/// Always in line: `limit::bucket` chooses where it runs out of line.
#[inline(always)]
pub fn decide_waiting(
    state: State,
    now: Nanos,
    cost: u64,
    capacity: u64,
    refill: Rate,
    wait: Nanos,
) -> (State, Verdict) {
    let slack = u128::from(wait) * u128::from(refill.tokens.max(1));
    let o = gcra_within(state, now, cost, capacity, refill, slack);
    let mut verdict = o.verdict;
    // A cost of 0 (a peek) takes nothing and waits for nothing.
    if verdict.allowed && wait > 0 && cost > 0 {
        let tau = u128::from(capacity) * u128::from(refill.per.max(1));
        verdict.delay = unscale(o.ahead.saturating_sub(tau), refill);
    }
    (o.state, verdict)
}

/// The bucket is full: the key can be forgotten.
pub(crate) fn is_fresh(state: State, now: Nanos, refill: Rate) -> bool {
    state.tat() <= scaled(now, refill)
}

/// Post-response settlement: take `delta` more tokens (not below empty) or
/// give back `−delta` (not above full).
pub(crate) fn adjust(state: State, now: Nanos, delta: i64, capacity: u64, refill: Rate) -> State {
    let t = u128::from(refill.per.max(1));
    let now_s = scaled(now, refill);
    let tat = state.tat().max(now_s);
    let d = u128::from(delta.unsigned_abs()) * t;
    let tat = if delta >= 0 {
        // Never below where it was: a bucket already past `capacity` (a
        // held request's debt) keeps its debt.
        (tat + d).min((now_s + u128::from(capacity) * t).max(tat))
    } else {
        tat.saturating_sub(d).max(now_s)
    };
    State::at(tat)
}

/// Re-express a state under new numbers, keeping the tokens the key has
/// *used* (so a full bucket stays full and a raised capacity adds its
/// headroom; a lowered one keeps the debt, capped at the new capacity plus
/// what the new `wait` lets it owe).
pub(crate) fn rescale(
    state: State,
    now: Nanos,
    old: Rate,
    new_capacity: u64,
    new_wait: Nanos,
    new: Rate,
) -> State {
    let used_old = state.tat().saturating_sub(scaled(now, old));
    // used tokens = used_old / old.per; in new scaled time: × new.per.
    let used_new = ceil_div(
        used_old * u128::from(new.per.max(1)),
        u128::from(old.per.max(1)),
    );
    let cap = u128::from(new_capacity) * u128::from(new.per.max(1))
        + u128::from(new_wait) * u128::from(new.tokens.max(1));
    State {
        tat: State::at(scaled(now, new) + used_new.min(cap)).tat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::NANOS_PER_SEC;

    const S: Nanos = NANOS_PER_SEC;
    const MS: Nanos = 1_000_000;
    const T0: Nanos = 1_700_000_000 * S;

    fn per_sec(tokens: u64) -> Rate {
        Rate { tokens, per: S }
    }

    #[test]
    fn exact_burst_then_refill() {
        let (cap, rate) = (20, per_sec(10));
        let mut s = State::default();
        for i in 0..20 {
            let (n, v) = decide(s, T0, 1, cap, rate);
            assert!(v.allowed, "request {i}");
            assert_eq!(v.remaining, 19 - i);
            s = n;
        }
        let (_, v) = decide(s, T0, 1, cap, rate);
        assert!(!v.allowed && !v.never);
        assert_eq!(
            (v.retry_after, v.reset_after, v.remaining),
            (Some(100 * MS), 100 * MS, 0)
        );
        // 250 ms later: 2.5 tokens → r = 2, t = 50 ms until the third.
        let (_, v) = decide(s, T0 + 250 * MS, 0, cap, rate);
        assert_eq!((v.remaining, v.reset_after), (2, 50 * MS));
        assert!(!decide(s, T0 + 250 * MS, 3, cap, rate).1.allowed);
        assert!(decide(s, T0 + 300 * MS, 3, cap, rate).1.allowed);
        // Full after 2 s: t = 0.
        let (_, v) = decide(s, T0 + 2 * S, 0, cap, rate);
        assert_eq!((v.remaining, v.reset_after), (20, 0));
        assert!(is_fresh(s, T0 + 2 * S, rate));
    }

    #[test]
    fn long_run_rate_is_refill() {
        // 0.5/s = 5 per 10 s: after the burst of 3, one token every 2 s.
        let (cap, rate) = (
            3,
            Rate {
                tokens: 5,
                per: 10 * S,
            },
        );
        let mut s = State::default();
        let mut passed = 0;
        for ms in (0..60_000).step_by(100) {
            let (n, v) = decide(s, T0 + ms * MS, 1, cap, rate);
            if v.allowed {
                s = n;
                passed += 1;
            }
        }
        // 3 at once, then one per 2 s over the remaining 59.9 s: 29 more.
        assert_eq!(passed, 3 + 29);
    }

    #[test]
    fn non_integer_interval_is_exact() {
        // "3/s": T = 333 333 333.3 ns. Three tokens take exactly 1 s.
        let (cap, rate) = (3, per_sec(3));
        let (s, _) = decide(State::default(), T0, 3, cap, rate);
        assert!(!decide(s, T0 + S - 1, 3, cap, rate).1.allowed);
        assert!(decide(s, T0 + S, 3, cap, rate).1.allowed);
        let (_, v) = decide(s, T0, 1, cap, rate);
        assert_eq!(v.retry_after, Some(333_333_334), "rounded up");
    }

    #[test]
    fn cost_above_capacity_is_never() {
        let (_, v) = decide(State::default(), T0, 21, 20, per_sec(10));
        assert!(!v.allowed && v.never);
        assert_eq!(v.retry_after, None);
    }

    #[test]
    fn wait_worked_example() {
        // capacity 2, 10/s (T = 100 ms), wait 250 ms: five at T.
        let (cap, rate, wait) = (2, per_sec(10), 250 * MS);
        let mut s = State::default();
        let mut got = Vec::new();
        for _ in 0..5 {
            let (n, v) = decide_waiting(s, T0, 1, cap, rate, wait);
            if v.allowed {
                s = n;
            }
            got.push((v.allowed, v.delay, v.remaining, v.retry_after));
        }
        assert_eq!(
            got,
            [
                (true, 0, 1, None),
                (true, 0, 0, None),
                (true, 100 * MS, 0, None),
                (true, 200 * MS, 0, None),
                (false, 0, 0, Some(300 * MS)),
            ]
        );
        // The debt is at most wait × refill: tat = T + 400 ms = τ + 200 ms.
        assert_eq!(s.tat(), scaled(T0 + 400 * MS, rate));
        // Held requests' `t`: the next token after the debt is paid.
        let (_, v) = decide_waiting(s, T0, 0, cap, rate, wait);
        assert_eq!((v.remaining, v.reset_after), (0, 300 * MS));
        // The refused one comes back at its retry_after: admitted, no hold.
        let (_, v) = decide_waiting(s, T0 + 300 * MS, 1, cap, rate, wait);
        assert_eq!((v.allowed, v.delay), (true, 0));
        // 10 ms earlier it is held the 10 ms.
        let (_, v) = decide_waiting(s, T0 + 290 * MS, 1, cap, rate, wait);
        assert_eq!((v.allowed, v.delay), (true, 10 * MS));
    }

    #[test]
    fn wait_bounds_the_debt_under_any_arrivals() {
        // Requests every 7 ms for 3 s against 3 tokens at "3/s" with 400 ms
        // of wait: no held request waits longer than `wait`, the bucket
        // never owes more than wait × refill, and the requests leave (now
        // + delay) spaced by at least T once the burst is spent.
        let (cap, rate, wait) = (3, per_sec(3), 400 * MS);
        let t = S / 3;
        let tau = u128::from(cap) * u128::from(rate.per);
        let mut s = State::default();
        let mut leaves = Vec::new();
        for i in 0..430 {
            let now = T0 + i * 7 * MS;
            let (n, v) = decide_waiting(s, now, 1, cap, rate, wait);
            if v.allowed {
                assert!(v.delay <= wait, "held {} > wait", v.delay);
                s = n;
                let debt = s.tat() - scaled(now, rate);
                assert!(debt <= tau + u128::from(wait) * 3, "debt {debt}");
                leaves.push(now + v.delay);
            } else {
                assert!(v.retry_after.unwrap() > wait);
            }
        }
        for pair in leaves[3..].windows(2) {
            assert!(pair[1] - pair[0] + 1 >= t, "{pair:?}");
        }
        // The long-run rate is the refill: 3 + 3/s over ~3 s, plus what
        // the wait let in ahead (the 400 ms of debt: one more token).
        assert_eq!(leaves.len(), 3 + 9 + 1);
    }

    #[test]
    fn wait_zero_is_decide_exactly() {
        let (cap, rate) = (4, per_sec(7));
        let mut a = State::default();
        let mut b = State::default();
        for i in 0..200u64 {
            let now = T0 + i * 37 * MS;
            let cost = i % 3;
            let (na, va) = decide(a, now, cost, cap, rate);
            let (nb, vb) = decide_waiting(b, now, cost, cap, rate, 0);
            assert_eq!((na, va), (nb, vb));
            if va.allowed {
                (a, b) = (na, nb);
            }
        }
    }

    #[test]
    fn wait_never_admits_more_than_capacity() {
        let (_, v) = decide_waiting(State::default(), T0, 3, 2, per_sec(1), 10 * S);
        assert!(!v.allowed && v.never && v.retry_after.is_none());
    }

    #[test]
    fn a_held_requests_debt_survives_settlement_and_reload() {
        let (cap, rate, wait) = (2, per_sec(10), S);
        let mut s = State::default();
        for _ in 0..4 {
            s = decide_waiting(s, T0, 1, cap, rate, wait).0;
        }
        // Two tokens owed: a settlement charge keeps them owed (it used to
        // cap the tat at a full debt of one capacity, forgiving them).
        let charged = adjust(s, T0, 1, cap, rate);
        assert!(charged.tat() >= s.tat());
        // A reload with the same numbers keeps the debt.
        assert_eq!(rescale(s, T0, rate, cap, wait, rate), s);
    }

    #[test]
    fn adjust_and_rescale() {
        let (cap, rate) = (10, per_sec(1));
        let (s, _) = decide(State::default(), T0, 4, cap, rate);
        let charged = adjust(s, T0, 100, cap, rate);
        assert_eq!(decide(charged, T0, 0, cap, rate).1.remaining, 0);
        let refunded = adjust(s, T0, -100, cap, rate);
        assert!(is_fresh(refunded, T0, rate));
        // Raise capacity to 20, refill 2/s: the 4 used tokens stay used.
        let r = rescale(s, T0, rate, 20, 0, per_sec(2));
        assert_eq!(decide(r, T0, 0, 20, per_sec(2)).1.remaining, 16);
        // Lower to 3: at most 3 used.
        let r = rescale(s, T0, rate, 3, 0, rate);
        assert_eq!(decide(r, T0, 0, 3, rate).1.remaining, 0);
    }
}
