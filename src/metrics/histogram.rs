//! The request-duration histogram: the same OpenMetrics series as
//! `prometheus-client`'s `Histogram`, recorded without a lock.
//!
//! `prometheus-client`'s histogram takes a mutex on every observation. One
//! series per route is shared by every worker, so that mutex was a lock
//! every request took — the one the hot path must not have. Here each bucket
//! is its own atomic counter, and the sum an `f64`'s bits updated by
//! compare-and-swap (as `prometheus-client`'s float counters do; an integer
//! sum of nanoseconds would wrap within months at a busy gateway's rates),
//! and each worker has a set of its own (as [`super::WorkerCounter`]), so
//! that no line of it is written by two cores.
//!
//! A scrape reads the buckets one by one while requests keep landing, so it
//! derives `_count` from the buckets it read: `_count` always equals the
//! `+Inf` bucket, as the exposition format requires. `_sum` may include an
//! observation or two the buckets did not yet show, as with any histogram
//! scraped under load.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::worker::PerWorker;

/// Most buckets a histogram has, `+Inf` included: room for the duration
/// buckets' 15 bounds.
const MAX_BUCKETS: usize = 16;

/// A histogram of durations with fixed upper bounds (in seconds). Clones
/// share their counts, like `prometheus-client`'s metrics.
#[derive(Debug, Clone)]
pub(crate) struct DurationHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Upper bounds in nanoseconds, ascending; the `+Inf` bucket is implied.
    bounds_nanos: Box<[u64]>,
    /// The same bounds in seconds, as the exposition writes them.
    bounds_secs: Box<[f64]>,
    /// Each worker's observations ([`crate::worker`]): every request
    /// observes its route's histogram, and one set of counts every worker
    /// wrote moved between the cores on each observation.
    shards: PerWorker<Shard>,
}

/// One worker's observations.
#[derive(Debug, Default)]
struct Shard {
    /// Observations per bucket, not cumulative; one more than the bounds
    /// (the last is `+Inf`), the rest unused.
    counts: [AtomicU64; MAX_BUCKETS],
    /// The sum of observations in seconds, as `f64` bits.
    sum_bits: AtomicU64,
}

impl DurationHistogram {
    /// A histogram with these upper bounds in seconds (ascending, fewer
    /// than [`MAX_BUCKETS`]: the callers' constants).
    pub(crate) fn new(bounds_secs: &[f64]) -> DurationHistogram {
        assert!(bounds_secs.len() < MAX_BUCKETS, "too many histogram bounds");
        let bounds_nanos = bounds_secs
            .iter()
            .map(|&secs| Duration::from_secs_f64(secs).as_nanos() as u64)
            .collect();
        DurationHistogram {
            inner: Arc::new(Inner {
                bounds_nanos,
                bounds_secs: bounds_secs.into(),
                // 0.0's bits are 0: a default shard's sum is 0 seconds.
                shards: PerWorker::default(),
            }),
        }
    }

    /// Records one observation, in the calling worker's shard.
    pub(crate) fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let inner = &*self.inner;
        // Upward from the smallest bound, not a binary search: nearly every
        // observation (a request answered in under a millisecond) is in the
        // first bucket or two, found in a comparison or two where the
        // search took four (~35 instructions a request,
        // `bench/instructions.sh`).
        let bucket = inner
            .bounds_nanos
            .iter()
            .position(|&bound| nanos <= bound)
            .unwrap_or(inner.bounds_nanos.len());
        let shard = inner.shards.mine();
        // Relaxed: the counts are independent tallies; a scrape needs no
        // ordering between them (see the module doc).
        shard.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        let _ = shard
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + seconds).to_bits())
            });
    }

    /// `(sum in seconds, count, non-cumulative buckets with upper bounds)`,
    /// `f64::INFINITY` standing for `+Inf` as in `prometheus-client`: the
    /// workers' shards summed.
    pub(crate) fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.inner;
        let buckets: Vec<(f64, u64)> = inner
            .bounds_secs
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .enumerate()
            .map(|(i, bound)| {
                let count = inner
                    .shards
                    .iter()
                    .map(|shard| shard.counts[i].load(Ordering::Relaxed))
                    .fold(0, u64::wrapping_add);
                (bound, count)
            })
            .collect();
        let count = buckets.iter().map(|&(_, n)| n).sum();
        let sum = inner
            .shards
            .iter()
            .map(|shard| f64::from_bits(shard.sum_bits.load(Ordering::Relaxed)))
            .sum();
        (sum, count, buckets)
    }
}

impl TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::exposition;
    use prometheus_client::metrics::histogram::Histogram;

    const BOUNDS: [f64; 4] = [0.001, 0.01, 0.1, 1.0];

    #[test]
    fn exposes_what_prometheus_clients_histogram_exposes() {
        // Durations exact in binary seconds and in nanoseconds, on and
        // between the bounds (a bound is inclusive: `le`).
        let seconds = [0.0, 0.0005, 0.001, 0.0625, 0.1, 0.5, 1.0, 2.0, 40.0];
        let ours = DurationHistogram::new(&BOUNDS);
        let theirs = Histogram::new(BOUNDS);
        for s in seconds {
            ours.observe(Duration::from_secs_f64(s));
            theirs.observe(s);
        }
        assert_eq!(
            exposition(|r| r.register("d", "durations", ours)),
            exposition(|r| r.register("d", "durations", theirs)),
        );
    }

    #[test]
    fn count_is_the_inf_bucket_and_clones_share() {
        let histogram = DurationHistogram::new(&BOUNDS);
        let clone = histogram.clone();
        histogram.observe(Duration::from_micros(500));
        clone.observe(Duration::from_secs(3));
        clone.observe(Duration::from_secs(u64::MAX));
        let (sum, count, buckets) = histogram.snapshot();
        assert_eq!(count, 3);
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 3);
        assert_eq!(buckets.last(), Some(&(f64::INFINITY, 2)));
        assert_eq!(buckets[0], (0.001, 1));
        assert!(sum > 1e19, "no wrap: {sum}");
    }

    #[test]
    fn concurrent_observations_are_all_counted() {
        let histogram = DurationHistogram::new(&BOUNDS);
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let histogram = histogram.clone();
                scope.spawn(move || {
                    crate::worker::enter(t as usize);
                    for i in 0..10_000u64 {
                        histogram.observe(Duration::from_micros((i * 7 + t) % 2_000_000));
                    }
                });
            }
        });
        let (_, count, _) = histogram.snapshot();
        assert_eq!(count, 40_000);
    }
}
