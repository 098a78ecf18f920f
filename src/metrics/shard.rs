//! Per-thread shards of the counts every request adds to: a route's
//! request counters ([`ShardedCounter`]) and the duration histogram's
//! buckets and sum (`histogram`).
//!
//! One atomic that every worker adds to is one cache line the cores hand
//! back and forth on every request: with `workers = 2`, a denial wrote
//! four such lines besides its key's (the 429 counter, the decision
//! counter, a duration bucket and the duration sum). Each thread adds to
//! a shard of its own instead, [`SHARDS`] lines apart; a scrape sums them.
//! Threads take shards in the order they first count, so the first
//! [`SHARDS`] (the workers) share none.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Shards per counted value: threads beyond this many share them.
pub(crate) const SHARDS: usize = 8;

/// Words of one cache line.
pub(crate) const LINE_WORDS: usize = 8;

/// One cache line of counts: a shard's words never share a line with
/// another shard's.
#[repr(align(64))]
#[derive(Debug, Default)]
pub(crate) struct Line(pub(crate) [AtomicU64; LINE_WORDS]);

/// The shard of the calling thread, in `0..SHARDS`.
#[inline]
pub(crate) fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    // A thread being torn down counts in shard 0.
    SHARD.try_with(|shard| *shard).unwrap_or(0)
}

/// A counter whose adds land in the calling thread's shard; encoded as
/// `prometheus-client`'s `Counter` (`_total`, the sum of the shards).
/// Clones share their counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShardedCounter {
    lines: Arc<[Line; SHARDS]>,
}

impl ShardedCounter {
    /// One up.
    #[inline]
    pub(crate) fn inc(&self) {
        // Relaxed: an independent tally, as prometheus-client's counters.
        self.lines[shard()].0[0].fetch_add(1, Ordering::Relaxed);
    }

    /// The count, summed over the shards.
    pub(crate) fn get(&self) -> u64 {
        self.lines
            .iter()
            .map(|line| line.0[0].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

impl TypedMetric for ShardedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for ShardedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::registry::Registry;

    fn exposition(register: impl FnOnce(&mut Registry)) -> String {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn counts_from_every_thread_are_summed_and_exposed_as_a_counter() {
        let ours = ShardedCounter::default();
        let theirs: Counter = Counter::default();
        std::thread::scope(|scope| {
            for _ in 0..SHARDS + 3 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        ours.inc();
                        theirs.inc();
                    }
                });
            }
        });
        assert_eq!(ours.get(), (SHARDS as u64 + 3) * 1000);
        assert_eq!(
            exposition(|r| r.register("requests", "requests", ours)),
            exposition(|r| r.register("requests", "requests", theirs)),
        );
    }

    #[test]
    fn a_shard_is_a_line_of_its_own() {
        assert_eq!(std::mem::size_of::<Line>(), 64);
        assert_eq!(std::mem::align_of::<Line>(), 64);
    }
}
