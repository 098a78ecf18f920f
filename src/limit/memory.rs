//! [`Limiter`]: one named limit's per-key state, held in this process's memory.
//!
//! # Storage
//!
//! Keys are spread over [`SHARDS`] shards by the high bits of their digest;
//! each shard is a `parking_lot::Mutex` around a hash table keyed by the
//! digest's low half (used as the table's hash directly: it is already
//! uniformly random, so no second hash is computed; `table.rs` says why 64
//! bits within a shard are enough). There is no
//! global lock: a decision locks only the shard(s) it touches, and the shards
//! are cache-line aligned so that neighbours do not contend through false
//! sharing. A shard lock (rather than one atomic word per key, as governor
//! does) is what lets the key stack (`stack.rs`) decide several limits
//! all-or-nothing: it locks every shard it needs in one global order
//! (limiter address, shard index), decides, commits or rolls back, unlocks.
//!
//! Refill is computed on arrival by the algorithms' pure functions; there is
//! no timer per key.
//!
//! # Memory per key
//!
//! Each shard's keys live in a [`Table`] laid out for the limiter's
//! algorithm (`table.rs` has the figures): a token or leaky bucket's slot is
//! the digest's low half (8 bytes; the shard took the high half's top bits)
//! and its `tat` as an 8-byte offset from the shard's base, 16 bytes plus
//! one control byte. hashbrown keeps at most 7/8 of the slots full and
//! doubles when it fills, so a token-bucket key costs 19 bytes at full load
//! and 39 right after a doubling. A sliding log adds a heap-allocated deque
//! of `(timestamp, units)` runs (16 bytes per run), a concurrency key an
//! `Arc<AtomicU64>` (24 bytes), and an adaptive key its state under a
//! per-key mutex (`adaptive_slot`, 104 bytes).
//!
//! # Bounding the number of keys
//!
//! A flood of one-shot keys (random API keys, spoofed addresses) must not grow
//! memory without bound. Two mechanisms:
//!
//! * [`Limiter::sweep`] drops every key whose state is back to fresh (full
//!   bucket, empty windows, nothing in flight): forgetting such a key changes
//!   no future decision, since an absent key *is* a fresh one. The HTTP layer
//!   runs it periodically (say every 10 s); it locks one shard at a time.
//! * `max_keys`: when a new key would exceed it, its shard is swept first (at
//!   most once a second per shard, so a flood cannot turn every request into a
//!   scan); if the limiter is still full, the key does not get a state of its
//!   own but shares its shard's **overflow state** with every other key beyond
//!   the cap in that shard. Limiting still applies (more strictly: strangers
//!   share a budget) and memory stays bounded at `max_keys` entries plus one
//!   overflow state per shard. `live_keys()` counts the entries (not the
//!   overflow states).
//!
//! # Reload: carrying state over ([`Limiter::carry_from`])
//!
//! A limit whose algorithm kind changed starts fresh. Otherwise:
//!
//! * `fixed_window`, `sliding_window`, `sliding_log`: with the same `window`
//!   the counts/logs are kept as they are and the new `limit` applies to them
//!   (a client that used 60 of 100 has 40 left under 100, 140 under 200, none
//!   under 50 until its units leave the window). A changed `window` starts
//!   fresh: counts aligned to the old windows mean nothing in the new ones.
//! * `token_bucket`: the tokens a key has *used* are kept (re-expressed in the
//!   new refill), capped at the new capacity (plus the debt the new `wait`
//!   allows: a held request's charge stays). A full bucket stays full, a
//!   raised capacity adds its headroom to every key (as a fresh key would
//!   get), a lowered one leaves at most an empty bucket.
//! * `leaky_bucket`: the same, with `capacity + 1` slots: the queued excess is
//!   kept; `mode` may change freely.
//! * `concurrency`: the in-flight slots are shared with the old limiter, so
//!   permits taken before the reload release into the new one; a new `max`
//!   applies at once.
//! * `adaptive`: the same sharing, and each key keeps its learned limit and
//!   baseline, clamped into a changed `min`/`max` (`adaptive::rescale`).
//!
//! A limit whose definition did not change at all should simply keep its
//! `Arc<Limiter>`. Requests decided by the old limiter after the copy are not
//! carried (the window between `carry_from` and the swap is microseconds).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::adaptive_slot::{self, AdaptivePermit};
use super::bucket::Bucket;
use super::concurrency::{self, ConcurrencyPermit};
use super::key::LimitKey;
use super::priority::{self, Priority, Reserve};
use super::queue::{QueueParams, SlotQueue};
use super::reservations::OpenReservations;
use super::table::{Held, KeyState, StateMut, StateRef, StoreKey, Table};
use super::verdict::Verdict;
use super::{Algorithm, NANOS_PER_SEC, Nanos, WindowAlign};
use super::{fixed_window, leaky_bucket, sliding_log, sliding_window, token_bucket};

/// Shards per limiter: a power of two well above the core count, so two
/// requests for different keys rarely meet on one lock.
pub(crate) const SHARDS: usize = 64;

/// A full limiter sweeps a shard at most this often when a new key arrives.
const CAP_SWEEP_INTERVAL: Nanos = NANOS_PER_SEC;

/// One shard's keys.
#[derive(Debug)]
pub(crate) struct ShardMap {
    table: Table,
    /// Shared by the keys of this shard that arrived while the limiter was
    /// at `max_keys` (see the module doc).
    overflow: Option<KeyState>,
    /// When a full limiter last swept this shard.
    swept_at: Nanos,
}

/// Cache-line aligned so neighbouring shards' locks do not share a line.
#[repr(align(128))]
#[derive(Debug)]
struct Shard(Mutex<ShardMap>);

/// Where a charge went, to undo it.
#[derive(Debug)]
pub(crate) enum Target {
    /// An existing entry.
    Key(StoreKey),
    /// An entry this charge created: undo removes it.
    New(StoreKey),
    Overflow,
}

/// What to restore to undo a charge.
#[derive(Debug)]
pub(crate) enum UndoAction {
    Window(fixed_window::State),
    Sliding(sliding_window::State),
    Gcra(token_bucket::State),
    LogPop(u64),
    /// Concurrency: dropping the permit is the undo.
    Nothing,
}

#[derive(Debug)]
pub(crate) struct Undo {
    target: Target,
    action: UndoAction,
}

