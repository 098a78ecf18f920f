//! Per-key overrides of a limit's numbers (`PUT /limits/NAME/overrides`):
//! what is stored, and what a snapshot's request path reads of it.
//!
//! An override gives one key of one limit its own parameters, checked as
//! the file's are (`config::limits::check_override`). Its key's state lives
//! in a limiter built with those numbers, one per distinct set of numbers
//! of a limit (so 10,000 overrides of a few kinds cost a few limiters),
//! kept across reloads by [`Registry`]; installing or removing an override
//! moves the key's state between limiters as a reload does
//! ([`Limiter::carry_key`]).
//!
//! The request path ([`LimitOverrides::lookup`]) reads one relaxed flag
//! when a limit has no override; with some, one `arc-swap` load and one
//! hash lookup of the 16-byte digest. The key map is immutable and swapped
//! whole on every write (a cold path). A snapshot's override limiters sit
//! in slots filled once and never emptied while it lives, so a request
//! borrows one for the snapshot's lifetime as it borrows the plan
//! limiters; a reload (or a restart) compacts them.
//!
//! Overrides outlive reloads here and restarts in `server.state_file`
//! (`state_file`).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::config::LimitConfig;
use crate::config::limits::{RawPlan, check_override};
use crate::limit::digest_hasher::DigestHasher;
use crate::limit::{Algorithm, LimitKey, Limiter, Nanos};

/// Distinct sets of override numbers one limit may use in one snapshot.
/// Slots are not reused until the next reload, which compacts them.
pub(crate) const SLOTS: usize = 256;

/// One override as accepted: the values given (the limit's own are merged
/// under them whenever it is checked), when it ends, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Override {
    pub(crate) limit: String,
    pub(crate) key: LimitKey,
    pub(crate) params: RawPlan,
    /// On the limiters' clock; `None`: until deleted.
    pub(crate) expires: Option<Nanos>,
    pub(crate) reason: Option<String>,
    pub(crate) set_at: Nanos,
    /// The plan whose limiter held the key's state when it was installed,
    /// where it goes back when the override ends.
    pub(crate) plan: Option<Arc<str>>,
}

/// An override in force in a snapshot.
#[derive(Debug, Clone)]
pub(crate) struct InForce {
    /// The checked numbers (a shared limit's unscaled ones).
    pub(crate) algorithm: Algorithm,
    /// Its limiter's slot in [`LimitOverrides`].
    slot: usize,
    /// On the limiters' clock; `Nanos::MAX` without expiry.
    expires: Nanos,
    pub(crate) record: Arc<Override>,
}

/// A key of the override map: hashed as its digest's low half alone (one
/// `write_u64`, which [`DigestHasher`] passes through), not as an array
/// with its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MapKey(LimitKey);

impl Hash for MapKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.halves().1);
    }
}

type KeyMap = HashMap<MapKey, InForce, BuildHasherDefault<DigestHasher>>;

/// One limit's overrides in one snapshot.
#[derive(Debug)]
pub(crate) struct LimitOverrides {
    /// Whether `keys` has any entry: the one read a request of a limit
    /// without overrides pays.
    any: AtomicBool,
    keys: ArcSwap<KeyMap>,
    /// The limiters of the numbers in use, each filled once (see the module
    /// doc).
    slots: Box<[OnceLock<Arc<Limiter>>]>,
}

impl Default for LimitOverrides {
    fn default() -> Self {
        LimitOverrides {
            any: AtomicBool::new(false),
            keys: ArcSwap::from_pointee(KeyMap::default()),
            slots: (0..SLOTS).map(|_| OnceLock::new()).collect(),
        }
    }
}

