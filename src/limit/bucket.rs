//! A token or leaky bucket's numbers, taken out of its [`Algorithm`], and
//! its decision on a key's `tat`: what a limiter decides on a bucket's
//! table, where every key is one `tat`.
//!
//! Two forms of the one decision: every arm in line for a held key's
//! decision, the hot path of a bucket ([`Bucket::decide_in_line`]), and the
//! plain token bucket alone in line for the general path all algorithms
//! share ([`Bucket::decide`]). Each says why.

use super::{Algorithm, LeakyMode, Nanos, Rate, Verdict};
use super::{leaky_bucket, token_bucket};

/// The bucket's numbers, as its algorithm gives them.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bucket {
    /// A token bucket that refuses at once (`wait = 0`).
    Token { capacity: u64, refill: Rate },
    /// A token bucket that holds a request it would admit within `wait`.
    TokenWaiting {
        capacity: u64,
        refill: Rate,
        wait: Nanos,
    },
    /// A leaky bucket, refusing or delaying the excess (`mode`).
    Leaky {
        capacity: u64,
        rate: Rate,
        mode: LeakyMode,
    },
}

impl Bucket {
    /// `algorithm`'s bucket; `None` for an algorithm that is not one.
    #[inline(always)]
    pub(crate) fn of(algorithm: Algorithm) -> Option<Bucket> {
        Some(match algorithm {
            Algorithm::TokenBucket {
                capacity,
                refill,
                wait: 0,
            } => Bucket::Token { capacity, refill },
            Algorithm::TokenBucket {
                capacity,
                refill,
                wait,
            } => Bucket::TokenWaiting {
                capacity,
                refill,
                wait,
            },
            Algorithm::LeakyBucket {
                capacity,
                rate,
                mode,
            } => Bucket::Leaky {
                capacity,
                rate,
                mode,
            },
            _ => return None,
        })
    }

    /// The decision for `cost` at `now` on the key's `tat`: the state to
    /// store if admitted, and the verdict. Every arm in line, for a held
    /// key's decision ([`Limiter::charge_held`](super::Limiter)): with
    /// the waiting and leaky buckets out of line, the merged result lived
    /// on the stack, written a field at a time and read back at once in
    /// wider pieces the stores could not be forwarded to, which made the
    /// plain token bucket's decision 1.13× `5bdeb93`'s time with fewer
    /// instructions (BENCHMARKS.md "Limiter decisions").
    #[inline(always)]
    pub(crate) fn decide_in_line(
        self,
        tat: token_bucket::State,
        now: Nanos,
        cost: u64,
    ) -> (token_bucket::State, Verdict) {
        match self {
            Bucket::Token { capacity, refill } => {
                token_bucket::decide(tat, now, cost, capacity, refill)
            }
            Bucket::TokenWaiting {
                capacity,
                refill,
                wait,
            } => token_bucket::decide_waiting(tat, now, cost, capacity, refill, wait),
            Bucket::Leaky {
                capacity,
                rate,
                mode,
            } => leaky_bucket::decide(tat, now, cost, capacity, rate, mode),
        }
    }

    /// [`Bucket::decide_in_line`] with the plain token bucket alone in
    /// line, the others in one call: for the decision every algorithm's
    /// general path shares (`Limiter::decide`), where the buckets' code in
    /// line made the other algorithms' decisions dearer
    /// (`bench/limiter_instructions.sh`).
    #[inline(always)]
    pub(crate) fn decide(
        self,
        tat: token_bucket::State,
        now: Nanos,
        cost: u64,
    ) -> (token_bucket::State, Verdict) {
        match self {
            Bucket::Token { capacity, refill } => {
                token_bucket::decide(tat, now, cost, capacity, refill)
            }
            other => other.decide_apart(tat, now, cost),
        }
    }

    /// The waiting and leaky buckets' decision, out of line.
    #[inline(never)]
    fn decide_apart(
        self,
        tat: token_bucket::State,
        now: Nanos,
        cost: u64,
    ) -> (token_bucket::State, Verdict) {
        self.decide_in_line(tat, now, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::NANOS_PER_SEC as S;

    #[test]
    fn both_forms_decide_as_the_algorithm() {
        let rate = Rate { tokens: 7, per: S };
        let algorithms = [
            Algorithm::TokenBucket {
                capacity: 5,
                refill: rate,
                wait: 0,
            },
            Algorithm::TokenBucket {
                capacity: 5,
                refill: rate,
                wait: S / 2,
            },
            Algorithm::LeakyBucket {
                capacity: 5,
                rate,
                mode: LeakyMode::Reject,
            },
            Algorithm::LeakyBucket {
                capacity: 5,
                rate,
                mode: LeakyMode::Delay,
            },
        ];
        for algorithm in algorithms {
            let bucket = Bucket::of(algorithm).expect("a bucket");
            let (mut tat, mut now) = (token_bucket::State::default(), 10 * S);
            let (mut allowed, mut denied) = (0, 0);
            for step in 0..400u64 {
                now += step % 5 * S / 20;
                let cost = 1 + step % 3;
                let want = match algorithm {
                    Algorithm::TokenBucket {
                        capacity,
                        refill,
                        wait,
                    } => token_bucket::decide_waiting(tat, now, cost, capacity, refill, wait),
                    Algorithm::LeakyBucket {
                        capacity,
                        rate,
                        mode,
                    } => leaky_bucket::decide(tat, now, cost, capacity, rate, mode),
                    _ => unreachable!("only buckets above"),
                };
                let in_line = bucket.decide_in_line(tat, now, cost);
                let apart = bucket.decide(tat, now, cost);
                assert_eq!((in_line.0.tat(), in_line.1), (want.0.tat(), want.1));
                assert_eq!((apart.0.tat(), apart.1), (want.0.tat(), want.1));
                if want.1.allowed {
                    tat = want.0;
                    allowed += 1;
                } else {
                    denied += 1;
                }
            }
            // Both answers were met, so the test compared both.
            assert!(
                allowed > 50 && denied > 50,
                "{algorithm:?}: {allowed} / {denied}"
            );
        }
    }

    #[test]
    fn only_buckets_have_one() {
        let window = Algorithm::FixedWindow {
            limit: 5,
            window: S,
        };
        assert!(Bucket::of(window).is_none());
        assert!(Bucket::of(Algorithm::Concurrency { max: 3 }).is_none());
    }
}
