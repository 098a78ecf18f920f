//! Who the client is: the client IP behind trusted proxies, and the keys a limit
//! is counted under.

pub mod body_fields;
pub mod client_ip;
pub mod consumer;
mod forwarded;
pub(crate) use forwarded::normalize;
pub mod keys;
