//! Talking HTTP: forwarding to upstreams and building the gateway's own responses.

pub mod body;
pub mod error;
pub mod forward;
pub mod handler;
pub mod ratelimit;
pub mod response;
pub mod upgrade;
