//! Verified tokens, kept until they expire so that a client's next request
//! costs a hash and a comparison instead of a signature check.
//!
//! Keyed by a digest of the token's last [`DIGESTED_BYTES`] bytes — its
//! signature, which no two tokens an issuer signed share — with xxh3 and a
//! seed drawn at start, so nobody can choose tokens that land on one slot
//! ahead of time. Hashing a whole RS256 token cost more than the rest of
//! the lookup. The entry keeps the token's bytes and a hit compares them
//! whole, so two tokens with one digest can never share an identity (they
//! only take each other's slot). Sharded like the
//! limiters (no global lock); each shard holds at most its share of
//! `cache_size` entries, and a full shard first drops its expired entries,
//! then an arbitrary one. The cache belongs to one configuration: a
//! reload starts an empty one (its issuers and claims may have changed).
//!
//! A token that its issuer did sign but that is refused for claims that
//! will not change (expired, another audience) is kept too, for
//! [`REFUSAL_SECONDS`]: a client retrying with an expired token costs no
//! signature check per retry. Nothing else that is refused is kept — a
//! forged token would only push real ones out.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use parking_lot::Mutex;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::Failure;
use super::verified::Verified;
use crate::limit::digest_hasher::DigestHasher;

const SHARDS: usize = 16;

/// How much of a token's end the digest covers: 384 bits of a signature
/// (base64url), or of an HS256 tag and the claims before it.
const DIGESTED_BYTES: usize = 64;

/// How long a signed but refused token's answer is kept.
pub(crate) const REFUSAL_SECONDS: u64 = 60;

/// What is known of a token.
#[derive(Debug, Clone)]
pub(crate) enum Known {
    Valid(Arc<Verified>),
    /// Signed by its issuer (at `issuer`), refused for its claims.
    Refused {
        issuer: usize,
        failure: Failure,
    },
}

#[derive(Debug)]
struct Entry {
    token: Box<str>,
    known: Known,
    /// Unix second from which the entry is stale.
    until: u64,
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
        let bytes = token.as_bytes();
        let tail = &bytes[bytes.len().saturating_sub(DIGESTED_BYTES)..];
        let digest = xxh3_64_with_seed(tail, self.seed);
        (&self.shards[(digest >> 60) as usize % SHARDS], digest)
    }

    /// What is known of `token`, unless it went stale by `now` (Unix
    /// seconds).
    pub(crate) fn get(&self, token: &str, now: u64) -> Option<Known> {
        if self.per_shard == 0 {
            return None;
        }
        let (shard, digest) = self.slot(token);
        let mut shard = shard.lock();
        let entry = shard.get(&digest)?;
        if &*entry.token != token {
            return None;
        }
        if entry.until <= now {
            shard.remove(&digest);
            return None;
        }
        Some(entry.known.clone())
    }

    /// Keeps a valid token until it expires.
    pub(crate) fn insert(&self, token: &str, verified: Arc<Verified>, now: u64) {
        let until = verified.expires;
        self.keep(token, Known::Valid(verified), until, now);
    }

    /// Keeps a signed token's refusal for [`REFUSAL_SECONDS`].
    pub(crate) fn insert_refusal(&self, token: &str, issuer: usize, failure: Failure, now: u64) {
        let until = now.saturating_add(REFUSAL_SECONDS);
        self.keep(token, Known::Refused { issuer, failure }, until, now);
    }

    fn keep(&self, token: &str, known: Known, until: u64, now: u64) {
        if self.per_shard == 0 {
            return;
        }
        let (shard, digest) = self.slot(token);
        let mut shard = shard.lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&digest) {
            shard.retain(|_, entry| entry.until > now);
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
                known,
                until,
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
        assert!(matches!(cache.get("a.b.c", 99), Some(Known::Valid(_))));
        cache.insert_refusal("x.y.z", 0, Failure::Expired, 10);
        assert!(matches!(
            cache.get("x.y.z", 10 + REFUSAL_SECONDS - 1),
            Some(Known::Refused {
                failure: Failure::Expired,
                ..
            })
        ));
        assert!(cache.get("x.y.z", 10 + REFUSAL_SECONDS).is_none());
        assert!(cache.get("a.b.d", 99).is_none());
        assert!(cache.get("a.b.c", 100).is_none());
        assert_eq!(cache.len(), 0);
        for i in 0..1000 {
            cache.insert(&format!("t{i}"), verified(100), 10);
        }
        assert!(cache.len() <= 32, "{}", cache.len());
        // Two tokens ending alike share a slot but never an identity.
        let end = "s".repeat(DIGESTED_BYTES);
        let (first, second) = (format!("a.{end}"), format!("b.{end}"));
        assert_eq!(cache.slot(&first).1, cache.slot(&second).1);
        cache.insert(&first, verified(100), 10);
        assert!(cache.get(&second, 11).is_none());
        cache.insert(&second, verified(200), 10);
        assert!(cache.get(&first, 11).is_none());
        assert!(matches!(cache.get(&second, 11), Some(Known::Valid(v)) if v.expires == 200));
        assert_ne!(cache.slot("a.b.c").1, cache.slot("a.b.d").1);
        let off = Cache::new(0);
        off.insert("a.b.c", verified(100), 10);
        assert!(off.get("a.b.c", 11).is_none());
    }
}
