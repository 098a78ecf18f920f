//! The request path's counters, counted per worker: the same OpenMetrics
//! series as `prometheus-client`'s `Counter`, without a cache line that
//! every worker writes.
//!
//! `prometheus-client`'s counter is one atomic word. A route's `200`
//! counter and its limits' `allowed` counters go up on every request of
//! every worker, so that word's line moved between the cores on each
//! increment. Here each worker ([`crate::worker`]) adds to a cell of its
//! own, one cache line each, and a scrape sums the cells. Threads that are
//! no worker share worker 0's cell: an atomic add keeps that exact.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::worker::PerWorker;

/// A counter kept per worker. Clones share their counts, like
/// `prometheus-client`'s.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkerCounter {
    cells: PerWorker<AtomicU64>,
}

impl WorkerCounter {
    /// One up, in the calling worker's cell.
    #[inline]
    pub(crate) fn inc(&self) {
        // Relaxed: a tally; a scrape needs no order among the cells.
        self.cells.mine().fetch_add(1, Ordering::Relaxed);
    }

    /// The count over all workers.
    pub(crate) fn get(&self) -> u64 {
        self.cells
            .iter()
            .map(|cell| cell.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

impl TypedMetric for WorkerCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for WorkerCounter {
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
    use crate::metrics::exposition;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn exposes_what_prometheus_clients_counter_exposes() {
        let ours = WorkerCounter::default();
        let theirs = Counter::<u64>::default();
        for _ in 0..3 {
            ours.inc();
            theirs.inc();
        }
        assert_eq!(
            exposition(|r| r.register("requests", "requests", ours)),
            exposition(|r| r.register("requests", "requests", theirs)),
        );
    }

    #[test]
    fn every_thread_is_counted_and_clones_share() {
        let counter = WorkerCounter::default();
        std::thread::scope(|scope| {
            for worker in 0..4 {
                let counter = counter.clone();
                scope.spawn(move || {
                    crate::worker::enter(worker);
                    for _ in 0..10_000 {
                        counter.inc();
                    }
                });
            }
        });
        assert_eq!(counter.get(), 40_000);
    }
}
