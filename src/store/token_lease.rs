//! Token leasing: a shared token bucket with `lease = N` is charged N
//! tokens at a time. An admitting call takes up to N (`stack.lua`), the
//! node keeps the rest in its pool and spends them without a call for
//! [`LEASE_HOLD`]; the store thread gives back what lapsed unspent
//! ([`RedisStore::return_expired`]).
//!
//! All of it happens inside [`RedisStore::decide`]
//! ([`RedisStore::decide_leasing`]): tokens spent for a request whose stack
//! is then denied, or whose call fails (the fallback then decides every
//! shared limit), go back to the pool before the answer, and its verdict
//! shows them back. A node holds at most one lease of a bucket: while a
//! call taking one is under way, its other requests that miss take only
//! their cost (the bound in docs/src/guides/distributed.md, "Token leasing").

use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::{OwnedEntry, RedisStore, SharedDecision, SharedEntry, Unavailable, slot_of};
use crate::limit::Verdict;

/// How long a node keeps the tokens it leased before giving back what it
/// did not spend (`lease = N`).
pub(crate) const LEASE_HOLD: Duration = Duration::from_secs(1);

/// Shards of the lease pool: requests for different keys rarely meet.
const POOL_SHARDS: usize = 16;

/// Tokens leased from one shared token bucket and not spent yet.
#[derive(Debug)]
struct Leased {
    tokens: u64,
    expires: Instant,
    entry: OwnedEntry,
    /// A call taking a lease for this bucket is under way: the node's
    /// other requests meanwhile take only their cost, so that it never
    /// holds more than one lease of a bucket (docs/src/guides/distributed.md, "Token leasing").
    fetching: bool,
}

type PoolShard = parking_lot::Mutex<std::collections::HashMap<String, Leased>>;

/// Leased token-bucket tokens, by Redis key, sharded.
pub(super) struct Pool(Box<[PoolShard]>);

impl Default for Pool {
    fn default() -> Pool {
        Pool((0..POOL_SHARDS).map(|_| PoolShard::default()).collect())
    }
}

/// The buckets a decision is taking leases for; their `fetching` mark is
/// cleared when it ends, also when its request goes away mid-call.
struct Fetching<'a> {
    store: &'a RedisStore,
    keys: SmallVec<[String; 2]>,
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        for key in &self.keys {
            if let Some(held) = self.store.pool_shard(key).lock().get_mut(key) {
                held.fetching = false;
            }
        }
    }
}

/// What the pool does for one leased entry of a decision.
enum Leasing {
    /// Its cost was spent from this node's tokens: these are left.
    Spent(u64),
    /// Redis decides it, taking a lease (this decision fetches it).
    Fetch,
    /// Redis decides it, taking only the cost: another call is fetching.
    CostOnly,
}

impl RedisStore {
    /// Drops this node's unspent lease of the bucket at Redis `key` (a
    /// reset emptied the bucket: the lease's tokens were taken from the
    /// state that is gone).
    pub(super) fn drop_lease(&self, key: &str) {
        self.pool_shard(key).lock().remove(key);
    }

    fn pool_shard(&self, key: &str) -> &PoolShard {
        let i = slot_of(key) as usize % POOL_SHARDS;
        &self.pool.0[i]
    }

