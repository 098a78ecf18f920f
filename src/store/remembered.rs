//! Denials a node remembers (`store.remember_denials`).
//!
//! When Redis denies a key's request of cost *c* with a retry-after *r*, no
//! request of cost *c* or more on that key can pass before *r* has gone by:
//! other nodes' requests only spend. So for the shorter of *r* and
//! `remember_denials`, this node denies such requests itself, from the
//! verdict Redis gave (its retry-after counted down), without a call: a flood
//! on a denied key costs Redis one call per key, worker and
//! `remember_denials`, not one per request, and the denials no longer queue
//! on the worker's Redis connection ahead of other clients' decisions.
//!
//! What another node *can* bring back early is never remembered (the
//! snapshot decides which limits, `SharedEntry::remember`): concurrency slots,
//! leased buckets, limits a response can refund. What is left to it: a key
//! an operator deletes in Redis stays denied on a node that remembers it, for
//! at most `remember_denials`.
//!
//! Per worker thread, so without a lock. A reload moves the store's epoch,
//! and a thread finding a new epoch forgets everything (the limits may have
//! changed). At most [`MOST`] denials per thread.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use super::{OwnedEntry, SharedEntry};
use crate::limit::{LimitKey, Nanos, Verdict};

/// Most denials one thread remembers: a flood over many keys cannot grow the
/// table without bound. When full, lapsed denials go; if none has lapsed, a
/// new denial is not remembered.
const MOST: usize = 4096;

/// Epochs are unique in the process: one store's cannot pass for another's.
static EPOCHS: AtomicU64 = AtomicU64::new(1);

/// A fresh epoch (a store starting, a reload).
pub(super) fn new_epoch() -> u64 {
    EPOCHS.fetch_add(1, Ordering::Relaxed)
}

/// One key's denial, as Redis gave it.
struct Denial {
    entry: OwnedEntry,
    /// The cost denied: a request of this cost or more cannot pass.
    cost: u64,
    verdict: Verdict,
    /// When the call that denied was sent: no later than Redis decided, so
    /// the retry-after counted from here is never later than Redis's.
    asked: Instant,
    /// Until when it is answered from memory.
    until: Instant,
}

impl Denial {
    /// The verdict as it stands at `now`: its times counted down.
    fn at(&self, now: Instant) -> Verdict {
        let elapsed = Nanos::try_from((now - self.asked).as_nanos()).unwrap_or(Nanos::MAX);
        Verdict::deny(
            self.verdict.remaining,
            self.verdict.reset_after.saturating_sub(elapsed),
            self.verdict
                .retry_after
                .unwrap_or(0)
                .saturating_sub(elapsed)
                .max(1),
            false,
        )
    }
}

/// One thread's denials, of the store whose epoch it holds.
struct Memory {
    epoch: u64,
    denials: HashTable<Denial>,
}

impl Memory {
    /// The denials of `epoch`: none when the thread last saw another.
    fn of(&mut self, epoch: u64) -> &mut HashTable<Denial> {
        if self.epoch != epoch {
            self.epoch = epoch;
            self.denials.clear();
        }
        &mut self.denials
    }
}

thread_local! {
    static MEMORY: RefCell<Memory> = const {
        RefCell::new(Memory {
            epoch: 0,
            denials: HashTable::new(),
        })
    };
}

/// The table's hash of a key: its digest's half, already uniform (the
/// limits that share a digest only share a bucket).
fn hash_of(key: LimitKey) -> u64 {
    key.halves().1
}

