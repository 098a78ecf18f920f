//! The pipeline: what the gateway does with a request once it is parsed.
//! [`handler`] calls the steps in their fixed order; the rate-limit fields
//! and 429s ([`ratelimit`]), the gateway's own responses ([`response`]),
//! the forwarding header rules ([`forward`]), upgrade tunnels ([`upgrade`]),
//! the body types ([`body`]), token quotas' reservation and settlement
//! ([`tokens`]) and the error → status mapping ([`error`]) are
//! its parts. Below it: the codec (`http1`), upstream connections
//! (`upstream`), the shared state (`app`); above it only the connection
//! layer (`conn`), which it never names.

pub(crate) mod body;
pub(crate) mod downstream;
pub(crate) mod forward;
pub(crate) mod handler;
pub(crate) mod retry;
pub(crate) mod send;
pub(crate) mod tokens;
pub(crate) mod upgrade;
