//! [`Table`]: one shard's keys and their states, laid out per algorithm, so
//! that a key costs its own algorithm's bytes and no other's.
//!
//! # Layouts
//!
//! Each table is a hashbrown [`HashTable`] of `(key, state)` slots plus one
//! control byte per slot. The table keeps at most 7/8 of its slots full and
//! doubles when it fills, so a key costs `(slot + 1) × 8/7` bytes at full
//! load and twice that right after a doubling (the shards of a limiter fill
//! at the same pace, so they double together: bytes per key is a sawtooth
//! over the key count, between those two figures).
//!
//! | algorithm | key | state | slot | per key |
//! | --- | --- | --- | ---: | ---: |
//! | `token_bucket`, `leaky_bucket` | 8 | `tat`, 8 (compact) | 16 | 19–39 B |
//! | the same, numbers too large to be compact | 8 | `tat`, 16 | 24 | 29–57 B |
//! | `sliding_window` | 8 | window + two counts, 16 | 24 | 29–57 B |
//! | `fixed_window` | 16 | window + count, 16 | 32 | 38–75 B |
//! | `sliding_log` | 8 | a boxed deque, 8 (+ 48 + 16 per run on the heap) | 16 | 19–39 B + heap |
//! | `concurrency` | 8 | an `Arc<AtomicU64>`, 8 (+ 24 on the heap) | 16 | 19–39 B + 24 |
//! | `adaptive` | 8 | an `Arc<Mutex<…>>`, 8 (+ 104 on the heap) | 16 | 19–39 B + 104 |
//!
//! A table of 32 KiB or more (a shard past ~1,800 token-bucket keys) is
//! mapped from the OS and unmapped when freed ([`TableAlloc`]). When a table
//! doubles, hashbrown frees the old half; mimalloc, the gateway's allocator,
//! kept such blocks for later, so a gateway's RSS grew by the tables plus
//! their previous generation (measured: 15–25 % above the tables). Mapped,
//! the old half goes back to the OS as the new one is filled.
//!
//! # The 64-bit key
//!
//! A shard holds the digest's low half only: its high half's top bits chose
//! the shard (`memory.rs`: 64 shards, 6 bits), so a key is
//! told apart from the others by 70 of the digest's 128 bits. Two clients
//! whose digests agree on those 70 bits share one state: the chance of any
//! such pair among `n` live keys of a limit is about `n² / 2^71`, 4 × 10⁻¹⁰
//! at 1,000,000 keys (1 × 10⁻⁵ at 100,000,000). A shared state only ever
//! limits more strictly (two clients on one budget); it cannot give a client
//! more than its limit, so a collision is not a way around it. Aiming one at
//! a chosen victim means finding a digest that agrees with the victim's on
//! 70 bits, for a key whose digest the attacker can compute (its value is
//! known): about 2^69 xxh3 evaluations, for the power to share that
//! victim's budget. Fixed windows keep the whole digest: with
//! `reset_jitter`, a key's window offset is its high half modulo the jitter,
//! the same offset the Redis store uses, and the sweep must recompute it.
//!
//! # The compact `tat`
//!
//! GCRA's `tat` is in scaled nanoseconds (ns × `refill.tokens`, so that
//! every refill interval is a whole number, see `token_bucket`): a `u128`.
//! Only its distance from `now` carries information (a `tat` in the past is
//! a full bucket, however far back), and that distance is at most twice the
//! burst (a settlement's debt included). So a compact table keeps each `tat`
//! as a `u64` offset from the shard's `base` (0: a full bucket), exact, and
//! moves `base` forward when `now` runs [`REBASE_AT`] scaled ns past it:
//! every offset is lowered by the same amount (a `tat` that falls at or
//! behind the new base becomes 0, which decides the same: the bucket is full
//! at any `now` past the base). A `now` behind the base (another clock) moves
//! it back the same way. Rebasing walks the shard once, under the lock the
//! decision already holds, at most once a minute of `now` (the numbers that
//! are compact are chosen so: once in 48 years for `"10/s"`, once an hour
//! for `"1000000/s"`); no allocation, and the sweep walks every shard every
//! 10 s anyway. Numbers whose
//! burst or `refill.tokens` are too large for that keep the 16-byte `tat`.

use std::alloc::Layout;
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global};
use hashbrown::HashTable;

use super::adaptive_slot;
use super::concurrency::Slot;
use super::{Algorithm, Nanos};
use super::{fixed_window, sliding_log, sliding_window, token_bucket};

/// A compact table moves its base once `now` is this far past it (scaled ns).
const REBASE_AT: u128 = 1 << 62;

/// Where a rebase puts the base: this far behind `now` (scaled ns), so that
/// a slightly earlier `now` from another thread stays past it.
const REBASE_MARGIN: u128 = 1 << 60;