impl LimitOverrides {
    /// `key`'s override in force at `now`: its numbers and the limiter
    /// holding its state.
    #[inline(always)]
    pub(crate) fn lookup(&self, key: LimitKey, now: Nanos) -> Option<(Algorithm, &Limiter)> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.lookup_in_map(key, now)
    }

    #[inline(never)]
    fn lookup_in_map(&self, key: LimitKey, now: Nanos) -> Option<(Algorithm, &Limiter)> {
        let keys = self.keys.load();
        let found = keys.get(&MapKey(key)).filter(|f| now < f.expires)?;
        let limiter = self.slots.get(found.slot)?.get()?;
        Some((found.algorithm, limiter))
    }

    /// As [`LimitOverrides::lookup`], with the limiter shared and the
    /// record (explain, a token bill).
    pub(crate) fn find(&self, key: LimitKey, now: Nanos) -> Option<(InForce, Arc<Limiter>)> {
        let keys = self.keys.load();
        let found = keys.get(&MapKey(key)).filter(|f| now < f.expires)?;
        let limiter = self.slots.get(found.slot)?.get()?;
        Some((found.clone(), limiter.clone()))
    }

    /// The slot holding `limiter`, filling a free one; `None` when all are
    /// taken.
    fn slot_of(&self, limiter: &Arc<Limiter>) -> Option<usize> {
        for (i, slot) in self.slots.iter().enumerate() {
            match slot.get() {
                Some(held) if Arc::ptr_eq(held, limiter) => return Some(i),
                Some(_) => {}
                None => {
                    let _ = slot.set(limiter.clone());
                    return Some(i);
                }
            }
        }
        None
    }

    fn swap(&self, keys: KeyMap) {
        let any = !keys.is_empty();
        self.keys.store(Arc::new(keys));
        self.any.store(any, Ordering::Relaxed);
    }

    fn current(&self) -> KeyMap {
        KeyMap::clone(&self.keys.load())
    }
}

/// Why an override could not be installed.
#[derive(Debug)]
pub(crate) enum Refused {
    /// A value the file would refuse too: `(field, message)` each.
    Invalid(Vec<(String, String)>),
    /// Every slot of the limit holds other numbers until the next reload.
    Full,
}

/// What a limiter of override numbers was built for: its state is kept
/// while these match.
#[derive(Debug, Clone, PartialEq)]
struct Built {
    limit: LimitConfig,
    numbers: Algorithm,
}

/// A limiter of override numbers and what it was built for.
type OverrideLimiter = (Built, Arc<Limiter>);

/// Every override and the limiters of their numbers, outside any
/// snapshot; touched only by admin writes, reloads and the sweeper (the
/// caller holds the install lock).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// The last poll of a Redis fleet's overrides failed
    /// (`override_sync`): the set in force is the last one seen.
    stale: AtomicBool,
    stored: Mutex<BTreeMap<(String, u128), Arc<Override>>>,
    /// By limit and the numbers the limiter is built with (a shared
    /// limit's scaled fallback numbers).
    limiters: Mutex<HashMap<(String, Algorithm), OverrideLimiter>>,
}

/// What a write needs of the snapshot it applies to.
pub(crate) struct Target<'a> {
    pub(crate) config: &'a LimitConfig,
    pub(crate) overrides: &'a LimitOverrides,
    /// The limit's base and plan limiters, by plan.
    pub(crate) limiters: Vec<(Option<Arc<str>>, Arc<Limiter>)>,
    /// `local_fraction` when the limit is shared: its limiters hold the
    /// scaled fallback.
    pub(crate) fraction: Option<(u64, u64)>,
}

impl Registry {
    /// Sets whether the overrides are stale; what it was.
    pub(crate) fn set_stale(&self, stale: bool) -> bool {
        self.stale.swap(stale, Ordering::Relaxed)
    }

    /// Whether the last poll of Redis failed.
    pub(crate) fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Every override stored, in limit and key order.
    pub(crate) fn list(&self) -> Vec<Arc<Override>> {
        self.stored.lock().values().cloned().collect()
    }

    /// The override of `limit` for `key`, if any.
    pub(crate) fn get(&self, limit: &str, key: LimitKey) -> Option<Arc<Override>> {
        self.stored
            .lock()
            .get(&(limit.to_owned(), key.as_u128()))
            .cloned()
    }

