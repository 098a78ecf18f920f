//! The key stack: a route's limits decided all-or-nothing.
//!
//! A request is admitted only if every non-shadow limit of its stack admits
//! it, and a denied request consumes from none of them (contract §2 "Key stack
//! semantics"). Under concurrency that needs more than checking each limit in
//! turn: two requests racing for the last unit of a shared per-IP limit while
//! each holds its own per-key budget must not both pass, and a request denied
//! by the second limit must not have charged the first.
//!
//! [`check_stack`] therefore:
//!
//! 1. locks every shard the stack touches, in one global order (limiter
//!    address, then shard index; a shard shared by two entries is locked
//!    once), so two stacks sharing limits can never deadlock;
//! 2. decides each entry in stack order and charges it at once if it admits
//!    (so a limit listed twice sees its own first charge), remembering how to
//!    undo each charge;
//! 3. if a non-shadow entry denied, undoes every charge in reverse order and
//!    drops the concurrency permits taken, then reports the limits that would
//!    have admitted as [`Outcome::DeniedByOther`], with their state as it
//!    stands (uncharged);
//! 4. unlocks. Nobody else observes the intermediate states.
//!
//! Shadow limits are decided and charged like the others when the request is
//! admitted but never deny; a shadow limit that would deny is not charged
//! (its state tracks what it would hold if enforced) and reports
//! [`Outcome::ShadowDenied`]. An entry without a key is skipped.
//!
//! No heap allocation for stacks of up to [`INLINE`] entries: the lock plan,
//! the guards, the undo log, the verdicts and the permits (up to 2) live in
//! `SmallVec`s inline in the stack frame and in the returned
//! [`StackDecision`]. (A key seen for the first time does allocate its table
//! slot; a sliding log may grow its deque.)
//!
//! Example: stack `[per_key (token bucket, 20), per_ip (sliding window, 100)]`
//! with cost 20, per_key full and per_ip at 90: per_key admits and is charged
//! (`r` 0), per_ip denies (`r` 10); the per_key charge is undone, and the
//! decision reports `denied_by = Some(1)`, per_key `Allowed` with `r` 20.

use std::cell::RefCell;
use std::mem::ManuallyDrop;

use parking_lot::MutexGuard;
use smallvec::SmallVec;

use super::Nanos;
use super::adaptive_slot::UpstreamAnswer;
use super::clock::Clock;
use super::key::LimitKey;
use super::memory::{Decision, Limiter, ShardMap, SlotPermit, Undo};
use super::priority::Priority;
use super::verdict::Verdict;

/// Stacks up to this long are decided without touching the heap.
pub(crate) const INLINE: usize = 8;

/// One limit of a route's stack, with the request's key for it.
#[derive(Clone, Copy, Debug)]
pub struct StackEntry<'a> {
    pub limiter: &'a Limiter,
    /// `None`: the request has no such key and the limit skips it.
    pub key: Option<LimitKey>,
    /// Count and report, never deny.
    pub shadow: bool,
}

/// How one entry took the request (the `outcome` label of
/// `tollgate_ratelimit_decisions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The limit admits (charged if the whole stack admitted).
    Allowed,
    /// The limit denies (and, not being shadow, so does the stack).
    Denied,
    /// A shadow limit that would have denied.
    ShadowDenied,
    /// No key: the limit did not apply.
    Skipped,
    /// The limit would have admitted, but another limit of the stack denied
    /// the request, so nothing was charged here: the request did not get
    /// through, and counting it `Allowed` would overstate what passed.
    DeniedByOther,
}

/// One entry's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryVerdict {
    pub outcome: Outcome,
    /// The limit's numbers (default, all zero, when skipped).
    pub verdict: Verdict,
}

