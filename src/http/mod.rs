//! HTTP wire vocabulary shared by both sides of the gateway.

pub mod chunked;
pub mod date;
pub mod field_lines;
pub mod hop_by_hop;
pub mod path;
pub mod structured;
