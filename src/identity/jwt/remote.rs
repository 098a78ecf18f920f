//! The keys of a `jwks_url`, as the request path sees them: the last key set
//! fetched (swapped whole), and the one way a request asks for a fresh one
//! — a token whose `kid` is not in it.
//!
//! The fetching itself (HTTP, `Cache-Control`, the background interval) is
//! the app layer's (`app::jwks`); this handle is what both sides share.
//! An early refresh is granted at most once per `refresh` interval: a
//! flood of tokens with invented `kid`s costs the issuer one request per
//! interval, not one per token. Requests that arrive while a granted
//! refresh is under way wait for it, too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::sync::{Notify, watch};

use super::jwks::KeySet;

/// How long a request waits for an early refresh before it is answered
/// with the keys it has.
pub const EARLY_REFRESH_WAIT: Duration = Duration::from_secs(2);

/// One `jwks_url`'s keys and refresh signals.
#[derive(Debug)]
pub struct RemoteKeys {
    pub url: Arc<str>,
    /// The least time between two early refreshes (`refresh`), in ns.
    interval: u64,
    keys: ArcSwapOption<KeySet>,
    /// When an early refresh was last granted (ns on the request clock),
    /// `u64::MAX` before the first.
    granted_at: AtomicU64,
    /// An early refresh is granted and not yet done.
    pending: AtomicBool,
    /// Wakes the fetcher for an early refresh.
    wake: Notify,
    /// Counts finished fetches (answered or failed), for waiters.
    fetched: watch::Sender<u64>,
}

/// What a request with an unknown `kid` should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Early {
    /// Wait for the refresh under way, then verify again.
    Wait,
    /// A refresh was had within the interval: the key is unknown.
    No,
}

impl RemoteKeys {
    pub fn new(url: Arc<str>, interval: Duration) -> RemoteKeys {
        RemoteKeys {
            url,
            interval: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
            keys: ArcSwapOption::empty(),
            granted_at: AtomicU64::new(u64::MAX),
            pending: AtomicBool::new(false),
            wake: Notify::new(),
            fetched: watch::Sender::new(0),
        }
    }

    /// The keys fetched last; `None` before the first answer.
    pub fn keys(&self) -> Option<Arc<KeySet>> {
        self.keys.load_full()
    }

    /// The fetcher's answer: the new keys replace the old whole.
    pub fn install(&self, keys: KeySet) {
        self.keys.store(Some(Arc::new(keys)));
    }

    /// The fetcher finished an attempt (with or without new keys): waiters
    /// verify again.
    pub fn fetch_done(&self) {
        self.pending.store(false, Ordering::Release);
        self.fetched.send_modify(|n| *n += 1);
    }

    /// A token named a `kid` these keys lack, at `now` (ns).
    pub fn ask_early(&self, now: u64) -> Early {
        // The fetch at start is not finished: wait for it, granting
        // nothing. Requests that reach a starting gateway before its first
        // JWKS would otherwise spend the interval's one early refresh (and
        // cause a second fetch at once), leaving a key rotated in the
        // first interval unknown until the background refresh.
        if self.pending.load(Ordering::Acquire) || *self.fetched.borrow() == 0 {
            return Early::Wait;
        }
        let granted = self.granted_at.load(Ordering::Acquire);
        if granted != u64::MAX && now.saturating_sub(granted) < self.interval {
            return Early::No;
        }
        // One request wins the grant; the others wait for its refresh.
        if self
            .granted_at
            .compare_exchange(granted, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.pending.store(true, Ordering::Release);
            self.wake.notify_one();
        }
        Early::Wait
    }

    /// Waits (at most [`EARLY_REFRESH_WAIT`]) for the fetch under way to
    /// finish: a granted early refresh, or the fetch at start.
    pub async fn wait_for_fetch(&self) {
        let mut fetched = self.fetched.subscribe();
        if !self.pending.load(Ordering::Acquire) && *fetched.borrow() > 0 {
            return;
        }
        let _ = tokio::time::timeout(EARLY_REFRESH_WAIT, fetched.changed()).await;
    }

    /// The fetcher's wait between refreshes: `after`, or less when a
    /// request asks for an early one.
    pub async fn wait_for_refresh(&self, after: Duration) {
        let _ = tokio::time::timeout(after, self.wake.notified()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_refreshes_are_granted_once_per_interval() {
        let remote = RemoteKeys::new(Arc::from("http://x/jwks"), Duration::from_secs(60));
        let second = 1_000_000_000;
        // Before the fetch at start has finished, askers wait for it and
        // no early refresh is granted.
        assert_eq!(remote.ask_early(second), Early::Wait);
        assert_eq!(remote.granted_at.load(Ordering::Acquire), u64::MAX);
        assert!(!remote.pending.load(Ordering::Acquire));
        remote.fetch_done();
        assert_eq!(remote.ask_early(10 * second), Early::Wait);
        // Under way: later askers wait for the same refresh.
        assert_eq!(remote.ask_early(11 * second), Early::Wait);
        remote.fetch_done();
        assert_eq!(remote.ask_early(12 * second), Early::No);
        assert_eq!(remote.ask_early(69 * second), Early::No);
        assert_eq!(remote.ask_early(70 * second), Early::Wait);
    }
}
