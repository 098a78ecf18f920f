//! HTTP wire vocabulary shared by both sides of the gateway (the request
//! side in `http1::server`, the upstream client in `http1::client`): rules
//! that must read the same bytes the same way wherever they are applied.

pub mod chunked;
pub mod content_length;
pub mod date;
pub mod field_lines;
pub mod hop_by_hop;
pub mod host;
pub mod path;
pub mod structured;
