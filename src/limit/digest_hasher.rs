//! The hasher of maps keyed by digests (the limiter's table of keys, open
//! reservations, overrides, the JWT cache, `simulate`'s tracker): a key
//! that is already a uniform 64-bit digest half needs no SipHash round.

use std::hash::Hasher;

/// Passes a digest's half, written with `write_u64`, through as the hash.
#[derive(Default)]
pub(crate) struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is expected; fold anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