    /// The limiter for `limit`'s override numbers `numbers` (scaled by
    /// `fraction` for a shared limit), kept or built.
    fn limiter(
        &self,
        limit: &LimitConfig,
        numbers: Algorithm,
        fraction: Option<(u64, u64)>,
    ) -> Arc<Limiter> {
        let scaled = match fraction {
            Some((num, den)) => numbers.scaled(num, den),
            None => numbers,
        };
        let built = Built {
            limit: limit.clone(),
            numbers: scaled,
        };
        let mut limiters = self.limiters.lock();
        let id = (limit.name.clone(), scaled);
        if let Some((was, limiter)) = limiters.get(&id)
            && was.limit.key == built.limit.key
            && was.limit.align == built.limit.align
            && was.limit.max_keys == built.limit.max_keys
        {
            return limiter.clone();
        }
        let limiter =
            Arc::new(Limiter::new(&limit.name, scaled, limit.max_keys).with_align(limit.align));
        limiters.insert(id, (built, limiter.clone()));
        limiter
    }

    /// Whether an override of `numbers` fits `target` now: a slot holds a
    /// limiter of them, or one is free (checked before a write is stored
    /// anywhere; [`Registry::put`] decides).
    pub(crate) fn has_room(&self, target: &Target<'_>, numbers: Algorithm) -> bool {
        let scaled = match target.fraction {
            Some((num, den)) => numbers.scaled(num, den),
            None => numbers,
        };
        target
            .overrides
            .slots
            .iter()
            .any(|slot| slot.get().is_none_or(|held| held.algorithm() == scaled))
    }

    /// Checks `record` against `target` and, once `persist` accepted the
    /// whole new set, puts it in force: the key's state moved to the
    /// override's limiter at `now`. Returns the record stored.
    pub(crate) fn put<E>(
        &self,
        target: &Target<'_>,
        mut record: Override,
        now: Nanos,
        persist: impl FnOnce(&[Arc<Override>]) -> Result<(), E>,
    ) -> Result<Result<Arc<Override>, Refused>, E> {
        let numbers = match check_override(target.config, &record.params) {
            Ok(numbers) => numbers,
            Err(problems) => return Ok(Err(Refused::Invalid(problems))),
        };
        let limiter = self.limiter(target.config, numbers, target.fraction);
        let Some(slot) = target.overrides.slot_of(&limiter) else {
            return Ok(Err(Refused::Full));
        };
        let id = (record.limit.clone(), record.key.as_u128());
        let previous = self.stored.lock().get(&id).cloned();
        // Where the key's state is now: a previous override's limiter, or
        // the base or plan limiter holding it.
        let (plan, from) = match previous
            .as_ref()
            .and_then(|_| target.overrides.find(record.key, now))
        {
            Some((found, held)) => (found.record.plan.clone(), held),
            None => target
                .limiters
                .iter()
                .find(|(_, l)| l.holds(record.key))
                .or(target.limiters.first())
                .map(|(plan, l)| (plan.clone(), l.clone()))
                .expect("a limit has its base limiter"),
        };
        record.plan = plan;
        let record = Arc::new(record);
        let mut next = self.list();
        next.retain(|o| (o.limit.as_str(), o.key) != (id.0.as_str(), record.key));
        next.push(record.clone());
        persist(&next)?;
        if !Arc::ptr_eq(&from, &limiter) {
            limiter.carry_key(&from, record.key, now);
        }
        self.stored.lock().insert(id, record.clone());
        let mut keys = target.overrides.current();
        keys.insert(
            MapKey(record.key),
            InForce {
                algorithm: numbers,
                slot,
                expires: record.expires.unwrap_or(Nanos::MAX),
                record: record.clone(),
            },
        );
        target.overrides.swap(keys);
        Ok(Ok(record))
    }

