//! Who the client is: the client IP behind trusted proxies, and the keys a limit
//! is counted under.

pub(crate) mod body_fields;
pub mod client_ip;
pub(crate) mod consumer;
mod forwarded;
pub mod jwt;
pub(crate) use forwarded::normalize;
pub mod keys;
