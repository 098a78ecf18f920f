//! Reservations still open on a limiter: a token request admitted with its
//! reservation and not settled yet (its response still streaming), per
//! key, so that the explain endpoint can say what a key has in flight.
//! Sharded by key like the limiter's state: no global lock on the request
//! path. Only token routes use it; an empty shard holds no allocation.
//! The maps hash a key by its digest's low half (the key is a digest
//! already: SipHash over it cost a token request ~130 instructions per
//! limit, at the open and again at the close).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use parking_lot::Mutex;

use super::LimitKey;
use super::digest_hasher::DigestHasher;

const SHARDS: usize = 16;

/// Per key: requests in flight and the tokens they reserved.
type Shard = HashMap<Key, (u64, u64), BuildHasherDefault<DigestHasher>>;

/// A key in a shard: hashed as its digest's low 64 bits (one `write_u64`,
/// which [`DigestHasher`] passes through); the shard is chosen by the top
/// bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key(LimitKey);

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.as_u128() as u64);
    }
}

#[derive(Debug)]
pub(crate) struct OpenReservations {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for OpenReservations {
    fn default() -> Self {
        OpenReservations {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }
}

impl OpenReservations {
    fn shard(&self, key: LimitKey) -> &Mutex<Shard> {
        &self.shards[(key.as_u128() >> 120) as usize % SHARDS]
    }

    /// A request reserved `tokens` under `key`.
    pub(crate) fn open(&self, key: LimitKey, tokens: u64) {
        let mut shard = self.shard(key).lock();
        let (requests, reserved) = shard.entry(Key(key)).or_default();
        *requests += 1;
        *reserved = reserved.saturating_add(tokens);
    }

    /// The request that reserved `tokens` under `key` was settled.
    pub(crate) fn close(&self, key: LimitKey, tokens: u64) {
        let mut shard = self.shard(key).lock();
        if let Some((requests, reserved)) = shard.get_mut(&Key(key)) {
            *requests = requests.saturating_sub(1);
            *reserved = reserved.saturating_sub(tokens);
            if *requests == 0 {
                shard.remove(&Key(key));
            }
        }
    }

    /// Requests in flight under `key` and the tokens they reserved.
    pub(crate) fn of(&self, key: LimitKey) -> (u64, u64) {
        self.shard(key)
            .lock()
            .get(&Key(key))
            .copied()
            .unwrap_or((0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_and_closes_per_key() {
        let open = OpenReservations::default();
        let (a, b) = (LimitKey::from_u128(1), LimitKey::from_u128(2 << 120));
        open.open(a, 100);
        open.open(a, 50);
        open.open(b, 7);
        assert_eq!(open.of(a), (2, 150));
        open.close(a, 100);
        assert_eq!(open.of(a), (1, 50));
        open.close(a, 50);
        assert_eq!(open.of(a), (0, 0));
        assert_eq!(open.of(b), (1, 7));
        // A close without its open changes nothing.
        open.close(a, 9);
        assert_eq!(open.of(a), (0, 0));
    }
}