/// The first of `entries`, in stack order, that this thread remembers as
/// denied for a cost no greater than the entry's, and its verdict now.
pub(super) fn recall(epoch: u64, entries: &[SharedEntry<'_>]) -> Option<(usize, Verdict)> {
    MEMORY.with_borrow_mut(|memory| {
        let denials = memory.of(epoch);
        if denials.is_empty() {
            return None;
        }
        let now = Instant::now();
        entries.iter().enumerate().find_map(|(i, e)| {
            if !e.remember {
                return None;
            }
            let found = denials.find_entry(hash_of(e.key), |d| d.entry.is(e)).ok()?;
            if found.get().until <= now {
                found.remove();
                return None;
            }
            let denial = found.get();
            (e.cost >= denial.cost).then(|| (i, denial.at(now)))
        })
    })
}

/// Remembers, for at most `most`, each of `entries` that Redis denied (in
/// `verdicts`, in the call sent at `asked`) and that may be remembered.
pub(super) fn remember(
    epoch: u64,
    entries: &[SharedEntry<'_>],
    verdicts: &[Option<Verdict>],
    asked: Instant,
    most: Duration,
) {
    MEMORY.with_borrow_mut(|memory| {
        let denials = memory.of(epoch);
        for (e, verdict) in entries.iter().zip(verdicts) {
            let Some(verdict) = verdict else { continue };
            // A shadow limit denies nothing; `never` has no retry-after.
            let Some(retry) = verdict.retry_after.filter(|_| !verdict.allowed) else {
                continue;
            };
            if !e.remember || e.shadow || retry == 0 {
                continue;
            }
            let until = asked + Duration::from_nanos(retry).min(most);
            match denials.find_entry(hash_of(e.key), |d| d.entry.is(e)) {
                // The latest denial holds: it was decided no earlier.
                Ok(mut found) => {
                    let denial = found.get_mut();
                    denial.cost = e.cost;
                    denial.verdict = *verdict;
                    denial.asked = asked;
                    denial.until = until;
                }
                Err(_) => {
                    if denials.len() >= MOST {
                        let now = Instant::now();
                        denials.retain(|d| d.until > now);
                        if denials.len() >= MOST {
                            continue;
                        }
                    }
                    let denial = Denial {
                        entry: OwnedEntry::from(e),
                        cost: e.cost,
                        verdict: *verdict,
                        asked,
                        until,
                    };
                    denials.insert_unique(hash_of(e.key), denial, |d| hash_of(d.entry.key));
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, NANOS_PER_SEC, Rate, WindowAlign};

    const MS: Nanos = 1_000_000;

    fn entry(key: u128, cost: u64) -> SharedEntry<'static> {
        SharedEntry {
            limit: "per_key",
            plan: None,
            algorithm: Algorithm::TokenBucket {
                capacity: 10,
                refill: Rate {
                    tokens: 1,
                    per: NANOS_PER_SEC,
                },
                wait: 0,
            },
            align: WindowAlign::default(),
            key: LimitKey::from_u128(key),
            shadow: false,
            lease: 0,
            cost,
            remember: true,
        }
    }

    fn denied(retry: Nanos) -> Option<Verdict> {
        Some(Verdict::deny(0, retry, retry, false))
    }

    #[test]
    fn a_denial_answers_costs_at_least_its_own_until_it_lapses() {
        let epoch = new_epoch();
        let asked = Instant::now();
        let e = entry(1, 2);
        remember(
            epoch,
            &[e],
            &[denied(900 * MS)],
            asked,
            Duration::from_secs(1),
        );
        let (i, verdict) = recall(epoch, &[entry(9, 1), e]).expect("remembered");
        assert_eq!(i, 1);
        assert!(!verdict.allowed);
        let retry = verdict.retry_after.expect("a retry-after");
        assert!(retry <= 900 * MS && retry > 0, "{retry}");
        // A dearer request: denied too. A cheaper one may pass: asked.
        assert!(recall(epoch, &[entry(1, 5)]).is_some());
        assert!(recall(epoch, &[entry(1, 1)]).is_none());
        // Another limit on the same key digest, a plan, other numbers: not it.
        assert!(
            recall(
                epoch,
                &[SharedEntry {
                    limit: "other",
                    ..e
                }]
            )
            .is_none()
        );
        assert!(
            recall(
                epoch,
                &[SharedEntry {
                    plan: Some("pro"),
                    ..e
                }]
            )
            .is_none()
        );
        let smaller = Algorithm::FixedWindow {
            limit: 1,
            window: NANOS_PER_SEC,
        };
        assert!(
            recall(
                epoch,
                &[SharedEntry {
                    algorithm: smaller,
                    ..e
                }]
            )
            .is_none()
        );
        // A new epoch (a reload) forgets.
        assert!(recall(new_epoch(), &[e]).is_none());
        assert!(recall(epoch, &[e]).is_none());
    }

    #[test]
    fn what_may_not_be_remembered_is_not() {
        let epoch = new_epoch();
        let asked = Instant::now();
        let most = Duration::from_secs(1);
        let cases = [
            (
                SharedEntry {
                    remember: false,
                    ..entry(2, 1)
                },
                denied(MS),
            ),
            (
                SharedEntry {
                    shadow: true,
                    ..entry(3, 1)
                },
                denied(MS),
            ),
            (entry(4, 1), Some(Verdict::allow(3, MS))),
            // `never`: no retry-after.
            (entry(5, 1), Some(Verdict::deny(0, MS, 0, true))),
            // Not decided (an earlier Cluster slot denied).
            (entry(6, 1), None),
        ];
        for (e, verdict) in cases {
            remember(epoch, &[e], &[verdict], asked, most);
            assert!(
                recall(
                    epoch,
                    &[SharedEntry {
                        remember: true,
                        ..e
                    }]
                )
                .is_none(),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_denial_is_remembered_no_longer_than_asked_nor_than_its_retry_after() {
        let epoch = new_epoch();
        let long_ago = Instant::now() - Duration::from_millis(50);
        // Key `key` denied 50 ms ago with `retry` ms, remembered for `most`.
        let remember_one = |key: u128, retry: Nanos, most: Duration| {
            remember(
                epoch,
                &[entry(key, 1)],
                &[denied(retry * MS)],
                long_ago,
                most,
            );
            recall(epoch, &[entry(key, 1)])
        };
        // Retry-after 10 s, remembered for 20 ms: lapsed.
        assert!(remember_one(7, 10_000, Duration::from_millis(20)).is_none());
        // Retry-after 20 ms, remembered for up to 10 s: lapsed too.
        assert!(remember_one(8, 20, Duration::from_secs(10)).is_none());
        // Retry-after 10 s, remembered for 10 s: 50 ms of it counted down.
        let (_, verdict) = remember_one(9, 10_000, Duration::from_secs(10)).expect("remembered");
        let retry = verdict.retry_after.unwrap();
        assert!(retry <= 9_950 * MS && retry > 9_000 * MS, "{retry}");
    }

    #[test]
    fn a_thread_remembers_at_most_most_denials() {
        let epoch = new_epoch();
        let asked = Instant::now();
        let most = Duration::from_secs(10);
        for key in 0..(MOST as u128 + 10) {
            remember(
                epoch,
                &[entry(1000 + key, 1)],
                &[denied(5_000 * MS)],
                asked,
                most,
            );
        }
        MEMORY.with_borrow(|memory| assert_eq!(memory.denials.len(), MOST));
        assert!(recall(epoch, &[entry(1000, 1)]).is_some());
        assert!(recall(epoch, &[entry(1000 + MOST as u128 + 5, 1)]).is_none());
    }
}
