//! The request-duration histogram: the same OpenMetrics series as
//! `prometheus-client`'s `Histogram`, recorded without a lock.
//!
//! `prometheus-client`'s histogram takes a mutex on every observation. One
//! series per route is shared by every worker, so that mutex was a lock
//! every request took — the one the hot path must not have. Here each bucket
//! is its own atomic counter, and the sum an `f64`'s bits updated by
//! compare-and-swap (as `prometheus-client`'s float counters do; an integer
//! sum of nanoseconds would wrap within months at a busy gateway's rates).
//! Each thread observes into a shard of its own (`shard`), its buckets and
//! sum on cache lines no other worker writes; a scrape adds the shards up.
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

use super::shard::{LINE_WORDS, Line, SHARDS, shard};

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
    /// [`SHARDS`] shards of `stride` words each, a shard starting on a line
    /// of its own: observations per bucket, not cumulative, one more than
    /// the bounds (the last is `+Inf`), then the sum of observations in
    /// seconds as `f64` bits.
    lines: Box<[Line]>,
    /// Words per shard: the buckets and the sum, rounded up to whole lines.
    stride: usize,
}

impl Inner {
    /// Word `index` of shard `shard`.
    #[inline]
    fn word(&self, shard: usize, index: usize) -> &AtomicU64 {
        let at = shard * self.stride + index;
        &self.lines[at / LINE_WORDS].0[at % LINE_WORDS]
    }

    /// The word of the sum in `shard`.
    #[inline]
    fn sum_word(&self, shard: usize) -> &AtomicU64 {
        self.word(shard, self.bounds_nanos.len() + 1)
    }
}

impl DurationHistogram {
    /// A histogram with these upper bounds in seconds (ascending).
    pub(crate) fn new(bounds_secs: &[f64]) -> DurationHistogram {
        let bounds_nanos = bounds_secs
            .iter()
            .map(|&secs| Duration::from_secs_f64(secs).as_nanos() as u64)
            .collect();
        // The buckets, `+Inf` and the sum.
        let stride = (bounds_secs.len() + 2).div_ceil(LINE_WORDS) * LINE_WORDS;
        let inner = Inner {
            bounds_nanos,
            bounds_secs: bounds_secs.into(),
            lines: (0..SHARDS * stride / LINE_WORDS)
                .map(|_| Line::default())
                .collect(),
            stride,
        };
        for shard in 0..SHARDS {
            inner
                .sum_word(shard)
                .store(0f64.to_bits(), Ordering::Relaxed);
        }
        DurationHistogram {
            inner: Arc::new(inner),
        }
    }

    /// Records one observation.
    pub(crate) fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let inner = &*self.inner;
        let bucket = inner.bounds_nanos.partition_point(|&bound| bound < nanos);
        let shard = shard();
        // Relaxed: the counts are independent tallies; a scrape needs no
        // ordering between them (see the module doc).
        inner.word(shard, bucket).fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        let _ = inner
            .sum_word(shard)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + seconds).to_bits())
            });
    }

    /// `(sum in seconds, count, non-cumulative buckets with upper bounds)`,
    /// `f64::INFINITY` standing for `+Inf` as in `prometheus-client`.
    pub(crate) fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.inner;
        let buckets: Vec<(f64, u64)> = inner
            .bounds_secs
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .enumerate()
            .map(|(bucket, bound)| {
                let count = (0..SHARDS)
                    .map(|shard| inner.word(shard, bucket).load(Ordering::Relaxed))
                    .fold(0, u64::wrapping_add);
                (bound, count)
            })
            .collect();
        let count = buckets.iter().map(|&(_, n)| n).sum();
        let sum = (0..SHARDS)
            .map(|shard| f64::from_bits(inner.sum_word(shard).load(Ordering::Relaxed)))
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
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    const BOUNDS: [f64; 4] = [0.001, 0.01, 0.1, 1.0];

    fn exposition(register: impl FnOnce(&mut Registry)) -> String {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

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
