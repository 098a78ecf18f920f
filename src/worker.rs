//! Which worker thread the current code runs on.
//!
//! With `[server] workers = N > 1` the gateway runs thread-per-core: N OS
//! threads (`tollgate-wrk-0` … `tollgate-wrk-{N-1}`), each a single-threaded
//! tokio runtime accepting on its own sockets. A connection is accepted,
//! served and closed on one thread, and whatever its requests spawn (an
//! upgrade tunnel, an upstream connection) stays there too. So state that is
//! only ever touched from one worker can be kept per worker — e.g. one
//! upstream connection pool per worker, chosen with [`worker_index`] in a
//! `Vec` of [`worker_count`] entries — and never bounces between cores.
//!
//! - [`worker_index`] is `0..worker_count()` on a worker thread. Everything
//!   else — the main thread (signals, admin listener, idle-key sweeper,
//!   reloads), blocking-pool threads (`spawn_blocking`), tests, and the whole
//!   process with `workers = 1` — sees 0, i.e. shares worker 0's slot. Code
//!   indexing per-worker state must therefore still be thread-safe (a `Mutex`
//!   that is uncontended in practice is fine); it only gets locality.
//! - [`worker_count`] is fixed once at start ([`init`]) and never changes: a
//!   reload that changes `workers` needs a restart. Before `init` (library
//!   users, unit tests) it is 1.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

static COUNT: OnceLock<usize> = OnceLock::new();

/// The index of the worker thread running this code, in `0..worker_count()`;
/// 0 off worker threads (see the module doc).
pub(crate) fn worker_index() -> usize {
    INDEX.with(Cell::get)
}

/// How many worker threads serve traffic (at least 1).
pub(crate) fn worker_count() -> usize {
    COUNT.get().copied().unwrap_or(1)
}

/// Resolves `[server] workers` (0 = one per CPU core) and fixes
/// [`worker_count`] for the life of the process; returns the count. Called
/// once by the binary before anything sizes per-worker state; later calls
/// return the count fixed by the first.
pub fn init(configured: usize) -> usize {
    *COUNT.get_or_init(|| resolve(configured))
}

/// `configured`, or the CPU cores available to the process when 0.
pub(crate) fn resolve(configured: usize) -> usize {
    match configured {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    }
}

/// One `T` per worker ([`worker_count`] of them), each on cache lines of
/// its own: state every worker changes per request (a counter, an idle
/// list, a handle's count) that would move between the cores if two
/// workers' values shared a line. [`PerWorker::mine`] is the calling
/// worker's; off worker threads, worker 0's (so `T` must be thread-safe).
/// Clones share the values.
#[derive(Debug)]
pub(crate) struct PerWorker<T> {
    slots: Arc<[Padded<T>]>,
}

/// A value alone on its cache lines (128 bytes: adjacent-line prefetch
/// pairs 64-byte lines on x86).
#[repr(align(128))]
#[derive(Debug)]
struct Padded<T>(T);

impl<T> PerWorker<T> {
    /// A value per worker, each made by `make`.
    pub(crate) fn new(mut make: impl FnMut() -> T) -> PerWorker<T> {
        PerWorker {
            slots: (0..worker_count()).map(|_| Padded(make())).collect(),
        }
    }

    /// The calling worker's value; worker 0's for an index past the
    /// values (a `PerWorker` made before [`init`] fixed the count).
    #[inline]
    pub(crate) fn mine(&self) -> &T {
        // A comparison, not `%`: a division on every counter's increment.
        match self.slots.get(worker_index()) {
            Some(slot) => &slot.0,
            None => &self.slots[0].0,
        }
    }

    /// Every worker's value, in worker order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|slot| &slot.0)
    }
}

// By hand: a derive would ask `T: Clone`, and the clone shares the values.
impl<T> Clone for PerWorker<T> {
    fn clone(&self) -> PerWorker<T> {
        PerWorker {
            slots: self.slots.clone(),
        }
    }
}

impl<T: Default> Default for PerWorker<T> {
    fn default() -> PerWorker<T> {
        PerWorker::new(T::default)
    }
}

/// Marks the calling thread as worker `index`. Called by the server on each
/// worker thread it starts, before the thread runs anything else.
pub(crate) fn enter(index: usize) {
    INDEX.with(|cell| cell.set(index));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_worker_values_are_each_workers_own_and_shared_by_clones() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let made = AtomicUsize::new(0);
        let values = PerWorker::new(|| AtomicUsize::new(made.fetch_add(1, Ordering::Relaxed)));
        assert_eq!(made.load(Ordering::Relaxed), worker_count());
        let clone = values.clone();
        clone.mine().fetch_add(10, Ordering::Relaxed);
        assert_eq!(
            values.mine().load(Ordering::Relaxed),
            10,
            "worker 0's, shared"
        );
        let all: Vec<usize> = values.iter().map(|v| v.load(Ordering::Relaxed)).collect();
        assert_eq!(all.len(), worker_count());
        for slot in values.slots.iter() {
            assert_eq!(
                std::ptr::from_ref(slot) as usize % 128,
                0,
                "a line of its own"
            );
        }
    }

    #[test]
    fn index_is_per_thread_and_zero_elsewhere() {
        assert_eq!(worker_index(), 0);
        let seen = std::thread::spawn(|| {
            enter(3);
            worker_index()
        })
        .join()
        .unwrap_or(usize::MAX);
        assert_eq!(seen, 3);
        assert_eq!(worker_index(), 0, "another thread's index leaked here");
    }

    #[test]
    fn zero_workers_means_one_per_core() {
        assert!(resolve(0) >= 1);
        assert_eq!(resolve(4), 4);
        assert!(worker_count() >= 1);
    }
}
