//! Talking HTTP: forwarding to upstreams and building the gateway's own responses.

pub mod body;
pub mod forward;
pub mod pool;
pub mod ratelimit;
pub mod response;
pub mod structured;
pub mod upgrade;
