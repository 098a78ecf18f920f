//! What one limit says about one request, and the policy numbers for headers.
//!
//! A denial is a value, not an error: [`Verdict`] carries everything the HTTP
//! layer needs for `RateLimit`, `RateLimit-Policy`, `X-RateLimit-*` and
//! `Retry-After` (contract §2 "Header values per algorithm", §3), and whether
//! waiting can help at all (`never`).
//!
//! The policy numbers are computed in exact integer arithmetic on the rational
//! [`Rate`], so a token bucket of capacity 120 refilled at `"1/s"` has
//! `w = ceil(120 * 1 s / 1 token) = 120`, never 121 from a float rounding up;
//! `"0.5/s"` is `Rate { tokens: 5, per: 10 s }` and capacity 3 gives
//! `w = ceil(3 * 10 / 5) = 6`.

use super::{Algorithm, NANOS_PER_SEC, Nanos, Rate};

/// One limit's decision for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Verdict {
    /// The limit admits the request (and, in a committed stack, charged it).
    pub allowed: bool,
    /// `r`: cost units left after this request (floor), or as they stand when
    /// the request was not charged.
    pub remaining: u64,
    /// `t`: until more quota is available. Windows: until the window (or the
    /// weighted estimate) frees a unit; token/leaky bucket: until one more
    /// token, 0 when full; concurrency: 0 (frees when a response ends).
    pub(crate) reset_after: Nanos,
    /// When a denied request of this cost could pass; `None` when allowed or
    /// when it never can. Concurrency cannot know: it says 1 s.
    pub retry_after: Option<Nanos>,
    /// The cost exceeds what this limit can ever admit (cost > limit/capacity).
    pub never: bool,
    /// Leaky bucket in `Delay` mode: hold the request this long before
    /// forwarding it, so that the excess leaves spaced at `rate`.
    pub(crate) delay: Nanos,
    /// `adaptive`: the key's limit when decided (its `q`, which moves); 0
    /// for the other algorithms, whose `q` is their configured quota.
    pub(crate) current_limit: u32,
}

impl Verdict {
    /// An admitting verdict with the given `r` and `t`.
    pub(crate) fn allow(remaining: u64, reset_after: Nanos) -> Verdict {
        Verdict {
            allowed: true,
            remaining,
            reset_after,
            ..Verdict::default()
        }
    }

    /// A denying verdict; `retry_after` is ignored when `never`.
    pub(crate) fn deny(
        remaining: u64,
        reset_after: Nanos,
        retry_after: Nanos,
        never: bool,
    ) -> Verdict {
        Verdict {
            allowed: false,
            remaining,
            reset_after,
            retry_after: if never { None } else { Some(retry_after) },
            never,
            delay: 0,
            current_limit: 0,
        }
    }
}

/// `q`: the quota in cost units (window limit, token capacity, leaky
/// `capacity + 1` as nginx admits that many at once, concurrency max).
pub(crate) fn quota(algorithm: &Algorithm) -> u64 {
    match *algorithm {
        Algorithm::FixedWindow { limit, .. }
        | Algorithm::SlidingWindow { limit, .. }
        | Algorithm::SlidingLog { limit, .. } => limit,
        Algorithm::TokenBucket { capacity, .. } => capacity,
        Algorithm::LeakyBucket { capacity, .. } => capacity.saturating_add(1),
        Algorithm::Concurrency { max } => max,
        // The most it can become; a decision's own `q` is [`quota_of`].
        Algorithm::Adaptive { params } => u64::from(params.max()),
    }
}

/// `q` of one decision: an adaptive limit's current limit as the verdict
/// saw it, else the configured [`quota`].
pub(crate) fn quota_of(algorithm: &Algorithm, verdict: &Verdict) -> u64 {
    match algorithm {
        Algorithm::Adaptive { .. } => u64::from(verdict.current_limit),
        _ => quota(algorithm),
    }
}

/// `w`: the policy window in whole seconds (rounded up, at least 1); for a
/// bucket, the time to refill from empty. `None` for concurrency.
pub(crate) fn window_secs(algorithm: &Algorithm) -> Option<u64> {
    let secs = match *algorithm {
        Algorithm::FixedWindow { window, .. }
        | Algorithm::SlidingWindow { window, .. }
        | Algorithm::SlidingLog { window, .. } => ceil_div(window as u128, NANOS_PER_SEC as u128),
        Algorithm::TokenBucket {
            capacity, refill, ..
        } => units_time_secs(capacity as u128, refill),
        Algorithm::LeakyBucket { capacity, rate, .. } => {
            units_time_secs(capacity as u128 + 1, rate)
        }
        Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. } => return None,
    };
    Some(u64::try_from(secs).unwrap_or(u64::MAX).max(1))
}