/// The state change an admitted request makes (computed by the pure decision).
enum Next {
    Window(fixed_window::State),
    Sliding(sliding_window::State),
    Gcra(token_bucket::State),
    LogRecord,
    Acquire,
    AcquireAdaptive,
}

/// A request's hold on one limit that counts requests in flight, released
/// by being dropped.
// Never read: each is held only for what its drop releases (an adaptive
// permit is also told how the upstream answered).
#[allow(dead_code)]
#[derive(Debug)]
pub enum SlotPermit {
    Concurrency(ConcurrencyPermit),
    Adaptive(AdaptivePermit),
}

/// One limit's decision on one request ([`Limiter::check`]).
#[derive(Debug)]
#[must_use]
pub struct Decision {
    pub verdict: Verdict,
    /// Concurrency, adaptive: the slot taken by an admitted request; hold
    /// it until the response body ends.
    pub permit: Option<SlotPermit>,
}

/// [`Limiter::in_flight_totals`]: what the in-flight gauges show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct InFlightTotals {
    /// Requests (cost units) in flight over all keys.
    pub(crate) in_flight: u64,
    /// An adaptive limit's current limits summed over its keys.
    pub(crate) limit: u64,
}

/// One named limit's per-key state. Share it as `Arc<Limiter>`.
#[derive(Debug)]
pub struct Limiter {
    algorithm: Algorithm,
    /// `algorithm`'s numbers when it is a token or leaky bucket, taken out
    /// once rather than on every decision.
    bucket: Option<Bucket>,
    /// Fixed windows only: where each key's boundaries fall.
    align: WindowAlign,
    max_keys: usize,
    /// Entries across all shards (reserved before insert, so never above
    /// `max_keys`).
    live: AtomicUsize,
    shards: Box<[Shard]>,
    /// A token limit's reservations not settled yet (explain).
    pub(crate) open: OpenReservations,
    /// Slot limits: what a sheddable request may not take.
    reserve: Reserve,
    /// Slot limits with a `queue`: its waiting line, woken by the permits.
    queue: Option<Arc<SlotQueue>>,
}

impl Limiter {
    /// A limiter of `algorithm` holding at most `max_keys` keys. `name`, the
    /// limit's, is for the caller's reading only: the limiter keeps no copy
    /// (its metrics and logs are labelled by the snapshot).
    pub fn new(_name: &str, algorithm: Algorithm, max_keys: usize) -> Limiter {
        let shard = || {
            Shard(Mutex::new(ShardMap {
                table: Table::new(&algorithm),
                overflow: None,
                swept_at: 0,
            }))
        };
        Limiter {
            algorithm,
            bucket: Bucket::of(algorithm),
            align: WindowAlign::default(),
            max_keys,
            live: AtomicUsize::new(0),
            shards: (0..SHARDS).map(|_| shard()).collect(),
            open: OpenReservations::default(),
            reserve: Reserve::default(),
            queue: None,
        }
    }

    /// Sets a slot limit's reserve and waiting line (other algorithms
    /// ignore them). Set before the limiter is shared.
    pub(crate) fn with_slots(mut self, reserve: Reserve, queue: Option<QueueParams>) -> Limiter {
        self.reserve = reserve;
        self.queue = queue.map(|params| Arc::new(SlotQueue::new(params)));
        self
    }

    /// A slot limit's waiting line, when it has a `queue`.
    pub(crate) fn queue(&self) -> Option<&Arc<SlotQueue>> {
        self.queue.as_ref()
    }

    /// Sets where a fixed window's boundaries fall per key (other
    /// algorithms ignore it). Set before the limiter is shared.
    pub(crate) fn with_align(mut self, align: WindowAlign) -> Limiter {
        self.align = align;
        self
    }

    /// The clock a key's fixed window runs on: with `reset_jitter`, `now`
    /// moved back by the key's offset in `[0, jitter)`, so the key's
    /// boundaries fall that much later than the epoch-aligned ones. Only a
    /// fixed window reads the key, and its table keeps the whole digest.
    #[inline]
    fn key_now(&self, key: StoreKey, now: Nanos) -> Nanos {
        match (self.algorithm, self.align) {
            (
                Algorithm::FixedWindow { .. },
                WindowAlign::Epoch { jitter } | WindowAlign::Month { jitter },
            ) if jitter > 0 => {
                // The high half: independent of the table hash (low half).
                now.saturating_sub(key.hi % jitter)
            }
            _ => now,
        }
    }

