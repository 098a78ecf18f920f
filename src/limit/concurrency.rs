//! Concurrency: requests in flight per key, released when the response ends.
//!
//! Unlike the rate algorithms there is nothing to compute on arrival except
//! `in_flight + cost <= max` (less the reserve for a sheddable request:
//! `priority.rs` decides); the interesting part is the release. Each key's
//! count is an `Arc<AtomicU64>` (its *slot*); an admitted request gets a
//! [`ConcurrencyPermit`] holding a clone of the slot, and dropping the permit
//! subtracts its units. The HTTP layer keeps the permit alive until the
//! response body ends (for an upgraded connection, until the tunnel closes),
//! so no code path can forget to release: a panic or a dropped future
//! releases too.
//!
//! Increments happen under the key's shard lock (so a stack decides
//! atomically); releases need no lock, they only lower the count, which can
//! only make a concurrent decision more conservative. A slot whose only
//! owner is the map and whose count is 0 is fresh and can be swept.
//!
//! A limit with a `queue` hands out permits that also know its waiting line
//! (`queue.rs`): their drop wakes the first waiter for the released key, and
//! costs one atomic load more when nobody waits. A limit without one pays
//! nothing.
//!
//! Worked example, `max = 2`: two requests take permits (`in_flight` 2,
//! `r` 0); a third is denied (`retry_after` 1 s, the contract's fixed hint,
//! since nobody knows when a response will end); when the first response
//! ends its permit drops, `in_flight` is 1 and the next request passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::queue::SlotQueue;

/// A key's in-flight count, shared by the map and the permits.
pub(crate) type Slot = Arc<AtomicU64>;

/// Holds `units` of a key's concurrency until dropped.
#[derive(Debug)]
pub struct ConcurrencyPermit {
    slot: Slot,
    units: u64,
    /// The limit's waiting line and this slot's key in it, when the limit
    /// has a `queue`: told of the release.
    queue: Option<(Arc<SlotQueue>, u64)>,
}

impl ConcurrencyPermit {
    /// Charge `units` to `slot`; the caller has decided they fit.
    pub(crate) fn acquire(slot: &Slot, units: u64) -> ConcurrencyPermit {
        slot.fetch_add(units, Ordering::AcqRel);
        ConcurrencyPermit {
            slot: Arc::clone(slot),
            units,
            queue: None,
        }
    }

    /// Tell `queue` when this permit's slot of `key` is released.
    pub(crate) fn wake_on_release(&mut self, queue: &Arc<SlotQueue>, key: u64) {
        self.queue = Some((Arc::clone(queue), key));
    }
}

impl Drop for ConcurrencyPermit {
    fn drop(&mut self) {
        // SeqCst, as the waiter's count in the queue: a waiter that joined
        // before this release is woken, or sees the slot free when it
        // decides again after joining.
        self.slot.fetch_sub(self.units, Ordering::SeqCst);
        if let Some((queue, key)) = &self.queue {
            queue.released(*key);
        }
    }
}

/// No permit alive and nothing in flight: the key can be forgotten.
pub(crate) fn is_fresh(slot: &Slot) -> bool {
    Arc::strong_count(slot) == 1 && slot.load(Ordering::Acquire) == 0
}

/// Units in flight now.
pub(crate) fn in_flight(slot: &Slot) -> u64 {
    slot.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::priority::{Priority, RETRY_AFTER, Reserve};
    use crate::limit::verdict::Verdict;

    /// The decision of a normal request (`priority.rs` decides them all).
    fn decide(in_flight: u64, cost: u64, max: u64) -> Verdict {
        crate::limit::priority::slot_verdict(
            in_flight,
            cost,
            max,
            Reserve::default(),
            Priority::Normal,
        )
    }

    #[test]
    fn worked_example() {
        let slot: Slot = Arc::default();
        let max = 2;
        let mut permits = Vec::new();
        for r in [1, 0] {
            let v = decide(in_flight(&slot), 1, max);
            assert!(v.allowed);
            assert_eq!(v.remaining, r);
            permits.push(ConcurrencyPermit::acquire(&slot, 1));
        }
        let v = decide(in_flight(&slot), 1, max);
        assert!(!v.allowed && v.retry_after == Some(RETRY_AFTER));
        permits.pop();
        assert!(decide(in_flight(&slot), 1, max).allowed);
        assert!(!is_fresh(&slot));
        permits.clear();
        assert!(is_fresh(&slot));
        assert!(decide(0, 3, max).never);
    }
}
