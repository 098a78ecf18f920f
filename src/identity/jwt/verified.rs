//! [`Verified`]: what a verified token leaves for the request — its
//! issuer, when it stops being valid, the claims the configuration reads
//! (by slot), the consumer its claims name, and its priority claim.

use crate::config::Consumer;
use crate::limit::Priority;

/// A token that verified: what the request's limits need from it.
#[derive(Debug)]
pub struct Verified {
    /// Index of its issuer in the configuration.
    pub(crate) issuer: usize,
    /// Unix second from which it is no longer valid (`exp` + leeway).
    pub(crate) expires: u64,
    /// The value of each configured claim path, by slot; `None` where the
    /// token lacks it (or it is an object, an array or null).
    pub(super) values: Box<[Option<Box<[u8]>>]>,
    /// From `consumer_claim` / `tenant_claim` / `plan_claim`.
    pub(crate) consumer: Option<Consumer>,
    /// The plan claim's value, as one of the configuration's plan names.
    pub(super) plan: Option<usize>,
    /// The priority claim's value, when it names a priority.
    pub(crate) priority: Option<Priority>,
}

impl Verified {
    /// The value of claim slot `slot` (a `jwt:CLAIM` key part).
    #[inline]
    pub(crate) fn claim(&self, slot: usize) -> Option<&[u8]> {
        self.values.get(slot)?.as_deref()
    }

    #[cfg(test)]
    pub(crate) fn for_test(expires: u64) -> Verified {
        Verified {
            issuer: 0,
            expires,
            values: Box::new([]),
            consumer: None,
            plan: None,
            priority: None,
        }
    }
}
