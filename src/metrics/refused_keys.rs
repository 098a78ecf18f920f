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
//! A shard finds a counted pair by a hash index and the counter to replace
//! by a cursor, so a refusal costs the same few steps however many keys
//! are refused (see [`Shard`]).
//! A reader merges the shards, summing a pair's counts and errors, which is
//! how space-saving summaries merge (Agarwal et al., "Mergeable
//! Summaries", 2012).
//!
//! A key is its 128-bit digest ([`LimitKey`]), never its value: raw API
//! keys, tokens and addresses are not here to leak. The reader names a
//! digest after a consumer where the configuration can.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::LocalKey;

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

/// One shard: at most [`CAPACITY`] counters, in no order, found by a hash
/// index rather than a scan.
///
/// A refusal flood is the very time the deny path must stay cheap, and it
/// is often a flood of many keys (addresses): a scan of the counters cost
/// up to 64 comparisons per refusal, and each key new to a full shard a
/// second pass for the smallest counter. Here a counted pair is found in
/// [`INDEX`] slots of linear probing (at most half full) from its digest's
/// low half, and the smallest counter by a cursor that goes on from where
/// it stopped: every counter is at least `floor`, so the first at `floor`
/// is a smallest, and a whole pass finding none raises `floor` to the true
/// smallest.
#[derive(Debug)]
struct Shard {
    counters: Vec<Counted>,
    /// Per slot, the position + 1 of the counter whose pair probes from
    /// here (0: free).
    index: [u8; INDEX],
    /// No counter is below it.
    floor: u64,
    /// Where the search for a smallest counter goes on.
    cursor: usize,
}

/// Slots of a shard's index: twice [`CAPACITY`], a power of two.
const INDEX: usize = 2 * CAPACITY;

impl Default for Shard {
    fn default() -> Shard {
        Shard {
            counters: Vec::new(),
            index: [0; INDEX],
            floor: 0,
            cursor: 0,
        }
    }
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

/// The index slot a key's probe starts at.
fn home(key: LimitKey) -> usize {
    // A digest's bits are uniform: its low half's low bits will do.
    (key.halves().1 as usize) & (INDEX - 1)
}

impl Shard {
    fn record(&mut self, limit: &Arc<str>, key: LimitKey) {
        let mut slot = home(key);
        loop {
            let at = usize::from(self.index[slot]);
            if at == 0 {
                break;
            }
            let counted = &mut self.counters[at - 1];
            if counted.key == key && (Arc::ptr_eq(&counted.limit, limit) || counted.limit == *limit)
            {
                counted.count += 1;
                return;
            }
            slot = (slot + 1) & (INDEX - 1);
        }
        self.take_place(slot, limit, key);
    }

    /// A pair not counted: a counter of its own while there is room, else
    /// the place of a smallest counter. `free` is the index slot where its
    /// probe ended.
    #[cold]
    fn take_place(&mut self, free: usize, limit: &Arc<str>, key: LimitKey) {
        if self.counters.len() < CAPACITY {
            self.counters.push(Counted {
                limit: limit.clone(),
                key,
                count: 1,
                error: 0,
            });
            self.index[free] = self.counters.len() as u8;
            return;
        }
        let at = self.smallest();
        self.unindex(at);
        let floor = self.counters[at].count;
        self.counters[at] = Counted {
            limit: limit.clone(),
            key,
            count: floor + 1,
            error: floor,
        };
        // The slot freed above may be on this key's probe: probed again.
        let mut slot = home(key);
        while self.index[slot] != 0 {
            slot = (slot + 1) & (INDEX - 1);
        }
        self.index[slot] = (at + 1) as u8;
    }

    /// The position of a smallest counter (the shard is full).
    fn smallest(&mut self) -> usize {
        loop {
            for _ in 0..self.counters.len() {
                let at = self.cursor;
                self.cursor = (at + 1) % self.counters.len();
                if self.counters[at].count <= self.floor {
                    return at;
                }
            }
            // None at `floor`: the smallest is above it.
            self.floor = self.counters.iter().map(|c| c.count).min().unwrap_or(0);
        }
    }

    /// The counter at `at` out of the index: its slot emptied, and the
    /// slots probing past it moved back (deletion in linear probing), so
    /// that every probe still reaches its pair before a free slot.
    fn unindex(&mut self, at: usize) {
        let mut hole = home(self.counters[at].key);
        while usize::from(self.index[hole]) != at + 1 {
            hole = (hole + 1) & (INDEX - 1);
        }
        let mut next = hole;
        loop {
            next = (next + 1) & (INDEX - 1);
            let held = usize::from(self.index[next]);
            if held == 0 {
                break;
            }
            // It may fill the hole unless its probe starts after the hole.
            let from = home(self.counters[held - 1].key);
            if next.wrapping_sub(from) & (INDEX - 1) >= next.wrapping_sub(hole) & (INDEX - 1) {
                self.index[hole] = self.index[next];
                hole = next;
            }
        }
        self.index[hole] = 0;
    }
}

/// The shard of the calling thread: a constant thread-local read (a lazy
/// one checked its state on every refusal), picked on the thread's first.
#[inline(always)]
fn shard_index() -> usize {
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    match SHARD.get() {
        usize::MAX => first_shard_index(&SHARD),
        shard => shard,
    }
}

/// The calling thread's shard, picked on its first refusal.
#[cold]
#[inline(never)]
fn first_shard_index(slot: &'static LocalKey<Cell<usize>>) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let shard = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    slot.set(shard);
    shard
}

impl RefusedKeys {
    /// `limit` refused the request counted under `key`.
    #[inline(always)]
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
    fn the_index_finds_every_counted_pair_through_any_replacements() {
        let mut shard = Shard::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let mut n = 0u64;
        // Keys of both limits, the same digests under each, coming back
        // at every distance: replacements all over the index.
        for i in 0..20_000u64 {
            let limit = if i % 3 == 0 { &a } else { &b };
            shard.record(limit, key(i % 97 + (i / 1000) * 13));
            n += 1;
        }
        // Space-saving's counts always sum to the refusals seen.
        assert_eq!(shard.counters.iter().map(|c| c.count).sum::<u64>(), n);
        let counted = shard.counters.clone();
        let mut pairs: Vec<(&str, u128)> = counted
            .iter()
            .map(|c| (&*c.limit, c.key.as_u128()))
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        assert_eq!(pairs.len(), CAPACITY, "each pair counted once");
        // Each counted pair is found (counted again), none taken in anew.
        for c in &counted {
            shard.record(&c.limit, c.key);
        }
        for (before, after) in counted.iter().zip(&shard.counters) {
            assert_eq!((&before.limit, before.key), (&after.limit, after.key));
            assert_eq!(after.count, before.count + 1);
        }
        let used = shard.index.iter().filter(|&&at| at != 0).count();
        assert_eq!(used, CAPACITY);
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
