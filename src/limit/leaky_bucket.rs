//! Leaky bucket, following nginx `limit_req` exactly.
//!
//! nginx keeps, per key, an `excess` (requests queued beyond the one being
//! served) and the time of the last request; on arrival
//! `excess = max(0, excess − rate × elapsed + 1)`, and the request is refused
//! when `excess > burst`. Otherwise, with `nodelay` it passes at once; without,
//! it is delayed by `excess / rate` so that queued requests leave spaced at
//! `rate`. `capacity` here is nginx's `burst`: a fresh key takes
//! `capacity + 1` requests at once (the first with `excess` 0).
//!
//! That recurrence is GCRA with the bucket level `L = (excess + 1) × T`
//! (`T = 1 / rate`): `L' = max(L − elapsed, 0) + T`, refused when
//! `L' > (capacity + 1) × T`. So this module runs `token_bucket::gcra` with
//! `capacity + 1` units and derives the delay as `L' − T`, the `excess / rate`
//! of nginx. nginx truncates to milliseconds; here the arithmetic is exact in
//! nanoseconds (`rate` is rational, see `token_bucket`). A request of cost `c`
//! counts as `c` requests; its delay is that of the last of them.
//!
//! Worked example, `capacity = 2`, `rate = "1/s"`: three requests at once
//! pass; in [`LeakyMode::Delay`] they get delays 0 s, 1 s and 2 s, the fourth
//! is denied with `retry_after = 1 s`. In [`LeakyMode::Reject`] (nodelay) the
//! same three pass with delay 0.
//!
//! State: the GCRA `tat`, 16 bytes.

use super::token_bucket::{self, State, gcra};
use super::verdict::{Verdict, ceil_div, sat_nanos};
use super::{LeakyMode, Nanos, Rate};

/// Decide a request of `cost` at `now`; store the returned state only if the
/// verdict admits. In `Delay` mode an admitted verdict carries the delay.
///
/// Always in line: `limit::bucket` chooses where it runs out of line.
#[inline(always)]
pub(crate) fn decide(
    state: State,
    now: Nanos,
    cost: u64,
    capacity: u64,
    rate: Rate,
    mode: LeakyMode,
) -> (State, Verdict) {
    let units = capacity.saturating_add(1);
    let o = gcra(state, now, cost, units, rate);
    let mut verdict = o.verdict;
    if verdict.allowed && mode == LeakyMode::Delay {
        // excess / rate = L' − T, back from scaled nanoseconds (rounded up:
        // a request must not leave before its slot).
        let t = u128::from(rate.per.max(1));
        let excess = o.ahead.saturating_sub(t);
        verdict.delay = sat_nanos(ceil_div(excess, u128::from(rate.tokens.max(1))));
    }
    (o.state, verdict)
}

/// Post-response settlement, as for the token bucket with `capacity + 1`.
pub(crate) fn adjust(state: State, now: Nanos, delta: i64, capacity: u64, rate: Rate) -> State {
    token_bucket::adjust(state, now, delta, capacity.saturating_add(1), rate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::NANOS_PER_SEC;

    const S: Nanos = NANOS_PER_SEC;
    const MS: Nanos = 1_000_000;
    const T0: Nanos = 1_700_000_000 * S;

    fn run(mode: LeakyMode, capacity: u64, rate: Rate, at: &[Nanos]) -> Vec<Option<Nanos>> {
        let mut s = State::default();
        at.iter()
            .map(|&now| {
                let (n, v) = decide(s, now, 1, capacity, rate, mode);
                if v.allowed {
                    s = n;
                    Some(v.delay)
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn reject_mode_takes_capacity_plus_one_at_once() {
        let rate = Rate { tokens: 1, per: S };
        let got = run(LeakyMode::Reject, 5, rate, &[T0; 8]);
        assert_eq!(got, [vec![Some(0); 6], vec![None; 2]].concat());
    }

    #[test]
    fn delay_mode_spaces_excess_at_rate() {
        // rate 4/s → 1/rate = 250 ms; burst 3 → delays 0, 250, 500, 750 ms.
        let rate = Rate { tokens: 4, per: S };
        let got = run(LeakyMode::Delay, 3, rate, &[T0; 5]);
        assert_eq!(
            got,
            vec![
                Some(0),
                Some(250 * MS),
                Some(500 * MS),
                Some(750 * MS),
                None
            ]
        );
    }

    #[test]
    fn worked_example_and_nginx_recurrence() {
        let rate = Rate { tokens: 1, per: S };
        let mut s = State::default();
        for expected in [0, S, 2 * S] {
            let (n, v) = decide(s, T0, 1, 2, rate, LeakyMode::Delay);
            assert!(v.allowed);
            assert_eq!(v.delay, expected);
            s = n;
        }
        let (_, v) = decide(s, T0, 1, 2, rate, LeakyMode::Delay);
        assert!(!v.allowed);
        assert_eq!(v.retry_after, Some(S));
        // nginx: 1.5 s later excess = max(0, 2 − 1.5 + 1) = 1.5 → delay 1.5 s.
        let (_, v) = decide(s, T0 + 1_500 * MS, 1, 2, rate, LeakyMode::Delay);
        assert!(v.allowed);
        assert_eq!(v.delay, 1_500 * MS);
        // Idle long enough: excess back to 0, no delay.
        let (_, v) = decide(s, T0 + 10 * S, 1, 2, rate, LeakyMode::Delay);
        assert_eq!(v.delay, 0);
    }

    #[test]
    fn cost_above_capacity_plus_one_is_never() {
        let rate = Rate { tokens: 1, per: S };
        let (_, v) = decide(State::default(), T0, 4, 2, rate, LeakyMode::Reject);
        assert!(v.never && v.retry_after.is_none());
        let (_, v) = decide(State::default(), T0, 3, 2, rate, LeakyMode::Reject);
        assert!(v.allowed);
    }
}
