//! Validated parameters of one limit's algorithm, as `gateway.toml` spells them.
//!
//! Time is `Nanos`, nanoseconds since the Unix epoch (windows are aligned to the
//! epoch, so the clock must be wall-clock based). Rates are exact rationals
//! (`tokens` every `per` nanoseconds) so that header arithmetic such as
//! `w = ceil(capacity / refill)` is exact: `"0.5/s"` is 5 tokens per 10 s.

/// Nanoseconds; as an instant, since the Unix epoch.
pub type Nanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// A rate: `tokens` cost units every `per` nanoseconds. Both are non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    pub tokens: u64,
    pub per: Nanos,
}

/// What a leaky bucket does with a request that finds the bucket non-empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeakyMode {
    /// nginx `limit_req burst=N nodelay`: admit at once while the bucket has room.
    Reject,
    /// nginx `limit_req burst=N`: queue the excess, release it at `rate`.
    Delay,
}

/// One limit's algorithm and its parameters (all counts in cost units, all > 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    FixedWindow {
        limit: u64,
        window: Nanos,
    },
    SlidingWindow {
        limit: u64,
        window: Nanos,
    },
    SlidingLog {
        limit: u64,
        window: Nanos,
    },
    TokenBucket {
        capacity: u64,
        refill: Rate,
        /// `wait`: hold a request the bucket would admit within this long
        /// instead of refusing it (0: refuse at once). See `token_bucket`.
        wait: Nanos,
    },
    LeakyBucket {
        capacity: u64,
        rate: Rate,
        mode: LeakyMode,
    },
    Concurrency {
        max: u64,
    },
    /// A concurrency limit that follows the upstream (`limit::adaptive`);
    /// always node-local.
    Adaptive {
        params: super::adaptive::Params,
    },
}

impl Algorithm {
    /// The numbers a settlement may charge up to when a balance may go
    /// below zero by at most the quota (token limits: a response that used
    /// more than it reserved): the quota doubled, the rate kept. Only the
    /// ceiling of a charge reads them.
    pub(crate) fn with_debt(self) -> Algorithm {
        use Algorithm::*;
        match self {
            FixedWindow { limit, window } => FixedWindow {
                limit: limit.saturating_mul(2),
                window,
            },
            SlidingWindow { limit, window } => SlidingWindow {
                limit: limit.saturating_mul(2),
                window,
            },
            SlidingLog { limit, window } => SlidingLog {
                limit: limit.saturating_mul(2),
                window,
            },
            TokenBucket {
                capacity,
                refill,
                wait,
            } => TokenBucket {
                capacity: capacity.saturating_mul(2),
                refill,
                wait,
            },
            // Its burst is capacity + 1: doubled, 2 * capacity + 1.
            LeakyBucket {
                capacity,
                rate,
                mode,
            } => LeakyBucket {
                capacity: capacity.saturating_mul(2).saturating_add(1),
                rate,
                mode,
            },
            Concurrency { max } => Concurrency { max },
            Adaptive { params } => Adaptive { params },
        }
    }

    /// The same algorithm with its quota (and rate) times `num / den`
    /// (at most 1), rounded down but at least 1: a node's share of a shared
    /// limit (`store.local_fraction`). Windows keep their length.
    pub(crate) fn scaled(self, num: u64, den: u64) -> Algorithm {
        let den = den.max(1);
        let num = num.min(den);
        let part = |n: u64| (u128::from(n) * u128::from(num) / u128::from(den)).max(1) as u64;
        // A rate of tokens/per becomes tokens·num / (per·den), kept exact
        // while it fits (it always does for validated rates).
        let rate = |r: Rate| match (r.tokens.checked_mul(num), r.per.checked_mul(den)) {
            (Some(tokens), Some(per)) if tokens > 0 => {
                let (mut a, mut b) = (tokens, per);
                while b != 0 {
                    (a, b) = (b, a % b);
                }
                Rate {
                    tokens: tokens / a,
                    per: per / a,
                }
            }
            _ => r,
        };
        if num >= den {
            return self;
        }
        match self {
            Algorithm::FixedWindow { limit, window } => Algorithm::FixedWindow {
                limit: part(limit),
                window,
            },
            Algorithm::SlidingWindow { limit, window } => Algorithm::SlidingWindow {
                limit: part(limit),
                window,
            },
            Algorithm::SlidingLog { limit, window } => Algorithm::SlidingLog {
                limit: part(limit),
                window,
            },
            // A share's `wait` is the same time: its debt scales with its rate.
            Algorithm::TokenBucket {
                capacity,
                refill,
                wait,
            } => Algorithm::TokenBucket {
                capacity: part(capacity),
                refill: rate(refill),
                wait,
            },
            Algorithm::LeakyBucket {
                capacity,
                rate: r,
                mode,
            } => Algorithm::LeakyBucket {
                capacity: (u128::from(capacity) * u128::from(num) / u128::from(den)) as u64,
                rate: rate(r),
                mode,
            },
            Algorithm::Concurrency { max } => Algorithm::Concurrency { max: part(max) },
            // Node-local by nature: each node measures its own traffic.
            Algorithm::Adaptive { params } => Algorithm::Adaptive { params },
        }
    }
}

/// Where a fixed window's boundaries fall for each key (`align`,
/// `reset_jitter`), so that long windows of many keys do not all reset in the
/// same second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WindowAlign {
    /// At multiples of the window since the Unix epoch, each key shifted by a
    /// fixed offset in `[0, jitter)` derived from its digest (0: no shift).
    Epoch { jitter: Nanos },
    /// A key's window starts at its first request; the next one starts with
    /// the first request after it ends.
    FirstRequest,
    /// `window = "1mo"`: calendar months in UTC (`super::calendar`), each
    /// key shifted by a fixed offset in `[0, jitter)` as for `Epoch`.
    Month { jitter: Nanos },
}

impl Default for WindowAlign {
    fn default() -> Self {
        WindowAlign::Epoch { jitter: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NANOS_PER_SEC;

    #[test]
    fn scaled_takes_an_exact_share_at_least_one() {
        let w = Algorithm::FixedWindow {
            limit: 30,
            window: S,
        };
        assert_eq!(
            w.scaled(1, 3),
            Algorithm::FixedWindow {
                limit: 10,
                window: S
            }
        );
        assert_eq!(
            w.scaled(1, 100),
            Algorithm::FixedWindow {
                limit: 1,
                window: S
            }
        );
        assert_eq!(w.scaled(1, 1), w);
        let b = Algorithm::TokenBucket {
            capacity: 20,
            refill: Rate { tokens: 10, per: S },
            wait: 0,
        };
        // 10/s halved is 5/s, reduced: 1 token per 200 ms.
        let half = Algorithm::TokenBucket {
            capacity: 10,
            refill: Rate {
                tokens: 1,
                per: S / 5,
            },
            wait: 0,
        };
        assert_eq!(b.scaled(500_000, 1_000_000), half);
        let c = Algorithm::Concurrency { max: 3 };
        assert_eq!(c.scaled(1, 2), Algorithm::Concurrency { max: 1 });
    }
}