    /// Removes `limit`'s override of `key` once `persist` accepted the set
    /// without it, its state going back to the limiter it came from.
    /// `Ok(None)`: there was none.
    pub(crate) fn remove<E>(
        &self,
        target: &Target<'_>,
        key: LimitKey,
        now: Nanos,
        persist: impl FnOnce(&[Arc<Override>]) -> Result<(), E>,
    ) -> Result<Option<Arc<Override>>, E> {
        let id = (target.config.name.clone(), key.as_u128());
        let Some(record) = self.stored.lock().get(&id).cloned() else {
            return Ok(None);
        };
        let mut next = self.list();
        next.retain(|o| !Arc::ptr_eq(o, &record));
        persist(&next)?;
        self.stored.lock().remove(&id);
        let back = target
            .limiters
            .iter()
            .find(|(plan, _)| *plan == record.plan)
            .or(target.limiters.first());
        if let (Some((_, back)), Some((_, held))) = (back, target.overrides.find(key, 0)) {
            back.carry_key(&held, key, now);
        }
        let mut keys = target.overrides.current();
        keys.remove(&MapKey(key));
        target.overrides.swap(keys);
        Ok(Some(record))
    }

    /// The overrides whose time is up at `now`, by limit and key.
    pub(crate) fn expired(&self, now: Nanos) -> Vec<(String, LimitKey)> {
        self.stored
            .lock()
            .values()
            .filter(|o| o.expires.is_some_and(|at| at <= now))
            .map(|o| (o.limit.clone(), o.key))
            .collect()
    }

    /// Replaces every stored override with `records` (a restart's file),
    /// none in force yet: [`Registry::attach`] puts them in a snapshot.
    pub(crate) fn restore(&self, records: Vec<Override>) {
        let mut stored = self.stored.lock();
        stored.clear();
        for record in records {
            stored.insert(
                (record.limit.clone(), record.key.as_u128()),
                Arc::new(record),
            );
        }
    }

    /// Puts the stored overrides in force in a new snapshot's limits (a
    /// start, a reload, a rescale): each checked against its limit as it
    /// is now, its state kept where its limiter is. An override whose limit
    /// is gone, or whose values no longer check, is dropped (logged);
    /// returns whether any was, for the caller to persist the set.
    pub(crate) fn attach(&self, targets: &[Target<'_>]) -> bool {
        let mut stored = self.stored.lock();
        let mut dropped = false;
        let mut maps: Vec<KeyMap> = targets.iter().map(|_| KeyMap::default()).collect();
        let mut kept = HashMap::new();
        stored.retain(|(limit, _), record| {
            let Some(i) = targets.iter().position(|t| t.config.name == *limit) else {
                tracing::info!(limit = %limit, "a removed limit took its override with it");
                dropped = true;
                return false;
            };
            let target = &targets[i];
            let numbers = match check_override(target.config, &record.params) {
                Ok(numbers) => numbers,
                Err(problems) => {
                    let (field, message) = problems.into_iter().next().unwrap_or_default();
                    tracing::warn!(
                        limit = %limit,
                        "an override no longer fits its limit and is dropped: `{field}`: {message}"
                    );
                    dropped = true;
                    return false;
                }
            };
            let limiter = self.limiter(target.config, numbers, target.fraction);
            let Some(slot) = target.overrides.slot_of(&limiter) else {
                tracing::warn!(limit = %limit, "too many distinct override numbers; one is dropped");
                dropped = true;
                return false;
            };
            kept.insert((limit.clone(), limiter.algorithm()), ());
            maps[i].insert(
                MapKey(record.key),
                InForce {
                    algorithm: numbers,
                    slot,
                    expires: record.expires.unwrap_or(Nanos::MAX),
                    record: record.clone(),
                },
            );
            true
        });
        drop(stored);
        // Limiters of numbers no override uses any more are let go.
        self.limiters.lock().retain(|id, _| kept.contains_key(id));
        for (target, keys) in targets.iter().zip(maps) {
            target.overrides.swap(keys);
        }
        dropped
    }
}
