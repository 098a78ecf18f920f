//! What the server knows about the connection a request came on, handed
//! to the pipeline with each request.

use std::net::SocketAddr;

/// What the server knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Downstream {
    pub(crate) peer: SocketAddr,
    /// `"http"` or `"https"`, for `X-Forwarded-Proto` and `Forwarded`.
    pub(crate) proto: &'static str,
}
