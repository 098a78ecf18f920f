//! Each worker's own handle on the current [`Snapshot`], so that taking
//! the snapshot for a request writes nothing another core reads.
//!
//! `ArcSwap::load_full` hands every request a clone of the one `Arc`:
//! an increment and, at the request's end, a decrement of the same
//! reference count by every worker — a cache line that moves between the
//! cores twice a request. Here each worker keeps an `Arc` of its own
//! around the snapshot's (`SnapshotHandle`), in a slot of its own
//! (`WorkerSnapshots`, one cache line each): a request clones the
//! worker's handle, whose count only that worker touches, and the shared
//! count changes once per worker per reload.
//!
//! The contract stays the `ArcSwap`'s: a request keeps the snapshot it
//! took to its end, and a request that starts after [`super::App::install`]
//! returned sees the new one. A reload stores the new snapshot, then
//! empties every worker's slot ([`WorkerSnapshots::clear`]): a worker that
//! filled its slot from the old snapshot in between finds it empty, and
//! the old snapshot is dropped when its last request ends, as before.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::Snapshot;
use crate::worker::PerWorker;

/// A request's snapshot: derefs to it, and keeps it alive while held.
/// Cloning touches only the worker's own count.
#[derive(Debug, Clone)]
// The outer `Arc` is the point: a count of the worker's own.
#[allow(clippy::redundant_allocation)]
pub(crate) struct SnapshotHandle(Arc<Arc<Snapshot>>);

impl Deref for SnapshotHandle {
    type Target = Snapshot;

    fn deref(&self) -> &Snapshot {
        &self.0
    }
}

/// Every worker's slot: its handle on the current snapshot, empty until
/// its first request and after each reload, on cache lines of its own so
/// that one worker's lock and count never share a line with another's
/// (threads that are no worker share worker 0's, which the lock makes safe).
#[derive(Debug)]
pub(crate) struct WorkerSnapshots {
    slots: PerWorker<Mutex<Option<SnapshotHandle>>>,
}

impl WorkerSnapshots {
    pub(crate) fn new() -> WorkerSnapshots {
        WorkerSnapshots {
            slots: PerWorker::default(),
        }
    }

    /// This worker's handle on the current snapshot, taken from `current`
    /// when its slot is empty. The lock is the worker's own: uncontended
    /// but during a reload's [`WorkerSnapshots::clear`].
    #[inline]
    pub(crate) fn get(&self, current: &ArcSwap<Snapshot>) -> SnapshotHandle {
        let mut slot = self.slots.mine().lock();
        match &*slot {
            Some(handle) => handle.clone(),
            None => fill(&mut slot, current),
        }
    }

    /// Empties every slot: each worker's next request takes the snapshot
    /// stored before this call. The old handles are dropped outside the
    /// locks (dropping the last one drops a whole snapshot).
    pub(crate) fn clear(&self) {
        let old: Vec<Option<SnapshotHandle>> =
            self.slots.iter().map(|slot| slot.lock().take()).collect();
        drop(old);
    }
}

/// The slot's first handle since it was emptied. Out of line: once per
/// worker per reload.
#[cold]
#[inline(never)]
fn fill(slot: &mut Option<SnapshotHandle>, current: &ArcSwap<Snapshot>) -> SnapshotHandle {
    let handle = SnapshotHandle(Arc::new(current.load_full()));
    *slot = Some(handle.clone());
    handle
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn config(route: &str) -> Config {
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\
             [[routes]]\nname = \"{route}\"\nmatch = {{ path_prefix = \"/\" }}\n\
             respond = {{ status = 200 }}\n"
        );
        Config::from_bytes(std::path::Path::new("gateway.toml"), toml.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_worker_reuses_its_handle_until_a_reload() {
        let app = crate::app::App::new(config("first"));
        let a = app.request_snapshot();
        let b = app.request_snapshot();
        assert!(Arc::ptr_eq(&a.0, &b.0), "the worker's own handle, cloned");
        assert_eq!(a.routes[0].name.as_ref(), "first");
        app.install(config("second"));
        let c = app.request_snapshot();
        assert_eq!(
            c.routes[0].name.as_ref(),
            "second",
            "the next request sees the reload"
        );
        assert_eq!(a.routes[0].name.as_ref(), "first", "a held snapshot stays");
        assert_eq!(c.generation, a.generation + 1);
    }

    #[test]
    fn the_old_snapshot_goes_with_its_last_request() {
        let app = crate::app::App::new(config("first"));
        let held = app.request_snapshot();
        let shared = Arc::downgrade(&held.0);
        let old = Arc::downgrade(&*held.0);
        app.install(config("second"));
        assert!(old.upgrade().is_some(), "a request still holds it");
        drop(held);
        assert!(shared.upgrade().is_none(), "no slot kept the handle");
        assert!(old.upgrade().is_none(), "nothing keeps the old snapshot");
    }

    #[test]
    fn workers_fill_their_slots_from_the_current_snapshot() {
        let app = crate::app::App::new(config("first"));
        app.install(config("second"));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..100 {
                        assert_eq!(app.request_snapshot().routes[0].name.as_ref(), "second");
                    }
                });
            }
        });
    }
}