/// Concurrency permits of an admitted request; dropping them releases the
/// slots. Hold them until the response body ends.
#[derive(Debug, Default)]
pub(crate) struct Permits {
    /// Memory slots and guards held elsewhere, in one list: a request makes
    /// several empty `Permits` on its way (moved into and out of the
    /// decision, the notes, the response body), and an empty list drops
    /// without the out-of-line call a second, boxed field cost each time.
    /// A `Vec`, not inline: most requests hold none, and the 64 bytes of an
    /// inline pair made every response 40 bytes larger, copied on each of
    /// its moves. A request that holds a permit takes its list from the
    /// thread's spare lists ([`SPARE_LISTS`]), so a decision allocates
    /// nothing once the thread has served one.
    ///
    /// Dropped by hand ([`Permits`]' `Drop`): a `Vec` field's own drop
    /// called the slice's drop out of line even for the empty list most
    /// requests hold, four times a request (~70 instructions).
    slots: ManuallyDrop<Vec<Permit>>,
}

/// Emptied permit lists kept per thread for the next requests that hold
/// permits (beyond it a list is freed).
const SPARE_LISTS_MAX: usize = 64;

thread_local! {
    static SPARE_LISTS: RefCell<Vec<Vec<Permit>>> = const { RefCell::new(Vec::new()) };
}

/// One thing [`Permits`] releases by being dropped.
#[derive(Debug)]
enum Permit {
    Memory(SlotPermit),
    /// Held elsewhere (a Redis concurrency lease; see [`Permits::hold`]).
    // Never read: held only for what its drop releases.
    #[allow(dead_code)]
    Held(Box<dyn std::fmt::Debug + Send + Sync>),
}

impl Drop for Permits {
    #[inline]
    fn drop(&mut self) {
        if self.slots.capacity() != 0 {
            self.give_back_list();
        }
    }
}

impl Permits {
    fn push(&mut self, permit: Option<SlotPermit>) {
        if let Some(permit) = permit {
            self.add(Permit::Memory(permit));
        }
    }

    /// Tells the adaptive limits among these permits how the upstream
    /// answered, at the time `clock` reads now; their release (the response
    /// body's end) then teaches each limit. Read only when one is held, so
    /// a request without an adaptive limit pays no clock read. A request
    /// whose permits are dropped without this (a client that went away, a
    /// gateway error other than a timeout) teaches nothing.
    pub(crate) fn record_outcome(&mut self, answer: UpstreamAnswer, clock: &dyn Clock) {
        let mut now = None;
        for permit in self.slots.iter_mut() {
            if let Permit::Memory(SlotPermit::Adaptive(adaptive)) = permit {
                let now = *now.get_or_insert_with(|| clock.now());
                adaptive.answered(answer, now);
            }
        }
    }

    /// [`Permits::record_outcome`] at a known instant (the simulator's
    /// modelled response end).
    pub(crate) fn record_outcome_at(&mut self, answer: UpstreamAnswer, now: Nanos) {
        for permit in self.slots.iter_mut() {
            if let Permit::Memory(SlotPermit::Adaptive(adaptive)) = permit {
                adaptive.answered(answer, now);
            }
        }
    }

    /// Keeps `guard` (e.g. a Redis concurrency lease) until these permits drop.
    pub(crate) fn hold(&mut self, guard: Box<dyn std::fmt::Debug + Send + Sync>) {
        self.add(Permit::Held(guard));
    }

    fn add(&mut self, permit: Permit) {
        if self.slots.capacity() == 0 {
            *self.slots = SPARE_LISTS
                .try_with(|lists| lists.try_borrow_mut().ok()?.pop())
                .ok()
                .flatten()
                .unwrap_or_else(|| Vec::with_capacity(2));
        }
        self.slots.push(permit);
    }

    /// Releases the permits and keeps their list for the thread's next
    /// request that holds one.
    #[cold]
    fn give_back_list(&mut self) {
        // Taken out whole: an empty list, which owns nothing, stays.
        let mut list = std::mem::take(&mut *self.slots);
        list.clear();
        if list.capacity() > 8 {
            return;
        }
        let _ = SPARE_LISTS.try_with(|lists| {
            if let Ok(mut lists) = lists.try_borrow_mut()
                && lists.len() < SPARE_LISTS_MAX
            {
                lists.push(list);
            }
        });
    }

