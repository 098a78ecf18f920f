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
//! it takes no lock for a pair already counted: each thread writes a shard
//! of its own ([`Shard`], claimed on its first refusal; threads past the
//! [`ALONE`] first share the [`SHARED`] others, one writer at a time),
//! whose counts only it changes, so that counting again is a load and a
//! store. A shard finds a counted pair by a hash index and the counter to
//! replace by a cursor, so a refusal costs the same few steps however many
//! keys are refused.
//! A reader merges the shards, summing a pair's counts and errors, which is
//! how space-saving summaries merge (Agarwal et al., "Mergeable
//! Summaries", 2012). Counts are exact: a pair changes (taken in, or
//! replaced) only under its shard's lock, which the reader holds.
//!
//! A key is its 128-bit digest ([`LimitKey`]), never its value: raw API
//! keys, tokens and addresses are not here to leak. The reader names a
//! digest after a consumer where the configuration can.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::limit::LimitKey;

/// Counters per shard.
pub(crate) const CAPACITY: usize = 64;

/// Shards a thread may claim for itself alone: one per worker, and more.
const ALONE: usize = 16;

/// Shards the threads past [`ALONE`] share (`thread % SHARED`).
const SHARED: usize = 4;

/// Slots of a shard's index: twice [`CAPACITY`], a power of two.
const INDEX: usize = 2 * CAPACITY;

/// The sketch; one per process, kept across reloads like the counters.
#[derive(Debug)]
pub(crate) struct RefusedKeys {
    /// This sketch among others (the tests' several), as a thread's claim
    /// names it.
    id: u64,
    /// [`ALONE`] shards a thread each, then [`SHARED`] shared ones.
    shards: Box<[Shard]>,
}

