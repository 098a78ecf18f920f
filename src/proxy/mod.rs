//! Talking HTTP: forwarding to upstreams and building the gateway's own responses.

pub mod body;
pub mod client;
pub mod field_lines;
pub mod forward;
pub mod hop_by_hop;
pub mod ratelimit;
pub mod response;
pub mod structured;
pub mod upgrade;
