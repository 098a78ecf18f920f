//! The HTTP/1.1 codec: the server side and the upstream client.

pub mod client;
pub mod server;