    /// [`RedisStore::decide`] of a stack with leased token buckets: each
    /// spends this node's tokens when it holds enough, without a call; the
    /// others are decided in Redis, a bucket no other call of this node is
    /// fetching a lease for taking one. Admitted, a lease's rest joins the
    /// pool; denied, or when Redis fails, the spent tokens go back.
    pub(super) async fn decide_leasing(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<SharedDecision, Unavailable> {
        // Per entry, the tokens left when spent from the pool.
        let mut spent: SmallVec<[Option<u64>; 4]> = SmallVec::new();
        let mut remote: SmallVec<[SharedEntry<'_>; 4]> = SmallVec::new();
        let mut fetching = Fetching {
            store: self,
            keys: SmallVec::new(),
        };
        for e in entries {
            let leasing = match e.lease {
                0 => Leasing::CostOnly,
                _ => self.lease_for(e, &mut fetching),
            };
            match leasing {
                Leasing::Spent(left) => spent.push(Some(left)),
                Leasing::Fetch => {
                    spent.push(None);
                    remote.push(*e);
                }
                Leasing::CostOnly => {
                    spent.push(None);
                    remote.push(SharedEntry { lease: 0, ..*e });
                }
            }
        }
        let answer = if remote.is_empty() {
            Ok(None)
        } else {
            self.decide_remote(&remote).await.map(Some)
        };
        drop(fetching);
        let (decision, taken) = match answer {
            Ok(Some(charged)) => (charged.decision, charged.taken),
            Ok(None) => (SharedDecision::default(), SmallVec::new()),
            Err(Unavailable) => {
                self.unspend(entries, &spent);
                return Err(Unavailable);
            }
        };
        let admitted = remote
            .iter()
            .zip(&decision.verdicts)
            .all(|(e, v)| v.is_none_or(|v| v.allowed || e.shadow));
        if admitted {
            // A lease took more than the cost: the rest is this node's.
            for (e, taken) in remote.iter().zip(&taken) {
                if e.lease > 0 && *taken > e.cost {
                    self.add_lease(e, taken - e.cost);
                }
            }
        } else {
            self.unspend(entries, &spent);
        }
        // The entries in stack order: spent ones (with their tokens back
        // when denied), then Redis's verdicts in the order they were sent.
        let mut decided = decision.verdicts.into_iter();
        let verdicts = entries
            .iter()
            .zip(&spent)
            .map(|(e, left)| match left {
                Some(left) if admitted => Some(Verdict::allow(*left, 0)),
                Some(left) => Some(Verdict::allow(left.saturating_add(e.cost), 0)),
                None => decided.next().flatten(),
            })
            .collect();
        Ok(SharedDecision {
            verdicts,
            leases: decision.leases,
        })
    }

    /// Spends `e`'s cost from this node's tokens when it holds that many
    /// (and the lease has not lapsed); else marks `e` fetched by this
    /// decision, unless another call is fetching it already.
    fn lease_for(&self, e: &SharedEntry<'_>, fetching: &mut Fetching<'_>) -> Leasing {
        let key = self.key_of(e);
        let now = Instant::now();
        let mut shard = self.pool_shard(&key).lock();
        if let Some(held) = shard.get_mut(&key) {
            if held.tokens >= e.cost && held.expires > now {
                held.tokens -= e.cost;
                return Leasing::Spent(held.tokens);
            }
            if held.fetching {
                return Leasing::CostOnly;
            }
            held.fetching = true;
        } else {
            shard.insert(
                key.clone(),
                Leased {
                    tokens: 0,
                    expires: now + LEASE_HOLD,
                    entry: OwnedEntry::from(e),
                    fetching: true,
                },
            );
        }
        fetching.keys.push(key);
        Leasing::Fetch
    }

    /// Puts back the tokens spent for `entries` (`spent`: what was left,
    /// for those spent) when their request is not admitted after all.
    fn unspend(&self, entries: &[SharedEntry<'_>], spent: &[Option<u64>]) {
        for (e, _) in entries.iter().zip(spent).filter(|(_, s)| s.is_some()) {
            let key = self.key_of(e);
            if let Some(held) = self.pool_shard(&key).lock().get_mut(&key) {
                held.tokens += e.cost;
            }
        }
    }

    /// Keeps `tokens` leased for `e` for [`LEASE_HOLD`]; what is not spent
    /// by then goes back to the shared bucket.
    fn add_lease(&self, e: &SharedEntry<'_>, tokens: u64) {
        let key = self.key_of(e);
        let expires = Instant::now() + LEASE_HOLD;
        let mut shard = self.pool_shard(&key).lock();
        let held = shard.entry(key).or_insert_with(|| Leased {
            tokens: 0,
            expires,
            entry: OwnedEntry::from(e),
            fetching: false,
        });
        held.tokens += tokens;
        held.expires = expires;
    }

    /// Gives every unspent leased token back (a reload changes the limits).
    pub(crate) fn return_leases(self: &Arc<Self>) {
        let store = self.clone();
        self.runtime
            .spawn(async move { store.return_expired(true).await });
    }

    /// Gives back the unspent tokens of lapsed leases (of all, with `all`).
    pub(super) async fn return_expired(&self, all: bool) {
        let now = Instant::now();
        let mut back: Vec<(OwnedEntry, u64)> = Vec::new();
        for shard in self.pool.0.iter() {
            shard.lock().retain(|_, held| {
                if all || held.expires <= now {
                    back.push((held.entry.clone(), held.tokens));
                    // Kept while its fetch is under way (the fetch ends it).
                    held.tokens = 0;
                    return held.fetching;
                }
                true
            });
        }
        let back: Vec<(SharedEntry<'_>, u64)> = back
            .iter()
            .filter(|(_, tokens)| *tokens > 0)
            .map(|(e, tokens)| (e.view(), *tokens))
            .collect();
        if !back.is_empty() {
            self.refund(&back).await;
        }
    }
}