/// The farthest a compact `tat` may run ahead of `now` (scaled ns): with
/// [`REBASE_AT`], every offset stays below 2^63.
const AHEAD_MAX: u128 = 1 << 62;

/// Nanoseconds in a minute: compact numbers rebase at most once a minute.
const MINUTE: u128 = 60_000_000_000;

/// The largest `refill.tokens` kept compact (57 million): `(REBASE_AT −
/// REBASE_MARGIN) / tokens`, the `now` between two rebases, is then at least
/// a minute. A rebase walks one shard, as the sweep (every 10 s) does.
const COMPACT_TOKENS: u128 = (REBASE_AT - REBASE_MARGIN) / MINUTE;

/// A full digest. 8-byte aligned (a `u128` would force 16-byte alignment on
/// every slot).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct StoreKey {
    pub(crate) hi: u64,
    pub(crate) lo: u64,
}

/// One key's state, owned: a new key's before it is stored, a shard's
/// overflow state, a state carried to a new limiter.
#[derive(Debug)]
pub(crate) enum KeyState {
    Window(fixed_window::State),
    Sliding(sliding_window::State),
    Log(Box<sliding_log::State>),
    /// Token and leaky bucket.
    Gcra(token_bucket::State),
    Inflight(Slot),
    Adaptive(adaptive_slot::Slot),
}

/// A state to read: the small ones copied, the others borrowed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum StateRef<'a> {
    Window(fixed_window::State),
    Sliding(sliding_window::State),
    Log(&'a sliding_log::State),
    Gcra(token_bucket::State),
    Inflight(&'a Slot),
    Adaptive(&'a adaptive_slot::Slot),
}

/// A state to change in place (a compact `tat` is a copy written back after).
#[derive(Debug)]
pub(crate) enum StateMut<'a> {
    Window(&'a mut fixed_window::State),
    Sliding(&'a mut sliding_window::State),
    Log(&'a mut sliding_log::State),
    Gcra(&'a mut token_bucket::State),
    Inflight(&'a Slot),
    Adaptive(&'a adaptive_slot::Slot),
}

impl KeyState {
    pub(crate) fn read(&self) -> StateRef<'_> {
        match self {
            KeyState::Window(s) => StateRef::Window(*s),
            KeyState::Sliding(s) => StateRef::Sliding(*s),
            KeyState::Log(s) => StateRef::Log(s),
            KeyState::Gcra(s) => StateRef::Gcra(*s),
            KeyState::Inflight(slot) => StateRef::Inflight(slot),
            KeyState::Adaptive(slot) => StateRef::Adaptive(slot),
        }
    }

    pub(crate) fn write(&mut self) -> StateMut<'_> {
        match self {
            KeyState::Window(s) => StateMut::Window(s),
            KeyState::Sliding(s) => StateMut::Sliding(s),
            KeyState::Log(s) => StateMut::Log(s),
            KeyState::Gcra(s) => StateMut::Gcra(s),
            KeyState::Inflight(slot) => StateMut::Inflight(slot),
            KeyState::Adaptive(slot) => StateMut::Adaptive(slot),
        }
    }
}

impl StateMut<'_> {
    pub(crate) fn read(&self) -> StateRef<'_> {
        match self {
            StateMut::Window(s) => StateRef::Window(**s),
            StateMut::Sliding(s) => StateRef::Sliding(**s),
            StateMut::Log(s) => StateRef::Log(s),
            StateMut::Gcra(s) => StateRef::Gcra(**s),
            StateMut::Inflight(slot) => StateRef::Inflight(slot),
            StateMut::Adaptive(slot) => StateRef::Adaptive(slot),
        }
    }
}

/// What a table keeps of a digest.
pub(crate) trait SlotKey: Copy + Eq {
    fn of(key: StoreKey) -> Self;
    /// The table's hash: the low half, already uniform.
    fn hash(self) -> u64;
    /// The digest as far as it is kept (`hi` is 0 when it is not).
    fn full(self) -> StoreKey;
}

impl SlotKey for u64 {
    #[inline(always)]
    fn of(key: StoreKey) -> u64 {
        key.lo
    }
    #[inline(always)]
    fn hash(self) -> u64 {
        self
    }
    fn full(self) -> StoreKey {
        StoreKey { hi: 0, lo: self }
    }
}

impl SlotKey for StoreKey {
    #[inline(always)]
    fn of(key: StoreKey) -> StoreKey {
        key
    }
    #[inline(always)]
    fn hash(self) -> u64 {
        self.lo
    }
    fn full(self) -> StoreKey {
        self
    }
}

/// Tables of at least this many bytes are mapped from the OS.
const MAPPED: usize = 32 * 1024;

/// The tables' allocator: small tables from the global allocator, tables of
/// [`MAPPED`] bytes and more mapped from the OS (`mmap`) and unmapped when
/// freed (see the module doc: a doubled table's old half goes back at once).
/// Tables grow only when a new key is inserted: never on a decision for a
/// key the table holds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TableAlloc;

// SAFETY: every block is either the global allocator's (below `MAPPED`,
// freed there) or a private anonymous mapping of exactly `layout.size()`
// bytes (at or above it, unmapped with that size); a mapping is page
// aligned, which covers any alignment a table asks for (at most 16, its
// control group's).
unsafe impl Allocator for TableAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() < MAPPED || layout.align() > 4096 || cfg!(not(unix)) {
            return Global.allocate(layout);
        }
        map(layout.size())
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() < MAPPED || layout.align() > 4096 || cfg!(not(unix)) {
            // SAFETY: allocated by `Global` with this layout (above).
            unsafe { Global.deallocate(ptr, layout) };
            return;
        }
        unmap(ptr, layout.size());
    }
}

#[cfg(unix)]
fn map(size: usize) -> Result<NonNull<[u8]>, AllocError> {
    // SAFETY: a new private anonymous mapping; no existing memory is named.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(AllocError);
    }
    let p = NonNull::new(p.cast::<u8>()).ok_or(AllocError)?;
    Ok(NonNull::slice_from_raw_parts(p, size))
}