impl Default for RefusedKeys {
    fn default() -> RefusedKeys {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        RefusedKeys {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shards: (0..ALONE + SHARED).map(|_| Shard::default()).collect(),
        }
    }
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
///
/// One thread writes it at a time (its owner, or the holder of `writer`):
/// the index, the digests, the limits' addresses and the counts are
/// atomics only so that the reader may read the counts beside the pairs.
/// The writer changes a pair only under `pairs`, which the reader takes.
#[derive(Debug)]
struct Shard {
    /// Claimed by a thread as its own.
    claimed: AtomicBool,
    /// Held by a writer of a shared shard.
    writer: Mutex<()>,
    /// The pairs counted, in counter order, and the search for a smallest.
    pairs: Mutex<Pairs>,
    /// Per slot, the position + 1 of the counter whose pair probes from
    /// here (0: free).
    index: [AtomicU8; INDEX],
    /// Per counter, its digest's halves and its limit's address (the
    /// `Arc` that `pairs` keeps), compared on each refusal.
    high: [AtomicU64; CAPACITY],
    low: [AtomicU64; CAPACITY],
    limit: [AtomicUsize; CAPACITY],
    /// Per counter, the refusals counted, at most its `error` over the
    /// true number.
    counts: [AtomicU64; CAPACITY],
}

/// A shard's pairs, and where the search for a smallest counter stands.
#[derive(Debug, Default)]
struct Pairs {
    counted: Vec<Pair>,
    /// No counter is below it.
    floor: u64,
    /// Where the search for a smallest counter goes on.
    cursor: usize,
}

/// The pair a counter counts.
#[derive(Debug)]
struct Pair {
    limit: Arc<str>,
    key: LimitKey,
    /// How much of the count may be other pairs' refusals.
    error: u64,
}

impl Default for Shard {
    fn default() -> Shard {
        Shard {
            claimed: AtomicBool::new(false),
            writer: Mutex::new(()),
            pairs: Mutex::new(Pairs::default()),
            index: [const { AtomicU8::new(0) }; INDEX],
            high: [const { AtomicU64::new(0) }; CAPACITY],
            low: [const { AtomicU64::new(0) }; CAPACITY],
            limit: [const { AtomicUsize::new(0) }; CAPACITY],
            counts: [const { AtomicU64::new(0) }; CAPACITY],
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

/// The slot after `slot`, round the index.
fn next(slot: usize) -> usize {
    (slot + 1) & (INDEX - 1)
}

/// A limit's name by its address: the same `Arc`, the same name. (The
/// same name under another `Arc`, a reload's, is found by its text.)
fn address(limit: &Arc<str>) -> usize {
    Arc::as_ptr(limit).cast::<u8>().addr()
}

impl Shard {
    /// A refusal of `(limit, key)`, by the shard's one writer.
    fn record(&self, limit: &Arc<str>, key: LimitKey) {
        if !self.count_again(limit, key) {
            self.take_place(limit, key);
        }
    }

    /// One more refusal of a pair counted under this very `limit`: no
    /// lock, one load and one store of its count. `false`: not counted so.
    #[inline(always)]
    fn count_again(&self, limit: &Arc<str>, key: LimitKey) -> bool {
        let (high, low) = key.halves();
        let mut slot = home(key);
        loop {
            let at = usize::from(self.index[slot].load(Ordering::Relaxed));
            if at == 0 {
                return false;
            }
            // Positions are below `CAPACITY`: said, no bounds check.
            let i = (at - 1) % CAPACITY;
            if self.low[i].load(Ordering::Relaxed) == low
                && self.high[i].load(Ordering::Relaxed) == high
                && self.limit[i].load(Ordering::Relaxed) == address(limit)
            {
                let count = &self.counts[i];
                count.store(count.load(Ordering::Relaxed) + 1, Ordering::Release);
                return true;
            }
            slot = next(slot);
        }
    }

    /// The digest counted at `i`.
    fn counts_key(&self, i: usize, key: LimitKey) -> bool {
        let (high, low) = key.halves();
        self.low[i].load(Ordering::Relaxed) == low && self.high[i].load(Ordering::Relaxed) == high
    }

    /// A pair not counted under this `limit`: counted under another copy
    /// of its name (the copy taken), else a counter of its own while there
    /// is room, else the place of a smallest counter.
    #[cold]
    #[inline(never)]
    fn take_place(&self, limit: &Arc<str>, key: LimitKey) {
        let mut pairs = self.pairs.lock();
        let mut slot = home(key);
        loop {
            let at = usize::from(self.index[slot].load(Ordering::Relaxed));
            if at == 0 {
                break;
            }
            let i = at - 1;
            if self.counts_key(i, key) && *pairs.counted[i].limit == **limit {
                pairs.counted[i].limit = limit.clone();
                self.limit[i].store(address(limit), Ordering::Relaxed);
                let count = &self.counts[i];
                count.store(count.load(Ordering::Relaxed) + 1, Ordering::Release);
                return;
            }
            slot = next(slot);
        }
        if pairs.counted.len() < CAPACITY {
            let i = pairs.counted.len();
            pairs.counted.push(Pair {
                limit: limit.clone(),
                key,
                error: 0,
            });
            self.count_anew(i, limit, key, 1);
            self.index[slot].store((i + 1) as u8, Ordering::Relaxed);
            return;
        }
        let i = self.smallest(&mut pairs);
        self.unindex(i);
        let floor = self.counts[i].load(Ordering::Relaxed);
        pairs.counted[i] = Pair {
            limit: limit.clone(),
            key,
            error: floor,
        };
        self.count_anew(i, limit, key, floor + 1);
        // The slot freed above may be on this key's probe: probed again.
        let mut slot = home(key);
        while self.index[slot].load(Ordering::Relaxed) != 0 {
            slot = next(slot);
        }
        self.index[slot].store((i + 1) as u8, Ordering::Relaxed);
    }

    /// Counter `i` set to count `(limit, key)` from `count`.
    fn count_anew(&self, i: usize, limit: &Arc<str>, key: LimitKey, count: u64) {
        let (high, low) = key.halves();
        self.high[i].store(high, Ordering::Relaxed);
        self.low[i].store(low, Ordering::Relaxed);
        self.limit[i].store(address(limit), Ordering::Relaxed);
        self.counts[i].store(count, Ordering::Release);
    }

    /// The position of a smallest counter (the shard is full).
    fn smallest(&self, pairs: &mut Pairs) -> usize {
        let len = pairs.counted.len();
        let count = |i: usize| self.counts[i].load(Ordering::Relaxed);
        loop {
            for _ in 0..len {
                let at = pairs.cursor;
                pairs.cursor = (at + 1) % len;
                if count(at) <= pairs.floor {
                    return at;
                }
            }
            // None at `floor`: the smallest is above it.
            pairs.floor = (0..len).map(count).min().unwrap_or(0);
        }
    }

    /// The counter at `at` out of the index: its slot emptied, and the
    /// slots probing past it moved back (deletion in linear probing), so
    /// that every probe still reaches its pair before a free slot.
    fn unindex(&self, at: usize) {
        let slot = |i: usize| usize::from(self.index[i].load(Ordering::Relaxed));
        let home_of = |held: usize| {
            let low = self.low[held - 1].load(Ordering::Relaxed);
            (low as usize) & (INDEX - 1)
        };
        let mut hole = home_of(at + 1);
        while slot(hole) != at + 1 {
            hole = next(hole);
        }
        let mut probe = hole;
        loop {
            probe = next(probe);
            let held = slot(probe);
            if held == 0 {
                break;
            }
            // It may fill the hole unless its probe starts after the hole.
            let from = home_of(held);
            if probe.wrapping_sub(from) & (INDEX - 1) >= probe.wrapping_sub(hole) & (INDEX - 1) {
                self.index[hole].store(held as u8, Ordering::Relaxed);
                hole = probe;
            }
        }
        self.index[hole].store(0, Ordering::Relaxed);
    }

    /// The pairs counted, with their counts as they stand.
    fn counted(&self) -> Vec<Counted> {
        let pairs = self.pairs.lock();
        pairs
            .counted
            .iter()
            .enumerate()
            .map(|(i, pair)| Counted {
                limit: pair.limit.clone(),
                key: pair.key,
                count: self.counts[i].load(Ordering::Acquire),
                error: pair.error,
            })
            .collect()
    }
}

/// The shard a thread writes: its sketch, its position, and whether the
/// thread has it alone.
#[derive(Clone, Copy)]
struct Claim {
    sketch: u64,
    shard: usize,
    alone: bool,
}

thread_local! {
    /// The calling thread's claim, of the sketch it last refused into (a
    /// constant thread-local: a lazy one checked its state on every read).
    static CLAIM: Cell<Claim> = const {
        Cell::new(Claim {
            sketch: 0,
            shard: 0,
            alone: false,
        })
    };
}

impl RefusedKeys {
    /// `limit` refused the request counted under `key`.
    #[inline(always)]
    pub(crate) fn record(&self, limit: &Arc<str>, key: LimitKey) {
        let claim = CLAIM.get();
        if claim.sketch == self.id
            && claim.alone
            && let Some(shard) = self.shards.get(claim.shard)
        {
            if !shard.count_again(limit, key) {
                shard.take_place(limit, key);
            }
            return;
        }
        self.record_shared(claim, limit, key);
    }

    /// [`RefusedKeys::record`] by a thread on its first refusal into this
    /// sketch, or past the [`ALONE`] first: its claim made, its shard's
    /// writer lock taken where it shares it.
    #[cold]
    #[inline(never)]
    fn record_shared(&self, claim: Claim, limit: &Arc<str>, key: LimitKey) {
        let claim = if claim.sketch == self.id {
            claim
        } else {
            self.claim()
        };
        let shard = &self.shards[claim.shard];
        let _writer = (!claim.alone).then(|| shard.writer.lock());
        shard.record(limit, key);
    }

    /// The calling thread's shard: one of its own while one is free.
    fn claim(&self) -> Claim {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let own = self.shards[..ALONE].iter().position(|shard| {
            shard
                .claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        let claim = match own {
            Some(shard) => Claim {
                sketch: self.id,
                shard,
                alone: true,
            },
            None => Claim {
                sketch: self.id,
                shard: ALONE + NEXT.fetch_add(1, Ordering::Relaxed) % SHARED,
                alone: false,
            },
        };
        CLAIM.set(claim);
        claim
    }

    /// The pairs refused most, most first (ties by limit, then digest, so
    /// that the order is stable), at most `n`.
    pub(crate) fn top(&self, n: usize) -> Vec<Counted> {
        let mut merged: HashMap<(Arc<str>, LimitKey), (u64, u64)> = HashMap::new();
        for shard in &self.shards {
            for c in shard.counted() {
                let sum = merged.entry((c.limit, c.key)).or_default();
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
        let shard = Shard::default();
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
        let counters = shard.counted();
        assert!(counters.len() <= CAPACITY);
        let find = |k: LimitKey| counters.iter().find(|c| c.key == k).cloned();
        let heavy = find(key(1)).expect("the heaviest key is kept");
        let second = find(key(2)).expect("the second key is kept");
        // The bound: the count is at least the truth, at most truth + error.
        assert!(heavy.count >= 1_000 && heavy.count - heavy.error <= 1_000);
        assert!(second.count >= 500 && second.count - second.error <= 500);
        // n / CAPACITY bounds every error.
        let n = 10_000 + 1_000 + 500;
        assert!(counters.iter().all(|c| c.error <= n / CAPACITY as u64));
    }

    #[test]
    fn the_index_finds_every_counted_pair_through_any_replacements() {
        let shard = Shard::default();
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
        assert_eq!(shard.counted().iter().map(|c| c.count).sum::<u64>(), n);
        let counted = shard.counted();
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
        for (before, after) in counted.iter().zip(&shard.counted()) {
            assert_eq!((&before.limit, before.key), (&after.limit, after.key));
            assert_eq!(after.count, before.count + 1);
        }
        let used = shard
            .index
            .iter()
            .filter(|at| at.load(Ordering::Relaxed) != 0)
            .count();
        assert_eq!(used, CAPACITY);
    }

    #[test]
    fn shards_of_several_threads_merge() {
        let sketch = Arc::new(RefusedKeys::default());
        let limit: Arc<str> = Arc::from("l");
        let threads: Vec<_> = (0..(ALONE + SHARED) * 2)
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
        assert_eq!(
            (top[0].count, top[0].error),
            (100 * (ALONE + SHARED) as u64 * 2, 0)
        );
    }

    #[test]
    fn a_limit_named_again_by_a_reload_counts_the_same_pair() {
        let sketch = RefusedKeys::default();
        let before: Arc<str> = Arc::from("per_ip");
        for _ in 0..3 {
            sketch.record(&before, key(1));
        }
        // A reload's label: the same name, another `Arc`.
        let after: Arc<str> = Arc::from("per_ip");
        for _ in 0..2 {
            sketch.record(&after, key(1));
        }
        drop(before);
        sketch.record(&after, key(1));
        let top = sketch.top(10);
        assert_eq!(top.len(), 1);
        assert_eq!(
            (&*top[0].limit, top[0].count, top[0].error),
            ("per_ip", 6, 0)
        );
    }

    #[test]
    fn counts_stay_exact_while_a_reader_reads() {
        let sketch = Arc::new(RefusedKeys::default());
        let limit: Arc<str> = Arc::from("l");
        let writer = {
            let (sketch, limit) = (sketch.clone(), limit.clone());
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    sketch.record(&limit, key(i % 200));
                }
            })
        };
        // Space-saving's counts never sum past the refusals made.
        let mut seen = 0;
        while !writer.is_finished() {
            let sum: u64 = sketch.top(usize::MAX).iter().map(|c| c.count).sum();
            assert!(sum >= seen && sum <= 20_000, "{seen} then {sum}");
            seen = sum;
        }
        writer.join().expect("writer");
        let sum: u64 = sketch.top(usize::MAX).iter().map(|c| c.count).sum();
        assert_eq!(sum, 20_000);
    }
}
