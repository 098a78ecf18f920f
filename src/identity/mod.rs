//! Who the client is: the client IP behind trusted proxies, and the keys a limit
//! is counted under.

pub mod client_ip;
mod forwarded;
pub mod keys;