#[cfg(unix)]
fn unmap(ptr: NonNull<u8>, size: usize) {
    // SAFETY: `ptr` is a mapping of `size` bytes made by `map`, no longer used.
    unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
}

#[cfg(not(unix))]
fn map(_: usize) -> Result<NonNull<[u8]>, AllocError> {
    Err(AllocError)
}

#[cfg(not(unix))]
fn unmap(_: NonNull<u8>, _: usize) {}

/// A hash table of `(key, state)` slots.
#[derive(Debug)]
pub(crate) struct Keyed<K, S>(HashTable<(K, S), TableAlloc>);

impl<K: SlotKey, S> Keyed<K, S> {
    fn new() -> Self {
        Keyed(HashTable::new_in(TableAlloc))
    }

    #[inline(always)]
    fn get(&self, key: StoreKey) -> Option<&S> {
        let k = K::of(key);
        self.0.find(k.hash(), |e| e.0 == k).map(|e| &e.1)
    }

    #[inline(always)]
    fn get_mut(&mut self, key: StoreKey) -> Option<&mut S> {
        let k = K::of(key);
        self.0.find_mut(k.hash(), |e| e.0 == k).map(|e| &mut e.1)
    }

    /// Stores `state` for `key`, which the caller found absent.
    fn insert(&mut self, key: StoreKey, state: S) {
        let k = K::of(key);
        self.0.insert_unique(k.hash(), (k, state), |e| e.0.hash());
    }

    fn remove(&mut self, key: StoreKey) -> bool {
        let k = K::of(key);
        match self.0.find_entry(k.hash(), |e| e.0 == k) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }
}

/// Token and leaky buckets with compact `tat`s (see the module doc).
#[derive(Debug)]
pub(crate) struct Compact {
    /// `tat − base × tokens` per key, 0 for a full bucket.
    slots: Keyed<u64, u64>,
    /// The origin of the offsets, in ns.
    base: Nanos,
    /// `base × tokens`, kept rather than multiplied out on every decision.
    base_scaled: u128,
    /// How far past `base` a `now` may run before it moves the base (ns):
    /// one unsigned difference tells both a `now` behind the base (it wraps
    /// above) and one past the horizon.
    span: Nanos,
    /// The rate's `tokens`: offsets are in ns × `tokens`.
    tokens: u64,
}

impl Compact {
    fn new(tokens: u64) -> Compact {
        let mut table = Compact {
            slots: Keyed::new(),
            base: 0,
            base_scaled: 0,
            span: 0,
            tokens,
        };
        table.move_base(0);
        table
    }

    /// Puts the base at `base`, and the horizon (the first `now` past it
    /// that moves it again) `REBASE_AT` scaled ns on.
    fn move_base(&mut self, base: Nanos) {
        let span = REBASE_AT / u128::from(self.tokens);
        let until = u64::try_from(u128::from(base) + span).unwrap_or(Nanos::MAX);
        self.base = base;
        self.base_scaled = u128::from(base) * u128::from(self.tokens);
        self.span = until - base;
    }

    /// The first `now` past `base` that moves it.
    #[cfg(test)]
    fn until(&self) -> Nanos {
        self.base + self.span
    }

    /// The origin of the offsets (ns), for tests that must see it move.
    #[cfg(test)]
    pub(crate) fn base(&self) -> Nanos {
        self.base
    }

