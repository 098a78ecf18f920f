//! HTTP wire vocabulary shared by both sides of the gateway (the request
//! side in `h1/`, the upstream client in `proxy/client/`): rules that must
//! read the same bytes the same way wherever they are applied.

pub mod content_length;
