//! HTTP wire vocabulary shared by both sides of the gateway (the request
//! side in `http1::server`, the upstream client in `http1::client`): rules
//! that must read the same bytes the same way wherever they are applied,
//! and the one writer of the gateway's own error bodies (`problem`:
//! RFC 9457 problem+json), for the codec and the pipeline alike.

pub mod chunked;
pub mod content_length;
pub(crate) mod date;
pub(crate) mod field_lines;
pub(crate) mod hop_by_hop;
pub mod host;
pub(crate) mod path;
pub(crate) mod problem;
pub(crate) mod rfc3339;
pub(crate) mod structured;