    #[inline(always)]
    fn base_scaled(&self) -> u128 {
        self.base_scaled
    }

    #[inline(always)]
    fn load(rel: u64, base: u128) -> token_bucket::State {
        if rel == 0 {
            token_bucket::State::default()
        } else {
            token_bucket::State::at(base + u128::from(rel))
        }
    }

    #[inline(always)]
    fn store(state: token_bucket::State, base: u128) -> u64 {
        let tat = state.tat();
        if tat <= base {
            0
        } else {
            // Below 2^63 by the numbers chosen compact; saturating would
            // only ever be stricter.
            u64::try_from(tat - base).unwrap_or(u64::MAX)
        }
    }

    /// A held key's `tat` on a compact table, at `now` ([`Table::held`]).
    #[inline(always)]
    fn slot(&mut self, key: StoreKey, now: Nanos) -> Option<GcraSlot<'_>> {
        self.prepare(now);
        self.held_slot(key)
    }

    /// [`Compact::slot`] at a `now` the base already covers.
    #[inline(always)]
    fn held_slot(&mut self, key: StoreKey) -> Option<GcraSlot<'_>> {
        let base = self.base_scaled();
        let rel = self.slots.get_mut(key)?;
        Some(GcraSlot::Compact { rel, base })
    }

    /// Makes `now` a time whose states fit: moves the base when `now` is
    /// past the horizon or behind the base.
    #[inline(always)]
    fn prepare(&mut self, now: Nanos) {
        // `now < base || now >= base + span` as one comparison.
        if now.wrapping_sub(self.base) >= self.span {
            self.rebase(now);
        }
    }

    #[cold]
    fn rebase(&mut self, now: Nanos) {
        let old = self.base_scaled();
        let margin = REBASE_MARGIN / u128::from(self.tokens);
        self.move_base(now.saturating_sub(u64::try_from(margin).unwrap_or(u64::MAX)));
        let new = self.base_scaled();
        for (_, rel) in self.slots.0.iter_mut() {
            if *rel != 0 {
                *rel = Compact::store(Compact::load(*rel, old), new);
            }
        }
    }
}

/// Where a token or leaky bucket's key keeps its `tat` ([`Compact::slot`]).
pub(crate) enum GcraSlot<'a> {
    /// Compact: its offset and the base it is from.
    Compact {
        rel: &'a mut u64,
        base: u128,
    },
    Wide(&'a mut token_bucket::State),
}

impl GcraSlot<'_> {
    /// The key's state.
    #[inline(always)]
    pub(crate) fn get(&self) -> token_bucket::State {
        match self {
            GcraSlot::Compact { rel, base } => Compact::load(**rel, *base),
            GcraSlot::Wide(state) => **state,
        }
    }

    /// Stores `state` for the key.
    #[inline(always)]
    pub(crate) fn set(&mut self, state: token_bucket::State) {
        match self {
            GcraSlot::Compact { rel, base } => **rel = Compact::store(state, *base),
            GcraSlot::Wide(s) => **s = state,
        }
    }
}

