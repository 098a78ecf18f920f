//! Each worker's sweep over its connections: the one timer that wakes the
//! connections whose deadlines (slow head, idle time) are due, in place of
//! a timer per connection.
//!
//! A timer (tokio's `Sleep`) was 96 bytes in every connection's task, idle
//! or not, and its cell rounds to 128 bytes. Instead a connection's
//! watchdog (`watchdog.rs`) writes when it wants to look at its
//! deadlines next into its activity ([`ConnActivity::check_at`], a 32-bit
//! field that fits in the activity's allocation as it was), and the sweep of
//! its worker walks the worker's shard of the registry ([`super::evict`]),
//! marks each connection whose moment has come and wakes its task, which
//! then looks (and asks for its next look, or closes the connection).
//!
//! Granularity: the sweep runs at the earliest moment one of its
//! connections asked for, but at least [`LEAST`] after its last run (so
//! thousands of connections' moments cost a walk per [`LEAST`], not one
//! each) and at most [`MOST`] after it (a connection that asks for an
//! earlier moment meanwhile is not seen before the next run). So a
//! deadline is acted on never before it falls and at most [`MOST`] after:
//! a head not complete within `header_read_timeout` is cut off within that
//! and a quarter of a second, an idle connection closed within
//! `idle_timeout` and a quarter of a second (short enough that a 1 s
//! header timeout closes well inside a client's 2 s). A walk costs a few loads per connection (10,000 connections:
//! tens of microseconds). A worker with no connection sleeps until one
//! opens.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::conn::evict::Registry;
use crate::http1::server::ConnActivity;

/// The least time between two runs of a worker's sweep.
pub(crate) const LEAST: Duration = Duration::from_millis(100);

/// The most time between two runs of a worker's sweep while it has
/// connections: the latest a deadline is acted on after it falls.
pub(crate) const MOST: Duration = Duration::from_millis(250);

/// Wakes worker `worker`'s connections of `connections` when their
/// deadlines are due, until the task is dropped (run on the worker's own
/// runtime: the connections it wakes are served there).
pub(crate) async fn sweep(connections: Arc<Registry>, worker: usize) {
    loop {
        let now = Instant::now();
        let mut earliest: Option<Instant> = None;
        let any = connections.for_each_of(worker, |activity| {
            if let Some(at) = due_at(activity, now) {
                earliest = Some(earliest.map_or(at, |earliest| earliest.min(at)));
            }
        });
        if !any {
            connections.opened(worker).await;
            continue;
        }
        let next = earliest.map_or(now + MOST, |at| at.clamp(now + LEAST, now + MOST));
        tokio::time::sleep_until(next).await;
    }
}

/// Wakes `activity`'s connection if its look is due at `now`; otherwise
/// the moment it asked for, if any.
fn due_at(activity: &ConnActivity, now: Instant) -> Option<Instant> {
    let at_ms = activity.wake_if_due(activity.ms_at(now))?;
    // `now_ms` counts from 1 at the connection's start.
    Some(activity.started + Duration::from_millis(at_ms.saturating_sub(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    /// Counts its wake-ups.
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A connection is woken once its moment has come, not before, once,
    /// and within [`MOST`] of it; one that asks again is woken again.
    #[tokio::test(start_paused = true)]
    async fn a_connection_is_woken_once_when_its_look_is_due() {
        let registry = Registry::new(1);
        let activity = Arc::new(ConnActivity::new());
        let woken = Arc::new(Counting(AtomicUsize::new(0)));
        activity.set_task(&Waker::from(woken.clone()));
        let _registered = registry.register(0, activity.clone());
        let sweeping = tokio::spawn(sweep(registry.clone(), 0));
        let start = Instant::now();
        activity.check_at(activity.now_ms() + 2_500);
        let wakes = || woken.0.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(2_400)).await;
        assert_eq!(wakes(), 0, "woken before its moment");
        tokio::time::sleep(MOST).await;
        assert_eq!(wakes(), 1, "not woken within MOST of its moment");
        assert!(activity.take_due() && !activity.take_due());
        tokio::time::sleep(5 * MOST).await;
        assert_eq!(wakes(), 1, "woken again without asking");
        // Asks again, for a moment already past: the next run wakes it.
        activity.check_at(activity.ms_at(start));
        tokio::time::sleep(MOST).await;
        assert_eq!(wakes(), 2);
        sweeping.abort();
    }

    /// A worker with no connection waits for one; its sweep then watches
    /// it.
    #[tokio::test(start_paused = true)]
    async fn a_sweep_waits_for_a_connection_and_then_watches_it() {
        let registry = Registry::new(2);
        let sweeping = tokio::spawn(sweep(registry.clone(), 1));
        tokio::time::sleep(10 * MOST).await;
        let activity = Arc::new(ConnActivity::new());
        let woken = Arc::new(Counting(AtomicUsize::new(0)));
        activity.set_task(&Waker::from(woken.clone()));
        activity.check_at(activity.now_ms() + 300);
        let _registered = registry.register(1, activity.clone());
        tokio::time::sleep(MOST + 2 * LEAST).await;
        assert_eq!(woken.0.load(Ordering::Relaxed), 1);
        sweeping.abort();
    }
}
