//! `adaptive` per key: the state a key's requests share, the admission test,
//! and the [`AdaptivePermit`] an admitted request holds until its response
//! ends, whose release tells the limit how the request went.
//!
//! How the limit moves is `adaptive`'s (a pure function of completions and
//! `now`); this module only keeps it per key and feeds it. As with
//! `concurrency`, a key's state is an `Arc` shared by the table and the
//! permits, so a permit dropped anywhere (a response body's end, a tunnel's
//! close, a cancelled request's future) releases its slot. Unlike a
//! concurrency slot, a release does more than subtract: it moves the limit
//! (several `f64` fields), so the state sits behind a per-key mutex. The
//! order is always shard lock, then key lock (admission); a release takes
//! the key's lock only, never a shard's, so the two cannot deadlock and a
//! release never waits on another key's decision.
//!
//! What a release reports ([`UpstreamAnswer`] → [`Outcome`]): the proxy
//! records the upstream's status (or its timeout) on the request's permits
//! when it has it ([`AdaptivePermit::answered`]); the latency is from
//! admission to that answer, on the limiter's clock. A request that ends
//! without an answer (its client went away, the stack was refused
//! elsewhere, `/auth` only decided) releases its slot and teaches nothing.
//!
//! Worked example, `min = 1, max = 100, initial = 2`, key fresh at `T`: two
//! requests are admitted (`r` 1, 0, `q` 2); a third is refused (`Retry-After`
//! 1 s, as concurrency: nobody knows when a response ends). The first
//! answers 503 at `T + 5 ms`: its release multiplies the limit by 0.8 (2 →
//! 1.6, whose integer part 1 admits), so after the second also ends, one
//! request at a time passes until completions show the upstream keeps up.

use std::sync::Arc;

use parking_lot::Mutex;

use super::Nanos;
use super::adaptive::{Adaptive, Outcome, Params};
use super::priority::{self, Priority, RETRY_AFTER, Reserve};
use super::queue::SlotQueue;
use super::verdict::Verdict;

/// One key's limit and the numbers it moves within (kept with it, so that a
/// release needs nothing but its permit, and a reload can rescale it).
#[derive(Debug)]
pub(crate) struct Cell {
    params: Params,
    state: Adaptive,
}

/// A key's adaptive state, shared by the table and the permits.
pub(crate) type Slot = Arc<Mutex<Cell>>;

/// A fresh key at `params.initial`, its first window starting at `now`.
pub(crate) fn fresh(params: Params, now: Nanos) -> Slot {
    Arc::new(Mutex::new(Cell {
        params,
        state: Adaptive::new(params, now),
    }))
}

/// Decide a request of `cost` against `slot` (`None`: a fresh key): admitted
/// while `in_flight + cost ≤ limit`; never when `cost` exceeds `max`, the
/// most the limit can ever be. The verdict's `current_limit` is its `q`.
pub(crate) fn decide(
    slot: Option<&Slot>,
    params: Params,
    (cost, priority): (u64, Priority),
    reserve: Reserve,
) -> Verdict {
    let (in_flight, limit) = match slot {
        Some(slot) => {
            let cell = slot.lock();
            (cell.state.in_flight(), cell.state.limit())
        }
        None => (0, params.initial()),
    };
    let (in_flight, limit64) = (u64::from(in_flight), u64::from(limit));
    // The same rule as `concurrency` (the reserve a sheddable request may not
    // take) at the limit in force; `never` only past `max`, where the limit
    // can never grow to.
    let mut verdict = priority::slot_verdict(in_flight, cost, limit64, reserve, priority);
    verdict.never = cost > u64::from(params.max());
    if verdict.never {
        verdict.allowed = false;
        verdict.retry_after = Some(RETRY_AFTER);
    }
    verdict.current_limit = limit;
    verdict
}

/// Nothing in flight, no permit alive and the limit at `initial`: the key can
/// be forgotten (an absent key is a fresh one).
pub(crate) fn is_fresh(slot: &Slot) -> bool {
    Arc::strong_count(slot) == 1 && {
        let cell = slot.lock();
        cell.state.is_fresh(cell.params)
    }
}

/// `slot` kept for a reloaded limit with `params`: the learned limit and
/// baseline stay, clamped into the new bounds; permits taken before the
/// reload release into it. Cold path (a reload).
pub(crate) fn carry(slot: &Slot, params: Params) -> Slot {
    let mut cell = slot.lock();
    cell.params = params;
    cell.state.rescale(params);
    Arc::clone(slot)
}

