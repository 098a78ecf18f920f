//! [`LimitKey`]: the fixed-size digest that identifies one client of a limit.
//!
//! Keys are hashed once, when the identity layer extracts them, and from then
//! on are 16 bytes that copy for free and never hold a user name, API key or
//! address (the same digest names the key in Redis). xxh3-128 is fast and its
//! 128 bits make an accidental collision between two clients of one limit
//! practically impossible (~2^-64 for 2^32 live keys).
//!
//! Composite keys (`["ip", "header:user-agent"]`) hash several parts. Each part
//! is preceded by its length as 8 little-endian bytes, so part boundaries are
//! unambiguous: `["ab", "c"]` hashes `02..00 'a' 'b' 01..00 'c'` and
//! `["a", "bc"]` hashes `01..00 'a' 02..00 'b' 'c'` — different inputs, where
//! plain concatenation would give `"abc"` for both. The parts are fed to the
//! streaming hasher one by one (it lives on the stack), so no buffer is
//! allocated whatever the sizes.

use xxhash_rust::xxh3::{Xxh3, xxh3_128};

/// A 128-bit digest of a limit key's parts, as two halves (high, low).
///
/// Not a `u128`: that is 16-byte aligned, and so becomes every future that
/// holds a key across an await — the request handler's, boxed per request,
/// and an over-aligned allocation takes the allocator's slow path.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct LimitKey([u64; 2]);

impl LimitKey {
    /// Digest of `parts`, each length-prefixed (see the module doc).
    pub fn digest(parts: &[&[u8]]) -> LimitKey {
        // The one-part case with a short value (an IP, an API key) is the
        // common one: a stack buffer and the one-shot hash are cheaper than
        // the streaming state.
        if let [part] = parts
            && part.len() <= 56
        {
            let mut buf = [0u8; 64];
            let len = part.len();
            buf[..8].copy_from_slice(&(len as u64).to_le_bytes());
            buf[8..8 + len].copy_from_slice(part);
            return LimitKey::from_u128(xxh3_128(&buf[..8 + len]));
        }
        let mut hasher = Xxh3::new();
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        LimitKey::from_u128(hasher.digest128())
    }

    pub(crate) fn from_u128(digest: u128) -> LimitKey {
        LimitKey([(digest >> 64) as u64, digest as u64])
    }

    pub fn as_u128(self) -> u128 {
        (u128::from(self.0[0]) << 64) | u128::from(self.0[1])
    }

    /// The digest as two halves: the high half picks the shard, the low half
    /// feeds the shard's hash table (independent bits for each job).
    pub(crate) fn halves(self) -> (u64, u64) {
        (self.0[0], self.0[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_separated_unambiguously() {
        let a = LimitKey::digest(&[b"ab", b"c"]);
        let b = LimitKey::digest(&[b"a", b"bc"]);
        let c = LimitKey::digest(&[b"abc"]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
        assert_ne!(LimitKey::digest(&[b""]), LimitKey::digest(&[]));
    }

    #[test]
    fn short_and_streaming_paths_agree() {
        // One part of 56 bytes takes the stack path, 57 the streaming one;
        // both must equal the streaming digest of the same framing.
        for len in [0usize, 1, 55, 56, 57, 200] {
            let part = vec![7u8; len];
            let mut h = Xxh3::new();
            h.update(&(len as u64).to_le_bytes());
            h.update(&part);
            assert_eq!(
                LimitKey::digest(&[&part]),
                LimitKey::from_u128(h.digest128())
            );
        }
    }
}
