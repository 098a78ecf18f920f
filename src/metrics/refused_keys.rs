//! The keys refused most: a bounded heavy-hitters sketch (space-saving,
//! Metwally et al. 2005) of the `(limit, key digest)` pairs that limits
//! denied, read by the admin listener's `/stats`.
//!
//! Space-saving keeps [`CAPACITY`] counters. A refusal of a pair it counts
//! adds one; a pair it does not count takes the place of the smallest
//! counter `m` and starts at `m + 1`, remembering `m` as its possible
//! overcount (`error`). Every pair refused more than `n / CAPACITY` times
//! (of `n` refusals) is kept, and a kept count is over the true one by at
//! most its `error`: memory stays fixed whatever the number of keys.
//!
//! Only the deny path records (an admitted request never comes here), and
//! it holds no global lock: each thread writes a shard of its own
//! ([`SHARDS`], picked once per thread), so two workers rarely share one.
//! A reader merges the shards, summing a pair's counts and errors, which is
//! how space-saving summaries merge (Agarwal et al., "Mergeable
//! Summaries", 2012).
//!
//! A key is its 128-bit digest ([`LimitKey`]), never its value: raw API
//! keys, tokens and addresses are not here to leak. The reader names a
//! digest after a consumer where the configuration can.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::limit::LimitKey;

/// Counters per shard.
pub(crate) const CAPACITY: usize = 64;

/// Shards: threads write to `thread index % SHARDS`.
const SHARDS: usize = 8;

/// The sketch; one per process, kept across reloads like the counters.
#[derive(Debug, Default)]
pub(crate) struct RefusedKeys {
    shards: [Mutex<Shard>; SHARDS],
}

/// One shard: at most [`CAPACITY`] counters, in no order.
#[derive(Debug, Default)]
struct Shard {
    counters: Vec<Counted>,
}

/// A pair counted and how often it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Counted {
    /// The limit's name (its metric label).
    pub(crate) limit: Arc<str>,
    /// The key's digest under that limit.
    pub(crate) key: LimitKey,
    /// Refusals counted, at most `error` over the true number.
    pub(crate) count: u64,
    /// How much of `count` may be other pairs' refusals (the smallest
    /// counter's count when this pair took its place).
    pub(crate) error: u64,
}

impl Shard {
    fn record(&mut self, limit: &Arc<str>, key: LimitKey) {
        let same =
            |c: &Counted| c.key == key && (Arc::ptr_eq(&c.limit, limit) || c.limit == *limit);
        if let Some(counted) = self.counters.iter_mut().find(|c| same(c)) {
            counted.count += 1;
            return;
        }
        if self.counters.len() < CAPACITY {
            self.counters.push(Counted {
                limit: limit.clone(),
                key,
                count: 1,
                error: 0,
            });
            return;
        }
        if let Some(smallest) = self.counters.iter_mut().min_by_key(|c| c.count) {
            let floor = smallest.count;
            *smallest = Counted {
                limit: limit.clone(),
                key,
                count: floor + 1,
                error: floor,
            };
        }
    }
}

/// The shard of the calling thread.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|shard| *shard)
}

impl RefusedKeys {
    /// `limit` refused the request counted under `key`.
    pub(crate) fn record(&self, limit: &Arc<str>, key: LimitKey) {
        self.shards[shard_index()].lock().record(limit, key);
    }

    /// The pairs refused most, most first (ties by limit, then digest, so
    /// that the order is stable), at most `n`.
    pub(crate) fn top(&self, n: usize) -> Vec<Counted> {
        let mut merged: HashMap<(Arc<str>, LimitKey), (u64, u64)> = HashMap::new();
        for shard in &self.shards {
            for c in &shard.lock().counters {
                let sum = merged.entry((c.limit.clone(), c.key)).or_default();
                sum.0 += c.count;
                sum.1 += c.error;
            }
        }
        let mut top: Vec<Counted> = merged
            .into_iter()
            .map(|((limit, key), (count, error))| Counted {
                limit,
                key,
                count,
                error,
            })
            .collect();
        top.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.limit.cmp(&b.limit))
                .then_with(|| a.key.as_u128().cmp(&b.key.as_u128()))
        });
        top.truncate(n);
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> LimitKey {
        LimitKey::digest(&[&n.to_le_bytes()])
    }

    #[test]
    fn counts_exactly_while_the_pairs_fit() {
        let sketch = RefusedKeys::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("per_ip"), Arc::from("per_key"));
        for _ in 0..5 {
            sketch.record(&a, key(1));
        }
        sketch.record(&a, key(2));
        // Same digest, other limit: another pair.
        sketch.record(&b, key(1));
        sketch.record(&Arc::from("per_ip"), key(2));
        let top = sketch.top(10);
        let summary: Vec<(&str, LimitKey, u64, u64)> = top
            .iter()
            .map(|c| (&*c.limit, c.key, c.count, c.error))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("per_ip", key(1), 5, 0),
                ("per_ip", key(2), 2, 0),
                ("per_key", key(1), 1, 0),
            ]
        );
        assert_eq!(sketch.top(1).len(), 1);
    }

    #[test]
    fn heavy_hitters_survive_a_flood_of_one_off_keys() {
        let mut shard = Shard::default();
        let limit: Arc<str> = Arc::from("l");
        // Two heavy keys among 10,000 keys seen once each.
        for i in 0..10_000u64 {
            shard.record(&limit, key(1_000_000 + i));
            if i % 10 == 0 {
                shard.record(&limit, key(1));
            }
            if i % 20 == 0 {
                shard.record(&limit, key(2));
            }
        }
        assert!(shard.counters.len() <= CAPACITY);
        let find = |k: LimitKey| shard.counters.iter().find(|c| c.key == k).cloned();
        let heavy = find(key(1)).expect("the heaviest key is kept");
        let second = find(key(2)).expect("the second key is kept");
        // The bound: the count is at least the truth, at most truth + error.
        assert!(heavy.count >= 1_000 && heavy.count - heavy.error <= 1_000);
        assert!(second.count >= 500 && second.count - second.error <= 500);
        // n / CAPACITY bounds every error.
        let n = 10_000 + 1_000 + 500;
        assert!(
            shard
                .counters
                .iter()
                .all(|c| c.error <= n / CAPACITY as u64)
        );
    }

    #[test]
    fn shards_of_several_threads_merge() {
        let sketch = Arc::new(RefusedKeys::default());
        let limit: Arc<str> = Arc::from("l");
        let threads: Vec<_> = (0..SHARDS * 2)
            .map(|_| {
                let (sketch, limit) = (sketch.clone(), limit.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        sketch.record(&limit, key(7));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("thread");
        }
        let top = sketch.top(CAPACITY);
        assert_eq!(top.len(), 1);
        assert_eq!((top[0].count, top[0].error), (100 * SHARDS as u64 * 2, 0));
    }
}