/// A held key's state, from [`Table::held`].
pub(crate) enum Held<'a> {
    /// A token or leaky bucket's `tat`.
    Bucket(GcraSlot<'a>),
    /// The other layouts' state.
    Other(StateMut<'a>),
}

/// One shard's keys, in their algorithm's layout.
#[derive(Debug)]
pub(crate) enum Table {
    Gcra(Compact),
    GcraWide(Keyed<u64, token_bucket::State>),
    Window(Keyed<StoreKey, fixed_window::State>),
    Sliding(Keyed<u64, sliding_window::State>),
    Log(Keyed<u64, Box<sliding_log::State>>),
    Inflight(Keyed<u64, Slot>),
    Adaptive(Keyed<u64, adaptive_slot::Slot>),
}

impl Table {
    pub(crate) fn new(algorithm: &Algorithm) -> Table {
        use Algorithm::*;
        match *algorithm {
            FixedWindow { .. } => Table::Window(Keyed::new()),
            SlidingWindow { .. } => Table::Sliding(Keyed::new()),
            SlidingLog { .. } => Table::Log(Keyed::new()),
            TokenBucket { .. } | LeakyBucket { .. } => match compact_tokens(algorithm) {
                Some(tokens) => Table::Gcra(Compact::new(tokens)),
                None => Table::GcraWide(Keyed::new()),
            },
            Concurrency { .. } => Table::Inflight(Keyed::new()),
            Adaptive { .. } => Table::Adaptive(Keyed::new()),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Table::Gcra(t) => t.slots.0.len(),
            Table::GcraWide(t) => t.0.len(),
            Table::Window(t) => t.0.len(),
            Table::Sliding(t) => t.0.len(),
            Table::Log(t) => t.0.len(),
            Table::Inflight(t) => t.0.len(),
            Table::Adaptive(t) => t.0.len(),
        }
    }

    /// Bytes of one slot of this layout (the control byte not included).
    #[cfg(test)]
    pub(crate) fn slot_bytes(&self) -> usize {
        use std::mem::size_of;
        match self {
            Table::Gcra(_) => size_of::<(u64, u64)>(),
            Table::GcraWide(_) => size_of::<(u64, token_bucket::State)>(),
            Table::Window(_) => size_of::<(StoreKey, fixed_window::State)>(),
            Table::Sliding(_) => size_of::<(u64, sliding_window::State)>(),
            Table::Log(_) => size_of::<(u64, Box<sliding_log::State>)>(),
            Table::Inflight(_) => size_of::<(u64, Slot)>(),
            Table::Adaptive(_) => size_of::<(u64, adaptive_slot::Slot)>(),
        }
    }

    /// `key`'s state, if the table holds it.
    #[inline(always)]
    pub(crate) fn get(&self, key: StoreKey) -> Option<StateRef<'_>> {
        match self {
            Table::Gcra(t) => {
                let rel = *t.slots.get(key)?;
                Some(StateRef::Gcra(Compact::load(rel, t.base_scaled())))
            }
            Table::GcraWide(t) => t.get(key).map(|s| StateRef::Gcra(*s)),
            Table::Window(t) => t.get(key).map(|s| StateRef::Window(*s)),
            Table::Sliding(t) => t.get(key).map(|s| StateRef::Sliding(*s)),
            Table::Log(t) => t.get(key).map(|s| StateRef::Log(s)),
            Table::Inflight(t) => t.get(key).map(StateRef::Inflight),
            Table::Adaptive(t) => t.get(key).map(StateRef::Adaptive),
        }
    }

    /// Runs `f` on `key`'s state, if the table holds it; `now` is the time
    /// `f` decides at (a compact table's base must cover it).
    #[inline(always)]
    pub(crate) fn with<R>(
        &mut self,
        key: StoreKey,
        now: Nanos,
        f: impl FnOnce(StateMut<'_>) -> R,
    ) -> Option<R> {
        if let Table::Gcra(t) = self {
            t.prepare(now);
        }
        self.with_held(key, f)
    }

    /// [`Table::with`] for an `f` that only puts back a state read under the
    /// same lock (an undo): the base already covers it.
    #[inline(always)]
    pub(crate) fn with_held<R>(
        &mut self,
        key: StoreKey,
        f: impl FnOnce(StateMut<'_>) -> R,
    ) -> Option<R> {
        // `f` (the whole decision, inlined) appears twice here, not once
        // per layout: a compact tat is a copy written back after.
        if let Table::Gcra(t) = self {
            let mut slot = t.held_slot(key)?;
            let mut state = slot.get();
            let r = f(StateMut::Gcra(&mut state));
            slot.set(state);
            return Some(r);
        }
        self.with_in_place(key, f)
    }

    /// A held key's state to decide on in place at `now` (a compact
    /// table's base moved to cover it); `None` for a key not held. A
    /// bucket's `tat` comes as a [`GcraSlot`], which its decision reads and
    /// writes in line, without the closure [`Table::with_in_place`] takes.
    #[inline(always)]
    pub(crate) fn held(&mut self, key: StoreKey, now: Nanos) -> Option<Held<'_>> {
        Some(match self {
            Table::Gcra(t) => Held::Bucket(t.slot(key, now)?),
            Table::GcraWide(t) => Held::Bucket(GcraSlot::Wide(t.get_mut(key)?)),
            Table::Window(t) => Held::Other(StateMut::Window(t.get_mut(key)?)),
            Table::Sliding(t) => Held::Other(StateMut::Sliding(t.get_mut(key)?)),
            Table::Log(t) => Held::Other(StateMut::Log(t.get_mut(key)?)),
            Table::Inflight(t) => Held::Other(StateMut::Inflight(t.get_mut(key)?)),
            Table::Adaptive(t) => Held::Other(StateMut::Adaptive(t.get_mut(key)?)),
        })
    }

    /// [`Table::with_held`] for the layouts whose states change in place:
    /// `None` on a compact table.
    #[inline(always)]
    pub(crate) fn with_in_place<R>(
        &mut self,
        key: StoreKey,
        f: impl FnOnce(StateMut<'_>) -> R,
    ) -> Option<R> {
        let state = match self {
            Table::Gcra(_) => return None,
            Table::GcraWide(t) => StateMut::Gcra(t.get_mut(key)?),
            Table::Window(t) => StateMut::Window(t.get_mut(key)?),
            Table::Sliding(t) => StateMut::Sliding(t.get_mut(key)?),
            Table::Log(t) => StateMut::Log(t.get_mut(key)?),
            Table::Inflight(t) => StateMut::Inflight(t.get_mut(key)?),
            Table::Adaptive(t) => StateMut::Adaptive(t.get_mut(key)?),
        };
        Some(f(state))
    }

    /// Stores `state` for `key`, which the caller found absent; `now` as
    /// for [`Table::with`]. A state of another layout is dropped (one
    /// limiter, one algorithm: it cannot be built).
    pub(crate) fn insert(&mut self, key: StoreKey, state: KeyState, now: Nanos) {
        match (self, state) {
            (Table::Gcra(t), KeyState::Gcra(s)) => {
                t.prepare(now);
                let rel = Compact::store(s, t.base_scaled());
                t.slots.insert(key, rel);
            }
            (Table::GcraWide(t), KeyState::Gcra(s)) => t.insert(key, s),
            (Table::Window(t), KeyState::Window(s)) => t.insert(key, s),
            (Table::Sliding(t), KeyState::Sliding(s)) => t.insert(key, s),
            (Table::Log(t), KeyState::Log(s)) => t.insert(key, s),
            (Table::Inflight(t), KeyState::Inflight(s)) => t.insert(key, s),
            (Table::Adaptive(t), KeyState::Adaptive(s)) => t.insert(key, s),
            _ => debug_assert!(false, "key state does not match the table"),
        }
    }

    /// Forgets `key`; whether it was held.
    pub(crate) fn remove(&mut self, key: StoreKey) -> bool {
        match self {
            Table::Gcra(t) => t.slots.remove(key),
            Table::GcraWide(t) => t.remove(key),
            Table::Window(t) => t.remove(key),
            Table::Sliding(t) => t.remove(key),
            Table::Log(t) => t.remove(key),
            Table::Inflight(t) => t.remove(key),
            Table::Adaptive(t) => t.remove(key),
        }
    }

    /// Keeps the keys `keep` says to keep. It gets each key as far as the
    /// table holds it (`hi` 0 where only the low half is kept).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(StoreKey, StateRef<'_>) -> bool) {
        match self {
            Table::Gcra(t) => {
                let base = t.base_scaled();
                t.slots
                    .0
                    .retain(|(k, rel)| keep(k.full(), StateRef::Gcra(Compact::load(*rel, base))));
            }
            Table::GcraWide(t) => t.0.retain(|(k, s)| keep(k.full(), StateRef::Gcra(*s))),
            Table::Window(t) => t.0.retain(|(k, s)| keep(k.full(), StateRef::Window(*s))),
            Table::Sliding(t) => t.0.retain(|(k, s)| keep(k.full(), StateRef::Sliding(*s))),
            Table::Log(t) => t.0.retain(|(k, s)| keep(k.full(), StateRef::Log(s))),
            Table::Inflight(t) => t.0.retain(|(k, s)| keep(k.full(), StateRef::Inflight(s))),
            Table::Adaptive(t) => t.0.retain(|(k, s)| keep(k.full(), StateRef::Adaptive(s))),
        }
    }

    /// Every key (as in [`Table::retain`]) and its state.
    pub(crate) fn for_each(&self, mut f: impl FnMut(StoreKey, StateRef<'_>)) {
        match self {
            Table::Gcra(t) => {
                let base = t.base_scaled();
                for (k, rel) in t.slots.0.iter() {
                    f(k.full(), StateRef::Gcra(Compact::load(*rel, base)));
                }
            }
            Table::GcraWide(t) => {
                t.0.iter()
                    .for_each(|(k, s)| f(k.full(), StateRef::Gcra(*s)))
            }
            Table::Window(t) => {
                t.0.iter()
                    .for_each(|(k, s)| f(k.full(), StateRef::Window(*s)))
            }
            Table::Sliding(t) => {
                t.0.iter()
                    .for_each(|(k, s)| f(k.full(), StateRef::Sliding(*s)))
            }
            Table::Log(t) => t.0.iter().for_each(|(k, s)| f(k.full(), StateRef::Log(s))),
            Table::Inflight(t) => {
                t.0.iter()
                    .for_each(|(k, s)| f(k.full(), StateRef::Inflight(s)))
            }
            Table::Adaptive(t) => {
                t.0.iter()
                    .for_each(|(k, s)| f(k.full(), StateRef::Adaptive(s)))
            }
        }
    }
}

/// The rate's `tokens` when a token or leaky bucket's `tat`s can be compact:
/// twice its burst (a settlement's debt) plus its `wait` (a held request's)
/// within [`AHEAD_MAX`], and a rate that moves the base at most once a
/// minute.
fn compact_tokens(algorithm: &Algorithm) -> Option<u64> {
    let (burst, rate, wait) = match *algorithm {
        Algorithm::TokenBucket {
            capacity,
            refill,
            wait,
        } => (capacity, refill, wait),
        Algorithm::LeakyBucket { capacity, rate, .. } => (capacity.saturating_add(1), rate, 0),
        _ => return None,
    };
    let tokens = rate.tokens.max(1);
    // A `wait`'s debt comes on top (scaled: `wait × tokens`).
    let ahead = (2 * u128::from(burst) + 2) * u128::from(rate.per.max(1))
        + u128::from(wait) * u128::from(tokens);
    (ahead <= AHEAD_MAX && u128::from(tokens) <= COMPACT_TOKENS).then_some(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{NANOS_PER_SEC, Rate};

    const S: Nanos = NANOS_PER_SEC;
    const T0: Nanos = 1_700_000_000 * S;

    fn bucket(capacity: u64, tokens: u64, per: Nanos) -> Algorithm {
        Algorithm::TokenBucket {
            capacity,
            refill: Rate { tokens, per },
            wait: 0,
        }
    }

    #[test]
    fn slot_sizes() {
        // The module doc's table: per-key bytes follow from these.
        let window = Algorithm::FixedWindow {
            limit: 1,
            window: S,
        };
        let sliding = Algorithm::SlidingWindow {
            limit: 1,
            window: S,
        };
        let log = Algorithm::SlidingLog {
            limit: 1,
            window: S,
        };
        let cases = [
            (bucket(100, 10, S), 16),
            (bucket(u64::MAX / 4, 10, S), 24),
            // A `wait` whose debt could pass the compact range.
            (
                Algorithm::TokenBucket {
                    capacity: 100,
                    refill: Rate { tokens: 10, per: S },
                    wait: 1 << 60,
                },
                24,
            ),
            (window, 32),
            (sliding, 24),
            (log, 16),
            (Algorithm::Concurrency { max: 1 }, 16),
            (adaptive(), 16),
        ];
        for (algorithm, bytes) in cases {
            assert_eq!(Table::new(&algorithm).slot_bytes(), bytes, "{algorithm:?}");
        }
    }

    #[test]
    fn large_tables_are_mapped_and_hold_their_keys() {
        let layout = Layout::from_size_align(MAPPED, 16).unwrap();
        let block = TableAlloc.allocate(layout).unwrap();
        let p = block.cast::<u8>();
        if cfg!(unix) {
            assert_eq!(p.as_ptr() as usize % 4096, 0, "a mapping is page aligned");
        }
        // SAFETY: `block` is `MAPPED` writable bytes, freed with its layout.
        unsafe {
            std::ptr::write_bytes(p.as_ptr(), 0xA5, MAPPED);
            TableAlloc.deallocate(p, layout);
        }
        // A table that grows from the global allocator into mappings and
        // through several doublings keeps every key.
        let mut table = Table::new(&bucket(10, 10, S));
        for i in 0..20_000 {
            let state = token_bucket::State::at(u128::from(T0) * 10 + u128::from(i) + 1);
            table.insert(key(i), KeyState::Gcra(state), T0);
        }
        assert_eq!(table.len(), 20_000);
        for i in 0..20_000 {
            assert_eq!(
                tat_of(&table, key(i)),
                u128::from(T0) * 10 + u128::from(i) + 1
            );
        }
        assert!(table.remove(key(7)) && !table.remove(key(7)));
    }

    #[test]
    fn compact_only_within_its_range() {
        assert!(compact_tokens(&bucket(1_000_000, 1_000_000, S)).is_some());
        assert!(compact_tokens(&bucket(10, 50_000_000, S)).is_some());
        // A rate of a billion per second would rebase every few seconds.
        assert!(compact_tokens(&bucket(10, 1_000_000_000, S)).is_none());
        // A burst whose debt spans more than 2^62 scaled ns.
        assert!(compact_tokens(&bucket(1 << 40, 1, 1 << 30)).is_none());
        assert!(compact_tokens(&Algorithm::Concurrency { max: 1 }).is_none());
    }

    fn adaptive() -> Algorithm {
        let params = crate::limit::adaptive::Params::new(1, 10, 5).unwrap();
        Algorithm::Adaptive { params }
    }

    #[test]
    fn adaptive_keys_share_their_state_with_permits() {
        let mut table = Table::new(&adaptive());
        let Algorithm::Adaptive { params } = adaptive() else {
            unreachable!()
        };
        table.insert(
            key(1),
            KeyState::Adaptive(adaptive_slot::fresh(params, T0)),
            T0,
        );
        let permit = table
            .with(key(1), T0, |s| match s {
                StateMut::Adaptive(slot) => adaptive_slot::AdaptivePermit::acquire(slot, 2, T0),
                other => panic!("{other:?}"),
            })
            .unwrap();
        let in_flight = |table: &Table| match table.get(key(1)) {
            Some(StateRef::Adaptive(slot)) => adaptive_slot::view(slot).in_flight,
            other => panic!("{other:?}"),
        };
        assert_eq!(in_flight(&table), 2);
        table.retain(|_, s| match s {
            StateRef::Adaptive(slot) => !adaptive_slot::is_fresh(slot),
            _ => true,
        });
        assert_eq!(table.len(), 1, "a key with a permit alive is kept");
        drop(permit);
        assert_eq!(in_flight(&table), 0);
        table.retain(|_, s| match s {
            StateRef::Adaptive(slot) => !adaptive_slot::is_fresh(slot),
            _ => true,
        });
        assert_eq!(table.len(), 0, "fresh again: swept");
    }

    fn key(i: u64) -> StoreKey {
        StoreKey {
            hi: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            lo: i.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1,
        }
    }

    fn tat_of(table: &Table, k: StoreKey) -> u128 {
        match table.get(k) {
            Some(StateRef::Gcra(s)) => s.tat(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn compact_tats_are_exact_across_rebases() {
        // "3/s": scaled ns are ns × 3, rebasing every ~48 years of `now`.
        let mut table = Table::new(&bucket(10, 3, S));
        let tat = u128::from(T0) * 3 + 7;
        table.insert(key(1), KeyState::Gcra(token_bucket::State::at(tat)), T0);
        table.insert(key(2), KeyState::Gcra(token_bucket::State::default()), T0);
        assert_eq!(tat_of(&table, key(1)), tat);
        assert_eq!(tat_of(&table, key(2)), 0, "a full bucket stays full");
        let Table::Gcra(compact) = &mut table else {
            panic!("compact")
        };
        let base = compact.base;
        // `now` behind the base (another clock): the base moves back.
        compact.prepare(base - 10 * S);
        assert!(compact.base < base);
        assert_eq!(tat_of(&table, key(1)), tat);
        // `now` past the horizon: forward; the tat is in the past by then,
        // and a tat in the past decides as a full bucket.
        let Table::Gcra(compact) = &mut table else {
            panic!("compact")
        };
        let later = compact.until() + S;
        compact.prepare(later);
        assert!(compact.base > base);
        assert_eq!(tat_of(&table, key(1)), 0);
        // A tat ahead of the next base survives the next move exactly.
        let Table::Gcra(compact) = &table else {
            panic!("compact")
        };
        let (moved, horizon) = (compact.base, compact.until());
        let ahead = u128::from(horizon) * 3 + 5;
        table.with(key(1), later, |s| {
            if let StateMut::Gcra(s) = s {
                *s = token_bucket::State::at(ahead);
            }
        });
        let Table::Gcra(compact) = &mut table else {
            panic!("compact")
        };
        compact.prepare(horizon);
        assert!(compact.base > moved);
        assert_eq!(tat_of(&table, key(1)), ahead);
    }

    #[test]
    fn rebased_table_decides_as_the_wide_one() {
        // The same requests through a compact and a wide table, with `now`
        // jumping across several horizons of a fast rate: identical verdicts.
        let (capacity, rate) = (
            50,
            Rate {
                tokens: 600_000,
                per: S,
            },
        );
        let algorithm = bucket(capacity, rate.tokens, rate.per);
        let mut compact = Table::new(&algorithm);
        let mut wide = Table::GcraWide(Keyed::new());
        assert!(matches!(compact, Table::Gcra(_)));
        let mut now = T0;
        for step in 0..2_000u64 {
            now += if step % 97 == 0 {
                180 * MINUTE as u64
            } else {
                step % 7
            };
            let k = key(step % 5);
            let mut verdicts = Vec::new();
            for table in [&mut compact, &mut wide] {
                let decided = table.with(k, now, |s| {
                    let StateMut::Gcra(s) = s else { panic!() };
                    let (n, v) = token_bucket::decide(*s, now, 1 + step % 3, capacity, rate);
                    if v.allowed {
                        *s = n;
                    }
                    v
                });
                let v = decided.unwrap_or_else(|| {
                    let (n, v) =
                        token_bucket::decide(Default::default(), now, 1 + step % 3, capacity, rate);
                    table.insert(
                        k,
                        KeyState::Gcra(if v.allowed { n } else { Default::default() }),
                        now,
                    );
                    v
                });
                verdicts.push(v);
            }
            assert_eq!(verdicts[0], verdicts[1], "step {step}");
        }
    }
}
