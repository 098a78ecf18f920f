//! Connections to upstreams.

pub mod deadline;
pub mod pool;