    pub(crate) fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Keys holding their own state (the `tollgate_limiter_keys` gauge).
    pub fn live_keys(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Requests in flight over every key of a `concurrency` or `adaptive`
    /// limit, and an adaptive limit's current limits summed over its keys
    /// (both 0 for the other algorithms), for the scrape-time gauges. Cold
    /// path: one shard locked at a time, as the sweep does.
    pub(crate) fn in_flight_totals(&self) -> InFlightTotals {
        let mut totals = InFlightTotals::default();
        if !matches!(
            self.algorithm,
            Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. }
        ) {
            return totals;
        }
        let mut add = |state: StateRef<'_>| match state {
            StateRef::Inflight(slot) => totals.in_flight += concurrency::in_flight(slot),
            StateRef::Adaptive(slot) => {
                let view = adaptive_slot::view(slot);
                totals.in_flight += u64::from(view.in_flight);
                totals.limit += u64::from(view.limit);
            }
            _ => {}
        };
        for shard in self.shards.iter() {
            let shard = shard.0.lock();
            shard.table.for_each(|_, state| add(state));
            if let Some(state) = &shard.overflow {
                add(state.read());
            }
        }
        totals
    }

    /// An adaptive limit's key as it stands, charging nothing (`None` for
    /// the other algorithms). A key it does not hold is a fresh one: at
    /// `initial`, nothing in flight, nothing learned.
    pub(crate) fn adaptive_view(&self, key: LimitKey) -> Option<adaptive_slot::View> {
        let Algorithm::Adaptive { params } = self.algorithm else {
            return None;
        };
        let shard = self.lock_shard(self.shard_of(key));
        let state = match shard.table.get(StoreKey::from(key)) {
            Some(state) => Some(state),
            None if self.live_keys() >= self.max_keys => {
                shard.overflow.as_ref().map(KeyState::read)
            }
            None => None,
        };
        Some(match state {
            Some(StateRef::Adaptive(slot)) => adaptive_slot::view(slot),
            _ => adaptive_slot::View {
                limit: params.initial(),
                in_flight: 0,
                baseline: None,
                recent: None,
            },
        })
    }

    /// Decide and charge one request against this limit alone. The same
    /// decision as a one-entry [`check_stack`](super::check_stack), returned compactly (no
    /// per-entry array to copy out).
    #[inline]
    pub fn check(&self, key: LimitKey, cost: u64, now: Nanos) -> Decision {
        self.check_as(key, (cost, Priority::Normal), now)
    }

    /// [`Limiter::check`] for a request of `priority` (a slot limit keeps
    /// its reserve from a sheddable one).
    #[inline(always)]
    pub(crate) fn check_as(&self, key: LimitKey, charge: (u64, Priority), now: Nanos) -> Decision {
        let mut permit = None;
        let mut shard = self.lock_shard(self.shard_of(key));
        let verdict = match self.charge_held(&mut shard, key, charge, now, &mut permit) {
            Some(verdict) => verdict,
            None => self.apply(&mut shard, key, charge, now, &mut permit).0,
        };
        drop(shard);
        Decision { verdict, permit }
    }

    /// [`Limiter::apply`] for a key the table holds, keeping no undo (a lone
    /// check never rolls back); `None` for anything else (a new key, the
    /// overflow state, a peek), which `apply` then decides. The same
    /// decision and charge as `apply`'s first step: built without the
    /// `Undo`, the value the closure returns shrinks from about 100 bytes to a
    /// verdict, and its copies were a third of the growth since `5bdeb93`
    /// (callgrind, `benches/limiter.rs`; BENCHMARKS.md "Limiter decisions").
    #[inline(always)]
    fn charge_held(
        &self,
        shard: &mut ShardMap,
        key: LimitKey,
        (cost, priority): (u64, Priority),
        now: Nanos,
        permit: &mut Option<SlotPermit>,
    ) -> Option<Verdict> {
        if cost == 0 {
            return None;
        }
        let k = StoreKey::from(key);
        match shard.table.held(k, now)? {
            Held::Bucket(mut slot) => {
                // A bucket's table (its `key_now` is `now`): the bucket's
                // decision alone, in line, on the key's `tat`.
                let (next, v) = self.bucket?.decide_in_line(slot.get(), now, cost);
                if v.allowed {
                    slot.set(next);
                }
                Some(v)
            }
            Held::Other(state) => {
                let now = self.key_now(k, now);
                Some(self.charge_state(state, (k, now), (cost, priority), permit))
            }
        }
    }

    /// [`Limiter::charge_held`] on a held key of the layouts other than a
    /// bucket's. Out of line, as the closure for every layout was: inlined
    /// into the lone check, it cost these algorithms 9 to 17 instructions a
    /// decision (`bench/limiter_instructions.sh`).
    #[inline(never)]
    fn charge_state(
        &self,
        state: StateMut<'_>,
        (k, now): (StoreKey, Nanos),
        (cost, priority): (u64, Priority),
        permit: &mut Option<SlotPermit>,
    ) -> Verdict {
        let (v, next) = self.decide(Some(state.read()), now, cost, priority);
        if let Some(next) = next {
            // The undo is for a stack's rollback: a lone check has none.
            let _ = self.commit(state, next, (k, now), cost, permit);
        }
        v
    }

    /// The key's state as it stands (`r`, `t`), charging nothing.
    pub fn peek(&self, key: LimitKey, now: Nanos) -> Verdict {
        let shard = self.lock_shard(self.shard_of(key));
        self.peek_in(&shard, key, now)
    }

    /// Post-response cost settlement: charge `delta` more units, or refund
    /// `-delta`; never below empty, never above full. No effect on
    /// concurrency (its permits settle themselves).
    pub(crate) fn adjust(&self, key: LimitKey, delta: i64, now: Nanos) {
        self.adjust_within(key, delta, now, self.algorithm);
    }

    /// [`Limiter::adjust`] where a charge may take the key below empty, by
    /// at most its quota (a token limit's settlement).
    pub(crate) fn adjust_with_debt(&self, key: LimitKey, delta: i64, now: Nanos) {
        self.adjust_within(key, delta, now, self.algorithm.with_debt());
    }

    /// [`Limiter::adjust`] with `ceiling`'s numbers bounding a charge.
    fn adjust_within(&self, key: LimitKey, delta: i64, now: Nanos, ceiling: Algorithm) {
        if delta == 0
            || matches!(
                self.algorithm,
                Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. }
            )
        {
            return;
        }
        let k = StoreKey::from(key);
        let now = self.key_now(k, now);
        let mut shard = self.lock_shard(self.shard_of(key));
        let shard = &mut *shard;
        let adjust = |state: StateMut<'_>| self.adjust_state(state, delta, now, ceiling);
        if shard.table.with(k, now, adjust).is_some() {
            return;
        }
        if delta < 0 {
            // Nothing to refund on a fresh key.
            return;
        }
        if self.reserve(shard, now) {
            let mut state = self.fresh_state(now);
            adjust(state.write());
            shard.table.insert(k, state, now);
        } else {
            let state = shard.overflow.get_or_insert_with(|| self.fresh_state(now));
            adjust(state.write());
        }
    }

    /// Forgets `key`'s state (an operator's reset): its next request starts
    /// as a new key's. Whether the key was held. A key counted in the
    /// shard's overflow (the limiter full) shares that state and keeps it.
    pub(crate) fn forget(&self, key: LimitKey) -> bool {
        let mut shard = self.lock_shard(self.shard_of(key));
        let removed = shard.table.remove(StoreKey::from(key));
        drop(shard);
        if removed {
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// Forget every key whose state is fresh again; returns how many.
    /// Locks one shard at a time (cold path: run it periodically).
    pub fn sweep(&self, now: Nanos) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            removed += self.sweep_shard(&mut shard.0.lock(), now);
        }
        removed
    }

    /// Whether [`Limiter::carry_from`] keeps any state from `old` to `new`.
    pub(crate) fn carries_state(old: &Algorithm, new: &Algorithm) -> bool {
        use Algorithm::*;
        match (old, new) {
            (FixedWindow { window: a, .. }, FixedWindow { window: b, .. })
            | (SlidingWindow { window: a, .. }, SlidingWindow { window: b, .. })
            | (SlidingLog { window: a, .. }, SlidingLog { window: b, .. }) => a == b,
            (TokenBucket { .. }, TokenBucket { .. })
            | (LeakyBucket { .. }, LeakyBucket { .. })
            | (Concurrency { .. }, Concurrency { .. })
            | (Adaptive { .. }, Adaptive { .. }) => true,
            _ => false,
        }
    }

    /// A limiter for a reloaded definition, keeping `old`'s key states where
    /// the algorithm allows (rules in the module doc). Cold path: locks each
    /// of `old`'s shards once.
    pub(crate) fn carry_from(
        old: &Limiter,
        name: &str,
        algorithm: Algorithm,
        max_keys: usize,
        now: Nanos,
    ) -> Limiter {
        let new = Limiter::new(name, algorithm, max_keys);
        if !Limiter::carries_state(&old.algorithm, &algorithm) {
            return new;
        }
        for (from, to) in old.shards.iter().zip(new.shards.iter()) {
            let from = from.0.lock();
            // `new` is not shared yet: this lock is never contended.
            let mut to = to.0.lock();
            let to = &mut *to;
            from.table.for_each(|k, state| {
                if old.is_fresh(state, old.key_now(k, now)) || !new.reserve(to, now) {
                    return;
                }
                let carried = old.carry_state(state, &algorithm, now);
                to.table.insert(k, carried, now);
            });
            to.overflow = from
                .overflow
                .as_ref()
                .map(|s| old.carry_state(s.read(), &algorithm, now));
        }
        new
    }

    /// One key's state moved into `self` from `from` (another limiter of
    /// the same limit: a per-key override installed or removed), carried
    /// over where the algorithms allow as [`Limiter::carry_from`] does; a
    /// state that does not carry leaves the key fresh in `self`. `from`
    /// forgets the key. Cold path: locks one shard of each.
    pub(crate) fn carry_key(&self, from: &Limiter, key: LimitKey, now: Nanos) {
        let k = StoreKey::from(key);
        let carried = {
            let mut shard = from.lock_shard(from.shard_of(key));
            let carried = shard.table.get(k).and_then(|state| {
                let fresh = from.is_fresh(state, from.key_now(k, now));
                (!fresh && Limiter::carries_state(&from.algorithm, &self.algorithm))
                    .then(|| from.carry_state(state, &self.algorithm, now))
            });
            if shard.table.remove(k) {
                from.live.fetch_sub(1, Ordering::Relaxed);
            }
            carried
        };
        let mut shard = self.lock_shard(self.shard_of(key));
        if shard.table.remove(k) {
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(state) = carried
            && self.reserve(&mut shard, now)
        {
            shard.table.insert(k, state, now);
        }
    }

    /// Whether `key` holds its own state here (not the overflow's).
    pub(crate) fn holds(&self, key: LimitKey) -> bool {
        let shard = self.lock_shard(self.shard_of(key));
        shard.table.get(StoreKey::from(key)).is_some()
    }

    // ----- used by the key stack -----

    pub(crate) fn shard_of(&self, key: LimitKey) -> usize {
        // Top bits of the high half: independent of the table's hash (low half).
        (key.halves().0 >> (64 - SHARDS.trailing_zeros())) as usize
    }

    pub(crate) fn lock_shard(&self, index: usize) -> MutexGuard<'_, ShardMap> {
        self.shards[index % SHARDS].0.lock()
    }

    /// Decide `cost` for `key` and, if admitted, charge it (a concurrency
    /// permit goes to `permit`). Returns what to undo, if anything changed.
    #[inline]
    pub(crate) fn apply(
        &self,
        shard: &mut ShardMap,
        key: LimitKey,
        (cost, priority): (u64, Priority),
        now: Nanos,
        permit: &mut Option<SlotPermit>,
    ) -> (Verdict, Option<Undo>) {
        if cost == 0 {
            return (self.peek_in(shard, key, now), None);
        }
        let k = StoreKey::from(key);
        let now = self.key_now(k, now);
        let held = shard.table.with(k, now, |state| {
            let (v, next) = self.decide(Some(state.read()), now, cost, priority);
            match next {
                Some(next) => {
                    let action = self.commit(state, next, (k, now), cost, permit);
                    let target = Target::Key(k);
                    (v, Some(Undo { target, action }))
                }
                None => (v, None),
            }
        });
        if let Some(decided) = held {
            return decided;
        }
        if self.reserve(shard, now) {
            let (v, next) = self.decide(None, now, cost, priority);
            let Some(next) = next else {
                self.live.fetch_sub(1, Ordering::Relaxed);
                return (v, None);
            };
            let mut state = self.fresh_state(now);
            let action = self.commit(state.write(), next, (k, now), cost, permit);
            shard.table.insert(k, state, now);
            let target = Target::New(k);
            return (v, Some(Undo { target, action }));
        }
        let state = shard.overflow.get_or_insert_with(|| self.fresh_state(now));
        let (v, next) = self.decide(Some(state.read()), now, cost, priority);
        match next {
            Some(next) => {
                let action = self.commit(state.write(), next, (k, now), cost, permit);
                let target = Target::Overflow;
                (v, Some(Undo { target, action }))
            }
            None => (v, None),
        }
    }

    /// Reverse a charge made by [`Limiter::apply`] under the same lock.
    pub(crate) fn undo(&self, shard: &mut ShardMap, undo: Undo) {
        let restore = |state: StateMut<'_>| match (undo.action, state) {
            (UndoAction::Window(old), StateMut::Window(s)) => *s = old,
            (UndoAction::Sliding(old), StateMut::Sliding(s)) => *s = old,
            (UndoAction::Gcra(old), StateMut::Gcra(s)) => *s = old,
            (UndoAction::LogPop(n), StateMut::Log(s)) => sliding_log::unrecord(s, n),
            _ => {}
        };
        match undo.target {
            Target::New(k) => {
                if shard.table.remove(k) {
                    self.live.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Target::Key(k) => {
                shard.table.with_held(k, restore);
            }
            Target::Overflow => {
                if let Some(state) = shard.overflow.as_mut() {
                    restore(state.write());
                }
            }
        }
    }

    /// The state of `key` as it stands (cost 0), the way [`Limiter::apply`]
    /// would find it (including the overflow state when at the cap).
    pub(crate) fn peek_in(&self, shard: &ShardMap, key: LimitKey, now: Nanos) -> Verdict {
        let k = StoreKey::from(key);
        let now = self.key_now(k, now);
        let state = match shard.table.get(k) {
            Some(s) => Some(s),
            None if self.live_keys() >= self.max_keys => {
                shard.overflow.as_ref().map(KeyState::read)
            }
            None => None,
        };
        self.decide(state, now, 0, Priority::Normal).0
    }

    // ----- per-algorithm dispatch -----

    /// The pure decision on `state` (`None` = fresh). The `Next` is present
    /// iff the verdict admits a non-zero cost.
    #[inline(always)]
    fn decide(
        &self,
        state: Option<StateRef<'_>>,
        now: Nanos,
        cost: u64,
        priority: Priority,
    ) -> (Verdict, Option<Next>) {
        use Algorithm::*;
        let admitted = |v: &Verdict, next: Next| (v.allowed && cost > 0).then_some(next);
        match self.algorithm {
            FixedWindow { limit, window } => {
                let s = match state {
                    Some(StateRef::Window(s)) => s,
                    _ => Default::default(),
                };
                let (n, v) = match self.align {
                    WindowAlign::FirstRequest => {
                        fixed_window::decide_first(s, now, cost, limit, window)
                    }
                    WindowAlign::Epoch { .. } => fixed_window::decide(s, now, cost, limit, window),
                    WindowAlign::Month { .. } => fixed_window::decide_month(s, now, cost, limit),
                };
                (v, admitted(&v, Next::Window(n)))
            }
            SlidingWindow { limit, window } => {
                let s = match state {
                    Some(StateRef::Sliding(s)) => s,
                    _ => Default::default(),
                };
                let (n, v) = sliding_window::decide(s, now, cost, limit, window);
                (v, admitted(&v, Next::Sliding(n)))
            }
            SlidingLog { limit, window } => {
                let v = match state {
                    Some(StateRef::Log(s)) => sliding_log::check(s, now, cost, limit, window),
                    _ => sliding_log::check(&Default::default(), now, cost, limit, window),
                };
                (v, admitted(&v, Next::LogRecord))
            }
            TokenBucket { .. } | LeakyBucket { .. } => {
                // A bucket's arm: `bucket` is always `Some` here.
                let (n, v) = match self.bucket {
                    Some(bucket) => bucket.decide(gcra_state(state), now, cost),
                    None => Default::default(),
                };
                (v, admitted(&v, Next::Gcra(n)))
            }
            Concurrency { max } => {
                let in_flight = match state {
                    Some(StateRef::Inflight(slot)) => concurrency::in_flight(slot),
                    _ => 0,
                };
                let v = priority::slot_verdict(in_flight, cost, max, self.reserve, priority);
                (v, admitted(&v, Next::Acquire))
            }
            Adaptive { params } => {
                let slot = match state {
                    Some(StateRef::Adaptive(slot)) => Some(slot),
                    _ => None,
                };
                let v = adaptive_slot::decide(slot, params, (cost, priority), self.reserve);
                (v, admitted(&v, Next::AcquireAdaptive))
            }
        }
    }

    /// Apply an admitted decision's state change; returns its undo.
    #[inline(always)]
    fn commit(
        &self,
        state: StateMut<'_>,
        next: Next,
        (key, now): (StoreKey, Nanos),
        cost: u64,
        permit: &mut Option<SlotPermit>,
    ) -> UndoAction {
        let window = match self.algorithm {
            Algorithm::SlidingLog { window, .. } => window,
            _ => 0,
        };
        match (next, state) {
            (Next::Window(n), StateMut::Window(s)) => UndoAction::Window(std::mem::replace(s, n)),
            (Next::Sliding(n), StateMut::Sliding(s)) => {
                UndoAction::Sliding(std::mem::replace(s, n))
            }
            (Next::Gcra(n), StateMut::Gcra(s)) => UndoAction::Gcra(std::mem::replace(s, n)),
            (Next::LogRecord, StateMut::Log(s)) => {
                sliding_log::record(s, now, cost, window);
                UndoAction::LogPop(cost)
            }
            (Next::Acquire, StateMut::Inflight(slot)) => {
                let mut taken = ConcurrencyPermit::acquire(slot, cost);
                if let Some(queue) = &self.queue {
                    taken.wake_on_release(queue, key.lo);
                }
                *permit = Some(SlotPermit::Concurrency(taken));
                UndoAction::Nothing
            }
            (Next::AcquireAdaptive, StateMut::Adaptive(slot)) => {
                // At most `max` ≤ adaptive::MAX_LIMIT: the decision admitted it.
                let units = u32::try_from(cost).unwrap_or(u32::MAX);
                let mut taken = AdaptivePermit::acquire(slot, units, now);
                if let Some(queue) = &self.queue {
                    taken.wake_on_release(queue, key.lo);
                }
                *permit = Some(SlotPermit::Adaptive(taken));
                UndoAction::Nothing
            }
            _ => {
                // Each table holds its algorithm's layout only, and the
                // overflow state is built by `fresh_state`: unreachable.
                debug_assert!(false, "key state does not match the algorithm");
                UndoAction::Nothing
            }
        }
    }

    fn fresh_state(&self, now: Nanos) -> KeyState {
        use Algorithm::*;
        match self.algorithm {
            FixedWindow { .. } => KeyState::Window(Default::default()),
            SlidingWindow { .. } => KeyState::Sliding(Default::default()),
            SlidingLog { .. } => KeyState::Log(Default::default()),
            TokenBucket { .. } | LeakyBucket { .. } => KeyState::Gcra(Default::default()),
            Concurrency { .. } => KeyState::Inflight(Arc::default()),
            Adaptive { params } => KeyState::Adaptive(adaptive_slot::fresh(params, now)),
        }
    }

    fn is_fresh(&self, state: StateRef<'_>, now: Nanos) -> bool {
        use Algorithm::*;
        match (self.algorithm, state) {
            (FixedWindow { window, .. }, StateRef::Window(s)) => match self.align {
                WindowAlign::FirstRequest => fixed_window::is_fresh_first(s, now, window),
                WindowAlign::Epoch { .. } => fixed_window::is_fresh(s, now, window),
                WindowAlign::Month { .. } => fixed_window::is_fresh_month(s, now),
            },
            (SlidingWindow { window, .. }, StateRef::Sliding(s)) => {
                sliding_window::is_fresh(s, now, window)
            }
            (SlidingLog { window, .. }, StateRef::Log(s)) => sliding_log::is_fresh(s, now, window),
            (TokenBucket { refill: rate, .. } | LeakyBucket { rate, .. }, StateRef::Gcra(s)) => {
                token_bucket::is_fresh(s, now, rate)
            }
            (Concurrency { .. }, StateRef::Inflight(slot)) => concurrency::is_fresh(slot),
            (Adaptive { .. }, StateRef::Adaptive(slot)) => adaptive_slot::is_fresh(slot),
            _ => true,
        }
    }

    fn adjust_state(&self, state: StateMut<'_>, delta: i64, now: Nanos, ceiling: Algorithm) {
        use Algorithm::*;
        match (ceiling, state) {
            (FixedWindow { limit, window }, StateMut::Window(s)) => {
                *s = match self.align {
                    WindowAlign::FirstRequest => {
                        fixed_window::adjust_first(*s, now, delta, limit, window)
                    }
                    WindowAlign::Epoch { .. } => {
                        fixed_window::adjust(*s, now, delta, limit, window)
                    }
                    WindowAlign::Month { .. } => fixed_window::adjust_month(*s, now, delta, limit),
                }
            }
            (SlidingWindow { limit, window }, StateMut::Sliding(s)) => {
                *s = sliding_window::adjust(*s, now, delta, limit, window)
            }
            (SlidingLog { limit, window }, StateMut::Log(s)) => {
                sliding_log::adjust(s, now, delta, limit, window)
            }
            (
                TokenBucket {
                    capacity, refill, ..
                },
                StateMut::Gcra(s),
            ) => *s = token_bucket::adjust(*s, now, delta, capacity, refill),
            (LeakyBucket { capacity, rate, .. }, StateMut::Gcra(s)) => {
                *s = leaky_bucket::adjust(*s, now, delta, capacity, rate)
            }
            _ => {}
        }
    }

    /// `state` (of `self`'s algorithm) re-expressed for `new`; the caller has
    /// checked [`Limiter::carries_state`].
    fn carry_state(&self, state: StateRef<'_>, new: &Algorithm, now: Nanos) -> KeyState {
        use Algorithm::*;
        match (self.algorithm, new, state) {
            (
                TokenBucket { refill: old, .. },
                TokenBucket {
                    capacity,
                    refill,
                    wait,
                },
                StateRef::Gcra(s),
            ) => KeyState::Gcra(token_bucket::rescale(
                s, now, old, *capacity, *wait, *refill,
            )),
            (
                LeakyBucket { rate: old, .. },
                LeakyBucket { capacity, rate, .. },
                StateRef::Gcra(s),
            ) => {
                let slots = capacity.saturating_add(1);
                KeyState::Gcra(token_bucket::rescale(s, now, old, slots, 0, *rate))
            }
            (_, _, StateRef::Window(s)) => KeyState::Window(s),
            (_, _, StateRef::Sliding(s)) => KeyState::Sliding(s),
            (_, _, StateRef::Log(s)) => KeyState::Log(Box::new(s.clone())),
            (_, _, StateRef::Gcra(s)) => KeyState::Gcra(s),
            (_, _, StateRef::Inflight(slot)) => KeyState::Inflight(Arc::clone(slot)),
            (_, Adaptive { params }, StateRef::Adaptive(slot)) => {
                KeyState::Adaptive(adaptive_slot::carry(slot, *params))
            }
            // `carries_state` keeps an adaptive state for an adaptive limit only.
            (_, _, StateRef::Adaptive(slot)) => KeyState::Adaptive(Arc::clone(slot)),
        }
    }

    /// Reserve room for one more entry; at the cap, sweep this shard (at
    /// most once per `CAP_SWEEP_INTERVAL`) and try once more.
    fn reserve(&self, shard: &mut ShardMap, now: Nanos) -> bool {
        let try_reserve = || {
            if self.live.fetch_add(1, Ordering::Relaxed) < self.max_keys {
                true
            } else {
                self.live.fetch_sub(1, Ordering::Relaxed);
                false
            }
        };
        if try_reserve() {
            return true;
        }
        if now.abs_diff(shard.swept_at) < CAP_SWEEP_INTERVAL {
            return false;
        }
        shard.swept_at = now;
        self.sweep_shard(shard, now) > 0 && try_reserve()
    }

    fn sweep_shard(&self, shard: &mut ShardMap, now: Nanos) -> usize {
        let before = shard.table.len();
        shard
            .table
            .retain(|k, s| !self.is_fresh(s, self.key_now(k, now)));
        let removed = before - shard.table.len();
        self.live.fetch_sub(removed, Ordering::Relaxed);
        if shard
            .overflow
            .as_ref()
            .is_some_and(|s| self.is_fresh(s.read(), now))
        {
            shard.overflow = None;
        }
        removed
    }
}

