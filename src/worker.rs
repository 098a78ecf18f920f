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
use std::sync::OnceLock;

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

/// Marks the calling thread as worker `index`. Called by the server on each
/// worker thread it starts, before the thread runs anything else.
pub(crate) fn enter(index: usize) {
    INDEX.with(|cell| cell.set(index));
}

#[cfg(test)]
mod tests {
    use super::*;

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
