//! Talking HTTP: forwarding to upstreams and building the gateway's own responses.

pub mod structured;