fn gcra_state(state: Option<StateRef<'_>>) -> token_bucket::State {
    match state {
        Some(StateRef::Gcra(s)) => s,
        _ => Default::default(),
    }
}

impl From<LimitKey> for StoreKey {
    fn from(key: LimitKey) -> StoreKey {
        let (hi, lo) = key.halves();
        StoreKey { hi, lo }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{LeakyMode, Rate};

    const S: Nanos = NANOS_PER_SEC;
    const T0: Nanos = 1_700_000_000 * S;

    fn key(i: u64) -> LimitKey {
        LimitKey::digest(&[&i.to_le_bytes()])
    }

    fn bucket(capacity: u64, per_sec: u64) -> Algorithm {
        Algorithm::TokenBucket {
            capacity,
            refill: Rate {
                tokens: per_sec,
                per: S,
            },
            wait: 0,
        }
    }

    #[test]
    fn token_bucket_slot_is_16_bytes() {
        // The module doc's figure: an 8-byte key and an 8-byte tat (+1 ctrl).
        let limiter = Limiter::new("t", bucket(10, 10), 10);
        assert_eq!(limiter.shards[0].0.lock().table.slot_bytes(), 16);
    }

    #[test]
    fn a_key_is_its_shard_and_low_half() {
        // table.rs: within a shard only the digest's low half is kept. Two
        // digests that agree on the shard bits and the low half share one
        // state (stricter, never looser); another shard is another key.
        let l = Limiter::new("t", bucket(1, 1), 100);
        let a = LimitKey::from_u128((0xA5u128 << 120) | (1 << 64) | 42);
        let b = LimitKey::from_u128((0xA5u128 << 120) | (2 << 64) | 42);
        let c = LimitKey::from_u128((0x15u128 << 120) | (1 << 64) | 42);
        assert_eq!(l.shard_of(a), l.shard_of(b));
        assert_ne!(l.shard_of(a), l.shard_of(c));
        assert!(l.check(a, 1, T0).verdict.allowed);
        assert!(!l.check(b, 1, T0).verdict.allowed, "one state for a and b");
        assert!(l.check(c, 1, T0).verdict.allowed);
        assert_eq!(l.live_keys(), 2);
    }

    #[test]
    fn sweep_forgets_fresh_keys_only() {
        let l = Limiter::new("t", bucket(10, 10), 1000);
        for i in 0..100 {
            assert!(l.check(key(i), 1, T0).verdict.allowed);
        }
        assert!(l.check(key(0), 5, T0).verdict.allowed);
        assert_eq!(l.live_keys(), 100);
        // 100 ms later one token is back: the one-shot keys are full again.
        assert_eq!(l.sweep(T0 + S / 10), 99);
        assert_eq!(l.live_keys(), 1);
        assert_eq!(l.peek(key(0), T0 + S / 10).remaining, 5);
    }

    #[test]
    fn keys_beyond_the_cap_share_an_overflow_state() {
        let l = Limiter::new("t", bucket(3, 1), 10);
        for i in 0..10 {
            assert!(l.check(key(i), 1, T0).verdict.allowed);
        }
        assert_eq!(l.live_keys(), 10);
        // Nothing is fresh: new keys go to their shard's overflow state, and
        // still get limited.
        let mut passed = 0;
        for _ in 0..5 {
            passed += u64::from(l.check(key(999), 1, T0).verdict.allowed);
        }
        assert_eq!(passed, 3);
        assert_eq!(l.live_keys(), 10, "memory stays bounded");
        // A second later, the full limiter sweeps a shard for the new key.
        let later = T0 + 10 * S;
        assert!(l.check(key(1000), 1, later).verdict.allowed);
        assert!(l.live_keys() <= 10);
    }

    #[test]
    fn adjust_charges_and_refunds_within_bounds() {
        let l = Limiter::new("t", bucket(10, 1), 100);
        assert!(l.check(key(1), 2, T0).verdict.allowed);
        l.adjust(key(1), 5, T0);
        assert_eq!(l.peek(key(1), T0).remaining, 3);
        l.adjust(key(1), 50, T0);
        assert_eq!(l.peek(key(1), T0).remaining, 0);
        l.adjust(key(1), -50, T0);
        assert_eq!(l.peek(key(1), T0).remaining, 10);
        l.adjust(key(2), -5, T0);
        assert_eq!(l.live_keys(), 1, "a refund to a fresh key stores nothing");
    }

    #[test]
    fn reset_jitter_spreads_window_boundaries_per_key() {
        let day = 86_400 * S;
        let limiter = Limiter::new(
            "daily",
            Algorithm::FixedWindow {
                limit: 1,
                window: day,
            },
            100,
        )
        .with_align(WindowAlign::Epoch { jitter: 3_600 * S });
        let midnight = 19_000 * day;
        let resets: Vec<Nanos> = (0..20u32)
            .map(|i| {
                let key = LimitKey::digest(&[&i.to_le_bytes()]);
                let v = limiter.check(key, 1, midnight + 7_200 * S).verdict;
                assert!(v.allowed);
                // Each key's window ends between 00:00 and 01:00 the next day.
                let end = midnight + 7_200 * S + v.reset_after;
                assert!(
                    end > midnight + day && end <= midnight + day + 3_600 * S,
                    "{end}"
                );
                end
            })
            .collect();
        let distinct: std::collections::HashSet<_> = resets.iter().collect();
        assert!(
            distinct.len() > 15,
            "keys should not reset together: {resets:?}"
        );
        // A key's own boundary holds: denied until it, admitted after.
        let key = LimitKey::digest(&[&0u32.to_le_bytes()]);
        let end = resets[0];
        assert!(!limiter.check(key, 1, end - 1).verdict.allowed);
        assert!(limiter.check(key, 1, end).verdict.allowed);
    }

    #[test]
    fn one_key_moves_between_limiters() {
        let base = Limiter::new("t", bucket(10, 1), 100);
        assert!(base.check(key(1), 4, T0).verdict.allowed);
        assert!(base.check(key(2), 1, T0).verdict.allowed);
        let own = Limiter::new("t", bucket(20, 1), 100);
        own.carry_key(&base, key(1), T0);
        assert_eq!(own.peek(key(1), T0).remaining, 16);
        assert!(!base.holds(key(1)) && base.holds(key(2)));
        assert_eq!((base.live_keys(), own.live_keys()), (1, 1));
        // And back; a window of another length starts afresh.
        base.carry_key(&own, key(1), T0);
        assert_eq!(base.peek(key(1), T0).remaining, 6);
        assert_eq!(own.live_keys(), 0);
        let w = |window| Algorithm::FixedWindow { limit: 10, window };
        let (short, long) = (
            Limiter::new("w", w(S), 100),
            Limiter::new("w", w(2 * S), 100),
        );
        assert!(short.check(key(1), 3, T0).verdict.allowed);
        long.carry_key(&short, key(1), T0);
        assert_eq!(long.peek(key(1), T0).remaining, 10);
        assert_eq!((short.live_keys(), long.live_keys()), (0, 0));
    }

    #[test]
    fn held_buckets_decide_as_their_algorithm_across_rebases() {
        // `check` on a held key of a bucket's table takes its own path
        // (`Table::held`): the same verdicts as the pure decisions on
        // a `tat` kept here, for every bucket (compact and wide), with
        // `now` jumping past a compact table's horizon (its base moves
        // forward) and stepping behind its base (it moves back).
        let rate = Rate {
            tokens: 600_000,
            per: S,
        };
        // 100,000/s, but as 10^8 tokens a rate too fine to be compact:
        // the wide `tat`.
        let wide = Algorithm::TokenBucket {
            capacity: 50,
            refill: Rate {
                tokens: 100_000_000,
                per: 1_000 * S,
            },
            wait: 0,
        };
        let buckets = [
            bucket(50, 600_000),
            wide,
            Algorithm::TokenBucket {
                capacity: 50,
                refill: rate,
                wait: 20_000,
            },
            Algorithm::LeakyBucket {
                capacity: 50,
                rate,
                mode: LeakyMode::Reject,
            },
            Algorithm::LeakyBucket {
                capacity: 50,
                rate,
                mode: LeakyMode::Delay,
            },
        ];
        for algorithm in buckets {
            let limiter = Limiter::new("t", algorithm, 100);
            let shard_base = |k: LimitKey| match &limiter.lock_shard(limiter.shard_of(k)).table {
                Table::Gcra(t) => Some(t.base()),
                Table::GcraWide(_) => None,
                other => panic!("not a bucket's: {other:?}"),
            };
            let compact = shard_base(key(0)).is_some();
            let keys: Vec<LimitKey> = (0..3).map(key).collect();
            let mut tats = [token_bucket::State::default(); 3];
            let (mut now, mut moves, mut allowed, mut denied) = (T0, 0, 0, 0);
            for step in 0..3_000u64 {
                now = match step % 101 {
                    0 => now + 180 * 60 * S,
                    50 => now - 90 * 60 * S,
                    _ => now + step % 7 * 100,
                };
                let i = (step % 3) as usize;
                let cost = 1 + step % 4;
                let before = shard_base(keys[i]);
                let got = limiter.check(keys[i], cost, now).verdict;
                moves += u32::from(shard_base(keys[i]) != before);
                let (next, want) = Bucket::of(algorithm)
                    .expect("a bucket")
                    .decide(tats[i], now, cost);
                let want_alone = match algorithm {
                    Algorithm::TokenBucket {
                        capacity,
                        refill,
                        wait,
                    } => token_bucket::decide_waiting(tats[i], now, cost, capacity, refill, wait).1,
                    Algorithm::LeakyBucket {
                        capacity,
                        rate,
                        mode,
                    } => leaky_bucket::decide(tats[i], now, cost, capacity, rate, mode).1,
                    _ => unreachable!(),
                };
                assert_eq!(want, want_alone, "{algorithm:?} step {step}");
                assert_eq!(got, want, "{algorithm:?} step {step}");
                if want.allowed {
                    tats[i] = next;
                    allowed += 1;
                } else {
                    denied += 1;
                }
            }
            assert_eq!(compact, algorithm != wide);
            assert!(
                !compact || moves >= 40,
                "{algorithm:?}: the base moved {moves} times"
            );
            assert!(allowed > 100 && denied > 100, "{allowed} / {denied}");
        }
    }

    #[test]
    fn carry_over_rules() {
        // Token bucket: used tokens are kept, capacity raised.
        let old = Limiter::new("t", bucket(10, 1), 100);
        assert!(old.check(key(1), 4, T0).verdict.allowed);
        let new = Limiter::carry_from(&old, "t", bucket(20, 1), 100, T0);
        assert_eq!(new.peek(key(1), T0).remaining, 16);
        // Window changed: fresh.
        let w = |window| Algorithm::SlidingWindow { limit: 10, window };
        let old = Limiter::new("w", w(S), 100);
        assert!(old.check(key(1), 4, T0).verdict.allowed);
        let same = Limiter::carry_from(
            &old,
            "w",
            Algorithm::SlidingWindow {
                limit: 20,
                window: S,
            },
            100,
            T0,
        );
        assert_eq!(same.peek(key(1), T0).remaining, 16);
        let fresh = Limiter::carry_from(&old, "w", w(2 * S), 100, T0);
        assert_eq!(fresh.live_keys(), 0);
        // Kind changed: fresh.
        let fresh = Limiter::carry_from(&old, "w", bucket(10, 1), 100, T0);
        assert_eq!(fresh.live_keys(), 0);
        // Concurrency: a permit taken before the reload releases into the new one.
        let old = Limiter::new("c", Algorithm::Concurrency { max: 1 }, 100);
        let permits = old.check(key(1), 1, T0).permit;
        let new = Limiter::carry_from(&old, "c", Algorithm::Concurrency { max: 1 }, 100, T0);
        assert!(!new.check(key(1), 1, T0).verdict.allowed);
        drop(permits);
        assert!(new.check(key(1), 1, T0).verdict.allowed);
        // Adaptive: permits shared, the learned limit kept and clamped.
        let adaptive = |min, max, initial| Algorithm::Adaptive {
            params: crate::limit::adaptive::Params::new(min, max, initial).unwrap(),
        };
        let old = Limiter::new("a", adaptive(1, 100, 20), 100);
        let permit = old.check(key(1), 1, T0).permit;
        let new = Limiter::carry_from(&old, "a", adaptive(1, 10, 5), 100, T0);
        let view = new.adaptive_view(key(1)).unwrap();
        assert_eq!((view.limit, view.in_flight), (10, 1));
        drop(permit);
        assert_eq!(new.adaptive_view(key(1)).unwrap().in_flight, 0);
        assert_eq!(new.adaptive_view(key(2)).unwrap().limit, 5, "a fresh key");
        assert_eq!(new.sweep(T0), 0, "learned 10, not its initial 5: kept");
        let fresh = Limiter::carry_from(&new, "a", Algorithm::Concurrency { max: 3 }, 100, T0);
        assert_eq!(fresh.live_keys(), 0);
        // Leaky: excess kept, mode may change.
        let leaky = |mode| Algorithm::LeakyBucket {
            capacity: 2,
            rate: Rate { tokens: 1, per: S },
            mode,
        };
        let old = Limiter::new("l", leaky(LeakyMode::Reject), 100);
        assert!(old.check(key(1), 3, T0).verdict.allowed);
        let new = Limiter::carry_from(&old, "l", leaky(LeakyMode::Delay), 100, T0);
        assert!(!new.check(key(1), 1, T0).verdict.allowed);
    }
}
