//! Making room at `max_connections`: the live connections of the process,
//! and closing the one idle the longest so that a new client is served
//! instead of waiting in the accept backlog.
//!
//! Each worker registers its connections in its own shard (a lock taken when
//! a connection opens and when it closes, never per request, and shared with
//! nobody but an eviction). At the cap, an accept loop looks over every
//! shard — the cap is the whole process's, so the idle connection to close
//! may be another worker's — reads each connection's [`ConnActivity`] (a few
//! relaxed loads; the marks the watchdog already keeps), and asks the one
//! idle since the earliest moment to close. The connection's own task makes
//! the decision when it wakes for it (`ConnActivity::evicted`): if a request
//! started in between, it is left alone. A connection with a request in
//! progress, one that has not sent a request yet, or an upgrade's tunnel is
//! never chosen.
//!
//! The same shards are what each worker's sweep (`sweep.rs`) walks to
//! wake the connections whose deadlines are due.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::http1::server::ConnActivity;

/// The live connections, one shard per worker.
#[derive(Debug)]
pub(crate) struct Registry {
    shards: Box<[Mutex<Shard>]>,
    /// Per shard: told when its first connection registers, for its sweep
    /// that waits while it has none.
    opened: Box<[Notify]>,
}

/// A worker's connections: a slab, each connection at an index of its own
/// until it closes, the free indexes reused first. A pointer's room per
/// connection (a map from ids would take about three).
#[derive(Debug, Default)]
struct Shard {
    live: Vec<Option<Arc<ConnActivity>>>,
    free: Vec<u32>,
}

/// A connection's place in the registry, left when dropped. Two 32-bit
/// indexes beside the pointer: every connection's task, idle or not,
/// carries one.
#[derive(Debug)]
pub(crate) struct Registered {
    registry: Arc<Registry>,
    shard: u32,
    slot: u32,
}

impl Registry {
    pub(crate) fn new(workers: usize) -> Arc<Registry> {
        Arc::new(Registry {
            shards: (0..workers.max(1))
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            opened: (0..workers.max(1)).map(|_| Notify::new()).collect(),
        })
    }

    /// Registers a connection of worker `worker` (its shard).
    pub(crate) fn register(
        self: &Arc<Self>,
        worker: usize,
        activity: Arc<ConnActivity>,
    ) -> Registered {
        let shard = worker % self.shards.len();
        let mut entries = self.shards[shard].lock();
        if entries.live.len() == entries.free.len() {
            // Its sweep may be waiting for a connection to watch.
            self.opened[shard].notify_one();
        }
        let slot = match entries.free.pop() {
            Some(slot) => {
                entries.live[slot as usize] = Some(activity);
                slot
            }
            None => {
                entries.live.push(Some(activity));
                // Fewer entries than open connections, far below `u32::MAX`.
                (entries.live.len() - 1) as u32
            }
        };
        Registered {
            registry: self.clone(),
            // At most 1024 workers (`[server] workers`).
            shard: shard as u32,
            slot,
        }
    }

    /// Asks the connection idle the longest to close; false when no
    /// connection is idle (then nothing can be done but wait).
    pub(crate) fn evict_oldest_idle(&self) -> bool {
        loop {
            let mut oldest: Option<(Instant, Arc<ConnActivity>)> = None;
            for shard in self.shards.iter() {
                for activity in shard.lock().live.iter().flatten() {
                    if let Some(since) = activity.idle_since()
                        && oldest.as_ref().is_none_or(|(at, _)| since < *at)
                    {
                        oldest = Some((since, activity.clone()));
                    }
                }
            }
            match oldest {
                None => return false,
                Some((_, activity)) => {
                    if activity.request_eviction() {
                        return true;
                    }
                    // Asked by another accept loop in between: look again.
                }
            }
        }
    }

    /// Calls `visit` with each live connection of worker `worker`'s shard,
    /// under its lock (the same thread's connections cannot open or close
    /// meanwhile); false when it has none.
    pub(crate) fn for_each_of(&self, worker: usize, mut visit: impl FnMut(&ConnActivity)) -> bool {
        let entries = self.shards[worker % self.shards.len()].lock();
        entries
            .live
            .iter()
            .flatten()
            .for_each(|activity| visit(activity));
        entries.live.len() > entries.free.len()
    }

    /// Returns once worker `worker`'s shard may have a connection: at once
    /// if one registered since the last call.
    pub(crate) async fn opened(&self, worker: usize) {
        self.opened[worker % self.shards.len()].notified().await;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().live.iter().flatten().count())
            .sum()
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut entries = self.registry.shards[self.shard as usize].lock();
        if let Some(entry) = entries.live.get_mut(self.slot as usize)
            && entry.take().is_some()
        {
            entries.free.push(self.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(activity: &ConnActivity) {
        activity.bytes_read();
        activity.request_started();
        activity.request_finished();
    }

    #[tokio::test(start_paused = true)]
    async fn the_connection_idle_longest_is_asked_and_busy_or_new_ones_never() {
        let registry = Registry::new(2);
        let older = Arc::new(ConnActivity::new());
        let newer = Arc::new(ConnActivity::new());
        let busy = Arc::new(ConnActivity::new());
        let fresh = Arc::new(ConnActivity::new());
        let _a = registry.register(0, newer.clone());
        let _b = registry.register(1, older.clone());
        let _c = registry.register(0, busy.clone());
        let _d = registry.register(1, fresh.clone());
        tokio::time::advance(std::time::Duration::from_millis(10)).await;
        served(&older);
        tokio::time::advance(std::time::Duration::from_millis(10)).await;
        served(&newer);
        // `busy` is inside a request; `fresh` never sent one.
        busy.bytes_read();
        busy.request_started();

        assert!(registry.evict_oldest_idle());
        assert!(older.evicted(), "the one idle the longest goes first");
        assert!(!newer.evicted());
        assert!(registry.evict_oldest_idle());
        assert!(newer.evicted());
        assert!(!registry.evict_oldest_idle(), "only busy and new ones left");
        assert!(!busy.evicted() && !fresh.evicted());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_busy_again_when_it_looks_is_left_alone() {
        let registry = Registry::new(1);
        let activity = Arc::new(ConnActivity::new());
        let _r = registry.register(0, activity.clone());
        served(&activity);
        assert!(registry.evict_oldest_idle());
        // A request starts before the connection's task looks.
        activity.bytes_read();
        assert!(!activity.evicted());
        activity.request_started();
        activity.request_finished();
        // Idle again: it may be asked again.
        assert!(registry.evict_oldest_idle());
        assert!(activity.evicted());
    }

    #[test]
    fn a_closed_connection_leaves_the_registry() {
        let registry = Registry::new(1);
        let registered = registry.register(0, Arc::new(ConnActivity::new()));
        assert_eq!(registry.len(), 1);
        drop(registered);
        assert_eq!(registry.len(), 0);
    }
}