/// What a key's limit shows now (the admin view, the metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) limit: u32,
    pub(crate) in_flight: u32,
    /// The learned unqueued latency (ns), once a request was answered.
    pub(crate) baseline: Option<Nanos>,
    /// The mean latency (ns) of the last closed window.
    pub(crate) recent: Option<Nanos>,
}

pub(crate) fn view(slot: &Slot) -> View {
    let cell = slot.lock();
    View {
        limit: cell.state.limit(),
        in_flight: cell.state.in_flight(),
        baseline: cell.state.baseline(),
        recent: cell.state.recent(),
    }
}

/// How the upstream answered an admitted request, as the proxy knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UpstreamAnswer {
    /// The upstream's response status.
    Status(u16),
    /// No answer within the route's upstream timeout.
    TimedOut,
}

impl UpstreamAnswer {
    /// What the answer tells the limit: 503, 504, 429 and a timeout say the
    /// upstream is full (multiplicative decrease); any other answer is a
    /// latency sample of its load.
    pub(crate) fn outcome(self) -> Outcome {
        match self {
            UpstreamAnswer::Status(503 | 504 | 429) | UpstreamAnswer::TimedOut => Outcome::Overload,
            UpstreamAnswer::Status(_) => Outcome::Success,
        }
    }
}

/// Holds `units` of a key's adaptive limit until dropped; the drop releases
/// them and, if the upstream answered, teaches the limit.
#[derive(Debug)]
pub struct AdaptivePermit {
    slot: Slot,
    units: u32,
    /// When the request was admitted (the latency's start).
    admitted: Nanos,
    /// When and how the upstream answered, once it has.
    answer: Option<(Nanos, Outcome)>,
    /// The limit's waiting line and this slot's key in it, when the limit
    /// has a `queue`: told of the release.
    queue: Option<(Arc<SlotQueue>, u64)>,
}

impl AdaptivePermit {
    /// Take `units` of `slot` at `now`; the caller has decided they fit.
    pub(crate) fn acquire(slot: &Slot, units: u32, now: Nanos) -> AdaptivePermit {
        slot.lock().state.acquire_units(units);
        AdaptivePermit {
            slot: Arc::clone(slot),
            units,
            admitted: now,
            answer: None,
            queue: None,
        }
    }

    /// Tell `queue` when this permit's slot of `key` is released.
    pub(crate) fn wake_on_release(&mut self, queue: &Arc<SlotQueue>, key: u64) {
        self.queue = Some((Arc::clone(queue), key));
    }

    /// The upstream answered at `now` (a retried request's last answer is
    /// the one that counts).
    pub(crate) fn answered(&mut self, answer: UpstreamAnswer, now: Nanos) {
        self.answer = Some((now, answer.outcome()));
    }
}

