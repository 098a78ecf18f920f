//! Counters kept per worker thread: the cells behind the hot path's
//! request and decision counters and the duration histograms.
//!
//! One atomic counter that every worker adds to is a cache line the cores
//! pass back and forth on every request (a second worker cost a denial
//! about 0.34 µs more with the shared counters than without any, see
//! BENCHMARKS.md, *A flood*). Here each worker adds to cells on lines of
//! its own, found by [`worker_index`], and a scrape sums the workers'
//! cells: a counter read while requests land is a moment's sum, as any
//! counter scraped under load is.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::worker::{worker_count, worker_index};

/// Counters per cache line (128 bytes: adjacent-line prefetching pairs
/// 64-byte lines on x86).
const PER_LINE: usize = 16;

#[derive(Debug, Default)]
#[repr(align(128))]
struct Line([AtomicU64; PER_LINE]);

/// `width` counters per worker, each worker's on lines of their own.
/// Sized by [`worker_count`] when made; code off the worker threads adds
/// to worker 0's (see [`crate::worker`]).
#[derive(Debug)]
pub(crate) struct WorkerCells {
    lines: Box<[Line]>,
    width: usize,
    /// Lines per worker.
    stride: usize,
}

impl WorkerCells {
    pub(crate) fn new(width: usize) -> WorkerCells {
        let stride = width.div_ceil(PER_LINE).max(1);
        WorkerCells {
            lines: (0..stride * worker_count())
                .map(|_| Line::default())
                .collect(),
            width,
            stride,
        }
    }

    /// The calling worker's cell `i` (`i < width`).
    fn cell(&self, i: usize) -> &AtomicU64 {
        let workers = self.lines.len() / self.stride;
        let line = worker_index() % workers * self.stride + i / PER_LINE;
        &self.lines[line].0[i % PER_LINE]
    }

    /// Adds `n` to cell `i` of the calling worker.
    pub(crate) fn add(&self, i: usize, n: u64) {
        // Relaxed: independent tallies; a scrape needs no ordering.
        self.cell(i).fetch_add(n, Ordering::Relaxed);
    }

    /// Cell `i` of the calling worker, updated by `f` (a float's bits, say):
    /// only this worker writes it (off-worker threads share worker 0's, so
    /// it is still a compare-and-swap, uncontended in practice).
    pub(crate) fn update(&self, i: usize, f: impl Fn(u64) -> u64) {
        let _ = self
            .cell(i)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(f(v)));
    }

    /// Cell `i` of every worker.
    pub(crate) fn each(&self, i: usize) -> impl Iterator<Item = u64> + '_ {
        debug_assert!(i < self.width);
        self.lines
            .chunks(self.stride)
            .map(move |lines| lines[i / PER_LINE].0[i % PER_LINE].load(Ordering::Relaxed))
    }

    /// Cell `i` summed over the workers.
    pub(crate) fn sum(&self, i: usize) -> u64 {
        self.each(i).fold(0, u64::wrapping_add)
    }
}

/// A monotonic counter, exposed as `prometheus-client`'s `Counter` is;
/// clones share their count.
#[derive(Debug, Clone)]
pub(crate) struct WorkerCounter {
    cells: Arc<WorkerCells>,
}

impl Default for WorkerCounter {
    fn default() -> WorkerCounter {
        WorkerCounter {
            cells: Arc::new(WorkerCells::new(1)),
        }
    }
}

impl WorkerCounter {
    pub(crate) fn inc(&self) {
        self.cells.add(0, 1);
    }

    /// The count, summed over the workers.
    pub(crate) fn get(&self) -> u64 {
        self.cells.sum(0)
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
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::registry::Registry;

    #[test]
    fn a_counter_exposes_what_prometheus_clients_counter_exposes() {
        let exposition = |register: &dyn Fn(&mut Registry)| {
            let mut registry = Registry::default();
            register(&mut registry);
            let mut out = String::new();
            encode(&mut out, &registry).unwrap();
            out
        };
        let ours = WorkerCounter::default();
        let theirs: Counter = Counter::default();
        for _ in 0..3 {
            ours.inc();
            theirs.inc();
        }
        assert_eq!(
            exposition(&|r| r.register("c", "a count", ours.clone())),
            exposition(&|r| r.register("c", "a count", theirs.clone())),
        );
    }

    #[test]
    fn workers_count_on_cells_of_their_own_and_a_read_sums_them() {
        // Sized as for two workers: made after the count is fixed, as the
        // gateway's metrics are.
        let cells = WorkerCells {
            lines: (0..2 * 2).map(|_| Line::default()).collect(),
            width: 20,
            stride: 2,
        };
        let cells = Arc::new(cells);
        std::thread::scope(|scope| {
            for index in 0..2 {
                let cells = cells.clone();
                scope.spawn(move || {
                    crate::worker::enter(index);
                    for _ in 0..10_000 {
                        cells.add(17, 1);
                    }
                    cells.add(3, index as u64 + 1);
                });
            }
        });
        assert_eq!(cells.each(17).collect::<Vec<_>>(), [10_000, 10_000]);
        assert_eq!(cells.sum(17), 20_000);
        assert_eq!(cells.each(3).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(cells.sum(0), 0);
    }
}