/// Whole seconds (rounded up) that `units` take at `rate`:
/// `ceil(units * per / (tokens * 1e9))`.
fn units_time_secs(units: u128, rate: Rate) -> u128 {
    ceil_div(
        units * rate.per as u128,
        (rate.tokens as u128).max(1) * NANOS_PER_SEC as u128,
    )
}

/// `ceil(a / b)` for `b > 0`; a zero `b` (never produced by validation) is
/// treated as 1 rather than panicking on input.
pub(crate) fn ceil_div(a: u128, b: u128) -> u128 {
    let q = div(a, b);
    q + u128::from(q * b.max(1) != a)
}

/// `a / b` (`b` = 0 treated as 1), with a 64-bit fast path: the operands are
/// scaled nanoseconds that almost always fit in 64 bits, and a 128-bit
/// division is a library call several times slower than the `div`
/// instruction.
#[inline]
pub(crate) fn div(a: u128, b: u128) -> u128 {
    let b = b.max(1);
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ => a / b,
    }
}

/// A count after post-response settlement: `used + delta`, kept in
/// `0..=limit` (a charge never overdraws, a refund never exceeds full).
pub(crate) fn settle(used: u64, delta: i64, limit: u64) -> u64 {
    if delta >= 0 {
        used.saturating_add(delta.unsigned_abs()).min(limit)
    } else {
        used.saturating_sub(delta.unsigned_abs())
    }
}

/// Narrow a u128 duration to [`Nanos`], saturating.
pub(crate) fn sat_nanos(v: u128) -> Nanos {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Test support for the windowed algorithms: `n` requests of cost 1 at
/// `now` through `decide`, the state kept for each admitted one; how many
/// passed.
#[cfg(test)]
pub(crate) fn burst<S: Copy>(
    decide: fn(S, Nanos, u64, u64, Nanos) -> (S, Verdict),
    state: &mut S,
    now: Nanos,
    n: u64,
    limit: u64,
    window: Nanos,
) -> u64 {
    let mut passed = 0;
    for _ in 0..n {
        let (next, verdict) = decide(*state, now, 1, limit, window);
        if verdict.allowed {
            *state = next;
            passed += 1;
        }
    }
    passed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::LeakyMode;

    const S: Nanos = NANOS_PER_SEC;

    #[test]
    fn window_policy_numbers() {
        let a = Algorithm::SlidingWindow {
            limit: 100,
            window: 60 * S,
        };
        assert_eq!((quota(&a), window_secs(&a)), (100, Some(60)));
        let a = Algorithm::FixedWindow {
            limit: 5,
            window: 250_000_000,
        };
        assert_eq!(window_secs(&a), Some(1), "sub-second windows round up to 1");
    }

    #[test]
    fn token_bucket_w_is_exact() {
        let per_sec = |tokens| Rate { tokens, per: S };
        let a = Algorithm::TokenBucket {
            capacity: 120,
            refill: per_sec(1),
            wait: 0,
        };
        assert_eq!((quota(&a), window_secs(&a)), (120, Some(120)));
        let a = Algorithm::TokenBucket {
            capacity: 20,
            refill: per_sec(10),
            wait: 0,
        };
        assert_eq!(window_secs(&a), Some(2));
        // "0.5/s" = 5 tokens per 10 s: 3 tokens take 6 s.
        let a = Algorithm::TokenBucket {
            capacity: 3,
            refill: Rate {
                tokens: 5,
                per: 10 * S,
            },
            wait: 0,
        };
        assert_eq!(window_secs(&a), Some(6));
        // "600/m", capacity 1: 0.1 s rounds up to the minimum of 1.
        let a = Algorithm::TokenBucket {
            capacity: 1,
            refill: Rate {
                tokens: 600,
                per: 60 * S,
            },
            wait: 0,
        };
        assert_eq!(window_secs(&a), Some(1));
    }

    #[test]
    fn leaky_and_concurrency_policy_numbers() {
        let a = Algorithm::LeakyBucket {
            capacity: 5,
            rate: Rate { tokens: 2, per: S },
            mode: LeakyMode::Delay,
        };
        assert_eq!((quota(&a), window_secs(&a)), (6, Some(3)));
        let a = Algorithm::Concurrency { max: 8 };
        assert_eq!((quota(&a), window_secs(&a)), (8, None));
    }
}