impl Drop for AdaptivePermit {
    fn drop(&mut self) {
        let mut cell = self.slot.lock();
        let Cell { params, state } = &mut *cell;
        match self.answer {
            Some((at, outcome)) => {
                state.on_complete(*params, at, at.saturating_sub(self.admitted), outcome)
            }
            None => state.on_complete(*params, self.admitted, 0, Outcome::Ignored),
        }
        state.release_units(self.units.saturating_sub(1));
        drop(cell);
        // After the slot is free (under its lock, which orders it before a
        // waiter's next decision), as `ConcurrencyPermit::drop` does.
        if let Some((queue, key)) = &self.queue {
            queue.released(*key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const T: Nanos = 1_700_000_000_000 * MS;

    #[test]
    fn a_key_costs_104_heap_bytes() {
        // `table.rs`'s figure: the Arc's two counts and the locked cell.
        assert_eq!(16 + std::mem::size_of::<Mutex<Cell>>(), 104);
    }

    #[test]
    fn worked_example() {
        let params = Params::new(1, 100, 2).unwrap();
        let slot = fresh(params, T);
        let mut held = Vec::new();
        for r in [1, 0] {
            let v = decide(
                Some(&slot),
                params,
                (1, Priority::Normal),
                Reserve::default(),
            );
            assert!(v.allowed);
            assert_eq!((v.remaining, v.current_limit), (r, 2));
            held.push(AdaptivePermit::acquire(&slot, 1, T));
        }
        let v = decide(
            Some(&slot),
            params,
            (1, Priority::Normal),
            Reserve::default(),
        );
        assert!(!v.allowed && !v.never);
        assert_eq!(v.retry_after, Some(RETRY_AFTER));
        held[0].answered(UpstreamAnswer::Status(503), T + 5 * MS);
        held.remove(0);
        assert_eq!(view(&slot).limit, 1, "2 × 0.8 = 1.6");
        assert_eq!(view(&slot).in_flight, 1);
        assert!(
            !decide(
                Some(&slot),
                params,
                (1, Priority::Normal),
                Reserve::default()
            )
            .allowed
        );
        held.clear();
        assert!(
            decide(
                Some(&slot),
                params,
                (1, Priority::Normal),
                Reserve::default()
            )
            .allowed
        );
        assert!(
            decide(
                Some(&slot),
                params,
                (101, Priority::Normal),
                Reserve::default()
            )
            .never
        );
        // Learned (limit 1, not `initial`): not fresh, kept by a sweep.
        assert!(!is_fresh(&slot));
    }

    #[test]
    fn a_sheddable_request_leaves_the_reserve_of_the_current_limit() {
        // Limit 10 (initial), reserve 20 %: 2 slots a sheddable request may not take.
        let params = Params::new(1, 100, 10).unwrap();
        let slot = fresh(params, T);
        let held: Vec<_> = (0..8)
            .map(|_| AdaptivePermit::acquire(&slot, 1, T))
            .collect();
        let shed = decide(
            Some(&slot),
            params,
            (1, Priority::Sheddable),
            Reserve::default(),
        );
        assert!(!shed.allowed && !shed.never);
        assert_eq!(shed.current_limit, 10);
        for p in [Priority::Normal, Priority::Critical] {
            assert!(decide(Some(&slot), params, (1, p), Reserve::default()).allowed);
        }
        // Past the current limit but within `max`: refused, yet not `never`.
        let big = decide(
            Some(&slot),
            params,
            (50, Priority::Normal),
            Reserve::default(),
        );
        assert!(!big.allowed && !big.never);
        drop(held);
    }

    #[test]
    fn an_unanswered_release_teaches_nothing() {
        let params = Params::new(1, 100, 20).unwrap();
        let slot = fresh(params, T);
        for _ in 0..50 {
            drop(AdaptivePermit::acquire(&slot, 3, T));
        }
        let v = view(&slot);
        assert_eq!((v.limit, v.in_flight, v.baseline), (20, 0, None));
        assert!(is_fresh(&slot));
        let other = Arc::clone(&slot);
        assert!(!is_fresh(&slot), "a clone (a permit) is alive");
        drop(other);
    }

    #[test]
    fn answers_sample_and_cut() {
        let params = Params::new(1, 100, 10).unwrap();
        let slot = fresh(params, T);
        // Rounds of ten 200s at 10 ms with the limit in use: the first two
        // set the baseline, the third is a window that grows the limit.
        for round in 0..3 {
            let sent = T + round * 10 * MS;
            let mut held: Vec<_> = (0..10)
                .map(|_| AdaptivePermit::acquire(&slot, 1, sent))
                .collect();
            for p in &mut held {
                p.answered(UpstreamAnswer::Status(200), sent + 10 * MS);
            }
        }
        let v = view(&slot);
        assert_eq!(v.baseline, Some(10 * MS));
        assert!(v.limit > 10, "{v:?}");
        // A timeout: × 0.8.
        let before = v.limit;
        let mut p = AdaptivePermit::acquire(&slot, 1, T + 40 * MS);
        p.answered(UpstreamAnswer::TimedOut, T + 50 * MS);
        drop(p);
        assert!(view(&slot).limit < before);
        assert_eq!(UpstreamAnswer::Status(429).outcome(), Outcome::Overload);
        assert_eq!(UpstreamAnswer::Status(404).outcome(), Outcome::Success);
    }

    #[test]
    fn carry_rescales_and_shares() {
        let params = Params::new(1, 100, 50).unwrap();
        let slot = fresh(params, T);
        let permit = AdaptivePermit::acquire(&slot, 1, T);
        let narrower = Params::new(1, 30, 10).unwrap();
        let carried = carry(&slot, narrower);
        assert_eq!(view(&carried).limit, 30);
        assert_eq!(view(&carried).in_flight, 1);
        drop(permit);
        assert_eq!(view(&carried).in_flight, 0, "released into the carried key");
    }
}
