//! Verified tokens, kept until they expire so that a client's next request
//! costs a hash and a comparison instead of a signature check.
//!
//! Keyed by a digest of the token (xxh3 with a seed drawn at start, so
//! nobody can choose tokens that land on one slot ahead of time); the
//! entry keeps the token's bytes and a hit compares them whole, so two
//! tokens with one digest can never share an identity. Sharded like the
//! limiters (no global lock); each shard holds at most its share of
//! `cache_size` entries, and a full shard first drops its expired entries,
//! then an arbitrary one. The cache belongs to one configuration: a
//! reload starts an empty one (its issuers and claims may have changed).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use parking_lot::Mutex;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::verify::Verified;
use crate::limit::memory::DigestHasher;

const SHARDS: usize = 16;

#[derive(Debug)]
struct Entry {
    token: Box<str>,
    verified: Arc<Verified>,
}

type Shard = HashMap<u64, Entry, BuildHasherDefault<DigestHasher>>;

#[derive(Debug)]
pub(crate) struct Cache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    seed: u64,
}

impl Cache {
    /// A cache of at most `size` tokens; 0 turns it off.
    pub(crate) fn new(size: usize) -> Cache {
        Cache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: size.div_ceil(SHARDS),
            seed: fastrand::u64(..),
        }
    }

    fn slot(&self, token: &str) -> (&Mutex<Shard>, u64) {
        let digest = xxh3_64_with_seed(token.as_bytes(), self.seed);
        (&self.shards[(digest >> 60) as usize % SHARDS], digest)
    }

    /// The verified identity of `token`, unless it expired by `now`
    /// (Unix seconds).
    pub(crate) fn get(&self, token: &str, now: u64) -> Option<Arc<Verified>> {
        if self.per_shard == 0 {
            return None;
        }
        let (shard, digest) = self.slot(token);
        let mut shard = shard.lock();
        let entry = shard.get(&digest)?;
        if &*entry.token != token {
            return None;
        }
        if entry.verified.expires <= now {
            shard.remove(&digest);
            return None;
        }
        Some(entry.verified.clone())
    }

    pub(crate) fn insert(&self, token: &str, verified: Arc<Verified>, now: u64) {
        if self.per_shard == 0 {
            return;
        }
        let (shard, digest) = self.slot(token);
        let mut shard = shard.lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&digest) {
            shard.retain(|_, entry| entry.verified.expires > now);
            if shard.len() >= self.per_shard
                && let Some(&victim) = shard.keys().next()
            {
                shard.remove(&victim);
            }
        }
        shard.insert(
            digest,
            Entry {
                token: token.into(),
                verified,
            },
        );
    }

    /// Tokens held, for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(expires: u64) -> Arc<Verified> {
        Arc::new(Verified::for_test(expires))
    }

    #[test]
    fn hits_until_expiry_and_stays_bounded() {
        let cache = Cache::new(32);
        cache.insert("a.b.c", verified(100), 10);
        assert!(cache.get("a.b.c", 99).is_some());
        assert!(cache.get("a.b.d", 99).is_none());
        assert!(cache.get("a.b.c", 100).is_none());
        assert_eq!(cache.len(), 0);
        for i in 0..1000 {
            cache.insert(&format!("t{i}"), verified(100), 10);
        }
        assert!(cache.len() <= 32, "{}", cache.len());
        let off = Cache::new(0);
        off.insert("a.b.c", verified(100), 10);
        assert!(off.get("a.b.c", 11).is_none());
    }
}
