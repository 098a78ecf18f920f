//! Answers: what every front tells a client in HTTP, below the fronts so
//! that none borrows it from a sibling. The proxy, `/auth`, `/json`, the
//! Envoy service and the admin listener import it; it imports none of
//! them.
//!
//! - [`ratelimit`]: the rate-limit fields of a decided stack, a denial's
//!   fields as a value ([`ratelimit::denial_fields`]) and the 429 with them;
//! - [`error`]: why the gateway answers a request itself
//!   ([`error::GatewayError`]), mapped to a status in one `match`;
//! - [`response`]: the gateway's own problem+json responses;
//! - [`body`]: the response body all of them send;
//! - [`arena`]: the bodies written at flood rates, cut from one buffer
//!   per thread;
//! - [`memo`]: each thread's last denial, copied while the next ones are
//!   made of the same inputs.

pub(crate) mod arena;
pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod memo;
pub(crate) mod ratelimit;
pub(crate) mod response;
