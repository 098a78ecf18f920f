//! Priorities and the reserve of a slot limit (`concurrency`, `adaptive`).
//!
//! A request's [`Priority`] is resolved once per request (its consumer's,
//! else its route's, else `normal`) and carried into the decision as a
//! one-byte value. At a slot limit, `normal` and `critical` requests may
//! take any free slot; a `sheddable` one only while at least the limit's
//! [`Reserve`] stays free after it took its slots, so that a flood of batch
//! traffic cannot take the capacity the requests that matter need.
//!
//! [`slot_verdict`] is the whole rule, a pure function of the numbers an
//! algorithm already has: `concurrency` calls it with its `max`, `adaptive`
//! with its current limit. The waiting queue (`queue.rs`) orders waiters by
//! the same priority.
//!
//! Worked example: `max = 10`, `reserve = "20%"` (2 slots). With 7 in
//! flight a sheddable request is admitted (10 - 8 = 2 stay free); with 8 in
//! flight it is refused (only 1 would stay free), while a normal or
//! critical one is admitted up to 10.

use super::verdict::Verdict;
use super::{NANOS_PER_SEC, Nanos};

/// What a request refused at a slot limit is told to wait: the contract's
/// `Retry-After: 1` (nobody knows when a response will end).
pub(crate) const RETRY_AFTER: Nanos = NANOS_PER_SEC;

/// Who is served first when slots are short (`priority = "..."`).
///
/// Ordered by rank: `Critical < Normal < Sheddable`, so the queue serves in
/// ascending order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Served first; may take any slot.
    Critical,
    /// The default; may take any slot.
    #[default]
    Normal,
    /// Shed first: may not take the limit's reserve; served last.
    Sheddable,
}

impl Priority {
    /// Every priority, in the order the queue serves them.
    pub(crate) const ALL: [Priority; 3] =
        [Priority::Critical, Priority::Normal, Priority::Sheddable];

    /// The spelling in `gateway.toml`, metrics and problem details.
    pub fn label(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::Sheddable => "sheddable",
        }
    }

    /// The priority `text` names, if any.
    pub(crate) fn parse(text: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.label() == text)
    }

    /// The queue's class index (0 served first).
    pub(crate) fn rank(self) -> usize {
        self as usize
    }
}

/// The part of a slot limit a `sheddable` request may not take
/// (`reserve = "20%"` or `reserve = 3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reserve {
    /// Percent of the limit in force, rounded up (`"20%"` of 4 is 1 slot).
    Percent(u8),
    /// A number of slots.
    Slots(u64),
}

impl Default for Reserve {
    /// The contract's default, `"20%"`.
    fn default() -> Reserve {
        Reserve::Percent(20)
    }
}

impl Reserve {
    /// The slots reserved out of `limit` (never more than `limit`).
    pub fn slots(self, limit: u64) -> u64 {
        match self {
            Reserve::Percent(p) => {
                let part = u128::from(limit) * u128::from(p);
                part.div_ceil(100).min(u128::from(limit)) as u64
            }
            Reserve::Slots(n) => n.min(limit),
        }
    }
}

/// Whether a request of `priority` and `cost` may take slots of a limit of
/// `limit` with `in_flight` taken: every priority while they fit; a
/// `sheddable` one only while `reserve` of the limit stays free after it.
#[inline]
pub fn admits(in_flight: u64, cost: u64, limit: u64, reserve: Reserve, priority: Priority) -> bool {
    let after = in_flight.saturating_add(cost);
    match priority {
        Priority::Critical | Priority::Normal => after <= limit,
        Priority::Sheddable => after <= limit - reserve.slots(limit),
    }
}

/// A slot limit's verdict for one request: [`admits`] as a [`Verdict`]
/// (`r` = the slots left, a denial's `Retry-After` the contract's 1 s;
/// `never` when the cost exceeds the limit whatever the priority).
#[inline]
pub fn slot_verdict(
    in_flight: u64,
    cost: u64,
    limit: u64,
    reserve: Reserve,
    priority: Priority,
) -> Verdict {
    let never = cost > limit;
    if !never && admits(in_flight, cost, limit, reserve, priority) {
        Verdict::allow(limit - (in_flight + cost), 0)
    } else {
        Verdict::deny(limit.saturating_sub(in_flight), 0, RETRY_AFTER, never)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example() {
        let r = Reserve::default();
        assert_eq!(r.slots(10), 2);
        assert!(admits(7, 1, 10, r, Priority::Sheddable));
        assert!(!admits(8, 1, 10, r, Priority::Sheddable));
        for p in [Priority::Normal, Priority::Critical] {
            assert!(admits(9, 1, 10, r, p));
            assert!(!admits(10, 1, 10, r, p));
        }
        let v = slot_verdict(8, 1, 10, r, Priority::Sheddable);
        assert!(!v.allowed && !v.never && v.remaining == 2);
        let v = slot_verdict(8, 1, 10, r, Priority::Normal);
        assert!(v.allowed && v.remaining == 1);
        assert!(slot_verdict(0, 11, 10, r, Priority::Critical).never);
    }

    #[test]
    fn reserve_rounds_up_and_never_exceeds_the_limit() {
        assert_eq!(Reserve::Percent(20).slots(4), 1);
        assert_eq!(Reserve::Percent(20).slots(5), 1);
        assert_eq!(Reserve::Percent(20).slots(6), 2);
        assert_eq!(Reserve::Percent(0).slots(100), 0);
        assert_eq!(Reserve::Percent(100).slots(7), 7);
        assert_eq!(Reserve::Slots(3).slots(10), 3);
        assert_eq!(Reserve::Slots(30).slots(10), 10);
        assert_eq!(Reserve::Percent(50).slots(u64::MAX), u64::MAX / 2 + 1);
        // No reserve: sheddable is like normal.
        assert!(admits(9, 1, 10, Reserve::Slots(0), Priority::Sheddable));
        // A reserve as large as the limit sheds every sheddable request.
        assert!(!admits(0, 1, 10, Reserve::Slots(10), Priority::Sheddable));
    }

    #[test]
    fn an_adaptive_limit_moving_moves_the_reserve() {
        // The same check over a limit that changes between calls.
        let r = Reserve::Percent(25);
        assert!(admits(2, 1, 4, r, Priority::Sheddable));
        assert!(!admits(3, 1, 4, r, Priority::Sheddable));
        assert!(admits(5, 1, 8, r, Priority::Sheddable));
        assert!(!admits(6, 1, 8, r, Priority::Sheddable));
    }

    #[test]
    fn labels_round_trip_and_rank_orders_service() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.label()), Some(p));
        }
        assert_eq!(Priority::parse("high"), None);
        assert!(Priority::Critical.rank() < Priority::Normal.rank());
        assert!(Priority::Normal.rank() < Priority::Sheddable.rank());
        assert_eq!(Priority::default(), Priority::Normal);
    }
}