    /// Takes over `other`'s permits and guards.
    pub(crate) fn append(&mut self, mut other: Permits) {
        if self.slots.capacity() == 0 {
            std::mem::swap(&mut self.slots, &mut other.slots);
        } else {
            self.slots.append(&mut other.slots);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Memory permits plus held guards.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    fn clear(&mut self) {
        self.slots.clear();
    }
}

/// The stack's decision for one request.
#[derive(Debug)]
pub struct StackDecision {
    /// Every non-shadow limit admitted, and all were charged.
    pub allowed: bool,
    /// Per entry, in stack order.
    pub(crate) entries: SmallVec<[EntryVerdict; INLINE]>,
    /// The first non-shadow entry (stack order) that denied.
    pub denied_by: Option<usize>,
    /// Leaky buckets in `Delay` mode: hold the admitted request this long
    /// (the longest of the stack's delays) before forwarding. 0 if denied.
    pub(crate) delay: Nanos,
    /// Concurrency permits of an admitted request.
    permits: Permits,
}

impl Default for StackDecision {
    /// No entry decided yet: what [`check_stack_into`] fills. Inlined:
    /// a ticket's default writes it in place.
    #[inline(always)]
    fn default() -> StackDecision {
        StackDecision {
            allowed: true,
            entries: SmallVec::new(),
            denied_by: None,
            delay: 0,
            permits: Permits::default(),
        }
    }
}

impl StackDecision {
    /// A decision assembled from parts decided elsewhere (a stack split
    /// between node memory and a shared store).
    pub(crate) fn from_parts(
        entries: SmallVec<[EntryVerdict; INLINE]>,
        denied_by: Option<usize>,
        delay: Nanos,
        permits: Permits,
    ) -> StackDecision {
        StackDecision {
            allowed: denied_by.is_none(),
            entries,
            denied_by,
            delay,
            permits,
        }
    }

    /// Take the concurrency permits, to hold until the response body ends.
    /// Dropping the decision without taking them releases them at once.
    pub(crate) fn take_permits(&mut self) -> Permits {
        std::mem::take(&mut self.permits)
    }

    /// Moves the concurrency permits into `into`, which takes the place of
    /// [`StackDecision::take_permits`] when `into` is empty: assigning the
    /// taken permits over it dropped an empty `Permits` for nothing.
    /// Whatever `into` held is released with the decision.
    pub(crate) fn move_permits_into(&mut self, into: &mut Permits) {
        std::mem::swap(&mut self.permits, into);
    }
}

/// What each entry of a stack is charged: one cost for all, or its own
/// (a stack of request and token limits charges each in its unit).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Costs<'c> {
    Uniform(u64),
    /// One per entry, in stack order.
    PerEntry(&'c [u64]),
}

impl Costs<'_> {
    #[inline(always)]
    fn of(self, entry: usize) -> u64 {
        match self {
            Costs::Uniform(cost) => cost,
            Costs::PerEntry(costs) => costs.get(entry).copied().unwrap_or(0),
        }
    }
}

/// Decide `cost` against every entry of the stack, all or nothing (see the
/// module doc).
#[inline]
pub fn check_stack(entries: &[StackEntry<'_>], cost: u64, now: Nanos) -> StackDecision {
    let mut decision = StackDecision::default();
    let charge = (Costs::Uniform(cost), Priority::Normal);
    check_stack_into(entries, charge, now, &mut decision);
    decision
}

/// [`check_stack`] with each entry's own cost.
pub(crate) fn check_stack_costed(
    entries: &[StackEntry<'_>],
    charge: (Costs<'_>, Priority),
    now: Nanos,
) -> StackDecision {
    let mut decision = StackDecision::default();
    check_stack_into(entries, charge, now, &mut decision);
    decision
}

/// [`check_stack`] into `decision`, which must be as
/// [`StackDecision::default`] makes it, for a request of the given
/// priority (slot limits keep their reserve from a sheddable one). The
/// request path keeps its decision
/// where it is used (~0.5 KiB with its inline arrays): returned by value, it
/// was copied out even when inlined, ~90 instructions per request.
#[inline(always)]
pub(crate) fn check_stack_into(
    entries: &[StackEntry<'_>],
    (costs, priority): (Costs<'_>, Priority),
    now: Nanos,
    decision: &mut StackDecision,
) {
    debug_assert!(decision.entries.is_empty() && decision.permits.is_empty());
    if let [only] = entries {
        check_one(only, (costs.of(0), priority), now, decision);
    } else {
        check_many(entries, (costs, priority), now, decision);
    }
}

/// The general case: lock in order, decide, commit or roll back.
fn check_many(
    entries: &[StackEntry<'_>],
    (costs, priority): (Costs<'_>, Priority),
    now: Nanos,
    decision: &mut StackDecision,
) {
    // 1. Lock plan: (limiter address, shard, entry) sorted, so every thread
    //    locks in the same order. Insertion sort: at most a handful of items.
    let mut plan: SmallVec<[(usize, usize, usize); INLINE]> = SmallVec::new();
    for (i, e) in entries.iter().enumerate() {
        if let Some(key) = e.key {
            let addr = e.limiter as *const Limiter as usize;
            plan.push((addr, e.limiter.shard_of(key), i));
        }
    }
    for i in 1..plan.len() {
        let mut j = i;
        while j > 0 && plan[j - 1] > plan[j] {
            plan.swap(j - 1, j);
            j -= 1;
        }
    }
    let mut guards: SmallVec<[MutexGuard<'_, ShardMap>; INLINE]> = SmallVec::new();
    let mut guard_of: SmallVec<[usize; INLINE]> = SmallVec::new();
    guard_of.resize(entries.len(), usize::MAX);
    let mut locked: Option<(usize, usize)> = None;
    for &(addr, shard, i) in &plan {
        if locked != Some((addr, shard)) {
            guards.push(entries[i].limiter.lock_shard(shard));
            locked = Some((addr, shard));
        }
        guard_of[i] = guards.len() - 1;
    }

    // 2. Decide and charge, in stack order.
    let results = &mut decision.entries;
    let mut undos: SmallVec<[(usize, Undo); INLINE]> = SmallVec::new();
    for (i, e) in entries.iter().enumerate() {
        let (Some(key), Some(shard)) = (e.key, guards.get_mut(guard_of[i])) else {
            results.push(SKIPPED);
            continue;
        };
        let mut permit = None;
        let charge = (costs.of(i), priority);
        let (verdict, undo) = e.limiter.apply(shard, key, charge, now, &mut permit);
        decision.permits.push(permit);
        let outcome = outcome_of(&verdict, e.shadow);
        if outcome == Outcome::Denied && decision.denied_by.is_none() {
            decision.denied_by = Some(i);
        }
        if let Some(undo) = undo {
            undos.push((i, undo));
        }
        results.push(EntryVerdict { outcome, verdict });
    }

    // 3. Denied: roll back, report the limits as they stand.
    if decision.denied_by.is_some() {
        decision.allowed = false;
        decision.permits.clear();
        while let Some((i, undo)) = undos.pop() {
            if let Some(shard) = guards.get_mut(guard_of[i]) {
                entries[i].limiter.undo(shard, undo);
            }
        }
        for (i, r) in results.iter_mut().enumerate() {
            if r.outcome != Outcome::Allowed {
                continue;
            }
            r.outcome = Outcome::DeniedByOther;
            if let (Some(key), Some(shard)) = (entries[i].key, guards.get(guard_of[i])) {
                r.verdict = entries[i].limiter.peek_in(shard, key, now);
                r.verdict.allowed = true;
            }
        }
    } else {
        // Shadow limits never change what happens to the request.
        decision.delay = results
            .iter()
            .zip(entries)
            .filter(|(_, e)| !e.shadow)
            .map(|(r, _)| r.verdict.delay)
            .max()
            .unwrap_or(0);
    }
    drop(guards);
}

/// The verdict of an entry without a key.
pub(crate) const SKIPPED: EntryVerdict = EntryVerdict {
    outcome: Outcome::Skipped,
    verdict: Verdict {
        allowed: false,
        remaining: 0,
        reset_after: 0,
        retry_after: None,
        never: false,
        delay: 0,
        current_limit: 0,
    },
};

/// How a verdict counts for a (shadow or not) entry.
pub(crate) fn outcome_of(verdict: &Verdict, shadow: bool) -> Outcome {
    match (verdict.allowed, shadow) {
        (true, _) => Outcome::Allowed,
        (false, true) => Outcome::ShadowDenied,
        (false, false) => Outcome::Denied,
    }
}

/// The one-entry stack, the common case: one lock, and no roll-back, since
/// a limit that denies has charged nothing.
fn check_one(
    entry: &StackEntry<'_>,
    charge: (u64, Priority),
    now: Nanos,
    decision: &mut StackDecision,
) {
    let Some(key) = entry.key else {
        decision.entries.push(SKIPPED);
        return;
    };
    let Decision { verdict, permit } = entry.limiter.check_as(key, charge, now);
    decision.permits.push(permit);
    let outcome = outcome_of(&verdict, entry.shadow);
    if outcome == Outcome::Denied {
        decision.allowed = false;
        decision.denied_by = Some(0);
    } else if !entry.shadow {
        decision.delay = verdict.delay;
    }
    decision.entries.push(EntryVerdict { outcome, verdict });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, LeakyMode, NANOS_PER_SEC, Rate};

    const S: Nanos = NANOS_PER_SEC;
    const T0: Nanos = 1_700_000_000 * S;

    fn k(s: &str) -> Option<LimitKey> {
        Some(LimitKey::digest(&[s.as_bytes()]))
    }

    fn entry(limiter: &Limiter, key: Option<LimitKey>, shadow: bool) -> StackEntry<'_> {
        StackEntry {
            limiter,
            key,
            shadow,
        }
    }

    #[test]
    fn worked_example_denial_charges_nothing() {
        let per_key = Limiter::new(
            "per_key",
            Algorithm::TokenBucket {
                capacity: 20,
                refill: Rate { tokens: 10, per: S },
                wait: 0,
            },
            100,
        );
        let per_ip = Limiter::new(
            "per_ip",
            Algorithm::SlidingWindow {
                limit: 100,
                window: 60 * S,
            },
            100,
        );
        assert!(
            per_ip
                .check(k("ip").unwrap_or(LimitKey::from_u128(0)), 90, T0)
                .verdict
                .allowed
        );
        let stack = [
            entry(&per_key, k("key"), false),
            entry(&per_ip, k("ip"), false),
        ];
        let d = check_stack(&stack, 20, T0);
        assert!(!d.allowed);
        assert_eq!(d.denied_by, Some(1));
        assert_eq!(d.entries[0].outcome, Outcome::DeniedByOther);
        assert_eq!(d.entries[0].verdict.remaining, 20, "reported uncharged");
        assert_eq!(d.entries[1].verdict.remaining, 10);
        assert_eq!(per_key.live_keys(), 0, "the new key's charge was undone");
        // Cost 10 fits both.
        let d = check_stack(&stack, 10, T0);
        assert!(d.allowed);
        assert_eq!(d.entries[0].verdict.remaining, 10);
        assert_eq!(d.entries[1].verdict.remaining, 0);
    }

    #[test]
    fn shadow_never_denies_and_skip_is_marked() {
        let tight = Limiter::new(
            "tight",
            Algorithm::FixedWindow {
                limit: 1,
                window: S,
            },
            100,
        );
        let loose = Limiter::new(
            "loose",
            Algorithm::FixedWindow {
                limit: 10,
                window: S,
            },
            100,
        );
        let stack = [
            entry(&tight, k("a"), true),
            entry(&loose, None, false),
            entry(&loose, k("a"), false),
        ];
        assert!(check_stack(&stack, 1, T0).allowed);
        let d = check_stack(&stack, 1, T0);
        assert!(d.allowed);
        assert_eq!(d.entries[0].outcome, Outcome::ShadowDenied);
        assert_eq!(d.entries[1].outcome, Outcome::Skipped);
        assert_eq!(d.entries[2].verdict.remaining, 8);
    }

    #[test]
    fn same_limit_twice_charges_twice() {
        let l = Limiter::new(
            "l",
            Algorithm::FixedWindow {
                limit: 3,
                window: S,
            },
            100,
        );
        let stack = [entry(&l, k("a"), false), entry(&l, k("a"), false)];
        assert!(check_stack(&stack, 1, T0).allowed);
        let d = check_stack(&stack, 1, T0);
        assert_eq!(d.denied_by, Some(1));
        assert_eq!(l.peek(LimitKey::digest(&[b"a"]), T0).remaining, 1);
    }

    #[test]
    fn adaptive_is_all_or_nothing_and_learns_from_recorded_answers() {
        use crate::limit::ManualClock;
        use crate::limit::adaptive::Params;
        use crate::limit::adaptive_slot::UpstreamAnswer;
        let params = Params::new(1, 10, 2).unwrap();
        let backend = Limiter::new("backend", Algorithm::Adaptive { params }, 100);
        let tight = Limiter::new(
            "tight",
            Algorithm::FixedWindow {
                limit: 1,
                window: 60 * S,
            },
            100,
        );
        let route = k("route");
        let in_flight = || backend.adaptive_view(route.unwrap()).unwrap().in_flight;
        let stack = |user| [entry(&backend, route, false), entry(&tight, k(user), false)];
        let mut first = check_stack(&stack("a"), 1, T0);
        assert!(first.allowed);
        assert_eq!(first.entries[0].verdict.remaining, 1);
        assert_eq!(first.entries[0].verdict.current_limit, 2);
        let mut held = first.take_permits();
        // Refused by `tight`: the adaptive slot it took is given back.
        let second = check_stack(&stack("a"), 1, T0);
        assert_eq!(second.denied_by, Some(1));
        assert_eq!(second.entries[0].outcome, Outcome::DeniedByOther);
        assert_eq!(second.entries[0].verdict.remaining, 1);
        drop(second);
        assert_eq!(in_flight(), 1);
        // Refused by the adaptive limit: `tight` is not charged for `c`.
        let mut third = check_stack(&stack("b"), 1, T0);
        let also_held = third.take_permits();
        let fourth = check_stack(&stack("c"), 1, T0);
        assert_eq!(fourth.denied_by, Some(0));
        assert_eq!(tight.peek(k("c").unwrap(), T0).remaining, 1);
        // A 503 recorded on the first request's permits: once released,
        // the limit falls (2 × 0.8 = 1.6).
        let clock = ManualClock::new(T0 + 5_000_000);
        held.record_outcome(UpstreamAnswer::Status(503), &clock);
        drop(held);
        assert_eq!(backend.adaptive_view(route.unwrap()).unwrap().limit, 1);
        // Dropped without an answer: released, nothing learned.
        drop(also_held);
        let view = backend.adaptive_view(route.unwrap()).unwrap();
        assert_eq!((view.in_flight, view.limit, view.baseline), (0, 1, None));
        let totals = backend.in_flight_totals();
        assert_eq!((totals.in_flight, totals.limit), (0, 1));
    }

    #[test]
    fn delay_and_permits() {
        let leaky = Limiter::new(
            "leaky",
            Algorithm::LeakyBucket {
                capacity: 2,
                rate: Rate { tokens: 1, per: S },
                mode: LeakyMode::Delay,
            },
            100,
        );
        let conc = Limiter::new("conc", Algorithm::Concurrency { max: 2 }, 100);
        let stack = [entry(&leaky, k("a"), false), entry(&conc, k("a"), false)];
        let mut first = check_stack(&stack, 1, T0);
        let held = first.take_permits();
        assert_eq!((first.delay, held.len()), (0, 1));
        let second = check_stack(&stack, 1, T0);
        assert_eq!(second.delay, S);
        // Two in flight: the third is denied by concurrency, and the leaky
        // bucket is not charged for it.
        let third = check_stack(&stack, 1, T0);
        assert_eq!(third.denied_by, Some(1));
        assert_eq!(third.delay, 0);
        assert_eq!(third.entries[0].verdict.remaining, 1);
        drop(second);
        let fourth = check_stack(&stack, 1, T0);
        assert!(fourth.allowed);
        assert_eq!(fourth.delay, 2 * S);
        drop(held);
    }

    #[test]
    fn wait_holds_all_or_nothing_and_for_the_longest() {
        let waiting = |capacity, tokens, wait| {
            Limiter::new(
                "w",
                Algorithm::TokenBucket {
                    capacity,
                    refill: Rate { tokens, per: S },
                    wait,
                },
                100,
            )
        };
        // 1 token at 1/s with 3 s of wait; 2 at 2/s with 1 s of wait.
        let slow = waiting(1, 1, 3 * S);
        let fast = waiting(2, 2, S);
        let cap = Limiter::new(
            "cap",
            Algorithm::FixedWindow {
                limit: 3,
                window: 60 * S,
            },
            100,
        );
        let key = LimitKey::digest(&[b"a"]);
        let stack = [
            entry(&slow, k("a"), false),
            entry(&fast, k("a"), false),
            entry(&cap, k("a"), false),
        ];
        let delays: Vec<Nanos> = (0..3)
            .map(|_| {
                let d = check_stack(&stack, 1, T0);
                assert!(d.allowed);
                d.delay
            })
            .collect();
        // slow holds 0, 1 s, 2 s; fast 0, 0, 500 ms: the longer wins.
        assert_eq!(delays, [0, S, 2 * S]);
        // The fourth: slow would hold it 3 s (within its wait), fast 1 s,
        // but the window refuses: nothing charged, nothing held.
        let before = (slow.peek(key, T0), fast.peek(key, T0));
        let d = check_stack(&stack, 1, T0);
        assert_eq!((d.allowed, d.denied_by, d.delay), (false, Some(2), 0));
        assert_eq!(d.entries[0].outcome, Outcome::DeniedByOther);
        assert_eq!(
            d.entries[0].verdict.delay, 0,
            "an uncharged entry holds nothing"
        );
        assert_eq!((slow.peek(key, T0), fast.peek(key, T0)), before);
        // A limit past its wait refuses with its own retry: 4 s of debt.
        let alone = [entry(&slow, k("a"), false)];
        let d = check_stack(&alone, 1, T0);
        assert!(d.allowed && d.delay == 3 * S);
        let d = check_stack(&alone, 1, T0);
        assert_eq!(d.denied_by, Some(0));
        assert_eq!(d.entries[0].verdict.retry_after, Some(4 * S));
        // A shadow limit's hold is not the request's.
        let shadow = waiting(1, 1, 3 * S);
        let shadowed = [entry(&shadow, k("b"), true)];
        assert!(check_stack(&shadowed, 1, T0).allowed);
        let d = check_stack(&shadowed, 1, T0);
        assert_eq!((d.allowed, d.delay), (true, 0));
    }
}
